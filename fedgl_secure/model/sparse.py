"""Sparse matrix operator with a cached transpose, for fast sparse @ dense with autograd.

torch's own backward for ``sparse_csr @ dense`` rebuilds the transpose of the sparse matrix on
every call, which made backward ~10x slower than forward on a CPU. A GCN multiplies by the
same Â and X every epoch, so the transpose is built once (and, for input dropout, the
permutation that maps values to transposed positions is kept too).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch


def _csr_tensor(indptr: np.ndarray, indices: np.ndarray, values: torch.Tensor, shape, device) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(
            torch.as_tensor(indptr, dtype=torch.int64, device=device),
            torch.as_tensor(indices, dtype=torch.int64, device=device),
            values,
            size=tuple(shape),
            device=device,
            check_invariants=False,
        )


class _SparseMatmul(torch.autograd.Function):
    """``matrix @ dense`` whose backward uses the cached ``transpose`` (no gradient for the matrix)."""

    @staticmethod
    def forward(ctx, matrix: torch.Tensor, transpose: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        ctx.transpose = transpose
        return torch.sparse.mm(matrix, dense)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return None, None, torch.sparse.mm(ctx.transpose, grad_output)


@dataclass(frozen=True)
class SparseOperator:
    """A fixed sparse matrix ``S`` (CSR) usable as ``S @ dense`` inside autograd graphs."""

    matrix: torch.Tensor
    transpose: torch.Tensor
    transpose_order: torch.Tensor  # transposed value k is matrix value transpose_order[k]

    @classmethod
    def from_scipy(cls, matrix: sp.spmatrix, device: torch.device | str = "cpu") -> SparseOperator:
        csr = sp.csr_matrix(matrix, dtype=np.float32)
        csr.sum_duplicates()
        csr.sort_indices()
        values = torch.as_tensor(csr.data, dtype=torch.float32, device=device)
        # Transpose the positions 0..nnz-1 to learn where each value lands in Sᵀ.
        order = sp.csr_matrix((np.arange(csr.nnz, dtype=np.float64), csr.indices, csr.indptr), shape=csr.shape)
        order_t = order.T.tocsr()
        order_t.sort_indices()
        transpose_order = torch.as_tensor(order_t.data.astype(np.int64), device=device)
        return cls(
            matrix=_csr_tensor(csr.indptr, csr.indices, values, csr.shape, device),
            transpose=_csr_tensor(order_t.indptr, order_t.indices, values[transpose_order], order_t.shape, device),
            transpose_order=transpose_order,
        )

    @property
    def shape(self) -> torch.Size:
        return self.matrix.shape

    @property
    def values(self) -> torch.Tensor:
        return self.matrix.values()

    def with_values(self, values: torch.Tensor) -> SparseOperator:
        """Same sparsity pattern, new values (used by input dropout)."""
        device = values.device
        return SparseOperator(
            matrix=_csr_tensor(self.matrix.crow_indices(), self.matrix.col_indices(), values, self.shape, device),
            transpose=_csr_tensor(
                self.transpose.crow_indices(),
                self.transpose.col_indices(),
                values[self.transpose_order],
                self.transpose.shape,
                device,
            ),
            transpose_order=self.transpose_order,
        )

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(self.matrix, self.transpose, dense)

    def to_dense(self) -> torch.Tensor:
        return self.matrix.to_dense()

    def to_scipy(self) -> sp.csr_matrix:
        """``S`` as a scipy CSR matrix on the CPU (float64)."""
        matrix = self.matrix.cpu()
        return sp.csr_matrix(
            (matrix.values().double().numpy(), matrix.col_indices().numpy(), matrix.crow_indices().numpy()),
            shape=tuple(matrix.shape),
        )
