"""GraphSAGE (Hamilton, Ying & Leskovec, NeurIPS 2017) with the mean aggregator, two layers.

Layer l: ``h'_i = W_self h_i + W_neigh · mean_{j ∈ N(i)} h_j + b`` (the paper's Algorithm 1 with the
"GCN-free" mean aggregator and concatenation written as two weight blocks, as PyG's ``SAGEConv``);
ReLU and dropout between the two layers, no normalisation of the output (full-batch, no sampling).

The engine hands every backbone its GCN operator ``Â = D̃^-1/2 (W + I) D̃^-1/2`` (Kipf's Â, FedGL's fused
Â', or Fed²GNN's grafted operator with Appendix A's weights). The mean aggregator is read off that operator
(:func:`mean_aggregation`): the weighted adjacency W is recovered from the diagonal ``Â_ii = 1/d̃_i``,
and each row is divided by its weight. On a plain graph this is ``D^-1 A``; on Fed²GNN's grafted graph a
grafted node standing for m foreign neighbours counts m times, so the mean is over the node's true
neighbourhood.
"""

from __future__ import annotations

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput, dense_dropout, project_features
from fedgl_secure.model.sparse import SparseOperator


def mean_aggregation(operator: SparseOperator) -> SparseOperator:
    """``M = D_W^-1 W`` (self-loops dropped) from a GCN operator ``Â = D̃^-1/2 (W + I) D̃^-1/2``.

    :func:`mean_weights` on the operator's entries; same sparsity pattern as ``Â`` (the diagonal kept as
    explicit zeros), so it runs on whatever device ``Â`` is on.
    """
    matrix = operator.matrix
    values = matrix.values()
    rows = torch.repeat_interleave(
        torch.arange(matrix.shape[0], device=values.device), matrix.crow_indices().diff(), output_size=values.numel()
    )
    return operator.with_values(mean_weights(rows, matrix.col_indices(), values, matrix.shape[0]))


def mean_weights(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, size: int) -> torch.Tensor:
    """The entries ``M_ij`` of the mean aggregator at the entries ``Â_ij`` (``rows``, ``cols``, ``values``) of a
    GCN operator; 0 on the diagonal.

    ``W_ij = Â_ij · √(d̃_i d̃_j)`` with ``d̃_i = 1/Â_ii`` (the self-loop has weight 1, so the diagonal is
    ``1/d̃_i``); ``M_ij = W_ij / Σ_{j ≠ i} W_ij``; a node with no neighbour gets an all-zero row (its
    aggregate is 0, as in PyG's mean aggregation). Entry lists, so the engine's CSR operator and a PyG
    model's ``edge_index`` (:mod:`fedgl_secure.model.pyg_backbones`) share it.
    """
    on_diagonal = rows == cols
    diagonal = torch.zeros(size, dtype=values.dtype, device=values.device)
    diagonal[rows[on_diagonal]] = values[on_diagonal]
    if bool((diagonal <= 0).any()):
        raise ValueError(
            "mean aggregation needs a GCN operator with a positive self-loop on every row (Â_ii = 1/d̃_i); "
            f"{int((diagonal <= 0).sum())} of {size} rows have none"
        )
    weights = torch.where(on_diagonal, torch.zeros_like(values), values / torch.sqrt(diagonal[rows] * diagonal[cols]))
    row_weight = torch.zeros(size, dtype=values.dtype, device=values.device).index_add_(0, rows, weights)
    row_weight = torch.where(row_weight > 0, row_weight, torch.ones_like(row_weight))
    return weights / row_weight[rows]


class GraphSAGE(FlatParameters, nn.Module):
    """Two mean-aggregator SAGE layers: ``h = σ(X W_s0 + M X W_n0 + b0)``, ``H = h W_s1 + M h W_n1 + b1``.

    ``M`` is :func:`mean_aggregation` of the operator passed to :meth:`forward` (computed once per operator
    and kept: the engine passes the same Â every epoch of a round). Dropout as the GCN's (on the sparse
    input and the hidden layer), from the caller's generator. Same interface as
    :class:`~fedgl_secure.model.gcn.GCN` (flat parameters; weight decay on the first layer, ``decayed``).
    """

    def __init__(self, in_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.hidden = hidden
        self.num_classes = num_classes
        # [W_self | W_neigh] side by side: one product with the (dropped-out) input gives both projections
        self.weight0 = nn.Parameter(torch.empty(in_features, 2 * hidden))
        self.bias0 = nn.Parameter(torch.zeros(hidden))
        self.weight1 = nn.Parameter(torch.empty(hidden, 2 * num_classes))
        self.bias1 = nn.Parameter(torch.zeros(num_classes))
        self._aggregation: tuple[SparseOperator, SparseOperator] | None = None

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Glorot-uniform W_self and W_neigh (each block on its own fan), zero biases."""
        for weight, width in ((self.weight0, self.hidden), (self.weight1, self.num_classes)):
            with torch.no_grad():
                for block in (weight[:, :width], weight[:, width:]):
                    nn.init.xavier_uniform_(block, generator=generator)
        nn.init.zeros_(self.bias0)
        nn.init.zeros_(self.bias1)

    def aggregation(self, adjacency: SparseOperator) -> SparseOperator:
        """``M`` for ``adjacency``, rebuilt only when a different operator is passed."""
        if self._aggregation is None or self._aggregation[0] is not adjacency:
            self._aggregation = (adjacency, mean_aggregation(adjacency))
        return self._aggregation[1]

    @staticmethod
    def _layer(inputs: torch.Tensor, mean: SparseOperator, width: int, bias: torch.Tensor) -> torch.Tensor:
        """``self + M · neigh + b`` from the two projections side by side (mean of projections = projection of mean)."""
        return inputs[:, :width] + mean @ inputs[:, width:] + bias

    def forward(
        self,
        features: SparseOperator | torch.Tensor,
        adjacency: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        dropout = self.dropout if self.training else 0.0
        mean = self.aggregation(adjacency)
        projected = project_features(features, self.weight0, dropout, generator)
        hidden = torch.relu(self._layer(projected, mean, self.hidden, self.bias0))
        projected = dense_dropout(hidden, dropout, generator) @ self.weight1
        logits = self._layer(projected, mean, self.num_classes, self.bias1)
        return GCNOutput(logits=logits, hidden=hidden)
