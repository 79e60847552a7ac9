"""Federated methods, one module each, behind the interface of ``base.py``; :func:`build_method` picks one.

Each method's module is imported when it is built, not with this package: ``methods.base`` (the kind names
every layer reads) must stay cheap, and a node that runs FedGL should not pay for Opacus (GAP) or the
Fed²GNN decoder at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
