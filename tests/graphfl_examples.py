"""The hand-sized GraphFL example two test modules recompute in closed form: six nodes, two features, no edges."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.graph import GraphDataset

HAND_FEATURES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.5], [0.5, 2.0], [1.5, 1.0]], dtype=np.float32)
HAND_LABELS = np.array([0, 1, 1, 0, 1, 0])


def hand_graph() -> GraphDataset:
    """Every node a training node; with a 1-hop SGC (Â = I) the model is softmax regression on the features."""
    return GraphDataset(
        "hand",
        sp.csr_matrix(HAND_FEATURES),
        HAND_LABELS,
        np.zeros((2, 0), dtype=np.int64),
        np.ones(6, dtype=bool),
        np.zeros(6, dtype=bool),
        np.zeros(6, dtype=bool),
        2,
        np.arange(6),
    )
