"""Empirical privacy attacks for the audit (DESIGN §6): what an adversary can actually infer.

Formal guarantees (DP budgets) bound leakage from above; these attacks measure it from below on
a finished run, so a risk officer sees both. Two attacks, each reported as a ROC AUC — the
probability that a random positive gets a higher score than a random negative (0.5: no better
than guessing, 1: perfect inference):

* **Membership inference on the global model** ``W̄`` (Yeom et al., CSF 2018): a model is more
  confident on the nodes it was fitted to. Members are the training nodes of the clients, whose
  true labels entered the loss; non-members are an equal-size random sample of test nodes, whose
  labels never did. The model is evaluated on the merged client graph, as the simulation
  evaluates ``W̄``. Variants (all shadow-model-free, one threshold each):

  - ``loss``: ``log P(y_i | x_i) = −CE_i`` (Yeom's loss attack; same ranking as confidence ``p_y``,
    but in log space so near-1 confidences of an overfit model do not collapse into ties);
  - ``entropy``: ``−H(P_i)``, needs no label (a low-entropy prediction looks memorised);
  - ``modified-entropy``: ``−Mentr(P_i, y_i)`` with
    ``Mentr = −(1 − p_y) log p_y − Σ_{c≠y} p_c log(1 − p_c)`` (Song & Mittal, USENIX Sec. 2021),
    which penalises confident *wrong* predictions, unlike the plain entropy.

  The headline is the maximum AUC over the variants: the best an auditor found, hence an
  optimistic (attacker-favourable) estimate, as an audit should report.

* **Link inference from the pseudo graph** ``Ā``: how well ``Ā``'s edge weights rank the true
  edges of the merged real graph above an equal number of random non-edges — the leakage of the
  banks' private edges through the graph the server broadcasts. A pair's score is
  ``Ā[u, v] + Ā[v, u]`` (``Ā`` is row-normalised top-s, hence directed), 0 where absent. With
  fused embeddings ``H̄`` (or any per-node matrix, e.g. the fused predictions ``P̄``) a second
  variant scores pairs by cosine similarity of their rows: what a party holding ``H̄`` could do
  without the top-s truncation.

All sampling draws from :func:`fedgl_secure.seeding.numpy_stream` under the given seed, so
results are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
from scipy.stats import rankdata

from fedgl_secure.model.gcn import GCN
from fedgl_secure.seeding import numpy_stream

if TYPE_CHECKING:
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.engine.graph_tensors import GraphTensors
    from fedgl_secure.engine.pseudo_graph import PseudoGraph
    from fedgl_secure.methods.base import Broadcast
    from fedgl_secure.model.sparse import SparseOperator

MEMBERSHIP_ATTACKS = ("loss", "entropy", "modified-entropy")
LINK_ATTACKS = ("pseudo-graph", "embedding-cosine")

# log(0) guard for probabilities in the entropy scores (float64).
_LOG_EPS = 1e-300


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class MembershipResult:
    """Membership inference on one model.

    Attributes:
        auc: headline AUC, the maximum over ``variants``.
        members, nonmembers: how many nodes of each class were scored.
        attack: the variant that reached ``auc``.
        variants: AUC of every variant, by name (see ``MEMBERSHIP_ATTACKS``).
        auc_stderr: standard error of ``auc`` (Hanley–McNeil): with ~100 members it is ~0.05,
            so "AUC ≤ 0.55" is only resolved by larger sets or by pooling seeds.
    """

    auc: float
    members: int
    nonmembers: int
    attack: str
    variants: dict[str, float] = field(default_factory=dict)
    auc_stderr: float = float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LinkResult:
    """Link inference from the pseudo graph (and, when given, from embeddings).

    Attributes:
        auc: headline AUC, the maximum over ``variants``.
        positives: true (undirected) edges scored.
        negatives: random non-edges scored (as many as positives).
        attack: the variant that reached ``auc``.
        variants: AUC of every variant computed, by name (see ``LINK_ATTACKS``).
        auc_stderr: standard error of ``auc`` (Hanley–McNeil).
    """

    auc: float
    positives: int
    negatives: int
    attack: str
    variants: dict[str, float] = field(default_factory=dict)
    auc_stderr: float = float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AttackReport:
    """Both attacks on one run's final broadcast; ``link`` is None when no pseudo graph was sent."""

    membership: MembershipResult
    link: LinkResult | None

    def to_dict(self) -> dict:
        return {"membership": self.membership.to_dict(), "link": None if self.link is None else self.link.to_dict()}


# --------------------------------------------------------------------------------------------
# ROC AUC


def roc_auc(scores_members: np.ndarray | torch.Tensor, scores_nonmembers: np.ndarray | torch.Tensor) -> float:
    """``P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`` for a random positive and a random negative score.

    Computed as the Mann–Whitney statistic ``U / (n⁺ n⁻)`` with
    ``U = Σ rank(s⁺) − n⁺(n⁺ + 1)/2`` over midranks of the pooled scores, so tied scores count
    one half. O(n log n).

    Raises:
        ValueError: a side is empty, or a score is NaN.
    """
    positive = np.asarray(_to_numpy(scores_members), dtype=np.float64).ravel()
    negative = np.asarray(_to_numpy(scores_nonmembers), dtype=np.float64).ravel()
    if positive.size == 0 or negative.size == 0:
        raise ValueError(f"roc_auc needs at least one score on each side, got {positive.size} and {negative.size}")
    if np.isnan(positive).any() or np.isnan(negative).any():
        raise ValueError("roc_auc: scores contain NaN")
    ranks = rankdata(np.concatenate([positive, negative]), method="average")
    n_pos, n_neg = positive.size, negative.size
    u = ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def auc_standard_error(auc: float, num_positives: int, num_negatives: int) -> float:
    """Hanley & McNeil's (1982) standard error of an AUC estimated from ``n⁺`` and ``n⁻`` scores.

    ``SE² = [A(1 − A) + (n⁺ − 1)(Q1 − A²) + (n⁻ − 1)(Q2 − A²)] / (n⁺ n⁻)`` with
    ``Q1 = A / (2 − A)`` and ``Q2 = 2A² / (1 + A)``; at ``A = 0.5`` it equals the null standard
    deviation ``sqrt((n⁺ + n⁻ + 1) / (12 n⁺ n⁻))`` up to O(1/n²).
    """
    if num_positives < 1 or num_negatives < 1:
        raise ValueError("auc_standard_error needs at least one score on each side")
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    variance = (auc * (1.0 - auc) + (num_positives - 1) * (q1 - auc * auc) + (num_negatives - 1) * (q2 - auc * auc)) / (
        num_positives * num_negatives
    )
    return math.sqrt(max(variance, 0.0))


def _to_numpy(values: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _best(variants: dict[str, float]) -> tuple[str, float]:
    name = max(variants, key=variants.__getitem__)
    return name, variants[name]


# --------------------------------------------------------------------------------------------
# Membership inference


def membership_scores(log_probs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-node attack scores (higher = "more likely a member") from log-probabilities.

    Args:
        log_probs: ``n x C`` log-softmax of the model's logits (float64 recommended).
        labels: ``n`` true labels.

    Returns:
        ``{"loss": log p_y, "entropy": −H(p), "modified-entropy": −Mentr(p, y)}``.
    """
    probs = log_probs.exp()
    true = labels.view(-1, 1)
    log_true = log_probs.gather(1, true).squeeze(1)
    p_true = probs.gather(1, true).squeeze(1)
    entropy = -(probs * log_probs).sum(dim=1)
    # Mentr = −(1 − p_y) log p_y − Σ_{c≠y} p_c log(1 − p_c)
    log_complement = torch.log((1.0 - probs).clamp_min(_LOG_EPS))
    others = probs * log_complement
    others = others.sum(dim=1) - others.gather(1, true).squeeze(1)
    modified_entropy = -(1.0 - p_true) * log_true - others
    return {"loss": log_true, "entropy": -entropy, "modified-entropy": -modified_entropy}


def model_from_weights(weights: torch.Tensor, num_features: int, num_classes: int, hidden: int | None = None) -> GCN:
    """The two-layer GCN holding the flat parameter vector ``weights`` (``W̄``), in eval mode.

    The hidden width follows from the vector's length ``P = h (F + 1 + C) + C`` when not given.

    Raises:
        ValueError: the length fits no hidden width (or not the given one).
    """
    count = int(weights.numel())
    if hidden is None:
        hidden, remainder = divmod(count - num_classes, num_features + 1 + num_classes)
        if remainder or hidden < 1:
            raise ValueError(
                f"a parameter vector of {count} values is no 2-layer GCN with {num_features} features "
                f"and {num_classes} classes"
            )
    expected = hidden * (num_features + 1 + num_classes) + num_classes
    if count != expected:
        raise ValueError(
            f"a parameter vector of {count} values is no 2-layer GCN of hidden width {hidden} ({expected})"
        )
    model = GCN(num_features, hidden, num_classes, dropout=0.0)
    model.load_flat_parameters(weights)
    return model.eval()


def _as_bool_mask(mask: np.ndarray | torch.Tensor, size: int, name: str) -> np.ndarray:
    mask = np.asarray(_to_numpy(mask), dtype=bool).ravel()
    if mask.shape != (size,):
        raise ValueError(f"{name} must have one entry per node ({size}), got shape {mask.shape}")
    return mask


def membership_inference_auc(
    model_weights: torch.Tensor | torch.nn.Module,
    graph: GraphTensors,
    *,
    adjacency: SparseOperator | None = None,
    seed: int = 0,
    member_mask: np.ndarray | torch.Tensor | None = None,
    nonmember_mask: np.ndarray | torch.Tensor | None = None,
    hidden: int | None = None,
) -> MembershipResult:
    """Loss/entropy-threshold membership inference (Yeom et al.) on a node classifier.

    Args:
        model_weights: the global model — a flat ``W̄`` (``Broadcast.weights``) of the 2-layer GCN, or a model
            whose ``forward(features, adjacency)`` gives logits (moved to ``graph.device``; its train/eval mode
            is restored afterwards; :func:`global_model_membership` builds any method's).
        graph: the graph it is evaluated on; for a federation, the merged client graph
            (``Federation.merged``). Its labels are the attacker's knowledge of the true labels
            (needed by ``loss`` and ``modified-entropy``, not by ``entropy``).
        adjacency: the Â (or a method's evaluation view) to evaluate with; default the plain
            ``graph.adjacency(None, 0, False)``, which is how the simulation evaluates ``W̄`` unless
            ``pseudo_graph_at_eval`` is set.
        seed: seeds the sampling of the balanced member / non-member sets.
        member_mask: members (default ``graph.train_mask``: the clients' training nodes).
        nonmember_mask: pool of non-members (default ``graph.test_mask``: never trained on).
        hidden: hidden width, checked against ``model_weights`` (inferred when None).

    The two sets are balanced: the larger one is subsampled to the size of the smaller, so an
    AUC of 0.5 means chance whatever the split sizes.

    Assumptions: transductive setting — every node's features and edges are seen by training
    (message passing), so "member" means *its true label entered the loss*. In FedGL a test node
    may still carry a *pseudo* label (the consortium's own guess) in the loss; that is part of
    what is measured, not a flaw of the split.

    Raises:
        ValueError: a set is empty, the masks overlap, or a member lacks a label.
    """
    n = graph.num_nodes
    members = _as_bool_mask(graph.train_mask if member_mask is None else member_mask, n, "member_mask")
    pool = _as_bool_mask(graph.test_mask if nonmember_mask is None else nonmember_mask, n, "nonmember_mask")
    if (members & pool).any():
        raise ValueError("member and non-member masks overlap")
    labels = graph.labels.cpu()
    member_index, pool_index = np.flatnonzero(members), np.flatnonzero(pool)
    if (labels.numpy()[np.concatenate([member_index, pool_index])] < 0).any():
        raise ValueError("every member and non-member needs a true label")
    size = min(member_index.size, pool_index.size)
    if size == 0:
        raise ValueError(
            f"membership inference needs members and non-members, got {member_index.size} and {pool_index.size}"
        )
    rng = numpy_stream(seed, "privacy", "membership")
    member_index = np.sort(rng.choice(member_index, size=size, replace=False))
    pool_index = np.sort(rng.choice(pool_index, size=size, replace=False))

    if isinstance(model_weights, torch.nn.Module):
        model = model_weights
    else:
        model = model_from_weights(model_weights, graph.features.shape[1], graph.num_classes, hidden)
    model = model.to(graph.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if adjacency is None:
                adjacency = graph.adjacency(None, 0.0, False)
            logits = model(graph.features, adjacency).logits
    finally:
        model.train(was_training)
    log_probs = torch.log_softmax(logits.detach().cpu().double(), dim=1)
    # only members and non-members (all labelled, checked above) are scored; unlabelled rows (-1, e.g. Citeseer's
    # isolated test nodes) get a placeholder class so the gather over every row stays in range
    scores = membership_scores(log_probs, labels.clamp(min=0))
    member_t, nonmember_t = torch.as_tensor(member_index), torch.as_tensor(pool_index)
    variants = {name: roc_auc(score[member_t], score[nonmember_t]) for name, score in scores.items()}
    attack, auc = _best(variants)
    return MembershipResult(
        auc=auc,
        members=size,
        nonmembers=size,
        attack=attack,
        variants=variants,
        auc_stderr=auc_standard_error(auc, size, size),
    )


def global_model_membership(
    config: ExperimentConfig, weights, graph: GraphTensors, *, round_number: int, seed: int = 0
) -> MembershipResult:
    """:func:`membership_inference_auc` on the global model of ``config``'s method, whatever its model.

    A method that builds its own model (GAP's modules, the class sums of ``--method centroids``, GraphFL's backbone)
    is scored with that model on the graph it evaluates on (its ``evaluation_adjacency`` after round
    ``round_number``: GAP's phase and hop noise, the class sums' propagation); any other with the engine's
    ``training.backbone`` (the 2-layer GCN by default) on the plain Â, as the simulation evaluates it.
    """
    from fedgl_secure.method_registry import method_spec
    from fedgl_secure.methods import build_method
    from fedgl_secure.methods.base import Broadcast
    from fedgl_secure.model.backbones import build_backbone

    flat = torch.as_tensor(np.asarray(weights), dtype=torch.float32).reshape(-1)
    method = None if method_spec(config.method).baseline else build_method(config)
    model = None if method is None else method.build_model(graph.features.shape[1], graph.num_classes)
    if model is not None:
        adjacency = method.evaluation_adjacency(graph, Broadcast(round_number, flat))
    else:
        if config.training.backbone == "gcn":  # the GCN's own checks name a vector of the wrong length
            return membership_inference_auc(flat, graph, seed=seed, hidden=config.training.hidden)
        model = build_backbone(config.training, graph.features.shape[1], graph.num_classes, 0.0)
        adjacency = None
    model.load_flat_parameters(flat)
    return membership_inference_auc(model, graph, adjacency=adjacency, seed=seed)


# --------------------------------------------------------------------------------------------
# Link inference


def true_edge_index(graph: GraphTensors) -> np.ndarray:
    """The real edges of ``graph`` (``2 x E``, both directions, global index of the graph's rows).

    Read off ``graph.base_adjacency`` (``Â`` has the sparsity of ``A + I``), so it works on the
    merged client graph without going back to the clients.
    """
    coo = sp.coo_matrix(graph.base_adjacency)
    keep = (coo.row != coo.col) & (coo.data != 0)
    return np.stack([coo.row[keep], coo.col[keep]]).astype(np.int64)


def _undirected_pairs(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """Unique ``u < v`` pair keys ``u · M + v`` of an edge list (self-loops dropped)."""
    edge_index = np.asarray(edge_index, dtype=np.int64)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"true_edge_index must be 2 x E, got shape {edge_index.shape}")
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise ValueError(f"true_edge_index has node indices outside [0, {num_nodes})")
    low, high = np.minimum(edge_index[0], edge_index[1]), np.maximum(edge_index[0], edge_index[1])
    keep = low != high
    return np.unique(low[keep] * num_nodes + high[keep])


def sample_non_edges(edge_keys: np.ndarray, num_nodes: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct ``u < v`` pair keys drawn uniformly among the pairs that are not edges."""
    total_pairs = num_nodes * (num_nodes - 1) // 2
    if count > total_pairs - edge_keys.size:
        raise ValueError(f"cannot draw {count} non-edges: the graph has only {total_pairs - edge_keys.size}")
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < count:
        need = count - chosen.size
        u = rng.integers(0, num_nodes, size=2 * need + 16)
        v = rng.integers(0, num_nodes, size=2 * need + 16)
        keys = np.minimum(u, v) * num_nodes + np.maximum(u, v)
        keys = keys[(u != v) & ~np.isin(keys, edge_keys) & ~np.isin(keys, chosen)]
        _, first = np.unique(keys, return_index=True)  # keep the draw order, drop repeats
        chosen = np.concatenate([chosen, keys[np.sort(first)][:need]])
    return chosen


def restricted_pseudo_graph(pseudo_graph: PseudoGraph, positions: np.ndarray) -> PseudoGraph:
    """``Ā`` over the nodes at ``positions`` only, renumbered 0..len − 1: what a bank reads of its own customers'
    pairs. A kept neighbour outside them becomes a zero-weight self entry (zero weights are not edges); the
    whole graph is returned as it is when ``positions`` is every node in order."""
    from fedgl_secure.engine.pseudo_graph import PseudoGraph

    positions = np.asarray(positions, dtype=np.int64)
    m = pseudo_graph.num_nodes
    if positions.size == m and np.array_equal(positions, np.arange(m)):
        return pseudo_graph
    if positions.size and (positions.min() < 0 or positions.max() >= m):
        raise ValueError(f"positions outside the pseudo graph's {m} rows")
    local_of = np.full(m, -1, dtype=np.int64)
    local_of[positions] = np.arange(positions.size)
    neighbors = local_of[pseudo_graph.neighbors.cpu().numpy()[positions]]
    weights = pseudo_graph.weights.cpu().numpy()[positions].copy()
    outside = neighbors < 0
    neighbors[outside] = np.broadcast_to(np.arange(positions.size)[:, None], neighbors.shape)[outside]
    weights[outside] = 0.0
    return PseudoGraph(torch.from_numpy(neighbors), torch.from_numpy(weights))


def pseudo_graph_pair_scores(pseudo_graph: PseudoGraph, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``Ā[u, v] + Ā[v, u]`` for each pair (0 where neither direction is an edge of ``Ā``)."""
    matrix = pseudo_graph.to_scipy().astype(np.float64)
    symmetric = (matrix + matrix.T).tocsr()
    return np.asarray(symmetric[rows, cols]).ravel()


def cosine_pair_scores(embeddings: torch.Tensor, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Cosine similarity of the embedding rows of each pair (0 for an all-zero row)."""
    values = embeddings.detach().cpu().double()
    unit = values / values.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (unit[torch.as_tensor(rows)] * unit[torch.as_tensor(cols)]).sum(dim=1).numpy()


def link_inference_auc(
    pseudo_graph: PseudoGraph,
    true_edge_index: np.ndarray,
    num_nodes: int,
    seed: int = 0,
    *,
    embeddings: torch.Tensor | None = None,
    max_pairs: int | None = None,
) -> LinkResult:
    """How well the pseudo graph ``Ā`` reveals the real graph's edges (ROC AUC).

    Args:
        pseudo_graph: ``Ā`` over the global index (``Broadcast.pseudo_graph``).
        true_edge_index: ``2 x E`` real edges in the same global index (either or both
            directions; e.g. :func:`true_edge_index` of ``Federation.merged``).
        num_nodes: ``M``, the size of the global index.
        seed: seeds the sampling of non-edges (and of positives when ``max_pairs`` applies).
        embeddings: optional ``M x D`` per-node matrix (fused embeddings ``H̄`` or predictions
            ``P̄``) for the ``embedding-cosine`` variant.
        max_pairs: score at most this many true edges (a uniform sample); None scores all.

    Positives are the undirected true edges, negatives an equal number of distinct node pairs
    drawn uniformly among the non-edges (the attacker's prior over candidate pairs). The
    attacker is whoever holds ``Ā`` over these nodes — the aggregator, or a bank for the pairs
    of its own nodes — and wants the edges other banks hold.

    Raises:
        ValueError: shapes disagree with ``num_nodes``, or the real graph has no edges.
    """
    if pseudo_graph.num_nodes != num_nodes:
        raise ValueError(f"pseudo graph has {pseudo_graph.num_nodes} rows, num_nodes is {num_nodes}")
    if embeddings is not None and embeddings.shape[0] != num_nodes:
        raise ValueError(f"embeddings have {embeddings.shape[0]} rows, num_nodes is {num_nodes}")
    edges = positives = _undirected_pairs(true_edge_index, num_nodes)
    if edges.size == 0:
        raise ValueError("link inference needs at least one true edge")
    rng = numpy_stream(seed, "privacy", "link")
    if max_pairs is not None and edges.size > max_pairs:
        positives = np.sort(rng.choice(edges, size=max_pairs, replace=False))
    negatives = sample_non_edges(edges, num_nodes, positives.size, rng)
    keys = np.concatenate([positives, negatives])
    rows, cols = keys // num_nodes, keys % num_nodes
    split = positives.size

    def auc_of(scores: np.ndarray) -> float:
        return roc_auc(scores[:split], scores[split:])

    variants = {"pseudo-graph": auc_of(pseudo_graph_pair_scores(pseudo_graph, rows, cols))}
    if embeddings is not None:
        variants["embedding-cosine"] = auc_of(cosine_pair_scores(embeddings, rows, cols))
    attack, auc = _best(variants)
    return LinkResult(
        auc=auc,
        positives=split,
        negatives=int(negatives.size),
        attack=attack,
        variants=variants,
        auc_stderr=auc_standard_error(auc, split, int(negatives.size)),
    )


# --------------------------------------------------------------------------------------------
# Both, on a run's final broadcast


def attack_broadcast(
    broadcast: Broadcast,
    merged: GraphTensors,
    seed: int = 0,
    *,
    adjacency: SparseOperator | None = None,
    embeddings: torch.Tensor | None = None,
) -> AttackReport:
    """Membership inference on ``broadcast.weights`` and link inference on ``broadcast.pseudo_graph``.

    ``merged`` is the merged client graph of the federation (``Federation.merged``); its real
    edges are the link attack's ground truth. ``embeddings`` (e.g. the fused ``H̄``) adds the
    cosine variant; when None the fused predictions ``P̄`` kept on the broadcast are used if present.
    """
    membership = membership_inference_auc(broadcast.weights, merged, adjacency=adjacency, seed=seed)
    link = None
    if broadcast.pseudo_graph is not None:
        if embeddings is None:
            embeddings = broadcast.fused_predictions
        link = link_inference_auc(
            broadcast.pseudo_graph, true_edge_index(merged), merged.num_nodes, seed, embeddings=embeddings
        )
    return AttackReport(membership, link)
