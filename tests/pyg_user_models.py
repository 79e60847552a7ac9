"""Models a bank's data team might declare as ``training.backbone = "pyg_user_models:<Class>"``: one that meets
the contract (:mod:`fedgl_secure.model.pyg_adapter`) and some that do not, for the declaration checks.

A module of its own (not a test file) so the consortium's bank processes can import it too: the tests put this
folder on their ``PYTHONPATH``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GraphConv


class GraphConvHead(nn.Module):
    """One weighted ``GraphConv`` (neighbour sum + root), ReLU, dropout and a linear head; returns the logits only."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv = GraphConv(num_features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.conv(x, edge_index, edge_weight))
        return self.head(F.dropout(hidden, self.dropout, self.training))


class NotAModel:
    """A plain class: not a ``torch.nn.Module``."""

    def __init__(self, num_features: int, hidden: int, num_classes: int, dropout: float) -> None:
        self.width = hidden


class HiddenWidthOutput(GraphConvHead):
    """Returns the hidden layer where the logits belong: ``N × hidden`` instead of ``N × num_classes``."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x, edge_index, edge_weight))


class OtherSignature(nn.Module):
    """Constructed as ``(in_channels, out_channels)`` only: not the agreed signature."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)
