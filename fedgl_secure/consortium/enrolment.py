"""Enrolment at the aggregator: each bank's pseudonym set and data dimensions, the union index over them, and the
upload shapes the index fixes.

:class:`UnionIndex` holds the banks enrolled so far (each enrolment kept in the store), the union index once the
round loop has built it (M and each bank's positions, in the order it enrolled its pseudonyms; the aggregator needs
only M), and then every kind's upload shape and the model's parameter count, computed once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from fedgl_secure.consortium.aggregator_store import AggregatorStore, Enrolment
from fedgl_secure.consortium.participant_choice import Participation
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.round_pipeline import method_initial_parameters
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.methods.base import FederatedMethod, stage_upload_kinds


class UnionIndex:
    """The banks' enrolments and the union index built from them (module doc)."""

    def __init__(
        self,
        *,
        banks: Sequence[str],
        config: ExperimentConfig,
        method: FederatedMethod,
        store: AggregatorStore,
        changed: threading.Condition,
        participation: Participation,
        log,
    ) -> None:
        self.banks = tuple(banks)
        self.config = config
        self.method = method
        self.store = store
        self.changed = changed  # the coordinator's: the round loop waits on it for the last enrolment
        self.participation = participation
        self.log = log
        self.enrolled: set[str] = set(store.enrolled_banks())  # kept by enrol(); the round loop waits on it
        self.index: tuple[int, dict[str, np.ndarray]] | None = store.index()
        self.upload_shapes: dict[str, tuple[int, ...]] | None = None  # fixed once the index exists
        self.num_parameters: int | None = None  # likewise

    def enrol(self, bank: str, num_features: int, num_classes: int, pseudonyms: Sequence[str]) -> None:
        """Record a bank's pseudonym set and data dimensions (idempotent for the same set)."""
        self.participation.bank_index(bank)
        if len(set(pseudonyms)) != len(pseudonyms) or not pseudonyms:
            raise ProtocolConflict("bad-enrolment", f"{bank}: pseudonyms must be non-empty and distinct")
        enrolment = Enrolment(bank, num_features, num_classes, tuple(pseudonyms))
        with self.changed:
            existing = self.store.enrolment(bank)
            if existing is not None:
                if existing != enrolment:
                    raise ProtocolConflict(
                        "enrolment-changed", f"{bank} enrolled before with other nodes or dimensions; it cannot change"
                    )
            else:
                if self.index is not None:
                    raise ProtocolConflict("enrolment-closed", "the union index is already built")
                for other in self.store.enrolments().values():
                    if (other.num_features, other.num_classes) != (num_features, num_classes):
                        raise ProtocolConflict(
                            "dimension-mismatch",
                            f"{bank} has {num_features} features/{num_classes} classes, {other.bank} has "
                            f"{other.num_features}/{other.num_classes}",
                        )
                self.store.enrol(enrolment)
                self.enrolled.add(bank)
                self.log.info("bank.enrolled", bank=bank, nodes=len(pseudonyms))
            self.participation.seen[bank] = time.monotonic()
            self.changed.notify_all()

    def index_for(self, bank: str) -> tuple[int, np.ndarray]:
        """(M, positions of this bank's pseudonyms in the union index, in the order it enrolled them)."""
        self.participation.bank_index(bank)
        if self.index is None:
            raise ProtocolConflict("not-ready", "the union index is built once every bank has enrolled")
        size, positions = self.index
        return size, positions[bank]

    def max_bank_nodes(self) -> int:
        """The largest bank's node count: the DP step's public ``w_max`` (node membership is public to the
        aggregator anyway; every bank gets the same number)."""
        if self.index is None:
            raise ProtocolConflict("not-ready", "the union index is built once every bank has enrolled")
        return max(int(p.size) for p in self.index[1].values())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every kind's upload shape, over all stages (computed once: they depend only on the index and the
        dimensions)."""
        if self.upload_shapes is None:
            size, _ = self.index
            first = self.store.enrolment(self.banks[0])
            initial = method_initial_parameters(self.method, self.config, first.num_features, first.num_classes)
            self.num_parameters = int(initial.numel())
            self.upload_shapes = self.method.upload_shapes(self.num_parameters, size, first.num_classes)
        return self.upload_shapes

    def stage_shapes(self, stage: str) -> dict[str, tuple[int, ...]]:
        """The upload shapes of ``stage``'s kinds (all of them for a single-stage method)."""
        shapes = self.shapes()
        return {kind: shapes[kind] for kind in stage_upload_kinds(self.method, stage)}
