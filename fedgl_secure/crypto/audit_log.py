"""Hash-chained audit log: an append-only JSON-lines file whose lines cannot be altered unnoticed.

Each record carries ``prev`` (the hash of the record before it; 64 zeros for the first) and
``hash`` (SHA-256 of the record's canonical JSON without ``hash``). Editing a line breaks its own
hash; rewriting a line consistently breaks the next line's ``prev``; removing or inserting lines
breaks a link; cutting the tail is caught by looking for a head hash kept elsewhere
(the key authority keeps it in its SQLite ledger).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fedgl_secure.errors import CryptoError

GENESIS = "0" * 64


class AuditChainError(CryptoError):
    """The audit log's hash chain is broken (the file was altered, truncated or reordered)."""


def record_hash(record: dict) -> str:
    """SHA-256 of a record's canonical JSON (sorted keys, compact), ``hash`` field excluded."""
    body = {key: value for key, value in record.items() if key != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    """Outcome of :func:`verify_audit_chain`; ``broken_line`` is 1-based, ``None`` when intact."""

    ok: bool
    lines: int
    head: str
    broken_line: int | None = None
    problem: str | None = None


def verify_audit_chain(path: str | Path, expected_head: str | None = None) -> ChainReport:
    """Walk the chain and report the first broken link.

    With ``expected_head`` (a hash recorded elsewhere after an append) the chain must also contain
    that record: a log cut before it was truncated. The log may extend past it (a crash between
    appending and recording the head loses nothing).
    """
    path = Path(path)
    previous, count, seen_head = GENESIS, 0, expected_head in (None, GENESIS)
    if path.exists():
        with path.open("r", encoding="utf-8") as handle:
            for count, line in enumerate(handle, start=1):
                problem = _line_problem(line, previous, count)
                if problem is not None:
                    return ChainReport(False, count, previous, count, problem)
                previous = json.loads(line)["hash"]
                seen_head = seen_head or previous == expected_head
    if not seen_head:
        return ChainReport(
            False,
            count,
            previous,
            count + 1,
            f"the recorded head {expected_head[:12]}… is not in the {count} lines present "
            "(lines were cut from the end)",
        )
    return ChainReport(True, count, previous)


def _line_problem(line: str, previous: str, number: int) -> str | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return f"line {number}: not valid JSON"
    if not isinstance(record, dict) or "hash" not in record or "prev" not in record:
        return f"line {number}: not an audit record (no 'hash'/'prev')"
    if record_hash(record) != record["hash"]:
        return f"line {number}: content does not match its hash (the line was altered)"
    if record["prev"] != previous:
        return (
            f"line {number}: 'prev' does not match the hash of line {number - 1} "
            "(a line was removed, inserted or rewritten)"
        )
    return None


class AuditLog:
    """Appends records to the chain; refuses to open a file whose chain is already broken."""

    def __init__(self, path: str | Path, expected_head: str | None = None) -> None:
        self.path = Path(path)
        report = verify_audit_chain(self.path, expected_head)
        if not report.ok:
            raise AuditChainError(f"{self.path}: {report.problem}")
        self.head = report.head
        self.lines = report.lines

    def append(self, event: dict) -> dict:
        """Write one record (``event`` plus seq, time, prev, hash), flushed to disk; return it."""
        record = {
            **event,
            "seq": self.lines + 1,
            "time": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
            "prev": self.head,
        }
        record["hash"] = record_hash(record)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.head, self.lines = record["hash"], self.lines + 1
        return record
