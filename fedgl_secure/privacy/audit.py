"""The privacy audit of a finished run (DESIGN §6): checks a run directory against its policy.

:func:`audit_run` reads a run directory and returns an :class:`AuditReport`: sections of checks,
each ``green`` (conforms), ``amber`` (conforms, but a risk officer should know: no DP, a budget
almost spent, an attack not run), ``red`` (a violation or evidence that does not verify) or ``info``
(context that is no verdict, such as the attack's power on a model trained without DP). Rendering
(Markdown, HTML, JSON, plots) is :mod:`fedgl_secure.privacy.report`; the command is
:mod:`fedgl_secure.privacy.audit_command`.

Sections, in report order:

1. ``policy`` — protection, HE security level, quorum, the policy's effective guarantees, and
   whether the key authority's keys were made for the policy's HE parameters.
2. ``privacy`` — ε spent per bank and channel (:class:`~fedgl_secure.privacy.accounting.PrivacyLedger`),
   against the budget: red above it, amber within :data:`BUDGET_WARNING_FRACTION` of it. And the
   run's stop (``stopped_reason``, ``stopped_banks``): banks that stopped for their budget are the
   policy failing closed (green), each cross-checked against its ledger.
3. ``decryptions`` — the key authority's decryption ledger: each (round, kind) at most once, at
   least the quorum of distinct registered senders, only allowed kinds, every decryption backed by
   an ``allowed`` audit record and by a signed receipt of each sender; the key authority's central DP
   noise (``central_noise_std`` in its allowed records) exactly where, and as large as, the policy asks.
4. ``audit-log`` — the hash chain of ``audit.jsonl`` up to the recorded head; a broken link is
   named by its line number and what is wrong with it.
5. ``receipts`` — every upload receipt verifies under its bank's key, and ``banks.json`` holds the
   keys the key authority registered.
6. ``leakage`` — the leakage ledger (what crosses which boundary), from docs/threat-model.md §3.
7. ``attacks`` — membership inference on the final global model and link inference from the
   pseudo graph (:mod:`fedgl_secure.privacy.attacks`); amber "not run" when the data is missing.
   For a DP run, the membership AUC of a non-DP reference of the same experiment is reported
   beside it (:mod:`fedgl_secure.privacy.reference`), as ``info``.

Run directory layout (written by the simulation and the consortium)::

    run.json  policy.toml  model.npz  privacy/<bank>.ledger.json
    key-authority/{ledger.sqlite3, audit.jsonl, audit_head}  receipts.jsonl  banks.json   # HE runs

The directory is only read: the SQLite ledger is copied to a temporary directory before it is opened.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fedgl_secure.errors import ConfigError, FedGLError
from fedgl_secure.privacy.run_record import (
    AUDIT_HEAD_FILE,
    BANKS_FILE,
    LEDGER_SUFFIX,
    POLICY_FILE,
    PRIVACY_DIR,
    RECEIPTS_FILE,
    RUN_FILE,
    RunDirectory,
    load_run_dir,
)

if TYPE_CHECKING:
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.engine.graph_tensors import GraphTensors
    from fedgl_secure.privacy.attacks import LinkResult, MembershipResult
    from fedgl_secure.privacy.policy import Policy
    from fedgl_secure.privacy.reference import ReferenceModel, ReferencePlan

Status = Literal["info", "green", "amber", "red"]
INFO: Status = "info"  # context, not a verdict: never raises a section's or the report's status
GREEN: Status = "green"
AMBER: Status = "amber"
RED: Status = "red"
_RANK = {INFO: -1, GREEN: 0, AMBER: 1, RED: 2}

# ε spent at or above this fraction of the budget is amber ("almost spent").
BUDGET_WARNING_FRACTION = 0.9
# Attack AUCs: at or below GREEN is "no better than guessing" within sampling error; above RED is
# a clear leak. Link inference is never red: real edges are homophilous, so a pseudo graph built
# from (even DP-noised) similarity ranks some edges above chance without any private edge leaking.
MEMBERSHIP_AUC_GREEN = 0.55
MEMBERSHIP_AUC_RED = 0.65
LINK_AUC_GREEN = 0.55


# --- the report model --------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One verdict: ``name`` (short, stable), ``status`` and a sentence a risk officer can act on."""

    name: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class Plot:
    """A line plot: ``series`` maps a label to ``[(x, y), ...]``; ``limit`` draws a dashed horizontal line."""

    title: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float, float]]]
    limit: float | None = None
    limit_label: str = ""


@dataclass
class Section:
    key: str
    title: str
    checks: list[Check] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # machine-readable figures for the JSON report (the tables carry the same for Markdown and HTML)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, status: Status, detail: str) -> Check:
        check = Check(name, status, detail)
        self.checks.append(check)
        return check

    @property
    def status(self) -> Status:
        return worst(c.status for c in self.checks)


def worst(statuses: Iterable[Status]) -> Status:
    """The most severe status (green for none; info only when every status is info)."""
    return max(statuses, key=_RANK.__getitem__, default=GREEN)


@dataclass
class AuditReport:
    """Everything the audit found; ``status`` is the worst check's."""

    run_dir: str
    policy_source: str
    run: dict[str, Any]
    sections: list[Section]
    generated_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def status(self) -> Status:
        return worst(s.status for s in self.sections)

    def checks(self) -> list[tuple[str, Check]]:
        """Every check with its section key, in report order."""
        return [(s.key, c) for s in self.sections for c in s.checks]

    def with_status(self, status: Status) -> list[str]:
        """``"section/check: detail"`` for every check of ``status``."""
        return [f"{key}/{c.name}: {c.detail}" for key, c in self.checks() if c.status == status]

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing is red (amber too with ``strict``), else 1."""
        return 1 if _RANK[self.status] >= _RANK[AMBER if strict else RED] else 0

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["status"] = self.status
        for section, data in zip(self.sections, document["sections"], strict=True):
            data["status"] = section.status
        return _json_safe(document)


def _json_safe(value: Any) -> Any:
    """NaN and ±inf become None or strings so the JSON is strict (risk tools choke on NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


# --- reading the run directory (through run_record.load_run_dir) ----------------------------------


@dataclass(frozen=True)
class Decryption:
    federation: str
    round: int
    kind: str
    nonce: str
    senders: tuple[str, ...]
    decrypted_at: str


@dataclass(frozen=True)
class KeyAuthorityLedger:
    """A secure run's key-authority ledger (SQLite), read once: decryptions (in insertion order), registered
    bank keys and meta; or, when it could not be read, ``error`` and nothing else."""

    path: Path
    decryptions: list[Decryption] = field(default_factory=list)
    banks: dict[str, bytes] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    error: str | None = None


@contextlib.contextmanager
def _ledger_copy(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a private copy of a SQLite file (and its WAL): the run directory is only read."""
    with tempfile.TemporaryDirectory(prefix="fedgl-audit-") as tmp:
        target = Path(tmp) / path.name
        for suffix in ("", "-wal", "-shm"):
            source = path.with_name(path.name + suffix)
            if source.exists():
                shutil.copyfile(source, target.with_name(target.name + suffix))
        connection = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            yield connection
        finally:
            connection.close()


def read_key_authority_ledger(path: Path) -> KeyAuthorityLedger:
    """The key authority's ledger at ``path``, read from a private copy; an unreadable one carries its error."""
    try:
        with _ledger_copy(path) as connection:
            decryptions = [
                Decryption(f, int(r), k, n, tuple(json.loads(s)), t)
                for f, r, k, n, s, t in connection.execute(
                    "SELECT federation, round, kind, nonce, senders, decrypted_at FROM decryptions ORDER BY rowid"
                )
            ]
            banks = {name: bytes(key) for name, key in connection.execute("SELECT name, public_key FROM banks")}
            meta = dict(connection.execute("SELECT key, value FROM meta"))
    except (sqlite3.Error, ValueError, OSError) as error:
        return KeyAuthorityLedger(path, error=str(error))
    return KeyAuthorityLedger(path, decryptions, banks, meta)


@dataclass
class RunFiles:
    """What the audit reads: the run directory as loaded, the policy it is audited against and, for a
    secure run, the key authority's ledger (read once, for every check that needs it)."""

    directory: RunDirectory
    policy: Policy
    policy_source: str
    ledger: KeyAuthorityLedger | None = None  # secure runs only

    @property
    def run(self) -> dict[str, Any]:
        """The RunResult dict (dataset, method, config, ...)."""
        result = self.directory.run.get("result")
        return result if isinstance(result, dict) else {}

    @property
    def banks(self) -> list[str]:
        return list(self.directory.run.get("banks", []))

    @property
    def stopped_banks(self) -> Any:
        """run.json: bank -> the round it stopped at (checked on use)."""
        return self.directory.run.get("stopped_banks") or {}


def read_run_dir(run_dir: str | Path, policy_path: str | Path | None = None) -> RunFiles:
    """Read a run directory with :func:`~fedgl_secure.privacy.run_record.load_run_dir`.

    Raises :class:`~fedgl_secure.privacy.run_record.RunDirectoryError` naming the first missing or
    corrupt file. ``policy_path`` audits against another policy than the run's own ``policy.toml``
    copy; a run that recorded no policy (a plaintext simulation) is audited as ``protection = "none"``.
    """
    from fedgl_secure.privacy.policy import Policy, load_policy

    loaded = load_run_dir(run_dir)
    if policy_path is not None:
        policy, source = load_policy(policy_path), str(policy_path)
    elif loaded.policy is not None:
        policy, source = loaded.policy, str(loaded.path / POLICY_FILE)
    else:
        policy = Policy(protection="none", description="no policy recorded: audited as no protection")
        source = "(none recorded)"
    ledger = None
    if loaded.secure:
        from fedgl_secure.crypto.key_authority import LEDGER_FILE

        ledger = read_key_authority_ledger(loaded.key_authority_dir / LEDGER_FILE)
    return RunFiles(loaded, policy, source, ledger)


# --- 1. policy conformance -----------------------------------------------------------------------


def check_policy(files: RunFiles) -> Section:
    """Protection, HE security, quorum and the effective guarantees."""
    from fedgl_secure.crypto.he_security import max_total_bits, security_check
    from fedgl_secure.privacy.guarantees import effective_guarantees

    policy = files.policy
    section = Section("policy", "Policy conformance")
    if policy.description:
        section.notes.append(f"Policy: {policy.description}")
    if policy.protection == "none":
        section.add(
            "protection",
            RED,
            'protection = "none" (research-plaintext): every upload left its bank in clear, no encryption, '
            "no DP; only acceptable for experiments on public data",
        )
    else:
        if files.directory.secure:
            section.add("protection", GREEN, "protection = 'he': uploads CKKS-encrypted, only sums decrypted")
        else:
            section.add(
                "protection",
                RED,
                "the policy requires HE (protection = 'he') but run.json says the run was not secure: "
                "uploads were summed in clear",
            )
        he = policy.he
        bits = sum(he.coeff_mod_bit_sizes)
        try:
            security_check(he.poly_modulus_degree, he.coeff_mod_bit_sizes)
            section.add(
                "he-security",
                GREEN,
                f"CKKS N={he.poly_modulus_degree}, modulus {bits} bits ≤ {max_total_bits(he.poly_modulus_degree)} "
                "(≥ 128-bit, HomomorphicEncryption.org standard)",
            )
        except ValueError as error:
            section.add("he-security", RED, f"below 128-bit security: {error}")
        if files.ledger is not None:
            section.checks.append(_key_parameters_check(files.ledger, he))
    quorum = policy.quorum
    section.add(
        "quorum",
        GREEN if quorum >= 2 else RED,
        f"quorum = {quorum}: every decrypted sum must hold at least {quorum} banks"
        if quorum >= 2
        else f"quorum = {quorum} < 2: a 'sum' over one bank is that bank's upload in clear",
    )
    section.add("allowed-kinds", GREEN, f"kinds that may leave a bank: {', '.join(policy.allowed_kinds)}")

    try:
        guarantees = effective_guarantees(policy)
    except (FedGLError, ValueError) as error:
        section.add("guarantees", RED, f"cannot compute the policy's guarantees: {error}")
        return section
    section.add(
        "unit",
        GREEN,
        f"unit of privacy: {guarantees.unit} — protected: {guarantees.protects}; not protected: "
        f"{guarantees.does_not_protect}",
    )
    if guarantees.status == "he-only":
        section.add(
            "guarantees",
            AMBER,
            "HE only, no differential privacy: decrypted sums (W̄, fused predictions, pseudo graph) are exact, "
            "so ε is unbounded for what they reveal about customers",
        )
    elif guarantees.status != "no-protection":  # no protection: already red above
        section.add(
            "guarantees",
            GREEN if guarantees.budget_met else AMBER,
            f"planned ε = {guarantees.epsilon:.3g} at δ = {guarantees.delta:g} over {guarantees.rounds} rounds "
            f"≤ budget {guarantees.budget_epsilon:g} ({guarantees.accountant.upper()})"
            if guarantees.budget_met
            else f"the budget ε = {guarantees.budget_epsilon:g} covers {guarantees.rounds_within_budget} of the "
            f"policy's {guarantees.rounds} rounds: banks stop contributing early (fail closed)",
        )
    if guarantees.channels:
        section.tables.append(
            Table(
                "Planned per-channel guarantees (each channel alone)",
                ("channel", "noise", "clip", "sensitivity", "z", "σ", "z accounted", "ε/round", "ε total"),
                tuple(
                    (
                        c.channel,
                        c.noise,
                        c.clip,
                        c.sensitivity,
                        c.noise_multiplier,
                        c.noise_std,
                        c.accounted_noise_multiplier,
                        c.epsilon_per_round,
                        c.epsilon_total,
                    )
                    for c in guarantees.channels
                ),
            )
        )
    section.notes.extend(f"Assumption: {a}" for a in guarantees.assumptions)
    section.notes.extend(guarantees.notes)
    return section


def _key_parameters_check(ledger: KeyAuthorityLedger, he) -> Check:
    """The key authority records the HE parameters its key pair was made for; they must be the policy's."""
    from fedgl_secure.crypto.key_authority import HE_PARAMETERS

    if ledger.error is not None:
        return Check("key-parameters", RED, f"{ledger.path.name}: unreadable ({ledger.error})")
    recorded = ledger.meta.get(HE_PARAMETERS)
    if recorded is None:
        return Check("key-parameters", AMBER, "the key authority recorded no HE parameters")
    if json.loads(recorded) != he.model_dump(mode="json"):
        return Check(
            "key-parameters", RED, f"the key pair was made for HE parameters {recorded}, not the policy's {he}"
        )
    return Check("key-parameters", GREEN, "the key authority's key pair was made for the policy's HE parameters")


# --- 2. ε spent ----------------------------------------------------------------------------------


def check_privacy(files: RunFiles, expected_banks: Iterable[str] = ()) -> Section:
    """ε spent per bank and channel against the budget (a plot over rounds per bank), and the run's stop."""
    section = Section("privacy", "Privacy spent (ε per bank and channel)")
    delta, accountant = _delta_accountant(files.policy)
    spent = {bank: ledger.epsilon(delta, accountant) for bank, ledger in files.directory.ledgers.items()}
    _budget_checks(section, files, expected_banks, spent)
    section.checks.append(_stop_check(section, files, spent))
    return section


def _delta_accountant(policy: Policy) -> tuple[float, str]:
    """The δ and accountant ε is read at: the policy's budget's, else δ = 1e-5 under RDP."""
    budget = policy.budget
    return (budget.delta, budget.accountant) if budget is not None else (1e-5, "rdp")


def _budget_checks(section: Section, files: RunFiles, expected_banks: Iterable[str], spent: dict[str, float]) -> None:
    """ε spent per bank and channel (``spent``: each bank's total) against the budget, with a plot over rounds."""
    policy = files.policy
    budget = policy.budget
    delta, accountant = _delta_accountant(policy)
    ledgers = files.directory.ledgers
    if not policy.has_dp:
        recorded = {bank: spent[bank] for bank, ledger in ledgers.items() if ledger.releases}
        section.add(
            "budget",
            AMBER,
            "the policy has no DP and no budget: nothing bounds what decrypted sums reveal (ε unbounded)"
            + (f"; ledgers nevertheless record ε {recorded}" if recorded else ""),
        )
        return
    missing = sorted(set(expected_banks) - set(ledgers))
    for bank in missing:
        section.add(
            f"ledger:{bank}", RED, f"no privacy ledger for bank {bank!r} (expected {PRIVACY_DIR}/{bank}{LEDGER_SUFFIX})"
        )
    if not ledgers:
        section.add("ledgers", RED, f"the policy has DP but the run recorded no ledger under {PRIVACY_DIR}/")
        return
    rows = []
    channels = policy_channels(ledgers)
    for bank, ledger in sorted(ledgers.items()):
        total = spent[bank]
        fraction = total / budget.epsilon
        where = f"bank {bank}: ε = {total:.4g} of budget {budget.epsilon:g} at δ = {delta:g} ({accountant.upper()})"
        if not total <= budget.epsilon:  # NaN fails closed
            section.add(f"budget:{bank}", RED, f"{where}: BUDGET EXCEEDED")
        elif policy.dp.source_only:  # edge / label unit: paid once at the source, nothing more is ever spent
            unit = policy.dp.effective_unit
            section.add(f"budget:{bank}", GREEN, f"{where}: paid once at the source (unit {unit!r})")
        elif fraction >= BUDGET_WARNING_FRACTION:
            section.add(f"budget:{bank}", AMBER, f"{where}: within {1 - BUDGET_WARNING_FRACTION:.0%} of the budget")
        else:
            section.add(f"budget:{bank}", GREEN, f"{where} ({fraction:.0%} spent)")
        used = [c for c in ledger.channels if any(r.channel == c for r in ledger.releases)]
        rows.append((bank, total, budget.epsilon, *(ledger.epsilon(delta, accountant, channel=c) for c in channels)))
        history = ledger.history(delta, accountant)
        series = {"total": [(p.round, p.epsilon) for p in history]}
        for channel in used:
            series[channel] = [(p.round, p.by_channel[channel]) for p in history]
        section.plots.append(
            Plot(f"ε spent by {bank} over rounds", "round", f"ε at δ = {delta:g}", series, budget.epsilon, "budget")
        )
    section.tables.insert(0, Table("ε spent per bank", ("bank", "ε total", "budget", *channels), tuple(rows)))
    section.notes.append(
        "Per-channel ε is each channel composed on its own; composed together they are sub-additive, "
        "so the channels do not add up to the total."
    )


# What the simulation's and the aggregator's stopped_reason say when banks ran out of budget.
BUDGET_STOP_PHRASE = "privacy budget"


def _stop_check(section: Section, files: RunFiles, spent: dict[str, float]) -> Check:
    """Why the run stopped early, if it did, and which banks stopped at which round (run.json).

    Banks that withdraw because their next round would exceed the budget are the policy failing
    closed, as designed: green, once each stopped bank's ledger is cross-checked (present, within
    budget, no release at or after its stopping round; red naming the bank otherwise). A stop for
    another reason (a consortium that did not finish) is amber; no stop at all is information.
    """
    reason = files.run.get("stopped_reason")
    stopped = files.stopped_banks
    section.data["stop"] = {"stopped_reason": reason, "stopped_banks": stopped}
    if not isinstance(stopped, dict) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in stopped.values()
    ):
        return Check("stop", RED, f"{RUN_FILE}: stopped_banks is not a map bank → stopping round: {stopped!r}")
    if reason is None and not stopped:
        return Check("stop", INFO, "the run was not stopped early: no stopped_reason, and no bank stopped contributing")
    budget = files.policy.budget
    delta, _ = _delta_accountant(files.policy)
    problems: list[str] = []
    rows = []
    for bank, round_number in sorted(stopped.items(), key=lambda item: (item[1], item[0])):
        ledger = files.directory.ledgers.get(bank)
        if ledger is None:
            problems.append(f"bank {bank!r} stopped at round {round_number} but has no privacy ledger")
            rows.append((bank, round_number, None, None))
            continue
        total = spent[bank]
        last = max((r.round for r in ledger.releases), default=None)
        rows.append((bank, round_number, last, total))
        late = sorted({r.round for r in ledger.releases if r.round >= round_number})
        if late:
            problems.append(
                f"bank {bank!r} stopped at round {round_number} but its ledger records releases in round(s) "
                f"{', '.join(map(str, late))}"
            )
        if budget is not None and not total <= budget.epsilon:  # NaN fails closed
            problems.append(
                f"bank {bank!r} stopped at round {round_number} with ε = {total:.4g} above the budget "
                f"{budget.epsilon:g}"
            )
    if rows:
        section.tables.append(
            Table(
                "Banks that stopped contributing (privacy budget)",
                ("bank", "stopped at round", "last release round", f"ε at δ = {delta:g}"),
                tuple(rows),
            )
        )
    by_round: dict[int, list[str]] = {}
    for bank, round_number, *_ in rows:
        by_round.setdefault(round_number, []).append(bank)
    listed = "; ".join(f"{', '.join(banks)} at round {r}" for r, banks in by_round.items())
    if problems:
        return Check("stop", RED, "the run's stop does not match the privacy ledgers: " + "; ".join(problems))
    if reason is not None and BUDGET_STOP_PHRASE not in str(reason):
        return Check(
            "stop",
            AMBER,
            f"the run stopped early, not for the privacy budget: {reason}"
            + (f" (banks that had stopped for their budget: {listed})" if stopped else ""),
        )
    if not stopped:
        return Check(
            "stop",
            AMBER,
            f"the run stopped for the privacy budget ({reason}), but {RUN_FILE} names no bank that stopped: "
            "the stop cannot be cross-checked against the ledgers",
        )
    on_exhausted = budget.on_exhausted if budget is not None else "stop-contributing"
    why = f"the run stopped ({reason})" if reason is not None else "the run went on with the others"
    return Check(
        "stop",
        GREEN,
        f"fail closed, as the policy asks (budget.on_exhausted = {on_exhausted!r}): banks stopped contributing "
        f"before exceeding their budget ({listed}); {why}. Each one's ledger is within the budget and records no "
        "release from its stopping round on",
    )


def policy_channels(ledgers: dict) -> tuple[str, ...]:
    """Channels with at least one release in any ledger, in canonical order."""
    from fedgl_secure.privacy.accounting import CHANNELS

    seen = {r.channel for ledger in ledgers.values() for r in ledger.releases}
    return tuple(c for c in CHANNELS if c in seen) + tuple(sorted(seen - set(CHANNELS)))


# --- 3. the decryption ledger ----------------------------------------------------------------------


def check_decryptions(files: RunFiles, audit: AuditRecords, receipts: list[Any]) -> tuple[Section, list[Decryption]]:
    """Every decryption once per (round, kind), ≥ quorum distinct registered senders, backed by audit and
    receipts; central DP noise as the policy asks (:func:`check_central_noise`).

    With the audit chain broken (``audit.verified`` false) the cross-check with the ledger is not made
    (amber), the chain check itself being red.
    """
    section = Section("decryptions", "Key authority decryption ledger")
    decryptions = _ledger_checks(section, files, audit.records if audit.verified else None, receipts)
    central, table = check_central_noise(files, audit)
    section.checks.append(central)
    if table is not None:
        section.tables.append(table)
    return section, decryptions


def _ledger_checks(
    section: Section, files: RunFiles, audit_records: list[dict] | None, receipts: list[Any]
) -> list[Decryption]:
    """The decryption ledger's checks (see :func:`check_decryptions`); the decryptions it holds."""
    ledger = files.ledger
    if ledger.error is not None:
        section.add("ledger", RED, f"{ledger.path}: unreadable decryption ledger ({ledger.error})")
        return []
    decryptions, registered = ledger.decryptions, ledger.banks
    quorum = files.policy.quorum
    section.tables.append(
        Table(
            "Decryptions",
            ("round", "kind", "senders", "decrypted at"),
            tuple((d.round, d.kind, ", ".join(d.senders), d.decrypted_at) for d in decryptions),
        )
    )
    if not decryptions:
        section.add("decryptions", AMBER, "the key authority decrypted nothing (did the run train?)")
        return decryptions
    section.add("decryptions", GREEN, f"{len(decryptions)} decryptions recorded")

    repeated = [key for key, n in Counter((d.federation, d.round, d.kind) for d in decryptions).items() if n > 1]
    section.add(
        "once-per-round-kind",
        RED if repeated else GREEN,
        "decrypted more than once: " + ", ".join(f"round {r} {k!r} ({f})" for f, r, k in repeated)
        if repeated
        else "no (round, kind) was decrypted twice (no differencing)",
    )
    short = [d for d in decryptions if len(set(d.senders)) < quorum or len(set(d.senders)) != len(d.senders)]
    section.add(
        "quorum",
        RED if short else GREEN,
        "below the quorum of distinct senders: "
        + "; ".join(f"round {d.round} {d.kind!r}: {list(d.senders)}" for d in short)
        if short
        else f"every decryption had ≥ {quorum} distinct senders",
    )
    kinds = [d for d in decryptions if d.kind not in files.policy.allowed_kinds]
    section.add(
        "kinds",
        RED if kinds else GREEN,
        "kinds the policy does not allow were decrypted: " + ", ".join(sorted({d.kind for d in kinds}))
        if kinds
        else "only kinds the policy allows were decrypted",
    )
    unknown = sorted({s for d in decryptions for s in d.senders} - set(registered))
    section.add(
        "senders-registered",
        RED if unknown else GREEN,
        f"senders not registered with the key authority: {unknown}" if unknown else "every sender is a registered bank",
    )
    # Every decryption must appear in the audit log as allowed, with the same senders, and vice versa.
    if audit_records is None:
        section.add("matches-audit-log", AMBER, "not checked: the audit log's chain is broken (see audit-log)")
    else:
        audited = Counter(
            (r.get("federation"), r.get("round"), r.get("kind"), tuple(r.get("senders", ())))
            for r in audit_records
            if r.get("event") == "decrypt" and r.get("decision") == "allowed"
        )
        recorded = Counter((d.federation, d.round, d.kind, tuple(d.senders)) for d in decryptions)
        problems = [
            f"round {r} {k!r} decrypted but not in the audit log as allowed" for _, r, k, _ in recorded - audited
        ]
        problems += [
            f"round {r} {k!r} in the audit log as allowed but not in the ledger" for _, r, k, _ in audited - recorded
        ]
        section.add(
            "matches-audit-log",
            RED if problems else GREEN,
            "; ".join(problems) if problems else "ledger and audit log agree on every decryption and its senders",
        )
    # Each sender of each decryption must have signed a receipt bound to that round, nonce and kind.
    signed = {(r.federation, r.round, r.nonce, r.kind, r.sender) for r in receipts}
    missing = [
        f"round {d.round} {d.kind!r} from {s!r}"
        for d in decryptions
        for s in d.senders
        if (d.federation, d.round, d.nonce, d.kind, s) not in signed
    ]
    section.add(
        "receipts-for-decryptions",
        RED if missing else GREEN,
        f"{len(missing)} contributions without a receipt: " + "; ".join(missing[:10])
        if missing
        else "every contribution to every decrypted sum has a receipt",
    )
    return decryptions


# Fields of the key authority's allowed decision when it added central DP noise (KeyAuthority.decrypt_sum).
CENTRAL_NOISE_STD = "central_noise_std"
CENTRAL_NOISE_VALUES = "central_noise_values"
CENTRAL_NOISE_RTOL = 1e-9


@dataclass(frozen=True)
class AuditRecords:
    """audit.jsonl as read once: its records, and whether its hash chain verified up to the recorded head."""

    records: list[dict]  # every line that parses as a JSON object (all of them when verified)
    verified: bool  # False: the chain is broken, the records are only what the file says


def _read_audit_records(path: Path) -> list[dict]:
    """Every line of audit.jsonl that parses as a JSON object, trusted or not."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _central_noise_problem(record: dict, expected: dict[str, float], policy: Any) -> str | None:
    """What is wrong with one allowed decision's central noise, or None."""
    from fedgl_secure.privacy.guarantees import central_noise_count

    kind = record.get("kind")
    where = f"round {record.get('round')} {kind!r}"
    carried = CENTRAL_NOISE_STD in record or CENTRAL_NOISE_VALUES in record
    std, count, values = record.get(CENTRAL_NOISE_STD), record.get(CENTRAL_NOISE_VALUES), record.get("values")
    if kind not in expected:
        if not carried:
            return None
        channel = policy.dp.upload_channel(kind) if isinstance(kind, str) else None
        why = f"its channel's noise is {channel.noise!r}" if channel is not None else "it has no DP channel"
        return f"{where}: central noise (σ = {std}) added, but the policy asks for none on {kind!r} ({why})"
    sigma = expected[kind]
    if not carried:
        if values == 0:
            return None  # nothing decrypted, nothing to noise
        return f"{where}: decrypted WITHOUT central noise; the policy asks for σ = {sigma:.6g}"
    problems = []
    number = isinstance(std, (int, float)) and not isinstance(std, bool)
    if not (number and math.isclose(std, sigma, rel_tol=CENTRAL_NOISE_RTOL)):
        problems.append(f"σ = {std}, the policy's σ = {sigma:.6g}")
    if _is_count(values):
        wanted = central_noise_count(kind, values)  # Σ ŵ_k, the last weight, is exact
        if count != wanted:
            problems.append(f"on {count} values, expected {wanted} of the {values} decrypted")
    elif not _is_count(count):
        problems.append(f"no count of noised values ({count!r})")
    return f"{where}: central noise " + ", ".join(problems) if problems else None


def check_central_noise(files: RunFiles, audit: AuditRecords) -> tuple[Check, Table | None]:
    """Central DP noise in the key authority's allowed decisions (audit.jsonl) against the policy.

    Every decryption of a kind whose channel says ``noise = "central"`` must record
    ``central_noise_std`` equal to the policy's σ (relative tolerance :data:`CENTRAL_NOISE_RTOL`)
    and ``central_noise_values`` equal to the decrypted size (less the weights' last entry, Σ ŵ_k);
    no decryption of any other kind may carry central noise. Red naming the round and kind; info
    (not applicable) when the policy has no central channel and no decision carries any. With the
    chain broken (``audit.verified`` false) the records are taken as they are: a mismatch is still
    red, agreement only amber (unverified).
    """
    from fedgl_secure.crypto.key_authority import AUDIT_FILE
    from fedgl_secure.privacy.guarantees import central_noise_stds

    name = "central-noise"
    try:
        expected = central_noise_stds(files.policy)
    except (FedGLError, ValueError) as error:
        return Check(name, RED, f"cannot compute the policy's central-noise σ: {error}"), None
    verified = audit.verified
    allowed = [r for r in audit.records if r.get("event") == "decrypt" and r.get("decision") == "allowed"]
    carrying = [r for r in allowed if CENTRAL_NOISE_STD in r or CENTRAL_NOISE_VALUES in r]
    if not expected and not carrying:
        not_applicable = (
            "not applicable: the policy has no central DP channel (noise = 'central'), and no decryption "
            "carries central noise"
        )
        return Check(name, INFO, not_applicable), None
    problems = [p for r in allowed if (p := _central_noise_problem(r, expected, files.policy)) is not None]
    central = sum(1 for r in allowed if r.get("kind") in expected)
    table = Table(
        "Central DP noise added by the key authority (audit log)",
        ("round", "kind", "σ recorded", "σ policy", "values noised", "values decrypted"),
        tuple(
            (
                r.get("round"),
                r.get("kind"),
                r.get(CENTRAL_NOISE_STD),
                expected.get(r.get("kind")),
                r.get(CENTRAL_NOISE_VALUES),
                r.get("values"),
            )
            for r in allowed
            if r.get("kind") in expected or CENTRAL_NOISE_STD in r or CENTRAL_NOISE_VALUES in r
        ),
    )
    unverified = "" if verified else f" (read from {AUDIT_FILE}, whose chain is broken: see audit-log)"
    if problems:
        shown = "; ".join(problems[:10]) + (f"; … {len(problems) - 10} more" if len(problems) > 10 else "")
        detail = f"{len(problems)} decryptions do not carry the policy's central noise{unverified}: {shown}"
        return Check(name, RED, detail), table
    sigmas = ", ".join(f"{kind} σ = {sigma:.6g}" for kind, sigma in expected.items()) or "none"
    values = "every value decrypted but Σ ŵ_k (the weights' last entry)" if "weights" in expected else "every value"
    detail = (
        f"{central} decryptions of central kinds carried the key authority's noise at the policy's σ ({sigmas}) "
        f"on {values}; {len(allowed) - central} decryptions of other kinds carried none"
    )
    if not verified:
        return Check(name, AMBER, f"{detail}, but these records are unverified{unverified}"), table
    return Check(name, GREEN, detail), table


# --- 4. the audit-log hash chain -------------------------------------------------------------------


def check_audit_chain(files: RunFiles) -> tuple[Section, AuditRecords]:
    """Verify audit.jsonl's chain up to the recorded head; its records for the cross-checks, read once."""
    from fedgl_secure.crypto.audit import verify_audit_chain
    from fedgl_secure.crypto.key_authority import AUDIT_FILE, AUDIT_HEAD

    section = Section("audit-log", "Audit log hash chain")
    log_path = files.directory.key_authority_dir / AUDIT_FILE
    head = files.directory.audit_head
    recorded_head = files.ledger.meta.get(AUDIT_HEAD)  # None too when the ledger is unreadable (decryptions)
    if recorded_head is not None and recorded_head != head:
        section.add(
            "head",
            RED,
            f"{AUDIT_HEAD_FILE} ({head[:12]}…) differs from the head in the key authority's ledger "
            f"({recorded_head[:12]}…): one of them was replaced",
        )
    report = verify_audit_chain(log_path, head)
    records = _read_audit_records(log_path)
    if not report.ok:
        section.add(
            "chain",
            RED,
            f"BROKEN LINK in {AUDIT_FILE} at line {report.broken_line}: "
            f"{report.problem.removeprefix(f'line {report.broken_line}: ')}",
        )
        return section, AuditRecords(records, verified=False)
    section.add("chain", GREEN, f"{report.lines} records, chain intact up to the recorded head {head[:12]}…")
    decisions = Counter((r.get("event", "?"), r.get("decision", "?")) for r in records)
    section.tables.append(
        Table(
            "Audit log decisions",
            ("event", "decision", "count"),
            tuple((event, decision, n) for (event, decision), n in sorted(decisions.items())),
        )
    )
    refused = [r for r in records if r.get("decision") == "refused"]
    if refused:
        section.tables.append(
            Table(
                "Refusals (the key authority enforcing its rules)",
                ("line", "event", "round", "kind", "reason", "detail"),
                tuple(
                    (r.get("seq"), r.get("event"), r.get("round"), r.get("kind"), r.get("reason"), r.get("detail"))
                    for r in refused
                ),
            )
        )
    return section, AuditRecords(records, verified=True)


# --- 5. receipts -------------------------------------------------------------------------------------


def check_receipts(files: RunFiles) -> tuple[Section, list[Any]]:
    """Every receipt verifies under ``banks.json``; banks.json matches the key authority's registry.

    :func:`~fedgl_secure.privacy.run_record.load_run_dir` has already parsed every receipt and every
    key (a malformed one is a corrupt run directory, not a check).
    """
    from fedgl_secure.crypto.receipts import load_public_key, verify_receipt
    from fedgl_secure.errors import ReceiptError

    section = Section("receipts", "Upload receipt signatures")
    bank_keys = files.directory.bank_keys
    keys = {bank: load_public_key(bytes.fromhex(hex_key)) for bank, hex_key in bank_keys.items()}
    if files.ledger.error is None:
        registered = files.ledger.banks
        differing = sorted(
            bank for bank in set(registered) | set(bank_keys) if registered.get(bank, b"").hex() != bank_keys.get(bank)
        )
        section.add(
            "keys-match-key-authority",
            RED if differing else GREEN,
            f"{BANKS_FILE} and the key authority's registry disagree for {differing} (a substituted key would "
            "make forged receipts verify)"
            if differing
            else f"{BANKS_FILE} holds exactly the {len(registered)} keys the key authority registered",
        )
    valid: list[Any] = []
    bad: list[str] = []
    for number, receipt in enumerate(files.directory.receipts, start=1):
        key = keys.get(receipt.sender)
        if key is None:
            bad.append(f"{RECEIPTS_FILE} line {number}: sender {receipt.sender!r} has no key in {BANKS_FILE}")
            continue
        try:
            verify_receipt(key, receipt)
        except ReceiptError as error:
            bad.append(f"{RECEIPTS_FILE} line {number}: FORGED — {error}")
            continue
        valid.append(receipt)
    if bad:
        section.add(
            "signatures", RED, f"{len(bad)} of {len(valid) + len(bad)} receipts do not verify: " + "; ".join(bad)
        )
    elif not valid:
        section.add("signatures", AMBER, f"{RECEIPTS_FILE} holds no receipts")
    else:
        section.add("signatures", GREEN, f"all {len(valid)} receipts carry valid Ed25519 signatures of their senders")
    by_bank = Counter((r.sender, r.kind) for r in valid)
    section.tables.append(
        Table(
            "Valid receipts per bank and kind",
            ("bank", "kind", "receipts"),
            tuple((bank, kind, n) for (bank, kind), n in sorted(by_bank.items())),
        )
    )
    return section, valid


# --- 6. the leakage ledger -----------------------------------------------------------------------------

LEAKAGE_DOC = "docs/threat-model.md §3"
# Condensed from docs/threat-model.md §3 (the authoritative, longer table; keep the two in step).
LEAKAGE_LEDGER: tuple[tuple[str, str, str, str], ...] = (
    ("Node certificates (name, role, federation)", "node → peers (TLS)", "peers", "who talks to whom (R10)"),
    ("Banks' signing public keys", "public/ → aggregator, key authority", "both", "none"),
    ("Public CKKS context and fingerprint", "key authority → every node", "every node", "anyone can encrypt (R6)"),
    ("Sealed CKKS secret key", "key authority's disk", "nobody without the operator secret", "operator secret (R8)"),
    (
        "Pseudonym set of bank k (HMAC per node)",
        "bank → aggregator",
        "aggregator",
        "N_k and which banks hold each pseudonymised customer (R4)",
    ),
    ("M and bank k's own union positions", "aggregator → bank k", "bank k", "M − N_k (R4)"),
    (
        "Round view and history, evaluation counts",
        "aggregator ↔ banks",
        "all nodes",
        "liveness, per-bank accuracy (R6)",
    ),
    ("Receipts (metadata + signature)", "bank → aggregator → key authority", "both", "who contributed what, when"),
    (
        "Ciphertext sizes and timing",
        "bank → aggregator (network)",
        "aggregator, network",
        "shapes, N_k via timing (R10)",
    ),
    ("Uploads: N_k·W_k, N_k·P_k, N_k·H_k, node_weight", "bank → aggregator", "nobody (CKKS)", "none while encrypted"),
    ("Masked sums s + r", "aggregator → key authority → aggregator", "key authority sees masked only", "R7"),
    ("Σ N_k W_k and Σ N_k", "aggregator (unmasked)", "aggregator", "two contributors: the other's update (R2)"),
    ("Σ N_k P_k and Σ N_k H_k per row", "aggregator (unmasked)", "aggregator", "single-holder rows in clear (R1)"),
    ("W̄ (global model)", "aggregator → every bank", "aggregator, all banks", "model attacks unless DP (R9)"),
    ("Ȳ pseudo labels (all M)", "aggregator → every bank", "aggregator, all banks", "single-holder labels (R4)"),
    ("Ā pseudo graph (M × s)", "aggregator → every bank", "aggregator, all banks", "link inference (R4)"),
    ("Aggregator state (sums, pseudonyms, models)", "aggregator.sqlite3", "aggregator operators", "R1, R4, R11"),
    ("Key authority ledger and audit log", "key authority state", "its operators", "decisions, no values"),
)


def leakage_section(files: RunFiles) -> Section:
    section = Section("leakage", "Leakage ledger (what crosses which boundary)")
    section.tables.append(
        Table("Leakage ledger", ("value", "from → to", "seen in clear by", "residual risk"), LEAKAGE_LEDGER)
    )
    section.notes.append(f"Condensed from {LEAKAGE_DOC}, which gives each row's justification and mitigation.")
    if files.policy.protection == "none":
        section.add("uploads", RED, "under this policy every upload crosses bank → aggregator in clear")
    elif not files.policy.has_dp:
        section.add("decrypted-sums", AMBER, "no DP: the fused results (W̄, Ȳ, Ā) that reach every bank are exact")
    else:
        section.add("documented", GREEN, f"every boundary crossing is documented in {LEAKAGE_DOC}")
    return section


# --- 7. empirical attacks ------------------------------------------------------------------------------


def attack_section(
    files: RunFiles,
    data_root: str | Path | None = None,
    seed: int = 0,
    reference: ReferencePlan | None = None,
) -> Section:
    """Membership inference on W̄ (beside a non-DP reference for a DP run) and link inference on Ā.

    Amber "not run" when the graph cannot be rebuilt. ``reference`` (default: retrain) says where
    the without-DP model comes from (:mod:`fedgl_secure.privacy.reference`).
    """
    from fedgl_secure.privacy.reference import ReferencePlan

    section = Section("attacks", "Empirical attacks")
    try:
        config, dataset = _experiment(files, data_root)
        merged = _merged(config, dataset)
    except (FedGLError, OSError, ValueError, KeyError) as error:
        section.add("not-run", AMBER, f"attacks not run: the merged graph could not be rebuilt ({error})")
        return section
    rows: list[tuple[Any, ...]] = []
    membership = _membership(section, files, config, merged, seed)
    if membership is not None:
        rows.append(
            (
                "membership",
                membership.attack,
                membership.auc,
                membership.auc_stderr,
                membership.members,
                json.dumps(membership.variants),
            )
        )
    _membership_reference(section, files, membership, (config, dataset, merged), seed, reference or ReferencePlan())
    _membership_floor(section, config, merged, seed)
    link = _link(section, files, merged, seed)
    if link is not None:
        rows.append(("link", link.attack, link.auc, link.auc_stderr, link.positives, json.dumps(link.variants)))
    if rows:
        section.tables.insert(
            0, Table("Attack AUCs", ("attack", "best variant", "AUC", "± s.e.", "positives", "variants"), tuple(rows))
        )
    section.notes.append(
        "AUC 0.5 = guessing, 1.0 = perfect inference; the best variant is reported (favours the attacker)."
    )
    return section


def _membership_floor(section: Section, config: ExperimentConfig, merged: GraphTensors, seed: int) -> None:
    """The attack's AUC on the untrained initial model W₀, which saw no data: what "no leakage" scores here.

    Members (training nodes) and non-members (test nodes) differ in ways a model that learned nothing
    still reflects (degree, feature density), and the best of three variants is taken, so the floor
    is not exactly 0.5. Informational: it calibrates the membership thresholds, never decides them.
    """
    from fedgl_secure.engine.simulation import initial_parameters

    try:
        untrained = initial_parameters(config, merged.features.shape[1], merged.num_classes)
        floor = _membership_auc(untrained, config.training.hidden, merged, seed)
    except (ValueError, RuntimeError) as error:
        section.add("membership-floor", INFO, f"attack floor not computed: {error}")
        return
    section.add(
        "membership-floor",
        INFO,
        f"attack floor: AUC {floor.auc:.3f} ± {floor.auc_stderr:.3f} on the untrained initial model W₀ (seed "
        f"{config.seed}), which saw no data; an AUC near it means the attack finds nothing beyond how members "
        "and non-members differ anyway",
    )
    section.data.setdefault("membership", {})["floor"] = _auc_figures(floor)


def _dp_phrase(files: RunFiles) -> str:
    return "with DP" if files.policy.has_dp else "without DP"


def _membership_auc(weights: Any, hidden: int | None, merged: GraphTensors, seed: int) -> MembershipResult:
    """Membership inference on a flat parameter vector (array or tensor) of a model with ``hidden`` units.

    The same ``seed`` picks the same member and non-member nodes, so the run, its reference and the
    attack floor are scored on the same nodes.
    """
    import torch

    from fedgl_secure.privacy.attacks import membership_inference_auc

    flat = torch.as_tensor(weights, dtype=torch.float32).reshape(-1)
    return membership_inference_auc(flat, merged, seed=seed, hidden=hidden)


def _membership(
    section: Section, files: RunFiles, config: ExperimentConfig, merged: GraphTensors, seed: int
) -> MembershipResult | None:
    """The run's own membership inference check (its thresholds); the result, or None when it could not run."""
    try:
        membership = _membership_auc(files.directory.model["weights"], config.training.hidden, merged, seed)
    except (ValueError, RuntimeError) as error:
        section.add("membership", AMBER, f"membership inference not run: {error}")
        return None
    auc, se = membership.auc, membership.auc_stderr
    status = GREEN if auc <= MEMBERSHIP_AUC_GREEN else AMBER if auc <= MEMBERSHIP_AUC_RED else RED
    unit = files.policy.dp.effective_unit if files.policy.protection == "he" else "none"
    outside = unit in ("edge", "label")  # a customer's membership is not what these units protect
    section.add(
        "membership",
        INFO if outside else status,
        (f"not covered by unit {unit!r} (information only): " if outside else "")
        + f"membership inference on the final global model ({_dp_phrase(files)}): AUC {auc:.3f} ± {se:.3f} "
        f"(best of {', '.join(membership.variants)}: {membership.attack}; {membership.members} members vs "
        f"{membership.nonmembers} non-members; green ≤ {MEMBERSHIP_AUC_GREEN}, red > {MEMBERSHIP_AUC_RED})",
    )
    section.data["membership"] = {"dp": files.policy.has_dp, "run": _auc_figures(membership)}
    return membership


def _auc_figures(result: MembershipResult) -> dict[str, Any]:
    """The JSON figures of a :class:`~fedgl_secure.privacy.attacks.MembershipResult`."""
    return {
        "auc": result.auc,
        "auc_stderr": result.auc_stderr,
        "attack": result.attack,
        "members": result.members,
        "variants": dict(result.variants),
    }


def _membership_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult | None,
    experiment: tuple[ExperimentConfig, GraphDataset, GraphTensors],
    seed: int,
    plan: ReferencePlan,
) -> None:
    """The without-DP side of membership inference, always ``info``.

    It describes the attack (how well it does when nothing protects the model), not the run: a high
    reference AUC is expected and must not colour the report; the run's own check carries the verdict.
    ``experiment`` is ``(config, dataset, merged graph)`` as the audit rebuilt them.
    """
    if membership is None:
        _reference_note(section, "not-run", "no reference: the run's own membership inference did not run")
    elif not files.policy.has_dp:
        _reference_note(section, "not-needed", "run has no DP; its AUC is the without-DP figure")
    elif plan.skipped:
        _reference_note(
            section,
            "skipped",
            "reference skipped (--no-reference): the membership AUC without DP was not measured, so this report "
            "does not show what DP changed",
        )
    else:
        _computed_reference(section, files, membership, experiment, seed, plan)


def _reference_note(section: Section, status: str, detail: str) -> None:
    """An info line (and its JSON status) for a reference that was not computed, or not needed."""
    section.add("membership-reference", INFO, detail)
    section.data.setdefault("membership", {})["reference"] = {"status": status, "detail": detail}


def _computed_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult,
    experiment: tuple[ExperimentConfig, GraphDataset, GraphTensors],
    seed: int,
    plan: ReferencePlan,
) -> None:
    """The reference from ``--reference`` or retrained, attacked; a failure is an info line, not an error,
    since the run's own verdict stands without it."""
    from fedgl_secure.privacy.reference import completed_rounds, retrain_reference

    config, dataset, merged = experiment
    try:
        model = plan.model or retrain_reference(config, dataset, completed_rounds(files.run), progress=plan.progress)
        reference = _membership_auc(model.weights, model.hidden, merged, seed)
    except (FedGLError, OSError, ValueError, RuntimeError) as error:
        _reference_note(section, "failed", f"reference not computed: {error}")
        return
    _report_reference(section, files, membership, model, reference)


def _report_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult,
    model: ReferenceModel,
    reference: MembershipResult,
) -> None:
    """The info check, the with/without-DP table and the JSON figures of a computed reference.

    The difference's standard error treats the two AUCs as independent; as both score the same
    nodes they are positively correlated, so it overstates the uncertainty (conservative).
    """
    difference = membership.auc - reference.auc
    difference_se = math.hypot(membership.auc_stderr, reference.auc_stderr)
    rounds = files.run.get("rounds_run")
    lag = f"; it trained {model.rounds} rounds, the run {rounds}" if model.rounds != rounds else ""
    section.add(
        "membership-reference",
        INFO,
        f"reference without DP, {model.source}{lag}: AUC {reference.auc:.3f} ± {reference.auc_stderr:.3f}; "
        f"this run with DP: {membership.auc:.3f} ± {membership.auc_stderr:.3f}; difference (run − reference) "
        f"{difference:+.3f} ± {difference_se:.3f}. Information, not a verdict: the attack's power on the model "
        "without DP",
    )
    section.tables.append(
        Table(
            "Membership inference with and without DP",
            ("model", "DP", "source", "AUC", "± s.e.", "best variant", "members"),
            (
                (
                    "audited run",
                    "yes",
                    str(files.directory.path),
                    membership.auc,
                    membership.auc_stderr,
                    membership.attack,
                    membership.members,
                ),
                (
                    "reference",
                    "no",
                    model.source,
                    reference.auc,
                    reference.auc_stderr,
                    reference.attack,
                    reference.members,
                ),
                ("difference (run − reference)", "", "", difference, difference_se, "", ""),
            ),
        )
    )
    figures = section.data.setdefault("membership", {})
    figures["reference"] = {
        "status": "computed",
        "source": model.source,
        "rounds": model.rounds,
        **_auc_figures(reference),
    }
    figures["difference"] = difference
    figures["difference_stderr"] = difference_se


def _link(section: Section, files: RunFiles, merged: GraphTensors, seed: int) -> LinkResult | None:
    """Link inference from the broadcast pseudo graph; the result, or None when there is none or it failed."""
    import torch

    from fedgl_secure.engine.pseudo_graph import PseudoGraph
    from fedgl_secure.privacy.attacks import link_inference_auc, true_edge_index

    if "pseudo_graph_neighbors" not in files.directory.model or "pseudo_graph_weights" not in files.directory.model:
        section.add("link", GREEN, "no pseudo graph in model.npz: nothing to infer links from")
        return None
    try:
        pseudo = PseudoGraph(
            torch.as_tensor(files.directory.model["pseudo_graph_neighbors"], dtype=torch.int64),
            torch.as_tensor(files.directory.model["pseudo_graph_weights"], dtype=torch.float32),
        )
        link = link_inference_auc(pseudo, true_edge_index(merged), merged.num_nodes, seed)
    except (ValueError, RuntimeError) as error:
        section.add("link", AMBER, f"link inference not run: {error}")
        return None
    section.add(
        "link",
        GREEN if link.auc <= LINK_AUC_GREEN else AMBER,
        f"link inference from the pseudo graph ({_dp_phrase(files)}): AUC {link.auc:.3f} ± {link.auc_stderr:.3f} "
        f"({link.positives} true edges vs {link.negatives} non-edges; green ≤ {LINK_AUC_GREEN}; "
        "homophily alone lifts it above 0.5)",
    )
    return link


def _experiment(files: RunFiles, data_root: str | Path | None) -> tuple[ExperimentConfig, GraphDataset]:
    """The run's experiment configuration from run.json (on the CPU; ``data_root`` if given) and its dataset."""
    config_values = files.run.get("config")
    if not config_values:
        raise ValueError(f"{RUN_FILE} has no 'config' to rebuild the federation from")
    from fedgl_secure.data.registry import load_dataset
    from fedgl_secure.engine.config import build_config

    values = dict(config_values)
    values["device"] = "cpu"
    if data_root is not None:
        values["data_root"] = str(data_root)
    config = build_config(values)
    return config, load_dataset(config.dataset, config.data_root, seed=config.seed, split=config.data)


def _merged(config: ExperimentConfig, dataset: GraphDataset) -> GraphTensors:
    """The federation's merged client graph (on the CPU): what the simulation evaluates W̄ on."""
    from fedgl_secure.engine.simulation import Federation, resolve_device

    return Federation.build(dataset, config, resolve_device("cpu")).merged


# --- the whole audit -----------------------------------------------------------------------------


def audit_run(
    run_dir: str | Path,
    policy_path: str | Path | None = None,
    *,
    data_root: str | Path | None = None,
    attacks: bool = True,
    seed: int = 0,
    reference_dir: str | Path | None = None,
    reference: bool = True,
    progress: bool = False,
) -> AuditReport:
    """Audit a run directory against its policy (or ``policy_path``).

    Raises :class:`~fedgl_secure.privacy.run_record.RunDirectoryError` for a bad RUN_DIR.

    For a DP run the membership attack also runs on a non-DP reference of the same experiment:
    ``reference_dir`` (checked to be one, else :class:`~fedgl_secure.privacy.reference.ReferenceRunError`),
    else retrained in-process (``progress``: a bar over its rounds); ``reference=False`` skips it.
    """
    if reference_dir is not None and not reference:
        raise ConfigError("--reference and --no-reference contradict each other: give one of them")
    files = read_run_dir(run_dir, policy_path)
    plan = _reference_plan(files, reference_dir, reference, progress)
    sections = [check_policy(files)]
    senders: set[str] = set(files.banks) | set(files.directory.bank_keys)
    later: list[Section] = []
    if files.directory.secure:
        audit_log, audit = check_audit_chain(files)
        receipts, valid = check_receipts(files)
        decryptions, rows = check_decryptions(files, audit, valid)
        senders |= {s for d in rows for s in d.senders}
        later = [decryptions, audit_log, receipts]
    sections.append(check_privacy(files, senders))
    sections.extend(later)
    sections.append(leakage_section(files))
    if attacks:
        sections.append(attack_section(files, data_root, seed, plan))
    else:
        skipped = Section("attacks", "Empirical attacks")
        skipped.add("not-run", AMBER, "attacks skipped (--no-attacks)")
        sections.append(skipped)
    keys = ("dataset", "method", "seed", "rounds_run", "best_round", "global_test_accuracy")
    run = {key: files.run.get(key) for key in keys} | recorded_ranking_metrics(files.run)
    return AuditReport(str(files.directory.path), files.policy_source, run, sections)


NOT_RECORDED = "not recorded"


def recorded_ranking_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The run's global test ROC-AUC, PR-AUC and recall at the top (and its top fraction), beside its accuracy.

    From run.json's ``global_test_metrics``; ``"not recorded"`` where it has none (a record written before
    runs kept them): the audit never fails for their absence.
    """
    metrics = result.get("global_test_metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    names = ("roc_auc", "pr_auc", "recall_at_top", "top_fraction")
    return {f"global_test_{name}": metrics.get(name, NOT_RECORDED) for name in names}


def _reference_plan(files: RunFiles, reference_dir: str | Path | None, retrain: bool, progress: bool) -> ReferencePlan:
    """Where the without-DP model comes from; a ``reference_dir`` is read and checked now, before any work,
    so that a wrong one fails the command (exit 2) instead of becoming a line in the report."""
    from fedgl_secure.privacy.reference import ReferencePlan, load_reference

    if reference_dir is not None:
        return ReferencePlan(model=load_reference(reference_dir, files.run))
    return ReferencePlan(retrain=retrain, progress=progress)
