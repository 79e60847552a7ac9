"""Edge mechanisms (privacy/edge_mechanisms.py): randomised response on every node pair.

Statistical tests use a fixed byte source (``np.random.default_rng(seed).bytes``) so they are
deterministic; each tolerance is stated where it is used.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from fedgl_secure.privacy.edge_mechanisms import flip_probability, randomized_response_edges


def random_graph(n: int, p: float, seed: int) -> sp.csr_matrix:
    """About p·n²/2 random undirected edges, no self loops (sp.random is far too slow at n = 30 000)."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, size=(2, int(p * n * n / 2)))
    i, j = i[i != j], j[i != j]
    pattern = sp.csr_matrix((np.ones(2 * i.size), (np.r_[i, j], np.r_[j, i])), shape=(n, n))
    pattern.data[:] = 1.0  # duplicates were summed
    return pattern


def upper_pairs(adjacency: sp.spmatrix) -> set[tuple[int, int]]:
    upper = sp.triu(adjacency, k=1).tocoo()
    return set(zip(upper.row.tolist(), upper.col.tolist(), strict=True))


# --- randomised response -----------------------------------------------------------------------


def _assert_simple_graph(adjacency: sp.csr_matrix, n: int) -> None:
    assert adjacency.shape == (n, n)
    assert (adjacency != adjacency.T).nnz == 0
    assert not adjacency.diagonal().any()
    assert set(np.unique(adjacency.data)) <= {1.0}


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_randomized_response_flips_each_pair_at_the_right_rate(epsilon):
    n = 400
    graph = random_graph(n, 0.02, seed=4)
    released = randomized_response_edges(graph, epsilon, _random_bytes=np.random.default_rng(5).bytes)
    _assert_simple_graph(released, n)
    p = flip_probability(epsilon)
    before, after = upper_pairs(graph), upper_pairs(released)
    non_edges = n * (n - 1) // 2 - len(before)
    removed, added = len(before - after), len(after - before)
    # removed ~ Bin(E, p), added ~ Bin(#non-edges, p): each within 5 standard deviations of its mean.
    assert abs(removed - len(before) * p) <= 5 * math.sqrt(len(before) * p * (1 - p))
    assert abs(added - non_edges * p) <= 5 * math.sqrt(non_edges * p * (1 - p))


def test_randomized_response_treats_every_pair_alike():
    # Tiny graph, many runs: each of the 15 pairs must flip with probability p, whether it was an edge
    # or not and wherever it sits in the triangle (this checks the rank-to-pair mapping).
    n, runs, epsilon = 6, 800, 1.0
    graph = sp.csr_matrix(np.array([[0, 1, 1, 0, 0, 0]] + [[0] * 6] * 5, dtype=float))
    graph = ((graph + graph.T) != 0).astype(float)
    rng = np.random.default_rng(6)
    original = graph.toarray()
    flips = np.zeros((n, n))
    for _ in range(runs):
        flips += randomized_response_edges(graph, epsilon, _random_bytes=rng.bytes).toarray() != original
    p = flip_probability(epsilon)
    rates = flips[np.triu_indices(n, 1)] / runs
    # Each rate ~ Bin(runs, p)/runs: within 5 standard deviations (≈ ±0.078 here) of p = 0.269.
    assert np.all(np.abs(rates - p) <= 5 * math.sqrt(p * (1 - p) / runs))


def test_randomized_response_on_a_large_sparse_graph_never_builds_all_pairs():
    n, epsilon = 20_000, 7.0  # 2·10^8 pairs: materialising them would take gigabytes
    graph = random_graph(n, 2e-4, seed=8)
    released = randomized_response_edges(graph, epsilon, _random_bytes=np.random.default_rng(9).bytes)
    _assert_simple_graph(released, n)
    p = flip_probability(epsilon)
    non_edges = n * (n - 1) // 2 - len(upper_pairs(graph))
    added = len(upper_pairs(released) - upper_pairs(graph))
    assert abs(added - non_edges * p) <= 5 * math.sqrt(non_edges * p * (1 - p))


def test_randomized_response_refuses_dense_outputs_and_bad_input():
    graph = random_graph(300, 0.05, seed=10)
    with pytest.raises(ValueError, match="max_edges"):
        randomized_response_edges(graph, 0.1, max_edges=1000)
    with pytest.raises(ValueError, match="symmetric"):
        randomized_response_edges(sp.csr_matrix(np.triu(np.ones((3, 3)), 1)), 1.0)
    with pytest.raises(ValueError, match="self loops"):
        randomized_response_edges(sp.identity(3, format="csr"), 1.0)
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="epsilon"):
            randomized_response_edges(graph, bad)


def test_randomized_response_uses_fresh_secure_randomness_by_default():
    graph = random_graph(200, 0.05, seed=11)
    assert (randomized_response_edges(graph, 1.0) != randomized_response_edges(graph, 1.0)).nnz > 0
