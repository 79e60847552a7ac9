"""The method interface: what a client computes and uploads, what the server fuses and sends back.

The engine (``simulation/experiment.py``, and the consortium services) is method-agnostic. A method
declares its upload kinds; each client turns the current :class:`Broadcast` into a dict of
*pre-weighted* terms ``w_k · X_k`` (one per kind, already in global index where per-node);
the engine only sums them (in plaintext or under CKKS) and hands the sums back to the method.
FedAvg and FedGL are two such methods; others (meta-learned FedAvg with self-training,
neighbour reconstruction, edge-DP contrastive learning) plug in the same way.

Every method subclasses :class:`FederatedMethod`. A round may have several stages (e.g. GraphFL's meta step and then its
fine-tuning and FedAvg), each one upload and one server update; a method that declares none has
one. The engine goes through :func:`method_stages` and the ``stage_*`` helpers, never a method's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.kinds import EMBEDDINGS, META_GRADIENTS, NODE_WEIGHT, PREDICTIONS, WEIGHTS  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from torch import nn


# The name of the one stage of a method that declares no ``stages``.
SINGLE_STAGE = "round"


def weights_term(weight: float, parameters: torch.Tensor) -> torch.Tensor:
    """The WEIGHTS upload ``cat(w_k · W_k, [w_k])``: Eq. 10's numerator and denominator terms in one vector."""
    return torch.cat([weight * parameters, torch.tensor([weight], dtype=parameters.dtype)])


def split_weights_sum(summed: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(Σ_k w_k W_k, Σ_k w_k)`` from the summed WEIGHTS terms (the last entry is Σ_k w_k)."""
    return summed[:-1], float(summed[-1])


@dataclass(frozen=True)
class Broadcast:
    """What the server sends to the clients after a round (round 0: the initial model)."""

    round_number: int
    weights: torch.Tensor
    pseudo_labels: torch.Tensor | None = None
    pseudo_graph: PseudoGraph | None = None
    # Server-side only (never sent to banks): fused values kept for diagnostics.
    fused_predictions: torch.Tensor | None = field(default=None, repr=False)


class FederatedMethod:
    """The base of every method: what a client computes and uploads, what the server fuses and sends back.

    A method sets ``name`` and implements ``upload_kinds`` (a property), ``client_contribution(trainer,
    broadcast, *, with_node_terms=True)`` (the bank's pre-weighted terms; ``with_node_terms = False`` leaves out
    P_k and H_k for a caller that computes them itself, under DP with the public W̄: ``node_terms``),
    ``server_update(sums, round_number) -> Broadcast``, ``upload_shapes(num_parameters, num_global_nodes,
    num_classes)`` (the exact shape of every kind it uploads; a receiver refuses others) and
    ``evaluation_adjacency(graph, broadcast)``.

    What it may override, with the defaults below: a round of several ``stages`` (e.g. GraphFL: a meta step, then
    fine-tuning and FedAvg), each one upload (``stage_upload_kinds``, ``stage_contribution``) and one server update
    (``stage_update``, from the stage's sums and the broadcast the stage started from) — the clients of the round
    are the same in every stage, and kind names are unique within a round (the key authority decrypts each
    (round, kind) at most once); server state kept between rounds besides the broadcast (``server_state``,
    ``load_server_state``); its own model (``build_model``); the public normaliser of its uploads
    (``weight_normaliser``). A method that overrides nothing is one stage, :data:`SINGLE_STAGE`, made of
    ``client_contribution`` and ``server_update``.

    A method that carries its own node mechanism (``MethodSpec.own_mechanism``) may also say what one bank's
    contribution released (``bank_releases``; default: the spec's schedule for every bank) and keep a release a bank
    must never draw twice across restarts (``kept_release_channels`` and the ``kept_release*`` hooks: GAP's hops);
    the defaults keep nothing.
    """

    name: str
    stages: tuple[str, ...] = (SINGLE_STAGE,)
    weight_normaliser: float | None = None
    """The public ŵ normaliser of every upload; None: the federation's w_max (``engine/aggregation.py``)."""

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        """Every kind of every stage, in stage order."""
        raise NotImplementedError

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        raise NotImplementedError

    def stage_upload_kinds(self, stage: str) -> tuple[str, ...]:
        """The kinds a client uploads in ``stage``."""
        return tuple(self.upload_kinds)

    def stage_contribution(self, stage: str, trainer: LocalTrainer, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        """The bank's pre-weighted terms of ``stage``, from the broadcast the stage starts from."""
        return self.client_contribution(trainer, broadcast)

    def stage_update(
        self, stage: str, sums: Mapping[str, torch.Tensor], round_number: int, broadcast: Broadcast | None
    ) -> Broadcast:
        """The broadcast after ``stage``, from its sums and the broadcast the stage started from (a single-stage
        ``server_update`` reads no earlier broadcast: ``broadcast`` may then be None)."""
        return self.server_update(sums, round_number)

    def server_state(self) -> dict[str, torch.Tensor] | None:
        """What the server keeps between rounds besides the broadcast (e.g. GraphFL's meta optimiser moments), as
        named tensors, or None for a method whose broadcast is its whole state."""
        return None

    def load_server_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Put the server back in ``state`` (:meth:`server_state`); nothing for a method that keeps none."""

    def build_model(self, num_features: int, num_classes: int) -> nn.Module | None:
        """The method's own model (e.g. GraphFL's SGC backbone), or None: the engine's ``training.backbone``."""
        return None

    kept_release_channels: tuple[str, ...] = ()
    """Ledger channels of what :meth:`kept_release` holds; empty: the method keeps no release across restarts."""

    def bank_releases(self, trainer: LocalTrainer, training_round: int) -> list | None:
        """What this bank's last contribution (for ``training_round``) released inside the method, as ledger records;
        None: what the spec's ``mechanism_releases`` schedules for the round, the same for every bank."""
        return None

    def kept_release(self, trainer: LocalTrainer) -> dict[str, torch.Tensor]:
        """What this bank released inside the method and must keep across restarts (a second draw would be a second
        release), as named tensors; empty while there is none."""
        return {}

    def kept_release_settings(self) -> dict:
        """The settings the kept release was drawn under: one drawn under others is never taken back."""
        return {}

    def kept_release_records(self, round_number: int) -> list:
        """The ledger records of the kept release, made in round ``round_number``."""
        return []

    def restore_kept_release(self, trainer: LocalTrainer, arrays: Mapping[str, torch.Tensor]) -> None:
        """Take back what :meth:`kept_release` gave (a restarted bank): it is never drawn again."""
        raise NotImplementedError(
            f"method {self.name!r} keeps a release ({self.kept_release_channels}) it cannot restore"
        )


def method_stages(method: FederatedMethod) -> tuple[str, ...]:
    """The stages of one round, in order (one, :data:`SINGLE_STAGE`, unless the method declares ``stages``)."""
    stages = tuple(method.stages)
    if not stages or len(set(stages)) != len(stages):
        raise ValueError(f"method {method.name!r}: stages must be a non-empty list of distinct names, got {stages}")
    return stages


def stage_upload_kinds(method: FederatedMethod, stage: str) -> tuple[str, ...]:
    """The kinds a client uploads in ``stage``."""
    return tuple(method.stage_upload_kinds(stage))


def check_stage_kinds(method: FederatedMethod) -> None:
    """Refuse a method whose stages share an upload kind: a key authority decrypts each (round, kind) once, so
    a kind's second sum in the same round would always be refused."""
    seen: dict[str, str] = {}
    for stage in method_stages(method):
        for kind in stage_upload_kinds(method, stage):
            if kind in seen:
                raise ValueError(
                    f"method {method.name!r}: kind {kind!r} is uploaded in stages {seen[kind]!r} and {stage!r}; "
                    "a round's kinds must be distinct (each (round, kind) is decrypted once)"
                )
            seen[kind] = stage


def stage_contribution(
    method: FederatedMethod, stage: str, trainer: LocalTrainer, broadcast: Broadcast
) -> dict[str, torch.Tensor]:
    """A client's pre-weighted terms of ``stage`` (``client_contribution`` for a single-stage method)."""
    return method.stage_contribution(stage, trainer, broadcast)


def stage_update(
    method: FederatedMethod,
    stage: str,
    sums: Mapping[str, torch.Tensor],
    round_number: int,
    broadcast: Broadcast | None,
) -> Broadcast:
    """The server's update after ``stage`` (``server_update`` for a single-stage method, which reads no earlier
    broadcast: ``broadcast`` may then be None)."""
    return method.stage_update(stage, sums, round_number, broadcast)


def server_state(method: FederatedMethod) -> dict[str, torch.Tensor] | None:
    """What ``method``'s server keeps between rounds besides the broadcast (e.g. GraphFL's meta optimiser
    moments), as named tensors, or None for a method whose broadcast is its whole state. An aggregator
    stores it with every model version, so a round retried or resumed from a version starts from the
    state of that version, as the simulation's next round would."""
    return method.server_state()


def load_server_state(method: FederatedMethod, state: Mapping[str, torch.Tensor]) -> None:
    """Put ``method``'s server back in ``state`` (:func:`server_state`); nothing for a method that keeps none."""
    method.load_server_state(state)


def method_model(
    method: FederatedMethod, num_features: int, hidden: int, num_classes: int, dropout: float
) -> nn.Module:
    """The model a method trains and the engine evaluates: the method's ``build_model`` when it has one
    (e.g. GraphFL's SGC backbone), else the engine's ``training.backbone`` (the 2-layer GCN by default), with
    ``hidden`` as its width."""
    own = method.build_model(num_features, num_classes)
    if own is not None:
        return own
    from fedgl_secure.model.backbones import build_backbone

    training = method.config.training.model_copy(update={"hidden": hidden})
    return build_backbone(training, num_features, num_classes, dropout)
