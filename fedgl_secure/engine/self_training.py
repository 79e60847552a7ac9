"""Self-training (GraphFL §4.3): each client labels its most confident unlabelled nodes, n per class."""

from __future__ import annotations

import torch


def most_confident_per_class(
    probabilities: torch.Tensor, candidates: torch.Tensor, per_class: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(nodes, pseudo labels): for every class c, the ``per_class`` candidate nodes predicted as c whose
    probability of c is highest (fewer when fewer candidates are predicted as c).

    ``probabilities``: N x C softmax rows; ``candidates``: N bool (the client's unlabelled nodes).
    Ties are broken by the lower node index, so the choice does not depend on the sort's stability.
    Nodes come back grouped by class, each group in decreasing confidence.
    """
    if per_class < 0:
        raise ValueError(f"per_class = {per_class}: must be >= 0")
    confidence, predicted = probabilities.max(dim=1)
    nodes, labels = [], []
    for c in range(probabilities.shape[1]):
        pool = torch.nonzero(candidates & (predicted == c), as_tuple=True)[0]
        if pool.numel() == 0 or per_class == 0:
            continue
        # sort by index first, then stably by confidence: equal confidences keep the lower index first
        order = torch.sort(confidence[pool], descending=True, stable=True).indices
        chosen = pool[order[:per_class]]
        nodes.append(chosen)
        labels.append(torch.full_like(chosen, c))
    if not nodes:
        empty = torch.zeros(0, dtype=torch.int64, device=probabilities.device)
        return empty, empty.clone()
    return torch.cat(nodes), torch.cat(labels)
