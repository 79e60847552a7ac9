"""Which node order the overlap variant's windows run over (issue 11): the share of the graph's edges that some
client holds both ends of, for the authors' windows (data/graphfl_split.py, ``overlapping_windows``) over three
orders: the node ids of the data files (the authors' code), a random permutation, and ``community_order`` (Louvain
communities in reverse Cuthill-McKee order, the one ``graphfl_overlap_clients`` uses). docs/reproduction.md,
"Non-IID, overlap variant". One JSON line per (dataset, seed, γ):

    FEDGL_DATA=/work/shared/datasets OMP_NUM_THREADS=1 python benchmarks/graphfl_overlap_division.py cora,citeseer 3
"""

import json
import sys

import numpy as np

from fedgl_secure.data.graphfl_split import community_order, overlapping_windows
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.seeding import numpy_stream
from fedgl_secure.simulation.graphfl_experiments import NUM_CLIENTS


def edges_kept(edge_index: np.ndarray, windows: list[np.ndarray], num_nodes: int) -> float:
    """Share of the (directed, both ways stored) edges whose two ends lie in one window."""
    inside = np.zeros(edge_index.shape[1], dtype=bool)
    for window in windows:
        member = np.zeros(num_nodes, dtype=bool)
        member[window] = True
        inside |= member[edge_index[0]] & member[edge_index[1]]
    return float(inside.mean())


names, seeds = sys.argv[1].split(","), int(sys.argv[2])
for name in names:
    dataset = load_dataset(name, None, seed=0)
    n = dataset.num_nodes
    for seed in range(seeds):
        orders = {
            "node-ids": np.arange(n),
            "random": numpy_stream(seed, "benchmark", "random-order").permutation(n),
            "louvain-rcm": community_order(dataset, seed),
        }
        for overlap in (0.0, 0.1, 0.3):
            kept = {
                label: round(edges_kept(dataset.edge_index, overlapping_windows(order, NUM_CLIENTS, overlap), n), 4)
                for label, order in orders.items()
            }
            print(json.dumps({"dataset": name, "seed": seed, "overlap": overlap, **kept}), flush=True)
