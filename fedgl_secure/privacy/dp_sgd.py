"""DP-SGD for a bank's local GCN training (policy ``[dp.sgd]``), with per-node gradients from Opacus.

Full-batch GCN training has no per-example gradients: message passing mixes every node's data into
every other node's loss. This module makes them exist without changing the model. The loss of
training node c depends only on c's two-hop neighbourhood. So c's *example* is its ego-net: the rows
``N[c] = {c} ∪ neighbours(c)`` of ``Z = Â X`` (the first propagation, precomputed on the bank's
degree-bounded graph) and the weights ``Â[c, N[c]]``. On that example the two-layer GCN
``H = Â σ(Â X W0 + b0) W1 + b1`` (``fedgl_secure.model.gcn``) gives exactly the full-batch logits
of c. :class:`EgoGCN` holds the same parameters as two ``nn.Linear`` layers, and Opacus' ghost
clipping (:class:`~opacus.grad_sample.GradSampleModuleFastGradientClipping`) computes every example's
gradient norm. Each gradient is clipped to ``max_grad_norm`` C, the clipped gradients are summed, and Gaussian noise of
std ``noise_multiplier · C`` from the OS CSPRNG (:func:`~fedgl_secure.privacy.secure_noise.secure_gaussian`)
is added. The result is divided by the public number of training labels and given to the bank's
own optimiser (Adam with weight decay: post-processing).

What the guarantee is, and what it is not:

* **Node-level, honestly counted.** A node v enters the examples of every node within three hops
  (two propagations plus the degrees in Â's normalisation). At degree ≤ D that is
  K = :func:`~fedgl_secure.privacy.graph_sensitivity.affected_rows` examples. Removing v removes its own
  example (≤ C) and moves K − 1 others (≤ 2C each). The noisy sum therefore has sensitivity
  (2K − 1)·C, and the ledger records z / (2K − 1)
  (:func:`~fedgl_secure.privacy.graph_sensitivity.graph_dp_sgd_noise_multiplier`). Every step uses every
  example (no subsampling amplification is claimed).
* **The degree bound is checked, not assumed.** An ego-net with more than D neighbours raises.
* **Eq. 8 is preserved in expectation.** Training examples weigh 1 and pseudo-labelled ones
  ``α · n_train / n_pseudo``, so the clipped, noiseless sum divided by n_train equals the gradient
  of Eq. 8 whenever no gradient is clipped. n_train and n_pseudo are treated as public, like a
  bank's size (pseudo labels come from a DP release, and node membership is public).
* **Dropout** is as in full-batch training (Kipf's input dropout on X's stored values, one mask per
  step; hidden dropout per row). Masks are data-independent randomness, so they do not touch the
  guarantee.
* **Weights are post-processing.** The weights a bank uploads are a function of W̄ (public) and the
  noisy gradients, so under DP-SGD the weights channel needs no noise of its own.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fedgl_secure.model.gcn import GCN, dense_dropout, sparse_dropout
from fedgl_secure.model.losses import proximal_term
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.privacy import secure_noise

if TYPE_CHECKING:
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

RandomBytes = Callable[[int], bytes]


class DegreeBoundViolation(ValueError):
    """A graph given to DP-SGD has a node with more neighbours than the policy's ``dp.graph.max_degree``."""


class EgoGCN(nn.Module):
    """The two-layer GCN on ego-net examples: the logits of each example's centre node.

    ``aggregated`` is (B, R, F): the rows of Z = Â X at the centre's closed neighbourhood, padded
    with zeros to R = D + 1 rows; ``centre_weights`` is (B, 1, R): ``Â[c, N[c]]``, zero on padding.
    Both biases sit where the GCN has them: ``h_j = σ(Z_j W0 + b0)`` is a row-wise linear layer, and
    ``logits_c = (Σ_j Â_cj h_j) W1 + b1`` propagates before the second linear layer
    (``Â (h W1) = (Â h) W1``). So the model is two plain ``nn.Linear`` layers, which Opacus clips
    without materialising per-example gradients (ghost clipping).
    """

    def __init__(self, in_features: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.lin0 = nn.Linear(in_features, hidden)
        self.lin1 = nn.Linear(hidden, num_classes)

    def load_from(self, gcn: GCN) -> None:
        """Copy the full-batch GCN's parameters (its weights are (in, out); ``nn.Linear`` keeps (out, in))."""
        with torch.no_grad():
            self.lin0.weight.copy_(gcn.weight0.T)
            self.lin0.bias.copy_(gcn.bias0)
            self.lin1.weight.copy_(gcn.weight1.T)
            self.lin1.bias.copy_(gcn.bias1)

    def forward(
        self, aggregated: torch.Tensor, centre_weights: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        dropout = self.dropout if self.training else 0.0
        hidden = torch.relu(self.lin0(aggregated))  # input dropout: see aggregated_rows
        hidden = dense_dropout(hidden, dropout, generator)
        return self.lin1(torch.bmm(centre_weights, hidden))[:, 0, :]


@dataclass(frozen=True)
class EgoExamples:
    """One bank's DP-SGD examples for one round: the inputs of :class:`EgoGCN` plus targets and weights."""

    rows: torch.Tensor  # (B, D + 1): each example's rows of Z = Â X (N[c], centre first), n = padding
    centre_weights: torch.Tensor  # (B, 1, D + 1)
    targets: torch.Tensor  # (B,)
    loss_weights: torch.Tensor  # (B,)
    num_train: int


def closed_neighbourhoods(
    adjacency: sp.csr_matrix, centres: np.ndarray, max_degree: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each centre c: the indices of ``N[c]`` (c first, padded with -1) and ``Â[c, N[c]]`` (0 on padding).

    Raises :class:`DegreeBoundViolation` when a centre has more than ``max_degree`` neighbours besides itself.
    """
    width = max_degree + 1
    index = np.full((len(centres), width), -1, dtype=np.int64)
    weights = np.zeros((len(centres), width), dtype=np.float32)
    for row, centre in enumerate(centres):
        start, end = adjacency.indptr[centre], adjacency.indptr[centre + 1]
        columns, values = adjacency.indices[start:end], adjacency.data[start:end]
        others = columns != centre
        if int(others.sum()) > max_degree:
            raise DegreeBoundViolation(
                f"node {int(centre)} has {int(others.sum())} neighbours, above dp.graph.max_degree = {max_degree}; "
                "the DP-SGD guarantee assumes the bound (banks project their graph with graph_sensitivity.bound_degree)"
            )
        self_weight = values[~others]
        index[row, 0], weights[row, 0] = centre, float(self_weight[0]) if self_weight.size else 0.0
        count = int(others.sum())
        index[row, 1 : 1 + count] = columns[others]
        weights[row, 1 : 1 + count] = values[others]
    return index, weights


def ego_examples(
    adjacency: SparseOperator,
    labels: torch.Tensor,
    train_mask: torch.Tensor,
    pseudo_labels: torch.Tensor | None,
    alpha: float,
    max_degree: int,
) -> EgoExamples:
    """The examples of one round: every training node, and with α > 0 every pseudo-labelled non-training node."""
    device = labels.device
    csr = adjacency.csr_view()
    train = train_mask.cpu().numpy().astype(bool)
    targets = labels.cpu().numpy().copy()
    centres = [np.flatnonzero(train)]
    weights = [np.ones(int(train.sum()), dtype=np.float32)]
    if pseudo_labels is not None and alpha > 0:
        pseudo = pseudo_labels.cpu().numpy()
        pseudo_nodes = np.flatnonzero((pseudo >= 0) & ~train)
        if pseudo_nodes.size:
            targets[pseudo_nodes] = pseudo[pseudo_nodes]
            centres.append(pseudo_nodes)
            weights.append(np.full(pseudo_nodes.size, alpha * train.sum() / pseudo_nodes.size, dtype=np.float32))
    centre_index = np.concatenate(centres)
    index, centre_weights = closed_neighbourhoods(csr, centre_index, max_degree)
    return EgoExamples(
        rows=torch.as_tensor(np.where(index < 0, csr.shape[0], index), device=device),
        centre_weights=torch.as_tensor(centre_weights, device=device).unsqueeze(1),
        targets=torch.as_tensor(targets[centre_index], dtype=torch.int64, device=device),
        loss_weights=torch.as_tensor(np.concatenate(weights), device=device),
        num_train=int(train.sum()),
    )


def aggregated_rows(
    features: SparseOperator,
    adjacency: SparseOperator,
    examples: EgoExamples,
    input_dropout: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """(B, D + 1, F): every example's rows of Z = Â · dropout(X), zero rows for padding.

    Input dropout is Kipf's (on the stored values of the sparse X), one mask per step shared by all
    examples — exactly what full-batch training does; the mask is independent of the data.
    """
    dense = sparse_dropout(features, input_dropout, generator).to_dense()
    aggregated = adjacency @ dense
    padded = torch.cat([aggregated, torch.zeros(1, aggregated.shape[1], device=aggregated.device)])
    return padded[examples.rows]


def clipped_gradient_sum(
    private: GradSampleModuleFastGradientClipping,
    ego: EgoGCN,
    aggregated: torch.Tensor,
    examples: EgoExamples,
    generator: torch.Generator | None,
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Σ_i clip(∇ℓ_i, C) in GCN layout, each example's gradient norm before clipping, and the losses ℓ_i.

    Opacus' ghost clipping: one backward pass with its hooks computes every example's gradient norm
    without materialising the per-example gradients, a second one (hooks off) the gradient of
    Σ_i c_i ℓ_i with c_i = min(1, C / ‖∇ℓ_i‖) — which is the sum of the clipped gradients.
    """
    private.zero_grad(set_to_none=True)
    private.enable_hooks()  # the forward pass records activations for the norm pass
    logits = private(aggregated, examples.centre_weights, generator)
    losses = examples.loss_weights * F.cross_entropy(logits, examples.targets, reduction="none")
    with warnings.catch_warnings():  # the inputs are data, not parameters: Opacus' hooks need no input gradient
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        losses.sum().backward(retain_graph=True)
        norms = private.get_norm_sample()
        coefficients = private.get_clipping_coef()
        private.disable_hooks()
        private.zero_grad(set_to_none=True)
        (losses * coefficients.detach()).sum().backward()
    summed = [ego.lin0.weight.grad.T, ego.lin0.bias.grad, ego.lin1.weight.grad.T, ego.lin1.bias.grad]
    return [g.detach().contiguous() for g in summed], norms.detach(), losses.detach()


class NodeDPSGD:
    """A bank's DP-SGD: replaces :meth:`LocalTrainer.train`'s full-batch steps with noisy clipped ones.

    ``random_bytes`` replaces the OS CSPRNG for the noise (tests only: known noise protects nothing).
    """

    def __init__(
        self,
        max_grad_norm: float,
        noise_multiplier: float,
        max_degree: int,
        *,
        random_bytes: RandomBytes | None = None,
    ) -> None:
        if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be positive and finite, got {max_grad_norm}")
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier}")
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.max_degree = int(max_degree)
        self._random_bytes = random_bytes

    def train(
        self,
        trainer,
        adjacency: SparseOperator,
        pseudo_labels: torch.Tensor | None,
        alpha: float,
        proximal_mu: float,
        epochs: int,
    ) -> float:
        """``epochs`` DP-SGD steps on ``trainer``'s model and optimiser; returns the last step's mean loss."""
        graph, gcn = trainer.graph, trainer.model
        examples = ego_examples(adjacency, graph.labels, graph.train_mask, pseudo_labels, alpha, self.max_degree)
        ego = EgoGCN(gcn.weight0.shape[0], gcn.weight0.shape[1], gcn.weight1.shape[1], gcn.dropout).to(graph.device)
        # imported here: Opacus costs every node seconds at start-up and only a DP-SGD bank uses it
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        private = GradSampleModuleFastGradientClipping(
            ego, loss_reduction="sum", max_grad_norm=self.max_grad_norm, use_ghost_clipping=True
        )
        anchor = [p.detach().clone() for p in gcn.parameters()] if proximal_mu > 0 else None
        loss_value = 0.0
        try:
            for _ in range(epochs):
                ego.load_from(gcn)
                ego.train()
                aggregated = aggregated_rows(graph.features, adjacency, examples, ego.dropout, trainer.generator)
                summed, _, losses = clipped_gradient_sum(private, ego, aggregated, examples, trainer.generator)
                noisy = [self._add_noise(g) / examples.num_train for g in summed]
                trainer.optimizer.zero_grad(set_to_none=True)
                for parameter, grad in zip(gcn.parameters(), noisy, strict=True):
                    parameter.grad = grad
                if anchor is not None:  # FedProx: a function of W and the public W̄, added after the noise
                    proximal = proximal_term(list(gcn.parameters()), anchor, proximal_mu)
                    extra = torch.autograd.grad(proximal, list(gcn.parameters()))
                    for parameter, grad in zip(gcn.parameters(), extra, strict=True):
                        parameter.grad = parameter.grad + grad
                trainer.optimizer.step()
                loss_value = float(losses.detach().sum()) / examples.num_train
        finally:
            private.remove_hooks()
        return loss_value

    def _add_noise(self, summed: torch.Tensor) -> torch.Tensor:
        noise = secure_noise.secure_gaussian(
            tuple(summed.shape), self.noise_multiplier * self.max_grad_norm, _random_bytes=self._random_bytes
        )
        return summed + torch.from_numpy(noise).to(summed.dtype).to(summed.device)
