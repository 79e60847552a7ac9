"""The docs' tables of measured figures against the committed result files (issue 28, "truthful docs").

Convention. A markdown table in ``README.md`` or ``docs/*.md`` whose figures were measured is annotated by an
HTML comment on the line right above it (blank lines between them are allowed, nothing else)::

    <!-- results: docs/results/consortium_scale.json, docs/results/consortium_scale_1m.json -->
    | customers per bank | seconds per round | ... |

naming one or more committed JSON files under ``docs/results/``. This test then checks every *figure* in the
table's body cells against every number found anywhere in those files (nested objects and lists walked).

What counts as a figure (the rule):

* only numbers written with a decimal point (``0.8083``, ``1.77×``, ``6,287.6 MiB``, ``81.3 %``); integers
  are counts, sizes, seeds, parameters or parts of names (``Cora``, ``issue 27``, ``N = 4096``, ``2026-11-26``)
  and are not checked;
* not the header row and not the first column: they are labels (a row's setting, e.g. ``ε = 0.5``);
* not inside backticks (code, configuration values);
* not a bound or a target: a number right after ``≤``, ``≥``, ``<`` or ``>`` (e.g. ``≤ 1.5×``) is not checked,
  nor a section number (``§6.11``);
* a figure printed with d decimals matches a JSON number v when v rounds to it: ``|v − x| ≤ ½·10^−d``
  (``0.8083`` matches ``0.808316``, ``1.77×`` matches ``1.7717``); it also matches ``100·v`` (a fraction
  printed as a percentage, with or without a ``%`` beside it);
* a figure followed by a byte unit (``B``, ``bytes``, ``KB``, ``MB``, ``GB``, decimal; ``KiB``, ``MiB``,
  ``GiB``, binary) also matches a JSON number whose key, or an enclosing key, names its byte unit
  (``..._bytes``, ``bytes_...``, ``..._mib``, ``..._mb``, ...), after both are converted to bytes — so a MiB
  figure printed as GB without converting it fails.

A figure that is derived in the docs (a difference, a ratio of two files' numbers) does not belong in an
annotated table unless the file holds it too. Tables of targets, parameters or history are not annotated;
where one table mixes them, the bound rule above keeps the targets out.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = "docs/results/"

ANNOTATION = re.compile(r"^\s*<!--\s*results:\s*(?P<files>[^>]*?)\s*-->\s*$")
SEPARATOR_ROW = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")
# a number with a decimal point, optionally with thousands separators and a sign (ASCII or Unicode minus);
# not part of a longer token (a version "2.13.0", an identifier "v1.2", an exponent "1e-5")
FIGURE = re.compile(
    r"(?<![\w.^])(?P<sign>[-−])?(?P<num>\d{1,3}(?:,\d{3})+\.\d+|\d+\.\d+)(?![\w.]*\d)(?P<unit>\s*(?:%|[KMGT]i?B\b|B\b|bytes\b))?"
)
BOUND = re.compile(r"(?:[≤≥<>]\s*[-−]?|§\s*)$")
CODE = re.compile(r"`[^`]*`")

BYTE_UNITS = {
    "b": 1,
    "bytes": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclass
class ResultNumbers:
    """Every number in some JSON files: plain, and those whose key names a byte unit, in bytes."""

    plain: list[float] = field(default_factory=list)
    in_bytes: list[float] = field(default_factory=list)

    def add_file(self, path: Path) -> None:
        self._walk(json.loads(path.read_text()), None)

    def _walk(self, node, unit: int | None) -> None:
        if isinstance(node, bool) or node is None:
            return
        if isinstance(node, (int, float)):
            if math.isfinite(node):
                self.plain.append(float(node))
                if unit is not None:
                    self.in_bytes.append(float(node) * unit)
        elif isinstance(node, dict):
            for key, value in node.items():
                self._walk(value, _key_unit(str(key)) or unit)
        elif isinstance(node, list):
            for value in node:
                self._walk(value, unit)

    def freeze(self) -> None:
        self.plain.sort()
        self.in_bytes.sort()

    def matches(self, value: float, decimals: int, unit: str | None) -> bool:
        half = 0.5 * 10.0**-decimals
        slack = 1e-9 * max(1.0, abs(value))
        low, high = value - half - slack, value + half + slack
        if _any_between(self.plain, low, high) or _any_between(self.plain, low / 100, high / 100):
            return True
        factor = BYTE_UNITS.get(unit.lower()) if unit else None
        return factor is not None and _any_between(self.in_bytes, low * factor, high * factor)


def _key_unit(key: str) -> int | None:
    tokens = key.lower().split("_")
    for token in (tokens[-1], tokens[0], *tokens[1:-1]):  # upload_bytes_per_round: bytes
        if token in BYTE_UNITS and token != "b":
            return BYTE_UNITS[token]
    return None


def _any_between(values: list[float], low: float, high: float) -> bool:
    i = bisect.bisect_left(values, low)
    return i < len(values) and values[i] <= high


@dataclass
class Figure:
    text: str
    value: float
    decimals: int
    unit: str | None


def figures_in_cell(cell: str) -> list[Figure]:
    """The checked figures of one body cell, by the rule of the module docstring."""
    cell = CODE.sub(lambda m: " " * len(m.group()), cell)
    found = []
    for m in FIGURE.finditer(cell):
        if BOUND.search(cell[: m.start()]):
            continue
        number = m.group("num").replace(",", "")
        value = float(number) * (-1 if m.group("sign") else 1)
        unit = (m.group("unit") or "").strip() or None
        found.append(Figure(m.group().strip(), value, len(number.split(".")[1]), unit))
    return found


def split_row(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", body)]


@dataclass
class AnnotatedTable:
    doc: str
    line: int  # 1-based line of the annotation
    files: list[str]
    rows: list[tuple[int, list[str]]]  # (1-based line, cells) of the body rows


def annotated_tables(doc: str, text: str) -> list[AnnotatedTable]:
    """The tables of one markdown text that carry a results annotation; a misplaced annotation raises."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        m = ANNOTATION.match(line)
        if not m:
            continue
        files = [f.strip() for f in m.group("files").split(",") if f.strip()]
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j + 1 >= len(lines) or not lines[j].lstrip().startswith("|") or not SEPARATOR_ROW.match(lines[j + 1]):
            raise ValueError(f"{doc}:{i + 1}: a results annotation must stand right above a markdown table")
        k = j + 2
        rows = []
        while k < len(lines) and lines[k].lstrip().startswith("|"):
            rows.append((k + 1, split_row(lines[k])))
            k += 1
        tables.append(AnnotatedTable(doc, i + 1, files, rows))
    return tables


def load_numbers(files: list[str], root: Path = REPO) -> ResultNumbers:
    numbers = ResultNumbers()
    for name in files:
        if not name.startswith(RESULTS) or not name.endswith(".json"):
            raise ValueError(f"{name}: a results annotation names JSON files under {RESULTS}")
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"{name}: no such result file")
        numbers.add_file(path)
    numbers.freeze()
    return numbers


def unmatched_figures(table: AnnotatedTable, root: Path = REPO) -> list[str]:
    """Every figure of the table's body (first column excluded) that no annotated file holds."""
    numbers = load_numbers(table.files, root)
    wrong = []
    for line, cells in table.rows:
        for column, cell in enumerate(cells[1:], start=2):
            for figure in figures_in_cell(cell):
                if not numbers.matches(figure.value, figure.decimals, figure.unit):
                    wrong.append(f"{table.doc}:{line} column {column}: {figure.text!r} is in none of {table.files}")
    return wrong


def documents(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def all_tables(root: Path = REPO) -> list[AnnotatedTable]:
    tables = []
    for path in documents(root):
        tables += annotated_tables(str(path.relative_to(root)), path.read_text())
    return tables


# --- the docs ---------------------------------------------------------------------------------------------


def test_docs_tables_match_their_result_files():
    tables = all_tables()
    assert len(tables) >= 10, "the annotated results tables went missing"
    wrong = [message for table in tables for message in unmatched_figures(table)]
    assert not wrong, "figures in docs that their result files do not hold:\n" + "\n".join(wrong)


def test_every_annotated_table_checks_figures():
    """An annotation over a table with nothing to check would pass whatever the table says."""
    for table in all_tables():
        count = sum(len(figures_in_cell(cell)) for _, cells in table.rows for cell in cells[1:])
        assert count > 0, f"{table.doc}:{table.line}: the annotated table has no figure to check"


# --- the checker itself -----------------------------------------------------------------------------------

RESULT = {
    "accuracy": {"secure": 0.808316, "plaintext": 0.80829},
    "round_ratio": 1.7717,
    "per_seed": [0.8123, 0.7991],
    "peak_rss_mib": {"aggregator": 6287.6},
    "bytes_per_bank_per_round": 2346052.0,
    "rounds": 8,
}


def _write_result(tmp_path: Path) -> str:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "run.json").write_text(json.dumps(RESULT))
    return "docs/results/run.json"


def _check(tmp_path: Path, table: str) -> list[str]:
    name = _write_result(tmp_path)
    text = f"Some text.\n\n<!-- results: {name} -->\n\n{table}\nAfter.\n"
    return [m for t in annotated_tables("doc.md", text) for m in unmatched_figures(t, tmp_path)]


def test_checker_accepts_figures_at_printed_precision(tmp_path):
    table = (
        "| run (2026-11-26, N = 4096) | accuracy | ratio | peak RSS | bytes |\n"
        "|---|---|---|---|---|\n"
        "| issue 27, ε = 0.5 | **0.8083** / 0.808 (81.2 %, 79.9 %) | 1.77× (target ≤ 1.5×) | 6,287.6 MiB = 6.59 GB"
        " | 2.3 MB, 8 rounds, `beta = 0.3` |\n"
    )
    assert _check(tmp_path, table) == []


@pytest.mark.parametrize(
    "cell, figure",
    [
        ("0.8084", "0.8084"),  # one digit off at the printed precision
        ("1.78×", "1.78"),
        ("6.29 GB", "6.29 GB"),  # MiB printed as GB: 6,287.6 MiB is 6.59 GB
        ("5.04 s", "5.04"),  # a figure no file holds
        ("−0.81", "−0.81"),  # the sign counts
        ("81.3 %", "81.3 %"),
    ],
)
def test_checker_rejects_a_wrong_figure(tmp_path, cell, figure):
    table = f"| run | value |\n|---|---|\n| a | {cell} |\n"
    wrong = _check(tmp_path, table)
    assert len(wrong) == 1 and repr(figure) in wrong[0] and "doc.md:7 column 2" in wrong[0]


def test_checker_reads_figures_by_the_rule():
    cell = "≤ 1.5× target, 0.81 ± 0.02, `lr = 0.01`, v2.13.0, 1e-5, §6.11, 3,994.5 s"
    texts = [f.text for f in figures_in_cell(cell)]
    assert texts == ["0.81", "0.02", "3,994.5"]
    assert [f.unit for f in figures_in_cell("6.59 GB, 64.0 KiB, 12.5 %, 3.5 s")] == ["GB", "KiB", "%", None]


def test_an_annotation_needs_a_table_and_existing_files(tmp_path):
    with pytest.raises(ValueError, match="right above a markdown table"):
        annotated_tables("doc.md", "<!-- results: docs/results/run.json -->\nA paragraph, 0.81.\n")
    table = annotated_tables("doc.md", "<!-- results: docs/results/missing.json -->\n| a | b |\n|---|---|\n| x | 0.1 |")
    with pytest.raises(FileNotFoundError):
        unmatched_figures(table[0], tmp_path)
    table = annotated_tables("doc.md", "<!-- results: runs/demo.json -->\n| a | b |\n|---|---|\n| x | 0.1 |")
    with pytest.raises(ValueError, match="under docs/results/"):
        unmatched_figures(table[0], tmp_path)
