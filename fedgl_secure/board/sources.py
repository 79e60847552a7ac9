"""What the board reads, each source on its own and each only read: the run directory, the nodes' JSON logs, a live
aggregator's ``/v1/status`` and the audit's JSON report.

* The **run directory** (``run.json`` and the rest, :mod:`fedgl_secure.audit.run_files`) exists once a run has
  ended; before that the board shows what the other sources hold.
* The **logs** (``<node>.log``, one structlog JSON record a line, as ``consortium up`` writes them under
  ``<state_root>/logs``) carry each round's time by phase: the aggregator's ``round.applied`` and each bank's
  ``round.uploaded`` (:class:`~fedgl_secure.phase_timer.PhaseTimer`), and the rounds applied so far.
* The **aggregator's status** (``GET /v1/status`` over mutual TLS, presenting a node's certificate) carries a live
  run's rounds with their pooled validation accuracy.
* The **audit report** (``fedgl-secure audit RUN_DIR --format json --output RUN_DIR/audit.json``) gives the verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedgl_secure.audit.report_model import AuditReport
from fedgl_secure.errors import ConfigError

AUDIT_REPORT_FILE = "audit.json"  # where the board looks for the audit's JSON report in a run directory
STATUS_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class RoundPhases:
    """One round's seconds by phase: the aggregator's (``aggregator``) and each bank's (bank → phase → seconds)."""

    round: int
    seconds: float | None = None  # the aggregator's wall time from opening the round to applying it
    aggregator: dict[str, float] = field(default_factory=dict)
    banks: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeLogs:
    """What the nodes' logs say: rounds applied (with contributors), rounds opened, and time by phase."""

    applied: dict[int, dict[str, Any]]  # round → its round.applied record
    opened: dict[int, list[str]]  # round → participants invited
    phases: dict[int, RoundPhases]
    finished: bool  # the aggregator logged rounds.finished


def read_log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of one node's log; other lines (uvicorn's plain text, a line cut by a crash) are skipped."""
    records = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _round_of(record: dict[str, Any]) -> int | None:
    value = record.get("round")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _seconds(phases: Any) -> dict[str, float]:
    if not isinstance(phases, dict):
        return {}
    return {str(name): float(s) for name, s in phases.items() if isinstance(s, (int, float)) and s >= 0}


def read_node_logs(directory: Path) -> NodeLogs:
    """Every ``*.log`` in ``directory``; a node's role is the ``role`` its records carry.

    A round logged twice (an aggregator that restarted mid-round) keeps its last record; a bank's stages of one round
    (GraphFL has two) add up.
    """
    applied: dict[int, dict[str, Any]] = {}
    opened: dict[int, list[str]] = {}
    banks: dict[int, dict[str, dict[str, float]]] = {}
    finished = False
    for path in sorted(directory.glob("*.log")):
        for record in read_log_records(path):
            event, role, number = record.get("event"), record.get("role"), _round_of(record)
            if role == "aggregator":
                if event == "rounds.finished":
                    finished = True
                elif event == "round.opened" and number is not None:
                    opened[number] = [str(bank) for bank in record.get("participants") or []]
                elif event == "round.applied" and number is not None:
                    applied[number] = record
            elif role == "bank" and event == "round.uploaded" and number is not None:
                bank = str(record.get("node") or path.stem)
                spent = banks.setdefault(number, {}).setdefault(bank, {})
                for name, seconds in _seconds(record.get("phases")).items():
                    spent[name] = spent.get(name, 0.0) + seconds
    phases = {}
    for number in sorted(set(applied) | set(banks)):
        record = applied.get(number, {})
        seconds = record.get("seconds")
        seconds = float(seconds) if isinstance(seconds, (int, float)) else None
        phases[number] = RoundPhases(number, seconds, _seconds(record.get("phases")), banks.get(number, {}))
    return NodeLogs(applied, opened, phases, finished)


@dataclass(frozen=True)
class LiveAggregator:
    """A running aggregator to ask for ``/v1/status``, as node ``node_config`` (its TLS certificate and key)."""

    node_config: Path
    url: str | None = None  # default: the aggregator of the node's consortium


def fetch_status(live: LiveAggregator) -> dict[str, Any]:
    """The aggregator's ``/v1/status``; raises :class:`~fedgl_secure.errors.ConfigError` naming what failed (the
    node file, the TLS files, an unreachable aggregator or its answer)."""
    import httpx

    from fedgl_secure.consortium.config import NodeRole, PkiLayout, load_node_config
    from fedgl_secure.errors import FedGLError
    from fedgl_secure.services.tls import make_http_client

    node, consortium = load_node_config(live.node_config)
    url = live.url or consortium.aggregator.url
    try:
        with make_http_client(
            PkiLayout(consortium.pki_dir),
            node.name,
            url,
            timeout=STATUS_TIMEOUT_SECONDS,
            expect_role=NodeRole.AGGREGATOR,
        ) as http:
            response = http.get("/v1/status")
    except (httpx.HTTPError, FedGLError, OSError) as error:
        raise ConfigError(f"the aggregator at {url} did not answer as {node.name}: {error}") from None
    if response.status_code != 200:
        raise ConfigError(f"the aggregator at {url} answered {response.status_code}: {response.text[:300]}")
    status = response.json()
    if not isinstance(status, dict) or not isinstance(status.get("rounds"), list):
        raise ConfigError(f"the aggregator at {url} sent a status without its rounds")
    return status


def read_audit_report(path: Path) -> AuditReport:
    """The audit's JSON report at ``path``; :class:`~fedgl_secure.errors.ConfigError` names a bad one."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return AuditReport.from_dict(document)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the audit report ({error})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(
            f"{path}: not an audit report of `fedgl-secure audit --format json` ({type(error).__name__}: {error})"
        ) from None
