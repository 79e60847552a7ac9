"""Audit sections 1 and 2: the run's policy conformance (protection, HE security, quorum, guarantees, the key
authority's parameters) and the ε spent per bank and channel against the budget, with the run's stop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fedgl_secure.audit.report_model import (
    AMBER,
    BUDGET_WARNING_FRACTION,
    GREEN,
    INFO,
    RED,
    Check,
    Plot,
    Section,
    Table,
)
from fedgl_secure.audit.run_files import KeyAuthorityLedger, RunFiles
from fedgl_secure.errors import FedGLError
from fedgl_secure.wire.run_record import (
    LEDGER_SUFFIX,
    PRIVACY_DIR,
    RUN_FILE,
)

if TYPE_CHECKING:
    from fedgl_secure.policy.schema import Policy

# --- 1. policy conformance -----------------------------------------------------------------------


def check_policy(files: RunFiles) -> Section:
    """Protection, HE security, quorum and the effective guarantees."""
    from fedgl_secure.policy.he_security import max_total_bits, security_check
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
