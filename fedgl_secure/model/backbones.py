"""The engine's model, by name (``training.backbone``): GCN, GraphSAGE or DAGNN over the engine's own sparse
operator, or a declared model ``package.module:ClassName`` (a PyG model, e.g. those of
:mod:`fedgl_secure.model.pyg_backbones`, behind :class:`~fedgl_secure.model.pyg_adapter.PyGBackbone`); all
``FlatParameters``.

Every backbone takes ``(features, Â, generator)`` and returns logits and a hidden layer, so the trainer, the
evaluator and the (encrypted) FedAvg summation treat them alike; only the length of W_k differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedgl_secure.model.dagnn import DAGNN
from fedgl_secure.model.declared_backbone import build_declared_backbone
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.sage import GraphSAGE

if TYPE_CHECKING:
    from torch import nn

    from fedgl_secure.engine.config import TrainingConfig


def build_backbone(
    training: TrainingConfig, num_features: int, num_classes: int, dropout: float | None = None
) -> nn.Module:
    """``training.backbone`` with ``training.hidden`` (and ``training.dagnn_hops``); ``dropout`` defaults to
    ``training.dropout`` (an evaluator passes 0). A declared backbone is imported and checked against
    ``num_features`` and ``num_classes`` here (:func:`~fedgl_secure.model.declared_backbone.build_declared_backbone`).
    """
    dropout = training.dropout if dropout is None else dropout
    if ":" in training.backbone:
        return build_declared_backbone(training.backbone, num_features, training.hidden, num_classes, dropout)
    if training.backbone == "sage":
        return GraphSAGE(num_features, training.hidden, num_classes, dropout)
    if training.backbone == "dagnn":
        return DAGNN(num_features, training.hidden, num_classes, training.dagnn_hops, dropout)
    if training.backbone == "gcn":
        return GCN(num_features, training.hidden, num_classes, dropout)
    raise ValueError(
        f"training.backbone: unknown backbone {training.backbone!r}; choose gcn, sage, dagnn or "
        "'package.module:ClassName'"
    )
