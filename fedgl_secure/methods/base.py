"""The method interface: what a client computes and uploads, what the server fuses and sends back.

The engine (``simulation/experiment.py``, and the consortium services) is method-agnostic. A method
declares its upload kinds; each client turns the current :class:`Broadcast` into a dict of
*pre-weighted* terms ``w_k · X_k`` (one per kind, already in global index where per-node);
the engine only sums them (in plaintext or under CKKS) and hands the sums back to the method.
FedAvg and FedGL are two such methods; others (meta-learned FedAvg with self-training,
neighbour reconstruction, edge-DP contrastive learning) plug in the same way.

A round may have several stages (:class:`MultiStageMethod`, e.g. GraphFL's meta step and then its
fine-tuning and FedAvg), each one upload and one server update; a method that declares none has
one. The engine goes through :func:`method_stages` and the ``stage_*`` helpers, never a method's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.kinds import EMBEDDINGS, META_GRADIENTS, NODE_WEIGHT, PREDICTIONS, WEIGHTS  # noqa: F401 (re-exported)
from fedgl_secure.model.sparse import SparseOperator

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


class FederatedMethod(Protocol):
    name: str

    @property
    def upload_kinds(self) -> tuple[str, ...]: ...

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        """The bank's pre-weighted terms. ``with_node_terms = False`` leaves out P_k and H_k (predictions,
        embeddings), for a caller that computes them itself (under DP, with the public W̄: :meth:`node_terms`)."""
        ...

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast: ...

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        """The exact shape of every kind ``client_contribution`` returns (a receiver refuses others)."""
        ...

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator: ...


class MultiStageMethod(Protocol):
    """A method whose round has several stages (e.g. GraphFL: a meta step, then fine-tuning and FedAvg).

    Each stage is one upload and one server update: the clients of the round (the same participants in
    every stage) compute their pre-weighted terms from the broadcast the stage starts from, the engine
    sums them, and :meth:`stage_update` turns the sums into the broadcast the next stage (or round)
    starts from. Kind names are unique within a round (the key authority decrypts each (round, kind) at
    most once). A method without ``stages`` is one stage, :data:`SINGLE_STAGE`, made of
    ``client_contribution`` and ``server_update``; the helpers below hide the difference from the engine.
    """

    name: str
    stages: tuple[str, ...]

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        """Every kind of every stage, in stage order."""
        ...

    def stage_upload_kinds(self, stage: str) -> tuple[str, ...]: ...

    def stage_contribution(self, stage: str, trainer: LocalTrainer, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        """The bank's pre-weighted terms of ``stage``, from the broadcast the stage starts from."""
        ...

    def stage_update(
        self, stage: str, sums: Mapping[str, torch.Tensor], round_number: int, broadcast: Broadcast
    ) -> Broadcast:
        """The broadcast after ``stage``, from its sums and the broadcast the stage started from."""
        ...


def method_stages(method: FederatedMethod | MultiStageMethod) -> tuple[str, ...]:
    """The stages of one round, in order (one, :data:`SINGLE_STAGE`, unless the method declares ``stages``)."""
    stages = tuple(getattr(method, "stages", (SINGLE_STAGE,)))
    if not stages or len(set(stages)) != len(stages):
        raise ValueError(f"method {method.name!r}: stages must be a non-empty list of distinct names, got {stages}")
    return stages


def stage_upload_kinds(method: FederatedMethod | MultiStageMethod, stage: str) -> tuple[str, ...]:
    """The kinds a client uploads in ``stage``."""
    if hasattr(method, "stage_upload_kinds"):
        return tuple(method.stage_upload_kinds(stage))
    return tuple(method.upload_kinds)


def check_stage_kinds(method: FederatedMethod | MultiStageMethod) -> None:
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
    method: FederatedMethod | MultiStageMethod, stage: str, trainer: LocalTrainer, broadcast: Broadcast
) -> dict[str, torch.Tensor]:
    """A client's pre-weighted terms of ``stage`` (``client_contribution`` for a single-stage method)."""
    if hasattr(method, "stage_contribution"):
        return method.stage_contribution(stage, trainer, broadcast)
    return method.client_contribution(trainer, broadcast)


def stage_update(
    method: FederatedMethod | MultiStageMethod,
    stage: str,
    sums: Mapping[str, torch.Tensor],
    round_number: int,
    broadcast: Broadcast | None,
) -> Broadcast:
    """The server's update after ``stage`` (``server_update`` for a single-stage method, which reads no earlier
    broadcast: ``broadcast`` may then be None)."""
    if hasattr(method, "stage_update"):
        return method.stage_update(stage, sums, round_number, broadcast)
    return method.server_update(sums, round_number)


def server_state(method: FederatedMethod | MultiStageMethod) -> dict[str, torch.Tensor] | None:
    """What ``method``'s server keeps between rounds besides the broadcast (e.g. GraphFL's meta optimiser
    moments), as named tensors, or None for a method whose broadcast is its whole state. An aggregator
    stores it with every model version, so a round retried or resumed from a version starts from the
    state of that version, as the simulation's next round would."""
    return method.server_state() if hasattr(method, "server_state") else None


def load_server_state(method: FederatedMethod | MultiStageMethod, state: Mapping[str, torch.Tensor]) -> None:
    """Put ``method``'s server back in ``state`` (:func:`server_state`); nothing for a method that keeps none."""
    if hasattr(method, "load_server_state"):
        method.load_server_state(state)


def method_model(
    method: FederatedMethod | MultiStageMethod, num_features: int, hidden: int, num_classes: int, dropout: float
) -> nn.Module:
    """The model a method trains and the engine evaluates: the method's ``build_model`` when it has one
    (e.g. GraphFL's SGC backbone), else the engine's ``training.backbone`` (the 2-layer GCN by default), with
    ``hidden`` as its width."""
    if hasattr(method, "build_model"):
        return method.build_model(num_features, num_classes)
    from fedgl_secure.model.backbones import build_backbone

    training = method.config.training.model_copy(update={"hidden": hidden})
    return build_backbone(training, num_features, num_classes, dropout)
