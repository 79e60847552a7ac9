"""GraphFL's clients and splits (Wang et al., §5.1): labelled nodes spread over clients that all see the
whole graph, the overlap variant (clients holding overlapping subgraphs), support/query halves, and the
new-label-domain split of the classes.

Pure functions of the dataset and a seed; every draw comes from a named stream (``seeding``), so any
party can rebuild the same clients.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.sparse.csgraph import reverse_cuthill_mckee

from fedgl_secure.data.graph import GraphDataset, induced_subgraph
from fedgl_secure.data.partition import louvain_communities
from fedgl_secure.errors import ConfigError
from fedgl_secure.seeding import numpy_stream


def support_query_split(
    nodes: np.ndarray, query_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A client's labelled nodes cut at random into a support set and a query set (sorted, disjoint).

    The query set gets ``round(query_fraction · n)`` nodes, at least one and at most n − 1 when n ≥ 2
    (both sets non-empty); a single labelled node is support only.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    if not 0.0 < query_fraction < 1.0:
        raise ConfigError(f"graphfl.query_fraction = {query_fraction}: must be in (0, 1)")
    if nodes.size < 2:
        return np.sort(nodes), np.zeros(0, dtype=np.int64)
    size = min(max(1, int(round(query_fraction * nodes.size))), nodes.size - 1)
    shuffled = rng.permutation(nodes)
    return np.sort(shuffled[size:]), np.sort(shuffled[:size])


def _masked(dataset: GraphDataset, name: str, train: np.ndarray, val: np.ndarray, test: np.ndarray) -> GraphDataset:
    masks = []
    for nodes in (train, val, test):
        mask = np.zeros(dataset.num_nodes, dtype=bool)
        mask[nodes] = True
        masks.append(mask)
    return dataclasses.replace(dataset, name=name, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def graphfl_clients(
    dataset: GraphDataset,
    num_clients: int,
    labels_per_class: int,
    seed: int,
    test_size: int = 1000,
    val_size: int = 500,
) -> list[GraphDataset]:
    """The paper's non-IID clients: every client sees the whole graph; ``labels_per_class`` labelled nodes
    of each class, drawn at random, are spread evenly over the clients (each holds ~C·n/K of them, a
    random mix of classes); ``test_size`` random nodes are every client's test set.

    The paper has no validation set (the authors' code reports the best test accuracy over rounds); we
    draw ``val_size`` random nodes, disjoint from the test and training nodes, to pick the reported
    round and settle options. Nodes without a label (``-1``) are never drawn.
    """
    if num_clients < 1:
        raise ConfigError(f"num_clients = {num_clients}: at least one client is needed")
    rng = numpy_stream(seed, "graphfl", "split")
    train, val, test = _draw_labelled(dataset, labels_per_class, rng, test_size, val_size)
    spread = np.array_split(rng.permutation(train), num_clients)
    return [_masked(dataset, f"{dataset.name}/client-{k}", nodes, val, test) for k, nodes in enumerate(spread)]


def _draw_labelled(
    dataset: GraphDataset, labels_per_class: int, rng: np.random.Generator, test_size: int, val_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(training, validation, test) nodes: ``test_size`` then ``val_size`` random labelled nodes, then
    ``labels_per_class`` of each class from the rest (the training nodes, class after class)."""
    labelled = np.flatnonzero(dataset.labels >= 0)
    if test_size + val_size >= labelled.size:
        raise ConfigError(
            f"test_size + val_size = {test_size + val_size} leaves no training nodes among {labelled.size} labelled"
        )
    shuffled = rng.permutation(labelled)
    test, val, rest = shuffled[:test_size], shuffled[test_size : test_size + val_size], shuffled[test_size + val_size :]
    train = []
    for c in range(dataset.num_classes):
        pool = rest[dataset.labels[rest] == c]
        if pool.size < labels_per_class:
            raise ConfigError(
                f"labels_per_class = {labels_per_class}: class {c} has only {pool.size} nodes outside the test "
                "and validation sets"
            )
        train.append(rng.choice(pool, size=labels_per_class, replace=False))
    return np.concatenate(train), val, test


def community_order(dataset: GraphDataset, seed: int) -> np.ndarray:
    """Every node once, in an order where neighbours sit close: the Louvain communities (seeded), largest first
    (ties: lowest first node), each in reverse Cuthill-McKee order of its induced subgraph (which keeps the
    band of its adjacency narrow, so consecutive nodes tend to be linked)."""
    adjacency = dataset.adjacency()
    communities = sorted(louvain_communities(dataset, seed), key=lambda c: (-c.size, int(c[0])))
    ordered = []
    for community in communities:
        inside = adjacency[community][:, community].tocsr()
        ordered.append(community[np.asarray(reverse_cuthill_mckee(inside, symmetric_mode=True), dtype=np.int64)])
    return np.concatenate(ordered)


def overlapping_windows(order: np.ndarray, num_clients: int, overlap: float) -> list[np.ndarray]:
    """The authors' overlapping subgraphs (``get_sub_dataset`` in their utils_gnn.py): windows of ``s`` consecutive
    nodes of ``order``, client i's starting at ``round(i·(1−γ)·s)``, with ``s = ceil(n / (K − (K−1)·γ))`` so
    that the K windows cover all n nodes; client i and client i+1 share ~γ·s nodes (a chain: the last client
    shares with its predecessor only; with γ ≥ 0.5 client i also meets client i+2). Sorted node arrays."""
    n = int(order.size)
    size = int(np.ceil(n / (num_clients - (num_clients - 1) * overlap)))
    starts = [int(np.round(i * (1.0 - overlap) * size)) for i in range(num_clients)]
    if starts[-1] >= n:
        raise ConfigError(f"num_clients = {num_clients}: too many clients for a graph of {n} nodes")
    return [np.sort(order[start : min(start + size, n)]) for start in starts]


def graphfl_overlap_clients(
    dataset: GraphDataset,
    num_clients: int,
    labels_per_class: int,
    seed: int,
    overlap: float,
    test_size: int = 1000,
    val_size: int = 500,
) -> list[GraphDataset]:
    """The paper's overlap variant of the non-IID setting: each client holds its own subgraph, client i and its
    neighbour i+1 share a fraction ``overlap`` (γ) of their nodes, and every edge whose ends no client holds
    both of is dropped (each client keeps the subgraph its nodes induce).

    The division is the authors' chain of overlapping windows (:func:`overlapping_windows`) over
    :func:`community_order`: their windows run over the node ids of their data files, which on Cora and
    Citeseer keep ~7 % / ~6 % of the edges at γ = 0 (a random division: 2 %), leaving the clients nearly
    edgeless; Louvain communities in reverse Cuthill-McKee order keep ~51 % / ~73 % (docs/reproduction.md).

    The training, validation and test nodes are :func:`graphfl_clients`' for the same seed (the same draws
    from the same stream); a client's training nodes are the drawn ones among the nodes it holds (a shared
    node's label is known to both clients that hold it; a client may hold none), its validation and test
    nodes the global ones it holds, so the union of the clients is the graph without the dropped edges,
    with the global validation and test sets.
    """
    if num_clients < 1:
        raise ConfigError(f"num_clients = {num_clients}: at least one client is needed")
    if not 0.0 <= overlap < 1.0:  # also refuses nan
        raise ConfigError(f"overlap = {overlap}: the shared fraction γ must be in [0, 1)")
    train, val, test = _draw_labelled(
        dataset, labels_per_class, numpy_stream(seed, "graphfl", "split"), test_size, val_size
    )
    whole = _masked(dataset, dataset.name, train, val, test)
    windows = overlapping_windows(community_order(dataset, seed), num_clients, overlap)
    return [induced_subgraph(whole, nodes, name=f"{dataset.name}/client-{k}") for k, nodes in enumerate(windows)]


def split_label_domains(num_classes: int, new_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training classes, new classes): ``new_classes`` (K₀) classes held out at random for the new label
    domain (Algorithm 2); the clients never see a node of them during federated training."""
    if not 1 <= new_classes < num_classes:
        raise ConfigError(f"new_classes = {new_classes}: must be in [1, {num_classes - 1}]")
    order = numpy_stream(seed, "graphfl", "label-domains").permutation(num_classes)
    return np.sort(order[new_classes:]), np.sort(order[:new_classes])


@dataclasses.dataclass(frozen=True)
class Task:
    """A K₀-way task: ``nodes`` with their task-local labels ``0..K₀-1`` (``classes[j]`` is label j)."""

    classes: np.ndarray
    nodes: np.ndarray
    labels: np.ndarray


def sample_task(
    labels: np.ndarray,
    classes: np.ndarray,
    ways: int,
    shots: int,
    rng: np.random.Generator,
    exclude: np.ndarray | None = None,
) -> Task:
    """``ways`` classes drawn from ``classes``, ``shots`` nodes of each (never from ``exclude``)."""
    chosen = np.sort(rng.choice(classes, size=ways, replace=False))
    allowed = np.ones(labels.shape[0], dtype=bool)
    if exclude is not None:
        allowed[exclude] = False
    nodes, task_labels = [], []
    for j, c in enumerate(chosen):
        pool = np.flatnonzero((labels == c) & allowed)
        if pool.size < shots:
            raise ConfigError(f"class {c} has {pool.size} nodes, a task needs {shots}")
        nodes.append(rng.choice(pool, size=shots, replace=False))
        task_labels.append(np.full(shots, j, dtype=np.int64))
    return Task(chosen, np.concatenate(nodes), np.concatenate(task_labels))


@dataclasses.dataclass(frozen=True)
class EvaluationDraw:
    """One test-time draw of the new label domain (Algorithm 2): the fine-tuning shots, validation nodes and
    test nodes of the same K₀ new classes, pairwise disjoint."""

    fine_tune: Task
    val: Task
    test: Task


def evaluation_draw(
    labels: np.ndarray, new: np.ndarray, ways: int, shots: int, rng: np.random.Generator, per_class: int = 20
) -> EvaluationDraw:
    """``shots`` fine-tuning nodes per new class, then ``per_class`` test and ``per_class`` validation nodes
    of the same classes that are neither (the validation nodes settle the adaptation setting; the paper has
    none, its authors' code reads the best test accuracy)."""
    fine_tune = sample_task(labels, new, ways, shots, rng)
    test = sample_task(labels, fine_tune.classes, ways, per_class, rng, exclude=fine_tune.nodes)
    val = sample_task(
        labels, fine_tune.classes, ways, per_class, rng, exclude=np.concatenate([fine_tune.nodes, test.nodes])
    )
    return EvaluationDraw(fine_tune, val, test)


def task_client(
    dataset: GraphDataset, task: Task, name: str, val: Task | None = None, test: Task | None = None
) -> GraphDataset:
    """The whole graph with only ``task``'s nodes labelled (task-local labels) as training nodes, and the
    optional validation and test tasks' nodes (same classes) as its validation and test sets."""
    labels = np.full(dataset.num_nodes, -1, dtype=np.int64)
    parts = [task] + [t for t in (val, test) if t is not None]
    for part in parts:
        if not np.array_equal(part.classes, task.classes):
            raise ValueError("a client's validation and test tasks must have its training task's classes")
        labels[part.nodes] = part.labels
    empty = np.zeros(0, dtype=np.int64)
    client = _masked(
        dataset, name, task.nodes, val.nodes if val is not None else empty, test.nodes if test is not None else empty
    )
    return dataclasses.replace(client, labels=labels, num_classes=int(task.classes.size))
