"""Figures as SVG, drawn by matplotlib, for the audit's report and the board (``fedgl-secure board``).

Three kinds: a line plot of an audit :class:`~fedgl_secure.audit.report_model.Plot` (series over rounds, a
dashed limit such as the ε budget), :class:`StackedBars` (seconds per phase) and :class:`Strip` (one
categorical cell per bank and round: who took part). Each is built as a matplotlib ``Figure`` first
(``*_figure``: tests read its axes) and then written as SVG text with :func:`figure_svg`; the HTML pages
embed it inline, so a report stays one file that opens offline.

Text stays text in the SVG (``svg.fonttype = "none"``): smaller files, and titles and labels a browser can
find and select. Ids are salted with a constant so that the same figure gives the same bytes.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from fedgl_secure.audit.report_model import Plot

# Colour-blind-safe (Okabe–Ito), the first series darkest: the total or the headline figure.
PALETTE = ("#222222", "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442")
LIMIT_COLOUR = "#b00020"
_SIZE = (5.6, 3.0)  # inches; 100 dpi: 560 × 300 px, as the hand-drawn plots were


@dataclass(frozen=True)
class StackedBars:
    """One bar per ``categories`` entry, stacked from ``stacks`` (label → one value per category)."""

    title: str
    x_label: str
    y_label: str
    categories: list[str]
    stacks: dict[str, list[float]]


@dataclass(frozen=True)
class Strip:
    """A grid of ``rows`` × ``columns`` cells, each one of ``legend``'s keys (legend: key → colour)."""

    title: str
    x_label: str
    rows: list[str]
    columns: list[int]
    cells: list[list[str]]  # cells[row][column], a legend key
    legend: dict[str, str]


def _new_figure(size: tuple[float, float] = _SIZE) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=100, layout="constrained")


def line_plot_figure(plot: Plot) -> Figure:
    """``plot.series`` as lines (a lone point as a marker), the dashed ``plot.limit`` with its label, a legend."""
    figure = _new_figure()
    axes = figure.add_subplot()
    for index, (label, series) in enumerate(plot.series.items()):
        finite = [(x, y) for x, y in series if math.isfinite(y)]
        xs, ys = [x for x, _ in finite], [y for _, y in finite]
        axes.plot(
            xs,
            ys,
            color=PALETTE[index % len(PALETTE)],
            linewidth=2.5 if index == 0 else 1.5,
            marker="o" if len(finite) == 1 else None,
            label=label,
        )
    if plot.limit is not None and math.isfinite(plot.limit):
        axes.axhline(plot.limit, color=LIMIT_COLOUR, linestyle="--", linewidth=1.2)
        axes.annotate(
            f"{plot.limit_label} {plot.limit:.4g}".strip(),
            (1.0, plot.limit),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 4),
            textcoords="offset points",
            ha="right",
            color=LIMIT_COLOUR,
        )
    low, high = axes.get_ylim()  # the limit and zero stay in view: "how close to the budget" is the point
    top = max(high, plot.limit * 1.05 if plot.limit is not None and math.isfinite(plot.limit) else high)
    axes.set_ylim(min(0.0, low), top)
    axes.xaxis.get_major_locator().set_params(integer=True)
    _label(axes, plot.title, plot.x_label, plot.y_label)
    if plot.series:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    return figure


def stacked_bars_figure(bars: StackedBars) -> Figure:
    """``bars.stacks`` stacked per category, in order, with a legend beside the axes."""
    figure = _new_figure()
    axes = figure.add_subplot()
    positions = list(range(len(bars.categories)))
    bottom = [0.0] * len(positions)
    for index, (label, values) in enumerate(bars.stacks.items()):
        axes.bar(positions, values, bottom=bottom, color=PALETTE[(index + 1) % len(PALETTE)], label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    step = max(1, math.ceil(len(positions) / 12))  # at most ~12 labels: 300 rounds stay readable
    axes.set_xticks(positions[::step], bars.categories[::step])
    _label(axes, bars.title, bars.x_label, bars.y_label)
    if bars.stacks:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    return figure


def strip_figure(strip: Strip) -> Figure:
    """One coloured cell per row and column, rows top to bottom, with the legend's keys beside it."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    keys = list(strip.legend)
    codes = [[keys.index(cell) for cell in row] for row in strip.cells]
    figure = _new_figure((_SIZE[0], 0.9 + 0.32 * max(len(strip.rows), 1)))
    axes = figure.add_subplot()
    if strip.rows and strip.columns:
        axes.imshow(
            codes,
            cmap=ListedColormap([strip.legend[key] for key in keys]),
            vmin=-0.5,
            vmax=len(keys) - 0.5,
            aspect="auto",
            interpolation="nearest",
            extent=(strip.columns[0] - 0.5, strip.columns[-1] + 0.5, len(strip.rows) - 0.5, -0.5),
        )
    axes.set_yticks(range(len(strip.rows)), strip.rows)
    axes.xaxis.get_major_locator().set_params(integer=True)
    _label(axes, strip.title, strip.x_label, "", grid=False)
    axes.legend(
        handles=[Patch(color=colour, label=key) for key, colour in strip.legend.items()],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
        fontsize="small",
    )
    return figure


def _label(axes, title: str, x_label: str, y_label: str, *, grid: bool = True) -> None:
    axes.set_title(title, loc="left", fontsize="medium", fontweight="bold")
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    if grid:
        axes.grid(axis="y", color="#eeeeee")
        axes.set_axisbelow(True)


def figure_svg(figure: Figure, *, inline: bool = True) -> str:
    """The figure as SVG text: ``inline`` (for an HTML page) without the XML prologue a standalone file has."""
    from matplotlib import rc_context

    buffer = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "fedgl-secure"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :] if inline else text


def svg(item: Plot | StackedBars | Strip, *, inline: bool = True) -> str:
    """Any of the three figures as SVG text (see :func:`figure_svg`)."""
    if isinstance(item, StackedBars):
        figure = stacked_bars_figure(item)
    elif isinstance(item, Strip):
        figure = strip_figure(item)
    else:
        figure = line_plot_figure(item)
    return figure_svg(figure, inline=inline)
