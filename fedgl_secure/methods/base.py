"""The method interface: what a client computes and uploads, what the server fuses and sends back.

The engine (``simulation.py``, later the network services) is method-agnostic. A method
declares its upload kinds; each client turns the current :class:`Broadcast` into a dict of
*pre-weighted* terms ``w_k · X_k`` (one per kind, already in global index where per-node);
the engine only sums them (in plaintext or under CKKS) and hands the sums back to the method.
FedAvg and FedGL are two such methods; others (meta-learned FedAvg with self-training,
neighbour reconstruction, edge-DP contrastive learning) plug in the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.model.sparse import SparseOperator

# Upload kinds. Every kind is a sum of pre-weighted client terms.
WEIGHTS = "weights"  # cat(w_k · W_k, [w_k]): flattened parameters, then the weight itself (for Σ_k w_k)
PREDICTIONS = "predictions"  # w_k · P_k in global index (M x C)
EMBEDDINGS = "embeddings"  # w_k · H_k in global index (M x D)
NODE_WEIGHT = "node_weight"  # w_k · [i ∈ V_k] (M), the per-node normaliser of Eqs. 12/14


def weights_term(weight: float, parameters: torch.Tensor) -> torch.Tensor:
    """The WEIGHTS upload ``cat(w_k · W_k, [w_k])``: Eq. 10's numerator and denominator terms in one vector."""
    return torch.cat([weight * parameters, torch.tensor([weight], dtype=parameters.dtype)])


def split_weights_sum(summed: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(Σ_k w_k W_k, Σ_k w_k)`` from the summed WEIGHTS terms (the last entry is Σ_k w_k)."""
    return summed[:-1], float(summed[-1])


@dataclass(frozen=True)
class Broadcast:
    """What the server sends to the clients after a round (round 0: the initial model)."""

    round_number: int
    weights: torch.Tensor
    pseudo_labels: torch.Tensor | None = None
    pseudo_graph: PseudoGraph | None = None
    # Server-side only (never sent to banks): fused values kept for diagnostics.
    fused_predictions: torch.Tensor | None = field(default=None, repr=False)


class FederatedMethod(Protocol):
    name: str

    @property
    def upload_kinds(self) -> tuple[str, ...]: ...

    def client_contribution(
        self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True
    ) -> dict[str, torch.Tensor]:
        """The bank's pre-weighted terms. ``with_node_terms = False`` leaves out P_k and H_k (predictions,
        embeddings), for a caller that computes them itself (under DP, with the public W̄: :meth:`node_terms`)."""
        ...

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast: ...

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        """The exact shape of every kind ``client_contribution`` returns (a receiver refuses others)."""
        ...

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator: ...
