"""The audit report's model: statuses, checks, tables, plots, sections and the report (DESIGN §6), and
the thresholds behind the verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np

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

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> AuditReport:
        """A report read back from :meth:`to_dict` (``audit --format json``), to draw it again as a page.

        Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a document of another shape (the caller names
        the file); the statuses are recomputed from the checks, as when the audit ran.
        """
        sections = [
            Section(
                key=str(data["key"]),
                title=str(data["title"]),
                checks=[Check(str(c["name"]), _status(c["status"]), str(c["detail"])) for c in data["checks"]],
                tables=[
                    Table(str(t["title"]), tuple(t["columns"]), tuple(map(tuple, t["rows"]))) for t in data["tables"]
                ],
                plots=[_plot(p) for p in data["plots"]],
                notes=[str(note) for note in data["notes"]],
                data=dict(data.get("data") or {}),
            )
            for data in document["sections"]
        ]
        return cls(
            str(document["run_dir"]),
            str(document["policy_source"]),
            dict(document["run"]),
            sections,
            str(document["generated_at"]),
        )


def _status(value: Any) -> Status:
    if value not in _RANK:
        raise ValueError(f"unknown status {value!r} (expected one of {', '.join(_RANK)})")
    return value


def _number(value: Any) -> float:
    """A JSON-safe number back to a float: None was NaN, "inf"/"-inf" were infinities."""
    return math.nan if value is None else float(value)


def _plot(data: dict[str, Any]) -> Plot:
    series = {str(label): [(float(x), _number(y)) for x, y in points] for label, points in data["series"].items()}
    limit = data.get("limit")
    return Plot(
        str(data["title"]),
        str(data["x_label"]),
        str(data["y_label"]),
        series,
        None if limit is None else float(limit),
        str(data.get("limit_label", "")),
    )


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
