"""The Ray executor: a simulation's banks on a few Ray actors, the server side in the driver.

Banks are spread round-robin (bank k on actor k mod A) over A actors of one CPU each — by default one per CPU of
the cluster: a hundred banks as a hundred processes, each importing torch, would need tens of GB. Each actor
(:class:`BankShard`) builds its banks' graphs, trainers and its own method object from the run's config and seed
as the in-process executor does, so every random stream — a bank's dropout, self-training, GraphFL's
support/query split — is the same and so is the run record (``tests/test_ray_executor.py``).

A stage of a round: the driver puts the broadcast into Ray's object store once (``ray.put``; the server-side
diagnostics it carries are left out, a bank never receives them), each actor fetches it once, then one actor call
per participant returns that bank's pre-weighted terms; the driver takes them in the participants' order as they
arrive and hands each to the summation, so it sums while the actors still train. Ray runs the calls one actor
receives in the order they were sent. The local goal is evaluated in the actors, with the best round's model.

Ray comes in through :func:`ray_session`: the Ray this process is already connected to (e.g. a reproduction's, for
all its runs), else the cluster at ``--ray-address`` / ``$RAY_ADDRESS``, else a local Ray started now and stopped
when the run ends.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import ray
import torch

from fedgl_secure.crypto.bank_encryption import EncryptedTerms
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import SplitAccuracy
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import BankUpload
from fedgl_secure.errors import ConfigError, FedGLError
from fedgl_secure.log import get_logger
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import Broadcast, method_model
from fedgl_secure.simulation.executors import ExecutorSettings, local_goal, local_trainers, training_graphs
from fedgl_secure.simulation.experiment import resolve_device

LOCAL_START_ATTEMPTS = 3


@contextmanager
def ray_session(settings: ExecutorSettings) -> Iterator[None]:
    """Connected to Ray for the block (module doc); a Ray started here is stopped at its end."""
    if ray.is_initialized():
        yield
        return
    address = settings.address or os.environ.get("RAY_ADDRESS") or "local"
    # a bank's simulation reports nothing to Ray's usage statistics service
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _start_ray(address)
    try:
        yield
    finally:
        ray.shutdown()


def _start_ray(address: str) -> None:
    """``ray.init`` at ``address``; a local start is tried again when it times out.

    Ray's raylet waits a fixed 15 s for its agents (Python processes) to report their ports, and the driver 30 s for
    the raylet: on a loaded host the agents' imports can take longer (seen on the shared 2-core host at load 24).
    A second start finds their modules in the page cache."""
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            return
        except (ConnectionError, ValueError) as error:
            raise ConfigError(f"--ray-address {address}: no Ray cluster to connect to there ({error})") from error
        except Exception as error:  # Ray raises a bare Exception when its node does not come up in time
            ray.shutdown()  # the processes of the failed start
            if address != "local" or "timed out during startup" not in str(error):
                raise
            get_logger(executor="ray").warning("ray.start_timed_out", attempt=attempt, of=LOCAL_START_ATTEMPTS)
    raise FedGLError(
        f"a local Ray did not start in {LOCAL_START_ATTEMPTS} attempts (its agents did not report in time; the host "
        "is too loaded): start one with `ray start --head` and pass --ray-address, or use --executor in-process"
    )


def bank_view(broadcast: Broadcast) -> Broadcast:
    """The broadcast as a bank receives it: without the server-side fused predictions."""
    return dataclasses.replace(broadcast, fused_predictions=None)


def fetch(refs):
    """``ray.get``, with an error of this package raised in an actor re-raised as itself (the CLI's one line)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, FedGLError):
            raise error.cause from None
        raise


class BankShard:
    """One actor's banks: their graphs, trainers, and the client side of the method (module doc)."""

    def __init__(
        self,
        config: dict,
        banks: list[tuple[int, GraphDataset, np.ndarray]],
        num_global_nodes: int,
        num_classes: int,
    ) -> None:
        # Ray hands numpy arrays over read-only, straight from its object store; the graphs are built on copies
        # of their own, as torch would otherwise share (and could write to) memory it may not write to
        banks = copy.deepcopy(banks)
        self.config = config = ExperimentConfig.model_validate(config)
        torch.manual_seed(config.seed)  # as the driver pins it: nothing should draw from it
        device = resolve_device(config.device)
        ids = [k for k, _, _ in banks]
        normalize = config.training.normalize_features
        self.graphs = {
            k: GraphTensors.from_graph(graph, positions, num_global_nodes, device, normalize)
            for k, graph, positions in banks
        }
        self.method = build_method(config)
        trained_on = training_graphs(config, [self.graphs[k] for k in ids], ids, num_classes)
        self.trainers = dict(zip(ids, local_trainers(config, self.method, trained_on, ids), strict=True))
        num_features = trained_on[0].features.shape[1]
        training = config.training
        self.evaluator = method_model(self.method, num_features, training.hidden, num_classes, 0.0).to(device)
        self.broadcast: Broadcast | None = None
        self.contexts: dict[str, object] = {}  # public CKKS contexts by fingerprint, loaded once (secure rounds)

    def ready(self) -> tuple[int, list[int]]:
        """This actor's process id and the banks it holds (once its set-up is done)."""
        return os.getpid(), sorted(self.trainers)

    def receive(self, broadcast: Broadcast) -> None:
        """The broadcast the next contributions start from."""
        self.broadcast = broadcast

    def contribution(self, stage: str, k: int, upload: BankUpload) -> dict[str, torch.Tensor] | EncryptedTerms:
        """Bank ``k``'s terms of ``stage`` from the last broadcast received, as it uploads them: normalised, and
        encrypted here when the round is (so they leave this process as ciphertexts only)."""
        terms = upload.terms(self.method.stage_contribution(stage, self.trainers[k], self.broadcast))
        if upload.encryption is None:
            return terms
        return upload.encryption.encrypt(upload.encryption.load_context(self.contexts), terms)

    def local_goal(self, best: Broadcast) -> dict[int, SplitAccuracy]:
        """Each of this actor's banks' local goal with the best round's W̄."""
        ids = sorted(self.graphs)
        scores = local_goal(self.method, self.evaluator, [self.graphs[k] for k in ids], best, self.config)
        return dict(zip(ids, scores, strict=True))


class RayExecutor:
    """The banks of ``clients`` on Ray actors (module doc); :meth:`close` ends them and a Ray started for them.
    ``placement``: each actor's process id → the banks it holds."""

    def __init__(
        self,
        config: ExperimentConfig,
        clients: Sequence[GraphDataset],
        positions: Sequence[np.ndarray],
        num_global_nodes: int,
        num_classes: int,
        settings: ExecutorSettings,
    ) -> None:
        self.num_banks = len(clients)
        self._session = ray_session(settings)
        self._session.__enter__()
        try:
            self._actors = self._start(config, clients, positions, num_global_nodes, num_classes, settings)
        except BaseException:
            self._session.__exit__(None, None, None)
            raise
        self._actor_of = {k: self._actors[k % len(self._actors)] for k in range(self.num_banks)}

    def _start(self, config, clients, positions, num_global_nodes, num_classes, settings) -> list:
        # the cluster's CPUs, not those free now: the actors of a run just ended are still being released
        cpus = int(ray.cluster_resources().get("CPU", 0))
        count = min(settings.actors or max(cpus, 1), self.num_banks)
        if count > cpus:
            raise ConfigError(
                f"--executor ray: {count} actors of one CPU each, but the Ray cluster has {cpus} CPUs; "
                "ask for fewer actors"
            )
        gpus = 0.0
        if resolve_device(config.device).type == "cuda":
            offered = ray.cluster_resources().get("GPU", 0.0)
            if offered <= 0:
                raise ConfigError(
                    f"device = {config.device!r}: this process uses a GPU but the Ray cluster offers none to the "
                    "banks' actors; use --device cpu"
                )
            gpus = min(offered, 1.0) / count  # the actors share the GPU the driver's evaluation uses
        shard = ray.remote(num_cpus=1, num_gpus=gpus)(BankShard)
        settings_json = config.model_dump(mode="json")
        actors = [
            shard.remote(
                settings_json,
                [(k, clients[k], positions[k]) for k in range(a, self.num_banks, count)],
                num_global_nodes,
                num_classes,
            )
            for a in range(count)
        ]
        # a bank's set-up error surfaces here, as itself
        self.placement = dict(fetch([actor.ready.remote() for actor in actors]))
        get_logger(executor="ray").info("ray.actors_ready", banks=self.num_banks, placement=self.placement)
        return actors

    def contribute(
        self, stage: str, participants: Sequence[int], broadcast: Broadcast, upload: BankUpload
    ) -> Iterator[tuple[int, Mapping[str, torch.Tensor] | EncryptedTerms]]:
        """Each participant's terms of ``stage`` through ``upload`` (encrypted in its actor when the round is), in
        ``participants``' order, as its actor returns them."""
        shared = ray.put(bank_view(broadcast))
        for actor in self._actors:
            actor.receive.remote(shared)
        step = ray.put(upload)  # the public context of a secure round travels once a stage, not once a bank
        pending = deque((k, self._actor_of[k].contribution.remote(stage, k, step)) for k in participants)
        while pending:
            k, ref = pending.popleft()  # dropped once fetched, so the object store can let it go
            yield k, fetch(ref)

    def local_goal(self, best: Broadcast) -> list[SplitAccuracy]:
        shared = ray.put(bank_view(best))
        scores: dict[int, SplitAccuracy] = {}
        for part in fetch([actor.local_goal.remote(shared) for actor in self._actors]):
            scores.update(part)
        return [scores[k] for k in range(self.num_banks)]

    def close(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        self._session.__exit__(None, None, None)
