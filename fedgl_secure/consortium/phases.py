"""Set-up phases in a consortium: what the aggregator and the banks run before training round 1 because the run
declares it, never because they recognise a method or a policy setting.

A phase is declared as a :class:`~fedgl_secure.method_registry.SetupPhase` by the method
(``MethodSpec.phases``: Fed²GNN's neighbour exchange) or by a unit of privacy
(:func:`fedgl_secure.privacy.unit_phases.setup_phases`: the label unit's release with the consortium prior);
:func:`declared_phases` lists both. Each declaration names its two sides, built here from the parts of the node
that runs them (:class:`AggregatorParts`, :class:`BankParts`):

* an :class:`AggregatorPhase`, whose hooks the coordinator calls at fixed points: ``before_training`` once the
  union index exists (and before the first training round opens), ``upload_shapes`` for the upload body limit,
  ``serve_stage`` for the round stages it owns (``owned_stages``), and ``round_view`` / ``status`` for what the
  banks and the operators are told;
* a :class:`BankPhase`, whose hooks the bank calls: ``before_enrolment`` (it may replace the graph the bank enrols),
  ``release_labels`` (it may make the bank's one label release) and ``labels_in_progress``.

Every hook has a default that does nothing, so a phase implements only the points it runs at, and a new phase
(a new method's or a new unit's) touches its own modules and its declaration, not the aggregator or the bank.
A phase's own rounds take round numbers before training round 1, with base version :data:`SETUP_BASE_VERSION`,
and close as :data:`SETUP_ROUND_DONE`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fedgl_secure.errors import ConfigError
from fedgl_secure.method_registry import SetupPhase, load, method_spec
from fedgl_secure.privacy import unit_phases

if TYPE_CHECKING:
    import numpy as np
    import scipy.sparse as sp
    import tenseal as ts
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from fedgl_secure.consortium.aggregator_port import AggregatorPort
    from fedgl_secure.consortium.aggregator_store import AggregatorStore
    from fedgl_secure.consortium.bank_releases import BankReleases
    from fedgl_secure.consortium.enrolment import UnionIndex
    from fedgl_secure.consortium.participant_choice import Participation
    from fedgl_secure.consortium.round_stages import RoundStages
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.engine.graph_tensors import GraphTensors
    from fedgl_secure.policy.schema import Policy

SETUP_BASE_VERSION = -1  # a set-up phase's round's base version in the store: it comes before model version 0
SETUP_ROUND_DONE = "fitted"  # the status a set-up phase closes its own round with once its result is published


def declared_phases(config: ExperimentConfig, policy: Policy) -> tuple[SetupPhase, ...]:
    """The run's set-up phases: the method's, then its units of privacy's; names are unique."""
    phases = (*method_spec(config.method).phases, *unit_phases.setup_phases(policy))
    names = [phase.name for phase in phases]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"set-up phases {repeated} are declared twice (method {config.method!r} and the policy)")
    return phases


@dataclass(frozen=True)
class AggregatorParts:
    """What an aggregator-side phase may use: the federation, its configuration and the coordinator's parts."""

    federation: str
    config: ExperimentConfig
    policy: Policy
    banks: tuple[str, ...]
    signing_keys: Mapping[str, Ed25519PublicKey]
    broadcast_key: Ed25519PrivateKey
    store: AggregatorStore
    enrolment: UnionIndex
    participation: Participation
    stages: RoundStages
    changed: threading.Condition
    log: object


class AggregatorPhase:
    """The aggregator's side of a set-up phase (module doc); every hook's default does nothing."""

    owned_stages: tuple[str, ...] = ()
    """The round stages this phase runs under round numbers of its own; :meth:`serve_stage` serves their results."""

    def __init__(self, parts: AggregatorParts) -> None:
        self.parts = parts

    def before_training(self, stop: threading.Event) -> bool:
        """Run once every bank has enrolled and the union index exists, before training round 1 opens (again after a
        restart: resume where it stopped). False if ``stop`` was set first."""
        return True

    def upload_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the uploads this phase's rounds accept (the upload body limit reads them)."""
        return []

    def serve_stage(self, bank: str, round_number: int, stage: str, data: bytes) -> tuple[bytes, str]:
        """``data``, the result published after ``stage`` (one of :attr:`owned_stages`) of ``round_number``, as
        ``bank`` is served it, with its signature."""
        raise NotImplementedError(f"{type(self).__name__} declares stages {self.owned_stages} but serves none")

    def round_view(self) -> dict[str, object]:
        """Fields of the ``RoundView`` every bank is told once the union index exists (e.g. the label prior's
        fitted rounds)."""
        return {}

    def status(self) -> dict[str, object]:
        """Entries of the aggregator's status (e.g. the exchange's progress)."""
        return {}


@dataclass(frozen=True)
class BankParts:
    """What a bank-side phase may use: the bank's identity and keys, the aggregator and the bank's state directory;
    ``inputs``: what the node's wiring gives this phase (e.g. Fed²GNN's share of the exchange)."""

    name: str
    federation: str
    client_index: int
    config: ExperimentConfig
    policy: Policy
    aggregator: AggregatorPort
    context: ts.Context
    fingerprint: str
    signing_key: Ed25519PrivateKey
    broadcast_key: Ed25519PublicKey
    state_dir: Path | None
    poll_seconds: float
    log: object
    inputs: object = None


class BankPhase:
    """A bank's side of a set-up phase (module doc); every hook's default does nothing."""

    def __init__(self, parts: BankParts) -> None:
        self.parts = parts

    def before_enrolment(self, graph: GraphDataset, stop: threading.Event) -> GraphDataset:
        """The graph the bank enrols and trains on, from ``graph`` (its own, or the previous phase's result)."""
        return graph

    def release_labels(
        self, releases: BankReleases, graph: GraphTensors, adjacency: sp.spmatrix, stop: threading.Event
    ) -> np.ndarray | None:
        """The bank's one label release when this phase makes it (kept and recorded through ``releases``), on
        ``graph`` with its prepared ``adjacency``; None: the bank releases them alone, if at all."""
        return None

    def labels_in_progress(self) -> bool:
        """Whether a label release this phase makes is under way in the state directory (a restarted bank resumes
        it rather than finding a recorded release gone)."""
        return False


def aggregator_phases(phases: Sequence[SetupPhase], parts: AggregatorParts) -> dict[str, AggregatorPhase]:
    """The aggregator's side of every phase that has one, by phase name, in declaration order."""
    return {phase.name: _built(phase, phase.aggregator, AggregatorPhase, parts) for phase in phases if phase.aggregator}


def bank_phases(
    phases: Sequence[SetupPhase], parts: BankParts, inputs: Mapping[str, object] | None = None
) -> list[BankPhase]:
    """The bank's side of every phase that has one, in declaration order, each given its entry of ``inputs``; an
    input for a phase the run does not declare is refused (it would be silently unused)."""
    inputs = dict(inputs or {})
    unknown = sorted(set(inputs) - {phase.name for phase in phases})
    if unknown:
        raise ConfigError(
            f"{parts.name}: inputs for set-up phases {unknown}, which method {parts.config.method!r} and the policy "
            f"do not declare (declared: {[phase.name for phase in phases]})"
        )
    built = []
    for phase in phases:
        if phase.bank is not None:
            built.append(_built(phase, phase.bank, BankPhase, replace(parts, inputs=inputs.get(phase.name))))
    return built


def _built(phase: SetupPhase, reference: str, base: type, parts):
    implementation = load(reference)
    if not (isinstance(implementation, type) and issubclass(implementation, base)):
        raise TypeError(f"set-up phase {phase.name!r}: {reference} is not a {base.__name__}")
    return implementation(parts)
