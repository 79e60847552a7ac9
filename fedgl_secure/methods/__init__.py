"""Federated methods, one module each, behind the interface of ``base.py``; :func:`build_method` builds the one
the registry (``fedgl_secure/method_registry.py``) names.

Each method's module is imported when it is built, not with this package: ``methods.base`` (the kind names
every layer reads) must stay cheap, and a node that runs FedGL should not pay for Opacus (GAP) or the
Fed²GNN decoder at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from fedgl_secure.method_registry import load, method_spec, method_specs

if TYPE_CHECKING:
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.method_registry import MethodSpec
    from fedgl_secure.methods.base import FederatedMethod


class InMethodMechanism(NamedTuple):
    """A node-unit mechanism that runs inside its method: ``apply_policy(config, policy)`` puts the policy's
    settings into the method's config (refusing other methods); ``releases(config)`` gives the ledger channels of
    the method's own releases and ``releases_of_round(round)`` (what each round releases, for every bank)."""

    apply_policy: Callable
    releases: Callable


def mechanism_owner(node_mechanism: str) -> MethodSpec | None:
    """The method whose own release ``dp.node_mechanism`` names (GAP, the class sums), if one does."""
    return next((spec for spec in method_specs().values() if spec.own_mechanism == node_mechanism), None)


def in_method_mechanism(policy) -> InMethodMechanism | None:
    """The mechanism ``policy.dp.node_mechanism`` names, if it runs inside a method (GAP, class sums); else None:
    the engine's per-upload DP step applies instead."""
    owner = mechanism_owner(policy.dp.node_mechanism)
    if owner is None:
        return None
    return InMethodMechanism(load(owner.apply_mechanism_policy), load(owner.mechanism_releases))


def apply_in_method_policy(config: ExperimentConfig, policy) -> ExperimentConfig:
    """``config`` with the settings an in-method node mechanism's policy fixes (its ε, δ, rounds), or as it is."""
    mechanism = in_method_mechanism(policy)
    return config if mechanism is None else mechanism.apply_policy(config, policy)


def check_method_privacy(config: ExperimentConfig, policy) -> None:
    """A method's own refusals of a run's privacy set-up (``policy`` may be None), where its spec declares some
    (the class sums refuse central noise that no key authority would add)."""
    spec = method_spec(config.method)
    if spec.check_privacy is not None:
        load(spec.check_privacy)(config, policy)


def build_method(config: ExperimentConfig) -> FederatedMethod:
    """The federated method for ``config.method`` (baselines are not federated methods)."""
    spec = method_spec(config.method)
    if spec.baseline:
        raise ValueError(f"{config.method!r} is a baseline, not a federated method")
    if config.fgcl.enabled and spec.contrastive_implementation is not None:  # with FGCL's contrastive term
        return load(spec.contrastive_implementation)(config)
    return load(spec.implementation)(config)


def prepare_clients(config: ExperimentConfig, dataset: GraphDataset, clients: list[GraphDataset]) -> list[GraphDataset]:
    """The clients a method trains on: rebuilt before round 1 where its spec declares a set-up
    (:func:`fedgl_secure.methods.fed2gnn.prepare_clients`), else as they are."""
    spec = method_spec(config.method)
    return clients if spec.prepare_clients is None else load(spec.prepare_clients)(config, dataset, clients)
