"""A seeded synthetic "customer graph" for demos and tests: a contextual stochastic block model.

It stands in for a bank's customer/transaction graph when no real data may be used: customers
(nodes) fall into ``C`` risk classes, customers of the same class transact more often with each
other (homophily), and each class has a few characteristic binary attributes (products held,
behaviour flags) that its members show more often than others do. Both signals are noisy on
purpose, so that a 2-layer GCN does clearly better than chance and better than features alone,
but is not perfect — which leaves room for federated methods to differ. Measured with the
defaults (Kipf GCN, seeds 0-4): average degree 6.8-7.0, edge homophily 0.71-0.73, test accuracy
0.83-0.86 on the whole graph, 0.35-0.39 from features alone (MLP-like GCN without edges), and
0.32-0.75 for one client holding 30-70 % of the nodes.

Model (all draws from ``np.random.default_rng(seed)``, in a fixed order):

* **Classes.** ``y = permutation(arange(N) mod C)``: balanced classes, ``n_c = N / C``.
* **Edges.** Stochastic block model with ``p_in = d·h / (n_c − 1)`` and
  ``p_out = d·(1 − h) / (N − n_c)`` for average degree ``d`` and edge homophily ``h``, so a node
  expects ``d·h`` neighbours in its own class and ``d·(1 − h)`` outside. For every block pair the
  number of edges is drawn from ``Binomial(#pairs, p)`` and that many endpoint pairs are drawn
  uniformly (repeats and self-pairs are dropped, a relative loss of about ``d / n_c``). Cost is
  ``O(E)``; no ``N × N`` matrix is ever built.
* **Features.** Class ``c`` owns ``k`` prototype features (disjoint sets); feature ``j`` of a
  node of class ``c`` is 1 with probability ``prototype_prob`` if ``j`` is one of ``c``'s
  prototypes and ``noise_prob`` otherwise.
* **Split.** 20 training nodes per class, then 300 validation and 500 test nodes from the rest.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fedgl_secure.data.graph import GraphDataset, canonical_edge_index
from fedgl_secure.data.splits import sample_split
from fedgl_secure.errors import ConfigError

SYNTHETIC_NAME = "synthetic"
_FEATURE_CHUNK_ROWS = 1 << 16


def _require(condition: bool, argument: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"synthetic_consortium: {argument} {message}")


def _block_edges(
    rng: np.random.Generator, members: list[np.ndarray], p_in: float, p_out: float
) -> tuple[np.ndarray, np.ndarray]:
    """Endpoints of SBM edges, one Binomial edge count per block pair (see module docstring)."""
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    for a, block_a in enumerate(members):
        for b in range(a, len(members)):
            block_b = members[b]
            if a == b:
                pairs, prob = block_a.size * (block_a.size - 1) // 2, p_in
            else:
                pairs, prob = block_a.size * block_b.size, p_out
            count = int(rng.binomial(pairs, prob)) if pairs > 0 else 0
            rows.append(block_a[rng.integers(0, block_a.size, size=count)])
            cols.append(block_b[rng.integers(0, block_b.size, size=count)])
    return np.concatenate(rows), np.concatenate(cols)


def _features(
    rng: np.random.Generator,
    labels: np.ndarray,
    num_features: int,
    prototypes: int,
    prototype_prob: float,
    noise_prob: float,
) -> sp.csr_matrix:
    """Binary features, class-conditional Bernoulli (see module docstring); row-chunked memory."""
    num_classes = int(labels.max()) + 1
    prob = np.full((num_classes, num_features), noise_prob, dtype=np.float32)
    owners = rng.permutation(num_features)[: num_classes * prototypes].reshape(num_classes, prototypes)
    for cls in range(num_classes):
        prob[cls, owners[cls]] = prototype_prob
    chunks = []
    for start in range(0, labels.size, _FEATURE_CHUNK_ROWS):
        part = labels[start : start + _FEATURE_CHUNK_ROWS]
        draws = rng.random((part.size, num_features), dtype=np.float32)
        chunks.append(sp.csr_matrix(draws < prob[part], dtype=np.float32))
    return sp.vstack(chunks, format="csr") if len(chunks) > 1 else chunks[0]


def synthetic_consortium(
    seed: int = 0,
    num_nodes: int = 1200,
    num_classes: int = 4,
    num_features: int = 100,
    *,
    average_degree: float = 7.0,
    homophily: float = 0.72,
    prototypes_per_class: int = 10,
    prototype_prob: float = 0.14,
    noise_prob: float = 0.05,
    train_per_class: int = 20,
    num_val: int = 300,
    num_test: int = 500,
) -> GraphDataset:
    """Generate the ``synthetic`` dataset; the same arguments always give the same graph.

    Args:
        seed: seeds ``np.random.default_rng``; everything (graph, features, split) derives from it.
        num_nodes, num_classes, num_features: ``N``, ``C``, ``F``.
        average_degree: expected undirected degree ``d``.
        homophily: expected fraction ``h`` of edges that join two nodes of the same class.
        prototypes_per_class: ``k``, characteristic features per class (``C·k ≤ F``).
        prototype_prob, noise_prob: probability that a prototype / any other feature is 1.
        train_per_class, num_val, num_test: split sizes.

    Raises:
        ConfigError: an argument is out of range; the message names it.
    """
    _require(isinstance(seed, (int, np.integer)) and seed >= 0, "seed", f"must be an integer >= 0, got {seed!r}")
    _require(num_classes >= 2, "num_classes", f"must be >= 2, got {num_classes}")
    _require(num_features >= 1, "num_features", f"must be >= 1, got {num_features}")
    _require(train_per_class >= 1, "train_per_class", f"must be >= 1, got {train_per_class}")
    _require(num_val >= 0, "num_val", f"must be >= 0, got {num_val}")
    _require(num_test >= 1, "num_test", f"must be >= 1, got {num_test}")
    needed = num_classes * train_per_class + num_val + num_test
    _require(
        num_nodes >= needed,
        "num_nodes",
        f"must be >= num_classes * train_per_class + num_val + num_test = {needed}, got {num_nodes}",
    )
    _require(0.0 <= homophily <= 1.0, "homophily", f"must be in [0, 1], got {homophily}")
    _require(
        1 <= prototypes_per_class and num_classes * prototypes_per_class <= num_features,
        "prototypes_per_class",
        f"must be >= 1 with num_classes * prototypes_per_class <= num_features ({num_features}), "
        f"got {prototypes_per_class}",
    )
    _require(0.0 <= prototype_prob <= 1.0, "prototype_prob", f"must be in [0, 1], got {prototype_prob}")
    _require(0.0 <= noise_prob <= 1.0, "noise_prob", f"must be in [0, 1], got {noise_prob}")
    block = num_nodes // num_classes  # smallest class size
    p_in = average_degree * homophily / max(block - 1, 1)
    p_out = average_degree * (1.0 - homophily) / (num_nodes - block)
    _require(
        average_degree > 0 and p_in <= 1.0 and p_out <= 1.0,
        "average_degree",
        f"must be > 0 and small enough for the class sizes (p_in = {p_in:.3g}, p_out = {p_out:.3g} "
        f"must be <= 1), got {average_degree}",
    )

    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_nodes, dtype=np.int64) % num_classes)
    members = [np.flatnonzero(labels == cls) for cls in range(num_classes)]
    rows, cols = _block_edges(rng, members, p_in, p_out)
    features = _features(rng, labels, num_features, prototypes_per_class, prototype_prob, noise_prob)
    train_mask, val_mask, test_mask = sample_split(
        labels,
        rng,
        train_per_class=np.full(num_classes, train_per_class),
        num_val=num_val,
        num_test=num_test,
        dataset=SYNTHETIC_NAME,
    )
    return GraphDataset(
        name=SYNTHETIC_NAME,
        features=features,
        labels=labels,
        edge_index=canonical_edge_index(rows, cols, num_nodes),
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=num_classes,
        node_ids=np.arange(num_nodes, dtype=np.int64),
    )
