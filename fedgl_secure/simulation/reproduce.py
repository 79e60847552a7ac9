"""Reproduction of the FedGL paper's Table 2 (global test accuracy, mean over seeds).

Each (dataset, method, seed) run is stored as its own JSON file under ``<output>/runs`` and
re-used when the same configuration is asked for again, so a long reproduction can be stopped
and resumed, and runs can be spread over worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
from tqdm.auto import tqdm

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import ExperimentConfig, build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.method_registry import method_spec
from fedgl_secure.simulation.executors import ExecutorSettings
from fedgl_secure.simulation.experiment import run_experiment

# FedGL paper, Table 2: global test accuracy, mean of 5 seeds (DESIGN §4).
PAPER_TABLE2 = MappingProxyType(
    {
        "cora": {
            "centralized": 0.811,
            "federated": 0.810,
            "fedgl-no-gpg": 0.828,
            "fedgl-no-gpl": 0.812,
            "fedgl": 0.830,
        },
        "citeseer": {
            "centralized": 0.705,
            "federated": 0.676,
            "fedgl-no-gpg": 0.732,
            "fedgl-no-gpl": 0.676,
            "fedgl": 0.734,
        },
        "acm": {
            "centralized": 0.848,
            "federated": 0.855,
            "fedgl-no-gpg": 0.892,
            "fedgl-no-gpl": 0.858,
            "fedgl": 0.891,
        },
        "wiki": {
            "centralized": 0.619,
            "federated": 0.678,
            "fedgl-no-gpg": 0.689,
            "fedgl-no-gpl": 0.673,
            "fedgl": 0.691,
        },
    }
)
TABLE2_METHODS = ("centralized", "local", "federated", "fedgl-no-gpg", "fedgl-no-gpl", "fedgl")


@dataclass(frozen=True)
class RunSpec:
    config: ExperimentConfig

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.config.model_dump_json().encode()).hexdigest()[:10]
        return f"{self.config.dataset}-{self.config.method}-seed{self.config.seed}-{digest}"


def _run_one(args: tuple) -> dict:
    """One run, ``(config, path[, executor settings])``, its record written to ``path``."""
    config_dict, path, *executor = args
    # One thread per worker: several small GCNs in parallel beat one multi-threaded one.
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("FEDGL_WORKER_THREADS", "1"))))
    config = ExperimentConfig.model_validate(config_dict)
    dataset = load_dataset(config.dataset, config.data_root, seed=config.seed, split=config.data)
    settings = ExecutorSettings.model_validate(executor[0]) if executor and executor[0] else None
    result = run_experiment(config, dataset, progress=False, executor=settings).to_dict()
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return result


def run_table2(
    datasets: Sequence[str],
    methods: Sequence[str],
    seeds: int,
    output_dir: Path,
    data_root: str | None,
    workers: int = 1,
    overrides: dict | None = None,
    executor: ExecutorSettings | None = None,
) -> dict:
    """Run every missing (dataset, method, seed), then write ``table2.json`` and ``table2.md``.

    ``executor``: where the federated methods' banks run (:mod:`~fedgl_secure.simulation.executors`; the
    baselines, which exchange nothing, run in this process); on Ray, one Ray serves every run, and runs go one
    after the other (``workers`` = 1: the banks are what is spread over the CPUs)."""
    runs_dir = output_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    specs = []
    for dataset in datasets:
        for method in methods:
            for seed in range(seeds):
                values = {"dataset": dataset, "method": method, "seed": seed, "data_root": data_root}
                for key, value in (overrides or {}).items():
                    values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
                specs.append(RunSpec(build_config(values)))
    todo = [s for s in specs if not (runs_dir / f"{s.key}.json").exists()]
    on_ray = executor is not None and executor.kind == "ray"
    if on_ray and workers > 1:
        raise ConfigError("--workers: with --executor ray the banks of each run are spread over Ray; use --workers 1")
    jobs = [
        (
            s.config.model_dump(mode="json"),
            str(runs_dir / f"{s.key}.json"),
            None if executor is None or method_spec(s.config.method).baseline else executor.model_dump(),
        )
        for s in todo
    ]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(tqdm(pool.map(_run_one, jobs), total=len(jobs), desc="table2", unit="run"))
    else:
        with _ray_for(executor if on_ray and jobs else None):
            for job in tqdm(jobs, desc="table2", unit="run"):
                _run_one(job)
    results = [json.loads((runs_dir / f"{s.key}.json").read_text()) for s in specs]
    table = summarize(results)
    (output_dir / "table2.json").write_text(json.dumps(table, indent=2))
    (output_dir / "table2.md").write_text(render_markdown(table))
    return table


@contextmanager
def _ray_for(executor: ExecutorSettings | None) -> Iterator[None]:
    """One Ray for every run of a reproduction on Ray (none otherwise): started or joined once, not per run."""
    if executor is None:
        yield
        return
    from fedgl_secure.simulation.ray_executor import ray_session

    with ray_session(executor):
        yield


def _split_of(result: dict) -> str:
    """The run's ``data.split`` (runs recorded before the option existed used the standard split)."""
    return result.get("config", {}).get("data", {}).get("split", "standard")


def summarize(results: Sequence[dict]) -> dict:
    """Mean ± std of global test accuracy per (dataset, method), with the paper's Table 2 value.

    The paper value is given only for standard-split runs: random splits (``data.split = "random"``)
    are the paper's Table 3 setting, which Table 2's numbers do not describe.
    """
    cells: dict[str, dict[str, dict]] = {}
    splits: dict[tuple[str, str], set[str]] = {}
    for result in results:
        splits.setdefault((result["dataset"], result["method"]), set()).add(_split_of(result))
        cell = cells.setdefault(result["dataset"], {}).setdefault(
            result["method"], {"seeds": [], "global_test_accuracy": [], "best_val_accuracy": [], "rounds": []}
        )
        cell["seeds"].append(result["seed"])
        cell["global_test_accuracy"].append(result["global_test_accuracy"])
        cell["best_val_accuracy"].append(result["best_val_accuracy"])
        cell["rounds"].append(result["best_round"])
    for dataset, methods in cells.items():
        for method, cell in methods.items():
            accuracies = np.asarray(cell["global_test_accuracy"])
            cell["mean"] = float(accuracies.mean())
            cell["std"] = float(accuracies.std())
            cell["val_mean"] = float(np.mean(cell["best_val_accuracy"]))
            standard = splits[(dataset, method)] == {"standard"}
            cell["paper"] = PAPER_TABLE2.get(dataset, {}).get(method) if standard else None
    return cells


def render_markdown(table: dict) -> str:
    methods = [m for m in TABLE2_METHODS if any(m in cells for cells in table.values())]
    lines = [
        "# Table 2 — global test accuracy (mean ± std over seeds; paper value in brackets)",
        "",
        "| dataset | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for dataset, cells in table.items():
        row = []
        for method in methods:
            cell = cells.get(method)
            if cell is None:
                row.append("–")
                continue
            paper = f" [{cell['paper']:.3f}]" if cell.get("paper") is not None else ""
            row.append(f"{cell['mean']:.3f} ± {cell['std']:.3f}{paper}")
        lines.append(f"| {dataset} | " + " | ".join(row) + " |")
    seeds = {len(c["seeds"]) for cells in table.values() for c in cells.values()}
    lines += ["", f"Seeds per cell: {', '.join(str(s) for s in sorted(seeds))}."]
    return "\n".join(lines) + "\n"
