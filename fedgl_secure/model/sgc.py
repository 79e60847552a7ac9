"""SGC (Wu et al., 2019): ``H = Â^K X W + b``, a GCN without its non-linearities (GraphFL's second backbone)."""

from __future__ import annotations

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput, project_features
from fedgl_secure.model.sparse import SparseOperator


class SGC(FlatParameters, nn.Module):
    """``H = Â^K X W + b``; ``P = softmax(H)``. ``Â^K (X W)`` costs K sparse products of an N x C matrix.

    Same interface as :class:`~fedgl_secure.model.gcn.GCN` (forward with an explicit dropout generator,
    flat parameters), so a trainer and the engine can use either. Dropout (input features only) is
    off by default, as in SGC; ``hidden`` of the output is the logits (there is no hidden layer).
    """

    def __init__(self, in_features: int, num_classes: int, hops: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if hops < 1:
            raise ValueError(f"hops = {hops}: SGC needs K >= 1 propagation steps")
        self.hops = hops
        self.dropout = dropout
        self.weight = nn.Parameter(torch.empty(in_features, num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Glorot-uniform weight, zero bias."""
        nn.init.xavier_uniform_(self.weight, generator=generator)
        nn.init.zeros_(self.bias)

    def first_layer_parameters(self) -> list[nn.Parameter]:
        """Parameters that get weight decay (SGC's only layer)."""
        return [self.weight, self.bias]

    def second_layer_parameters(self) -> list[nn.Parameter]:
        return []

    def forward(
        self,
        features: SparseOperator | torch.Tensor,
        adjacency: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        dropout = self.dropout if self.training else 0.0
        projected = project_features(features, self.weight, dropout, generator)
        for _ in range(self.hops):  # Â^K X W = Â(...(Â (X W))): linear, so project first
            projected = adjacency @ projected
        logits = projected + self.bias
        return GCNOutput(logits=logits, hidden=logits)
