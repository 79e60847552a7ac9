"""Disjoint client partitions: a Louvain split of one graph into M institutions (FedSage+'s protocol).

Under ``federation.partition = "louvain"`` the clients hold **disjoint** node sets, as banks hold
disjoint customer books: the edges between two clients (inter-bank transfers) are known to both
ends by node id, but neither sees the other's features. The default ``"sampled"`` partition is
DESIGN §4's independent node sampling (overlapping clients).

The Louvain communities (networkx' ``louvain_communities``, seeded) are turned into exactly M clients
by one of two rules (``federation.louvain_balance``):

``"fedsage"`` (the default): FedSage+'s ``louvain_graph_cut`` (Zhang et al., NeurIPS 2021, the split
the Fed²GNN paper follows; github.com/zkhku/fedsage, ``src/utils/louvain_networkx.py``), with
``delta = federation.louvain_delta`` (20 in FedSage+'s configuration):

1. every community longer than ``n // M - delta`` is cut into consecutive pieces of that length
   (nodes in ascending id order; the tail piece is whatever is left);
2. the pieces, longest first (ties: communities in the order of their first node, cut pieces after
   them in the order they were cut), are dealt **sequentially**: the current owner keeps receiving
   pieces until it holds ``>= n // M`` nodes, then the next owner becomes current; a piece that would
   bring the current owner to ``>= n // M + delta`` nodes moves the pointer on to the next owner that
   can take it, and the pointer stays there (where FedSage+'s code would not finish,
   :func:`deal_sequentially` says what happens instead);
3. every owner holding fewer than 2 nodes of a class takes, once per class, the last (highest id)
   node of that class from the first owner holding more than 2 of them.

``"least-loaded"``: the split this module shipped first (not FedSage+'s): communities cut at
``ceil(n / M)``, the pieces dealt longest first to the owner holding the fewest nodes (greedy LPT).

With fewer pieces than clients a client would stay empty: that is refused (:class:`ConfigError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedgl_secure.data.graph import GraphDataset, induced_subgraph
from fedgl_secure.errors import ConfigError


def louvain_communities(dataset: GraphDataset, seed: int, resolution: float = 1.0) -> list[np.ndarray]:
    """Louvain communities of ``dataset`` (networkx, seeded), each a sorted array of node indices.

    Isolated nodes come back as singleton communities (networkx puts every node in one).
    """
    import networkx as nx  # here: only a Louvain split needs it, and it costs every node start-up

    graph = nx.Graph()
    graph.add_nodes_from(range(dataset.num_nodes))
    src, dst = dataset.edge_index
    upper = src < dst
    graph.add_edges_from(zip(src[upper].tolist(), dst[upper].tolist(), strict=True))
    communities = nx.community.louvain_communities(graph, resolution=resolution, seed=seed)
    return [np.sort(np.fromiter(c, dtype=np.int64)) for c in communities]


LouvainBalance = Literal["fedsage", "least-loaded"]
FEDSAGE_DELTA = 20  # FedSage+'s configuration (src/utils/config.py: delta = 20)
FEDSAGE_MIN_PER_CLASS = 2  # FedSage+ tops up owners holding fewer than 2 nodes of a class


def balance_communities(communities: list[np.ndarray], num_nodes: int, num_clients: int) -> list[np.ndarray]:
    """``"least-loaded"``: exactly ``num_clients`` disjoint, sorted node sets from ``communities`` (not FedSage+'s
    rule): pieces of at most ``ceil(n / M)``, dealt longest first to the owner holding the fewest nodes."""
    _check_num_clients(num_clients)
    cap = math.ceil(num_nodes / num_clients)
    pieces: list[np.ndarray] = []
    for community in communities:
        community = np.sort(community)
        pieces.extend(community[start : start + cap] for start in range(0, community.shape[0], cap))
    _check_enough_pieces(len(pieces), num_clients)
    pieces.sort(key=lambda piece: (-piece.shape[0], int(piece[0])))
    sizes = np.zeros(num_clients, dtype=np.int64)
    members: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for piece in pieces:
        target = int(np.argmin(sizes))  # argmin returns the lowest index among ties
        members[target].append(piece)
        sizes[target] += piece.shape[0]
    return [np.sort(np.concatenate(parts)) for parts in members]


def fedsage_pieces(communities: list[np.ndarray], max_length: int) -> list[np.ndarray]:
    """FedSage+'s cut (step 1): communities in the order of their first node, each longer than ``max_length``
    cut into consecutive pieces of ``max_length`` (ascending ids), the cut-off pieces listed after every
    community in the order they were cut; then sorted longest first, stably (so that order breaks ties)."""
    if max_length < 1:
        raise ConfigError(
            f"invalid configuration: federation.louvain_delta: pieces of n // M - delta = {max_length} nodes; "
            "use a smaller delta or fewer clients"
        )
    heads, tails = [], []
    ordered = sorted((np.sort(c) for c in communities), key=lambda c: int(c[0]))
    for order, community in enumerate(ordered):
        heads.append(community[:max_length])
        # FedSage+ appends each cut-off rest to its list of groups and cuts it again when its turn comes: round r's
        # pieces of every community follow round r - 1's
        cuts = range(max_length, community.shape[0], max_length)
        tails.extend((r, order, community[start : start + max_length]) for r, start in enumerate(cuts))
    tails.sort(key=lambda tail: tail[:2])
    return sorted(heads + [piece for _, _, piece in tails], key=lambda piece: -piece.shape[0])


def deal_sequentially(pieces: list[np.ndarray], num_nodes: int, num_clients: int, delta: int) -> list[list[int]]:
    """FedSage+'s dealing (step 2): piece indices per owner. The current owner takes pieces until it holds
    ``>= n // M`` nodes; a piece that would bring it to ``>= n // M + delta`` moves the pointer on.

    Where FedSage+'s code does not finish, a piece goes to the owner holding the fewest nodes (among the open
    owners, if any): when every owner is full while pieces are left (FedSage+ divides by zero) and when no
    open owner can take a piece under ``n // M + delta`` (FedSage+ loops forever; small graphs of few, large
    communities). Where FedSage+'s code finishes, the result is its result.
    """
    full = num_nodes // num_clients
    sizes = [0] * num_clients
    dealt: list[list[int]] = [[] for _ in range(num_clients)]
    open_owners, at = list(range(num_clients)), 0
    for index, piece in enumerate(pieces):
        length = int(piece.shape[0])
        while open_owners and sizes[open_owners[at]] >= full:
            open_owners.pop(at)
            at = at % len(open_owners) if open_owners else 0
        if not open_owners:
            owner = int(np.argmin(sizes))
        else:
            for _ in range(len(open_owners)):
                if sizes[open_owners[at]] + length < full + delta:
                    break
                at = (at + 1) % len(open_owners)
            else:  # a full turn found no owner: the pointer is back where it was
                at = min(range(len(open_owners)), key=lambda i: sizes[open_owners[i]])
            owner = open_owners[at]
        dealt[owner].append(index)
        sizes[owner] += length
    return dealt


def top_up_classes(node_sets: list[np.ndarray], labels: np.ndarray) -> list[np.ndarray]:
    """FedSage+'s class top-up (step 3): for each class (ascending) and owner (in order) holding fewer than 2
    of its nodes, the first owner holding more than 2 gives it its last (highest id) node of the class.

    FedSage+'s loop over donors has ``j = config.num_owners`` where a ``break`` is meant (a Python ``for``
    does not stop on it, so there every donor gives one); one donor per shortfall is the intent, kept here.
    """
    num_classes = int(labels.max()) + 1
    owner = np.full(labels.shape[0], -1, dtype=np.int64)
    for k, nodes in enumerate(node_sets):
        owner[nodes] = k
    members = [[list(nodes[labels[nodes] == c]) for c in range(num_classes)] for nodes in node_sets]
    for c in range(num_classes):
        for receiver in range(len(node_sets)):
            if len(members[receiver][c]) >= FEDSAGE_MIN_PER_CLASS:
                continue
            donor = next((k for k in range(len(node_sets)) if len(members[k][c]) > FEDSAGE_MIN_PER_CLASS), None)
            if donor is not None:  # the donor's list is in ascending id order: its last node is the highest
                node = members[donor][c].pop()
                members[receiver][c].append(node)
                owner[node] = receiver
    return [np.flatnonzero(owner == k) for k in range(len(node_sets))]


def fedsage_balance(
    communities: list[np.ndarray], labels: np.ndarray, num_clients: int, delta: int = FEDSAGE_DELTA
) -> list[np.ndarray]:
    """``"fedsage"``: FedSage+'s ``louvain_graph_cut`` (module docstring, steps 1-3), ``labels`` < 0 unlabelled."""
    _check_num_clients(num_clients)
    num_nodes = int(sum(c.shape[0] for c in communities))
    pieces = fedsage_pieces(communities, num_nodes // num_clients - delta)
    dealt = deal_sequentially(pieces, num_nodes, num_clients, delta)
    _check_enough_pieces(sum(1 for owned in dealt if owned), num_clients)
    node_sets = [np.sort(np.concatenate([pieces[i] for i in owned])) for owned in dealt]
    return top_up_classes(node_sets, labels) if np.any(labels >= 0) else node_sets


def _check_num_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ConfigError(f"invalid configuration: federation.num_clients: must be at least 1, got {num_clients}")


def _check_enough_pieces(filled: int, num_clients: int) -> None:
    if filled < num_clients:
        raise ConfigError(
            f"invalid configuration: federation.num_clients: {num_clients} clients, but the graph's Louvain pieces "
            f"fill only {filled}; use fewer clients"
        )


def louvain_partition(
    dataset: GraphDataset,
    num_clients: int,
    seed: int,
    balance: LouvainBalance = "fedsage",
    delta: int = FEDSAGE_DELTA,
) -> list[np.ndarray]:
    """The node sets of ``num_clients`` disjoint clients covering ``dataset`` (Louvain + the ``balance`` rule)."""
    communities = louvain_communities(dataset, seed)
    if balance == "least-loaded":
        return balance_communities(communities, dataset.num_nodes, num_clients)
    return fedsage_balance(communities, np.asarray(dataset.labels), num_clients, delta)


@dataclass(frozen=True)
class CrossClientEdges:
    """The edges between clients, by node index, as both ends know them (the counterpart of a transfer).

    ``edges`` is ``2 x E``, both directions stored (``edges[:, e]`` = (u, v) with u and v at different
    clients); ``owner[u]`` is the client holding node u.
    """

    edges: np.ndarray
    owner: np.ndarray

    def of_client(self, client: int) -> np.ndarray:
        """``2 x E_k``: the cross edges (own node, foreign node) whose first end client ``client`` holds."""
        keep = self.owner[self.edges[0]] == client
        return self.edges[:, keep]

    def external_degree(self, client: int, nodes: np.ndarray) -> np.ndarray:
        """Number of foreign neighbours of each of ``nodes`` (all held by ``client``)."""
        own = self.of_client(client)
        counts = np.bincount(own[0], minlength=self.owner.shape[0])
        return counts[np.asarray(nodes, dtype=np.int64)]


def cross_client_edges(dataset: GraphDataset, node_sets: list[np.ndarray]) -> CrossClientEdges:
    """The cross-client edges of a disjoint partition (refuses overlapping or incomplete node sets)."""
    owner = partition_owner(dataset.num_nodes, node_sets)
    src, dst = dataset.edge_index
    cut = owner[src] != owner[dst]
    return CrossClientEdges(np.stack([src[cut], dst[cut]]), owner)


def partition_owner(num_nodes: int, node_sets: list[np.ndarray]) -> np.ndarray:
    """``owner[u]``: the client holding node u; refuses sets that overlap or leave nodes out."""
    owner = np.full(num_nodes, -1, dtype=np.int64)
    for k, nodes in enumerate(node_sets):
        if np.any(owner[nodes] >= 0):
            raise ConfigError(f"federation.partition: client {k} shares nodes with another client")
        owner[nodes] = k
    if np.any(owner < 0):
        raise ConfigError(f"federation.partition: {int((owner < 0).sum())} nodes belong to no client")
    return owner


def louvain_clients(
    dataset: GraphDataset,
    num_clients: int,
    seed: int,
    balance: LouvainBalance = "fedsage",
    delta: int = FEDSAGE_DELTA,
) -> list[GraphDataset]:
    """The clients' induced subgraphs of a Louvain partition (cross-client edges are not in them)."""
    return [
        induced_subgraph(dataset, nodes, name=f"{dataset.name}/client-{k}")
        for k, nodes in enumerate(louvain_partition(dataset, num_clients, seed, balance, delta))
    ]
