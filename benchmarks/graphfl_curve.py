"""Non-IID accuracy against labelled nodes per class (issue 11, the GraphFL paper's Figures 1-3), from the
graphfl.json of `reproduce graphfl --parts non-iid`: per dataset and label count the mean ± std of every column
with its seeds, the paired GraphFL − FL (mean, standard error, per seed), and test (validation) per seed.
docs/reproduction.md, "Non-IID":

    python benchmarks/graphfl_curve.py results/graphfl/graphfl.json
"""

import json
import sys

from fedgl_secure.simulation.graphfl_experiments import METHOD_LABELS, mean_std, paired_difference, table_cell


def drawn_seeds(report: dict, dataset: str, lpc: int) -> list[int]:
    """The seeds a row's cells come from, in order: 0..seeds-1 less those whose split could not be drawn."""
    skipped = {c["seed"] for c in report.get("not_drawn", []) if c["dataset"] == dataset and c["lpc"] == lpc}
    return [seed for seed in range(report["seeds"]) if seed not in skipped]


def main(path: str) -> None:
    report = json.loads(open(path).read())
    columns = report["non_iid_methods"]
    rows = {}
    for key, cells in report["non_iid"].items():
        dataset, lpc, variant = key.split("/")
        rows.setdefault((dataset, int(lpc)), {})[variant] = cells
    print("| dataset | labels per class | seeds | " + " | ".join(METHOD_LABELS[m] for m in columns) + " |")
    print("|---|---|---|" + "---|" * len(columns))
    for (dataset, lpc), methods in rows.items():
        seeds = drawn_seeds(report, dataset, lpc)
        cells = []
        for m in columns:
            test = [c["test"] for c in methods.get(m, [])]
            cells.append(table_cell(mean_std(test)) if test else "–")
        print(f"| {dataset} | {lpc} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    print()
    for (dataset, lpc), methods in rows.items():
        if "graphfl" in methods and "federated" in methods:
            gap = paired_difference(methods["federated"], methods["graphfl"])  # the same seeds, in order
            per_seed = " / ".join(f"{d:+.3f}" for d in gap["per_seed"])
            print(f"{dataset} {lpc}: GraphFL - FL {gap['mean']:+.3f} (s.e. {gap['se']:.3f}; per seed {per_seed})")
    print()
    for (dataset, lpc), methods in rows.items():
        seeds = drawn_seeds(report, dataset, lpc)
        for m in (m for m in columns if m in methods):
            cells = ", ".join(f"{s}: {c['test']:.3f} ({c['val']:.3f})" for s, c in zip(seeds, methods[m], strict=True))
            print(f"{dataset} {lpc} {METHOD_LABELS[m]}: {cells}")


if __name__ == "__main__":
    main(sys.argv[1])
