"""Reproduction of Fed²GNN's Table 1 (Cora, GCN and GraphSAGE) and Table 2 (DAGNN): FedAvg, FedAvg-Full, Fed²GNN on
M Louvain clients, and Central, with the backbone ``training.backbone`` (one table per backbone).

Protocol (paper §5.1): random 40/30/30 split of the labelled nodes (``data.split = "fraction"``), M
disjoint Louvain clients (``federation.partition = "louvain"``). FedAvg trains on the clients'
subgraphs (cross-client edges lost), FedAvg-Full on each client's true 2-hop neighbourhood, Fed²GNN on
the reconstructed graphs; Central is one GCN on the whole graph (one client holding every node), the
same for every M. Each run is one JSON file under ``<output>/runs`` (re-used when asked again), so a
reproduction can be stopped and resumed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import MappingProxyType

import numpy as np
from tqdm.auto import tqdm

from fedgl_secure.data.partition import cross_client_edges, louvain_partition
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import ExperimentConfig, build_config
from fedgl_secure.methods.fed2gnn_exchange import upload_values
from fedgl_secure.model.backbones import build_backbone
from fedgl_secure.simulation.reproduce import RunSpec, _run_one

# Fed²GNN paper, Table 1 (GCN, GraphSAGE) and Table 2 (DAGNN, 5 layers) on Cora (accuracy %, mean of 10 seeds), keyed
# by backbone (training.backbone), method and M.
PAPER_TABLE1 = MappingProxyType(
    {
        "gcn": {
            "federated": {5: 86.02, 10: 81.39, 15: 77.88},
            "fedavg-full": {5: 86.49, 10: 82.89, 15: 81.53},
            "fed2gnn": {5: 86.15, 10: 83.30, 15: 82.20},
            "centralized": {0: 87.88},
        },
        "sage": {
            "federated": {5: 84.64, 10: 81.37, 15: 77.62},
            "fedavg-full": {5: 85.19, 10: 83.41, 15: 80.84},
            "fed2gnn": {5: 86.07, 10: 84.22, 15: 80.46},
        },
        "dagnn": {
            "federated": {5: 87.62, 10: 84.04, 15: 81.42},
            "fedavg-full": {5: 87.65, 10: 86.79, 15: 85.20},
            "fed2gnn": {5: 87.41, 10: 86.78, 15: 86.72},
            "centralized": {0: 88.15},
        },
    }
)
TABLE1_METHODS = ("federated", "fedavg-full", "fed2gnn")
LABELS = MappingProxyType(
    {"federated": "FedAvg", "fedavg-full": "FedAvg-Full", "fed2gnn": "Fed²GNN", "centralized": "Central"}
)


def table1_specs(
    dataset: str,
    clients: Sequence[int],
    seeds: int,
    data_root: str | None,
    overrides: dict | None = None,
    backbone: str = "gcn",
) -> list[tuple[int, RunSpec]]:
    """(M, run) for every cell: the three federated methods per M, Central once per seed (M = 0), all training
    ``backbone`` (``training.backbone``; an override of it wins)."""
    specs = []
    for seed in range(seeds):
        for num_clients in [0, *clients]:
            methods = ("centralized",) if num_clients == 0 else TABLE1_METHODS
            for method in methods:
                values: dict = {"dataset": dataset, "method": method, "seed": seed, "data_root": data_root}
                values["data"] = {"split": "fraction"}
                values["training"] = {"backbone": backbone}
                values["federation"] = (
                    {"proportions": [1.0]} if num_clients == 0 else {"partition": "louvain", "num_clients": num_clients}
                )
                for key, value in (overrides or {}).items():
                    values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
                specs.append((num_clients, RunSpec(build_config(values))))
    return specs


def run_table1(
    datasets: Sequence[str],
    clients: Sequence[int],
    seeds: int,
    output_dir: Path,
    data_root: str | None,
    workers: int = 1,
    overrides: dict | None = None,
    backbones: Sequence[str] = ("gcn",),
) -> dict:
    """Run every missing cell, then write ``fed2gnn.json`` and ``fed2gnn.md`` beside the paper's numbers (GCN), and
    ``fed2gnn-<backbone>.json`` / ``.md`` for each other backbone; returns ``{backbone: table}``."""
    runs_dir = output_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    chosen = (overrides or {}).get("training", {}).get("backbone")
    tables = {}
    for backbone in (chosen,) if chosen else backbones:  # --set training.backbone=… names the one table
        specs = [
            spec
            for dataset in datasets
            for spec in table1_specs(dataset, clients, seeds, data_root, overrides, backbone)
        ]
        tables[backbone] = _run_cells(specs, runs_dir, workers)
        for dataset in datasets:
            config = next(spec.config for m, spec in specs if m > 0 and spec.config.dataset == dataset)
            tables[backbone][dataset]["communication"] = communication(dataset, data_root, clients, config)
        stem = "fed2gnn" if backbone == "gcn" else f"fed2gnn-{backbone}"
        (output_dir / f"{stem}.json").write_text(json.dumps(tables[backbone], indent=2))
        (output_dir / f"{stem}.md").write_text(render_markdown(tables[backbone], backbone))
    return tables


def _run_cells(specs: Sequence[tuple[int, RunSpec]], runs_dir: Path, workers: int) -> dict:
    """Run the cells not stored under ``runs_dir`` yet, then :func:`summarize` them all."""
    # a stored run counts when its recorded configuration is the spec's, whatever its file name: the name's hash
    # changes with the serialisation of the config model (e.g. a section added for another method)
    stored = {_canonical(json.loads(path.read_text()).get("config", {})): path for path in runs_dir.glob("*.json")}
    paths = [
        stored.get(_canonical(spec.config.model_dump(mode="json")), runs_dir / f"{spec.key}.json") for _, spec in specs
    ]
    jobs = [
        (spec.config.model_dump(mode="json"), str(path))
        for (_, spec), path in zip(specs, paths, strict=True)
        if not path.exists()
    ]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(tqdm(pool.map(_run_one, jobs), total=len(jobs), desc="fed2gnn table 1", unit="run"))
    else:
        for job in tqdm(jobs, desc="fed2gnn table 1", unit="run"):
            _run_one(job)
    results = [(m, json.loads(path.read_text())) for (m, _), path in zip(specs, paths, strict=True)]
    return summarize(results)


def _canonical(config: dict) -> str | None:
    """A stored run's configuration as today's model reads it (fields added since take their defaults), as a
    key; None when it no longer validates."""
    section = config.get("fed2gnn")
    if isinstance(section, dict) and "edge_correction" not in section:  # recorded before the field: plain edges
        config = {**config, "fed2gnn": {**section, "edge_correction": False}}
    federation = config.get("federation")
    if isinstance(federation, dict) and "louvain_balance" not in federation:  # recorded before the field
        config = {**config, "federation": {**federation, "louvain_balance": "least-loaded"}}
    try:
        dumped = ExperimentConfig.model_validate(config).model_dump(mode="json")
    except ValueError:
        return None
    if dumped["method"] != "fed2gnn":  # the other methods read only the tree depth (FedAvg-Full's halo)
        dumped["fed2gnn"] = {"hops": dumped["fed2gnn"]["hops"]}
    return json.dumps(dumped, sort_keys=True)


def communication(dataset: str, data_root: str | None, clients: Sequence[int], config: ExperimentConfig) -> dict:
    """Values each bank sends, per M (seed 0's partition): Fed²GNN's one-off level sums (8 bytes each, masked
    fixed point) and every method's per-round FedAvg upload (the backbone's parameters and the weight w_k)."""
    dataset_graph = load_dataset(dataset, data_root, seed=0, split=config.data)
    settings = config.fed2gnn
    width = (settings.projection_dim or dataset_graph.num_features) + 1
    model = build_backbone(config.training, dataset_graph.num_features, dataset_graph.num_classes)
    per_round = sum(parameter.numel() for parameter in model.parameters()) + 1
    report = {}
    for num_clients in clients:
        federation = config.federation
        node_sets = louvain_partition(
            dataset_graph, num_clients, 0, federation.louvain_balance, federation.louvain_delta
        )
        cut = cross_client_edges(dataset_graph, node_sets)
        boundary = [int(np.unique(cut.of_client(k)[0]).size) for k in range(num_clients)]
        setup = upload_values(boundary, width, settings.hops)
        report[str(num_clients)] = {
            "boundary_nodes_per_bank": boundary,
            "setup_values_per_bank": setup,
            "setup_megabytes_per_bank_mean": 8 * float(np.mean(setup)) / 1e6,
            "round_values_per_bank": per_round,
        }
    return report


def summarize(results: Sequence[tuple[int, dict]]) -> dict:
    """``{dataset: {method: {M: cell}}}``, each cell the mean ± std test accuracy (%) with the paper's value for the
    runs' backbone (``config.training.backbone``; runs of one table share it)."""
    table: dict = {}
    for num_clients, result in results:
        cell = (
            table.setdefault(result["dataset"], {})
            .setdefault(result["method"], {})
            .setdefault(str(num_clients), {"seeds": [], "accuracy": [], "val_accuracy": [], "rounds": []})
        )
        cell["seeds"].append(result["seed"])
        cell["accuracy"].append(100.0 * result["global_test_accuracy"])
        cell["val_accuracy"].append(100.0 * result["best_val_accuracy"])
        cell["rounds"].append(result["best_round"])
        cell["backbone"] = result.get("config", {}).get("training", {}).get("backbone", "gcn")
    for dataset, methods in table.items():
        for method, cells in methods.items():
            for num_clients, cell in cells.items():
                cell["mean"], cell["std"] = float(np.mean(cell["accuracy"])), float(np.std(cell["accuracy"]))
                paper = PAPER_TABLE1.get(cell["backbone"], {}).get(method, {}) if dataset == "cora" else {}
                cell["paper"] = paper.get(int(num_clients))
    return table


def render_markdown(table: dict, backbone: str = "gcn") -> str:
    title = {"gcn": "Table 1, GCN", "sage": "Table 1, GraphSAGE", "dagnn": "Table 2, DAGNN"}.get(backbone, backbone)
    lines = [f"# Fed²GNN {title} — test accuracy % (mean ± std over seeds; paper in brackets)", ""]
    for dataset, everything in table.items():
        methods = {k: v for k, v in everything.items() if k != "communication"}
        columns = sorted({int(m) for cells in methods.values() for m in cells if int(m) > 0})
        lines += [f"## {dataset}", "", "| method | " + " | ".join(f"M = {m}" for m in columns) + " |"]
        lines.append("|---|" + "---|" * len(columns))
        for method in (*TABLE1_METHODS, "centralized"):
            cells = methods.get(method)
            if cells is None:
                continue
            row = []
            for m in columns:
                cell = cells.get(str(m)) or cells.get("0")
                if cell is None:
                    row.append("–")
                    continue
                paper = f" [{cell['paper']:.2f}]" if cell.get("paper") is not None else ""
                row.append(f"{cell['mean']:.2f} ± {cell['std']:.2f}{paper}")
            lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(row) + " |")
        seeds = sorted({len(c["seeds"]) for cells in methods.values() for c in cells.values()})
        lines += ["", f"Seeds per cell: {', '.join(map(str, seeds))}.", ""]
        comm = everything.get("communication", {})
        if comm:
            lines += [
                "| M | boundary nodes per bank (mean) | Fed²GNN set-up per bank, once (MB, mean) "
                "| FedAvg per round per bank (values) |",
                "|---|---|---|---|",
            ]
            for m, cell in comm.items():
                lines.append(
                    f"| {m} | {np.mean(cell['boundary_nodes_per_bank']):.1f} | "
                    f"{cell['setup_megabytes_per_bank_mean']:.2f} | {cell['round_values_per_bank']} |"
                )
            lines.append("")
    return "\n".join(lines)
