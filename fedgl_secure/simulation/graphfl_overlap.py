"""``fedgl-secure reproduce graphfl --parts overlap``: the paper's overlap variant of the non-IID setting.

Each client holds its own subgraph (:func:`graphfl_overlap_clients`): neighbouring clients share a fraction γ of
their nodes and every edge no client holds both ends of is dropped. FL, GraphFL and the central reference run
exactly as in the non-IID experiment (``NON_IID_SCHEDULE``, nothing retuned) on these clients; the global model is
scored on the merged client graph (the graph without the dropped edges) at the same validation and test nodes.
Cells are cached under ``<output>/runs`` keyed by γ and their settings; the table goes to ``graphfl_overlap.md``
and ``graphfl_overlap.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.graphfl_split import graphfl_overlap_clients
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.errors import ConfigError
from fedgl_secure.log import get_logger
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.simulation.graphfl_experiments import (
    METHOD_LABELS,
    NUM_CLIENTS,
    cached_result,
    mean_std,
    merge_sections,
    non_iid_schedule,
    paired_difference,
    protocol_config,
    table_cell,
)

OVERLAP_PART = "overlap"
OVERLAP_METHODS = ("federated", "graphfl", "centralized")  # table order
DEFAULT_OVERLAPS = (0.0, 0.1, 0.3)
# names the division in the cache key: a different division rule must be a new cell
DIVISION = "louvain-rcm-windows"
DIVISION_STATISTICS = ("edges_kept", "clients_without_labels", "mean_client_nodes")


def parse_overlaps(text: str) -> list[float]:
    """``--overlaps``: comma-separated γ, each in [0, 1)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--overlaps: {text!r} is not a list of numbers") from None
    if not values:
        raise ConfigError("--overlaps: give at least one γ")
    for value in values:
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"--overlaps: γ = {value} must be in [0, 1)")
    return values


def division_statistics(dataset: GraphDataset, clients: Sequence[GraphDataset]) -> dict:
    """What the division keeps: the share of the graph's edges some client holds both ends of, the clients without
    a labelled node, and the mean number of nodes per client."""
    kept = set()
    for client in clients:
        src, dst = client.node_ids[client.edge_index[0]], client.node_ids[client.edge_index[1]]
        kept.update(zip(src.tolist(), dst.tolist(), strict=True))
    return {
        "edges_kept": len(kept) / dataset.edge_index.shape[1],
        "clients_without_labels": sum(1 for c in clients if not c.train_mask.any()),
        "mean_client_nodes": float(np.mean([c.num_nodes for c in clients])),
    }


def overlap_cell(
    dataset: GraphDataset, method: str, labels_per_class: int, seed: int, overlap: float, settings: dict
) -> dict:
    """Global test accuracy (at the best validation round) of ``method`` on the overlap clients with γ = ``overlap``,
    with the division's statistics."""
    config = protocol_config(dataset.name, method, seed, settings)
    clients = graphfl_overlap_clients(dataset, NUM_CLIENTS, labels_per_class, seed, overlap)
    result = run_experiment(config, clients=clients, progress=False)
    return {
        "test": result.global_test_accuracy,
        "val": result.best_val_accuracy,
        "best_round": result.best_round,
        **division_statistics(dataset, clients),
    }


def cached_overlap_cell(
    runs: Path, dataset: GraphDataset, method: str, labels_per_class: int, seed: int, overlap: float, overrides: dict
) -> dict:
    """:func:`overlap_cell` under the non-IID schedule (then ``overrides``), cached and keyed by γ, the division and
    the settings."""
    schedule = non_iid_schedule(method)
    key = {
        "experiment": OVERLAP_PART,
        "dataset": dataset.name,
        "seed": seed,
        "variant": method,
        "lpc": labels_per_class,
        "overlap": overlap,
        "division": DIVISION,
        "overrides": overrides,
        "schedule": schedule,
    }
    settings = merge_sections(schedule, overrides)
    return cached_result(runs, key, partial(overlap_cell, dataset, method, labels_per_class, seed, overlap, settings))


def summarise_overlap(cells: dict) -> dict:
    """Per ``dataset/lpc/γ``: every method's mean ± std (test and validation) and per-seed scores, and the paired
    GraphFL − FL difference over the seeds both have (mean, standard error, per seed)."""
    summary: dict = {}
    for key, methods in cells.items():
        row: dict = {}
        for method, results in methods.items():
            row[method] = {
                "ours": mean_std([r["test"] for r in results]),
                "val": mean_std([r["val"] for r in results]),
                "per_seed": [[r["test"], r["val"]] for r in results],
                "seeds": len(results),
            }
        first = next(iter(methods.values()))
        row["division"] = {name: float(np.mean([r[name] for r in first])) for name in DIVISION_STATISTICS}
        if "federated" in methods and "graphfl" in methods:
            row["graphfl_minus_fl"] = paired_difference(methods["federated"], methods["graphfl"])
        summary[key] = row
    return summary


def overlap_markdown(summary: dict, seeds: int) -> str:
    header = " | ".join(METHOD_LABELS[m] for m in OVERLAP_METHODS)
    lines = [
        f"# GraphFL, overlap variant (seeds 0-{seeds - 1}; global test accuracy at the best validation round)",
        "",
        "Mean ± std over seeds; GraphFL − FL paired per seed (mean ± standard error). Edges kept: share of the",
        "graph's edges that some client holds both ends of (the merged graph's); clients without a labelled node.",
        "",
        f"| dataset | labels per class | γ | {header} | GraphFL − FL | edges kept | clients without labels |",
        "|---|---|---|" + "---|" * len(OVERLAP_METHODS) + "---|---|---|",
    ]
    for key, row in summary.items():
        name, lpc, overlap = key.split("/")
        cells = " | ".join(table_cell(row[m]["ours"]) if m in row else "–" for m in OVERLAP_METHODS)
        paired = row.get("graphfl_minus_fl")
        difference = f"{paired['mean']:+.3f} ± {paired['se']:.3f}" if paired else "–"
        division = row["division"]
        lines.append(
            f"| {name} | {lpc} | {overlap} | {cells} | {difference} | {division['edges_kept']:.3f} | "
            f"{division['clients_without_labels']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run_graphfl_overlap(
    datasets: Sequence[str],
    seeds: int,
    output_dir: Path,
    data_root: str | None,
    overrides: dict,
    labels_per_class: Sequence[int],
    overlaps: Sequence[float] = DEFAULT_OVERLAPS,
) -> dict:
    """Every (dataset, labels per class, γ, seed, method) cell; writes graphfl_overlap.md and graphfl_overlap.json."""
    log = get_logger(experiment="reproduce-graphfl-overlap")
    runs = output_dir / "runs"
    jobs = [
        (name, lpc, overlap, seed, method)
        for name in datasets
        for lpc in labels_per_class
        for overlap in overlaps
        for seed in range(seeds)
        for method in OVERLAP_METHODS
    ]
    cells: dict = {}
    loaded: dict[str, GraphDataset] = {}
    for name, lpc, overlap, seed, method in tqdm(jobs, desc="reproduce graphfl overlap", unit="cell"):
        if name not in loaded:
            loaded[name] = load_dataset(name, data_root, seed=0)
        result = cached_overlap_cell(runs, loaded[name], method, lpc, seed, overlap, overrides)
        cells.setdefault(f"{name}/{lpc}/{overlap:g}", {}).setdefault(method, []).append(result)
        log.info("cell.done", dataset=name, lpc=lpc, overlap=overlap, seed=seed, method=method, test=result["test"])
    summary = summarise_overlap(cells)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {"seeds": seeds, "overrides": overrides, "division": DIVISION, "cells": cells, "summary": summary}
    (output_dir / "graphfl_overlap.json").write_text(json.dumps(report, indent=1))
    (output_dir / "graphfl_overlap.md").write_text(overlap_markdown(summary, seeds))
    return summary
