"""Ranking metrics of a federation from histograms of scores, not from the scores themselves.

In the consortium no party sees another bank's per-customer scores; a bank reports, per model
version, how many of its validation and test customers of each label fall in each score bin
(:func:`score_histogram`). Summed over banks, the histograms give the pooled ROC-AUC, PR-AUC and
recall at the top (:func:`histogram_metrics`) — exactly the metrics of :mod:`fedgl_secure.engine.metrics`
when no two customers of different scores share a bin, and otherwise as if each bin's customers were
tied (the same convention those functions use for tied scores).

Scores are the positive class's log-odds ``log(p / (1 − p))`` (:func:`~fedgl_secure.engine.metrics.class_scores`),
binned in steps of 0.05 over [−15, 15] (600 bins; a probability of 3e-7 or 1 − 3e-7 lands in an end bin):
fine where the ranking of a rare class happens, and a fixed, public layout every bank shares.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedgl_secure.engine.metrics import DEFAULT_TOP_FRACTION, RankingMetrics, class_scores, top_count

LOG_ODDS_RANGE = 15.0
NUM_BINS = 600
EDGES = np.linspace(-LOG_ODDS_RANGE, LOG_ODDS_RANGE, NUM_BINS + 1)


def score_histogram(logits: Any, labels: Any, mask: Any, positive_class: int) -> np.ndarray:
    """``2 × NUM_BINS`` counts of the masked labelled nodes by score bin: row 0 negatives, row 1 positives."""
    scores = class_scores(logits, positive_class, from_logits=True)
    labels = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels).ravel()
    mask = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask, dtype=bool).ravel()
    selected = mask & (labels >= 0)
    bins = np.clip(np.searchsorted(EDGES, scores[selected], side="right") - 1, 0, NUM_BINS - 1)
    positive = labels[selected] == positive_class
    histogram = np.zeros((2, NUM_BINS), dtype=np.int64)
    np.add.at(histogram, (positive.astype(np.int64), bins), 1)
    return histogram


def histogram_metrics(histogram: np.ndarray, top_fraction: float = DEFAULT_TOP_FRACTION) -> RankingMetrics:
    """ROC-AUC, average precision and recall at the top ``top_fraction`` from a (pooled) ``2 × B`` histogram.

    Bins are read from the highest score down; the customers of one bin count as tied: half a pair
    for ROC-AUC, one threshold for average precision, and a shared place at the top-k cut-off.
    NaN when there is no positive or no negative.
    """
    negatives, positives = (np.asarray(row, dtype=np.float64)[::-1] for row in histogram)  # highest score first
    total_neg, total_pos = negatives.sum(), positives.sum()
    if total_neg == 0 or total_pos == 0:
        return RankingMetrics.undefined(top_fraction)
    positives_above = np.cumsum(positives) - positives
    roc_auc = float(np.sum(negatives * (positives_above + 0.5 * positives)) / (total_pos * total_neg))
    true_positives, false_positives = np.cumsum(positives), np.cumsum(negatives)
    occupied = (positives + negatives) > 0
    precision = true_positives[occupied] / (true_positives[occupied] + false_positives[occupied])
    pr_auc = float(np.sum(positives[occupied] / total_pos * precision))
    n = int(total_pos + total_neg)
    k = top_count(top_fraction, n)
    counts = positives + negatives
    before = np.cumsum(counts) - counts
    taken = np.clip(k - before, 0, counts)  # how many of each bin are within the top k
    share = np.divide(taken, counts, out=np.zeros_like(taken), where=counts > 0)
    recall = float(np.sum(share * positives) / total_pos)
    return RankingMetrics(roc_auc, pr_auc, recall, top_fraction)
