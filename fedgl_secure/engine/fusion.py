"""Fused predictions and embeddings (Eqs. 12 and 14) from per-client terms in global index."""

from __future__ import annotations

from typing import Literal

import torch

FusionMode = Literal["per-node", "paper"]


def scatter_to_global(rows: torch.Tensor, positions: torch.Tensor, num_global_nodes: int) -> torch.Tensor:
    """Place a client's per-node rows at their global indices, zero elsewhere (Eqs. 12, 14)."""
    out = torch.zeros((num_global_nodes,) + tuple(rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    out[positions] = rows
    return out


def fuse_node_values(
    weighted_sum: torch.Tensor,
    node_weight_sum: torch.Tensor,
    total_weight: torch.Tensor | float,
    mode: FusionMode = "per-node",
) -> torch.Tensor:
    """Eqs. 12 and 14: fused ``P̄`` (or ``H̄``) from the summed pre-weighted client terms.

    ``weighted_sum[i] = Σ_k w_k X_k,i`` (zero where client k does not hold i),
    ``node_weight_sum[i] = Σ_k w_k [i ∈ V_k]``, ``total_weight = Σ_k w_k``.

    * ``per-node`` (default): ``X̄_i = Σ_k w_k X_k,i / Σ_k w_k [i ∈ V_k]`` — a true average over
      the clients that hold node i (nodes held by nobody stay 0).
    * ``paper``: the literal ``Σ_k (N_k / Σ N) X_k``; a node held by one client is scaled down.
    """
    if mode == "paper":
        return weighted_sum / float(total_weight)
    if mode != "per-node":
        raise ValueError(f"fusion mode {mode!r}: expected 'per-node' or 'paper'")
    denominator = node_weight_sum.reshape((-1,) + (1,) * (weighted_sum.dim() - 1))
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator > 0, weighted_sum / safe, torch.zeros_like(weighted_sum))
