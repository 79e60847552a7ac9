"""The cached-transpose sparse operator gives torch's dense results and gradients."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.model.sparse import SparseOperator


def test_matmul_and_gradient_match_dense_for_a_non_symmetric_matrix():
    matrix = sp.random(30, 20, density=0.2, format="csr", random_state=0, dtype=np.float32)
    operator = SparseOperator.from_scipy(matrix)
    dense = torch.as_tensor(matrix.toarray())
    x = torch.randn(20, 4, dtype=torch.float32, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    upstream = torch.randn(30, 4)
    (operator @ x).backward(upstream)
    (dense @ x_ref).backward(upstream)
    torch.testing.assert_close(operator @ x.detach(), dense @ x.detach())
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_with_values_keeps_matrix_and_transpose_consistent():
    matrix = sp.random(15, 25, density=0.3, format="csr", random_state=1, dtype=np.float32)
    operator = SparseOperator.from_scipy(matrix)
    new_values = torch.arange(operator.values.numel(), dtype=torch.float32)
    changed = operator.with_values(new_values)
    torch.testing.assert_close(changed.transpose.to_dense(), changed.matrix.to_dense().T)
    expected = matrix.copy()
    expected.sort_indices()
    expected.data = new_values.numpy()
    torch.testing.assert_close(changed.to_dense(), torch.as_tensor(expected.toarray()))
