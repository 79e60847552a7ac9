"""The memory-lean Eq. 9 (model/adjacency.py: no n x s temporaries, diagonal scaling in place) gives bit for bit
the matrices of the plain scipy expressions it replaced, so runs stay identical while a 5,000,000-customer bank's
fused operator is built in a fraction of the memory (``benchmarks/fusion_memory.py``, whose baseline is the
reference here)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from benchmark_scripts import load_benchmark

from fedgl_secure.model.adjacency import (
    fuse_global_pseudo_graph,
    fuse_pseudo_graph,
    gcn_normalize,
    project_pseudo_graph,
    symmetric_normalize,
)
from fedgl_secure.model.sparse import SparseOperator

REFERENCE = load_benchmark("fusion_memory")  # the plain scipy expressions, the benchmark's baseline


def assert_same_bits(mine: sp.csr_matrix, reference: sp.csr_matrix) -> None:
    assert mine.shape == reference.shape
    np.testing.assert_array_equal(mine.indptr, reference.indptr)
    np.testing.assert_array_equal(mine.indices, reference.indices)
    assert mine.data.dtype == reference.data.dtype == np.float64
    np.testing.assert_array_equal(mine.data.view(np.int64), reference.data.view(np.int64))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("renormalize", [False, True])
def test_projection_and_fusion_are_the_scipy_expressions_bit_for_bit(seed, renormalize):
    rng = np.random.default_rng(seed)
    num_global, n_local, s = 5000, 3000, 12
    positions = rng.choice(num_global, n_local, replace=False)
    neighbors = rng.integers(0, num_global, (num_global, s)).astype(np.int32)
    weights = rng.random((num_global, s)).astype(np.float32)
    weights[rng.random(weights.shape) < 0.1] = 0.0  # Eq. 15's rows with fewer than s positive similarities
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)
    edges = sp.random(n_local, n_local, density=4 / n_local, random_state=seed, format="csr")
    a_hat = gcn_normalize(edges + edges.T)
    assert_same_bits(a_hat, REFERENCE.scipy_symmetric_normalize(sp.csr_matrix(edges + edges.T) + sp.identity(n_local)))

    projected = project_pseudo_graph(neighbors, weights, positions, num_global)
    reference = REFERENCE.scipy_projection(neighbors, weights, positions, num_global)
    assert_same_bits(projected, reference)
    assert_same_bits(symmetric_normalize(projected), REFERENCE.scipy_symmetric_normalize(reference))

    projected_before, a_hat_before = projected.copy(), a_hat.copy()
    fused = fuse_pseudo_graph(a_hat, projected, 0.3, renormalize)
    expected = (a_hat + 0.3 * REFERENCE.scipy_symmetric_normalize(reference)).tocsr()
    assert_same_bits(fused, REFERENCE.scipy_symmetric_normalize(expected) if renormalize else expected)
    assert_same_bits(projected, projected_before)  # scaled in a copy: the caller's matrices are left as they were
    assert_same_bits(a_hat, a_hat_before)
    # from the M x s structure itself, the projection normalised in its own arrays: the same matrix again
    assert_same_bits(
        fuse_global_pseudo_graph(a_hat, neighbors, weights, positions, num_global, 0.3, renormalize), fused
    )
    assert_same_bits(a_hat, a_hat_before)

    # the training operator: values cast alone, the same tensors as through a float32 copy of the whole matrix
    operator, reference_operator = SparseOperator.from_scipy(fused).matrix, REFERENCE.scipy_operator(fused)
    for mine, theirs in zip(
        (operator.crow_indices(), operator.col_indices(), operator.values()),
        (reference_operator.crow_indices(), reference_operator.col_indices(), reference_operator.values()),
        strict=True,
    ):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)


def test_the_global_fusion_without_a_pseudo_graph_is_the_local_adjacency():
    a_hat = gcn_normalize(sp.random(50, 50, density=0.1, random_state=0, format="csr"))
    no_neighbours = np.zeros((60, 4), dtype=np.int32), np.zeros((60, 4), dtype=np.float32)
    assert fuse_global_pseudo_graph(a_hat, *no_neighbours, np.arange(50), 60, 0.3) is a_hat
    assert (
        fuse_global_pseudo_graph(a_hat, np.ones((60, 4), dtype=np.int32), np.ones((60, 4)), np.arange(50), 60, 0.0)
        is a_hat
    )
