"""The key authority's durable state in SQLite: registered banks, opened rounds, decryptions.

The decryption ledger is what blocks differencing attacks: a sum of (round, kind) is decrypted at
most once, and each ciphertext (named by the SHA-256 of its ``c1``) at most once per federation, even
across restarts, so an aggregator cannot obtain Σ over banks {A, B, C} and then Σ over {A, B} for the
same values. The count of decrypted ciphertexts is the query budget the noise flooding is sized for.
The audit log's head hash lives here too, so a truncated log is detected at the next start.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS banks (name TEXT PRIMARY KEY, public_key BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    federation TEXT NOT NULL, round INTEGER NOT NULL, nonce TEXT NOT NULL, participants TEXT NOT NULL,
    opened_at TEXT NOT NULL, PRIMARY KEY (federation, round, nonce));
CREATE TABLE IF NOT EXISTS decryptions (
    federation TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL, nonce TEXT NOT NULL,
    senders TEXT NOT NULL, decrypted_at TEXT NOT NULL, PRIMARY KEY (federation, round, kind));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decrypted_ciphertexts (
    federation TEXT NOT NULL, c1_sha256 TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL,
    PRIMARY KEY (federation, c1_sha256));
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class OpenRound:
    """The round a federation currently has open (the latest one opened)."""

    federation: str
    round: int
    nonce: str
    participants: tuple[str, ...]


class Ledger:
    """Thin, transactional access to the key authority's SQLite file (one connection, caller locks)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute("PRAGMA synchronous=FULL")
        self.connection.executescript(SCHEMA)

    def close(self) -> None:
        self.connection.close()

    def register_bank(self, name: str, public_key: bytes) -> bytes:
        """Store a bank's signing key; returns the key on record (an existing one is never replaced)."""
        with self.connection:
            self.connection.execute("INSERT OR IGNORE INTO banks VALUES (?, ?)", (name, public_key))
        row = self.connection.execute("SELECT public_key FROM banks WHERE name = ?", (name,)).fetchone()
        return bytes(row[0])

    def banks(self) -> dict[str, bytes]:
        return {name: bytes(key) for name, key in self.connection.execute("SELECT name, public_key FROM banks")}

    def open_round(self, federation: str, round_number: int, nonce: str, participants: tuple[str, ...]) -> None:
        with self.connection:
            self.connection.execute(
                "INSERT INTO rounds VALUES (?, ?, ?, ?, ?)",
                (federation, round_number, nonce, json.dumps(list(participants)), _now()),
            )

    def current_round(self, federation: str) -> OpenRound | None:
        """The most recently opened round of ``federation`` (a reopened round replaces its nonce)."""
        row = self.connection.execute(
            "SELECT round, nonce, participants FROM rounds WHERE federation = ? ORDER BY rowid DESC LIMIT 1",
            (federation,),
        ).fetchone()
        if row is None:
            return None
        return OpenRound(federation, int(row[0]), row[1], tuple(json.loads(row[2])))

    def was_decrypted(self, federation: str, round_number: int, kind: str) -> bool:
        row = self.connection.execute(
            "SELECT 1 FROM decryptions WHERE federation = ? AND round = ? AND kind = ?",
            (federation, round_number, kind),
        ).fetchone()
        return row is not None

    def record_decryption(
        self,
        federation: str,
        round_number: int,
        kind: str,
        nonce: str,
        senders: tuple[str, ...],
        ciphertexts: Sequence[str],
    ) -> bool:
        """Claim (round, kind) and its ciphertexts (``c1`` digests) in one transaction; ``False`` when either was
        already claimed (the primary keys decide)."""
        try:
            with self.connection:
                self.connection.execute(
                    "INSERT INTO decryptions VALUES (?, ?, ?, ?, ?, ?)",
                    (federation, round_number, kind, nonce, json.dumps(list(senders)), _now()),
                )
                self.connection.executemany(
                    "INSERT INTO decrypted_ciphertexts VALUES (?, ?, ?, ?)",
                    [(federation, digest, round_number, kind) for digest in ciphertexts],
                )
        except sqlite3.IntegrityError:
            return False
        return True

    def decrypted_ciphertexts(self, federation: str, digests: Sequence[str]) -> set[str]:
        """Those of ``digests`` (``c1`` SHA-256) already decrypted in ``federation``."""
        wanted = list(digests)
        if not wanted:
            return set()
        marks = ", ".join("?" * len(wanted))
        rows = self.connection.execute(
            f"SELECT c1_sha256 FROM decrypted_ciphertexts WHERE federation = ? AND c1_sha256 IN ({marks})",
            (federation, *wanted),
        )
        return {digest for (digest,) in rows}

    def decryption_count(self) -> int:
        """Ciphertexts decrypted under this key, every federation together (the flooding's query count)."""
        return int(self.connection.execute("SELECT COUNT(*) FROM decrypted_ciphertexts").fetchone()[0])

    def get_meta(self, key: str) -> str | None:
        row = self.connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self.connection:
            self.connection.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
