"""The aggregator's durable state (SQLite): enrolments, the union index, models, rounds, sums, reports.

A round of a method with several stages (GraphFL: a meta step, then fine-tuning) also keeps the
broadcast each stage but the last publishes (``stage_models``: the next stage starts from it), and a
method that keeps state on the server between rounds (GraphFL's meta optimiser) has it stored with
each model version (``server_states``), so a retried or resumed round starts from the same state.
Every accepted upload's receipt is kept too, for the run directory an audit reads, and every bank's
withdrawal (a bank whose privacy budget is spent), with the reason the run stopped, if it did.
A restarted aggregator resumes from here: every applied round's broadcast is stored with the
round that produced it (in the same transaction), and every decrypted sum is stored the moment
the key authority returns it — the key authority decrypts each (round, kind) only once, so a
sum that was not written down could never be asked for again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedgl_secure.engine.evaluation import ratio
from fedgl_secure.engine.score_histograms import histogram_metrics

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS enrolments (
    bank TEXT PRIMARY KEY, num_features INTEGER NOT NULL, num_classes INTEGER NOT NULL,
    pseudonyms TEXT NOT NULL, enrolled_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS positions (bank TEXT PRIMARY KEY, positions BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    version INTEGER PRIMARY KEY, round INTEGER, arrays BLOB NOT NULL, contributors TEXT NOT NULL,
    created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, base_version INTEGER NOT NULL, nonce TEXT NOT NULL,
    participants TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
    opened_at REAL NOT NULL, closed_at REAL, contributors TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS sums (
    round INTEGER NOT NULL, kind TEXT NOT NULL, nonce TEXT NOT NULL, vector BLOB NOT NULL,
    contributors TEXT NOT NULL, PRIMARY KEY (round, kind));
CREATE TABLE IF NOT EXISTS reports (
    version INTEGER NOT NULL, bank TEXT NOT NULL, val_correct INTEGER NOT NULL, val_total INTEGER NOT NULL,
    test_correct INTEGER NOT NULL, test_total INTEGER NOT NULL, PRIMARY KEY (version, bank));
CREATE TABLE IF NOT EXISTS report_histograms (
    version INTEGER NOT NULL, bank TEXT NOT NULL, histograms BLOB NOT NULL, PRIMARY KEY (version, bank));
CREATE TABLE IF NOT EXISTS receipts (
    round INTEGER NOT NULL, nonce TEXT NOT NULL, bank TEXT NOT NULL, kind TEXT NOT NULL, receipt TEXT NOT NULL,
    accepted_at REAL NOT NULL, PRIMARY KEY (round, nonce, bank, kind));
CREATE TABLE IF NOT EXISTS stage_models (
    round INTEGER NOT NULL, stage TEXT NOT NULL, arrays BLOB NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (round, stage));
CREATE TABLE IF NOT EXISTS server_states (version INTEGER PRIMARY KEY, arrays BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS withdrawals (
    bank TEXT PRIMARY KEY, reason TEXT NOT NULL, round INTEGER NOT NULL, withdrawn_at REAL NOT NULL);
"""
FINISHED = "finished"
STOPPED_REASON = "stopped_reason"


@dataclass(frozen=True)
class RoundRow:
    round: int
    base_version: int
    nonce: str
    participants: tuple[str, ...]
    status: str
    attempts: int
    opened_at: float
    closed_at: float | None
    contributors: tuple[str, ...]
    detail: str | None


@dataclass(frozen=True)
class Withdrawal:
    """A bank that takes no further part in the run: why, and the round it declined."""

    bank: str
    reason: str
    round: int
    withdrawn_at: float


@dataclass(frozen=True)
class Enrolment:
    bank: str
    num_features: int
    num_classes: int
    pseudonyms: tuple[str, ...]


class AggregatorStore:
    """Thread-safe access to ``aggregator.sqlite3`` (one connection, one lock, durable commits)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, statements: list[tuple[str, tuple]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, parameters in statements:
                    self._db.execute(sql, parameters)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, parameters: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, parameters).fetchall()

    # --- meta --------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))])

    def finish(self, stopped_reason: str | None = None) -> None:
        """Mark the federation finished, with the reason it stopped early (if it did), in one transaction."""
        statements = [("INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (FINISHED,))]
        if stopped_reason is not None:
            statements.append(
                ("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (STOPPED_REASON, stopped_reason))
            )
        self._write(statements)

    def finished(self) -> bool:
        return self.get_meta(FINISHED) == "1"

    def stopped_reason(self) -> str | None:
        return self.get_meta(STOPPED_REASON)

    # --- withdrawals ----------------------------------------------------------------------------

    def withdraw(self, bank: str, reason: str, round_number: int) -> Withdrawal:
        """Record a bank's withdrawal (the first one stands: a repeat changes nothing); returns the record."""
        self._write(
            [
                (
                    "INSERT OR IGNORE INTO withdrawals (bank, reason, round, withdrawn_at) VALUES (?, ?, ?, ?)",
                    (bank, reason, round_number, time.time()),
                )
            ]
        )
        return self.withdrawals()[bank]

    def withdrawals(self) -> dict[str, Withdrawal]:
        rows = self._read("SELECT bank, reason, round, withdrawn_at FROM withdrawals ORDER BY withdrawn_at, bank")
        return {row[0]: Withdrawal(*row) for row in rows}

    # --- enrolment and the union index ------------------------------------------------------

    def enrolment(self, bank: str) -> Enrolment | None:
        rows = self._read("SELECT num_features, num_classes, pseudonyms FROM enrolments WHERE bank = ?", (bank,))
        if not rows:
            return None
        features, classes, pseudonyms = rows[0]
        return Enrolment(bank, features, classes, tuple(json.loads(pseudonyms)))

    def enrolled_banks(self) -> list[str]:
        """The banks that have enrolled (names only: cheap)."""
        return [bank for (bank,) in self._read("SELECT bank FROM enrolments ORDER BY bank")]

    def enrolments(self) -> dict[str, Enrolment]:
        rows = self._read("SELECT bank, num_features, num_classes, pseudonyms FROM enrolments ORDER BY bank")
        return {
            bank: Enrolment(bank, features, classes, tuple(json.loads(pseudonyms)))
            for bank, features, classes, pseudonyms in rows
        }

    def enrol(self, enrolment: Enrolment) -> None:
        self._write(
            [
                (
                    "INSERT INTO enrolments (bank, num_features, num_classes, pseudonyms, enrolled_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        enrolment.bank,
                        enrolment.num_features,
                        enrolment.num_classes,
                        json.dumps(list(enrolment.pseudonyms)),
                        time.time(),
                    ),
                )
            ]
        )

    def save_index(self, num_global_nodes: int, positions: dict[str, np.ndarray]) -> None:
        statements = [
            ("INSERT OR REPLACE INTO meta (key, value) VALUES ('num_global_nodes', ?)", (str(num_global_nodes),))
        ]
        statements += [
            ("INSERT OR REPLACE INTO positions (bank, positions) VALUES (?, ?)", (bank, pos.astype("<i8").tobytes()))
            for bank, pos in positions.items()
        ]
        self._write(statements)

    def index(self) -> tuple[int, dict[str, np.ndarray]] | None:
        size = self.get_meta("num_global_nodes")
        if size is None:
            return None
        rows = self._read("SELECT bank, positions FROM positions")
        return int(size), {bank: np.frombuffer(blob, dtype="<i8").copy() for bank, blob in rows}

    # --- models and rounds ------------------------------------------------------------------

    def save_initial_model(self, arrays: bytes) -> None:
        self._write(
            [
                (
                    "INSERT OR IGNORE INTO models (version, round, arrays, contributors, created_at) "
                    "VALUES (0, NULL, ?, '[]', ?)",
                    (arrays, time.time()),
                )
            ]
        )

    def model(self, version: int) -> bytes | None:
        rows = self._read("SELECT arrays FROM models WHERE version = ?", (version,))
        return rows[0][0] if rows else None

    def latest_version(self) -> int | None:
        rows = self._read("SELECT MAX(version) FROM models")
        return rows[0][0] if rows and rows[0][0] is not None else None

    def open_round(self, round_number: int, base_version: int, nonce: str, participants: tuple[str, ...]) -> None:
        """Record round ``round_number`` as open (a reopened round keeps its row and counts the attempt)."""
        self._write(
            [
                (
                    "INSERT INTO rounds (round, base_version, nonce, participants, status, attempts, opened_at) "
                    "VALUES (?, ?, ?, ?, 'open', 1, ?) ON CONFLICT(round) DO UPDATE SET nonce = excluded.nonce, "
                    "participants = excluded.participants, status = 'open', attempts = rounds.attempts + 1, "
                    "opened_at = excluded.opened_at, closed_at = NULL, detail = NULL",
                    (round_number, base_version, nonce, json.dumps(list(participants)), time.time()),
                )
            ]
        )

    def close_round(self, round_number: int, status: str, detail: str | None = None) -> None:
        self._write(
            [
                (
                    "UPDATE rounds SET status = ?, closed_at = ?, detail = ? WHERE round = ?",
                    (status, time.time(), detail, round_number),
                )
            ]
        )

    def apply_round(
        self,
        round_number: int,
        version: int,
        arrays: bytes,
        contributors: tuple[str, ...],
        server_state: bytes | None = None,
    ) -> None:
        """Store the round's broadcast (and the method's server state after it, if it keeps one) and mark the
        round applied, in one transaction (never half-applied)."""
        names = json.dumps(list(contributors))
        state = (
            []
            if server_state is None
            else [("INSERT OR REPLACE INTO server_states (version, arrays) VALUES (?, ?)", (version, server_state))]
        )
        self._write(
            [
                *state,
                (
                    "INSERT INTO models (version, round, arrays, contributors, created_at) VALUES (?, ?, ?, ?, ?)",
                    (version, round_number, arrays, names, time.time()),
                ),
                (
                    "UPDATE rounds SET status = 'applied', closed_at = ?, contributors = ? WHERE round = ?",
                    (time.time(), names, round_number),
                ),
            ]
        )

    def server_state(self, version: int) -> bytes | None:
        """The method's server state stored with model ``version`` (None: the method keeps none, or version 0)."""
        rows = self._read("SELECT arrays FROM server_states WHERE version = ?", (version,))
        return rows[0][0] if rows else None

    def save_stage_model(self, round_number: int, stage: str, arrays: bytes) -> None:
        """The broadcast after ``stage`` of round ``round_number``, which the round's next stage starts from."""
        self._write(
            [
                (
                    "INSERT OR REPLACE INTO stage_models (round, stage, arrays, created_at) VALUES (?, ?, ?, ?)",
                    (round_number, stage, arrays, time.time()),
                )
            ]
        )

    def stage_model(self, round_number: int, stage: str) -> bytes | None:
        rows = self._read("SELECT arrays FROM stage_models WHERE round = ? AND stage = ?", (round_number, stage))
        return rows[0][0] if rows else None

    def round(self, round_number: int) -> RoundRow | None:
        rows = self._read(
            "SELECT round, base_version, nonce, participants, status, attempts, opened_at, closed_at, contributors, "
            "detail FROM rounds WHERE round = ?",
            (round_number,),
        )
        return _round_row(rows[0]) if rows else None

    def rounds(self) -> list[RoundRow]:
        rows = self._read(
            "SELECT round, base_version, nonce, participants, status, attempts, opened_at, closed_at, contributors, "
            "detail FROM rounds ORDER BY round"
        )
        return [_round_row(row) for row in rows]

    def last_round_number(self) -> int:
        rows = self._read("SELECT MAX(round) FROM rounds")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    # --- decrypted sums ---------------------------------------------------------------------

    def save_sum(
        self, round_number: int, kind: str, nonce: str, vector: np.ndarray, contributors: tuple[str, ...]
    ) -> None:
        self._write(
            [
                (
                    "INSERT OR REPLACE INTO sums (round, kind, nonce, vector, contributors) VALUES (?, ?, ?, ?, ?)",
                    (round_number, kind, nonce, vector.astype("<f8").tobytes(), json.dumps(list(contributors))),
                )
            ]
        )

    def sums(self, round_number: int) -> dict[str, tuple[str, np.ndarray, tuple[str, ...]]]:
        rows = self._read("SELECT kind, nonce, vector, contributors FROM sums WHERE round = ?", (round_number,))
        return {
            kind: (nonce, np.frombuffer(blob, dtype="<f8").copy(), tuple(json.loads(names)))
            for kind, nonce, blob, names in rows
        }

    # --- evaluation reports -----------------------------------------------------------------

    def save_report(
        self, version: int, bank: str, counts: tuple[int, int, int, int], histograms: np.ndarray | None = None
    ) -> None:
        statements = [
            (
                "INSERT OR REPLACE INTO reports (version, bank, val_correct, val_total, test_correct, test_total) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (version, bank, *counts),
            )
        ]
        if histograms is not None:
            statements.append(
                (
                    "INSERT OR REPLACE INTO report_histograms (version, bank, histograms) VALUES (?, ?, ?)",
                    (version, bank, np.ascontiguousarray(histograms, dtype="<i8").tobytes()),
                )
            )
        self._write(statements)

    def pooled_histograms(self, version: int) -> np.ndarray | None:
        """The banks' score histograms of ``version`` summed (``4 × bins``), or None when none reported any."""
        rows = self._read("SELECT histograms FROM report_histograms WHERE version = ?", (version,))
        if not rows:
            return None
        return sum(np.frombuffer(blob, dtype="<i8").reshape(4, -1) for (blob,) in rows)

    def pooled_reports(self) -> dict[int, tuple[int, int, int, int, int]]:
        """Per model version: (banks reporting, val correct, val total, test correct, test total)."""
        rows = self._read(
            "SELECT version, COUNT(*), SUM(val_correct), SUM(val_total), SUM(test_correct), SUM(test_total) "
            "FROM reports GROUP BY version ORDER BY version"
        )
        return {row[0]: tuple(int(v) for v in row[1:]) for row in rows}

    # --- accepted receipts (for the run directory's receipts.jsonl) ---------------------------

    def save_receipt(self, receipt) -> None:
        """Keep an accepted upload's receipt (a :class:`~fedgl_secure.crypto.receipts.Receipt`); repeats are ignored."""
        self._write(
            [
                (
                    "INSERT OR IGNORE INTO receipts (round, nonce, bank, kind, receipt, accepted_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        receipt.round,
                        receipt.nonce,
                        receipt.sender,
                        receipt.kind,
                        receipt.model_dump_json(),
                        time.time(),
                    ),
                )
            ]
        )

    def receipts(self) -> list[str]:
        """Every accepted receipt (JSON), in the order they were accepted."""
        return [row[0] for row in self._read("SELECT receipt FROM receipts ORDER BY rowid")]


def _round_row(row: tuple) -> RoundRow:
    round_number, base, nonce, participants, status, attempts, opened, closed, contributors, detail = row
    return RoundRow(
        round_number,
        base,
        nonce,
        tuple(json.loads(participants)),
        status,
        attempts,
        opened,
        closed,
        tuple(json.loads(contributors)) if contributors else (),
        detail,
    )


PooledReport = tuple[int, int, int, int, int]
"""(reports, val correct, val total, test correct, test total) of one model version, over the banks."""


def validation_scores(store: AggregatorStore, reports: Mapping[int, PooledReport], selection: str) -> dict[int, float]:
    """Per model version of ``reports``, the pooled validation figure that selects the final model
    (``evaluation.selection``): accuracy from the counts, or PR-AUC from the score histograms (a version
    without histograms is left out: it is never chosen)."""
    if selection == "accuracy":
        return {version: ratio(report[1], report[2]) for version, report in reports.items()}
    scores = {}
    for version in reports:
        histograms = store.pooled_histograms(version)
        if histograms is not None:
            scores[version] = histogram_metrics(histograms[:2]).pr_auc
    return scores


def best_report(
    reports: Mapping[int, PooledReport],
    versions: Collection[int] | None = None,
    scores: Mapping[int, float] | None = None,
) -> tuple[int, PooledReport] | None:
    """The model version with the best pooled validation figure (``scores``, by default accuracy; the earliest
    on a tie; NaN never wins), with its pooled counts; None without reports. ``versions`` restricts the
    choice (e.g. to applied rounds' results)."""
    if scores is None:
        scores = {version: ratio(report[1], report[2]) for version, report in reports.items()}

    def key(item: tuple[int, PooledReport]) -> tuple[float, int]:
        score = scores.get(item[0], float("nan"))
        return (score if score == score else float("-inf"), -item[0])

    candidates = ((v, r) for v, r in reports.items() if versions is None or v in versions)
    return max(candidates, key=key, default=None)


def pooled_test_metrics(store: AggregatorStore, version: int | None, top_fraction: float) -> dict | None:
    """ROC-AUC, PR-AUC and recall at the top of model ``version`` on the banks' pooled test customers, from
    their score histograms (None without them: no positive class, or nothing reported)."""
    histograms = None if version is None else store.pooled_histograms(version)
    return None if histograms is None else histogram_metrics(histograms[2:], top_fraction).to_dict()


def round_history(
    store: AggregatorStore, reports: dict[int, tuple[int, int, int, int, int]] | None = None
) -> list[dict]:
    """Every round as a row for status pages and run records, with the pooled accuracy of its result.

    ``reports`` is :meth:`AggregatorStore.pooled_reports` when the caller has already read it.
    """
    if reports is None:
        reports = store.pooled_reports()
    history = []
    for row in store.rounds():
        pooled = reports.get(row.base_version + 1) if row.status == "applied" else None
        history.append(
            {
                "round": row.round,
                "base_version": row.base_version,
                "status": row.status,
                "attempts": row.attempts,
                "participants": list(row.participants),
                "contributors": list(row.contributors),
                "seconds": (row.closed_at - row.opened_at) if row.closed_at else None,
                "detail": row.detail,
                "val_accuracy": pooled[1] / pooled[2] if pooled and pooled[2] else None,
                "test_accuracy": pooled[3] / pooled[4] if pooled and pooled[4] else None,
            }
        )
    return history
