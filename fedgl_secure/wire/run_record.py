"""What a run leaves for the audit: the run directory (DESIGN §6, ``fedgl-secure audit RUN_DIR``).

Layout, written by :func:`write_run_dir` and read back, validated, by :func:`load_run_dir`::

    run.json                    the run record (RunResult), the bank names, policy and secure-run facts
    policy.toml                 a byte-for-byte copy of the policy the run used (absent: no policy)
    model.npz                   the final broadcast: weights, and pseudo_labels / pseudo_graph_* if any
    privacy/<bank>.ledger.json  each bank's PrivacyLedger (with a policy)
    key-authority/              secure runs: ledger.sqlite3, audit.jsonl, audit_head (the chain's head hash)
    receipts.jsonl              secure runs: every receipt the aggregator accepted, one JSON object per line
    banks.json                  secure runs: bank name → Ed25519 receipt-signing public key (hex)

An auditor verifies the receipts against ``banks.json`` and the audit chain against ``audit_head``
(:func:`fedgl_secure.crypto.audit_log.verify_audit_chain`); the loader checks only that every file is
present and well formed, naming the first one that is not.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedgl_secure.errors import ConfigError, FedGLError
from fedgl_secure.privacy.accounting import PrivacyLedger

RUN_FORMAT = "fedgl-secure/run/1"
RUN_FILE = "run.json"
POLICY_FILE = "policy.toml"
MODEL_FILE = "model.npz"
PRIVACY_DIR = "privacy"
KEY_AUTHORITY_DIR = "key-authority"
RECEIPTS_FILE = "receipts.jsonl"
BANKS_FILE = "banks.json"
LEDGER_SUFFIX = ".ledger.json"
# key-authority/ holds the key authority's LEDGER_FILE and AUDIT_FILE (fedgl_secure.crypto.key_authority) and:
AUDIT_HEAD_FILE = "audit_head"  # the audit chain's head hash, as the key authority recorded it


class RunDirectoryError(ConfigError):
    """A run directory is missing a file, or a file in it is corrupt; the message names it."""


@dataclass
class RunDirectory:
    """A run directory as loaded: every file parsed, nothing verified beyond its form."""

    path: Path
    run: dict[str, Any]
    model: dict[str, np.ndarray]
    policy_text: str | None = None
    policy: Any = None  # the policy.toml copy as loaded (fedgl_secure.policy.schema.Policy); None: no policy
    ledgers: dict[str, PrivacyLedger] = field(default_factory=dict)
    receipts: list = field(default_factory=list)
    bank_keys: dict[str, str] = field(default_factory=dict)
    key_authority_dir: Path | None = None
    audit_head: str | None = None

    @property
    def secure(self) -> bool:
        return bool(self.run.get("secure"))


def ledger_path(run_dir: Path, bank: str) -> Path:
    return Path(run_dir) / PRIVACY_DIR / f"{bank}{LEDGER_SUFFIX}"


@dataclass(frozen=True)
class SecureRecord:
    """What a secure run leaves besides its result: the facts :func:`write_run_dir` records, as plain data.

    From a simulation's :class:`~fedgl_secure.crypto.secure_summation.SecureSummation`
    (:meth:`from_summation`) or from a consortium's nodes' files
    (:func:`fedgl_secure.services.run_export.collect_consortium_run`).
    """

    federation: str
    fingerprint: str | None  # the CKKS context's
    key_authority_dir: Path  # the key authority's state directory: its LEDGER_FILE and AUDIT_FILE
    audit_head: str  # the audit chain's head, as the key authority recorded it
    receipts: list  # every Receipt the aggregator accepted
    bank_public_keys: dict[str, str]  # bank name → Ed25519 receipt-signing public key (hex)

    @classmethod
    def from_summation(cls, summation) -> SecureRecord:
        """The record of a simulation's SecureSummation, still open."""
        return cls(
            federation=summation.federation,
            fingerprint=summation.fingerprint,
            key_authority_dir=Path(summation.state_dir),
            audit_head=summation.authority.audit.head,
            receipts=list(summation.accepted_receipts),
            bank_public_keys=dict(summation.bank_public_keys()),
        )


def stopped_rounds(privacy) -> dict[str, int]:
    """Bank → the round it stopped contributing at, from a FederationPrivacy (None: no policy, none stopped)."""
    if privacy is None:
        return {}
    return {b.bank: b.stopped_round for b in privacy.banks.values() if b.stopped_round is not None}


def write_run_dir(
    run_dir: str | Path,
    result: dict[str, Any],
    *,
    final_broadcast=None,
    policy_path: str | Path | None = None,
    ledgers: dict[str, PrivacyLedger] | None = None,
    stopped_banks: dict[str, int] | None = None,
    secure: SecureRecord | None = None,
) -> Path:
    """Write the run directory of a finished run (see the module doc); returns its path.

    ``result`` is the RunResult as a dict, ``final_broadcast`` the last Broadcast (for model.npz; a
    caller may write model.npz itself), ``ledgers`` each bank's PrivacyLedger (None: no policy),
    ``stopped_banks`` bank → the round it stopped contributing at, ``secure`` a secure run's record.
    """
    from fedgl_secure.wire.broadcast import encode_broadcast

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "format": RUN_FORMAT,
        "secure": secure is not None,
        "policy": POLICY_FILE if policy_path is not None else None,
        "banks": sorted(ledgers) if ledgers is not None else [],
        "stopped_banks": dict(stopped_banks or {}),
        "result": result,
    }
    if secure is not None:
        record["federation"] = secure.federation
        record["context_fingerprint"] = secure.fingerprint
    if policy_path is not None:
        from fedgl_secure.policy.schema import load_policy

        shutil.copyfile(policy_path, run_dir / POLICY_FILE)
        record["privacy_unit"] = load_policy(policy_path).dp.effective_unit  # what one protected change is
    if final_broadcast is not None:
        (run_dir / MODEL_FILE).write_bytes(encode_broadcast(final_broadcast))
    if ledgers is not None:
        (run_dir / PRIVACY_DIR).mkdir(exist_ok=True)
        for bank, ledger in ledgers.items():
            ledger.save(ledger_path(run_dir, bank))
    if secure is not None:
        _copy_key_authority(secure, run_dir / KEY_AUTHORITY_DIR)
        with open(run_dir / RECEIPTS_FILE, "w", encoding="utf-8") as out:
            for receipt in secure.receipts:
                out.write(receipt.model_dump_json() + "\n")
        (run_dir / BANKS_FILE).write_text(json.dumps(secure.bank_public_keys, indent=2) + "\n")
    # run.json last: its presence says the directory is complete
    (run_dir / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return run_dir


def _copy_key_authority(secure: SecureRecord, target: Path) -> None:
    """The key authority's ledger (a consistent SQLite backup), audit log and audit head."""
    from fedgl_secure.crypto.key_authority import AUDIT_FILE, LEDGER_FILE

    target.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(secure.key_authority_dir / LEDGER_FILE)
    destination = sqlite3.connect(target / LEDGER_FILE)
    try:
        source.backup(destination)
    finally:
        destination.close()
        source.close()
    shutil.copyfile(secure.key_authority_dir / AUDIT_FILE, target / AUDIT_FILE)
    (target / AUDIT_HEAD_FILE).write_text(secure.audit_head + "\n", encoding="ascii")


def _require(path: Path) -> Path:
    if not path.is_file():
        raise RunDirectoryError(f"{path}: missing from the run directory")
    return path


def _json(path: Path) -> Any:
    try:
        return json.loads(_require(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunDirectoryError(f"{path}: corrupt JSON ({error})") from None


def load_run_dir(run_dir: str | Path) -> RunDirectory:
    """Read a run directory back; raises :class:`RunDirectoryError` naming the first missing or corrupt file."""
    from fedgl_secure.crypto.receipts import load_public_key, parse_receipt
    from fedgl_secure.policy.schema import load_policy

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirectoryError(f"{run_dir}: not a directory")
    run = _json(run_dir / RUN_FILE)
    if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
        raise RunDirectoryError(f"{run_dir / RUN_FILE}: format is not {RUN_FORMAT!r}")
    for key in ("secure", "banks", "result"):
        if key not in run:
            raise RunDirectoryError(f"{run_dir / RUN_FILE}: {key}: missing")
    try:
        with np.load(io.BytesIO(_require(run_dir / MODEL_FILE).read_bytes()), allow_pickle=False) as archive:
            model = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError) as error:
        raise RunDirectoryError(f"{run_dir / MODEL_FILE}: not a valid array bundle ({error})") from None
    if "weights" not in model or not np.all(np.isfinite(model["weights"])):
        raise RunDirectoryError(f"{run_dir / MODEL_FILE}: weights missing or not finite")
    loaded = RunDirectory(run_dir, run, model)
    if run.get("policy") is not None:
        try:
            loaded.policy = load_policy(_require(run_dir / POLICY_FILE))
        except FedGLError as error:
            raise RunDirectoryError(str(error)) from None
        loaded.policy_text = (run_dir / POLICY_FILE).read_text(encoding="utf-8")
    for bank in run["banks"]:
        path = _require(ledger_path(run_dir, bank))
        try:
            loaded.ledgers[bank] = PrivacyLedger.load(path)
        except FedGLError as error:
            raise RunDirectoryError(str(error)) from None
        if loaded.ledgers[bank].bank != bank:
            raise RunDirectoryError(f"{path}: ledger of {loaded.ledgers[bank].bank!r}, expected {bank!r}")
    if loaded.secure:
        from fedgl_secure.crypto.key_authority import AUDIT_FILE, LEDGER_FILE

        ka = run_dir / KEY_AUTHORITY_DIR
        for name in (LEDGER_FILE, AUDIT_FILE, AUDIT_HEAD_FILE):
            _require(ka / name)
        loaded.key_authority_dir = ka
        loaded.audit_head = (ka / AUDIT_HEAD_FILE).read_text(encoding="ascii").strip()
        if len(loaded.audit_head) != 64:
            raise RunDirectoryError(f"{ka / AUDIT_HEAD_FILE}: not a SHA-256 hex digest")
        keys = _json(run_dir / BANKS_FILE)
        if not isinstance(keys, dict):
            raise RunDirectoryError(f"{run_dir / BANKS_FILE}: expected an object bank → public key hex")
        for bank, key in keys.items():
            try:
                load_public_key(bytes.fromhex(key))
            except (ValueError, TypeError, FedGLError) as error:
                raise RunDirectoryError(f"{run_dir / BANKS_FILE}: {bank}: {error}") from None
        loaded.bank_keys = dict(keys)
        lines = _require(run_dir / RECEIPTS_FILE).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                loaded.receipts.append(parse_receipt(line))
            except FedGLError as error:
                raise RunDirectoryError(f"{run_dir / RECEIPTS_FILE}: line {number}: {error}") from None
    return loaded
