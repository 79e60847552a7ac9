"""How right an approximate pseudo graph (Eq. 15) is: the recall of the exact top-s on a sample of its rows.

An approximate search (``faiss_ivf``, ``ivf``) keeps, per row, ``s`` neighbours it found among its candidates. For a
sample of rows the exact top-s is one product of the sample against every row — ``rows x M x D`` multiply-adds, a
second or two at ``M = 2.5·10^6`` for 500 rows — so a server can report how many of the true neighbours its graph
kept without computing the exact graph (``self_supervision.recall_sample``; the aggregator logs it with the pseudo
graph's seconds, and ``benchmarks/consortium_scale.py`` reports it beside them).

``recall`` is the mean share of each sampled row's exact top-s that it kept; ``recall_ties`` also counts a kept
neighbour as right when its exact similarity reaches the row's s-th largest (the two differ only where
similarities tie; for cosine, within float64's rounding of the unit rows).
"""

from __future__ import annotations

import numpy as np
import torch

# Cosine ties: rows of one direction and different lengths (the policy's packing quantises embeddings to steps,
# so decrypted customers share directions by the thousand) have unit rows that differ by float64 rounding,
# ~1e-16 a coordinate, so their ``−‖u − v‖²`` differ by up to ~1e-31 around 0. Scores within this of the s-th
# largest count as tied with it: (8 ulp)², i.e. unit rows less than ~2e-15 apart, which is float64's rounding of
# the unit rows rather than a difference of direction it can resolve.
_UNIT_ROW_ROUNDING = (8 * float(torch.finfo(torch.float64).eps)) ** 2


def recall_rows(num_nodes: int, rows: int, seed: int) -> torch.Tensor:
    """``rows`` distinct row ids of ``num_nodes`` (all of them if fewer), drawn with ``seed``, ascending."""
    drawn = np.random.default_rng(seed).choice(num_nodes, size=min(rows, num_nodes), replace=False)
    return torch.from_numpy(np.sort(drawn))


def sampled_recall(
    embeddings: torch.Tensor, similarity: str, rows: torch.Tensor, found: torch.Tensor
) -> tuple[float, float]:
    """(recall, recall counting ties) of ``found`` — the neighbours kept for ``rows``, ``len(rows) x s`` — against
    the exact top-s of those rows among every row of ``embeddings`` (``M x D``), the row itself excluded.

    Scores are computed in float64 on ``embeddings``' device, at most 2^27 of them at a time, and cosine is ranked
    by the distance between unit rows (:func:`cosine_rank_scores`): two unit rows less than ~3·10^-4 radians apart
    both score a float32 cosine of 1.0, and float64 cosines still tie below ~10^-8 radians, while at millions of
    rows hundreds of rows lie that close (noisy decryptions of customers with the same features), so rounding,
    not the search, would decide which of them count.
    """
    points = embeddings.to(torch.float64)
    if similarity == "cosine":
        points = torch.nn.functional.normalize(points, p=2.0, dim=1)
    s = found.shape[1]
    if s == 0 or rows.numel() == 0:
        return 1.0, 1.0
    step = max(1, 2**27 // points.shape[0])
    kept_share, tied = [], []
    for first in range(0, rows.shape[0], step):
        chunk = rows[first : first + step].to(points.device)
        kept_ids = found[first : first + step].to(points.device, torch.int64)
        scores = cosine_rank_scores(points[chunk], points) if similarity == "cosine" else points[chunk] @ points.t()
        scores[torch.arange(chunk.shape[0], device=points.device), chunk] = float("-inf")
        values, exact = torch.topk(scores, s, dim=1)
        kept = scores.gather(1, kept_ids)
        tolerance = _UNIT_ROW_ROUNDING if similarity == "cosine" else 0.0
        tied.append((kept >= values[:, -1:] - tolerance).sum(dim=1).clamp(max=s).cpu())
        kept_share += [len(set(a) & set(b)) / s for a, b in zip(kept_ids.tolist(), exact.tolist(), strict=True)]
        del scores
    return float(np.mean(kept_share)), torch.cat(tied).double().mean().item() / s


def cosine_rank_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Scores in the order of cosine similarity between unit ``queries`` and unit ``keys`` (zero rows stay zero):
    ``−‖u − v‖²`` (``= 2 cos − 2``) from the differences themselves, which keep their precision where ``cos`` is 1
    to the last bit; −2 (cosine 0) where either row is zero."""
    scores = torch.cdist(queries, keys, compute_mode="donot_use_mm_for_euclid_dist").square_().neg_()
    scores[:, (keys == 0).all(dim=1)] = -2.0
    scores[(queries == 0).all(dim=1)] = -2.0
    return scores
