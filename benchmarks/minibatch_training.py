"""Mini-batch against full-batch local training on one generated bank: ROC-AUC, seconds, peak memory (issue 29).

One bank's own local work, as its node does it each round: read its customers and transactions tables
(``load_bank_data``), build its graph tensors, then ``--rounds`` rounds of E local epochs (``LocalTrainer.train``
from the bank's own model, like the Local baseline) followed by inference of P_k and H_k over every node
(``LocalTrainer.infer``). Each mode runs in its own fresh process, one after the other, so each peak RSS is its
own:

* ``full``: full-batch Adam over the whole graph (the default training);
* ``minibatch``: ``training.batch_size`` seeds per step, neighbour-sampled with ``training.fanouts``, and
  layer-wise inference (``engine/minibatch.py``).

Reported per mode: validation and test ROC-AUC of the fraud class (from P_k) after every round, the test
ROC-AUC at the round of best validation ROC-AUC, CPU seconds of training and inference per round (the process's
CPU time: the machine is shared, wall seconds are given too), and the peak RSS (``VmHWM``) of each phase — load,
graph tensors, each round — reset between phases through ``/proc/self/clear_refs``, and of the whole process.
With both modes, ``minibatch_vs_full`` gives the ROC-AUC difference and the ratios of seconds and peak RSS.

``--pseudo-neighbors s`` adds FedGL's self-supervision from round 2 with stand-ins of the consortium's broadcast,
sized like the real ones (the aggregator's are not computed here): pseudo labels from the bank's own previous P
(Eq. 13 at λ = 0.5 on its own predictions) and a pseudo graph of ``s`` uniformly drawn neighbours per node (row
weights 1/s), fused into Â by Eq. 9 with β = 0.3, α = 0.2 — so the fused operator, the loss-node count and the
memory are those of a FedGL round; the accuracy is then not FedGL's.

    nice -n 19 .venv/bin/python benchmarks/minibatch_training.py --data-dir /tmp/banks_100k --customers 100000 \\
        --rounds 20 --output docs/results/minibatch_training.json
    nice -n 19 .venv/bin/python benchmarks/minibatch_training.py --data-dir /tmp/banks_5m --customers 5000000 \\
        --modes minibatch --rounds 3 --pseudo-neighbors 10 --output docs/results/bank_5m_customers.json

``--data-dir`` is generated with ``synthesize_banks`` (2 banks, the given customers per bank) when it holds no
output yet; the bank measured is ``--bank``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue as queue_module
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.data.sources.bank_graph import load_bank_data
from fedgl_secure.data.sources.declaration import FileSource
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import TrainingConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.metrics import binary_ranking_metrics
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.engine.pseudo_labels import global_pseudo_labels
from fedgl_secure.seeding import numpy_stream, torch_stream

ALPHA, BETA, THRESHOLD = 0.2, 0.3, 0.5
FRAUD = 1  # the schema's positive class ("fraud")


def memory_mib() -> dict[str, float]:
    """VmRSS and VmHWM of this process in MiB."""
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmHWM:", "VmRSS:")):
                name, value = line.split(":", 1)
                values[name] = round(int(value.split()[0]) / 1024, 1)
    return values


class Phases:
    """Peak RSS, CPU and wall seconds of consecutive phases (the peak is reset at each phase's start)."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, float]] = {}
        self.process_peak = 0.0
        self._start()

    def _start(self) -> None:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def end(self, name: str) -> dict[str, float]:
        memory = memory_mib()
        self.process_peak = max(self.process_peak, memory["VmHWM"])
        self.records[name] = {
            "peak_rss_mib": memory["VmHWM"],
            "rss_after_mib": memory["VmRSS"],
            "cpu_seconds": round(time.process_time() - self._cpu, 2),
            "wall_seconds": round(time.perf_counter() - self._wall, 2),
        }
        print(f"phase {name}: {json.dumps(self.records[name])}", file=sys.stderr, flush=True)
        self._start()
        return self.records[name]


def stand_in_pseudo_graph(num_nodes: int, neighbors: int, seed: int) -> PseudoGraph:
    """``neighbors`` uniformly drawn other nodes per node, weight 1/s: the size and shape of Eq. 15's Ā."""
    rng = numpy_stream(seed, "benchmark", "pseudo graph")
    drawn = rng.integers(0, num_nodes - 1, size=(num_nodes, neighbors), dtype=np.int64)
    drawn += drawn >= np.arange(num_nodes)[:, None]  # never the node itself
    weights = np.full((num_nodes, neighbors), 1.0 / neighbors, dtype=np.float32)
    return PseudoGraph(torch.from_numpy(drawn), torch.from_numpy(weights))


def roc_auc(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    scores = torch.softmax(logits[mask], dim=1)[:, FRAUD]
    return round(binary_ranking_metrics(scores, labels[mask] == FRAUD).roc_auc, 5)


def run_mode(mode: str, args: dict, queue) -> None:
    """One mode, start to end, in this (fresh) process; puts its record on ``queue``."""
    torch.set_num_threads(args["threads"])
    phases = Phases()
    directory = Path(args["data_dir"]) / args["bank"]
    source = FileSource(
        kind="files", customers=directory / "customers.parquet", transactions=directory / "transactions.parquet"
    )
    data = load_bank_data(source, synthetic_bank_schema(), name=args["bank"], seed=args["seed"])
    graph_data = data.graph
    phases.end("load")
    training = dict(args["training"])
    if mode == "full":
        training = {k: v for k, v in training.items() if k not in ("batch_size", "fanouts", "inference_rows")}
    config = TrainingConfig(**training)
    n = graph_data.num_nodes
    graph = GraphTensors.from_graph(graph_data, np.arange(n), n, torch.device("cpu"), config.normalize_features)
    del data, graph_data
    phases.end("graph_tensors")
    trainer = LocalTrainer(0, graph, config, args["seed"])
    trainer.model.reset_parameters(torch_stream(args["seed"], "init"))
    pseudo_graph = (
        stand_in_pseudo_graph(n, args["pseudo_neighbors"], args["seed"]) if args["pseudo_neighbors"] else None
    )
    pseudo_labels = None
    rounds = []
    for round_number in range(1, args["rounds"] + 1):
        with_ssl = pseudo_graph is not None and round_number > 1
        adjacency = graph.adjacency(pseudo_graph if with_ssl else None, BETA, False)
        loss = trainer.train(adjacency, None, pseudo_labels if with_ssl else None, ALPHA if with_ssl else 0.0)
        training_phase = phases.end(f"round_{round_number}_training")
        output = trainer.infer(adjacency)
        del adjacency
        inference_phase = phases.end(f"round_{round_number}_inference")
        probabilities = torch.softmax(output.logits, dim=1)
        if pseudo_graph is not None:
            pseudo_labels = global_pseudo_labels(probabilities, THRESHOLD)
        rounds.append(
            {
                "round": round_number,
                "loss": round(loss, 5),
                "val_roc_auc": roc_auc(output.logits, graph.labels, graph.val_mask),
                "test_roc_auc": roc_auc(output.logits, graph.labels, graph.test_mask),
                "training_cpu_seconds": training_phase["cpu_seconds"],
                "inference_cpu_seconds": inference_phase["cpu_seconds"],
                "pseudo_labelled": int((pseudo_labels >= 0).sum()) if pseudo_labels is not None else 0,
            }
        )
        del output, probabilities
        print(f"[{mode}] {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
        # what a long run has measured so far survives its being stopped (the parent writes the whole at the end)
        Path(args["partial"] + f".{mode}.json").write_text(json.dumps(summary(mode, config, graph, phases, rounds)))
    queue.put(summary(mode, config, graph, phases, rounds))


def summary(mode: str, config: TrainingConfig, graph: GraphTensors, phases: Phases, rounds: list[dict]) -> dict:
    """One mode's record after ``rounds``."""
    best = max(rounds, key=lambda entry: entry["val_roc_auc"])
    return {
        "mode": mode,
        "training": config.model_dump(mode="json"),
        "nodes": graph.num_nodes,
        "edges": int((graph.base_adjacency.nnz - graph.num_nodes) // 2),
        "train_nodes": int(graph.train_mask.sum()),
        "best_round": best["round"],
        "test_roc_auc_at_best_val": best["test_roc_auc"],
        "val_roc_auc_best": best["val_roc_auc"],
        "training_cpu_seconds_per_round": round(float(np.mean([r["training_cpu_seconds"] for r in rounds])), 2),
        "inference_cpu_seconds_per_round": round(float(np.mean([r["inference_cpu_seconds"] for r in rounds])), 2),
        "peak_rss_mib": phases.process_peak,
        "phases": phases.records,
        "rounds": rounds,
    }


def compare(records: dict[str, dict]) -> dict[str, float]:
    full, mini = records["full"], records["minibatch"]

    def ratio(key: str) -> float:
        return round(mini[key] / full[key], 3) if full[key] else float("nan")

    return {
        "test_roc_auc_difference": round(mini["test_roc_auc_at_best_val"] - full["test_roc_auc_at_best_val"], 5),
        "training_cpu_seconds_ratio": ratio("training_cpu_seconds_per_round"),
        "inference_cpu_seconds_ratio": ratio("inference_cpu_seconds_per_round"),
        "peak_rss_ratio": ratio("peak_rss_mib"),
        "training_peak_rss_above_graph_mib": {
            name: round(
                max(v["peak_rss_mib"] for k, v in record["phases"].items() if k.endswith("_training"))
                - record["phases"]["graph_tensors"]["rss_after_mib"],
                1,
            )
            for name, record in records.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--customers", type=int, required=True, help="customers per bank (to generate the data)")
    parser.add_argument("--bank", default="bank-a")
    parser.add_argument("--modes", default="full,minibatch")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=10, help="E: local epochs per round")
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--fanouts", default="10,10", help="neighbours per node and layer, input layer first")
    parser.add_argument("--pseudo-neighbors", type=int, default=0, help="s of the stand-in pseudo graph (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    summary = synthesize_banks(args.data_dir, banks=2, customers=args.customers, seed=args.seed)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or set(modes) - {"full", "minibatch"}:
        raise SystemExit(f"--modes: choose from full, minibatch, got {args.modes!r}")
    shared = {
        "data_dir": str(args.data_dir),
        "bank": args.bank,
        "rounds": args.rounds,
        "seed": args.seed,
        "threads": args.threads,
        "pseudo_neighbors": args.pseudo_neighbors,
        "partial": str(args.output.with_suffix(".partial")),
        "training": {
            # a bank node's defaults for its own tables (consortium/config.py): standardised numeric features
            # are not bag-of-words rows to normalise, and 3 % fraud needs balanced class weights
            "normalize_features": False,
            "class_weighting": "balanced",
            "local_epochs": args.epochs,
            "batch_size": args.batch_size,
            "fanouts": [int(f) for f in args.fanouts.split(",")],
        },
    }
    context = multiprocessing.get_context("spawn")
    records: dict[str, dict] = {}
    for mode in modes:
        queue = context.Queue()
        process = context.Process(target=run_mode, args=(mode, shared, queue))
        started = time.perf_counter()
        process.start()
        while True:
            try:
                records[mode] = queue.get(timeout=5)
                break
            except queue_module.Empty:  # the child may have died: say so rather than wait forever
                if not process.is_alive():
                    raise SystemExit(
                        f"the {mode} process ended without a result (exit code {process.exitcode})"
                    ) from None
        process.join()
        records[mode]["wall_seconds"] = round(time.perf_counter() - started, 1)
    document = {
        "benchmark": "minibatch_training",
        "command": " ".join(["benchmarks/minibatch_training.py", *sys.argv[1:]]),
        "customers_per_bank": args.customers,
        "bank": args.bank,
        "synth": {"banks": 2, "seed": args.seed, "persons": summary.persons},
        "self_supervision_stand_in": (
            {"pseudo_neighbors": args.pseudo_neighbors, "alpha": ALPHA, "beta": BETA, "threshold": THRESHOLD}
            if args.pseudo_neighbors
            else None
        ),
        "cores": len(os.sched_getaffinity(0)),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "modes": records,
    }
    if {"full", "minibatch"} <= set(records):
        document["minibatch_vs_full"] = compare(records)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    for mode in modes:
        args.output.with_suffix(f".partial.{mode}.json").unlink(missing_ok=True)
    print(json.dumps({k: v for k, v in document.items() if k != "modes"}, indent=2))


if __name__ == "__main__":
    main()
