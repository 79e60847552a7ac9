"""Ranking metrics from score histograms (what the consortium pools) against the same metrics from scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedgl_secure.engine.metrics import ranking_metrics
from fedgl_secure.engine.score_histograms import EDGES, NUM_BINS, histogram_metrics, score_histogram
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.services.aggregator_messages import ReportRequest


def _logits_at(log_odds: np.ndarray) -> torch.Tensor:
    """Two-class logits whose class-1 log-odds are exactly ``log_odds``."""
    return torch.tensor(np.stack([np.zeros_like(log_odds), log_odds], axis=1))


def test_distinct_bins_give_exactly_the_metrics_of_the_scores():
    rng = np.random.default_rng(3)
    n = 400
    bins = rng.choice(NUM_BINS, size=n, replace=False)  # one node per bin: no ties anywhere
    log_odds = (EDGES[bins] + EDGES[bins + 1]) / 2
    labels = (rng.random(n) < 0.2 + 0.5 * (bins > NUM_BINS / 2)).astype(np.int64)
    mask = np.ones(n, dtype=bool)
    histogram = score_histogram(_logits_at(log_odds), labels, mask, 1)
    assert histogram.shape == (2, NUM_BINS) and histogram.sum() == n and histogram[1].sum() == labels.sum()
    pooled = histogram_metrics(histogram, 0.05)
    exact = ranking_metrics(_logits_at(log_odds), labels, mask, 1, 0.05, from_logits=True)
    assert pooled.roc_auc == pytest.approx(exact.roc_auc, abs=1e-12)
    assert pooled.pr_auc == pytest.approx(exact.pr_auc, abs=1e-12)
    assert pooled.recall_at_top == pytest.approx(exact.recall_at_top, abs=1e-12)


def test_binned_metrics_stay_close_to_the_exact_ones_on_an_imbalanced_set():
    rng = np.random.default_rng(0)
    n = 5000
    labels = (rng.random(n) < 0.03).astype(np.int64)
    log_odds = rng.normal(-4 + 2 * labels, 1.5)
    mask = rng.random(n) < 0.8
    pooled = histogram_metrics(score_histogram(_logits_at(log_odds), labels, mask, 1))
    exact = ranking_metrics(_logits_at(log_odds), labels, mask, 1, from_logits=True)
    assert abs(pooled.roc_auc - exact.roc_auc) < 0.002
    assert abs(pooled.pr_auc - exact.pr_auc) < 0.02
    assert abs(pooled.recall_at_top - exact.recall_at_top) < 0.02


def test_histograms_of_two_banks_add_up_to_the_histogram_of_their_union():
    rng = np.random.default_rng(1)
    log_odds = rng.normal(0, 5, 300)
    labels = rng.integers(-1, 2, 300)  # unlabelled nodes are left out
    first, second = np.zeros(300, bool), np.zeros(300, bool)
    first[:150], second[150:] = True, True
    both = score_histogram(_logits_at(log_odds), labels, first | second, 1)
    parts = score_histogram(_logits_at(log_odds), labels, first, 1) + score_histogram(
        _logits_at(log_odds), labels, second, 1
    )
    assert np.array_equal(both, parts) and both.sum() == (labels >= 0).sum()
    assert np.isnan(histogram_metrics(np.zeros((2, NUM_BINS), np.int64)).roc_auc)


def test_a_report_with_malformed_histograms_is_refused():
    counts = {"version": 1, "val_correct": 1, "val_total": 2, "test_correct": 1, "test_total": 2}
    with pytest.raises(ProtocolConflict, match="4 x"):
        ReportRequest(**counts, histograms=[[0] * 3] * 4).checked_histograms()
    too_many = np.zeros((4, NUM_BINS), dtype=int)
    too_many[0, 0] = 5
    with pytest.raises(ProtocolConflict, match="more customers"):
        ReportRequest(**counts, histograms=too_many.tolist()).checked_histograms()
    negative = np.zeros((4, NUM_BINS), dtype=int)
    negative[3, 1] = -1
    with pytest.raises(ProtocolConflict, match="non-negative"):
        ReportRequest(**counts, histograms=negative.tolist()).checked_histograms()
    assert ReportRequest(**counts).checked_histograms() is None
