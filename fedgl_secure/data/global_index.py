"""The global node index: the union of all clients' nodes (size M, not the sum of N_k)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.model.adjacency import gcn_normalize


@dataclass(frozen=True)
class GlobalIndex:
    """Sorted union of node identifiers; position in it is a node's global index."""

    node_ids: np.ndarray

    @classmethod
    def from_id_sets(cls, id_sets: Sequence[np.ndarray]) -> GlobalIndex:
        return cls(np.unique(np.concatenate([np.asarray(ids) for ids in id_sets])))

    @property
    def size(self) -> int:
        return int(self.node_ids.shape[0])

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Global index of each id; every id must be in the index."""
        ids = np.asarray(ids)
        pos = np.searchsorted(self.node_ids, ids)
        if ids.size and (np.any(pos >= self.size) or np.any(self.node_ids[np.minimum(pos, self.size - 1)] != ids)):
            raise KeyError("some node ids are not in the global index")
        return pos.astype(np.int64)


def merge_client_graphs(clients: Sequence[GraphDataset], index: GlobalIndex) -> GraphDataset:
    """The merged client graph: union of the clients' nodes and of their (induced) edges.

    Features, labels and split membership of a node are the same at every client that holds
    it, so the first holder's copy is taken.
    """
    m = index.size
    first = clients[0]
    labels = np.full(m, -1, dtype=np.int64)
    masks = {name: np.zeros(m, dtype=bool) for name in ("train", "val", "test")}
    feature_rows: list[sp.csr_matrix] = []
    row_positions: list[np.ndarray] = []
    rows, cols = [], []
    for client in clients:
        pos = index.positions(client.node_ids)
        labels[pos] = client.labels
        masks["train"][pos] |= client.train_mask
        masks["val"][pos] |= client.val_mask
        masks["test"][pos] |= client.test_mask
        feature_rows.append(client.features)
        row_positions.append(pos)
        rows.append(pos[client.edge_index[0]])
        cols.append(pos[client.edge_index[1]])
    stacked = sp.vstack(feature_rows).tocsr()
    all_pos = np.concatenate(row_positions)
    _, first_occurrence = np.unique(all_pos, return_index=True)
    features = stacked[first_occurrence].tocsr()
    propagation = _merged_propagation(clients, row_positions, m)
    return GraphDataset(
        name=f"{first.name.split('/')[0]}/merged",
        features=features,
        labels=labels,
        edge_index=canonical_edge_index(np.concatenate(rows), np.concatenate(cols), m),
        train_mask=masks["train"],
        val_mask=masks["val"],
        test_mask=masks["test"],
        num_classes=first.num_classes,
        node_ids=index.node_ids,
        propagation=propagation,
    )


def _merged_propagation(
    clients: Sequence[GraphDataset], positions: list[np.ndarray], size: int
) -> sp.csr_matrix | None:
    """The merged graph's GCN operator when a client brings its own (``GraphDataset.propagation``): each
    client's operator (or its ``Â``) placed at its nodes' positions — the operator of the union, as the
    clients are then disjoint (Fed²GNN's); None when every client uses the plain ``Â`` of its edges."""
    if all(client.propagation is None for client in clients):
        return None
    all_positions = np.concatenate(positions)
    if np.unique(all_positions).size != all_positions.size:
        raise ValueError("clients with their own GCN operator (propagation) must hold disjoint nodes")
    rows, cols, values = [], [], []
    for client, pos in zip(clients, positions, strict=True):
        operator = client.propagation if client.propagation is not None else gcn_normalize(client.adjacency())
        coo = sp.coo_matrix(operator)
        rows.append(pos[coo.row])
        cols.append(pos[coo.col])
        values.append(coo.data)
    return sp.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size))
