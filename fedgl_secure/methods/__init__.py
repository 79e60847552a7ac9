"""Federated methods, one module each, behind the interface of ``base.py``; :func:`build_method` picks one.

Each method's module is imported when it is built, not with this package: ``methods.base`` (the kind names
every layer reads) must stay cheap, and a node that runs FedGL should not pay for Opacus (GAP) or the
Fed²GNN decoder at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from fedgl_secure.engine.config import NEIGHBOUR_EXCHANGE_METHODS

if TYPE_CHECKING:
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.methods.base import FederatedMethod

METHOD_CLASSES = {
    "federated": ("fedavg", "FedAvg"),
    "fed2gnn": ("fed2gnn", "Fed2GNN"),
    "fedavg-full": ("fed2gnn", "FedAvgFull"),
    "fgcl": ("fgcl", "FGCL"),
    "fedgl": ("fedgl", "FedGL"),
    "fedgl-no-gpg": ("fedgl", "FedGL"),
    "fedgl-no-gpl": ("fedgl", "FedGL"),
    "graphfl": ("graphfl", "GraphFL"),
    "gap": ("gap", "GAP"),
    "centroids": ("centroids", "PrivateCentroids"),
}
"""``ExperimentConfig.method`` → (module under ``fedgl_secure.methods``, class). Baselines are not here."""


IN_METHOD_MECHANISMS = {
    "gap": ("gap", "apply_gap_policy", "gap_releases"),
    "centroids": ("centroids", "apply_centroids_policy", "centroids_releases"),
}
"""``dp.node_mechanism`` values that run inside a method → (module, its policy function, its releases function)."""


class InMethodMechanism(NamedTuple):
    """A node-unit mechanism that runs inside its method: ``apply_policy(config, policy)`` puts the policy's
    settings into the method's config (refusing other methods); ``releases(config)`` gives the ledger channels of
    the method's own releases and ``releases_of_round(round)`` (what each round releases, for every bank)."""

    apply_policy: Callable
    releases: Callable


def in_method_mechanism(policy) -> InMethodMechanism | None:
    """The mechanism ``policy.dp.node_mechanism`` names, if it runs inside a method (GAP, class sums); else None:
    the engine's per-upload DP step applies instead."""
    entry = IN_METHOD_MECHANISMS.get(policy.dp.node_mechanism)
    if entry is None:
        return None
    module, apply_policy, releases = entry
    loaded = importlib.import_module(f"fedgl_secure.methods.{module}")
    return InMethodMechanism(getattr(loaded, apply_policy), getattr(loaded, releases))


def apply_in_method_policy(config: ExperimentConfig, policy) -> ExperimentConfig:
    """``config`` with the settings an in-method node mechanism's policy fixes (its ε, δ, rounds), or as it is."""
    mechanism = in_method_mechanism(policy)
    return config if mechanism is None else mechanism.apply_policy(config, policy)


def check_method_privacy(config: ExperimentConfig, policy) -> None:
    """A method's own refusals of a run's privacy set-up (``policy`` may be None): the module-level
    ``check_privacy(config, policy)`` of the method's module, where it has one (the class sums refuse central noise
    that no key authority would add)."""
    if config.method not in METHOD_CLASSES:
        return
    module, _ = METHOD_CLASSES[config.method]
    check = getattr(importlib.import_module(f"fedgl_secure.methods.{module}"), "check_privacy", None)
    if check is not None:
        check(config, policy)


def _method_class(module: str, name: str) -> type:
    return getattr(importlib.import_module(f"fedgl_secure.methods.{module}"), name)


def build_method(config: ExperimentConfig) -> FederatedMethod:
    """The federated method for ``config.method`` (baselines are not federated methods)."""
    if config.method not in METHOD_CLASSES:
        raise ValueError(f"{config.method!r} is a baseline, not a federated method")
    module, name = METHOD_CLASSES[config.method]
    if module == "fedgl" and config.fgcl.enabled:  # FedGL with FGCL's contrastive term
        module, name = "fgcl", "FedGLContrastive"
    return _method_class(module, name)(config)


def prepare_clients(config: ExperimentConfig, dataset: GraphDataset, clients: list[GraphDataset]) -> list[GraphDataset]:
    """The clients a method trains on (see :func:`fedgl_secure.methods.fed2gnn.prepare_clients`)."""
    if config.method not in NEIGHBOUR_EXCHANGE_METHODS:  # the others need not import Fed²GNN's module
        return clients
    from fedgl_secure.methods.fed2gnn import prepare_clients as fed2gnn_clients

    return fed2gnn_clients(config, dataset, clients)
