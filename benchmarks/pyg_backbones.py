"""The engine's own sparse operator against PyG's message passing, for every backbone, side by side in one process.

    FEDGL_DATA=../shared/datasets python benchmarks/pyg_backbones.py --output docs/results/pyg_backbones.json

For each backbone (GCN, GraphSAGE, SGC, DAGNN) the engine's model over its :class:`SparseOperator` and its PyG
counterpart (:mod:`fedgl_secure.model.pyg_backbones`, behind :class:`PyGBackbone`, the path of any declared PyG
model) are timed on the same graph, the same Â and the same full-batch step the trainer takes (forward, Eq. 8's
cross-entropy on the training nodes, backward, Adam), alternating engine and PyG ``--repeats`` times after a
warm-up of each, on ``--threads`` torch threads (1: a bank on a shared host); the medians of the CPU seconds are
compared (``ratio_pyg_over_engine`` > 1 means PyG is slower), as they do not count the time other work on a shared
host held the cores; the wall seconds are kept beside them. Also timed:

* ``propagation``: the kernel alone, ``Â H`` with ``H`` ``N × 16``, forward and backward — the engine's CSR
  product with its cached transpose against PyG's ``SimpleConv`` scatter over the edge weights;
* ``to_edges``: what the adapter pays once per operator (each FedGL round fuses a new Â'): the edge list and the
  dense features, against E = 10 epochs of a round.

For the GCN the PyG model with ``F.dropout`` on its dense input (the PyG GCN up to 8d1270b) is timed in the same
rotation: ``ratio_dense_over_stored_input_dropout`` is what dropping only the stored entries saves.

Graphs: Cora (``--data-root`` / ``FEDGL_DATA``; skipped with a note when absent) and the synthetic bank graph at
``--nodes`` nodes (100 000 by default, average degree 10: 500 000 undirected edges, 100 sparse features).

``--accuracy-seeds K`` adds Cora's accuracy with ``training.backbone = "gcn"`` and with the PyG GCN, seeds 0..K−1,
by ``--accuracy-method`` (``centralized`` by default: one model on the merged client graph, Table 2's first
column; ``fedgl`` costs ~30 s a round on a shared 2-core host): the test accuracy at the best validation round,
the mean and spread of each, and whether PyG's mean lies within the engine's seed range (the two draw different
dropout masks, so equality is not expected; ``--max-rounds`` caps the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_geometric
from torch_geometric.nn import SimpleConv

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import DatasetError
from fedgl_secure.model import pyg_backbones
from fedgl_secure.model.adjacency import gcn_normalize, row_normalize_features
from fedgl_secure.model.dagnn import DAGNN
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.pyg_adapter import PyGBackbone, operator_edges
from fedgl_secure.model.sage import GraphSAGE
from fedgl_secure.model.sgc import SGC
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.simulation.experiment import run_experiment

HIDDEN = 16
PYG_GCN = "fedgl_secure.model.pyg_backbones:GCN"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000, help="nodes of the synthetic bank graph")
    parser.add_argument("--degree", type=float, default=10.0, help="its average undirected degree")
    parser.add_argument("--repeats", type=int, default=7, help="timed steps of each, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a bank on a shared host runs one)")
    parser.add_argument("--data-root", default=None, help="datasets (default $FEDGL_DATA)")
    parser.add_argument("--accuracy-seeds", type=int, default=0, help="Cora accuracy with both GCNs, seeds 0..K-1")
    parser.add_argument("--accuracy-method", default="centralized", help="the method of that comparison")
    parser.add_argument("--max-rounds", type=int, default=300, help="its round cap (early stopping as usual)")
    parser.add_argument("--output", type=Path, default=Path("docs/results/pyg_backbones.json"))
    return parser.parse_args(argv)


class DenseInputDropoutGCN(pyg_backbones.GCN):
    """The PyG GCN as it was up to 8d1270b, the baseline of its input dropout: ``F.dropout`` (``nn.Dropout``) on the
    dense features, N·F draws a step, where :class:`~fedgl_secure.model.pyg_backbones.StoredEntryDropout` draws one
    per stored entry."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__(num_features, hidden, num_classes, dropout)
        self.input_dropout = torch.nn.Dropout(dropout)


def pairs(num_features: int, num_classes: int) -> dict[str, tuple[Callable, Callable]]:
    """Each backbone as (engine model, PyG model behind the adapter), the same widths and dropout."""
    return {
        "gcn": (lambda: GCN(num_features, HIDDEN, num_classes, 0.5), lambda: pyg_backbones.GCN),
        "sage": (lambda: GraphSAGE(num_features, HIDDEN, num_classes, 0.5), lambda: pyg_backbones.GraphSAGE),
        "sgc": (lambda: SGC(num_features, num_classes, 2, 0.0), lambda: pyg_backbones.SGC),
        "dagnn": (lambda: DAGNN(num_features, HIDDEN, num_classes, 5, 0.5), lambda: pyg_backbones.DAGNN),
    }


def interleaved(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, dict[str, float]]:
    """Median CPU and wall seconds of each callable, after one warm-up call of each, called in turn ``repeats``
    times."""
    for run in runs.values():
        run()
    samples: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": []} for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            cpu, wall = time.process_time(), time.perf_counter()
            run()
            samples[name]["cpu"].append(time.process_time() - cpu)
            samples[name]["wall"].append(time.perf_counter() - wall)
    return {
        name: {clock: statistics.median(values) for clock, values in clocks.items()} for name, clocks in samples.items()
    }


def comparison(seconds: dict[str, dict[str, float]]) -> dict[str, float]:
    """The engine's and PyG's CPU seconds, their ratio, and the wall seconds beside them."""
    return {
        "engine_cpu_seconds": seconds["engine"]["cpu"],
        "pyg_cpu_seconds": seconds["pyg"]["cpu"],
        "ratio_pyg_over_engine": seconds["pyg"]["cpu"] / seconds["engine"]["cpu"],
        "engine_wall_seconds": seconds["engine"]["wall"],
        "pyg_wall_seconds": seconds["pyg"]["wall"],
    }


def training_step(model: torch.nn.Module, features, adjacency, labels, train_mask) -> Callable[[], None]:
    """One full-batch step as the trainer takes it (forward, cross-entropy, backward, Adam)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(features, adjacency, generator).logits
        F.cross_entropy(logits[train_mask], labels[train_mask]).backward()
        optimizer.step()

    return step


def time_graph(graph: GraphDataset, repeats: int) -> dict:
    features = SparseOperator.from_scipy(row_normalize_features(graph.features))
    adjacency = SparseOperator.from_scipy(gcn_normalize(graph.adjacency()))
    labels = torch.as_tensor(graph.labels)
    train_mask = torch.as_tensor(graph.train_mask)
    result: dict = {
        "nodes": graph.num_nodes,
        "undirected_edges": graph.num_undirected_edges,
        "features": graph.num_features,
        "operator_entries": int(adjacency.values.numel()),
    }
    epochs = {}
    for name, (engine, pyg) in pairs(graph.num_features, graph.num_classes).items():
        models = {"engine": engine(), "pyg": PyGBackbone(pyg()(graph.num_features, HIDDEN, graph.num_classes, 0.5))}
        if name == "gcn":
            models["dense"] = PyGBackbone(DenseInputDropoutGCN(graph.num_features, HIDDEN, graph.num_classes, 0.5))
        for model in models.values():
            model.reset_parameters(torch.Generator().manual_seed(0))
        steps = {key: training_step(model, features, adjacency, labels, train_mask) for key, model in models.items()}
        seconds = interleaved(steps, repeats)
        epochs[name] = {**comparison(seconds), "parameters": int(models["engine"].flat_parameters().numel())}
        if "dense" in seconds:
            epochs[name]["pyg_dense_input_dropout_cpu_seconds"] = seconds["dense"]["cpu"]
            epochs[name]["ratio_pyg_dense_input_dropout_over_engine"] = (
                seconds["dense"]["cpu"] / seconds["engine"]["cpu"]
            )
            epochs[name]["ratio_dense_over_stored_input_dropout"] = seconds["dense"]["cpu"] / seconds["pyg"]["cpu"]
        print(f"  {name}: PyG / engine {epochs[name]['ratio_pyg_over_engine']:.2f} (CPU seconds)", flush=True)
    result["epoch"] = epochs
    result["load_average_1min_after_epochs"] = os.getloadavg()[0]
    result["propagation"] = time_propagation(adjacency, repeats)
    result["to_edges"] = time_conversion(features, adjacency, epochs["gcn"]["engine_cpu_seconds"], repeats)
    return result


def time_propagation(adjacency: SparseOperator, repeats: int) -> dict:
    """``Â H`` forward and backward, H ``N × 16``: the CSR product against PyG's weighted scatter."""
    hidden = torch.rand(adjacency.shape[0], HIDDEN, generator=torch.Generator().manual_seed(0), requires_grad=True)
    edge_index, edge_weight = operator_edges(adjacency)
    conv = SimpleConv(aggr="sum")

    def engine() -> None:
        (adjacency @ hidden).sum().backward()

    def pyg() -> None:
        conv(hidden, edge_index, edge_weight).sum().backward()

    return comparison(interleaved({"engine": engine, "pyg": pyg}, repeats))


def time_conversion(features: SparseOperator, adjacency: SparseOperator, engine_epoch: float, repeats: int) -> dict:
    """The adapter's once-per-operator cost (edge list and dense features) against a round of E = 10 engine
    GCN epochs."""
    seconds = interleaved({"convert": lambda: (operator_edges(adjacency), features.to_dense())}, repeats)["convert"]
    return {"cpu_seconds": seconds["cpu"], "share_of_a_round_of_10_epochs": seconds["cpu"] / (10 * engine_epoch)}


def cora_accuracy(data_root: str | None, method: str, seeds: int, max_rounds: int) -> dict:
    """``method`` on Cora with the engine's GCN and with PyG's, seeds 0..seeds−1."""
    dataset = load_dataset("cora", data_root)
    runs: dict[str, list[float]] = {}
    for backbone in ("gcn", PYG_GCN):
        runs[backbone] = []
        for seed in range(seeds):
            config = build_config(
                {
                    "dataset": "cora",
                    "method": method,
                    "seed": seed,
                    "device": "cpu",
                    "federation": {"max_rounds": max_rounds},
                    "training": {"backbone": backbone},
                }
            )
            result = run_experiment(config, dataset, progress=False)
            runs[backbone].append(result.global_test_accuracy)
            print(f"  {method} cora {backbone} seed {seed}: {result.global_test_accuracy:.4f}", flush=True)
    engine, pyg = runs["gcn"], runs[PYG_GCN]
    return {
        "method": method,
        "seeds": list(range(seeds)),
        "max_rounds": max_rounds,
        "engine_gcn": {"test_accuracy": engine, "mean": statistics.mean(engine), "std": statistics.pstdev(engine)},
        "pyg_gcn": {"test_accuracy": pyg, "mean": statistics.mean(pyg), "std": statistics.pstdev(pyg)},
        "pyg_mean_within_engine_seed_range": min(engine) <= statistics.mean(pyg) <= max(engine),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict = {
        "command": "benchmarks/pyg_backbones.py",
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "repeats": args.repeats,
        # CPU seconds on one thread are the measure: the wall clock of a shared host (its load average here) counts
        # the time other work held the cores
        "load_average_1min_at_start": os.getloadavg()[0],
        "graphs": {},
    }
    try:
        cora = load_dataset("cora", args.data_root)
    except DatasetError as error:
        print(f"Cora skipped: {error}")
        report["graphs"]["cora"] = {"skipped": str(error)}
    else:
        print("cora", flush=True)
        report["graphs"]["cora"] = time_graph(cora, args.repeats)
    print(f"synthetic, {args.nodes} nodes", flush=True)
    bank = synthetic_consortium(seed=0, num_nodes=args.nodes, average_degree=args.degree)
    report["graphs"][f"synthetic_{args.nodes}"] = time_graph(bank, args.repeats)
    if args.accuracy_seeds:
        report["cora_accuracy"] = cora_accuracy(
            args.data_root, args.accuracy_method, args.accuracy_seeds, args.max_rounds
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
