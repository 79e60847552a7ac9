"""Rendering of an :class:`~fedgl_secure.audit.report_model.AuditReport`: Markdown, self-contained HTML, JSON.

The HTML page is a Jinja2 template (``templates/audit.html``, with the layout and macros the board shares) with its
plots inline as SVG drawn by matplotlib (:mod:`fedgl_secure.audit.plots`): one file a risk officer can open offline
or attach to a ticket. Markdown cannot carry inline SVG portably; :func:`render_markdown` links the plots when given
the files they were written to (:func:`write_plots`), and always includes the numbers behind them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fedgl_secure.audit.plots import svg
from fedgl_secure.audit.report_model import AuditReport, Plot
from fedgl_secure.audit.templating import cell as _cell
from fedgl_secure.audit.templating import html_environment

_EMOJI = {"info": "⚪", "green": "🟢", "amber": "🟠", "red": "🔴"}


def _summary_lines(report: AuditReport) -> list[str]:
    red, amber = report.with_status("red"), report.with_status("amber")
    lines = [f"Overall: {report.status.upper()} ({len(red)} red, {len(amber)} amber, {len(report.checks())} checks)"]
    lines += [f"RED   {line}" for line in red]
    lines += [f"AMBER {line}" for line in amber]
    return lines


def summary_text(report: AuditReport) -> str:
    """A few lines for a terminal: the verdict and every red and amber check."""
    return "\n".join(_summary_lines(report))


# --- plots ---------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "plot"


def write_plots(report: AuditReport, directory: str | Path, stem: str = "audit") -> dict[int, Path]:
    """Write every plot as ``<stem>-<section>-<n>.svg`` in ``directory``; returns ``{id(plot): path}``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[int, Path] = {}
    for section in report.sections:
        for number, plot in enumerate(section.plots, start=1):
            path = directory / f"{stem}-{_slug(section.key)}-{number}.svg"
            path.write_text(svg(plot, inline=False), encoding="utf-8")
            written[id(plot)] = path
    return written


# --- Markdown -------------------------------------------------------------------------------------


def _md_escape(value: Any) -> str:
    return _cell(value).replace("|", "\\|").replace("\n", " ")


def _md_table(columns, rows) -> list[str]:
    lines = ["| " + " | ".join(_md_escape(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_escape(v) for v in row) + " |" for row in rows]
    return lines


def _plot_points(plot: Plot, limit: int = 12) -> list[str]:
    """The numbers behind a plot as a table (at most ``limit`` rounds: first, last and evenly between)."""
    rounds = sorted({x for series in plot.series.values() for x, _ in series})
    if len(rounds) > limit:
        picks = {rounds[round(i * (len(rounds) - 1) / (limit - 1))] for i in range(limit)}
        rounds = sorted(picks)
    lookup = {label: dict(series) for label, series in plot.series.items()}
    rows = [(r, *(lookup[label].get(r) for label in plot.series)) for r in rounds]
    return _md_table((plot.x_label, *plot.series), rows)


def render_markdown(report: AuditReport, plot_files: dict[int, Path] | None = None, relative_to: Path | None = None):
    """The report as Markdown; plots are linked when ``plot_files`` (from :func:`write_plots`) is given."""
    lines = [
        "# Privacy audit",
        "",
        f"- run: `{report.run_dir}`",
        f"- policy: `{report.policy_source}`",
        f"- generated: {report.generated_at}",
        "- run: " + ", ".join(f"{k} = {_cell(v)}" for k, v in report.run.items()),
        "",
        f"**{_EMOJI[report.status]} {report.status.upper()}**",
        "",
    ]
    lines += [f"- {line}" for line in _summary_lines(report)[1:]]
    for number, section in enumerate(report.sections, start=1):
        lines += ["", f"## {number}. {section.title} — {_EMOJI[section.status]} {section.status.upper()}", ""]
        if section.checks:
            lines += _md_table(
                ("check", "status", "detail"),
                [(c.name, f"{_EMOJI[c.status]} {c.status.upper()}", c.detail) for c in section.checks],
            )
        for table in section.tables:
            lines += ["", f"**{table.title}**", ""]
            lines += _md_table(table.columns, table.rows) if table.rows else ["(none)"]
        for plot in section.plots:
            lines += ["", f"**{plot.title}**", ""]
            if plot_files and id(plot) in plot_files:
                path = plot_files[id(plot)]
                if relative_to is not None:
                    path = Path(path).relative_to(relative_to) if Path(path).is_relative_to(relative_to) else path
                lines += [f"![{plot.title}]({Path(path).as_posix()})", ""]
            lines += _plot_points(plot)
        if section.notes:
            lines.append("")
            lines += [f"- {note}" for note in section.notes]
    return "\n".join(lines) + "\n"


# --- HTML -----------------------------------------------------------------------------------------


def render_html(report: AuditReport) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG plots, no scripts): ``templates/audit.html``."""
    return html_environment().get_template("audit.html").render(report=report)


# --- JSON -----------------------------------------------------------------------------------------


def render_json(report: AuditReport) -> str:
    """The report as strict JSON (no NaN): every check, table and the points behind every plot."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
