"""The engine's backbones written with PyG layers, as declared backbones (``training.backbone =
"fedgl_secure.model.pyg_backbones:GCN"`` …) behind :class:`~fedgl_secure.model.pyg_adapter.PyGBackbone`.

Each computes what its counterpart over the engine's own sparse operator computes, on the same Â (or Eq. 9's
fused Â') handed over as ``edge_index`` + ``edge_weight``, and follows the declared-backbone contract
(``Class(num_features, hidden, num_classes, dropout)``, ``forward(x, edge_index, edge_weight)`` →
``(logits, hidden)``, module docstring of :mod:`fedgl_secure.model.pyg_adapter`):

* :class:`GCN` — ``H = Â σ(Â X W0 + b0) W1 + b1`` with ``GCNConv(normalize=False)`` (Â is already normalised);
* :class:`GraphSAGE` — the mean aggregator ``h'_i = W_self h_i + W_neigh Σ_j M_ij h_j + b`` with ``GraphConv``
  over the mean weights ``M`` read off Â (:func:`~fedgl_secure.model.sage.mean_weights`); PyG's ``SAGEConv``
  takes no edge weights, so it would drop Eq. 9's β-weighted pseudo edges and Fed²GNN's multiplicities;
* :class:`SGC` — ``H = Â^K X W + b`` (K = 2) with ``SimpleConv``; PyG's ``SGConv`` normalises the edges again;
* :class:`DAGNN` — ``out = Σ_k sigmoid(Â^k Z w + b) ⊙ Â^k Z``, ``Z = MLP(X)`` (Liu, Gao & Ji, KDD 2020), the hops
  by ``SimpleConv`` as in PyG's DAGNN example.

Dropout draws from the bank's stream through the adapter. On the input it is :class:`StoredEntryDropout`: bag-of-words
and TF-IDF features are mostly zeros, which stay zero under any mask, so only the stored (non-zero) entries draw —
``F.dropout``'s distribution at a fraction of its cost (``F.dropout`` draws N·F numbers, and Wiki's TF-IDF features
are 13.0 % non-zero, Cora's bag of words 1.27 %: the datasets' README), as the engine's own backbones drop the
stored values of their sparse features. On the hidden layer it is PyG's ``F.dropout``. The masks differ from the
engine's (another generator), so the two agree exactly in evaluation and in distribution in training.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, GraphConv, Linear, SimpleConv

from fedgl_secure.model.sage import mean_weights


class StoredEntryDropout(nn.Module):
    """Inverted dropout of a dense input's non-zero entries: each kept with probability ``1 − p`` and scaled by
    ``1 / (1 − p)``, zeros left zero — ``F.dropout`` in distribution, drawing one number per stored entry rather than
    per entry (module docstring). The positions of the stored entries are found once per input tensor: the adapter
    hands the same feature tensor to every epoch of a round. The input is recognised through a weak reference, so
    the module neither keeps a bank's features alive nor carries them into a copy of the model."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self._stored: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None

    def stored_positions(self, x: torch.Tensor) -> torch.Tensor:
        """Flat indices of ``x``'s non-zero entries, recomputed only for another tensor."""
        if self._stored is None or self._stored[0]() is not x:
            self._stored = (weakref.ref(x), torch.flatten(x).nonzero().squeeze(1))
        return self._stored[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p <= 0.0:
            return x
        positions = self.stored_positions(x)
        kept = positions[torch.rand(positions.numel(), device=x.device) >= self.p]
        flat = torch.flatten(x)
        return flat.new_zeros(flat.numel()).index_copy(0, kept, flat[kept] / (1.0 - self.p)).view_as(x)


class GCN(nn.Module):
    """Kipf & Welling's two-layer GCN from ``GCNConv``; weight decay on the first layer."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.input_dropout = StoredEntryDropout(dropout)
        self.conv0 = GCNConv(num_features, hidden, normalize=False)
        self.conv1 = GCNConv(hidden, num_classes, normalize=False)

    def first_layer_parameters(self) -> list[nn.Parameter]:
        return list(self.conv0.parameters())

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.conv0(self.input_dropout(x), edge_index, edge_weight))
        logits = self.conv1(F.dropout(hidden, self.dropout, self.training), edge_index, edge_weight)
        return logits, hidden


class GraphSAGE(nn.Module):
    """Two mean-aggregator layers from ``GraphConv`` (``lin_rel`` = W_neigh with the bias, ``lin_root`` = W_self)
    over the mean weights of Â; weight decay on the first layer."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.input_dropout = StoredEntryDropout(dropout)
        self.conv0 = GraphConv(num_features, hidden, aggr="sum")
        self.conv1 = GraphConv(hidden, num_classes, aggr="sum")

    def first_layer_parameters(self) -> list[nn.Parameter]:
        return list(self.conv0.parameters())

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sources, targets = edge_index
        mean = mean_weights(targets, sources, edge_weight, x.shape[0])
        hidden = torch.relu(self.conv0(self.input_dropout(x), edge_index, mean))
        logits = self.conv1(F.dropout(hidden, self.dropout, self.training), edge_index, mean)
        return logits, hidden


class SGC(nn.Module):
    """``H = Â^K (X W) + b`` with K ``SimpleConv`` steps (linear, so projected first); ``hidden`` is unused (SGC
    has no hidden layer) and the logits are the embedding; weight decay on its one layer."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float = 0.0, hops: int = 2) -> None:
        super().__init__()
        self.dropout, self.hops = dropout, hops
        self.input_dropout = StoredEntryDropout(dropout)
        self.lin = Linear(num_features, num_classes, bias=False, weight_initializer="glorot")
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.propagate = SimpleConv(aggr="sum")

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        projected = self.lin(self.input_dropout(x))
        for _ in range(self.hops):
            projected = self.propagate(projected, edge_index, edge_weight)
        return projected + self.bias


class DAGNN(nn.Module):
    """DAGNN's MLP, K hops of ``SimpleConv`` and the per-node retainment scores; weight decay on the MLP's first
    layer (the engine's convention); ``hidden`` is the MLP's hidden layer."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float = 0.5, hops: int = 5) -> None:
        super().__init__()
        self.dropout, self.hops = dropout, hops
        self.input_dropout = StoredEntryDropout(dropout)
        self.lin0 = Linear(num_features, hidden, weight_initializer="glorot", bias_initializer="zeros")
        self.lin1 = Linear(hidden, num_classes, weight_initializer="glorot", bias_initializer="zeros")
        self.retain = Linear(num_classes, 1, weight_initializer="glorot", bias_initializer="zeros")
        self.propagate = SimpleConv(aggr="sum")

    def first_layer_parameters(self) -> list[nn.Parameter]:
        return list(self.lin0.parameters())

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.lin0(self.input_dropout(x)))
        z = self.lin1(F.dropout(hidden, self.dropout, self.training))
        stack = [z]
        for _ in range(self.hops):
            stack.append(self.propagate(stack[-1], edge_index, edge_weight))
        hops = torch.stack(stack, dim=1)  # N x (K+1) x C
        scores = torch.sigmoid(self.retain(hops))  # N x (K+1) x 1
        return (scores * hops).sum(dim=1), hidden
