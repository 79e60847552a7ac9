"""Ranking metrics for imbalanced labels: ROC-AUC, PR-AUC (average precision), recall at the top of the scores.

Banks' labels are imbalanced (2-5 % fraud or default), where accuracy says nothing: a model that
calls every customer "good" is 97 % accurate. These metrics judge how the model *ranks* nodes by
the score of the class of interest, which is what an analyst reviewing the top alerts sees.

Conventions shared by every function here:

* ``outputs`` is an N×C array (torch tensor or numpy) of class probabilities, or of logits with
  ``from_logits=True``; ``labels`` holds integer classes, -1 for an unlabelled node; ``mask`` is a
  boolean N-vector. A metric covers the masked nodes that carry a label (unlabelled ones are ignored).
* With a positive class (``positive_class`` given, or class 1 of a two-class problem), a node's
  score is that class's probability. From logits it is the class's log-odds
  ``z_c − logsumexp_{j≠c} z_j = log(p_c / (1 − p_c))``: a strictly increasing function of p_c, so
  every metric equals that of p_c, without the ties that p_c rounding to 1.0 in floating point
  would create among confident nodes.
* Without a positive class and with more than two classes (Cora, the synthetic consortium), each
  metric is the macro one-vs-rest average: the unweighted mean, over the classes present among the
  masked labelled nodes, of the metric with that class as the positive one.
* A metric that is undefined — empty mask, no positive or no negative node, non-finite scores — is
  NaN, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import logsumexp

DEFAULT_TOP_FRACTION = 0.01


@dataclass(frozen=True)
class RankingMetrics:
    """ROC-AUC, PR-AUC (average precision) and recall at the top ``top_fraction`` of the scores; NaN: undefined."""

    roc_auc: float
    pr_auc: float
    recall_at_top: float
    top_fraction: float

    @classmethod
    def undefined(cls, top_fraction: float = DEFAULT_TOP_FRACTION) -> RankingMetrics:
        """All three metrics NaN (nothing to rank, or a single class)."""
        nan = float("nan")
        return cls(nan, nan, nan, top_fraction)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _numpy(values: Any, dtype) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, possibly on the GPU
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


def _check_top_fraction(top_fraction: float) -> None:
    if not 0.0 < top_fraction <= 1.0:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")


def class_scores(outputs: Any, positive_class: int, *, from_logits: bool = False) -> np.ndarray:
    """Every node's score for ``positive_class``: its probability, or from logits its log-odds (module doc).

    ``z_c − logsumexp_{j≠c} z_j`` is computed directly, so it stays finite and distinct where p_c
    itself would round to exactly 1.0.
    """
    values = _numpy(outputs, np.float64)
    if values.ndim != 2:
        raise ValueError(f"outputs must be N×C, got shape {values.shape}")
    if not 0 <= positive_class < values.shape[1]:
        raise ValueError(f"positive_class {positive_class} out of range for {values.shape[1]} classes")
    if not from_logits:
        return values[:, positive_class].copy()
    if values.shape[1] == 1:  # one class: nothing to rank against
        return np.zeros(values.shape[0])
    others = values.copy()
    others[:, positive_class] = -np.inf  # exp(-inf) = 0: the sum runs over j ≠ c
    return values[:, positive_class] - logsumexp(others, axis=1)


def top_count(top_fraction: float, n: int) -> int:
    """k = ceil(top_fraction · n), at least 1 and at most n; the product is rounded to 9 decimals first,
    so that 0.01 · 300 (3.0000000000000004 in floating point) gives 3, not 4."""
    return min(n, max(1, math.ceil(round(top_fraction * n, 9))))


def recall_at_top(scores: Any, is_positive: Any, top_fraction: float = DEFAULT_TOP_FRACTION) -> float:
    """Share of the positives whose score is among the top ``k = ceil(top_fraction · n)`` of the n scores.

    Ties at the cut-off are shared: the nodes scoring strictly above the k-th highest score are all
    in; the ``k − above`` remaining places go to the ``t`` nodes tied at that score, each counting
    ``(k − above) / t`` of a node. That is the expected recall under a uniformly random order of the
    tied nodes, so the result never depends on node order (a constant score gives ``k / n``).
    NaN for no positives or non-finite scores.
    """
    _check_top_fraction(top_fraction)
    scores = _numpy(scores, np.float64).ravel()
    positive = _numpy(is_positive, bool).ravel()
    positives = int(positive.sum())
    if positives == 0 or not np.all(np.isfinite(scores)):
        return float("nan")
    k = top_count(top_fraction, len(scores))
    cutoff = np.sort(scores)[::-1][k - 1]
    above, tied = scores > cutoff, scores == cutoff
    share = (k - int(above.sum())) / int(tied.sum())
    return (int((positive & above).sum()) + share * int((positive & tied).sum())) / positives


def column_ranking_metrics(
    scores: np.ndarray, is_positive: np.ndarray, top_fraction: float = DEFAULT_TOP_FRACTION
) -> list[RankingMetrics]:
    """The metrics of each column of an N×m score matrix against the matching column of ``is_positive``.

    ROC-AUC and average precision come from scikit-learn, one call each for every column that has
    both positives and negatives (its per-call overhead dominates on a few thousand nodes); other
    columns, and all of them when a score is not finite, are NaN.
    """
    # deferred: scikit-learn (with scipy.stats) costs ~1.7 s to import, paid by every bank and aggregator process
    # at start-up although only evaluation reaches this line
    from sklearn.metrics import average_precision_score, roc_auc_score

    _check_top_fraction(top_fraction)
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(is_positive, dtype=bool)
    columns = scores.shape[1]
    if scores.shape[0] == 0 or not np.all(np.isfinite(scores)):
        return [RankingMetrics.undefined(top_fraction)] * columns
    roc, precision = np.full(columns, np.nan), np.full(columns, np.nan)
    defined = np.flatnonzero(positive.any(axis=0) & ~positive.all(axis=0))
    if len(defined) == 1:
        c = defined[0]
        roc[c] = roc_auc_score(positive[:, c], scores[:, c])
        precision[c] = average_precision_score(positive[:, c], scores[:, c])
    elif len(defined) > 1:  # multilabel-indicator form: the same per-column binary metrics, validated once
        indicator = positive[:, defined].astype(np.int64)
        roc[defined] = roc_auc_score(indicator, scores[:, defined], average=None)
        precision[defined] = average_precision_score(indicator, scores[:, defined], average=None)
    both_kinds = set(defined.tolist())
    return [
        RankingMetrics(
            float(roc[c]),
            float(precision[c]),
            recall_at_top(scores[:, c], positive[:, c], top_fraction) if c in both_kinds else float("nan"),
            top_fraction,
        )
        for c in range(columns)
    ]


def binary_ranking_metrics(scores: Any, is_positive: Any, top_fraction: float = DEFAULT_TOP_FRACTION) -> RankingMetrics:
    """ROC-AUC and average precision (scikit-learn) and :func:`recall_at_top` of one score per node.

    NaN when the nodes are not of both kinds (no positive or no negative) or a score is not finite.
    """
    scores = _numpy(scores, np.float64).reshape(-1, 1)
    positive = _numpy(is_positive, bool).reshape(-1, 1)
    return column_ranking_metrics(scores, positive, top_fraction)[0]


def macro_average(per_class: list[RankingMetrics], top_fraction: float) -> RankingMetrics:
    """The unweighted mean of each metric over classes (NaN if any class's is NaN, or none given)."""
    if not per_class:
        return RankingMetrics.undefined(top_fraction)

    def mean(name: str) -> float:
        return float(np.mean([getattr(m, name) for m in per_class]))

    return RankingMetrics(mean("roc_auc"), mean("pr_auc"), mean("recall_at_top"), top_fraction)


def ranking_metrics(
    outputs: Any,
    labels: Any,
    mask: Any,
    positive_class: int | None = None,
    top_fraction: float = DEFAULT_TOP_FRACTION,
    *,
    from_logits: bool = False,
) -> RankingMetrics:
    """ROC-AUC, PR-AUC and recall at the top ``top_fraction`` over the masked labelled nodes (module doc).

    ``positive_class`` None: class 1 of a two-class problem, else the macro one-vs-rest average over
    the classes present among the masked labelled nodes (a single class present: NaN).
    """
    _check_top_fraction(top_fraction)
    values = _numpy(outputs, np.float64)
    labels = _numpy(labels, np.int64).ravel()
    mask = _numpy(mask, bool).ravel()
    if values.ndim != 2 or values.shape[0] != labels.shape[0] or mask.shape != labels.shape:
        raise ValueError(f"outputs {values.shape}, labels {labels.shape} and mask {mask.shape} do not match")
    num_classes = values.shape[1]
    if positive_class is None and num_classes == 2:
        positive_class = 1
    if positive_class is not None and not 0 <= positive_class < num_classes:
        raise ValueError(f"positive_class {positive_class} out of range for {num_classes} classes")
    selected = mask & (labels >= 0)
    values, labels = values[selected], labels[selected]
    if not np.all(np.isfinite(values)):  # a diverged model: undefined, and no arithmetic on inf/NaN
        return RankingMetrics.undefined(top_fraction)
    classes = [positive_class] if positive_class is not None else [int(c) for c in np.unique(labels)]
    if not classes:  # no labelled node in the mask
        return RankingMetrics.undefined(top_fraction)
    scores = np.stack([class_scores(values, c, from_logits=from_logits) for c in classes], axis=1)
    per_class = column_ranking_metrics(
        scores.reshape(len(labels), len(classes)), labels[:, None] == classes, top_fraction
    )
    return per_class[0] if positive_class is not None else macro_average(per_class, top_fraction)
