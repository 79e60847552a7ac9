"""The fused numba top-s kernel (engine/fused_knn.py) against the torch backend and plain sorts.

The generic Eq. 15 checks (dense reference, ties, s >= M - 1, all-negative rows, overflow) run
for every CPU backend in test_pseudo_graph.py; these cover what is particular to the kernel:
several column chunks, row blocks and compactions, the column shuffle, thread settings, and its
two building blocks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from test_pseudo_graph import assert_invariants, assert_matches_reference, random_embeddings

from fedgl_secure.engine import fused_knn
from fedgl_secure.engine.pseudo_graph import SIMILARITIES, PseudoGraph, discover_pseudo_graph
from fedgl_secure.engine.simd import above_mask
from fedgl_secure.errors import ConfigError

# test_pseudo_graph.py's generic Eq. 15 checks, for this backend (kept here so that only this
# file's worker compiles the kernel).


@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize(
    ("m", "d", "s", "block_size"),
    [(50, 8, 5, 7), (137, 16, 10, 64), (20, 3, 19, 3), (20, 3, 100, None)],  # s = M - 1; s > M - 1
)
def test_matches_dense_reference(similarity: str, m: int, d: int, s: int, block_size: int | None):
    h = random_embeddings(m, d, seed=m + d + s)
    graph = discover_pseudo_graph(h, s, similarity=similarity, backend="fused", block_size=block_size)
    assert_matches_reference(graph, h, s, similarity)


def test_high_norm_hubs_outrank_self_similarity():
    h = random_embeddings(60, 4, seed=3)
    h[:8] *= 20
    assert_matches_reference(discover_pseudo_graph(h, 6, backend="fused", block_size=16), h, 6, "dot")


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_all_negative_similarities_give_an_all_zero_row(similarity: str):
    h = random_embeddings(30, 2, seed=1).abs() + 0.1
    h[0] = torch.tensor([-1.0, -2.0])
    graph = discover_pseudo_graph(h, 29, similarity=similarity, backend="fused")
    assert_matches_reference(graph, h, 29, similarity)
    assert (graph.weights[0] == 0).all()


def test_ties_never_make_a_node_its_own_neighbour():
    graph = discover_pseudo_graph(torch.ones(30, 4), 5, backend="fused", block_size=8)
    assert_invariants(graph)
    torch.testing.assert_close(graph.weights, torch.full((30, 5), 0.2))


def test_overflowing_similarities_raise_instead_of_returning_nan():
    with pytest.raises(ConfigError, match="embeddings"):
        discover_pseudo_graph(torch.full((5, 2), 1e30), 2, backend="fused")


@settings(max_examples=25, deadline=None, database=None)
@given(
    m=st.integers(2, 40),
    d=st.integers(2, 6),
    s=st.integers(1, 45),
    seed=st.integers(0, 2**16),
    similarity=st.sampled_from(SIMILARITIES),
    block_size=st.one_of(st.none(), st.integers(1, 45)),
)
def test_property_any_size_matches_reference(m, d, s, seed, similarity, block_size):
    h = random_embeddings(m, d, seed)
    graph = discover_pseudo_graph(h, s, similarity=similarity, backend="fused", block_size=block_size)
    assert_matches_reference(graph, h, s, similarity)


# Particular to the kernel.


def assert_same_graph(ours: PseudoGraph, reference: PseudoGraph, h: torch.Tensor | None = None) -> None:
    """Same neighbour sets wherever the s-th and (s+1)-th similarities are not tied, weights equal
    up to float32 rounding; ``reference`` is the torch backend's. With ``h`` (dot similarity), a row whose
    s-th and (s+1)-th similarities lie within float32 rounding of each other may swap the nodes at that
    boundary — and only those; without it every row must match exactly."""
    assert ours.neighbors.shape == reference.neighbors.shape
    torch.testing.assert_close(ours.weights, reference.weights, atol=1e-5, rtol=0)
    rows = torch.arange(ours.num_nodes)
    assert not (ours.neighbors == rows[:, None]).any()
    scores = None
    if h is not None:
        exact = h.double() @ h.double().T
        scores = exact.fill_diagonal_(-torch.inf)
    s = ours.num_neighbors
    for i in range(ours.num_nodes):
        mine, theirs = set(ours.neighbors[i].tolist()), set(reference.neighbors[i].tolist())
        if mine == theirs or scores is None:
            assert mine == theirs, f"row {i}"
            continue
        boundary = torch.sort(scores[i], descending=True).values[s - 1]
        tolerance = 1e-5 * max(1.0, abs(float(boundary)))  # float32 rounding of a score of this size
        swapped = torch.tensor(sorted(mine ^ theirs))
        assert (scores[i, swapped] - boundary).abs().max() <= tolerance, f"row {i}: not a tie at the s-th score"


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_matches_the_torch_backend_over_many_chunks_blocks_and_compactions(similarity: str):
    # 1,100 rows: 5 column chunks (the last partial), 18 row blocks of 64 split over 3 calls of
    # 400 rows, and s = 20 fills each row's buffer of 80 several times.
    h = torch.randn(1100, 16, generator=torch.Generator().manual_seed(1))
    ours = discover_pseudo_graph(h, 20, similarity=similarity, backend="fused", block_size=400)
    reference = discover_pseudo_graph(h, 20, similarity=similarity, backend="torch")
    assert_same_graph(ours, reference)


def test_rows_sorted_by_similarity_still_match():
    # Rows along one direction with growing norm: without the column shuffle every score of a row
    # would beat the bar in turn (the worst order for the threshold scan).
    generator = torch.Generator().manual_seed(2)
    direction = torch.randn(12, generator=generator)
    h = torch.linspace(0.1, 3.0, 600)[:, None] * direction + 0.05 * torch.randn(600, 12, generator=generator)
    # near-collinear rows make near-ties at the s-th score: those may swap between the two float32 orders
    assert_same_graph(discover_pseudo_graph(h, 15, backend="fused"), discover_pseudo_graph(h, 15, backend="torch"), h)


def test_float64_input_and_a_row_of_zeros():
    h = torch.randn(300, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    h[7] = 0
    ours = discover_pseudo_graph(h, 12, backend="fused")
    reference = discover_pseudo_graph(h, 12, backend="torch")
    # Row 7 scores 0 against everybody: any 12 others are a top 12, all with weight 0.
    assert (ours.weights[7] == 0).all() and 7 not in ours.neighbors[7].tolist()
    keep = torch.arange(300) != 7
    torch.testing.assert_close(ours.weights[keep], reference.weights[keep], atol=1e-5, rtol=0)
    for i in torch.nonzero(keep).flatten().tolist():
        assert set(ours.neighbors[i].tolist()) == set(reference.neighbors[i].tolist()), f"row {i}"


def test_a_pinned_host_stays_pinned_in_a_fresh_process():
    """numba's OpenMP layer sets the caller's OpenMP thread count when it first launches, and torch
    (and faiss imported after torch) share that libgomp here: a fused call must leave torch,
    faiss and numba's own settings as it found them. A fresh process, because that first launch
    happens once per process."""
    script = textwrap.dedent(
        """
        import torch, faiss, numba
        from fedgl_secure.engine.pseudo_graph import discover_pseudo_graph
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)
        h = torch.randn(200, 8, generator=torch.Generator().manual_seed(4))
        discover_pseudo_graph(h, 10, backend="fused", block_size=50)
        assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == (1, 1), (
            torch.get_num_threads(), faiss.omp_get_max_threads())
        numba_defaults = (numba.config.NUMBA_NUM_THREADS, 0)
        assert (numba.get_num_threads(), numba.get_parallel_chunksize()) == numba_defaults
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]


def test_refuses_a_gpu_device():
    with pytest.raises(ConfigError, match="^device"):
        discover_pseudo_graph(torch.randn(10, 3), 3, backend="fused", device="cuda:0")


@njit(cache=True)
def _keep_best(values, members, s):
    spare_values = np.empty_like(values)
    spare_members = np.empty_like(members)
    return fused_knn.keep_best(values, members, values.shape[0], s, spare_values, spare_members)


@pytest.mark.parametrize("kind", ["random", "ties", "equal"])
@pytest.mark.parametrize("s", [1, 7, 50, 99])
def test_keep_best_moves_the_s_largest_to_the_front(kind: str, s: int):
    rng = np.random.default_rng(s)
    values = {
        "random": rng.standard_normal(100),
        "ties": rng.integers(0, 5, 100),  # many equal to the s-th largest
        "equal": np.zeros(100),
    }[kind].astype(np.float32)
    original = values.copy()
    members = np.arange(100, dtype=np.int32)
    threshold = _keep_best(values, members, s)
    expected = np.sort(original)[::-1][:s]
    assert np.array_equal(np.sort(values[:s])[::-1], expected)
    assert threshold == expected[-1]
    assert np.array_equal(original[members], values), "members must move with their values"
    assert sorted(members.tolist()) == list(range(100))


@njit(cache=True)
def _masks(array, bar):
    return [above_mask(array, start, bar) for start in range(array.shape[0] - 7)]


def test_above_mask_sets_one_bit_per_lane_above_the_bar():
    array = np.random.default_rng(5).standard_normal(40).astype(np.float32)
    bar = np.float32(0.3)
    for start, mask in enumerate(_masks(array, bar)):
        expected = sum(1 << lane for lane in range(8) if array[start + lane] > bar)
        assert mask == expected, start
