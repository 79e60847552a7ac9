"""Personalised-PageRank propagation of per-node scores over a graph (one function, two users).

``Z ← (1 − α) Â Z + α S`` for K steps: APPNP's propagation (Gasteiger et al., "Predict then Propagate", ICLR 2019,
Eq. 3) and, with α the weight kept on the seeds, label propagation (Zhou et al., "Learning with Local and Global
Consistency", NIPS 2003). The class sums score customers with it (Eq. C4, :mod:`fedgl_secure.model.centroids`); the
label unit's propagation prior spreads released labels with it (:mod:`fedgl_secure.privacy.label_release`).
"""

from __future__ import annotations

from typing import TypeVar

Scores = TypeVar("Scores")


def personalised_pagerank(scores: Scores, operator, steps: int, teleport: float) -> Scores:
    """``steps`` steps of ``Z ← (1 − teleport) · operator @ Z + teleport · scores`` from ``Z = scores``.

    Works on whatever supports ``@`` and scalar arithmetic: torch tensors with a
    :class:`~fedgl_secure.model.sparse.SparseOperator`, numpy arrays with a scipy sparse matrix."""
    propagated = scores
    for _ in range(steps):
        propagated = (1.0 - teleport) * (operator @ propagated) + teleport * scores
    return propagated
