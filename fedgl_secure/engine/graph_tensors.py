"""A graph prepared for training on a device: features, labels, masks and its normalised Â."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.model.adjacency import fuse_global_pseudo_graph, gcn_normalize, row_normalize_features
from fedgl_secure.model.sparse import SparseOperator


@dataclass(frozen=True)
class GraphTensors:
    """Device tensors of one graph plus the global index of each of its nodes."""

    features: SparseOperator
    labels: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    positions: np.ndarray
    num_global_nodes: int
    base_adjacency: sp.csr_matrix
    num_classes: int
    device: torch.device
    # the training nodes that carry a self-training pseudo label rather than a true one (engine/self_training.py)
    self_trained_mask: torch.Tensor | None = None

    @classmethod
    def from_graph(
        cls,
        graph: GraphDataset,
        positions: np.ndarray,
        num_global_nodes: int,
        device: torch.device,
        normalize_features: bool = True,
    ) -> GraphTensors:
        features = row_normalize_features(graph.features) if normalize_features else graph.features
        return cls(
            features=SparseOperator.from_scipy(features, device),
            labels=torch.as_tensor(graph.labels, dtype=torch.int64, device=device),
            train_mask=torch.as_tensor(graph.train_mask, device=device),
            val_mask=torch.as_tensor(graph.val_mask, device=device),
            test_mask=torch.as_tensor(graph.test_mask, device=device),
            positions=np.asarray(positions, dtype=np.int64),
            num_global_nodes=num_global_nodes,
            base_adjacency=gcn_normalize(graph.adjacency()) if graph.propagation is None else graph.propagation,
            num_classes=graph.num_classes,
            device=device,
        )

    @property
    def num_nodes(self) -> int:
        return int(self.labels.shape[0])

    def adjacency(self, pseudo_graph: PseudoGraph | None, beta: float, renormalize: bool) -> SparseOperator:
        """This graph's Â, fused with its projection of the global pseudo graph (Eq. 9)."""
        if pseudo_graph is None:
            return SparseOperator.from_scipy(self.base_adjacency, self.device)
        fused = fuse_global_pseudo_graph(
            self.base_adjacency,
            pseudo_graph.neighbors.cpu().numpy(),
            pseudo_graph.weights.cpu().numpy(),
            self.positions,
            self.num_global_nodes,
            beta,
            renormalize,
        )
        return SparseOperator.from_scipy(fused, self.device)

    def local_pseudo_labels(self, global_labels: torch.Tensor | None) -> torch.Tensor | None:
        """The global pseudo labels (Eq. 13) at this graph's nodes."""
        if global_labels is None:
            return None
        return global_labels.to(self.device)[torch.as_tensor(self.positions, device=self.device)]


def accuracy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(correct, total) over ``mask``; counts rather than a ratio so callers can pool them."""
    total = int(mask.sum())
    if total == 0:
        return 0, 0
    correct = int((logits[mask].argmax(dim=1) == labels[mask]).sum())
    return correct, total
