"""Where the banks' local work of a simulated federation runs: in this process, or on Ray actors.

An executor holds the banks' side of a simulation — each bank's graph, its :class:`LocalTrainer` and the client
side of the method — and answers the round loop (``experiment.py``) two questions: each participant's pre-weighted
terms of a stage (:data:`~fedgl_secure.engine.round_pipeline.Contribute`), and each bank's local goal with the best
round's model. The server side — the sum, the method's update, the global model's evaluation on the merged graph,
early stopping — stays with the caller, in this process, whichever executor runs.

* ``in-process`` (the default): every bank's trainer in this process, one bank after the other; the simulation as
  it always ran.
* ``ray``: the banks spread over a few Ray actors (``ray_executor.py``), each holding its banks' graphs, trainers
  and its own method object, built from the run's config and seed as here, so the random streams and the run
  record are the same. Ray is imported only when chosen.

Under ``--secure`` each bank's terms are encrypted in its actor (``BankUpload.encryption``,
:mod:`fedgl_secure.crypto.bank_encryption`): ciphertexts, not terms, reach this process, which signs the receipts
with the banks' keys (the simulation keeps every bank's keys here, as its key ceremony runs here), checks, adds and
has them decrypted. Under a privacy policy (the DP step, DP-SGD, a node mechanism inside the method) the Ray
executor refuses to run: those steps are taken in this process today, and running them here while the rest of a
bank's work runs on its actor would misplace a bank's protection (:func:`check_executor`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import SplitAccuracy, evaluate_model
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import initial_parameters, local_contributions
from fedgl_secure.engine.self_training import self_trained_graphs
from fedgl_secure.errors import ConfigError
from fedgl_secure.tomlio import format_validation_error

if TYPE_CHECKING:
    from torch import nn

    from fedgl_secure.engine.round_pipeline import BankUpload
    from fedgl_secure.methods.base import Broadcast


class ExecutorSettings(BaseModel):
    """Which executor runs the banks' local work (``simulate --executor``, ``--ray-address``).

    Not part of the run's :class:`ExperimentConfig`: an executor does not change a run's results, so the run
    record and ``reproduce``'s stored runs are the same whichever ran them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    kind: Literal["in-process", "ray"] = "in-process"
    address: str | None = None
    """An existing Ray cluster (``ray://host:10001``, ``host:6379``); None: ``$RAY_ADDRESS``, else a local Ray
    started for the run and stopped after it."""
    actors: int | None = Field(default=None, ge=1)
    """Ray actors the banks are spread over, one CPU each; None: one per CPU of the cluster, at most one per bank."""

    @model_validator(mode="after")
    def _ray_options_with_ray(self) -> ExecutorSettings:
        if self.kind != "ray" and (self.address is not None or self.actors is not None):
            raise ValueError("address and actors are Ray's: they need kind = 'ray' (--executor ray)")
        return self


def executor_settings(kind: str = "in-process", address: str | None = None, actors: int | None = None):
    """:class:`ExecutorSettings` from the command line's flags, a bad value refused with a ConfigError naming it."""
    try:
        return ExecutorSettings(kind=kind, address=address, actors=actors)
    except ValidationError as error:
        raise ConfigError(f"--executor: {format_validation_error(error)}") from error


def check_executor(settings: ExecutorSettings, *, baseline: bool, privacy: bool, driver_encrypts: bool = False) -> None:
    """Refuse what the Ray executor cannot run as it promises (module doc): never a silent fall-back.
    ``driver_encrypts``: the summation would take the banks' terms in clear and protect them in this process
    (any other than the plain sum whose rounds cannot hand encryption to the banks)."""
    if settings.kind != "ray":
        return
    if driver_encrypts:
        raise ConfigError(
            "--executor ray: this summation protects the banks' terms in the driver process, so they would cross "
            "from the banks' actors in clear; use the secure summation (--secure), or --executor in-process"
        )
    if baseline:
        raise ConfigError(
            "--executor ray: the centralized and local baselines exchange nothing between banks and run in one "
            "process; choose a federated method, or --executor in-process"
        )
    if privacy:
        raise ConfigError(
            "--executor ray with a privacy policy: the DP step, DP-SGD and the label release run in the driver "
            "process, not in each bank's Ray actor, so a bank's protection would be applied outside the bank; "
            "drop --policy, or use --executor in-process"
        )


class BankExecutor(Protocol):
    """The banks' side of a simulation (module doc)."""

    num_banks: int

    def contribute(
        self, stage: str, participants: Sequence[int], broadcast: Broadcast, upload: BankUpload
    ) -> Iterable[tuple[int, object]]: ...

    def local_goal(self, best: Broadcast) -> list[SplitAccuracy]: ...

    def close(self) -> None: ...


def training_graphs(
    config: ExperimentConfig, graphs: list[GraphTensors], client_ids: list[int], num_classes: int
) -> list[GraphTensors]:
    """The graphs the banks train on: their own, with self-training's pseudo labels added where
    ``self_training.per_class`` asks for them (each bank from its own model, from W̄ of round 0)."""
    if config.self_training.per_class == 0:
        return graphs
    start = initial_parameters(config, graphs[0].features.shape[1], num_classes)
    return self_trained_graphs(config, graphs, start, client_ids)


def local_trainers(config: ExperimentConfig, method, graphs: list[GraphTensors], client_ids: list[int]):
    """One :class:`LocalTrainer` per bank: the method's own model where it brings one (e.g. GraphFL's SGC), else the
    engine's backbone; each trainer's dropout stream is its bank's, by number."""
    num_features = graphs[0].features.shape[1]
    own_models = [method.build_model(num_features, graph.num_classes) for graph in graphs]
    return [
        LocalTrainer(k, graph, config.training, config.seed, model)
        for k, graph, model in zip(client_ids, graphs, own_models, strict=True)
    ]


def local_goal(
    method, evaluator: nn.Module, graphs: Iterable[GraphTensors], best: Broadcast, config: ExperimentConfig
) -> list[SplitAccuracy]:
    """Each bank's own test nodes on its own graph, with the best round's W̄ (DESIGN §4's local goal)."""
    evaluator.load_flat_parameters(best.weights)
    return [
        evaluate_model(evaluator, graph, method.evaluation_adjacency(graph, best), config.evaluation, val_ranking=False)
        for graph in graphs
    ]


class InProcessExecutor:
    """Every bank's trainer in this process, contributing one after the other as the summation asks."""

    def __init__(
        self,
        method,
        trainers: list[LocalTrainer],
        graphs: list[GraphTensors],
        evaluator: nn.Module,
        config: ExperimentConfig,
    ) -> None:
        self.num_banks = len(trainers)
        self.contribute = local_contributions(method, trainers)
        self._method, self._graphs, self._evaluator, self._config = method, graphs, evaluator, config

    def local_goal(self, best: Broadcast) -> list[SplitAccuracy]:
        return local_goal(self._method, self._evaluator, self._graphs, best, self._config)

    def close(self) -> None:
        """Nothing to release: the trainers go with this object."""
