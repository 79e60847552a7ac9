"""Mini-batch local training over a bank's graph (``training.batch_size``) and the layer-wise inference that goes
with it, for banks whose graph does not fit full-batch training in memory.

An epoch is one pass over the nodes Eq. 8's loss reads — the training nodes and the nodes with a pseudo label
that are not training nodes — shuffled and cut into batches of ``batch_size`` seeds, each batch holding the two
kinds in their epoch-wide proportion (:func:`epoch_batches`), so each batch's
``CE(train) + α·CE(pseudo)`` estimates the full-batch loss. Each batch is one Adam step on the GCN run over
its sampled 2-hop neighbourhood (:mod:`fedgl_secure.model.neighbor_sampling`, ``training.fanouts``).

Inference (the P_k, H_k a bank uploads) is exact and over every node: the GCN layer by layer, each product with
Â taken ``inference_rows`` rows at a time into preallocated outputs (:func:`layerwise_inference`), so it holds
two ``N x hidden`` arrays and never an autograd graph.

Randomness: the batches and the neighbour samples come from the client's numpy stream ``("client", k,
"batches")`` (:mod:`fedgl_secure.seeding`), dropout from its torch stream as in full-batch training; a seed gives
the same run every time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.model.gcn import GCN, GCNOutput
from fedgl_secure.model.losses import fedgl_loss, proximal_term, pseudo_label_term
from fedgl_secure.model.neighbor_sampling import csr_rows, sample_batch
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.seeding import numpy_stream

if TYPE_CHECKING:
    from fedgl_secure.engine.client import LocalTrainer


def epoch_batches(
    train_nodes: np.ndarray, pseudo_nodes: np.ndarray, batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One epoch's seed batches: every node of ``train_nodes`` and ``pseudo_nodes`` (disjoint) exactly once, in
    batches of ``batch_size`` (the last one smaller), each kind shuffled and spread evenly over the batches.

    Each node gets a key ``(i + u) / n`` from its rank ``i`` among the ``n`` of its kind (``u`` uniform); batches are
    consecutive runs of the merged key order, so a batch holds each kind in proportion up to one node.
    """
    kinds = [rng.permutation(np.asarray(nodes, dtype=np.int64)) for nodes in (train_nodes, pseudo_nodes)]
    keys = [(np.arange(nodes.shape[0]) + rng.random(nodes.shape[0])) / max(nodes.shape[0], 1) for nodes in kinds]
    nodes = np.concatenate(kinds)
    ordered = nodes[np.argsort(np.concatenate(keys), kind="stable")]
    return [ordered[start : start + batch_size] for start in range(0, ordered.shape[0], batch_size)]


def _rows_product(operator: SparseOperator, dense: torch.Tensor, rows: int) -> torch.Tensor:
    """``operator @ dense`` computed ``rows`` rows at a time into one preallocated output."""
    total = operator.shape[0]
    output = torch.empty((total, dense.shape[1]), dtype=dense.dtype, device=dense.device)
    for start in range(0, total, rows):
        stop = min(start + rows, total)
        output[start:stop] = torch.sparse.mm(operator.rows(start, stop), dense)
    return output


@torch.no_grad()
def layerwise_inference(model: GCN, features: SparseOperator, adjacency: SparseOperator, rows: int) -> GCNOutput:
    """The GCN's eval-mode output over every node (equal to ``model(features, adjacency)``), one layer at a time
    and ``rows`` rows of each sparse product at a time."""
    hidden = _rows_product(features, model.weight0, rows)
    hidden = _rows_product(adjacency, hidden, rows).add_(model.bias0).relu_()
    logits = _rows_product(adjacency, hidden @ model.weight1, rows).add_(model.bias1)
    return GCNOutput(logits=logits, hidden=hidden)


class NeighborSampledTraining:
    """A client's mini-batch training over its trainer's current graph, with the client's own batch stream."""

    def __init__(self, trainer: LocalTrainer, seed: int) -> None:
        self.trainer = trainer
        self.rng = numpy_stream(seed, "client", trainer.client_id, "batches")

    def loss_nodes(self, pseudo_labels: torch.Tensor | None, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """The nodes Eq. 8 reads: training nodes, and (with α > 0) pseudo-labelled nodes that are not."""
        graph = self.trainer.graph
        train = graph.train_mask.cpu().numpy()
        pseudo = np.zeros_like(train)
        if pseudo_labels is not None and alpha > 0:
            pseudo = (pseudo_labels.cpu().numpy() >= 0) & ~train
        return np.flatnonzero(train), np.flatnonzero(pseudo)

    def train(
        self,
        adjacency: SparseOperator,
        pseudo_labels: torch.Tensor | None,
        alpha: float,
        proximal_mu: float,
        epochs: int,
    ) -> float:
        """``epochs`` passes of mini-batch Adam over the loss nodes; returns the last batch's loss."""
        trainer, config = self.trainer, self.trainer.config
        model = trainer.model
        operator, features = adjacency.csr_view(), trainer.graph.features.csr_view()
        train_nodes, pseudo_nodes = self.loss_nodes(pseudo_labels, alpha)
        anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
        model.train()
        loss = torch.zeros(())
        for _ in range(epochs):
            for seeds in epoch_batches(train_nodes, pseudo_nodes, config.batch_size, self.rng):
                batch = sample_batch(operator, seeds, config.fanouts, self.rng)
                loss = self._step(batch, features, pseudo_labels, alpha, anchor, proximal_mu)
        return float(loss.detach())

    def _step(self, batch, all_features: sp.csr_matrix, pseudo_labels, alpha, anchor, proximal_mu) -> torch.Tensor:
        trainer = self.trainer
        graph, device = trainer.graph, trainer.graph.device
        first, second = (SparseOperator.from_scipy(layer.operator, device) for layer in batch.layers)
        features = SparseOperator.from_scipy(csr_rows(all_features, batch.input_nodes), device)
        trainer.optimizer.zero_grad(set_to_none=True)
        logits = trainer.model.propagate(features, first, second, trainer.generator).logits
        seeds = torch.as_tensor(batch.seeds, device=device)
        train_mask = graph.train_mask[seeds]
        pseudo = pseudo_labels[seeds] if pseudo_labels is not None else None
        if bool(train_mask.any()):
            labels = graph.labels[seeds]
            loss = fedgl_loss(logits, labels, train_mask, pseudo, alpha, trainer.class_weights)
        else:  # a batch of pseudo-labelled nodes only (more of them than batches have training nodes)
            loss = torch.as_tensor(pseudo_label_term(logits, train_mask, pseudo, alpha, trainer.class_weights))
        if anchor is not None:
            loss = loss + proximal_term(list(trainer.model.parameters()), anchor, proximal_mu)
        loss.backward()
        trainer.optimizer.step()
        return loss
