"""Two-layer GCN (Kipf & Welling) with reproducible dropout: ``H = Â σ(Â X W0) W1``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedgl_secure.model.sparse import SparseOperator


@dataclass(frozen=True)
class GCNOutput:
    """What one forward pass yields: the logits H (pre-softmax) and the hidden layer."""

    logits: torch.Tensor
    hidden: torch.Tensor


def sparse_dropout(matrix: SparseOperator, p: float, generator: torch.Generator | None) -> SparseOperator:
    """Dropout on the stored values of a sparse matrix (Kipf's input dropout)."""
    if p <= 0.0:
        return matrix
    values = matrix.values
    keep = torch.rand(values.shape, generator=generator, device=values.device) >= p
    return matrix.with_values(values * keep / (1.0 - p))


def dense_dropout(tensor: torch.Tensor, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Inverted dropout drawing its mask from ``generator`` so every client's stream is its own."""
    if p <= 0.0:
        return tensor
    keep = torch.rand(tensor.shape, generator=generator, device=tensor.device) >= p
    return tensor * keep / (1.0 - p)


def project_features(
    features: SparseOperator | torch.Tensor, weight: torch.Tensor, p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """``dropout(X) W``: the first projection of every backbone, sparse or dense features alike."""
    if isinstance(features, SparseOperator):
        return sparse_dropout(features, p, generator) @ weight
    return dense_dropout(features, p, generator) @ weight


class FlatParameters:
    """A model's parameters as one flat vector (the W_k of Eq. 10), in and out; shared by every backbone.

    Also the weight-decay split the trainer's Adam uses: the parameters named in ``decayed`` (Kipf decays only
    the first layer) and the rest; a backbone may override either method.
    """

    decayed: tuple[str, ...] = ("weight0", "bias0")

    def first_layer_parameters(self) -> list[nn.Parameter]:
        """Parameters that get weight decay."""
        return [getattr(self, name) for name in self.decayed]

    def second_layer_parameters(self) -> list[nn.Parameter]:
        """Every other parameter (no weight decay)."""
        return [parameter for name, parameter in self.named_parameters() if name not in self.decayed]

    def flat_parameters(self) -> torch.Tensor:
        """All parameters as one detached vector (the W_k of Eq. 10)."""
        return nn.utils.parameters_to_vector(self.parameters()).detach().clone()

    def load_flat_parameters(self, vector: torch.Tensor) -> None:
        """Copy ``vector`` into the parameters.

        Copies rather than ``vector_to_parameters``, which would make the parameters views of
        ``vector``: training would then write into the broadcast W̄ shared by every client.
        """
        needed = sum(parameter.numel() for parameter in self.parameters())
        if vector.numel() != needed:  # checked first: a short vector would fail mid-copy with a shape error
            raise ValueError(f"parameter vector has {vector.numel()} values, the model needs {needed}")
        vector = vector.to(next(self.parameters()).device, torch.float32)
        offset = 0
        with torch.no_grad():
            for parameter in self.parameters():
                count = parameter.numel()
                parameter.copy_(vector[offset : offset + count].view_as(parameter))
                offset += count


class GCN(FlatParameters, nn.Module):
    """``H = Â σ(Â X W0 + b0) W1 + b1``; ``P = softmax(H)``.

    Dropout (on the sparse input features and on the hidden layer, as in Kipf & Welling) takes
    its randomness from an explicit generator, never from torch's global state: each bank
    owns its stream, so a distributed run reproduces an in-process one bit for bit.
    """

    def __init__(self, in_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.weight0 = nn.Parameter(torch.empty(in_features, hidden))
        self.bias0 = nn.Parameter(torch.zeros(hidden))
        self.weight1 = nn.Parameter(torch.empty(hidden, num_classes))
        self.bias1 = nn.Parameter(torch.zeros(num_classes))

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Glorot-uniform weights, zero biases."""
        nn.init.xavier_uniform_(self.weight0, generator=generator)
        nn.init.xavier_uniform_(self.weight1, generator=generator)
        nn.init.zeros_(self.bias0)
        nn.init.zeros_(self.bias1)

    def first_layer_parameters(self) -> list[nn.Parameter]:
        """Parameters that get weight decay (Kipf decays only the first layer)."""
        return [self.weight0, self.bias0]

    def second_layer_parameters(self) -> list[nn.Parameter]:
        return [self.weight1, self.bias1]

    def forward(
        self,
        features: SparseOperator | torch.Tensor,
        adjacency: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        return self.propagate(features, adjacency, adjacency, generator)

    def propagate(
        self,
        features: SparseOperator | torch.Tensor,
        first: SparseOperator,
        second: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        """``second σ(first X W0 + b0) W1 + b1``: the forward pass with each layer's own operator (the same Â in
        both for full-batch training; a mini-batch's sampled rows, input side first, for neighbour sampling)."""
        dropout = self.dropout if self.training else 0.0
        support = project_features(features, self.weight0, dropout, generator)
        hidden = torch.relu(first @ support + self.bias0)
        logits = second @ (dense_dropout(hidden, dropout, generator) @ self.weight1) + self.bias1
        return GCNOutput(logits=logits, hidden=hidden)
