"""Training on released labels (``dp.unit = "label"``): the forward-corrected loss and losses robust to wrong labels.

The labels a bank trains on were released once by k-ary randomised response
(:func:`~fedgl_secure.privacy.label_mechanisms.randomized_response_labels`); whatever is computed from them is
post-processing, so the bank may train on them however it likes. Plain cross-entropy treats every
flipped label as true. The forward correction (Patrini et al., "Making deep neural networks robust to
label noise: a loss correction approach", CVPR 2017, Eq. 4) instead fits the *noisy* label
distribution ``softmax(H) · T``, with ``T`` the randomised-response matrix
(:func:`~fedgl_secure.privacy.label_mechanisms.label_noise_matrix`), which depends only on the public ε
and the number of classes; the clean posterior is then ``softmax(H)``. Pseudo labels (FedGL's Eq. 13)
are the consortium's, not randomised, so their term stays plain cross-entropy.

Losses robust to wrong labels, for the same released-label term (``[dp.labels] correction``): generalised
cross-entropy (Zhang & Sabuncu, NeurIPS 2018) and bootstrapping (Reed et al., ICLR 2015 workshop). They read the
released labels and the model only, nothing about the mechanism: post-processing of the release as well.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from fedgl_secure.model.losses import proximal_term, pseudo_label_term
from fedgl_secure.model.sparse import SparseOperator


def forward_corrected_loss(
    logits: torch.Tensor, noisy_labels: torch.Tensor, noise_matrix: torch.Tensor
) -> torch.Tensor:
    r"""Patrini et al. (CVPR 2017) Eq. 4: :math:`-\frac1n\sum_i \log\,(\mathrm{softmax}(h_i)\,T)_{\tilde y_i}`.

    ``noise_matrix[i, j]`` = P(reported j | true i). With ``T = I`` it is cross-entropy.
    """
    return likelihood_loss(logits, noise_matrix.to(logits.dtype)[:, noisy_labels].T)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean of per-node ``values``, weighted by ``weights`` (per node) when given: Σ w_i v_i / Σ w_i, the mean
    ``F.cross_entropy(weight=...)`` takes (class weights looked up at each node's label)."""
    if weights is None:
        return values.mean()
    weights = weights.to(values.dtype)
    return (weights * values).sum() / weights.sum()


def likelihood_loss(
    logits: torch.Tensor, likelihood: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    r""":math:`-\frac1n\sum_i \log \sum_y \mathrm{softmax}(h_i)_y\,L_{iy}`, with :math:`L_{iy}` = P(released label of
    i | true y): the forward correction (Patrini et al., CVPR 2017, Eq. 4) with a transition per node, as
    RRWithPrior's depends on the node's prior (:func:`~fedgl_secure.privacy.label_mechanisms.rr_with_prior_likelihood`).
    ``weights``: per-node weights of the mean (:func:`weighted_mean`)."""
    probabilities = (torch.softmax(logits, dim=1) * likelihood).sum(dim=1)
    return weighted_mean(-torch.log(probabilities.clamp_min(1e-12)), weights)


def generalized_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, q: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Zhang & Sabuncu (NeurIPS 2018) Eq. 6: :math:`\frac1n\sum_i (1 - p_{i,\tilde y_i}^{\,q})/q`, q ∈ (0, 1].

    q → 0 is cross-entropy (its limit), q = 1 is 1 − p_y, MAE up to a factor 2. Its gradient is CE's times
    :math:`p_y^q`, so a label the model finds unlikely (often a wrong one) pulls less. Computed as
    ``-expm1(q · log p_y) / q`` so a small q loses no precision.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"generalised cross-entropy needs q in (0, 1], got {q}")
    log_p = torch.log_softmax(logits, dim=1).gather(1, labels.unsqueeze(1)).squeeze(1)
    return weighted_mean(-torch.expm1(q * log_p) / q, weights)


def soft_bootstrapping_loss(
    logits: torch.Tensor, labels: torch.Tensor, beta: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Reed et al. (ICLR 2015 workshop) soft bootstrapping: :math:`-\frac1n\sum_i\sum_k (\beta\,\tilde t_{ik} +
    (1-\beta)\,\hat p_{ik}) \log \hat p_{ik}`, with :math:`\tilde t_i` the released label one-hot.

    = β·CE + (1 − β)·H(p̂): the prediction in the target is not detached, as in the paper (minimum-entropy
    regularisation). β = 1 is cross-entropy.
    """
    _check_beta(beta)
    log_p = torch.log_softmax(logits, dim=1)
    target = beta * F.one_hot(labels, logits.shape[1]).to(log_p.dtype) + (1.0 - beta) * log_p.exp()
    return weighted_mean(-(target * log_p).sum(dim=1), weights)


def hard_bootstrapping_loss(
    logits: torch.Tensor, labels: torch.Tensor, beta: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Reed et al. (ICLR 2015 workshop) hard bootstrapping: :math:`-\frac1n\sum_i (\beta \log \hat p_{i,\tilde y_i}
    + (1-\beta) \log \hat p_{i,z_i})`, :math:`z_i = \arg\max_k \hat p_{ik}` (the model's own class; no gradient
    through the arg-max). β = 1 is cross-entropy.
    """
    _check_beta(beta)
    log_p = torch.log_softmax(logits, dim=1)
    predicted = log_p.detach().argmax(dim=1)
    chosen = log_p.gather(1, labels.unsqueeze(1)).squeeze(1)
    own = log_p.gather(1, predicted.unsqueeze(1)).squeeze(1)
    return weighted_mean(-(beta * chosen + (1.0 - beta) * own), weights)


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"bootstrapping needs beta in [0, 1], got {beta}")


LabelLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def robust_label_loss(correction: str, gce_q: float, bootstrap_beta: float) -> LabelLoss:
    """The loss ``(logits, released labels) → scalar`` named by ``[dp.labels] correction`` (one of the robust ones)."""
    if correction == "gce":
        return partial(generalized_cross_entropy, q=gce_q)
    if correction == "bootstrap-soft":
        return partial(soft_bootstrapping_loss, beta=bootstrap_beta)
    if correction == "bootstrap-hard":
        return partial(hard_bootstrapping_loss, beta=bootstrap_beta)
    raise ValueError(f"no robust label loss named {correction!r}")


class ReleasedLabelTraining:
    """A :class:`~fedgl_secure.engine.client.LocalTrainer`'s ``private_training`` hook under label DP.

    Full-batch Adam as the trainer's own loop, with the training-label term replaced by :meth:`label_loss` (the
    pseudo-label term of Eq. 8 unchanged: the consortium's labels are not the release). Subclasses say what the
    term is. Both terms honour the trainer's class weights (``training.class_weighting = "balanced"``) as
    :func:`~fedgl_secure.model.losses.fedgl_loss` does: a weighted mean, each node weighted by its label's class.
    """

    def label_loss(self, logits: torch.Tensor, graph, class_weights: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def supervised_loss(
        self,
        logits: torch.Tensor,
        graph,
        pseudo_labels: torch.Tensor | None,
        alpha: float,
        class_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eq. 8 on the released labels: :meth:`label_loss` + α · CE(pseudo labels), the pseudo-label rows of the
        bank's own training nodes dropped (as :func:`~fedgl_secure.model.losses.fedgl_loss`)."""
        label_term = self.label_loss(logits, graph, class_weights)
        return label_term + pseudo_label_term(logits, graph.train_mask, pseudo_labels, alpha, class_weights)

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
            loss = self.supervised_loss(logits, graph, pseudo_labels, alpha, trainer.class_weights)
            if anchor is not None:
                loss = loss + proximal_term(list(model.parameters()), anchor, proximal_mu)
            loss.backward()
            trainer.optimizer.step()
        return float(loss.detach())


class ForwardCorrectedTraining(ReleasedLabelTraining):
    """The training-label term is :func:`likelihood_loss`. ``likelihood[i, y]`` = P(node i's released label | true y),
    one row per node of the bank's graph: randomised response's matrix column of the released label
    (:meth:`for_randomized_response`, Patrini et al.'s forward correction), or the node's own RRWithPrior transition
    (``label_release.LabelRelease.likelihood``).
    """

    def __init__(self, likelihood: np.ndarray) -> None:
        self.likelihood = torch.as_tensor(likelihood, dtype=torch.float32)

    @classmethod
    def for_randomized_response(cls, noise_matrix: np.ndarray, labels: np.ndarray) -> ForwardCorrectedTraining:
        """Rows ``T[:, ỹ_i]`` of the randomised-response matrix for the released labels ỹ (negative: unlabelled)."""
        return cls(np.asarray(noise_matrix)[:, np.clip(np.asarray(labels), 0, None)].T)

    def label_loss(self, logits: torch.Tensor, graph, class_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The training-label term: :func:`likelihood_loss` on the graph's training nodes."""
        likelihood = self.likelihood.to(logits.device)[graph.train_mask]
        weights = _node_weights(graph, class_weights)
        return likelihood_loss(logits[graph.train_mask], likelihood.to(logits.dtype), weights)


class RobustLabelTraining(ReleasedLabelTraining):
    """The training-label term is a loss robust to wrong labels (:func:`robust_label_loss`) on the released labels."""

    def __init__(self, loss: LabelLoss) -> None:
        self.loss = loss

    def label_loss(self, logits: torch.Tensor, graph, class_weights: torch.Tensor | None = None) -> torch.Tensor:
        labels = graph.labels[graph.train_mask]
        return self.loss(logits[graph.train_mask], labels, weights=_node_weights(graph, class_weights))


def _node_weights(graph, class_weights: torch.Tensor | None) -> torch.Tensor | None:
    """Each training node's weight: its (released) label's class weight; None without class weights."""
    return None if class_weights is None else class_weights[graph.labels[graph.train_mask]]
