"""Reading a run directory for the audit (through ``wire.run_record.load_run_dir``), read-only: the key
authority's SQLite ledger is copied to a temporary directory before it is opened.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgl_secure.wire.run_record import (
    POLICY_FILE,
    RunDirectory,
    load_run_dir,
)

if TYPE_CHECKING:
    from fedgl_secure.policy.schema import Policy

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
    """Read a run directory with :func:`~fedgl_secure.wire.run_record.load_run_dir`.

    Raises :class:`~fedgl_secure.wire.run_record.RunDirectoryError` naming the first missing or
    corrupt file. ``policy_path`` audits against another policy than the run's own ``policy.toml``
    copy; a run that recorded no policy (a plaintext simulation) is audited as ``protection = "none"``.
    """
    from fedgl_secure.policy.schema import Policy, load_policy

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
