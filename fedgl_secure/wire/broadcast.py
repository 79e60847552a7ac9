"""The broadcast on the wire: W̄, pseudo labels and the pseudo graph as a pickle-free array bundle.

What the aggregator stores per model version, and what a run directory keeps as the final model. A bank is
served only **its projection** (:func:`encode_projection`, DESIGN §5.1): W̄, Ȳ at its own union positions, and
Ā's rows of its own nodes with only the neighbours it holds (Eq. 9 uses Ā^(k), rows and columns of client k's
nodes, and nothing else). A decoder checks every array against the shapes the reader expects (hostile input) and
expands a projection back to union-sized arrays with no label and no edge elsewhere.
"""

from __future__ import annotations

import numpy as np
import torch

from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.engine.pseudo_labels import NO_LABEL
from fedgl_secure.errors import CiphertextError
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.wire import encodings


def model_label(version: int) -> str:
    """What a served model version is called in its signature (``crypto/broadcast_signature.py``)."""
    return f"model {version}"


def stage_label(round_number: int, stage: str) -> str:
    """What a served stage broadcast is called in its signature."""
    return f"round {round_number} stage {stage}"


def encode_broadcast(broadcast: Broadcast) -> bytes:
    arrays = {"weights": broadcast.weights.detach().cpu().numpy().astype(np.float32)}
    if broadcast.pseudo_labels is not None:
        arrays["pseudo_labels"] = broadcast.pseudo_labels.cpu().numpy().astype(np.int64)
    if broadcast.pseudo_graph is not None:
        arrays["pseudo_graph_neighbors"] = broadcast.pseudo_graph.neighbors.cpu().numpy().astype(np.int64)
        arrays["pseudo_graph_weights"] = broadcast.pseudo_graph.weights.cpu().numpy().astype(np.float32)
    return encodings.encode_arrays(arrays)


def encode_projection(broadcast: Broadcast, rows: np.ndarray) -> bytes:
    """Bank k's share of ``broadcast``: W̄, Ȳ at its union positions ``rows``, and Ā's rows at ``rows`` keeping the
    neighbours among ``rows`` — every other neighbour becomes a zero-weight placeholder (the next row's index,
    never the row itself: no edge, as in :class:`PseudoGraph`). What Eq. 9 and Eq. 8 need at that bank, no more."""
    if broadcast.pseudo_labels is None and broadcast.pseudo_graph is None:
        return encode_broadcast(broadcast)  # W̄ only: nothing per node to project
    rows = np.asarray(rows, dtype=np.int64)
    arrays = {"weights": broadcast.weights.detach().cpu().numpy().astype(np.float32), "rows": rows}
    if broadcast.pseudo_labels is not None:
        arrays["pseudo_labels"] = broadcast.pseudo_labels.cpu().numpy().astype(np.int64)[rows]
    if broadcast.pseudo_graph is not None:
        neighbors = broadcast.pseudo_graph.neighbors.cpu().numpy().astype(np.int64)
        num_global_nodes = neighbors.shape[0]
        own = np.zeros(num_global_nodes, dtype=bool)
        own[rows] = True
        kept_neighbors, kept_weights = neighbors[rows], broadcast.pseudo_graph.weights.cpu().numpy()[rows]
        foreign = ~own[kept_neighbors]
        placeholder = np.broadcast_to(_placeholders(rows, num_global_nodes)[:, None], kept_neighbors.shape)
        arrays["pseudo_graph_neighbors"] = np.where(foreign, placeholder, kept_neighbors)
        arrays["pseudo_graph_weights"] = np.where(foreign, 0.0, kept_weights).astype(np.float32)
    return encodings.encode_arrays(arrays)


def broadcast_bytes_bound(num_parameters: int, num_global_nodes: int, max_neighbors: int) -> int:
    """The most a broadcast of these shapes can expand to: float32 weights, int64 pseudo labels, and an
    M x s pseudo graph (int64 neighbours, float32 weights), plus 1 MiB of archive overhead; never below
    the wire's default cap. (At 3 x 100,000 customers and s = 100 the pseudo graph alone is ~300 MB.)"""
    m = num_global_nodes
    arrays = 4 * num_parameters + 8 * m + 12 * m * max_neighbors
    return max(encodings.DEFAULT_MAX_BODY_BYTES, arrays + 2**20)


def decode_broadcast(
    version: int,
    data: bytes,
    num_parameters: int,
    num_global_nodes: int,
    max_neighbors: int,
    rows: np.ndarray | None = None,
) -> Broadcast:
    """A broadcast from its bytes, checked against the shapes this bank expects.

    ``encodings.decode_arrays`` refuses pickles, non-finite values and archives that expand past what
    these shapes can take (:func:`broadcast_bytes_bound`); the shapes are checked here. A projection
    (:func:`encode_projection`) must be for exactly ``rows`` (this bank's union positions) and is expanded to
    union-sized arrays: no pseudo label and no edge outside them.
    """
    try:
        arrays = encodings.decode_arrays(data, broadcast_bytes_bound(num_parameters, num_global_nodes, max_neighbors))
    except encodings.WireError as error:
        raise CiphertextError(f"model version {version}: {error}") from None
    if "rows" in arrays:
        arrays = _expanded(version, arrays, num_global_nodes, rows)
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


def _placeholders(rows: np.ndarray, num_global_nodes: int) -> np.ndarray:
    """The neighbour index standing in, at zero weight, for each of ``rows``' hidden neighbours: the next row,
    never the row itself (a zero weight is no edge, :class:`PseudoGraph`)."""
    return (rows + 1) % max(num_global_nodes, 1)


def _expanded(version: int, arrays: dict[str, np.ndarray], num_global_nodes: int, rows: np.ndarray | None) -> dict:
    """A projection's arrays at union size: its rows where they belong, no label and zero-weight placeholders
    (never the row itself) elsewhere. Refused unless it is a projection onto exactly ``rows``."""
    sent = arrays["rows"]
    if rows is None or sent.shape != np.shape(rows) or not np.array_equal(sent, rows):
        raise CiphertextError(f"model version {version}: a projection onto other union positions than this bank's")
    expanded = {"weights": arrays.get("weights")}
    labels = arrays.get("pseudo_labels")
    if labels is not None:
        if labels.shape != sent.shape:
            raise CiphertextError(f"model version {version}: projected pseudo labels are not {sent.size} values")
        expanded["pseudo_labels"] = np.full(num_global_nodes, NO_LABEL, dtype=np.int64)
        expanded["pseudo_labels"][sent] = labels
    neighbors, weights = arrays.get("pseudo_graph_neighbors"), arrays.get("pseudo_graph_weights")
    if neighbors is not None:
        shaped = neighbors.ndim == 2 and neighbors.shape[0] == sent.size
        if weights is None or not shaped or weights.shape != neighbors.shape:
            raise CiphertextError(f"model version {version}: malformed projected pseudo graph")
        width = neighbors.shape[1]
        placeholder = _placeholders(np.arange(num_global_nodes, dtype=np.int64), num_global_nodes)
        full_neighbors = np.repeat(placeholder[:, None], width, axis=1)
        full_weights = np.zeros((num_global_nodes, width), dtype=np.float32)
        full_neighbors[sent], full_weights[sent] = neighbors, weights
        expanded["pseudo_graph_neighbors"], expanded["pseudo_graph_weights"] = full_neighbors, full_weights
    return expanded
