r"""Class-centroid scores propagated over the graph: the model of ``--method centroids``.

Its only parameters are the released class sums S (``C × F``, :mod:`fedgl_secure.privacy.class_sums`). A node
is scored by the cosine of its feature row to each class direction,

.. math:: s_{ic} = \frac{x_i \cdot \tilde S_c}{\lVert x_i \rVert \, \lVert \tilde S_c \rVert},
   \qquad \tilde S = \max(S, 0) \text{ when the features are non-negative} \quad \text{(Eq. C3)}

and the scores are propagated over the bank's graph by personalised PageRank (APPNP, Gasteiger, Bojchevski
& Günnemann, ICLR 2019),

.. math:: Z^{(0)} = s, \qquad Z^{(k+1)} = (1 - \alpha)\, \hat A Z^{(k)} + \alpha\, s \quad \text{(Eq. C4)}

for K steps, with the engine's Â. Both are post-processing of S: clipping S at zero uses only the public
fact that every feature is non-negative (bag-of-words counts, amounts), which removes about half of the
noise energy from the many classes × features whose true sum is near zero.
"""

from __future__ import annotations

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput
from fedgl_secure.model.propagation import personalised_pagerank
from fedgl_secure.model.sparse import SparseOperator


def row_norms(features: SparseOperator | torch.Tensor) -> torch.Tensor:
    """The L2 norm of every row (sparse or dense), as an ``N × 1`` column."""
    if isinstance(features, SparseOperator):
        squared = features.with_values(features.values**2)
        ones = torch.ones((features.shape[1], 1), dtype=features.values.dtype, device=features.values.device)
        return torch.sqrt(squared @ ones)
    return features.norm(dim=1, keepdim=True)


def centroid_scores(
    features: SparseOperator | torch.Tensor, class_sums: torch.Tensor, nonnegative: bool
) -> torch.Tensor:
    """Eq. C3: the ``N × C`` cosines of the feature rows to the class directions (zero rows score 0)."""
    directions = class_sums.clamp(min=0.0) if nonnegative else class_sums
    directions = nn.functional.normalize(directions, p=2.0, dim=1)
    dots = features @ directions.T.to(torch.float32)
    return dots / row_norms(features).clamp(min=1e-12)


def propagate(scores: torch.Tensor, adjacency: SparseOperator, steps: int, teleport: float) -> torch.Tensor:
    """Eq. C4: K steps of personalised-PageRank propagation of ``scores`` over ``adjacency`` (α = ``teleport``)."""
    return personalised_pagerank(scores, adjacency, steps, teleport)


class CentroidPropagation(FlatParameters, nn.Module):
    """The released class sums as the one parameter; ``forward`` scores (Eq. C3) and propagates (Eq. C4)."""

    def __init__(self, num_features: int, num_classes: int, steps: int, teleport: float, nonnegative: bool) -> None:
        super().__init__()
        self.steps, self.teleport, self.nonnegative = steps, teleport, nonnegative
        # no gradient: the sums are released by the banks, never trained
        self.class_sums = nn.Parameter(torch.zeros(num_classes, num_features), requires_grad=False)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Zero sums: before round 1 there are no class directions (every node scores 0)."""
        with torch.no_grad():
            self.class_sums.zero_()

    def first_layer_parameters(self) -> list[nn.Parameter]:
        return []

    def second_layer_parameters(self) -> list[nn.Parameter]:
        return []

    def forward(self, features: SparseOperator | torch.Tensor, adjacency: SparseOperator, generator=None) -> GCNOutput:
        scores = centroid_scores(features, self.class_sums, self.nonnegative)
        return GCNOutput(propagate(scores, adjacency, self.steps, self.teleport), scores)
