"""The memory-lean Eq. 9 (model/adjacency.py: no n x s temporaries, diagonal scaling in place) gives bit for bit
the matrices of the plain scipy expressions it replaced, so runs stay identical while a 5,000,000-customer bank's
fused operator is built in a fraction of the memory (``benchmarks/fusion_memory.py``, whose baseline is the
reference here)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from benchmark_scripts import load_benchmark

from fedgl_secure.model.adjacency import fuse_pseudo_graph, gcn_normalize, project_pseudo_graph, symmetric_normalize

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
