"""The audit's link check: a fixed threshold without the edge unit, the guarantee's own bound under it; a bank's
view of the pseudo graph for the attacks on its own customers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedgl_secure.audit.attack_section import edge_dp_auc_bound, link_grade
from fedgl_secure.audit.attacks import LinkResult, restricted_pseudo_graph
from fedgl_secure.audit.report_model import AMBER, GREEN, RED
from fedgl_secure.engine.pseudo_graph import PseudoGraph


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 1.0, 3.0])
def test_the_bound_is_the_area_under_the_dp_trade_off_curve(epsilon):
    fpr = np.linspace(0.0, 1.0, 200_001)
    tpr = np.minimum(math.exp(epsilon) * fpr, 1.0 - math.exp(-epsilon) * (1.0 - fpr))
    assert edge_dp_auc_bound(epsilon) == pytest.approx(np.trapezoid(tpr, fpr), abs=1e-6)


def test_the_bound_starts_at_chance_and_grows_with_epsilon():
    assert edge_dp_auc_bound(0.0) == 0.5
    assert edge_dp_auc_bound(1.0) == pytest.approx(math.e / (1 + math.e))
    values = [edge_dp_auc_bound(e) for e in (0.1, 0.5, 1, 2, 8)]
    assert values == sorted(values) and values[-1] < 1.0


def link(auc: float, stderr: float = 0.005) -> LinkResult:
    return LinkResult(auc=auc, positives=4000, negatives=4000, attack="pseudo-graph", auc_stderr=stderr)


def test_without_the_edge_unit_a_fixed_threshold_applies():
    assert link_grade(link(0.54), None, "without DP")[0] == GREEN
    status, text = link_grade(link(0.563), None, "with DP")
    assert status == AMBER and "green ≤ 0.55" in text


def test_under_the_edge_unit_the_attack_is_checked_against_the_guarantee():
    # ε = 0.05 per bank, links held by up to 2 banks: 0.1-DP allows AUC 0.525
    status, text = link_grade(link(0.52), (0.05, 2), "with DP")
    assert status == GREEN and "0.5250" in text and "within" in text
    status, text = link_grade(link(0.60), (0.05, 2), "with DP")
    assert status == RED and "does not hold" in text
    # within two standard errors of the bound is not a contradiction
    assert link_grade(link(0.53, stderr=0.004), (0.05, 2), "with DP")[0] == GREEN
    # strict-edge-dp's ε = 8 over 6 banks bounds nothing an attack on Cora reaches
    status, text = link_grade(link(0.563), (8.0, 6), "with DP")
    assert status == GREEN and "48-DP" in text


def test_a_bank_reads_the_pseudo_graph_on_the_pairs_of_its_own_customers():
    # 5 global nodes; the bank holds global 3 and 1 (local 0 and 1)
    neighbors = torch.tensor([[1, 2], [3, 4], [0, 1], [1, 0], [3, 2]])
    weights = torch.tensor([[0.5, 0.5], [0.7, 0.3], [1.0, 0.0], [0.6, 0.4], [0.5, 0.5]])
    restricted = restricted_pseudo_graph(PseudoGraph(neighbors, weights), np.array([3, 1]))
    dense = restricted.to_scipy().toarray()
    # local 0 (global 3) keeps its edge to global 1 (local 1); local 1 (global 1) its edge to global 3
    np.testing.assert_allclose(dense, [[0.0, 0.6], [0.7, 0.0]])
    every = PseudoGraph(neighbors, weights)
    assert restricted_pseudo_graph(every, np.arange(5)) is every
    with pytest.raises(ValueError, match="outside the pseudo graph"):
        restricted_pseudo_graph(every, np.array([5]))
