"""Choose the class-sums method's post-processing (``centroids.*``) on VALIDATION accuracy at one node-unit ε.

Every setting is post-processing inside a bank (it costs no ε), so it may be chosen freely — but on the validation
nodes, never the test nodes. For each setting and seed: one federated run under ``policies/node-dp-centroids.toml``
with the budget's ε and ``--noise`` set (the six sampled banks, one round: the model is final after it), its
best-round validation and test accuracy. Writes JSON (settings ranked by mean validation accuracy).

    FEDGL_DATA=/work/shared/datasets python benchmarks/centroid_settings.py --dataset cora --epsilon 8 --seeds 5 \
        --noise central --output docs/results/centroid_settings_cora.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import tomllib

from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import build_config
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.simulation.experiment import run_experiment

POLICY = Path(__file__).resolve().parent.parent / "policies" / "node-dp-centroids.toml"
GRID = {"teleport": (0.05, 0.1, 0.2), "propagation_steps": (10, 20), "nonnegative": (True, False)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--noise", choices=("central", "local"), default="central", help="[dp.centroids] noise")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    values = tomllib.loads(POLICY.read_text(encoding="utf-8"))
    values["budget"]["epsilon"] = args.epsilon
    values["dp"]["centroids"]["noise"] = args.noise
    policy = policy_from_dict(values, source=f"{POLICY.name} (ε = {args.epsilon:g})")
    datasets = {seed: load_dataset(args.dataset, args.data_root, seed=seed) for seed in range(args.seeds)}
    started = time.perf_counter()
    rows = []
    for teleport, steps, nonnegative in itertools.product(*GRID.values()):
        runs = []
        for seed in range(args.seeds):
            config = build_config(
                {
                    "dataset": args.dataset,
                    "method": "centroids",
                    "seed": seed,
                    "data_root": args.data_root,
                    "device": "cpu",
                    "federation": {"max_rounds": 1},
                    "centroids": {"teleport": teleport, "propagation_steps": steps, "nonnegative": nonnegative},
                }
            )
            result = run_experiment(config, datasets[seed], progress=False, privacy=FederationPrivacy(policy))
            runs.append({"seed": seed, "val": result.best_val_accuracy, "test": result.global_test_accuracy})
        rows.append(
            {
                "teleport": teleport,
                "propagation_steps": steps,
                "nonnegative": nonnegative,
                "val_mean": statistics.fmean(r["val"] for r in runs),
                "test_mean": statistics.fmean(r["test"] for r in runs),
                "runs": runs,
            }
        )
        print(
            f"α={teleport} K={steps} nonneg={nonnegative}: "
            f"val {rows[-1]['val_mean']:.4f} test {rows[-1]['test_mean']:.4f}"
        )
    rows.sort(key=lambda row: -row["val_mean"])
    output = {
        "dataset": args.dataset,
        "epsilon": args.epsilon,
        "noise": args.noise,
        "seeds": args.seeds,
        "selection": "mean validation accuracy (test shown, not used)",
        "command": "python benchmarks/centroid_settings.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(output, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
