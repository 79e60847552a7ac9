"""How much of the graph each Louvain client rule cuts: cross-client edges and boundary nodes per rule, M and seed.

``federation.louvain_balance`` turns Louvain communities into M clients (data/partition.py): ``fedsage`` is
FedSage+'s ``louvain_graph_cut``, ``least-loaded`` the framework's first rule. For every rule, M and seed this
reports the undirected edges whose ends sit at different clients (lost to FedAvg), the nodes with at least one
such edge (Fed²GNN's boundary nodes), the client sizes, and, for ``fedsage``, how many nodes the class top-up
moved. With ``--python-louvain`` (python-louvain importable) the ``fedsage`` rule is also run on
python-louvain's ``best_partition(random_state=seed)``, FedSage+'s own library, to see whether the library
decides the result. Writes JSON.

    FEDGL_DATA=/work/shared/datasets python benchmarks/louvain_split.py --dataset cora --clients 5,10,15 --seeds 4 \
        --output docs/results/louvain_split_cora.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.partition import (
    FEDSAGE_DELTA,
    balance_communities,
    cross_client_edges,
    deal_sequentially,
    fedsage_pieces,
    louvain_communities,
    top_up_classes,
)
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.splits import SplitConfig


def cut_of(dataset: GraphDataset, node_sets: list[np.ndarray]) -> dict:
    """Undirected cross-client edges, boundary nodes and client sizes of one partition."""
    cut = cross_client_edges(dataset, node_sets)
    return {
        "cross_edges": int(cut.edges.shape[1] // 2),
        "boundary_nodes": int(np.unique(cut.edges[0]).size),
        "client_sizes": sorted(int(nodes.size) for nodes in node_sets),
    }


def fedsage_steps(communities: list[np.ndarray], labels: np.ndarray, num_nodes: int, num_clients: int) -> tuple:
    """FedSage+'s node sets before and after the class top-up (data/partition.fedsage_balance, step by step)."""
    pieces = fedsage_pieces(communities, num_nodes // num_clients - FEDSAGE_DELTA)
    dealt = deal_sequentially(pieces, num_nodes, num_clients, FEDSAGE_DELTA)
    before = [np.sort(np.concatenate([pieces[i] for i in owned])) for owned in dealt]
    return before, top_up_classes(before, labels)


def modularity(dataset: GraphDataset, communities: list[np.ndarray]) -> float:
    """Newman's modularity of ``communities`` on the undirected graph (networkx)."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(dataset.num_nodes))
    src, dst = dataset.edge_index
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return float(nx.community.modularity(graph, [set(c.tolist()) for c in communities]))


def python_louvain_communities(dataset: GraphDataset, seed: int) -> list[np.ndarray]:
    """python-louvain's ``best_partition`` (FedSage+'s library), as communities."""
    import community as community_louvain  # optional: not a dependency of the framework
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(dataset.num_nodes))
    src, dst = dataset.edge_index
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    groups: dict[int, list[int]] = {}
    for node, label in community_louvain.best_partition(graph, random_state=seed).items():
        groups.setdefault(label, []).append(node)
    return [np.sort(np.array(nodes, dtype=np.int64)) for nodes in groups.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--clients", default="5,10,15")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--python-louvain", action="store_true")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    dataset = load_dataset(args.dataset, args.data_root, seed=0, split=SplitConfig(split="fraction"))
    labels = np.asarray(dataset.labels)
    runs, libraries = [], []
    for seed in range(args.seeds):
        communities = louvain_communities(dataset, seed)
        other = python_louvain_communities(dataset, seed) if args.python_louvain else None
        found = {"networkx": communities} | ({"python-louvain": other} if other is not None else {})
        libraries.extend(
            {"seed": seed, "library": name, "communities": len(found_), "modularity": modularity(dataset, found_)}
            for name, found_ in found.items()
        )
        for num_clients in (int(m) for m in args.clients.split(",")):
            before, after = fedsage_steps(communities, labels, dataset.num_nodes, num_clients)
            rows = {
                "fedsage": {
                    **cut_of(dataset, after),
                    "top_up_moved": int(sum(np.setdiff1d(a, b).size for a, b in zip(before, after, strict=True))),
                },
                "fedsage-before-top-up": cut_of(dataset, before),
                "least-loaded": cut_of(dataset, balance_communities(communities, dataset.num_nodes, num_clients)),
            }
            if other is not None:
                rows["fedsage-python-louvain"] = cut_of(
                    dataset, fedsage_steps(other, labels, dataset.num_nodes, num_clients)[1]
                )
            for rule, row in rows.items():
                runs.append({"rule": rule, "clients": num_clients, "seed": seed, **row})
                print(
                    f"{rule:24s} M={num_clients:2d} seed={seed} "
                    f"cross={row['cross_edges']} boundary={row['boundary_nodes']}"
                )
    summary = {}
    for run in runs:
        cell = summary.setdefault(run["rule"], {}).setdefault(
            str(run["clients"]), {"cross_edges": [], "boundary_nodes": []}
        )
        cell["cross_edges"].append(run["cross_edges"])
        cell["boundary_nodes"].append(run["boundary_nodes"])
    for cells in summary.values():
        for cell in cells.values():
            cell["cross_edges_mean"] = statistics.fmean(cell["cross_edges"])
            cell["boundary_nodes_mean"] = statistics.fmean(cell["boundary_nodes"])
    report = {
        "command": "python benchmarks/louvain_split.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "dataset": args.dataset,
        "nodes": dataset.num_nodes,
        "undirected_edges": int(dataset.edge_index.shape[1] // 2),
        "delta": FEDSAGE_DELTA,
        "summary": summary,
        "communities": libraries,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
