"""The one registry of federated methods: name → implementation and what the method is (DESIGN §2).

Every layer that must know something about a method — the configuration (which names exist, which
sections a method reads), the CLI (its choices), the privacy checks (which units of privacy a method can
run under), the simulation and the consortium services (which set-up phases run before round 1) — reads
it here, from the method's :class:`MethodSpec`, instead of comparing ``config.method`` with names.

A set-up phase (:class:`SetupPhase`) is the declaration of something a consortium runs before training round 1
because a method (:attr:`MethodSpec.phases`: Fed²GNN's neighbour exchange) or a unit of privacy
(``privacy/unit_phases.py``: the label unit's release with the consortium prior) asks for it; the aggregator and
the banks build its two sides from the references it names and call their hooks (``consortium/phases.py``).

It sits on the base floor, below the engine and the configuration, so it holds only data: an
implementation is named by ``"module:attribute"`` and imported when a method is built (:func:`load`), so
this module imports nothing of the package and a node that runs FedGL pays nothing for GAP's Opacus.

Methods outside this package register through the ``fedgl_secure.methods`` entry-point group: each entry
point loads a :class:`MethodSpec` (``[project.entry-points."fedgl_secure.methods"] toy =
"my_bank.toy:SPEC"``). Their names must not clash with the built-in ones.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "fedgl_secure.methods"


@dataclass(frozen=True)
class SetupPhase:
    """A consortium set-up phase: its name (unique within a run), what it does, and its aggregator's and its banks'
    sides as ``"module:attribute"`` references to subclasses of ``consortium.phases.AggregatorPhase`` and
    ``consortium.phases.BankPhase`` (None: that party has no part in it)."""

    name: str
    summary: str
    aggregator: str | None = None
    bank: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("aggregator", "bank"):
            reference = getattr(self, field_name)
            if reference is not None and ":" not in reference:
                raise ValueError(f"set-up phase {self.name!r}: {field_name} {reference!r} is not 'module:attribute'")


NEIGHBOUR_EXCHANGE = SetupPhase(
    "neighbour-exchange",
    "the banks swap per-node neighbour sums through the aggregator's relay and enrol their completed graphs "
    "(Fed²GNN's exchange)",
    aggregator="fedgl_secure.consortium.exchange_phase:ExchangeRelayPhase",
    bank="fedgl_secure.consortium.exchange_phase:NeighbourExchange",
)
"""Fed²GNN's set-up phase, run before enrolment."""


_REFERENCE_FIELDS = (
    "implementation",
    "contrastive_implementation",
    "prepare_clients",
    "apply_mechanism_policy",
    "mechanism_releases",
    "check_mechanism_policy",
    "check_consortium_policy",
    "check_privacy",
)


@dataclass(frozen=True)
class MethodSpec:
    """What one method is. Field names say what a layer may ask; implementations are ``"module:attribute"``."""

    name: str
    summary: str
    implementation: str
    """The method's class (a ``methods.base.FederatedMethod``), or for a baseline the simulation's runner."""
    baseline: bool = False
    """Trains without a federation and releases nothing (centralized, local): the simulation runs it itself."""
    contrastive_implementation: str | None = None
    """The class built instead when ``fgcl.enabled`` adds FGCL's contrastive term to this method."""
    pseudo_labels: bool = False
    """Eq. 8's α applies: the method trains on the global pseudo labels."""
    pseudo_graph: bool = False
    """Eq. 9's β applies: the method fuses the global pseudo graph into its clients' graphs."""
    own_model: bool = False
    """Builds its own model from its own config section; ``training.backbone`` would be ignored, so it is refused."""
    self_training: bool = False
    """Can add self-trained labels (``self_training.per_class``)."""
    prepare_clients: str | None = None
    """``(config, dataset, clients) -> clients``: rebuilds the clients before round 1 in the simulation."""
    phases: tuple[SetupPhase, ...] = ()
    """Consortium set-up phases the method declares, run before training round 1 (``consortium/phases.py``)."""
    dp_units: tuple[str, ...] | None = None
    """The units of privacy (``dp.unit``) it may run under when a policy has DP; None: any."""
    dp_units_reason: str = ""
    """Why other units would not hold (the refusal's message)."""
    own_mechanism: str | None = None
    """A ``dp.node_mechanism`` that runs inside the method (GAP, the class sums): the method carries its DP."""
    apply_mechanism_policy: str | None = None
    """``(config, policy) -> config``: the settings the own mechanism's policy fixes (ε, δ, rounds)."""
    mechanism_releases: str | None = None
    """``config -> (channels, releases_of_round)``: the ledger channels of the own mechanism's releases."""
    check_mechanism_policy: str | None = None
    """``(policy, config) -> None``: refuses a run whose method or settings differ from what a policy naming
    :attr:`own_mechanism` accounts for; run for every policy that names it, whatever the method."""
    check_consortium_policy: str | None = None
    """``(policy) -> None``: what a consortium (not the simulation) refuses of a policy naming :attr:`own_mechanism`."""
    check_privacy: str | None = None
    """``(config, policy | None) -> None``: the method's own refusals of a run's privacy set-up."""

    def __post_init__(self) -> None:
        unknown = [phase for phase in self.phases if not isinstance(phase, SetupPhase)]
        if unknown:
            raise ValueError(f"method {self.name!r}: unknown set-up phases {unknown}; declare each as a SetupPhase")
        for field_name in _REFERENCE_FIELDS:
            reference = getattr(self, field_name)
            if reference is not None and ":" not in reference:
                raise ValueError(f"method {self.name!r}: {field_name} {reference!r} is not 'module:attribute'")


_METHODS = "fedgl_secure.methods"
_FEDGL = f"{_METHODS}.fedgl:FedGL"
_CONTRASTIVE_FEDGL = f"{_METHODS}.fgcl:FedGLContrastive"
_EXCHANGE_REASON = (
    "sends other banks per-node neighbour sums (features and counts) from its true graph before round 1, which "
    "no DP channel covers"
)

BUILT_IN: tuple[MethodSpec, ...] = (
    MethodSpec(
        "fedgl",
        "FedGL: global pseudo labels and pseudo graph",
        _FEDGL,
        contrastive_implementation=_CONTRASTIVE_FEDGL,
        pseudo_labels=True,
        pseudo_graph=True,
    ),
    MethodSpec("federated", "FedAvg, no self-supervision", f"{_METHODS}.fedavg:FedAvg", self_training=True),
    MethodSpec(
        "fedgl-no-gpg",
        "FedGL without the global pseudo graph (β = 0)",
        _FEDGL,
        contrastive_implementation=_CONTRASTIVE_FEDGL,
        pseudo_labels=True,
    ),
    MethodSpec(
        "fedgl-no-gpl",
        "FedGL without the global pseudo labels (α = 0)",
        _FEDGL,
        contrastive_implementation=_CONTRASTIVE_FEDGL,
        pseudo_graph=True,
    ),
    MethodSpec(
        "centralized",
        "one model on the merged client graph (baseline)",
        "fedgl_secure.simulation.baselines:run_centralized",
        baseline=True,
    ),
    MethodSpec(
        "local",
        "each client alone (baseline)",
        "fedgl_secure.simulation.baselines:run_local",
        baseline=True,
    ),
    MethodSpec("fgcl", "FGCL: federated graph contrastive learning", f"{_METHODS}.fgcl:FGCL"),
    MethodSpec(
        "fed2gnn",
        "Fed²GNN: FedAvg on graphs completed by the banks' neighbour exchange",
        f"{_METHODS}.fed2gnn:Fed2GNN",
        prepare_clients=f"{_METHODS}.fed2gnn:prepare_clients",
        phases=(NEIGHBOUR_EXCHANGE,),
        dp_units=("label",),
        dp_units_reason=_EXCHANGE_REASON,
    ),
    MethodSpec(
        "fedavg-full",
        "FedAvg on the oracle halo of every client (Fed²GNN's upper bound)",
        f"{_METHODS}.fed2gnn:FedAvgFull",
        prepare_clients=f"{_METHODS}.fed2gnn:prepare_clients",
        dp_units=("label",),
        dp_units_reason=_EXCHANGE_REASON,
    ),
    MethodSpec(
        "graphfl",
        "GraphFL: meta-learned FedAvg with self-training",
        f"{_METHODS}.graphfl:GraphFL",
        own_model=True,
        self_training=True,
    ),
    MethodSpec(
        "gap",
        "GAP: node-level DP by aggregation perturbation",
        f"{_METHODS}.gap:GAP",
        own_model=True,
        own_mechanism="gap",
        apply_mechanism_policy=f"{_METHODS}.gap:apply_gap_policy",
        mechanism_releases=f"{_METHODS}.gap:gap_releases",
        check_mechanism_policy=f"{_METHODS}.gap:check_gap_policy",
    ),
    MethodSpec(
        "centroids",
        "private class centroids from one round of noisy class sums",
        f"{_METHODS}.centroids:PrivateCentroids",
        own_model=True,
        own_mechanism="centroids",
        apply_mechanism_policy=f"{_METHODS}.centroids:apply_centroids_policy",
        mechanism_releases=f"{_METHODS}.centroids:centroids_releases",
        check_consortium_policy=f"{_METHODS}.centroids:check_consortium_policy",
        check_privacy=f"{_METHODS}.centroids:check_privacy",
    ),
)


def method_specs() -> dict[str, MethodSpec]:
    """Every method by name: the built-in ones, then those installed through the entry-point group."""
    specs = {spec.name: spec for spec in BUILT_IN}
    for spec in _installed_specs(tuple(sys.path)):
        if spec.name in specs:
            raise ValueError(f"entry point {ENTRY_POINT_GROUP}: method name {spec.name!r} is already registered")
        specs[spec.name] = spec
    return specs


def method_names() -> tuple[str, ...]:
    return tuple(method_specs())


def method_spec(name: str) -> MethodSpec:
    """The spec of method ``name``; an unknown name is a ``KeyError`` that lists the known ones."""
    specs = method_specs()
    if name not in specs:
        raise KeyError(f"unknown method {name!r}; choose from {', '.join(specs)}")
    return specs[name]


def in_method_mechanisms() -> tuple[str, ...]:
    """Every ``dp.node_mechanism`` that runs inside its method (:attr:`MethodSpec.own_mechanism`: GAP's modules, the
    class sums): the policy reads them here, so a method that brings its own mechanism is named once."""
    return tuple(spec.own_mechanism for spec in method_specs().values() if spec.own_mechanism is not None)


def load(reference: str) -> Any:
    """The attribute a ``"module:attribute"`` reference names, importing its module."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


@functools.lru_cache(maxsize=4)
def _installed_specs(search_path: tuple[str, ...]) -> tuple[MethodSpec, ...]:
    # keyed by sys.path: scanning every installed distribution's metadata costs ~30 ms, and the configuration
    # asks on every validation; a distribution put on the path later (a plug-in, a test's) is a new key
    del search_path
    specs = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        spec = point.load()
        if not isinstance(spec, MethodSpec):
            raise TypeError(
                f"entry point {ENTRY_POINT_GROUP}:{point.name} loads {type(spec).__name__}, not a MethodSpec"
            )
        if spec.name != point.name:
            raise ValueError(f"entry point {ENTRY_POINT_GROUP}:{point.name} registers a spec named {spec.name!r}")
        specs.append(spec)
    return tuple(specs)
