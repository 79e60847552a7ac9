"""Choose the new label domain's adaptation setting (issue 11, GraphFL Table 2) on VALIDATION tasks.

In MAML the meta-training inner loop and the test-time fine-tuning are one procedure, so each setting
(inner optimiser, α; T_e = 15 as the paper fixes it) is used for GraphFL's support steps in every episode and
for the fine-tuning of both GraphFL's and FedAvg's (FL+TL) global models. Every run is one cell of
``fedgl-secure reproduce graphfl --parts new-label`` with the setting as ``--set`` overrides, written to the
same cache (``<output-dir>/runs``), so that command finds the chosen setting's cells. FedAvg's federated
training does not depend on the setting, so it is trained once per (dataset, seed) and fine-tuned under
every setting. Runs go one at a time; the table (mean validation accuracy of GraphFL over the runs and the
three shot counts, which picks the setting; FL+TL's beside it; test accuracy recorded, never used) is
printed and written to ``--output`` as JSON.

    FEDGL_DATA=/work/shared/datasets OMP_NUM_THREADS=1 python benchmarks/graphfl_new_label_grid.py \
        --runs cora:0,cora:1,citeseer:0 --output-dir results/graphfl-new-label --output grid.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import GraphFLConfig
from fedgl_secure.simulation.graphfl_experiments import (
    cached_new_label_cell,
    evaluate_new_label,
    new_label_adaptation,
    new_label_tasks,
    protocol_config,
    train_new_label_models,
)

DEFAULT_META = GraphFLConfig()  # --method graphfl's own meta step: Adam at β = 0.02, first order


def setting(
    optimizer: str,
    rate: float,
    meta_learning_rate: float = DEFAULT_META.meta_learning_rate,
    meta_order: int = DEFAULT_META.meta_order,
) -> dict:
    """An adaptation setting (fresh inner state) with the meta step it trains under, every field explicit so a cell's
    key never depends on a default: β and the MAML order default to ``--method graphfl``'s."""
    return {
        "inner_optimizer": optimizer,
        "inner_learning_rate": rate,
        "inner_state": "fresh",
        "meta_learning_rate": meta_learning_rate,
        "meta_order": meta_order,
    }


SETTINGS = {  # name: graphfl overrides. First the adaptation (inner optimiser, α), then β and the order at its winner
    "sgd α=0.01": setting("sgd", 0.01),
    "sgd α=0.1": setting("sgd", 0.1),
    "sgd α=0.5": setting("sgd", 0.5),
    "sgd α=1.0": setting("sgd", 1.0),
    "adam lr=0.01": setting("adam", 0.01),
    "adam lr=0.05": setting("adam", 0.05),
    "adam lr=0.05 second-order": setting("adam", 0.05, meta_order=2),
    "adam lr=0.05 β=0.005": setting("adam", 0.05, meta_learning_rate=0.005),
    "adam lr=0.05 β=0.1": setting("adam", 0.05, meta_learning_rate=0.1),
    "adam lr=0.05 β=0.3": setting("adam", 0.05, meta_learning_rate=0.3),
    "adam lr=0.05 β=0.1 second-order": setting("adam", 0.05, meta_learning_rate=0.1, meta_order=2),
}
SETTING_KEYS = tuple(SETTINGS["sgd α=0.01"])
REPEATS = 10
BACKBONE = "gcn"


def run_one(dataset, seed: int, names: list[str], runs: Path, log) -> dict:
    """Every setting's cell on one (dataset, seed); FedAvg's model trained once, only when a cell is missing."""
    shared: dict = {}
    cells = {}
    for name in names:
        overrides = {"graphfl": dict(SETTINGS[name])}
        settings = {**new_label_adaptation(overrides)}
        settings["graphfl"] = {**settings["graphfl"], "backbone": BACKBONE}
        config = protocol_config(dataset.name, "graphfl", seed, settings)

        def compute(config=config) -> dict:
            _, new, tasks = new_label_tasks(dataset, 2, seed)
            if "fl+tl" not in shared:
                shared.update(train_new_label_models(dataset, config, tasks, 2, methods=("fl+tl",)))
            models = {**train_new_label_models(dataset, config, tasks, 2, methods=("graphfl",)), **shared}
            return {"new_classes": new.tolist(), **evaluate_new_label(dataset, config, models, new, REPEATS)}

        start = time.time()
        cells[name] = cached_new_label_cell(runs, dataset.name, seed, BACKBONE, overrides, REPEATS, compute)
        log(f"{dataset.name} seed {seed} {name}: {time.time() - start:.0f}s {json.dumps(cells[name]['val'])}")
    return cells


def table(results: dict) -> list[dict]:
    """Per setting: the validation (selection) and test means of both methods over runs and shot counts."""
    rows = []
    for name in SETTINGS:
        cells = [by_setting[name] for by_setting in results.values() if name in by_setting]
        if not cells:
            continue
        row = {"setting": name, "runs": len(cells)}
        for method in ("graphfl", "fl+tl"):
            row[f"{method} val"] = float(np.mean([c["val"][method] for c in cells]))
            row[f"{method} test"] = float(np.mean([c[method] for c in cells]))
            row[f"{method} val per run"] = [float(np.mean(c["val"][method])) for c in cells]
        rows.append(row)
    return rows


def cached_results(runs: Path) -> dict:
    """The grid's cells already in the cache, as ``run_one`` returns them (``{"dataset:seed": {setting: cell}}``)."""
    names = {json.dumps(values, sort_keys=True): name for name, values in SETTINGS.items()}
    results: dict = {}
    for path in sorted(runs.glob("new-label-*.json")):
        stored = json.loads(path.read_text())
        key = stored["key"]
        stored_setting = key["overrides"].get("graphfl", {})
        # a cell keyed before a field was explicit ran that field's default
        values = {k: stored_setting.get(k, getattr(DEFAULT_META, k)) for k in SETTING_KEYS}
        name = names.get(json.dumps(values, sort_keys=True))
        if key["variant"] == BACKBONE and key["repeats"] == REPEATS and name and set(key["overrides"]) == {"graphfl"}:
            results.setdefault(f"{key['dataset']}:{key['seed']}", {})[name] = stored["result"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="cora:0,cora:1,citeseer:0", help="dataset:seed,...")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    parser.add_argument("--output-dir", type=Path, default=Path("results/graphfl-new-label"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--summarise-only", action="store_true", help="tabulate the cached cells, run nothing")
    args = parser.parse_args()
    names = [n.strip() for n in args.settings.split(",") if n.strip()]
    results = {}
    if args.summarise_only:
        cached = cached_results(args.output_dir / "runs")
        results = {run: cached[run] for run in args.runs.split(",") if run in cached}
    for run in [] if args.summarise_only else args.runs.split(","):
        name, seed = run.split(":")
        dataset = load_dataset(name, None, seed=0)
        results[run] = run_one(dataset, int(seed), names, args.output_dir / "runs", print)
    rows = table(results)
    for row in rows:
        print(
            f"{row['setting']:>14} runs {row['runs']}  GraphFL val {row['graphfl val']:.3f} "
            f"(per run {', '.join(f'{v:.3f}' for v in row['graphfl val per run'])}) test {row['graphfl test']:.3f} | "
            f"FL+TL val {row['fl+tl val']:.3f} test {row['fl+tl test']:.3f}"
        )
    if args.output:
        args.output.write_text(json.dumps({"runs": results, "table": rows}, indent=1))


if __name__ == "__main__":
    main()
