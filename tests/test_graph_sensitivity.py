"""Graph sensitivities (privacy/graph_sensitivity.py): the degree bound, and the row counts and sensitivities
checked against a real two-layer GCN (the worst-case trees attain them).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_edge_mechanisms import _assert_simple_graph, random_graph, upper_pairs

from fedgl_secure.privacy.graph_sensitivity import (
    affected_rows,
    bound_degree,
    graph_dp_sgd_noise_multiplier,
    prediction_sensitivity,
    row_release_sensitivity,
    weight_update_sensitivity,
)
from fedgl_secure.privacy.secure_noise import (
    clip_rows,
)

# --- degree bound ------------------------------------------------------------------------------


def test_bound_degree_enforces_the_bound_with_a_subgraph():
    graph = random_graph(300, 0.08, seed=12)
    bounded = bound_degree(graph, 5, np.random.default_rng(13))
    _assert_simple_graph(bounded, 300)
    assert np.asarray(bounded.sum(axis=1)).max() <= 5
    assert upper_pairs(bounded) <= upper_pairs(graph)
    # Greedy projection is maximal: any dropped edge has an endpoint already at the bound.
    degree = np.asarray(bounded.sum(axis=1)).ravel()
    for u, v in upper_pairs(graph) - upper_pairs(bounded):
        assert degree[u] == 5 or degree[v] == 5


def test_bound_degree_is_the_identity_on_graphs_within_the_bound():
    graph = random_graph(300, 0.005, seed=14)
    limit = int(np.asarray(graph.sum(axis=1)).max())
    assert upper_pairs(bound_degree(graph, limit, np.random.default_rng(0))) == upper_pairs(graph)


# --- sensitivities: the row counts against a real two-layer GCN ---------------------------------


def gcn_output(adjacency: np.ndarray, features: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """H = Â tanh(Â X W0) W1 with Â = D̃^-1/2 (A + I) D̃^-1/2 (tanh: no dead units hiding a change)."""
    a = adjacency + np.eye(len(adjacency))
    d = 1 / np.sqrt(a.sum(axis=1))
    a_hat = d[:, None] * a * d[None, :]
    return a_hat @ np.tanh(a_hat @ features @ w0) @ w1


def tree(root_children: int, branching: int, depth: int) -> np.ndarray:
    """Adjacency of a tree: root with ``root_children`` children, every other inner node ``branching`` children."""
    edges, frontier, count = [], [0], 1
    for level in range(depth):
        nxt = []
        for parent in frontier:
            for _ in range(root_children if level == 0 else branching):
                edges.append((parent, count))
                nxt.append(count)
                count += 1
        frontier = nxt
    a = np.zeros((count, count))
    for u, v in edges:
        a[u, v] = a[v, u] = 1
    return a


def changed_rows(before: np.ndarray, after: np.ndarray) -> int:
    return int((np.abs(before - after).max(axis=1) > 1e-12).sum())


@pytest.fixture
def gcn_weights():
    rng = np.random.default_rng(15)
    return rng.normal(size=(4, 5)), rng.normal(size=(5, 3)), rng


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_node_removal_moves_exactly_the_counted_rows_on_the_worst_case_tree(degree, gcn_weights):
    w0, w1, rng = gcn_weights
    a = tree(degree, degree - 1, depth=3)  # every node within 3 hops of the root, all degrees ≤ D
    x = rng.normal(size=(len(a), 4))
    full = gcn_output(a, x, w0, w1)
    without_root = gcn_output(a[1:, 1:], x[1:], w0, w1)
    moved = changed_rows(full[1:], without_root) + 1  # + the removed node's own row
    assert moved == affected_rows(degree, 2, "node") == len(a)


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_feature_change_moves_exactly_the_counted_rows_on_the_worst_case_tree(degree, gcn_weights):
    w0, w1, rng = gcn_weights
    a = tree(degree, degree - 1, depth=2)
    x = rng.normal(size=(len(a), 4))
    changed = x.copy()
    changed[0] += 1.0
    assert changed_rows(gcn_output(a, x, w0, w1), gcn_output(a, changed, w0, w1)) == affected_rows(
        degree, 2, "features"
    )
    assert affected_rows(degree, 2, "features") == 1 + degree**2


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_edge_removal_moves_exactly_the_counted_rows_on_the_worst_case_graph(degree, gcn_weights):
    w0, w1, rng = gcn_weights
    # Two trees (root with D−1 children, then D−1 each, 2 levels) whose roots are joined by the edge.
    half = tree(degree - 1, degree - 1, depth=2)
    m = len(half)
    a = np.zeros((2 * m, 2 * m))
    a[:m, :m] = a[m:, m:] = half
    x = rng.normal(size=(2 * m, 4))
    cut = a.copy()
    a[0, m] = a[m, 0] = 1
    assert changed_rows(gcn_output(a, x, w0, w1), gcn_output(cut, x, w0, w1)) == affected_rows(degree, 2, "edge")
    assert affected_rows(degree, 2, "edge") == 2 * m


@pytest.mark.parametrize("neighbouring", ["node", "features", "edge"])
def test_row_counts_bound_random_bounded_degree_graphs(neighbouring, gcn_weights):
    w0, w1, rng = gcn_weights
    a = bound_degree(random_graph(80, 0.06, seed=16), 4, rng).toarray()
    x = rng.normal(size=(80, 4))
    full = gcn_output(a, x, w0, w1)
    limit = affected_rows(4, 2, neighbouring)
    for v in range(0, 80, 7):
        if neighbouring == "node":
            keep = np.arange(80) != v
            moved = changed_rows(full[keep], gcn_output(a[np.ix_(keep, keep)], x[keep], w0, w1)) + 1
        elif neighbouring == "features":
            changed = x.copy()
            changed[v] = rng.normal(size=4)
            moved = changed_rows(full, gcn_output(a, changed, w0, w1))
        else:
            neighbours = np.flatnonzero(a[v])
            if not neighbours.size:
                continue
            cut = a.copy()
            cut[v, neighbours[0]] = cut[neighbours[0], v] = 0
            moved = changed_rows(full, gcn_output(cut, x, w0, w1))
        assert moved <= limit


def test_sensitivity_formulas():
    assert row_release_sensitivity(0.5, 9) == pytest.approx(3.0)  # 2C√K
    k = affected_rows(3, 2, "node")
    assert prediction_sensitivity(1.0, 3) == pytest.approx(2 * math.sqrt(k))
    assert prediction_sensitivity(2.0, 3, num_layers=1, neighbouring="features") == pytest.approx(4 * math.sqrt(4))
    assert prediction_sensitivity(1.0, 10_000, num_rows=50) == pytest.approx(2 * math.sqrt(50))  # capped at N_k
    assert weight_update_sensitivity(1.5) == 3.0
    assert graph_dp_sgd_noise_multiplier(4.0, 3, 2, "node") == pytest.approx(4.0 / (2 * k - 1))
    assert graph_dp_sgd_noise_multiplier(4.0, 3, 2, "edge") == pytest.approx(4.0 / (2 * affected_rows(3, 2, "edge")))
    assert affected_rows(0, 2, "node") == 1 and affected_rows(1, 2, "edge") == 2
    with pytest.raises(ValueError, match="neighbouring"):
        affected_rows(3, 2, "graph")  # type: ignore[arg-type]


def test_clipped_gcn_rows_respect_the_prediction_sensitivity(gcn_weights):
    w0, w1, rng = gcn_weights
    a = tree(3, 2, depth=3)
    x = rng.normal(size=(len(a), 4)) * 10
    c = 0.3
    full = clip_rows(gcn_output(a, x, w0, w1), c)
    without = clip_rows(gcn_output(a[1:, 1:], x[1:], w0, w1), c)
    # Align rows: the removed node's row becomes zero in the neighbouring release.
    diff = full.copy()
    diff[1:] -= without
    assert np.linalg.norm(diff) <= prediction_sensitivity(c, 3, 2, "node")
