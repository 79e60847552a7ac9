"""Compare two Table 2 results (``reproduce table2``'s ``table2.json``) cell by cell: does each cell of the candidate
lie within the reference's seed spread? (issue 30: Table 2 with a PyG backbone.)

    python benchmarks/table2_compare.py docs/results/table2.json results/table2-pyg/table2.json \\
        --output docs/results/table2_pyg_compare.json

For every (dataset, method) cell both files hold, with the per-seed global test accuracies of each:

* ``within_seed_range``: the candidate's mean lies between the reference's lowest and highest seed;
* ``within_two_std``: ``|mean difference| <= 2 · std`` of the reference (population std over its seeds, as
  ``table2.json`` reports it);
* ``difference``: candidate mean − reference mean, and ``same_seeds``: whether both used the same seeds.

The verdict (``all_within``) is true when every compared cell is within the reference's seed range; the command
exits non-zero otherwise, naming the cells that are not.

``--reference-cells FILE`` (repeatable) replaces the reference's cells with those FILE holds (same dataset and
method), later files winning: for cells whose default settings changed after the reference table was run (Wiki's
self-supervision settings, chosen on validation later), so that both sides ran the same configuration. Each compared
cell names the file its reference came from (``reference_file``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path


def compare_cell(reference: dict, candidate: dict) -> dict:
    """One cell's comparison (module doc)."""
    accuracies = reference["global_test_accuracy"]
    reference_mean = statistics.fmean(accuracies)
    reference_std = statistics.pstdev(accuracies)
    candidate_mean = statistics.fmean(candidate["global_test_accuracy"])
    return {
        "reference_mean": round(reference_mean, 4),
        "reference_std": round(reference_std, 4),
        "reference_range": [round(min(accuracies), 4), round(max(accuracies), 4)],
        "candidate_mean": round(candidate_mean, 4),
        "candidate_std": round(statistics.pstdev(candidate["global_test_accuracy"]), 4),
        "candidate_seeds": candidate["seeds"],
        "same_seeds": candidate["seeds"] == reference["seeds"],
        "difference": round(candidate_mean - reference_mean, 4),
        "within_seed_range": min(accuracies) <= candidate_mean <= max(accuracies),
        "within_two_std": abs(candidate_mean - reference_mean) <= 2 * reference_std,
    }


def merge_references(tables: Sequence[tuple[str, dict]]) -> tuple[dict, dict]:
    """The cells of several Table 2 files, a later file's cell replacing an earlier one's, and the file each came
    from (by dataset then method)."""
    merged: dict[str, dict] = {}
    sources: dict[str, dict[str, str]] = {}
    for name, table in tables:
        for dataset, methods in table.items():
            merged.setdefault(dataset, {}).update(methods)
            sources.setdefault(dataset, {}).update(dict.fromkeys(methods, name))
    return merged, sources


def compare(reference: dict, candidate: dict, sources: dict | None = None) -> dict:
    """Every cell both tables hold, by dataset then method; ``sources`` (from :func:`merge_references`) names each
    reference cell's file."""
    cells = {
        dataset: {
            method: compare_cell(reference[dataset][method], cell)
            | ({"reference_file": sources[dataset][method]} if sources else {})
            for method, cell in methods.items()
            if method in reference.get(dataset, {})
        }
        for dataset, methods in candidate.items()
        if dataset in reference
    }
    outside = [
        f"{d}/{m}" for d, methods in cells.items() for m, cell in methods.items() if not cell["within_seed_range"]
    ]
    return {
        "cells": cells,
        "compared": sum(len(m) for m in cells.values()),
        "outside": outside,
        "all_within": not outside,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument(
        "--reference-cells",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a Table 2 file whose cells replace the reference's (repeatable, later files win; module doc)",
    )
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--note", default="", help="what the candidate ran (backbone, command), kept in the JSON")
    args = parser.parse_args()
    references = [args.reference, *args.reference_cells]
    reference, sources = merge_references([(str(path), json.loads(path.read_text())) for path in references])
    result = compare(reference, json.loads(args.candidate.read_text()), sources)
    record = {
        "reference": str(args.reference),
        "reference_cells": [str(path) for path in args.reference_cells],
        "candidate": str(args.candidate),
        "note": args.note,
        **result,
    }
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    if not result["compared"]:
        sys.exit("no cell in common")
    if result["outside"]:
        sys.exit(f"outside the reference's seed range: {', '.join(result['outside'])}")


if __name__ == "__main__":
    main()
