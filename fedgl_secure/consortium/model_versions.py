"""The model versions as the aggregator's rounds read them: each version's broadcast and each stage's, decoded
against the federation's shapes, the W̄ a round's weights are centred on, and the method's server update.

:class:`ModelVersions` holds the W̄ of the version rounds last started from, as the banks download it (the weights
sums of a round from that version are centred on it), and puts the method's server back in the state it had after
a version before a round from it starts.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.enrolment import UnionIndex
from fedgl_secure.crypto.centring import wire_reference
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.methods.base import Broadcast, FederatedMethod, load_server_state, stage_update
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import decode_broadcast


class ModelVersions:
    """The stored model versions, decoded for the round loop (module doc)."""

    def __init__(
        self, *, config: ExperimentConfig, method: FederatedMethod, store: AggregatorStore, index: UnionIndex
    ) -> None:
        self.config = config
        self.method = method
        self.store = store
        self.index = index
        # (version, its W̄ as banks download it): the weights sums of a round from that version are centred on it
        self.reference: tuple[int, np.ndarray] | None = None

    def model(self, version: int) -> bytes:
        data = self.store.model(version)
        if data is None:
            raise ProtocolConflict("unknown-version", f"model version {version} does not exist (yet)")
        return data

    def stage_model(self, round_number: int, stage: str) -> bytes:
        """The broadcast published after ``stage`` of round ``round_number`` (the next stage starts from it)."""
        data = self.store.stage_model(round_number, stage)
        if data is None:
            raise ProtocolConflict(
                "unknown-stage", f"round {round_number} has published no broadcast after stage {stage!r} (yet)"
            )
        return data

    def base_broadcast(self, version: int) -> Broadcast | None:
        """The broadcast of model ``version`` as the banks download it (float32), which a round's first stage
        starts from, with the method's server back in the state it had after that version
        (:func:`~fedgl_secure.methods.base.server_state`): a round retried from the same version, or resumed
        after a restart, starts where the simulation's would. None for a single-stage method: its
        ``server_update`` reads no earlier broadcast, so none is decoded (a large
        federation's pseudo graph is gigabytes)."""
        state = self.store.server_state(version)
        arrays = {} if state is None else encodings.decode_arrays(state)
        load_server_state(self.method, {name: torch.from_numpy(array) for name, array in arrays.items()})
        if len(self.method.stages) == 1:  # a single stage's server_update reads no earlier broadcast
            return None
        self.index.shapes()
        size, _ = self.index.index
        neighbors = self.config.self_supervision.neighbors
        return decode_broadcast(version, self.model(version), self.index.num_parameters, size, neighbors)

    def version_weights(self, version: int) -> np.ndarray:
        """W̄ of model ``version`` as the banks download it: what a round from it centres its weights on."""
        if self.reference is None or self.reference[0] != version:
            self.index.shapes()
            size, _ = self.index.index
            neighbors = self.config.self_supervision.neighbors
            broadcast = decode_broadcast(version, self.model(version), self.index.num_parameters, size, neighbors)
            self.reference = (version, wire_reference(broadcast.weights))
        return self.reference[1]

    def stage_update(
        self, stage: str, version: int, sums: Mapping[str, np.ndarray], broadcast: Broadcast | None
    ) -> Broadcast:
        """The method's server update after ``stage`` of the round from ``version`` (on its decrypted sums)."""
        shapes = self.index.shapes()
        tensors = {
            kind: torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(shapes[kind])
            for kind, values in sums.items()
        }
        return stage_update(self.method, stage, tensors, version + 1, broadcast)
