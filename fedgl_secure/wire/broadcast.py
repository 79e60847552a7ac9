"""The broadcast on the wire: W̄, pseudo labels and the pseudo graph as a pickle-free array bundle.

What the aggregator stores per model version and serves to banks, and what a run directory keeps as the
final model. A decoder checks every array against the shapes the reader expects (hostile input).
"""

from __future__ import annotations

import numpy as np
import torch

from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.errors import CiphertextError
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.wire import encodings


def encode_broadcast(broadcast: Broadcast) -> bytes:
    arrays = {"weights": broadcast.weights.detach().cpu().numpy().astype(np.float32)}
    if broadcast.pseudo_labels is not None:
        arrays["pseudo_labels"] = broadcast.pseudo_labels.cpu().numpy().astype(np.int64)
    if broadcast.pseudo_graph is not None:
        arrays["pseudo_graph_neighbors"] = broadcast.pseudo_graph.neighbors.cpu().numpy().astype(np.int64)
        arrays["pseudo_graph_weights"] = broadcast.pseudo_graph.weights.cpu().numpy().astype(np.float32)
    return encodings.encode_arrays(arrays)


def broadcast_bytes_bound(num_parameters: int, num_global_nodes: int, max_neighbors: int) -> int:
    """The most a broadcast of these shapes can expand to: float32 weights, int64 pseudo labels, and an
    M x s pseudo graph (int64 neighbours, float32 weights), plus 1 MiB of archive overhead; never below
    the wire's default cap. (At 3 x 100,000 customers and s = 100 the pseudo graph alone is ~300 MB.)"""
    m = num_global_nodes
    arrays = 4 * num_parameters + 8 * m + 12 * m * max_neighbors
    return max(encodings.DEFAULT_MAX_BODY_BYTES, arrays + 2**20)


def decode_broadcast(
    version: int, data: bytes, num_parameters: int, num_global_nodes: int, max_neighbors: int
) -> Broadcast:
    """A broadcast from its bytes, checked against the shapes this bank expects.

    ``encodings.decode_arrays`` refuses pickles, non-finite values and archives that expand past what
    these shapes can take (:func:`broadcast_bytes_bound`); the shapes are checked here.
    """
    try:
        arrays = encodings.decode_arrays(data, broadcast_bytes_bound(num_parameters, num_global_nodes, max_neighbors))
    except encodings.WireError as error:
        raise CiphertextError(f"model version {version}: {error}") from None
    weights = arrays.get("weights")
    if weights is None or weights.shape != (num_parameters,):
        raise CiphertextError(f"model version {version}: weights missing or not {num_parameters} values")
    labels = arrays.get("pseudo_labels")
    if labels is not None and labels.shape != (num_global_nodes,):
        raise CiphertextError(f"model version {version}: pseudo labels are not {num_global_nodes} values")
    pseudo_graph = None
    if "pseudo_graph_neighbors" in arrays:
        neighbors, edge_weights = arrays["pseudo_graph_neighbors"], arrays.get("pseudo_graph_weights")
        if (
            edge_weights is None
            or neighbors.ndim != 2
            or neighbors.shape[0] != num_global_nodes
            or neighbors.shape[1] > max_neighbors
            or edge_weights.shape != neighbors.shape
            or (neighbors.size and (neighbors.min() < 0 or neighbors.max() >= num_global_nodes))
        ):
            raise CiphertextError(f"model version {version}: malformed pseudo graph")
        pseudo_graph = PseudoGraph(torch.from_numpy(neighbors), torch.from_numpy(edge_weights))
    return Broadcast(
        version,
        torch.from_numpy(weights),
        torch.from_numpy(labels) if labels is not None else None,
        pseudo_graph,
    )
