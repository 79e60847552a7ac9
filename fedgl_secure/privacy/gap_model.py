"""GAP's three modules as one model (Sajadmanesh et al., USENIX Security 2023): encoder, perturbed hops, classifier.

The encoder is an MLP ``F → hidden → d`` with a linear head to the classes (trained alone, first); the
classifier is an MLP over the concatenated hop embeddings ``[x⁰, …, x^K]`` (K+1)·d → hidden → C. Neither
sees an edge: the graph enters only through :func:`~fedgl_secure.privacy.gap.perturbed_hops`. One flat
parameter vector holds both modules, so FedAvg (Eq. 10) averages them through the usual summation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.privacy.gap import normalise_rows, perturbed_hops


@dataclass(frozen=True)
class GAPView:
    """What GAP runs on instead of Â: the degree-bounded binary A, the hop noise σ, and which module answers."""

    adjacency: SparseOperator
    noise_std: float
    phase: str  # "encoder": the encoder's head answers (the classifier is not trained yet); "classifier"
    noise: tuple[torch.Tensor, ...] | None = None  # the hops' draws, fixed once per graph (None: fresh ones)


def dense_features(features: SparseOperator | torch.Tensor) -> torch.Tensor:
    return features.to_dense() if isinstance(features, SparseOperator) else features


def public_projection(num_features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """A Gaussian projection F × p scaled by 1/√p, from a public seeded stream (every bank draws the same)."""
    return torch.randn((num_features, dim), generator=generator) / dim**0.5


class EncoderWithHead(nn.Module):
    """The encoder and its head as one module (what DP-SGD clips per example in the encoder phase)."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(normalise_rows(self.encoder(features)))


class GAPModel(FlatParameters, nn.Module):
    """Encoder (with head) and classifier; ``forward(features, view)`` runs the whole pipeline on ``view``."""

    def __init__(
        self,
        in_features: int,
        encoder_dim: int,
        hidden: int,
        num_classes: int,
        hops: int,
        projection: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.hops = hops
        # a public, data-independent projection F → p (no parameter, costs no ε): DP-SGD's noise grows with the
        # number of parameters it covers, so the encoder learns from p ≪ F inputs
        self.register_buffer("projection", projection if projection is not None else torch.empty(0))
        width = projection.shape[1] if projection is not None else in_features
        encoder = nn.Sequential(nn.Linear(width, hidden), nn.SELU(), nn.Linear(hidden, encoder_dim))
        self.encoder_module = EncoderWithHead(encoder, nn.Linear(encoder_dim, num_classes))
        self.classifier = nn.Sequential(
            nn.Linear((hops + 1) * encoder_dim, hidden), nn.SELU(), nn.Linear(hidden, num_classes)
        )

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Every linear layer from ``generator`` (uniform ±1/√fan_in, torch's default range), reproducibly."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    bound = 1.0 / module.in_features**0.5
                    module.weight.copy_(torch.rand(module.weight.shape, generator=generator) * 2 * bound - bound)
                    module.bias.copy_(torch.rand(module.bias.shape, generator=generator) * 2 * bound - bound)

    def first_layer_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder_module.parameters())

    def second_layer_parameters(self) -> list[nn.Parameter]:
        return list(self.classifier.parameters())

    def inputs(self, features: SparseOperator | torch.Tensor) -> torch.Tensor:
        """What the encoder reads: the features, projected (when a projection is set) and row-normalised."""
        if self.projection.numel():
            return normalise_rows(features @ self.projection)
        return normalise_rows(dense_features(features))

    def forward(self, features: SparseOperator | torch.Tensor, view: GAPView, generator=None) -> GCNOutput:
        dense = self.inputs(features)
        if view.phase == "encoder":
            hidden = normalise_rows(self.encoder_module.encoder(dense))
            return GCNOutput(self.encoder_module.head(hidden), hidden)
        hops = perturbed_hops(
            self.encoder_module.encoder(dense), view.adjacency, self.hops, view.noise_std, noise=view.noise
        )
        stacked = torch.cat(hops, dim=1)
        return GCNOutput(self.classifier(stacked), stacked)
