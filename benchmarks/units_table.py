"""Markdown tables of a units-of-privacy run (``privacy_utility.py --units …`` JSON), as docs/privacy.md §6.5 has them.

``--format pivot`` (default): one row per unit and method, one column per ε, each cell the mean over seeds
of the chosen metric (``--metric accuracy|roc_auc|pr_auc|mia_auc|link_auc``); the no-DP runs (unit ``none``) fill
the ε = ∞ column of every unit's rows of the same method. ``--format rows``: one row per (unit, ε, method) with
the per-seed values, the best rounds, the membership AUC beside its attack floor, and the link AUC.

    python benchmarks/units_table.py docs/results/privacy_units_cora_grid.json
    python benchmarks/units_table.py docs/results/privacy_units_bank_grid.json --metric roc_auc
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

METRICS = ("accuracy", "roc_auc", "pr_auc", "mia_auc", "link_auc")
PERCENT = {"accuracy"}  # shown in per cent; the AUCs as fractions


def epsilon_key(epsilon) -> float:
    return math.inf if epsilon == "inf" else float(epsilon)


def epsilon_label(epsilon) -> str:
    return "∞" if epsilon_key(epsilon) == math.inf else f"{epsilon_key(epsilon):g}"


def seed_values(row: dict, metric: str) -> list[float]:
    return [run[metric] for run in row["runs"] if run.get(metric) is not None]


def shown(value: float | None, metric: str) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if metric in PERCENT else f"{value:.3f}"


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def pivot_table(rows: list[dict], metric: str) -> str:
    """Units × ε of ``metric``'s seed means; ε = ∞ from the no-DP row of the same method."""
    epsilons = sorted({epsilon_key(row["epsilon"]) for row in rows}, reverse=True)
    no_dp = {row["method"]: row for row in rows if row["unit"] == "none"}
    units = [(row["unit"], row["method"]) for row in rows if row["unit"] not in ("none",)]
    lines = [
        f"| unit | method | {' | '.join('ε = ' + epsilon_label(e) for e in epsilons)} | seeds |",
        "|---|---|" + "---|" * len(epsilons) + "---|",
    ]
    for unit, method in dict.fromkeys(units):  # first-seen order, no repeats
        cells, seeds = [], set()
        for epsilon in epsilons:
            match = [
                r for r in rows if r["unit"] == unit and r["method"] == method and epsilon_key(r["epsilon"]) == epsilon
            ]
            if not match and epsilon == math.inf and method in no_dp:
                match = [no_dp[method]]
            if not match:
                cells.append("–")
                continue
            values = seed_values(match[0], metric)
            seeds.add(len(values))
            cells.append(shown(mean(values), metric))
        lines.append(f"| {unit} | {method} | {' | '.join(cells)} | {'/'.join(map(str, sorted(seeds)))} |")
    return "\n".join(lines)


def rows_table(rows: list[dict]) -> str:
    """One line per (unit, ε, method): per-seed accuracy, best rounds, ROC-AUC, MIA beside its floor, link AUC."""
    lines = [
        "| unit | ε | method | accuracy % (per seed) | best rounds | ROC-AUC | MIA AUC | MIA floor | link AUC |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        accuracy = seed_values(row, "accuracy")
        per_seed = ", ".join(f"{100 * a:.1f}" for a in accuracy)
        best = ", ".join(str(run.get("best_round")) for run in row["runs"])
        cells = [shown(mean(seed_values(row, m)), m) for m in ("roc_auc", "mia_auc", "mia_floor_auc", "link_auc")]
        lines.append(
            f"| {row['unit']} | {epsilon_label(row['epsilon'])} | {row['method']} | "
            f"**{shown(mean(accuracy), 'accuracy')}** ({per_seed}) | {best} | {' | '.join(cells)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="privacy_utility.py --units outputs (rows concatenated)")
    parser.add_argument("--format", choices=("pivot", "rows"), default="pivot")
    parser.add_argument("--metric", choices=METRICS, default="accuracy", help="the pivot's cells")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for path in args.results:
        try:
            rows.extend(json.loads(path.read_text(encoding="utf-8"))["results"])
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"{path}: not a privacy_utility.py --units output ({error})")
    print(pivot_table(rows, args.metric) if args.format == "pivot" else rows_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
