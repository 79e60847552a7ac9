"""Training on randomised-response labels (``dp.unit = "label"``): the forward-corrected loss.

The labels a bank trains on were released once by k-ary randomised response
(:func:`~fedgl_secure.privacy.mechanisms.randomized_response_labels`); whatever is computed from them is
post-processing, so the bank may train on them however it likes. Plain cross-entropy treats every
flipped label as true. The forward correction (Patrini et al., "Making deep neural networks robust to
label noise: a loss correction approach", CVPR 2017, Eq. 4) instead fits the *noisy* label
distribution ``softmax(H) · T``, with ``T`` the randomised-response matrix
(:func:`~fedgl_secure.privacy.mechanisms.label_noise_matrix`), which depends only on the public ε
and the number of classes; the clean posterior is then ``softmax(H)``. Pseudo labels (FedGL's Eq. 13)
are the consortium's, not randomised, so their term stays plain cross-entropy.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedgl_secure.model.losses import proximal_term
from fedgl_secure.model.sparse import SparseOperator


def forward_corrected_loss(
    logits: torch.Tensor, noisy_labels: torch.Tensor, noise_matrix: torch.Tensor
) -> torch.Tensor:
    r"""Patrini et al. (CVPR 2017) Eq. 4: :math:`-\frac1n\sum_i \log\,(\mathrm{softmax}(h_i)\,T)_{\tilde y_i}`.

    ``noise_matrix[i, j]`` = P(reported j | true i). With ``T = I`` it is cross-entropy.
    """
    return likelihood_loss(logits, noise_matrix.to(logits.dtype)[:, noisy_labels].T)


def likelihood_loss(logits: torch.Tensor, likelihood: torch.Tensor) -> torch.Tensor:
    r""":math:`-\frac1n\sum_i \log \sum_y \mathrm{softmax}(h_i)_y\,L_{iy}`, with :math:`L_{iy}` = P(released label of
    i | true y): the forward correction (Patrini et al., CVPR 2017, Eq. 4) with a transition per node, as
    RRWithPrior's depends on the node's prior (:func:`~fedgl_secure.privacy.mechanisms.rr_with_prior_likelihood`)."""
    probabilities = (torch.softmax(logits, dim=1) * likelihood).sum(dim=1)
    return -torch.log(probabilities.clamp_min(1e-12)).mean()


class ForwardCorrectedTraining:
    """A :class:`~fedgl_secure.engine.client.LocalTrainer`'s ``private_training`` hook under label DP.

    Full-batch Adam as the trainer's own loop, with the training-label term replaced by
    :func:`likelihood_loss` (the pseudo-label term of Eq. 8 unchanged). ``likelihood[i, y]`` = P(node i's
    released label | true y), one row per node of the bank's graph: randomised response's matrix column of the
    released label (:meth:`for_randomized_response`, Patrini et al.'s forward correction), or the node's own
    RRWithPrior transition (``label_release.LabelRelease.likelihood``).
    """

    def __init__(self, likelihood: np.ndarray) -> None:
        self.likelihood = torch.as_tensor(likelihood, dtype=torch.float32)

    @classmethod
    def for_randomized_response(cls, noise_matrix: np.ndarray, labels: np.ndarray) -> ForwardCorrectedTraining:
        """Rows ``T[:, ỹ_i]`` of the randomised-response matrix for the released labels ỹ (negative: unlabelled)."""
        return cls(np.asarray(noise_matrix)[:, np.clip(np.asarray(labels), 0, None)].T)

    def label_loss(self, logits: torch.Tensor, graph) -> torch.Tensor:
        """The training-label term: :func:`likelihood_loss` on the graph's training nodes."""
        likelihood = self.likelihood.to(logits.device)[graph.train_mask]
        return likelihood_loss(logits[graph.train_mask], likelihood.to(logits.dtype))

    def train(
        self,
        trainer,
        adjacency: SparseOperator,
        pseudo_labels: torch.Tensor | None,
        alpha: float,
        proximal_mu: float,
        epochs: int,
    ) -> float:
        graph, model = trainer.graph, trainer.model
        anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
        model.train()
        loss = torch.zeros(())
        for _ in range(epochs):
            trainer.optimizer.zero_grad(set_to_none=True)
            logits = model(graph.features, adjacency, trainer.generator).logits
            loss = self.label_loss(logits, graph)
            if pseudo_labels is not None and alpha > 0:
                pseudo_mask = (pseudo_labels >= 0) & ~graph.train_mask
                if bool(pseudo_mask.any()):
                    loss = loss + alpha * F.cross_entropy(logits[pseudo_mask], pseudo_labels[pseudo_mask])
            if anchor is not None:
                loss = loss + proximal_term(list(model.parameters()), anchor, proximal_mu)
            loss.backward()
            trainer.optimizer.step()
        return float(loss.detach())
