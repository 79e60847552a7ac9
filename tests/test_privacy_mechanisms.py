"""DP mechanisms: clipping bounds, the CSPRNG Gaussian, distributed noise, randomised response, sensitivities.

Statistical tests use a fixed byte source (``np.random.default_rng(seed).bytes``) so they are
deterministic; each tolerance is stated where it is used. Tests of the OS CSPRNG path itself use
generous k-sigma bounds (k = 6: a false failure has probability ≈ 2·10^-9).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedgl_secure.privacy.mechanisms import (
    affected_rows,
    bound_degree,
    clip_rows,
    clip_vector,
    flip_probability,
    gaussian_share,
    graph_dp_sgd_noise_multiplier,
    noise_share_std,
    prediction_sensitivity,
    randomized_response_edges,
    residual_noise_std,
    row_release_sensitivity,
    secure_gaussian,
    secure_integers,
    secure_uniform,
    weight_update_sensitivity,
)


def fixed_bytes(seed: int):
    """A deterministic byte source for tests (never for releases)."""
    return np.random.default_rng(seed).bytes


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


# --- clipping ----------------------------------------------------------------------------------

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
bounds = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=60, deadline=None)
@given(matrix=arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 6)), elements=finite), bound=bounds)
def test_clip_rows_bounds_every_row_and_keeps_direction(matrix, bound):
    original = matrix.copy()
    clipped = clip_rows(matrix, bound)
    norms = np.linalg.norm(clipped, axis=1)
    assert (norms <= bound).all()
    assert np.array_equal(matrix, original)  # input untouched
    inside = np.linalg.norm(original, axis=1) <= bound
    assert np.array_equal(clipped[inside], original[inside])
    # Clipping only shrinks: clipped = c · row with 0 < c ≤ 1 (so the direction is kept).
    for row, out in zip(original[~inside], clipped[~inside], strict=True):
        scale = np.linalg.norm(out) / np.linalg.norm(row)
        assert 0 < scale <= 1 and np.allclose(out, scale * row, rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(vector=arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 5)), elements=finite), bound=bounds)
def test_clip_vector_bounds_the_whole_update(vector, bound):
    clipped = clip_vector(vector, bound)
    assert clipped.shape == vector.shape
    assert np.linalg.norm(clipped.ravel()) <= bound
    if np.linalg.norm(vector.ravel()) <= bound:
        assert np.array_equal(clipped, vector)


def test_clipping_refuses_non_finite_values_and_bad_bounds():
    with pytest.raises(ValueError, match="NaN"):
        clip_rows(np.array([[1.0, np.nan]]), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        clip_vector(np.array([np.inf]), 1.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="clip bound"):
            clip_rows(np.ones((2, 2)), bad)


# --- secure randomness -------------------------------------------------------------------------


def test_secure_gaussian_mean_and_variance():
    n, std = 400_000, 3.0
    for sample in (
        secure_gaussian(n, std, _random_bytes=fixed_bytes(1)),  # deterministic
        secure_gaussian(n, std),  # the OS CSPRNG
    ):
        # Sample mean ~ N(0, σ²/n): |mean| ≤ k·σ/√n with k = 6.
        assert abs(sample.mean()) <= 6 * std / math.sqrt(n)
        # Sample variance has std ≈ σ²·√(2/(n−1)) for Gaussian data: |s² − σ²| ≤ k·σ²·√(2/n), k = 6.
        assert abs(sample.var(ddof=1) - std**2) <= 6 * std**2 * math.sqrt(2 / n)


def test_secure_gaussian_has_a_gaussian_shape():
    sample = secure_gaussian(100_000, 1.0, _random_bytes=fixed_bytes(2))
    # Kolmogorov–Smirnov against N(0, 1); fixed source, so this is deterministic, and a sampler with
    # the wrong shape (e.g. a uniform or a mis-scaled normal) gives p-values of ~0 at this n.
    assert stats.kstest(sample, "norm").pvalue > 1e-3


def test_secure_gaussian_does_not_use_numpys_generator():
    np.random.seed(0)
    state = np.random.get_state()
    first = secure_gaussian(64, 1.0)
    assert np.array_equal(np.random.get_state()[1], state[1])  # numpy's global RNG was not consumed
    np.random.seed(0)
    second = secure_gaussian(64, 1.0)
    assert not np.array_equal(first, second)  # seeding numpy does not make it repeat


def test_injected_source_is_reproducible_and_shapes_are_kept():
    a = secure_gaussian((3, 4), 2.0, _random_bytes=fixed_bytes(7))
    b = secure_gaussian((3, 4), 2.0, _random_bytes=fixed_bytes(7))
    assert a.shape == (3, 4) and np.array_equal(a, b)
    with pytest.raises(ValueError, match="positive"):
        secure_gaussian(3, 0.0)


def test_secure_uniform_is_strictly_inside_the_unit_interval():
    zeros = lambda n: bytes(n)  # noqa: E731 - the extreme words 0 …
    ones = lambda n: b"\xff" * n  # noqa: E731 - … and 2^64 − 1
    assert 0 < secure_uniform(4, _random_bytes=zeros)[0] < 1e-15
    assert 1 - 1e-15 < secure_uniform(4, _random_bytes=ones)[0] < 1
    assert np.isfinite(secure_gaussian(4, 1.0, _random_bytes=zeros)).all()


def test_secure_integers_are_uniform():
    draws = secure_integers(70_000, 7, _random_bytes=fixed_bytes(3))
    assert draws.min() >= 0 and draws.max() < 7
    # Pearson χ² with 6 degrees of freedom; reject only beyond its 1 − 10^-6 quantile.
    observed = np.bincount(draws, minlength=7)
    chi2 = ((observed - 10_000) ** 2 / 10_000).sum()
    assert chi2 < stats.chi2.ppf(1 - 1e-6, df=6)


# --- distributed noise -------------------------------------------------------------------------


def test_share_std_formula_and_residual_noise():
    assert noise_share_std(6.0, 4) == pytest.approx(3.0)
    assert residual_noise_std(6.0, 4, 0) == pytest.approx(6.0)
    assert residual_noise_std(6.0, 4, 1) == pytest.approx(6.0 * math.sqrt(3 / 4))
    with pytest.raises(ValueError):
        noise_share_std(1.0, 0)
    with pytest.raises(ValueError):
        residual_noise_std(1.0, 3, 3)


@pytest.mark.parametrize("num_banks", [2, 5, 11])
def test_distributed_shares_add_up_to_the_configured_variance(num_banks):
    total_std, trials = 2.5, 40_000
    # Each bank draws its share for every trial from its own fixed source; sum over banks per trial.
    summed = sum(
        gaussian_share(trials, total_std, num_banks, _random_bytes=fixed_bytes(100 + k)) for k in range(num_banks)
    )
    # For Gaussian sums, (n−1)s²/σ² ~ χ²(n−1) exactly. Accept between its 10^-6 and 1 − 10^-6 quantiles
    # (≈ ±3.4% of σ² at n = 40 000): a share std off by the factor √K (no split, or split twice) lands
    # at K·σ² or σ²/K, far outside.
    statistic = (trials - 1) * summed.var(ddof=1) / total_std**2
    assert stats.chi2.ppf(1e-6, trials - 1) < statistic < stats.chi2.ppf(1 - 1e-6, trials - 1)
    # And a single share alone carries only σ²/K.
    single = gaussian_share(trials, total_std, num_banks, _random_bytes=fixed_bytes(99))
    statistic = (trials - 1) * single.var(ddof=1) / (total_std**2 / num_banks)
    assert stats.chi2.ppf(1e-6, trials - 1) < statistic < stats.chi2.ppf(1 - 1e-6, trials - 1)


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
