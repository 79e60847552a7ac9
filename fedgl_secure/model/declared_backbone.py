"""A backbone a bank or user declares by import path: ``training.backbone = "package.module:ClassName"``.

Resolved with :mod:`importlib` when the model is first built (the start of a run, of a bank, of the aggregator),
and checked before any round: the module imports, the name is a ``torch.nn.Module`` class, it is constructible
as ``Class(num_features, hidden, num_classes, dropout)`` (the contract of
:mod:`fedgl_secure.model.pyg_adapter`), it has parameters to federate, and on a tiny graph of the consortium's
agreed feature width it returns finite ``N × num_classes`` logits (and ``N × d`` hidden rows). Each failure is a
:class:`~fedgl_secure.errors.ConfigError` naming ``training.backbone`` and the problem.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from fedgl_secure.errors import ConfigError
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.model.pyg_adapter import PyGBackbone
from fedgl_secure.model.sparse import SparseOperator

DECLARED_BACKBONE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""``package.module:ClassName``: dotted module path, a colon, a class name."""
FIELD = "training.backbone"
_CHECK_NODES = 5


def declaration_error(spec: str, problem: str) -> ConfigError:
    return ConfigError(f"invalid configuration: {FIELD}: {spec!r} {problem}")


def resolve_backbone_class(spec: str) -> type[nn.Module]:
    """The class ``spec`` (``package.module:ClassName``) names, imported."""
    if not DECLARED_BACKBONE.fullmatch(spec):
        raise declaration_error(spec, "is not of the form 'package.module:ClassName'")
    module_name, class_name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise declaration_error(spec, f"cannot be imported: {error}") from error
    cls = getattr(module, class_name, None)
    if cls is None:
        raise declaration_error(spec, f"names nothing: module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise declaration_error(spec, f"is not a torch.nn.Module class (it is {type(cls).__name__} {cls!r})")
    return cls


def build_declared_backbone(spec: str, num_features: int, hidden: int, num_classes: int, dropout: float) -> PyGBackbone:
    """``Class(num_features, hidden, num_classes, dropout)`` behind the adapter, checked on a tiny graph.

    Constructed from a fixed seed inside a forked RNG state: every party builds the same module without moving
    torch's global generator (the engine then draws W̄ of round 0 from the run's "init" stream).
    """
    cls = resolve_backbone_class(spec)
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(0)
        try:
            model = cls(num_features, hidden, num_classes, dropout)
        except Exception as error:
            raise declaration_error(
                spec,
                f"cannot be constructed as {cls.__name__}(num_features={num_features}, hidden={hidden}, "
                f"num_classes={num_classes}, dropout={dropout}): {type(error).__name__}: {error}",
            ) from error
    backbone = PyGBackbone(model)
    check_agreed_shapes(backbone, spec, num_features, num_classes)
    return backbone


def tiny_graph(num_features: int) -> tuple[torch.Tensor, SparseOperator]:
    """Features and Â of a 5-node graph (a path with a chord): the check's input."""
    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [0, 2]])
    adjacency = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(_CHECK_NODES,) * 2)
    features = torch.rand(_CHECK_NODES, num_features, generator=torch.Generator().manual_seed(0))
    return features, SparseOperator.from_scipy(gcn_normalize(adjacency + adjacency.T))


def check_agreed_shapes(backbone: PyGBackbone, spec: str, num_features: int, num_classes: int) -> None:
    """One eval-mode forward pass on :func:`tiny_graph`: finite ``N × num_classes`` logits and ``N``-row hidden."""
    if not list(backbone.parameters()):
        raise declaration_error(spec, "has no parameters: there is nothing to train or federate")
    features, adjacency = tiny_graph(num_features)
    backbone.eval()
    try:
        with torch.no_grad():
            output = backbone(features, adjacency)
    except Exception as error:
        raise declaration_error(
            spec,
            f"failed on a {_CHECK_NODES}-node graph with {num_features} features: forward(x, edge_index, "
            f"edge_weight) raised {type(error).__name__}: {error}",
        ) from error
    finally:
        backbone.train()
    if output.logits.shape != (_CHECK_NODES, num_classes):
        raise declaration_error(
            spec,
            f"returns logits of shape {tuple(output.logits.shape)} on a {_CHECK_NODES}-node graph; the consortium "
            f"agreed on {num_classes} classes, so ({_CHECK_NODES}, {num_classes}) is needed",
        )
    if output.hidden.ndim != 2 or output.hidden.shape[0] != _CHECK_NODES:
        raise declaration_error(
            spec, f"returns a hidden layer of shape {tuple(output.hidden.shape)}; one row per node is needed"
        )
    if not bool(torch.isfinite(output.logits).all()):
        raise declaration_error(spec, f"returns non-finite logits on a {_CHECK_NODES}-node graph")
