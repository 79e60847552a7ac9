"""Global and local evaluation goals (DESIGN §4) and early stopping on validation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgl_secure.fedgl.graph_tensors import GraphTensors, accuracy
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.sparse import SparseOperator


@dataclass(frozen=True)
class SplitAccuracy:
    val: float
    test: float


@torch.no_grad()
def evaluate_model(model: GCN, graph: GraphTensors, adjacency: SparseOperator) -> SplitAccuracy:
    """Validation and test accuracy of ``model`` on ``graph`` (eval mode, no dropout)."""
    model.eval()
    logits = model(graph.features, adjacency).logits
    return SplitAccuracy(
        ratio(*accuracy(logits, graph.labels, graph.val_mask)),
        ratio(*accuracy(logits, graph.labels, graph.test_mask)),
    )


def ratio(correct: int, total: int) -> float:
    return correct / total if total else float("nan")


class EarlyStopping:
    """Tracks the best validation round; stops after ``patience`` rounds without improvement.

    Improvement is strict, so ties keep the earlier round (fewer rounds, same validation).
    """

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_val = float("-inf")
        self.best_round = 0

    def update(self, round_number: int, val_accuracy: float) -> bool:
        """Record a round; True when it is the new best."""
        if val_accuracy > self.best_val:
            self.best_val, self.best_round = val_accuracy, round_number
            return True
        return False

    def should_stop(self, round_number: int) -> bool:
        return round_number - self.best_round >= self.patience
