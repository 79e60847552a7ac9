"""Global and local evaluation goals (DESIGN §4) and early stopping on validation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgl_secure.engine.config import EvaluationConfig
from fedgl_secure.engine.graph_tensors import GraphTensors, accuracy
from fedgl_secure.engine.metrics import RankingMetrics, ranking_metrics
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.sparse import SparseOperator


@dataclass(frozen=True)
class SplitAccuracy:
    """Validation and test accuracy, and the ranking metrics for imbalanced labels of the same predictions."""

    val: float
    test: float
    val_ranking: RankingMetrics | None  # None: not asked for (``val_ranking=False``)
    test_ranking: RankingMetrics


@torch.no_grad()
def evaluate_model(
    model: GCN,
    graph: GraphTensors,
    adjacency: SparseOperator,
    evaluation: EvaluationConfig | None = None,
    *,
    val_ranking: bool = True,
) -> SplitAccuracy:
    """Validation and test accuracy of ``model`` on ``graph`` (eval mode, no dropout), and ROC-AUC, PR-AUC
    and recall at the top (``evaluation``'s positive class and top fraction) from the same logits.

    ``val_ranking=False`` skips the validation ranking metrics where nobody reads them (each client's
    local goal): scikit-learn's per-call overhead makes them the dearest part of an evaluation.
    """
    evaluation = evaluation or EvaluationConfig()
    model.eval()
    logits = model(graph.features, adjacency).logits
    return SplitAccuracy(
        ratio(*accuracy(logits, graph.labels, graph.val_mask)),
        ratio(*accuracy(logits, graph.labels, graph.test_mask)),
        split_ranking(logits, graph.labels, graph.val_mask, evaluation) if val_ranking else None,
        split_ranking(logits, graph.labels, graph.test_mask, evaluation),
    )


def split_ranking(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, evaluation: EvaluationConfig
) -> RankingMetrics:
    """:func:`~fedgl_secure.engine.metrics.ranking_metrics` of ``logits`` over ``mask`` under ``evaluation``."""
    return ranking_metrics(logits, labels, mask, evaluation.positive_class, evaluation.top_fraction, from_logits=True)


def selection_value(scores: SplitAccuracy, selection: str) -> float:
    """The validation figure that picks the best round (``evaluation.selection``): accuracy, or the ranked
    class's average precision (NaN, which never counts as an improvement, when it is undefined)."""
    return scores.val if selection == "accuracy" else scores.val_ranking.pr_auc


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
