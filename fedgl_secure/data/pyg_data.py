"""The project's graph as a PyG :class:`~torch_geometric.data.Data`, and back.

A benchmark loader or a bank's tables give a :class:`~fedgl_secure.data.graph.GraphDataset`; a data team that
works in PyG takes it as ``Data`` (``graph.to_pyg()``), and brings a ``Data`` of its own in
(``GraphDataset.from_pyg(data)``). The fields map one to one:

====================  ===============================================================
``GraphDataset``      ``Data``
====================  ===============================================================
features (CSR)        ``x``: dense ``N × F`` float32 (PyG's layers project dense x)
labels                ``y``: ``N`` int64, ``-1`` for a node without a label
edge_index            ``edge_index``: ``2 × E`` int64, both directions, no self-loops
train/val/test_mask   ``train_mask`` / ``val_mask`` / ``test_mask``: ``N`` bool
num_classes, name     ``num_classes``, ``name``
node_ids              ``node_ids``: the numpy array as it is (customer keys may be strings)
====================  ===============================================================

Coming in, the graph is made what the project's type promises: undirected, without self-loops or duplicate
edges (:func:`~fedgl_secure.data.graph.canonical_edge_index`); a ``Data`` without masks gets empty ones (no
split yet: ``data.split = "random"`` draws one).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch_geometric.data import Data

from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.errors import DatasetError

_MASKS = ("train_mask", "val_mask", "test_mask")


def to_pyg(graph: GraphDataset) -> Data:
    """``graph`` as a PyG ``Data`` (module docstring)."""
    if graph.propagation is not None:
        raise DatasetError(
            f"{graph.name}: this graph carries its own propagation operator (Fed²GNN's grafted trees), which a "
            "PyG edge list does not hold; export the graph before the method rebuilds it"
        )
    return Data(
        x=torch.as_tensor(graph.features.toarray(), dtype=torch.float32),
        y=torch.as_tensor(graph.labels, dtype=torch.int64),
        edge_index=torch.as_tensor(graph.edge_index, dtype=torch.int64),
        **{mask: torch.as_tensor(getattr(graph, mask), dtype=torch.bool) for mask in _MASKS},
        num_classes=graph.num_classes,
        name=graph.name,
        node_ids=graph.node_ids,
    )


def from_pyg(data: Data, name: str | None = None) -> GraphDataset:
    """A ``Data`` for node classification as a :class:`GraphDataset` (module docstring).

    Raises:
        DatasetError: no features, labels that are not one class id per node, edges outside the nodes, masks of
            another length, overlapping masks, or a split mask holding unlabelled nodes.
    """
    name = name or getattr(data, "name", None) or "pyg"
    if getattr(data, "x", None) is None:
        raise DatasetError(f"{name}: the PyG Data has no node features (data.x)")
    features = data.x.to_dense() if data.x.is_sparse else data.x
    if features.ndim != 2:
        raise DatasetError(f"{name}: data.x must be N x F, got shape {tuple(features.shape)}")
    num_nodes = int(features.shape[0])
    labels = _labels(data, name, num_nodes)
    edges = data.edge_index.cpu().numpy() if data.edge_index is not None else np.empty((2, 0), dtype=np.int64)
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise DatasetError(f"{name}: data.edge_index refers to nodes outside 0..{num_nodes - 1}")
    masks = {mask: _mask(data, mask, name, num_nodes) for mask in _MASKS}
    for mask, values in masks.items():
        if bool((labels[values] < 0).any()):
            raise DatasetError(f"{name}: data.{mask} holds nodes without a label (y < 0)")
    if bool((np.sum(list(masks.values()), axis=0) > 1).any()):
        raise DatasetError(f"{name}: data.train_mask, val_mask and test_mask overlap; a node belongs to one split")
    declared_classes = getattr(data, "num_classes", None)
    node_ids = getattr(data, "node_ids", None)
    return GraphDataset(
        name=name,
        features=sp.csr_matrix(features.detach().cpu().numpy().astype(np.float32)),
        labels=labels,
        edge_index=canonical_edge_index(edges[0], edges[1], num_nodes),
        **masks,
        num_classes=int(declared_classes) if declared_classes is not None else int(labels.max(initial=-1)) + 1,
        node_ids=np.asarray(node_ids) if node_ids is not None else np.arange(num_nodes, dtype=np.int64),
    )


def _labels(data: Data, name: str, num_nodes: int) -> np.ndarray:
    y = getattr(data, "y", None)
    if y is None or y.ndim != 1 or y.shape[0] != num_nodes or y.is_floating_point():
        shape = None if y is None else tuple(y.shape)
        raise DatasetError(f"{name}: data.y must hold one integer class id per node ({num_nodes}), got {shape}")
    return y.cpu().numpy().astype(np.int64)


def _mask(data: Data, mask: str, name: str, num_nodes: int) -> np.ndarray:
    values = getattr(data, mask, None)
    if values is None:
        return np.zeros(num_nodes, dtype=bool)
    if values.dtype != torch.bool or values.shape != (num_nodes,):
        raise DatasetError(f"{name}: data.{mask} must be a bool vector of {num_nodes} entries")
    return values.cpu().numpy()
