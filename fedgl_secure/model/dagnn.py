"""DAGNN (Liu, Gao & Ji, KDD 2020, "Towards Deeper Graph Neural Networks"): decoupled transformation and
propagation with adaptive hop weights — the deep backbone of the Fed²GNN paper's Table 2 (K = 5).

The model of the DAGNN paper's §4 (its Eq. 9: Z, H, S, S̃, X_out), with the engine's operator Â (Kipf's,
FedGL's fused Â', or Fed²GNN's grafted operator)::

    Z   = MLP(X) = W1 · dropout(ReLU(W0 · dropout(X) + b0)) + b1      ∈ R^{N×C}
    H_k = Â^k Z,  k = 0..K   (H = stack(Z, H_1, …, H_K))
    s_k = sigmoid(H_k w + b)                       one retainment score per node and hop (S = σ(H s))
    out = Σ_k s_k ⊙ H_k                            the logits (X_out = softmax(S̃ H) in the loss)

as the authors' code (``Prop``: ``Linear(C, 1)`` on the stacked ``H_k``, then a sigmoid).
"""

from __future__ import annotations

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput, dense_dropout, project_features
from fedgl_secure.model.sparse import SparseOperator


def hop_stack(adjacency: SparseOperator, z: torch.Tensor, hops: int) -> torch.Tensor:
    """``[H_0, …, H_K]`` with ``H_k = Â^k Z`` (DAGNN §4), stacked ``N x (K+1) x C``; K sparse products."""
    stack = [z]
    for _ in range(hops):
        stack.append(adjacency @ stack[-1])
    return torch.stack(stack, dim=1)


def adaptive_combination(stack: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``Σ_k s_k ⊙ H_k`` with retainment scores ``s_k = sigmoid(H_k w + b)`` (DAGNN §4: ``S = σ(H s)``, ``S̃ H``).

    ``stack``: ``N x (K+1) x C``; ``weight``: ``C``; returns ``N x C``.
    """
    scores = torch.sigmoid(stack @ weight + bias)  # N x (K+1)
    return (scores.unsqueeze(-1) * stack).sum(dim=1)


class DAGNN(FlatParameters, nn.Module):
    """``out = Σ_{k=0..K} sigmoid(Â^k Z w + b) ⊙ Â^k Z`` with ``Z = MLP(X)`` (module docstring).

    ``hidden`` of the output is the MLP's hidden layer (FedGL's ``embedding = "hidden"``); dropout on the
    input and the hidden layer, from the caller's generator, as the GCN's. Weight decay goes to the MLP's
    first layer (the engine's convention for every backbone; the DAGNN authors decay every parameter).
    """

    def __init__(self, in_features: int, hidden: int, num_classes: int, hops: int = 5, dropout: float = 0.5) -> None:
        super().__init__()
        if hops < 0:
            raise ValueError(f"hops = {hops}: DAGNN needs K >= 0 propagation steps")
        self.hops = hops
        self.dropout = dropout
        self.weight0 = nn.Parameter(torch.empty(in_features, hidden))
        self.bias0 = nn.Parameter(torch.zeros(hidden))
        self.weight1 = nn.Parameter(torch.empty(hidden, num_classes))
        self.bias1 = nn.Parameter(torch.zeros(num_classes))
        self.retain_weight = nn.Parameter(torch.empty(num_classes))
        self.retain_bias = nn.Parameter(torch.zeros(()))

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Glorot-uniform W0, W1 and w (as a ``C x 1`` matrix), zero biases."""
        nn.init.xavier_uniform_(self.weight0, generator=generator)
        nn.init.xavier_uniform_(self.weight1, generator=generator)
        nn.init.xavier_uniform_(self.retain_weight.view(-1, 1), generator=generator)
        for bias in (self.bias0, self.bias1, self.retain_bias):
            nn.init.zeros_(bias)

    def mlp(
        self, features: SparseOperator | torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Z, hidden)``: DAGNN's ``Z = MLP(X)``, the transformation before any propagation."""
        dropout = self.dropout if self.training else 0.0
        hidden = torch.relu(project_features(features, self.weight0, dropout, generator) + self.bias0)
        return dense_dropout(hidden, dropout, generator) @ self.weight1 + self.bias1, hidden

    def forward(
        self,
        features: SparseOperator | torch.Tensor,
        adjacency: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        z, hidden = self.mlp(features, generator)
        logits = adaptive_combination(hop_stack(adjacency, z, self.hops), self.retain_weight, self.retain_bias)
        return GCNOutput(logits=logits, hidden=hidden)
