"""Federated methods, one module each, behind the interface of ``base.py``; :func:`build_method` picks one."""

from __future__ import annotations

from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.methods.base import FederatedMethod
from fedgl_secure.methods.fed2gnn import Fed2GNN, FedAvgFull
from fedgl_secure.methods.fed2gnn import prepare_clients as prepare_clients
from fedgl_secure.methods.fedavg import FedAvg
from fedgl_secure.methods.fedgl import FedGL
from fedgl_secure.methods.fgcl import FGCL, FedGLContrastive
from fedgl_secure.methods.gap import GAP
from fedgl_secure.methods.graphfl import GraphFL


def build_method(config: ExperimentConfig) -> FederatedMethod:
    """The federated method for ``config.method`` (baselines are not federated methods)."""
    if config.method == "federated":
        return FedAvg(config)
    if config.method == "fed2gnn":
        return Fed2GNN(config)
    if config.method == "fedavg-full":
        return FedAvgFull(config)
    if config.method == "fgcl":
        return FGCL(config)
    if config.method in ("fedgl", "fedgl-no-gpg", "fedgl-no-gpl"):
        return FedGLContrastive(config) if config.fgcl.enabled else FedGL(config)
    if config.method == "graphfl":
        return GraphFL(config)
    if config.method == "gap":
        return GAP(config)
    raise ValueError(f"{config.method!r} is a baseline, not a federated method")
