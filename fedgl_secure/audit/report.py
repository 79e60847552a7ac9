"""Rendering of an :class:`~fedgl_secure.audit.report_model.AuditReport`: Markdown, self-contained HTML, JSON.

Plots are inline SVG drawn here (:func:`svg_line_plot`): no plotting dependency, and an HTML report
that is one file a risk officer can open offline or attach to a ticket. Markdown cannot carry inline
SVG portably; :func:`render_markdown` links the plots when given the files they were written to
(:func:`write_plots`), and always includes the numbers behind them.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from fedgl_secure.audit.report_model import AuditReport, Plot

_EMOJI = {"info": "⚪", "green": "🟢", "amber": "🟠", "red": "🔴"}
_PALETTE = ("#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "∞" if math.isinf(value) else "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _summary_lines(report: AuditReport) -> list[str]:
    red, amber = report.with_status("red"), report.with_status("amber")
    lines = [f"Overall: {report.status.upper()} ({len(red)} red, {len(amber)} amber, {len(report.checks())} checks)"]
    lines += [f"RED   {line}" for line in red]
    lines += [f"AMBER {line}" for line in amber]
    return lines


def summary_text(report: AuditReport) -> str:
    """A few lines for a terminal: the verdict and every red and amber check."""
    return "\n".join(_summary_lines(report))


# --- SVG ------------------------------------------------------------------------------------------


def _ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """About ``count`` round tick values from at most ``low`` to at least ``high`` (whole numbers if ``integer``)."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    start, stop = math.floor(low / step), math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(start, stop + 1)]


def svg_line_plot(plot: Plot, width: int = 560, height: int = 300) -> str:
    """An SVG line chart of ``plot.series`` with axes, ticks, a legend and the dashed ``plot.limit``."""
    left, right, top, bottom = 56, 120, 28, 40
    points = [p for series in plot.series.values() for p in series if math.isfinite(p[1])]
    xs = [p[0] for p in points] or [0.0, 1.0]
    ys = [p[1] for p in points] or [0.0, 1.0]
    if plot.limit is not None and math.isfinite(plot.limit):
        ys.append(plot.limit)
    x_ticks = _ticks(min(xs), max(xs), integer=True)
    y_ticks = _ticks(min(0.0, min(ys)), max(ys) * 1.05 if max(ys) > 0 else 1.0)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1.0) * plot_h

    e = html.escape
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img" '
        f'aria-label="{e(plot.title)}">',
        f"<title>{e(plot.title)}</title>",
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{e(plot.title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
    ]
    for t in x_ticks:
        parts.append(
            f'<line x1="{sx(t):.1f}" y1="{top + plot_h}" x2="{sx(t):.1f}" y2="{top + plot_h + 4}" stroke="#999"/>'
            f'<text x="{sx(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{_cell(float(t))}</text>'
        )
    for t in y_ticks:
        parts.append(
            f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + plot_w}" y2="{sy(t):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{_cell(float(t))}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle">{e(plot.x_label)}</text>'
        f'<text transform="translate(14,{top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{e(plot.y_label)}</text>"
    )
    legend_y = top + 8
    if plot.limit is not None and math.isfinite(plot.limit):
        y = sy(plot.limit)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#b00020" '
            f'stroke-dasharray="6 4"/><text x="{left + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end" '
            f'fill="#b00020">{e(plot.limit_label)} {_cell(plot.limit)}</text>'
        )
    for index, (label, series) in enumerate(plot.series.items()):
        colour = _PALETTE[index % len(_PALETTE)]
        finite = [(x, y) for x, y in series if math.isfinite(y)]
        if len(finite) == 1:
            x, y = finite[0]
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        elif finite:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in finite)
            width_px = 2.5 if index == 0 else 1.5
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{width_px}"/>')
        lx = left + plot_w + 10
        parts.append(
            f'<line x1="{lx}" y1="{legend_y}" x2="{lx + 16}" y2="{legend_y}" stroke="{colour}" stroke-width="2"/>'
            f'<text x="{lx + 20}" y="{legend_y + 4}">{e(label)}</text>'
        )
        legend_y += 16
    parts.append("</svg>")
    return "".join(parts)


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
            path.write_text(svg_line_plot(plot), encoding="utf-8")
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

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;
text-align:left;vertical-align:top}th{background:#f3f3f3}.badge{color:#fff;border-radius:3px;padding:0 .4em;
font-weight:bold;font-size:.85em}.info{background:#5f6b7a}.green{background:#1b7f3b}.amber{background:#b26a00}
.red{background:#b00020}
.verdict{font-size:1.4em;padding:.4em .8em;border-radius:4px;color:#fff;display:inline-block}
.notes{color:#555;font-size:.9em}figure{margin:.8em 0}
"""


def _badge(status: str) -> str:
    return f'<span class="badge {status}">{status.upper()}</span>'


def _html_table(columns, rows) -> str:
    e = html.escape
    head = "".join(f"<th>{e(_cell(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{e(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: AuditReport) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG plots, no scripts)."""
    e = html.escape
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Privacy audit — {e(report.run_dir)}</title><style>{_CSS}</style></head><body>",
        "<h1>Privacy audit</h1>",
        f"<p>Run <code>{e(report.run_dir)}</code>, policy <code>{e(report.policy_source)}</code>, "
        f"generated {e(report.generated_at)}.<br>"
        + ", ".join(f"{e(k)} = {e(_cell(v))}" for k, v in report.run.items())
        + "</p>",
        f'<div class="verdict {report.status}">{report.status.upper()}</div>',
    ]
    flagged = [(s, line) for s in ("red", "amber") for line in report.with_status(s)]
    if flagged:
        out.append("<ul>" + "".join(f"<li>{_badge(s)} {e(line)}</li>" for s, line in flagged) + "</ul>")
    for number, section in enumerate(report.sections, start=1):
        out.append(f'<section id="{e(section.key)}"><h2>{number}. {e(section.title)} {_badge(section.status)}</h2>')
        if section.checks:
            rows = "".join(
                f"<tr><td>{e(c.name)}</td><td>{_badge(c.status)}</td><td>{e(c.detail)}</td></tr>"
                for c in section.checks
            )
            out.append(f"<table><thead><tr><th>check</th><th>status</th><th>detail</th></tr></thead>{rows}</table>")
        for table in section.tables:
            out.append(f"<h3>{e(table.title)}</h3>")
            out.append(_html_table(table.columns, table.rows) if table.rows else "<p>(none)</p>")
        for plot in section.plots:
            out.append(f"<figure>{svg_line_plot(plot)}</figure>")
        if section.notes:
            out.append('<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in section.notes) + "</ul>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --- JSON -----------------------------------------------------------------------------------------


def render_json(report: AuditReport) -> str:
    """The report as strict JSON (no NaN): every check, table and the points behind every plot."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
