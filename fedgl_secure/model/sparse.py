"""Sparse matrix operator with a cached transpose, for fast sparse @ dense with autograd.

torch's own backward for ``sparse_csr @ dense`` rebuilds the transpose of the sparse matrix on
every call, which made backward ~10x slower than forward on a CPU. A GCN multiplies by the
same Â and X every epoch, so the transpose is built once (and, for input dropout, the
permutation that maps values to transposed positions is kept too).

The transpose is built on the first backward that needs it, not with the operator: an operator only
ever used without gradients (inference, evaluation) never pays for it, which at millions of nodes is
the size of the matrix again (measured by ``benchmarks/minibatch_training.py``).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch


def _csr_tensor(indptr, indices, values: torch.Tensor, shape, device) -> torch.Tensor:
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


class _TransposeLayout:
    """Where the values of ``S`` land in ``Sᵀ`` (its CSR pattern and the value permutation), built once on
    demand and shared by every operator of the same sparsity pattern (input dropout makes one per epoch)."""

    def __init__(self, matrix: torch.Tensor) -> None:
        self._matrix = matrix
        self._built: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(crow_indices, col_indices, order)`` of ``Sᵀ``: transposed value k is matrix value ``order[k]``."""
        if self._built is None:
            matrix, device = self._matrix, self._matrix.device
            indptr = matrix.crow_indices().cpu().numpy()
            indices = matrix.col_indices().cpu().numpy()
            # Transpose the positions 0..nnz-1 to learn where each value lands in Sᵀ.
            order = sp.csr_matrix(
                (np.arange(indices.shape[0], dtype=np.float64), indices, indptr), shape=tuple(matrix.shape)
            )
            order_t = order.T.tocsr()
            order_t.sort_indices()
            self._built = (
                torch.as_tensor(order_t.indptr, dtype=torch.int64, device=device),
                torch.as_tensor(order_t.indices, dtype=torch.int64, device=device),
                torch.as_tensor(order_t.data.astype(np.int64), device=device),
            )
            self._matrix = None  # the layout no longer needs the first operator's values
        return self._built


class _SparseMatmul(torch.autograd.Function):
    """``matrix @ dense`` whose backward uses the operator's cached transpose (no gradient for the matrix)."""

    @staticmethod
    def forward(ctx, matrix: torch.Tensor, operator: SparseOperator, dense: torch.Tensor) -> torch.Tensor:
        ctx.operator = operator
        return torch.sparse.mm(matrix, dense)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return None, None, torch.sparse.mm(ctx.operator.transpose, grad_output)


class SparseOperator:
    """A fixed sparse matrix ``S`` (CSR) usable as ``S @ dense`` inside autograd graphs."""

    __slots__ = ("_layout", "_transpose", "matrix")

    def __init__(self, matrix: torch.Tensor, layout: _TransposeLayout | None = None) -> None:
        self.matrix = matrix
        self._layout = layout or _TransposeLayout(matrix)
        self._transpose: torch.Tensor | None = None

    @classmethod
    def from_scipy(cls, matrix: sp.spmatrix, device: torch.device | str = "cpu") -> SparseOperator:
        csr = sp.csr_matrix(matrix)
        if csr.has_canonical_format:
            # only the values are cast: a float32 copy of the whole matrix would also copy its index arrays (0.35 GB
            # for a 5,000,000-customer bank's fused operator) that torch copies to int64 anyway
            values = torch.as_tensor(csr.data.astype(np.float32, copy=False), device=device)
        else:  # duplicates summed in float32, as they always were
            csr = sp.csr_matrix(matrix, dtype=np.float32)
            csr.sum_duplicates()
            csr.sort_indices()
            values = torch.as_tensor(csr.data, dtype=torch.float32, device=device)
        return cls(_csr_tensor(csr.indptr, csr.indices, values, csr.shape, device))

    @property
    def shape(self) -> torch.Size:
        return self.matrix.shape

    @property
    def values(self) -> torch.Tensor:
        return self.matrix.values()

    @property
    def transpose(self) -> torch.Tensor:
        """``Sᵀ`` as a CSR tensor (built on first use)."""
        if self._transpose is None:
            crow, col, order = self._layout.get()
            self._transpose = _csr_tensor(crow, col, self.values[order], self.shape[::-1], self.matrix.device)
        return self._transpose

    @property
    def transpose_order(self) -> torch.Tensor:
        """Transposed value k is matrix value ``transpose_order[k]``."""
        return self._layout.get()[2]

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of ``S`` as a CSR tensor of views into its arrays (no copy of the values)."""
        crow = self.matrix.crow_indices()
        first, last = int(crow[start]), int(crow[stop])
        return _csr_tensor(
            crow[start : stop + 1] - first,
            self.matrix.col_indices()[first:last],
            self.values[first:last],
            (stop - start, self.shape[1]),
            self.matrix.device,
        )

    def with_values(self, values: torch.Tensor) -> SparseOperator:
        """Same sparsity pattern, new values (used by input dropout)."""
        matrix = _csr_tensor(self.matrix.crow_indices(), self.matrix.col_indices(), values, self.shape, values.device)
        return SparseOperator(matrix, self._layout)

    def __matmul__(self, dense: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(self.matrix, self, dense)

    def to_dense(self) -> torch.Tensor:
        return self.matrix.to_dense()

    def to_scipy(self) -> sp.csr_matrix:
        """``S`` as a scipy CSR matrix on the CPU (float64, a copy of :meth:`csr_view`)."""
        return self.csr_view().astype(np.float64)

    def csr_view(self) -> sp.csr_matrix:
        """The CSR arrays of ``S`` as a scipy matrix of its own dtype, without a copy when ``S`` is on the CPU."""
        matrix = self.matrix
        return sp.csr_matrix(
            (
                matrix.values().detach().cpu().numpy(),
                matrix.col_indices().cpu().numpy(),
                matrix.crow_indices().cpu().numpy(),
            ),
            shape=tuple(matrix.shape),
            copy=False,
        )
