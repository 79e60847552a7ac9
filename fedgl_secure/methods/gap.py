"""GAP as a federated method (``--method gap``): node-level DP by aggregation perturbation, FedAvg of its modules.

Each bank runs GAP's three modules on its own graph (:mod:`fedgl_secure.privacy.gap` has the mechanism and
its accounting; :mod:`fedgl_secure.privacy.gap_model` the model), and the federation averages the modules' weights
by FedAvg (Eq. 10) through the engine's summation (plaintext, or CKKS with ``--secure``). One round is one
stage, uploading ``weights`` only; the round number picks the phase:

* rounds 1 … R_e — **encoder**: S DP-SGD steps on the encoder and its head (per-node examples, the
  bank's training labels), from the broadcast W̄;
* round R_e + 1 — the bank computes its K perturbed hops **once**, with the encoder of the broadcast
  (fixed from now on), on its degree-bounded graph, and keeps them;
* rounds R_e + 1 … R_e + R_c — **classifier**: S DP-SGD steps on the classifier over ``[x⁰, …, x^K]``;
* later rounds: no training (the budget covers the schedule only); the bank uploads W̄ unchanged.

The global model is evaluated on the merged graph with the same pipeline as a bank: degree bound D and hop
noise σ, drawn once per graph (:class:`~fedgl_secure.privacy.gap_model.GAPView`); the encoder's head answers before the
classifier phase. Features are row-normalised to unit L2 before the encoder (data-independent; it puts every
example's gradient on the scale of the clip C).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig, GAPConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.base import WEIGHTS, Broadcast, FederatedMethod, split_weights_sum, weights_term
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.eager_adam import EagerAdam
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.privacy import gap as gap_dp
from fedgl_secure.privacy import graph_sensitivity
from fedgl_secure.privacy.gap_model import GAPModel, GAPView, public_projection
from fedgl_secure.seeding import numpy_stream, torch_stream

if TYPE_CHECKING:
    from opacus import GradSampleModule

__all__ = ["GAP", "bounded_adjacency", "gap_config_values"]


def bounded_adjacency(graph: GraphTensors, max_degree: int, seed: int, purpose: object) -> SparseOperator:
    """The binary link pattern of ``graph`` projected to degree ≤ D (seeded edge order; once per graph)."""
    pattern = gap_dp.symmetric_pattern(graph.base_adjacency)
    bounded = graph_sensitivity.bound_degree(pattern, max_degree, numpy_stream(seed, "gap", "degree", purpose))
    return SparseOperator.from_scipy(sp.csr_matrix(bounded), graph.device)


def accounted_settings(config: ExperimentConfig) -> gap_dp.GAPSettings:
    """The part of ``config.gap`` that GAP's accounting reads (hashable, so calibrations are cached)."""
    return gap_dp.GAPSettings(**config.gap.model_dump(include=set(gap_dp.GAPSettings.model_fields)))


def gap_config_values(policy) -> dict:
    """The ``gap`` config section a GAP policy (``dp.node_mechanism = "gap"``) asks for: ``[dp.gap]``, ε, δ."""
    budget = policy.budget
    return {
        **policy.dp.gap.model_dump(),
        "epsilon": budget.epsilon,
        "delta": budget.delta,
        "accountant": budget.accountant,
    }


def check_gap_policy(policy, config: ExperimentConfig) -> None:
    """Refuse a run whose method or ``gap`` settings differ from what the GAP policy accounts for."""
    if config.method != "gap":
        raise ConfigError(
            f"dp.node_mechanism = 'gap' protects the node unit with GAP's own modules; method {config.method!r} "
            "has none: run --method gap, or choose dp.node_mechanism = 'channels'"
        )
    wanted = gap_config_values(policy)
    for name, value in wanted.items():
        if getattr(config.gap, name) != value:
            raise ConfigError(
                f"gap.{name} = {getattr(config.gap, name)!r} but the policy accounts for {value!r} "
                f"(dp.gap / budget); run with the policy's value (simulate sets it from the policy)"
            )


def apply_gap_policy(config: ExperimentConfig, policy) -> ExperimentConfig:
    """``config`` with the GAP policy's accounted settings, ε and δ, checked runnable.

    GAP's mechanisms run inside the method (DP-SGD, the perturbed hops) and what a bank uploads is
    post-processing of them, so the engine's per-upload DP step has nothing to do under such a policy.
    """
    from fedgl_secure.engine.config import build_config

    values = config.model_dump(mode="json")
    values["gap"] = {**values["gap"], **gap_config_values(policy)}
    config = build_config(values)
    check_gap_policy(policy, config)
    return config


def gap_releases(config: ExperimentConfig) -> tuple[tuple[str, ...], Callable[[int], list]]:
    """GAP's ledger channels and the releases each finished round makes (:func:`~fedgl_secure.privacy.gap.
    round_releases`), for :meth:`~fedgl_secure.privacy.dp_round.FederationPrivacy.in_method_ledgers`."""
    settings = accounted_settings(config)
    noise = gap_dp.calibrate(settings, config.gap.epsilon, config.gap.delta)
    channels = (gap_dp.ENCODER, gap_dp.AGGREGATION, gap_dp.CLASSIFIER)
    return channels, lambda round_number: gap_dp.round_releases(settings, noise, round_number)


@dataclass
class _Bank:
    """A bank's DP-SGD wrappers, optimisers and (after the encoder phase) its perturbed hops."""

    encoder: GradSampleModule
    classifier: GradSampleModule
    encoder_optimizer: torch.optim.Optimizer
    classifier_optimizer: torch.optim.Optimizer
    features: torch.Tensor
    train_nodes: torch.Tensor
    hops: torch.Tensor | None = None
    hops_drawn: bool = False  # the last client_contribution drew the hops (released them, inside the bank)


class GAP(FederatedMethod):
    """``--method gap``: GAP's encoder, perturbed hops and classifier per bank, FedAvg across banks."""

    name = "gap"

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.settings: GAPConfig = config.gap
        self.accounted = accounted_settings(config)
        self.noise = gap_dp.calibrate(self.accounted, self.settings.epsilon, self.settings.delta)
        self._banks: dict[int, _Bank] = {}
        self._views: dict[int, tuple[object, GAPView]] = {}

    @property
    def hop_noise_std(self) -> float:
        """σ of every hop: z_a times the sensitivity √D (Eq. A2)."""
        return self.noise.aggregation * gap_dp.aggregation_sensitivity(self.settings.max_degree)

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        return (WEIGHTS,)

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        return {WEIGHTS: (num_parameters + 1,)}

    def build_model(self, num_features: int, num_classes: int) -> GAPModel:
        s = self.settings
        projection = None
        if s.projection_dim:
            projection = public_projection(
                num_features, s.projection_dim, torch_stream(self.config.seed, "gap", "projection")
            )
        return GAPModel(num_features, s.encoder_dim, s.hidden, num_classes, s.hops, projection)

    def phase(self, round_number: int) -> str:
        """What round ``round_number`` (1-based) trains: ``encoder``, ``classifier`` or ``done``."""
        if round_number <= self.settings.encoder_rounds:
            return "encoder"
        return "classifier" if round_number <= self.settings.rounds else "done"

    def _bank(self, trainer: LocalTrainer) -> _Bank:
        bank = self._banks.get(trainer.client_id)
        if bank is None:
            # imported here: opacus pulls in scipy.stats and torch.distributed (~40 % of a bank node's start-up
            # imports), and only a GAP bank needs it
            from opacus import GradSampleModule

            model: GAPModel = trainer.model
            graph = trainer.graph
            encoder, classifier = GradSampleModule(model.encoder_module), GradSampleModule(model.classifier)
            lr = self.settings.learning_rate
            bank = _Bank(
                encoder,
                classifier,
                EagerAdam(model.encoder_module.parameters(), lr=lr),
                EagerAdam(model.classifier.parameters(), lr=lr),
                model.inputs(graph.features),
                torch.nonzero(graph.train_mask).flatten(),
            )
            self._banks[trainer.client_id] = bank
        return bank

    def _steps(self, trainer: LocalTrainer, bank: _Bank, module: GradSampleModule, optimizer, inputs, noise: float):
        labels = trainer.graph.labels[bank.train_nodes]
        inputs = inputs[bank.train_nodes]
        parameters = [p for p in module.parameters() if p.requires_grad]

        def loss_of(chosen: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(module(inputs[chosen]), labels[chosen], reduction="sum")

        for _ in range(self.settings.local_steps):
            gap_dp.dp_sgd_step(module, parameters, loss_of, len(bank.train_nodes), self.settings, noise, optimizer)

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        model: GAPModel = trainer.model
        model.load_flat_parameters(broadcast.weights)
        bank = self._bank(trainer)
        bank.hops_drawn = False
        phase = self.phase(broadcast.round_number + 1)
        model.train()
        if phase == "encoder":
            self._steps(trainer, bank, bank.encoder, bank.encoder_optimizer, bank.features, self.noise.encoder)
        elif phase == "classifier":
            if bank.hops is None:  # once: the encoder is final, and the hops are released inside the bank once
                with torch.no_grad():
                    adjacency = bounded_adjacency(
                        trainer.graph, self.settings.max_degree, self.config.seed, trainer.client_id
                    )
                    hops = gap_dp.perturbed_hops(
                        model.encoder_module.encoder(bank.features), adjacency, self.settings.hops, self.hop_noise_std
                    )
                bank.hops = torch.cat(hops, dim=1)
                bank.hops_drawn = True
            self._steps(trainer, bank, bank.classifier, bank.classifier_optimizer, bank.hops, self.noise.classifier)
        return {WEIGHTS: weights_term(client_weight(trainer.num_nodes), model.flat_parameters().cpu())}

    kept_release_channels = (gap_dp.AGGREGATION,)
    """Ledger channels of what :meth:`kept_release` holds."""

    def bank_releases(self, trainer: LocalTrainer, training_round: int) -> list:
        """What this bank's last :meth:`client_contribution` (for ``training_round``) released: the hops if it drew
        them, and its phase's DP-SGD steps — what a bank service records. (The simulation records
        :func:`gap_releases` for every bank every round, which is never less.)"""
        bank = self._banks.get(trainer.client_id)
        drawn = bank is not None and bank.hops_drawn
        made = [
            gap_dp.hops_release(self.accounted, self.noise, training_round) if drawn else None,
            gap_dp.step_release(self.accounted, self.noise, training_round),
        ]
        return [release for release in made if release is not None]

    def kept_release_records(self, round_number: int) -> list:
        """The ledger records of the kept hops, released in round ``round_number``."""
        release = gap_dp.hops_release(self.accounted, self.noise, round_number)
        return [] if release is None else [release]

    def kept_release_settings(self) -> dict:
        """The settings the kept hops were drawn under (``gap``: D, K, σ's ε and δ...): hops drawn under others
        are never taken back."""
        return self.settings.model_dump(mode="json")

    def kept_release(self, trainer: LocalTrainer) -> dict[str, torch.Tensor]:
        """What this bank released inside the method and must keep across restarts: its perturbed hops, once
        computed (a second draw would be a second release of the aggregation). Empty before the classifier phase."""
        bank = self._banks.get(trainer.client_id)
        return {} if bank is None or bank.hops is None else {"hops": bank.hops.detach().cpu()}

    def restore_kept_release(self, trainer: LocalTrainer, arrays: Mapping[str, torch.Tensor]) -> None:
        """Take back the hops :meth:`kept_release` gave (a restarted bank service): they are never drawn again."""
        hops = torch.as_tensor(arrays["hops"], dtype=torch.float32)
        expected = (trainer.graph.num_nodes, (self.settings.hops + 1) * self.settings.encoder_dim)
        if tuple(hops.shape) != expected:
            raise ConfigError(f"kept GAP hops of shape {tuple(hops.shape)}, but this bank's graph needs {expected}")
        self._bank(trainer).hops = hops.to(trainer.graph.device)

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        return Broadcast(round_number, fedavg(*split_weights_sum(sums[WEIGHTS])))

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> GAPView:
        """The view the global model is scored on: ``graph`` bounded to D, the banks' σ, the current phase."""
        cached = self._views.get(id(graph))
        if cached is None or cached[0] is not graph.base_adjacency:
            adjacency = bounded_adjacency(
                graph, self.settings.max_degree, self.config.seed, ("evaluation", graph.num_nodes)
            )
            # one draw per graph, like a bank's hops: scoring the same graph every round must not re-draw the
            # release (a noise draw that happens to suit the validation nodes would then pick the round)
            noise = (
                gap_dp.hop_noise(self.settings.hops, (graph.num_nodes, self.settings.encoder_dim), self.hop_noise_std)
                if self.hop_noise_std > 0
                else None
            )
            cached = (graph.base_adjacency, GAPView(adjacency, self.hop_noise_std, "classifier", noise))
            self._views[id(graph)] = cached
        view = cached[1]
        # after round r the model is what rounds 1 … r trained: the encoder's head until the classifier's first round
        phase = "encoder" if self.phase(broadcast.round_number) == "encoder" else "classifier"
        return GAPView(view.adjacency, view.noise_std, phase, view.noise)
