"""What a bank keeps between rounds: its trainer and evaluator over its graph, which rounds and versions it has
handled, the trainer's state at the start of each stage it trained, what it encrypted and what it released.

A round that is reopened (aborted below quorum, or the aggregator restarted) is retrained from the same starting
state — model, optimiser moments and dropout stream restored from a :class:`TrainerState` — so a reopened round
gives the same contribution as the first attempt would have; a retry after a broken connection resends the bytes
encrypted the first time, and a reopened attempt of the same round reuses its release.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from fedgl_secure.consortium.aggregator_port import RoundResponse
from fedgl_secure.crypto.upload import Upload
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.graph_tensors import GraphTensors


@dataclass(frozen=True)
class TrainerState:
    model: dict
    optimizer: dict
    generator: torch.Tensor


def snapshot(trainer: LocalTrainer) -> TrainerState:
    return TrainerState(
        copy.deepcopy(trainer.model.state_dict()),
        copy.deepcopy(trainer.optimizer.state_dict()),
        trainer.generator.get_state(),
    )


def restore(trainer: LocalTrainer, state: TrainerState) -> None:
    trainer.model.load_state_dict(state.model)
    trainer.optimizer.load_state_dict(copy.deepcopy(state.optimizer))
    trainer.generator.set_state(state.generator)


@dataclass
class Session:
    """What a bank keeps between rounds: its trainer, and which rounds and versions it has handled."""

    trainer: LocalTrainer
    evaluator: nn.Module
    graph: GraphTensors
    num_parameters: int
    done: set[tuple[int, str, str]] = field(default_factory=set)  # (round, nonce, stage)
    reported: set[int] = field(default_factory=set)
    snapshots: dict[tuple[int, str], TrainerState] = field(default_factory=dict)  # (base version, stage)
    uploads: dict[tuple[int, str, str], list[Upload]] = field(default_factory=dict)  # (round, nonce, stage)
    released: dict[tuple[int, int], dict[str, torch.Tensor]] = field(default_factory=dict)


def stage_key(view: RoundResponse) -> tuple[int, str, str]:
    """What a bank does once: one stage of one attempt (nonce) of a round."""
    return (view.round, view.nonce, view.stage or "")
