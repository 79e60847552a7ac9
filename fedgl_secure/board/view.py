"""What the board shows (:class:`BoardView`), built from its sources (:mod:`fedgl_secure.board.sources`).

Progress, the rounds' pooled validation accuracy, which bank took part in which round, time by phase, ε spent per
bank and channel, the decryption ledger in summary, and the audit's verdict. Everything shown is a figure about the
run — bank and round names, counts, seconds, accuracies, ε — never a pseudonym, a customer id, a key or a nonce: the
rounds' and the ledger's rows are reduced to such figures here, before any template sees them.

The sources complement each other: a finished run's directory is the record; while a run is live there is none yet,
and the rounds come from the aggregator's status (with validation accuracy) or, without it, from the nodes' logs. A
source that cannot be read becomes a note on the page, not an error: the board of a live run keeps refreshing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedgl_secure.audit.plots import StackedBars, Strip
from fedgl_secure.audit.report_model import AuditReport, Plot, Section, Table
from fedgl_secure.audit.run_files import RunFiles, read_run_dir
from fedgl_secure.board.sources import (
    AUDIT_REPORT_FILE,
    LiveAggregator,
    NodeLogs,
    fetch_status,
    read_audit_report,
    read_node_logs,
)
from fedgl_secure.data.sampling import bank_name
from fedgl_secure.errors import FedGLError
from fedgl_secure.wire.run_record import RUN_FILE

CONTRIBUTED, NO_UPLOAD, NOT_INVITED = "contributed", "invited, no upload", "not invited"
PARTICIPATION_COLOURS = {CONTRIBUTED: "#009e73", NO_UPLOAD: "#d55e00", NOT_INVITED: "#dddddd"}
AGGREGATOR_PHASES = ("aggregation", "decryption", "server_step")
WAITING = "waiting for the banks"  # a round's wall time outside the aggregator's own phases
# the audit report must be of this run: these run facts are compared
AUDITED_RUN_KEYS = ("method", "seed", "rounds_run", "best_round")


@dataclass(frozen=True)
class BoardSources:
    """Where the board reads: the run directory (it need not exist yet), the nodes' logs, the audit's JSON report
    and a live aggregator; each but the first optional."""

    run_dir: Path
    logs: Path | None = None
    audit_report: Path | None = None
    live: LiveAggregator | None = None

    @property
    def audit_path(self) -> Path:
        return self.audit_report if self.audit_report is not None else self.run_dir / AUDIT_REPORT_FILE


@dataclass(frozen=True)
class Progress:
    state: str  # a sentence: finished, running (with the aggregator's phase), waiting
    rounds_applied: int
    max_rounds: int | None
    stopped_reason: str | None = None

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.rounds_applied / self.max_rounds)) if self.max_rounds else 0


@dataclass
class BoardView:
    """Everything the board's page draws; ``live`` until the run directory exists (the page then refreshes)."""

    run_dir: str
    live: bool
    progress: Progress
    facts: list[tuple[str, Any]]
    banks: list[str]
    best: Table | None = None
    accuracy: Plot | None = None
    participation: Table | None = None
    participation_strip: Strip | None = None
    round_phases: StackedBars | None = None
    bank_phases: Table | None = None
    bank_phase_bars: StackedBars | None = None
    privacy: Section | None = None
    decryptions: Table | None = None
    audit: AuditReport | None = None
    audit_problem: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Round:
    """One round as the board needs it (from run.json's history, the status' rounds or the logs)."""

    round: int
    status: str
    participants: tuple[str, ...]
    contributors: tuple[str, ...]
    seconds: float | None
    val_accuracy: float | None


def _bank(name: Any) -> str:
    """A bank's name: the simulation's history names its banks by client index (``bank_name`` makes its ledgers')."""
    return bank_name(name) if isinstance(name, int) else str(name)


def _rounds_from_history(history: list[dict[str, Any]]) -> list[_Round]:
    """Rounds of run.json's history or of the aggregator's status; a simulation's history holds only the rounds it
    applied, each with every participant contributing (no ``status``, no ``contributors``)."""
    rounds = []
    for row in history:
        participants = tuple(_bank(name) for name in row.get("participants") or ())
        contributors = row.get("contributors")
        rounds.append(
            _Round(
                int(row["round"]),
                str(row.get("status", "applied")),
                participants,
                participants if contributors is None else tuple(_bank(name) for name in contributors),
                row.get("seconds"),
                row.get("val_accuracy"),
            )
        )
    return rounds


def _rounds_from_logs(logs: NodeLogs) -> list[_Round]:
    rounds = []
    for number in sorted(set(logs.opened) | set(logs.applied)):
        applied = logs.applied.get(number)
        contributors = tuple(map(str, applied.get("contributors") or ())) if applied else ()
        seconds = applied.get("seconds") if applied else None
        status = "applied" if applied else "open"
        rounds.append(_Round(number, status, tuple(logs.opened.get(number, contributors)), contributors, seconds, None))
    return rounds


@dataclass
class Snapshot:
    """The sources as read at one moment: the run directory (None until it exists), the aggregator's status (only
    asked while there is no run directory), the logs, and what could not be read."""

    files: RunFiles | None = None
    status: dict[str, Any] | None = None
    logs: NodeLogs | None = None
    notes: list[str] = field(default_factory=list)


def live_status(sources: BoardSources) -> tuple[dict[str, Any] | None, str | None]:
    """The aggregator's status while the run directory is not written (a finished run needs none), or the reason
    there is none; (None, None) without a live source."""
    if sources.live is None or (sources.run_dir / RUN_FILE).is_file():
        return None, None
    try:
        return fetch_status(sources.live), None
    except FedGLError as error:
        return None, f"live status unavailable: {error}"


def read_snapshot(sources: BoardSources, status: dict[str, Any] | None = None, problem: str | None = None) -> Snapshot:
    """Read the run directory and the logs; ``status`` and ``problem`` are :func:`live_status`'s answer."""
    snapshot = Snapshot(status=status, notes=[problem] if problem else [])
    if (sources.run_dir / RUN_FILE).is_file():
        try:
            snapshot.files = read_run_dir(sources.run_dir)
        except FedGLError as error:
            snapshot.notes.append(f"the run directory could not be read: {error}")
    if sources.logs is not None and sources.logs.is_dir():
        snapshot.logs = read_node_logs(sources.logs)
    elif sources.logs is not None:
        snapshot.notes.append(f"no node logs at {sources.logs} (yet): no time by phase")
    return snapshot


def build_view(sources: BoardSources, snapshot: Snapshot) -> BoardView:
    """The board of ``sources`` as read in ``snapshot``."""
    files, status, logs, notes = snapshot.files, snapshot.status, snapshot.logs, list(snapshot.notes)
    if files is not None:
        run = files.run
        rounds = _rounds_from_history(run.get("history") or [])
        max_rounds = (run.get("config") or {}).get("federation", {}).get("max_rounds")
        progress = Progress("finished: run directory written", _applied(rounds), max_rounds, run.get("stopped_reason"))
    elif status is not None:
        rounds = _rounds_from_history(status["rounds"])
        phase = status.get("phase")
        state = (
            "finished: the run directory is written once every node has stopped"
            if phase == "finished"
            else f"running (aggregator: {phase})"
        )
        progress = Progress(state, _applied(rounds), status.get("max_rounds"), status.get("stopped_reason"))
    elif logs is not None:
        rounds = _rounds_from_logs(logs)
        finished = "finished (from the logs): waiting for the run directory"
        progress = Progress(finished if logs.finished else "running (from the logs)", _applied(rounds), None)
        notes.append("validation accuracy per round: from the aggregator's status (--node-config) or the run directory")
    else:
        rounds, progress = [], Progress("waiting: no run directory, logs or live status yet", 0, None)
    banks = _banks(files, rounds)
    view = BoardView(
        run_dir=str(sources.run_dir),
        live=files is None,
        progress=progress,
        facts=_facts(files, status, banks),
        banks=banks,
        best=_best(files, status),
        accuracy=_accuracy_plot(rounds),
        notes=notes,
    )
    _participation(view, rounds, files, status)
    if logs is not None:
        _phases(view, logs, banks)
    if files is not None:
        view.privacy = _privacy(files)
        view.decryptions = _decryption_summary(files)
    _audit(view, sources, files)
    return view


def _applied(rounds: list[_Round]) -> int:
    return sum(1 for r in rounds if r.status == "applied")


def _banks(files: RunFiles | None, rounds: list[_Round]) -> list[str]:
    named: set[str] = set()
    if files is not None:
        named |= set(files.banks) | set(files.directory.bank_keys)
    for r in rounds:
        named |= set(r.participants) | set(r.contributors)
    return sorted(named)


def _facts(files: RunFiles | None, status: dict[str, Any] | None, banks: list[str]) -> list[tuple[str, Any]]:
    if files is not None:
        run, record = files.run, files.directory.run
        policy = files.policy
        return [
            ("federation", record.get("federation", "-")),
            ("method", run.get("method")),
            ("data", run.get("dataset")),
            ("policy", f"{policy.protection}: {policy.description}" if policy.description else policy.protection),
            ("encrypted (CKKS)", "yes" if files.directory.secure else "no"),
            ("banks", len(banks)),
            ("rounds run", run.get("rounds_run")),
        ]
    if status is not None:
        return [("federation", status.get("federation")), ("banks", len(banks))]
    return [("banks", len(banks))]


def _best(files: RunFiles | None, status: dict[str, Any] | None) -> Table | None:
    """The model chosen by validation and its pooled test figures."""
    if files is not None:
        run = files.run
        metrics = run.get("global_test_metrics") or {}
        rows = [
            ("best round (by validation)", run.get("best_round")),
            ("validation accuracy", run.get("best_val_accuracy")),
            ("test accuracy", run.get("global_test_accuracy")),
        ]
    elif status is not None and status.get("best_version") is not None:
        metrics = status.get("best_test_metrics") or {}
        rows = [
            ("best model version (by validation)", status.get("best_version")),
            ("validation accuracy", status.get("best_val_accuracy")),
            ("test accuracy", status.get("best_test_accuracy")),
        ]
    else:
        return None
    rows += [
        (f"test {label}", metrics[name])
        for name, label in (("roc_auc", "ROC-AUC"), ("pr_auc", "PR-AUC"))
        if name in metrics
    ]
    if "recall_at_top" in metrics:
        rows.append((f"test recall at the top {metrics.get('top_fraction', 0):.0%}", metrics["recall_at_top"]))
    return Table("The model chosen by validation (pooled over the banks)", ("figure", "value"), tuple(rows))


def _accuracy_plot(rounds: list[_Round]) -> Plot | None:
    points = [(float(r.round), float(r.val_accuracy)) for r in rounds if r.val_accuracy is not None]
    if not points:
        return None
    return Plot("Validation accuracy per round (pooled over the banks)", "round", "accuracy", {"validation": points})


def _participation(view: BoardView, rounds: list[_Round], files: RunFiles | None, status: dict | None) -> None:
    """Per bank: rounds invited, contributed, missed; and the strip of who contributed to which round."""
    if not view.banks or not rounds:
        return
    stopped: dict[str, Any] = {}
    if files is not None and isinstance(files.stopped_banks, dict):
        stopped.update(files.stopped_banks)
    if status is not None:
        stopped.update({w.get("bank"): w.get("round") for w in status.get("withdrawn") or []})
    rows = []
    for bank in view.banks:
        invited = [r.round for r in rounds if bank in r.participants]
        contributed = [r.round for r in rounds if bank in r.contributors]
        missed = sorted(set(invited) - set(contributed))
        listed = ", ".join(map(str, missed[:10])) + (" …" if len(missed) > 10 else "")
        rows.append((bank, len(invited), len(contributed), listed or "-", stopped.get(bank)))
    view.participation = Table(
        "Participation per bank",
        ("bank", "rounds invited", "rounds contributed", "missed rounds", "stopped at round"),
        tuple(rows),
    )

    def cell(bank: str, r: _Round) -> str:
        return CONTRIBUTED if bank in r.contributors else NO_UPLOAD if bank in r.participants else NOT_INVITED

    view.participation_strip = Strip(
        "Who contributed to which round",
        "round",
        view.banks,
        [r.round for r in rounds],
        [[cell(bank, r) for r in rounds] for bank in view.banks],
        PARTICIPATION_COLOURS,
    )


def _phases(view: BoardView, logs: NodeLogs, banks: list[str]) -> None:
    """The aggregator's round time by phase (bars per round) and each bank's mean time per phase."""
    rounds = [p for p in logs.phases.values() if p.aggregator or p.seconds is not None]
    if rounds:
        stacks = {name: [p.aggregator.get(name, 0.0) for p in rounds] for name in AGGREGATOR_PHASES}
        stacks[WAITING] = [
            max(0.0, (p.seconds or 0.0) - sum(p.aggregator.get(name, 0.0) for name in AGGREGATOR_PHASES))
            for p in rounds
        ]
        view.round_phases = StackedBars(
            "Round time by phase (the aggregator's view)", "round", "seconds", [str(p.round) for p in rounds], stacks
        )
    per_bank: dict[str, list[dict[str, float]]] = {}
    for p in logs.phases.values():
        for bank, spent in p.banks.items():
            per_bank.setdefault(bank, []).append(spent)
    if not per_bank:
        return
    names = list(dict.fromkeys(name for spent in per_bank.values() for one in spent for name in one))
    means = {
        bank: {name: sum(one.get(name, 0.0) for one in spent) / len(spent) for name in names}
        for bank, spent in sorted(per_bank.items())
    }
    view.bank_phases = Table(
        "Each bank's time per round by phase (mean seconds)",
        ("bank", "rounds", "total", *names),
        tuple(
            (bank, len(per_bank[bank]), sum(mean.values()), *(mean[name] for name in names))
            for bank, mean in means.items()
        ),
    )
    view.bank_phase_bars = StackedBars(
        "A bank's round by phase (mean seconds)",
        "bank",
        "seconds",
        list(means),
        {name: [means[bank][name] for bank in means] for name in names},
    )
    unknown = sorted(set(per_bank) - set(banks))
    if banks and unknown:
        view.notes.append(f"the logs hold rounds of banks this run does not name: {', '.join(unknown)}")


def _privacy(files: RunFiles) -> Section:
    """The audit's privacy section: ε spent per bank and channel against the budget, a plot per bank, the stop."""
    from fedgl_secure.audit.conformance import check_privacy

    senders = set(files.banks) | {receipt.sender for receipt in files.directory.receipts}
    return check_privacy(files, senders)


def _decryption_summary(files: RunFiles) -> Table | None:
    """The key authority's ledger per kind: how many decryptions, over which rounds, of which banks' sums."""
    ledger = files.ledger
    if ledger is None:
        return None
    if ledger.error is not None:
        return Table("Decryptions", ("problem",), ((f"the ledger could not be read: {ledger.error}",),))
    rows = []
    for kind in dict.fromkeys(d.kind for d in ledger.decryptions):
        of_kind = [d for d in ledger.decryptions if d.kind == kind]
        rounds = sorted({d.round for d in of_kind})
        sets = Counter(", ".join(sorted(d.senders)) for d in of_kind)
        summed = "; ".join(f"{senders} ×{count}" for senders, count in sets.most_common())
        rows.append((kind, len(of_kind), f"{rounds[0]}–{rounds[-1]}", summed, of_kind[-1].decrypted_at))
    return Table(
        f"Decryptions by the key authority: {len(ledger.decryptions)} in all",
        ("kind", "decryptions", "rounds", "sums over the uploads of", "last at"),
        tuple(rows),
    )


def _audit(view: BoardView, sources: BoardSources, files: RunFiles | None) -> None:
    """The audit's report, if there is one and it is this run's (else the reason it is not shown)."""
    path = sources.audit_path
    if not path.is_file():
        if sources.audit_report is not None:
            view.audit_problem = f"{path}: no such audit report"
        return
    try:
        report = read_audit_report(path)
    except FedGLError as error:
        view.audit_problem = str(error)
        return
    if files is None:
        view.audit_problem = f"{path} is there but the run directory is not: an earlier run's audit, not shown"
        return
    differ = [
        f"{key} {report.run.get(key)!r} ≠ {files.run.get(key)!r}"
        for key in AUDITED_RUN_KEYS
        if report.run.get(key) != files.run.get(key)
    ]
    if differ:
        view.audit_problem = f"{path} audits another run ({'; '.join(differ)}): run the audit again"
        return
    view.audit = report
