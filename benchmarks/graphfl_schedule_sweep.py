"""Choose the non-IID schedule of FL and GraphFL (issue 11) on VALIDATION accuracy, at 10 labels per class.

Every run is one cell of ``fedgl-secure reproduce graphfl --parts non-iid`` (simulation/graphfl_experiments.py:
50 clients, 20 % participation, 50 rounds, T_e = 15) with the setting's ``overrides`` in place of the
chosen ``NON_IID_SCHEDULE``; it reports the best-round validation accuracy (which picks the setting), the
test accuracy at that round (never used to choose) and the validation curve. Runs go ``--workers`` at a
time, each in its own process (one thread each); results are appended to ``--output`` as JSON lines.

Grids (docs/reproduction.md, "GraphFL (issue 11)"): ``1`` Kipf's weight decay; ``2`` and ``3`` without
local/meta weight decay; ``4`` and ``5`` the steps past the edges of 3 (the runs of 4 and 5 were made on a
2-core machine, one at a time); ``6`` self-training's n per class on top of the chosen schedules.

    FEDGL_DATA=/work/shared/datasets OMP_NUM_THREADS=1 python benchmarks/graphfl_schedule_sweep.py \
        --grid 2 --workers 16 --output sweep2.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RUNS = {  # (dataset, seeds) each setting of a grid runs on
    "1": (("cora", (0, 1)), ("citeseer", (0,))),
    "2": (("cora", (0, 1, 2)), ("citeseer", (0,))),
    "3": (("cora", (0, 1, 2)), ("citeseer", (0,))),
    "4": (("cora", (0, 1)), ("citeseer", (0,))),
    "5": (("cora", (0, 1)), ("citeseer", (0,))),
    "6": (("cora", (0, 1)), ("citeseer", (0,))),
}


def _fl(learning_rate: float, epochs: int = 15, reset: bool = False, weight_decay: float = 0.0) -> dict:
    training = {"learning_rate": learning_rate, "local_epochs": epochs, "weight_decay": weight_decay}
    return {"training": {**training, "reset_optimizer_each_round": reset}}


def _graphfl_own_adam(learning_rate: float, meta: str, beta: float, meta_decay: float = 0.0) -> dict:
    """GraphFL whose support steps are the client's own Adam at ``learning_rate`` (no local weight decay)."""
    return {
        "training": {"weight_decay": 0.0, "learning_rate": learning_rate},
        "graphfl": {
            "inner_optimizer": "adam",
            "meta_optimizer": meta,
            "meta_learning_rate": beta,
            "meta_weight_decay": meta_decay,
        },
    }


def _graphfl_sgd(alpha: float, meta: str, beta: float, meta_decay: float) -> dict:
    """GraphFL with plain-SGD support steps at α."""
    settings = {"inner_learning_rate": alpha, "meta_optimizer": meta, "meta_learning_rate": beta}
    return {"graphfl": {**settings, "meta_weight_decay": meta_decay}}


def grid(name: str) -> list[tuple[str, dict]]:
    """(method, overrides) of every setting in grid ``name``."""
    if name == "1":  # Kipf's weight decay 5e-4 everywhere (GraphFL before the empty-query fix, d8b83bb)
        settings = [("graphfl", _graphfl_sgd(a, "adam", b, 5e-4)) for a in (0.01, 0.1, 0.5) for b in (0.02, 0.005)]
        settings += [("graphfl", _graphfl_sgd(a, "sgd", 0.5, 5e-4)) for a in (0.1, 0.5)]
        settings += [
            ("graphfl", {"graphfl": {"inner_optimizer": "adam", "inner_learning_rate": a}})
            for a in (0.01, 0.003, 0.001)
        ]
        settings += [("federated", _fl(lr, e, weight_decay=5e-4)) for lr in (0.01, 0.003, 0.001) for e in (15, 5, 1)]
        settings += [("federated", _fl(lr, e, True, 5e-4)) for lr in (0.01, 0.001) for e in (15, 1)]
        return [*settings, ("centralized", {})]
    if name == "2":
        settings = [("graphfl", {})]  # the method's defaults
        settings += [("graphfl", _graphfl_sgd(a, "adam", b, 0.0)) for b in (0.02, 0.005) for a in (0.01, 0.1, 0.5)]
        settings += [("graphfl", _graphfl_sgd(a, "sgd", b, 0.0)) for b in (0.5, 2.0) for a in (0.1, 0.5)]
        settings += [("graphfl", _graphfl_own_adam(lr, "adam", 0.02)) for lr in (0.01, 0.003)]
        return settings + [("federated", _fl(lr, e, r)) for lr in (0.01, 0.003, 0.001) for e in (15, 5) for r in (0, 1)]
    if name == "3":
        settings = [("graphfl", _graphfl_own_adam(lr, "adam", b)) for lr, b in ((0.02, 0.02), (0.01, 0.05))]
        settings += [
            ("graphfl", _graphfl_own_adam(0.01, "adam", 0.005)),
            ("graphfl", _graphfl_own_adam(0.01, "sgd", 1.0)),
        ]
        settings += [
            ("graphfl", _graphfl_own_adam(0.02, "adam", 0.05)),
            ("graphfl", _graphfl_own_adam(0.01, "adam", 0.02, 5e-4)),
        ]
        return settings + [("federated", _fl(lr)) for lr in (0.02, 0.03)]
    if name == "4":  # the last setting (0.03, 0.05) was stopped unrun, for time
        settings = [("graphfl", _graphfl_own_adam(0.02, "adam", 0.1)), ("federated", _fl(0.05))]
        return settings + [("graphfl", _graphfl_own_adam(0.01, "adam", 0.1))]
    if name == "5":
        return [("federated", _fl(0.1)), ("graphfl", _graphfl_own_adam(0.05, "adam", 0.05))]
    if name == "6":  # GraphFL+ST: self-training's n on top of the chosen schedule, as reproduce's cell (cached)
        return [("graphfl+st", {"self_training": {"per_class": n}}) for n in (5, 10, 20)]
    raise SystemExit(f"--grid {name!r}: choose from {', '.join(RUNS)}")


def run_one(job: dict) -> dict:
    """One non-IID cell with ``job``'s overrides (in this process)."""
    import torch

    from fedgl_secure.data.graphfl_split import graphfl_clients
    from fedgl_secure.data.registry import load_dataset
    from fedgl_secure.simulation.experiment import run_experiment
    from fedgl_secure.simulation.graphfl_experiments import (
        NUM_CLIENTS,
        SELF_TRAINED,
        cached_non_iid_cell,
        protocol_config,
    )

    torch.set_num_threads(1)
    dataset = load_dataset(job["dataset"], None, seed=0)
    if job["method"].endswith(SELF_TRAINED):  # the very cell `reproduce graphfl` runs, written to its cache
        per_class = job["overrides"]["self_training"]["per_class"]
        started = time.time()
        cell = cached_non_iid_cell(Path(job["runs"]), dataset, job["method"], job["lpc"], job["seed"], {}, per_class)
        return {**job, **cell, "seconds": round(time.time() - started, 1)}
    config = protocol_config(dataset.name, job["method"], job["seed"], job["overrides"])
    started = time.time()
    result = run_experiment(
        config, clients=graphfl_clients(dataset, NUM_CLIENTS, job["lpc"], job["seed"]), progress=False
    )
    return {
        **job,
        "val": result.best_val_accuracy,
        "test": result.global_test_accuracy,
        "best_round": result.best_round,
        "seconds": round(time.time() - started, 1),
        "curve": [round(record.val_accuracy, 3) for record in result.history],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", required=True, choices=sorted(RUNS))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--output", required=True)
    parser.add_argument("--runs", default="results/graphfl/runs", help="reproduce graphfl's cell cache (grid 6)")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # one run, in a worker process
    args = parser.parse_args()
    if args.job:
        print(json.dumps(run_one(json.loads(args.job))), flush=True)
        return
    jobs = [
        {
            "grid": args.grid,
            "dataset": dataset,
            "method": method,
            "lpc": 10,
            "seed": seed,
            "overrides": overrides,
            "runs": args.runs,
        }
        for method, overrides in grid(args.grid)
        for dataset, seeds in RUNS[args.grid]
        for seed in seeds
    ]

    def run(job: dict) -> str:
        command = [sys.executable, __file__, "--grid", args.grid, "--output", args.output, "--job", json.dumps(job)]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        line = lines[-1] if done.returncode == 0 and lines else json.dumps({**job, "error": done.stderr[-800:]})
        with open(args.output, "a") as out:
            out.write(line + "\n")
        return line

    with ThreadPoolExecutor(args.workers) as pool:
        for line in pool.map(run, jobs):
            print(line[:160], flush=True)


if __name__ == "__main__":
    main()
