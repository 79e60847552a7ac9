"""Each FedGL equation against a small dense reference computed here, from the paper's formula."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fedgl_secure.engine.aggregation import client_weight, plaintext_sum
from fedgl_secure.engine.fusion import fuse_node_values, scatter_to_global
from fedgl_secure.engine.pseudo_labels import global_pseudo_labels
from fedgl_secure.model.adjacency import (
    fuse_pseudo_graph,
    gcn_normalize,
    project_pseudo_graph,
    row_normalize_features,
)
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.losses import fedgl_loss, proximal_term


def _random_adjacency(rng: np.random.Generator, n: int, p: float = 0.3) -> np.ndarray:
    upper = np.triu(rng.random((n, n)) < p, k=1)
    return (upper | upper.T).astype(float)


def test_gcn_normalize_matches_dense_formula():
    rng = np.random.default_rng(1)
    a = _random_adjacency(rng, 9)
    a[3, :] = a[:, 3] = 0  # an isolated node keeps its self-loop
    a_tilde = a + np.eye(9)
    d = np.diag(a_tilde.sum(1) ** -0.5)
    np.testing.assert_allclose(gcn_normalize(sp.csr_matrix(a)).toarray(), d @ a_tilde @ d, atol=1e-12)


def test_eq9_fusion_with_projection_matches_dense_reference():
    rng = np.random.default_rng(2)
    m, s, beta = 12, 4, 0.7
    client_positions = np.array([0, 2, 3, 5, 8, 9, 11])
    neighbors = np.stack([rng.choice(np.delete(np.arange(m), i), size=s, replace=False) for i in range(m)])
    weights = rng.random((m, s))
    weights[4] = 0.0  # a row without pseudo neighbours
    weights /= np.maximum(weights.sum(1, keepdims=True), 1e-300)
    dense_global = np.zeros((m, m))
    for i in range(m):
        dense_global[i, neighbors[i]] = weights[i]
    # Ā^(k): rows and columns of the client's nodes.
    projected_ref = dense_global[np.ix_(client_positions, client_positions)]
    projected = project_pseudo_graph(neighbors, weights, client_positions, m)
    np.testing.assert_allclose(projected.toarray(), projected_ref, atol=1e-12)

    a_hat = gcn_normalize(sp.csr_matrix(_random_adjacency(rng, len(client_positions))))
    degree = projected_ref.sum(1)
    inv_sqrt = np.where(degree > 0, degree, 1.0) ** -0.5 * (degree > 0)
    expected = a_hat.toarray() + beta * np.diag(inv_sqrt) @ projected_ref @ np.diag(inv_sqrt)
    fused = fuse_pseudo_graph(a_hat, projected, beta)
    np.testing.assert_allclose(fused.toarray(), expected, atol=1e-12)
    # Rows of degree 0 in Ā^(k) gain nothing.
    zero_rows = degree == 0
    np.testing.assert_allclose(fused.toarray()[zero_rows], a_hat.toarray()[zero_rows])
    # renormalised variant: D'^-1/2 Â' D'^-1/2 of the fused sum
    renormed = fuse_pseudo_graph(a_hat, projected, beta, renormalize=True).toarray()
    d2 = np.diag(expected.sum(1) ** -0.5)
    np.testing.assert_allclose(renormed, d2 @ expected @ d2, atol=1e-12)
    # β = 0 or no pseudo graph: the original Â, untouched
    assert fuse_pseudo_graph(a_hat, projected, 0.0) is a_hat
    assert fuse_pseudo_graph(a_hat, None, beta) is a_hat


def test_eq10_fedavg_is_node_weighted_mean():
    rng = np.random.default_rng(3)
    sizes = [30, 50, 20]
    params = [torch.tensor(rng.normal(size=7), dtype=torch.float32) for _ in sizes]
    contributions = [
        {"weights": client_weight(n) * w, "total_weight": torch.tensor([client_weight(n)])}
        for n, w in zip(sizes, params, strict=True)
    ]
    sums = plaintext_sum(contributions)
    expected = sum(n * w.double() for n, w in zip(sizes, params, strict=True)) / sum(sizes)
    torch.testing.assert_close(
        fedavg(sums["weights"], sums["total_weight"].item()).double(), expected, atol=1e-6, rtol=0
    )


def _client_terms(rng, m, c, holdings, sizes):
    """Per-client probability rows placed at global positions, plus the dense reference inputs."""
    probs = []
    for held in holdings:
        logits = torch.tensor(rng.normal(size=(len(held), c)) * 3)
        probs.append(torch.softmax(logits, 1).float())
    contributions = []
    for held, p, n in zip(holdings, probs, sizes, strict=True):
        pos = torch.as_tensor(held)
        contributions.append(
            {
                "predictions": scatter_to_global(n * p, pos, m),
                "node_weight": scatter_to_global(torch.full((len(held),), float(n)), pos, m),
                "total_weight": torch.tensor([float(n)]),
            }
        )
    return probs, plaintext_sum(contributions)


def test_eq12_per_node_and_paper_fusion_match_dense_reference():
    rng = np.random.default_rng(4)
    m, c = 10, 3
    holdings = [np.array([0, 1, 2, 5]), np.array([1, 2, 3, 7, 8]), np.array([2, 8, 9])]
    sizes = [4, 5, 3]
    probs, sums = _client_terms(rng, m, c, holdings, sizes)
    per_node_ref = np.zeros((m, c))
    paper_ref = np.zeros((m, c))
    for i in range(m):
        num, den = np.zeros(c), 0.0
        for held, p, n in zip(holdings, probs, sizes, strict=True):
            if i in held:
                row = p[list(held).index(i)].double().numpy()
                num += n * row
                den += n
                paper_ref[i] += n / sum(sizes) * row
        per_node_ref[i] = num / den if den else 0.0
    per_node = fuse_node_values(sums["predictions"], sums["node_weight"], sums["total_weight"].item(), "per-node")
    paper = fuse_node_values(sums["predictions"], sums["node_weight"], sums["total_weight"].item(), "paper")
    np.testing.assert_allclose(per_node.numpy(), per_node_ref, atol=1e-6)
    np.testing.assert_allclose(paper.numpy(), paper_ref, atol=1e-6)
    # node 4 and 6 are held by nobody: zero rows, never NaN
    assert torch.all(per_node[[4, 6]] == 0)
    # per-node rows of held nodes are probability vectors
    held = sums["node_weight"] > 0
    torch.testing.assert_close(per_node[held].sum(1), torch.ones(int(held.sum())), atol=1e-6, rtol=0)


def test_eq13_pseudo_labels_threshold_and_argmax():
    rng = np.random.default_rng(5)
    fused = torch.softmax(torch.tensor(rng.normal(size=(50, 4)) * 2), 1).float()
    fused[7] = 0.0  # a node held by nobody
    labels = global_pseudo_labels(fused, 0.5)
    for i in range(50):
        row = fused[i].numpy()
        expected = int(row.argmax()) if row.max() > 0.5 else -1
        assert labels[i].item() == expected
    assert labels[7] == -1
    # with the literal paper fusion and λ = 0.5 a node held by one client of weight share < 0.5
    # can never pass the threshold (DESIGN §3): its fused row sums to that share
    assert torch.all(global_pseudo_labels(fused * 0.4, 0.5) == -1)


def test_eq8_loss_drops_own_training_nodes_from_pseudo_term():
    rng = np.random.default_rng(6)
    logits = torch.tensor(rng.normal(size=(8, 3)), dtype=torch.float32)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    train = torch.tensor([True, True, False, False, False, False, False, False])
    pseudo = torch.tensor([2, 2, 1, -1, 0, -1, 2, 2])
    alpha = 0.3
    expected = F.cross_entropy(logits[:2], labels[:2]) + alpha * F.cross_entropy(
        logits[[2, 4, 6, 7]], pseudo[[2, 4, 6, 7]]
    )
    torch.testing.assert_close(fedgl_loss(logits, labels, train, pseudo, alpha), expected)
    torch.testing.assert_close(fedgl_loss(logits, labels, train, pseudo, 0.0), F.cross_entropy(logits[:2], labels[:2]))
    torch.testing.assert_close(fedgl_loss(logits, labels, train, None, alpha), F.cross_entropy(logits[:2], labels[:2]))


def test_fedprox_term():
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    g = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    assert proximal_term(p, g, 0.5).item() == 0.25 * (1 + 4 + 4)


def test_row_normalize_features_keeps_zero_rows():
    x = sp.csr_matrix(np.array([[1, 1, 0], [0, 0, 0], [2, 0, 2]], dtype=np.float32))
    np.testing.assert_allclose(row_normalize_features(x).toarray(), [[0.5, 0.5, 0], [0, 0, 0], [0.5, 0, 0.5]])


def test_balanced_class_weights_make_each_class_weigh_the_same():
    from fedgl_secure.model.losses import balanced_class_weights, fedgl_loss

    labels = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 2, -1])
    train = torch.tensor([True] * 9 + [False])
    weights = balanced_class_weights(labels, train, num_classes=4)
    # n = 9 training nodes over 3 present classes: 9 / (3 * 6), 9 / (3 * 2), 9 / (3 * 1); class 3 absent: 0
    assert torch.allclose(weights, torch.tensor([0.5, 1.5, 3.0, 0.0]))
    assert torch.allclose((weights[:3] * torch.tensor([6.0, 2.0, 1.0])), torch.full((3,), 3.0))
    logits = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    weighted = fedgl_loss(logits, labels, train, None, 0.0, weights)
    per_node = torch.nn.functional.cross_entropy(logits[train], labels[train], reduction="none")
    expected = (weights[labels[train]] * per_node).sum() / weights[labels[train]].sum()
    assert torch.allclose(weighted, expected)
    assert not torch.allclose(weighted, fedgl_loss(logits, labels, train, None, 0.0))
