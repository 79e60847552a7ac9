"""Any PyG model as the engine's backbone: the engine's operator handed over as ``edge_index`` + ``edge_weight``.

The engine passes every backbone its operator Â (Kipf's ``D̃^-1/2 (A + I) D̃^-1/2``, FedGL's fused
``Â' = Â + β · D̄^-1/2 Ā D̄^-1/2`` of Eq. 9, or Fed²GNN's grafted operator) as a
:class:`~fedgl_secure.model.sparse.SparseOperator`. :class:`PyGBackbone` wraps a model written the PyG way and
gives it that operator as an edge list, so FedGL's pseudo-graph fusion reaches a PyG model as edge weights.

The contract such a model meets (the built-ins of :mod:`fedgl_secure.model.pyg_backbones`, and a bank's own
``training.backbone = "package.module:ClassName"``, :mod:`fedgl_secure.model.declared_backbone`):

* constructed as ``Class(num_features, hidden, num_classes, dropout)``;
* ``forward(x, edge_index, edge_weight)``: ``x`` the dense ``N × F`` features, ``edge_index`` the ``2 × E`` entries
  of Â in PyG's order (row 0 the source j, row 1 the target i, so a sum of messages is ``Â x``), ``edge_weight``
  their values ``Â_ij``; returns the ``N × C`` logits, or ``(logits, hidden)`` — ``hidden`` is what FedGL uploads
  with ``embedding = "hidden"`` (the logits otherwise);
* the edges already carry the normalisation and the self-loops (``Â_ii = 1/d̃_i``): a layer must not normalise
  again nor add self-loops (``GCNConv(normalize=False)``, ``SimpleConv``), or it propagates over another operator;
* optionally ``first_layer_parameters()``, the parameters that get weight decay (Kipf decays only the first
  layer); without it every parameter does, as ``Adam(model.parameters(), weight_decay=…)`` in PyG's examples;
* ``reset_parameters()`` without arguments, as every PyG layer has, drawing from torch's global generator.

Torch's global generator is the one thing a PyG model draws from (``reset_parameters``, ``F.dropout``), while
each bank owns its random stream so that a consortium run reproduces a simulated one: the adapter seeds the global
generator from the caller's stream inside a forked RNG state (:func:`drawing_from`), and leaves it as it was.
Buffers (e.g. batch-norm statistics) stay with the bank; only parameters are federated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from fedgl_secure.model.gcn import FlatParameters, GCNOutput
from fedgl_secure.model.sparse import SparseOperator


def operator_edges(operator: SparseOperator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_weight)`` of the operator's stored entries, in PyG's source-to-target order.

    An entry ``S_ij`` (row i, column j) becomes the edge ``j → i`` with weight ``S_ij``: PyG sums the messages
    ``w · x_j`` arriving at i, which is row i of ``S @ x``; Eq. 9's fused operator is not symmetric, so the order
    matters.
    """
    matrix = operator.matrix
    targets = torch.repeat_interleave(
        torch.arange(matrix.shape[0], device=matrix.device),
        matrix.crow_indices().diff(),
        output_size=matrix.values().numel(),
    )
    return torch.stack([matrix.col_indices(), targets]), matrix.values()


@contextmanager
def drawing_from(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """Torch's global generator (CPU and, on a GPU, ``device``'s) seeded from ``generator`` inside the block and
    restored after it; without a generator the block draws from the global state as it is."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(cuda[0]):
                torch.cuda.manual_seed(seed)
        yield


def reset_module(module: nn.Module) -> None:
    """``module.reset_parameters()`` if it has one, else that of each child (recursively)."""
    if callable(getattr(module, "reset_parameters", None)):
        module.reset_parameters()
        return
    for child in module.children():
        reset_module(child)


class PyGBackbone(FlatParameters, nn.Module):
    """A PyG-style model (module docstring) behind the engine's backbone interface: ``forward(features, Â,
    generator)`` returning :class:`~fedgl_secure.model.gcn.GCNOutput`, flat parameters, and Kipf's weight-decay
    split where the model declares one.

    The edge list of Â and the dense features are built once per operator and feature matrix (the engine passes
    the same ones every epoch of a round) and kept, as :class:`~fedgl_secure.model.sage.GraphSAGE` keeps its mean
    aggregator.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._edges: tuple[SparseOperator, torch.Tensor, torch.Tensor] | None = None
        self._dense: tuple[SparseOperator, torch.Tensor] | None = None

    def reset_parameters(self, generator: torch.Generator) -> None:
        """The model's own initialisation (PyG's ``reset_parameters``), drawn from ``generator``."""
        device = next(self.model.parameters()).device
        with drawing_from(generator, device):
            reset_module(self.model)

    def first_layer_parameters(self) -> list[nn.Parameter]:
        """The model's ``first_layer_parameters()`` when it declares them, else every parameter."""
        declared = getattr(self.model, "first_layer_parameters", None)
        return list(declared()) if callable(declared) else list(self.model.parameters())

    def second_layer_parameters(self) -> list[nn.Parameter]:
        decayed = {id(parameter) for parameter in self.first_layer_parameters()}
        return [parameter for parameter in self.model.parameters() if id(parameter) not in decayed]

    def edges(self, adjacency: SparseOperator) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`operator_edges` of ``adjacency``, rebuilt only when a different operator is passed."""
        if self._edges is None or self._edges[0] is not adjacency:
            self._edges = (adjacency, *operator_edges(adjacency))
        return self._edges[1], self._edges[2]

    def dense_features(self, features: SparseOperator | torch.Tensor) -> torch.Tensor:
        """The ``N × F`` features as a dense tensor (PyG layers project dense ``x``)."""
        if not isinstance(features, SparseOperator):
            return features
        if self._dense is None or self._dense[0] is not features:
            self._dense = (features, features.to_dense())
        return self._dense[1]

    def forward(
        self,
        features: SparseOperator | torch.Tensor,
        adjacency: SparseOperator,
        generator: torch.Generator | None = None,
    ) -> GCNOutput:
        x = self.dense_features(features)
        edge_index, edge_weight = self.edges(adjacency)
        with drawing_from(generator if self.training else None, x.device):
            output = self.model(x, edge_index, edge_weight)
        if isinstance(output, torch.Tensor):
            return GCNOutput(logits=output, hidden=output)
        if not (isinstance(output, tuple | list) and len(output) == 2):
            raise TypeError(f"a PyG backbone returns logits or (logits, hidden), not {type(output).__name__}")
        return GCNOutput(logits=output[0], hidden=output[1])
