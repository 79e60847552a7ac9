"""Global pseudo labels (Eq. 13)."""

from __future__ import annotations

import torch

NO_LABEL = -1


def global_pseudo_labels(fused_predictions: torch.Tensor, threshold: float) -> torch.Tensor:
    """Eq. 13: ``Ȳ_i = argmax P̄_i`` where ``max P̄_i > λ``, else ``-1`` (no label).

    Returned as class ids rather than one-hot rows: the loss takes ids, and ``-1`` encodes the
    "no label" case without a separate mask.
    """
    confidence, classes = fused_predictions.max(dim=1)
    return torch.where(confidence > threshold, classes, torch.full_like(classes, NO_LABEL))
