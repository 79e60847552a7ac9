r"""FGCL for graph classification (Yang et al., arXiv 2207.11836): Federated, Fed+Noise and FGCL+Noise on molecules.

Every client holds whole molecules (:mod:`fedgl_secure.data.benchmarks.moleculenet`) and trains the GCN
graph classifier (:mod:`fedgl_secure.model.graph_classifier`); the server aggregates by FedAvg (Eq. 10),
with each client's upload the WEIGHTS term :func:`~fedgl_secure.methods.base.weights_term` ``(ŵ_k W_k, ŵ_k)``
(``w_k`` = its number of training molecules, divided by the public max) summed through the engine's
:class:`~fedgl_secure.engine.aggregation.Summation` (plaintext, or CKKS with
:class:`~fedgl_secure.crypto.secure_summation.SecureSummation`).

* ``federated``: the clients train on their molecules' true bonds (no DP).
* ``fed_noise``: each client releases every molecule's adjacency once by edge-level randomised response at ε
  (:mod:`fedgl_secure.privacy.molecule_views`) and trains on the release only (ε per bond).
* ``fgcl_noise``: two fresh releases per molecule at ε₀ and ε₁ (views; ε₀ + ε₁ per bond, composed); the local loss
  is :math:`\tfrac12(\mathrm{BCE}(v_0) + \mathrm{BCE}(v_1)) + \gamma\,\mathrm{InfoNCE}_\tau(z^{(0)}, z^{(1)})`, the
  symmetric InfoNCE of :func:`~fedgl_secure.methods.fgcl.info_nce` between the two views' graph embeddings,
  negatives the other molecules of the mini-batch.

Validation and test molecules are scored on their true graphs: the DP protects the training molecules' bonds,
and the model is a post-processing of the releases. The selected model is the round with the best validation
ROC-AUC (:func:`roc_auc`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sklearn.metrics import roc_auc_score

from fedgl_secure.data.benchmarks.moleculenet import MoleculeSet, MoleculeSplit
from fedgl_secure.engine.aggregation import Summation, normalise_contribution
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.methods.base import split_weights_sum, weights_term
from fedgl_secure.methods.fgcl import info_nce
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.eager_adam import EagerAdam
from fedgl_secure.model.graph_classifier import GCNGraphClassifier, make_batch, masked_bce
from fedgl_secure.privacy.molecule_views import release_views, views_epsilon
from fedgl_secure.seeding import numpy_stream

__all__ = [
    "GraphFederationConfig",
    "GraphRun",
    "client_update",
    "roc_auc",
    "run_graph_federation",
    "training_views",
]

Method = Literal["federated", "fed_noise", "fgcl_noise"]


class GraphFederationConfig(BaseModel):
    """Typed settings of one graph-classification federation (validated here, at the edge)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    method: Method = "federated"
    epsilon: float | None = Field(None, gt=0, description="fed_noise: ε of the one release per molecule")
    view_epsilons: tuple[float, float] | None = Field(None, description="fgcl_noise: ε₀, ε₁ (they compose: ε₀ + ε₁)")
    gamma: float = Field(0.1, ge=0, description="weight γ of InfoNCE")
    temperature: float = Field(0.5, gt=0, description="τ of InfoNCE")
    rounds: int = Field(40, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(64, ge=2)
    learning_rate: float = Field(1e-3, gt=0)
    hidden: int = Field(64, ge=1)
    num_layers: int = Field(3, ge=1)
    pooling: Literal["mean", "sum"] = "mean"
    seed: int = 0

    @model_validator(mode="after")
    def _budget_matches_method(self) -> GraphFederationConfig:
        if self.method == "fed_noise" and self.epsilon is None:
            raise ValueError("method fed_noise needs epsilon")
        if self.method == "fgcl_noise" and (self.view_epsilons is None or min(self.view_epsilons) <= 0):
            raise ValueError("method fgcl_noise needs two positive view_epsilons")
        return self

    def epsilon_spent(self) -> float:
        """ε per bond of the training molecules (∞ for ``federated``): one release, or two composed."""
        if self.method == "federated":
            return float("inf")
        if self.method == "fed_noise":
            return float(self.epsilon)
        return views_epsilon(self.view_epsilons)


@dataclass
class GraphRun:
    """What one federation measured: validation ROC-AUC per round, and the selected round's test ROC-AUC."""

    val_auc: list[float] = field(default_factory=list)
    best_round: int = 0
    best_val_auc: float = float("nan")
    test_auc: float = float("nan")


def training_views(data: MoleculeSet, indices: np.ndarray, config: GraphFederationConfig) -> list[list[np.ndarray]]:
    """The bonds each training view holds: the true ones, one ε-release, or two fresh releases (ε₀, ε₁)."""
    atoms = [data.molecules[i].num_atoms for i in indices]
    edges = [data.molecules[i].edges for i in indices]
    if config.method == "federated":
        return [edges]
    if config.method == "fed_noise":
        return [release_views(atoms, edges, config.epsilon)]
    return [release_views(atoms, edges, eps) for eps in config.view_epsilons]


def roc_auc(model: GCNGraphClassifier, data: MoleculeSet, indices: np.ndarray) -> float:
    """Mean ROC-AUC over the tasks that have both classes among the labelled molecules (true graphs)."""
    molecules = [data.molecules[i] for i in indices]
    batch = make_batch([m.features for m in molecules], [m.edges for m in molecules], [m.labels for m in molecules])
    model.eval()
    with torch.no_grad():
        scores = model(batch)[0].numpy()
    labels = batch.labels.numpy()
    aucs = []
    for t in range(labels.shape[1]):
        known = ~np.isnan(labels[:, t])
        y = labels[known, t]
        if y.size and 0 < y.sum() < y.size:
            aucs.append(roc_auc_score(y, scores[known, t]))
    return float(np.mean(aucs)) if aucs else float("nan")


def _local_loss(model: GCNGraphClassifier, batches: list, config: GraphFederationConfig) -> torch.Tensor:
    """BCE averaged over the views, plus γ · symmetric in-batch InfoNCE between two views' graph embeddings."""
    outputs = [model(b) for b in batches]
    loss = sum(masked_bce(logits, b.labels) for (logits, _), b in zip(outputs, batches, strict=True)) / len(outputs)
    if len(outputs) == 2 and config.gamma > 0 and batches[0].num_graphs > 1:
        z0, z1 = outputs[0][1], outputs[1][1]
        tau = config.temperature
        loss = loss + config.gamma * 0.5 * (info_nce(z0, z1, tau) + info_nce(z1, z0, tau))
    return loss


def client_update(
    model: GCNGraphClassifier,
    optimizer: torch.optim.Optimizer,
    global_weights: torch.Tensor,
    data: MoleculeSet,
    indices: np.ndarray,
    views: list[list[np.ndarray]],
    config: GraphFederationConfig,
    rng: np.random.Generator,
) -> torch.Tensor:
    """E local epochs of mini-batch training from W̄ on the client's (released) views; returns the trained W_k."""
    torch.nn.utils.vector_to_parameters(global_weights, model.parameters())
    model.train()
    for _ in range(config.local_epochs):
        order = rng.permutation(len(indices))
        for start in range(0, len(order), config.batch_size):
            chosen = order[start : start + config.batch_size]
            molecules = [data.molecules[indices[c]] for c in chosen]
            features = [m.features for m in molecules]
            labels = [m.labels for m in molecules]
            batches = [make_batch(features, [view[c] for c in chosen], labels) for view in views]
            optimizer.zero_grad(set_to_none=True)
            _local_loss(model, batches, config).backward()
            optimizer.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def run_graph_federation(
    data: MoleculeSet,
    split: MoleculeSplit,
    config: GraphFederationConfig,
    summation: Summation,
    progress: Callable[[int, float], None] | None = None,
) -> GraphRun:
    """FedAvg over the split's clients for ``config.rounds`` rounds; the model is chosen on validation ROC-AUC."""
    torch.manual_seed(int(numpy_stream(config.seed, "graph-model-init").integers(2**31)))
    global_model = GCNGraphClassifier(
        data.molecules[0].features.shape[1], config.hidden, len(data.tasks), config.num_layers, config.pooling
    )
    weights = torch.nn.utils.parameters_to_vector(global_model.parameters()).detach()
    sizes = [len(c) for c in split.clients]
    w_max = float(max(sizes))
    clients = []
    for k, indices in enumerate(split.clients):
        model = GCNGraphClassifier(
            data.molecules[0].features.shape[1], config.hidden, len(data.tasks), config.num_layers, config.pooling
        )
        optimizer = EagerAdam(model.parameters(), lr=config.learning_rate)
        # the releases are made once, before training: every round after them is post-processing
        clients.append(
            (
                model,
                optimizer,
                indices,
                training_views(data, indices, config),
                numpy_stream(config.seed, "graph-client", k),
            )
        )
    run = GraphRun()
    best_state = weights
    for round_number in range(1, config.rounds + 1):
        contributions = {}
        for k, (model, optimizer, indices, views, rng) in enumerate(clients):
            trained = client_update(model, optimizer, weights, data, indices, views, config, rng)
            contributions[k] = normalise_contribution({WEIGHTS: weights_term(float(sizes[k]), trained)}, w_max)
        weighted_sum, total = split_weights_sum(summation(round_number, contributions, reference=weights)[WEIGHTS])
        weights = fedavg(weighted_sum, total).to(torch.float32)
        torch.nn.utils.vector_to_parameters(weights, global_model.parameters())
        val = roc_auc(global_model, data, split.val)
        run.val_auc.append(val)
        if round_number == 1 or (np.isfinite(val) and not run.best_val_auc >= val):  # ties keep the earlier round
            run.best_round, run.best_val_auc, best_state = round_number, val, weights.clone()
        if progress is not None:
            progress(round_number, val)
    torch.nn.utils.vector_to_parameters(best_state, global_model.parameters())
    run.test_auc = roc_auc(global_model, data, split.test)
    return run
