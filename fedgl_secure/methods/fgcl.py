"""FGCL: federated graph contrastive learning on edge-DP views (Yang et al., arXiv 2207.11836).

Each bank trains its GCN on two perturbed *views* of its graph — the FGCL paper's edge-DP
perturbation, Laplace noise on the edge weights (or randomised response), drawn afresh every local
epoch with ε₀ and ε₁ — with the supervised loss on both views plus γ times InfoNCE between the two
views' node embeddings (temperature τ; negatives from the batch or from a fixed-size queue, as the
paper's MoCo-style variant). The server aggregates by FedAvg (Eq. 10), through the same summation
(plaintext or CKKS) as every method: FGCL uploads ``weights`` only.

Where privacy comes from. In this framework the privacy of a bank's links is the policy's
one-off edge-DP release (``dp.unit = "edge"``: randomised response at the source,
:mod:`fedgl_secure.privacy.dp_round`); the two views are drawn from that *released* graph, so they are
post-processing and ε₀, ε₁ cost no budget — they shape the augmentation. (The paper treats the
views themselves as the DP release; drawn from the raw graph, Laplace noise on weights would hide
weights, not whether an edge exists — :func:`~fedgl_secure.privacy.edge_mechanisms.laplace_edge_weights`.)
The views' randomness therefore comes from a seeded stream per bank, which keeps runs reproducible.

``fgcl.enabled = true`` on FedGL (``fedgl``, ``fedgl-no-gpg``, ``fedgl-no-gpl``) adds the same
contrastive term to FedGL's training, combined with its pseudo labels (Eq. 8) and pseudo graph (Eq. 9,
fused into each view).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig, FGCLConfig
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.methods.fedavg import FedAvg
from fedgl_secure.methods.fedgl import FedGL
from fedgl_secure.model.adjacency import fuse_pseudo_graph, gcn_normalize, project_pseudo_graph
from fedgl_secure.model.losses import fedgl_loss, proximal_term
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.privacy import edge_mechanisms
from fedgl_secure.seeding import numpy_stream

__all__ = ["FGCL", "FedGLContrastive", "info_nce", "perturbed_view"]


def info_nce(
    anchors: torch.Tensor, positives: torch.Tensor, temperature: float, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    r"""InfoNCE (van den Oord et al. 2018; FGCL's contrastive loss) on cosine similarities.

    With ``negatives = None`` (in-batch), anchor i's positive is ``positives[i]`` and its negatives are
    the other rows of ``positives``:
    :math:`\ell = -\frac1B\sum_i \log \frac{e^{s(a_i,p_i)/\tau}}{\sum_j e^{s(a_i,p_j)/\tau}}`.
    With a ``negatives`` matrix (a queue, Q × D), the denominator is the positive plus the Q negatives.
    ``s`` is the cosine similarity (rows are L2-normalised here).
    """
    if anchors.shape != positives.shape:
        raise ValueError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} differ")
    a = F.normalize(anchors, dim=1)
    p = F.normalize(positives, dim=1)
    if negatives is None:
        logits = a @ p.T / temperature
        return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))
    n = F.normalize(negatives, dim=1)
    logits = torch.cat([(a * p).sum(dim=1, keepdim=True), a @ n.T], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(a.shape[0], dtype=torch.int64, device=a.device))


def perturbed_view(adjacency: sp.spmatrix, mechanism: str, epsilon: float, rng: np.random.Generator) -> sp.csr_matrix:
    """One FGCL view of a symmetric adjacency: Laplace(1/ε) on the edge weights, or randomised response.

    For a binary graph the Laplace view is the paper's ``max(0, A_ij + Lap(1/ε))``; a weighted graph (e.g. the
    posterior-weighted edge-DP release) keeps its scale: ``A_ij · max(0, 1 + Lap(1/ε))``. Randomised response
    flips the pattern and gives every edge of the view the graph's mean weight. ``rng`` is a seeded
    augmentation stream (module doc: the views are post-processing of the released graph).
    """
    weighted = sp.csr_matrix(adjacency, dtype=np.float64)
    pattern = weighted.copy()
    pattern.data[:] = 1.0
    if mechanism == "laplace":
        factors = edge_mechanisms.laplace_edge_weights(pattern, epsilon, _random_bytes=rng.bytes)
        return sp.csr_matrix(weighted.multiply(factors))
    mean = float(weighted.data.mean()) if weighted.nnz else 1.0
    return edge_mechanisms.randomized_response_edges(pattern, epsilon, _random_bytes=rng.bytes) * mean


def released_adjacency(normalized: sp.csr_matrix) -> sp.csr_matrix:
    r"""The (weighted) adjacency A behind a GCN-normalised :math:`\hat A = D^{-1/2}(A + I)D^{-1/2}`, exactly.

    :math:`\hat A_{ii} = 1/d_i`, so :math:`d_i = 1/\hat A_{ii}` and :math:`A_{ij} = \hat A_{ij}\sqrt{d_i d_j}`
    off the diagonal: the views keep the weights of the graph the bank trains on (a weighted edge-DP release
    stays weighted).
    """
    matrix = sp.csr_matrix(normalized, dtype=np.float64, copy=True)
    root = np.sqrt(1.0 / matrix.diagonal())
    adjacency = sp.csr_matrix(sp.diags(root) @ matrix @ sp.diags(root))
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    return adjacency


class _Contrastive:
    """Local training on FGCL's two views, mixed into FedAvg (:class:`FGCL`) and FedGL (:class:`FedGLContrastive`)."""

    config: ExperimentConfig
    proximal_mu: float

    def _setup_contrastive(self, config: ExperimentConfig) -> None:
        self.fgcl: FGCLConfig = config.fgcl
        self._streams: dict[int, np.random.Generator] = {}
        self._queues: dict[int, torch.Tensor] = {}
        self._plain: dict[int, tuple[object, sp.csr_matrix]] = {}

    def _beta(self) -> float:
        return 0.0

    def _views(self, trainer: LocalTrainer, broadcast: Broadcast, rng: np.random.Generator) -> list[SparseOperator]:
        graph = trainer.graph
        cached = self._plain.get(trainer.client_id)
        if cached is None or cached[0] is not graph.base_adjacency:
            cached = (graph.base_adjacency, released_adjacency(graph.base_adjacency))
            self._plain[trainer.client_id] = cached
        plain = cached[1]
        projected = None
        beta = self._beta()
        if broadcast.pseudo_graph is not None and beta > 0:
            projected = project_pseudo_graph(
                broadcast.pseudo_graph.neighbors.cpu().numpy(),
                broadcast.pseudo_graph.weights.cpu().numpy(),
                graph.positions,
                graph.num_global_nodes,
            )
        renormalize = getattr(getattr(self, "ssl", None), "renormalize_fused", False)
        views = []
        for epsilon in self.fgcl.view_epsilons:
            view = gcn_normalize(perturbed_view(plain, self.fgcl.view_mechanism, epsilon, rng))
            views.append(SparseOperator.from_scipy(fuse_pseudo_graph(view, projected, beta, renormalize), graph.device))
        return views

    def _supervised(self, trainer: LocalTrainer, logits: torch.Tensor, pseudo_labels, alpha: float) -> torch.Tensor:
        from fedgl_secure.privacy.label_dp import ReleasedLabelTraining

        graph = trainer.graph
        hook = trainer.private_training
        if isinstance(hook, ReleasedLabelTraining):  # label DP: the training labels are released
            return hook.supervised_loss(logits, graph, pseudo_labels, alpha, trainer.class_weights)
        return fedgl_loss(logits, graph.labels, graph.train_mask, pseudo_labels, alpha, trainer.class_weights)

    def _contrast(self, client_id: int, z0: torch.Tensor, z1: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        n = z0.shape[0]
        batch = torch.as_tensor(rng.choice(n, size=min(self.fgcl.batch_size, n), replace=False), device=z0.device)
        a, p = z0[batch], z1[batch]
        tau = self.fgcl.temperature
        if self.fgcl.negatives == "batch":
            return 0.5 * (info_nce(a, p, tau) + info_nce(p, a, tau))
        queue = self._queues.get(client_id)
        loss = (
            info_nce(a, p, tau, negatives=queue)
            if queue is not None
            else 0.5 * (info_nce(a, p, tau) + info_nce(p, a, tau))
        )
        fresh = p.detach()
        self._queues[client_id] = (fresh if queue is None else torch.cat([fresh, queue]))[: self.fgcl.queue_size]
        return loss

    def _train(self, trainer: LocalTrainer, broadcast: Broadcast, adjacency: SparseOperator, alpha: float) -> None:
        """E local epochs on two views (fresh each round or epoch): ½(sup(v0) + sup(v1)) + γ · InfoNCE(z0, z1)."""
        from fedgl_secure.privacy.label_dp import ReleasedLabelTraining

        if trainer.private_training is not None and not isinstance(trainer.private_training, ReleasedLabelTraining):
            raise ConfigError(
                "fgcl: DP-SGD ([dp.sgd]) trains through its own per-node gradient loop, which has no contrastive term; "
                "use FGCL with an edge- or label-unit policy, or a policy without [dp.sgd]"
            )
        rng = self._streams.setdefault(trainer.client_id, numpy_stream(self.config.seed, "fgcl", trainer.client_id))
        pseudo_labels = trainer.graph.local_pseudo_labels(broadcast.pseudo_labels) if alpha > 0 else None
        model, graph = trainer.model, trainer.graph
        model.load_flat_parameters(broadcast.weights)
        if trainer.config.reset_optimizer_each_round:
            trainer.optimizer = trainer._new_optimizer()
        anchor = [p.detach().clone() for p in model.parameters()] if self.proximal_mu > 0 else None
        model.train()
        views = None
        for _ in range(trainer.config.local_epochs):
            if views is None or self.fgcl.views_per == "epoch":  # "round": one pair per round (cheaper)
                views = self._views(trainer, broadcast, rng)
            trainer.optimizer.zero_grad(set_to_none=True)
            outputs = [model(graph.features, view, trainer.generator) for view in views]
            supervised = sum(self._supervised(trainer, out.logits, pseudo_labels, alpha) for out in outputs) / 2
            embeddings = [out.hidden if self.fgcl.embedding == "hidden" else out.logits for out in outputs]
            loss = supervised + self.fgcl.weight * self._contrast(trainer.client_id, *embeddings, rng)
            if anchor is not None:
                loss = loss + proximal_term(list(model.parameters()), anchor, self.proximal_mu)
            loss.backward()
            trainer.optimizer.step()


class FGCL(_Contrastive, FedAvg):
    """``--method fgcl``: FedAvg (weights only) with FGCL's contrastive local training."""

    name = "fgcl"

    def __init__(self, config: ExperimentConfig) -> None:
        FedAvg.__init__(self, config)
        self._setup_contrastive(config)


class FedGLContrastive(_Contrastive, FedGL):
    """FedGL with ``fgcl.enabled``: pseudo labels (Eq. 8) and pseudo graph (Eq. 9, fused into both views) plus
    FGCL's contrastive term."""

    def __init__(self, config: ExperimentConfig) -> None:
        FedGL.__init__(self, config)
        self._setup_contrastive(config)

    def _beta(self) -> float:
        return self.beta
