"""Local objectives: FedGL's self-supervised loss (Eq. 8) and FedProx's proximal term."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def balanced_class_weights(labels: torch.Tensor, train_mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``w_c = n / (C · n_c)`` over the training labels (scikit-learn's "balanced"): each class weighs as much
    in the loss as if the classes were equally frequent; a class without training nodes gets weight 0."""
    counts = torch.bincount(labels[train_mask], minlength=num_classes).to(torch.float32)
    present = counts > 0
    weights = torch.zeros(num_classes, dtype=torch.float32, device=labels.device)
    weights[present] = counts.sum() / (int(present.sum()) * counts[present])
    return weights


def fedgl_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    train_mask: torch.Tensor,
    pseudo_labels: torch.Tensor | None,
    alpha: float,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 8: ``L = CE(train labels) + α · CE(pseudo labels)``.

    Both terms are means over their node sets (weighted means with ``class_weights``, for
    imbalanced labels: :func:`balanced_class_weights`). Pseudo labels are ``-1`` where the server
    gave none; rows of the client's own training nodes are dropped from the pseudo term so that
    a true label is never overridden by the consortium's guess.
    """
    loss = F.cross_entropy(logits[train_mask], labels[train_mask], weight=class_weights)
    return loss + pseudo_label_term(logits, train_mask, pseudo_labels, alpha, class_weights)


def pseudo_label_term(
    logits: torch.Tensor,
    train_mask: torch.Tensor,
    pseudo_labels: torch.Tensor | None,
    alpha: float,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor | float:
    """Eq. 8's second term, ``α · CE(pseudo labels)``, over the nodes with a pseudo label (``>= 0``) that are not
    the client's own training nodes; 0 without pseudo labels, at α = 0 or when no node qualifies."""
    if pseudo_labels is None or alpha == 0.0:
        return 0.0
    pseudo_mask = (pseudo_labels >= 0) & ~train_mask
    if not bool(pseudo_mask.any()):
        return 0.0
    return alpha * F.cross_entropy(logits[pseudo_mask], pseudo_labels[pseudo_mask], weight=class_weights)


def proximal_term(parameters: list[torch.Tensor], global_parameters: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx: ``μ/2 · ‖W − W̄‖²`` summed over all parameter tensors."""
    squared = sum(((p - g.detach()) ** 2).sum() for p, g in zip(parameters, global_parameters, strict=True))
    return 0.5 * mu * squared
