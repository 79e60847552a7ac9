"""Disjoint client partitions: a Louvain split of one graph into M institutions (FedSage+'s protocol).

Under ``federation.partition = "louvain"`` the clients hold **disjoint** node sets, as banks hold
disjoint customer books: the edges between two clients (inter-bank transfers) are known to both
ends by node id, but neither sees the other's features. The default ``"sampled"`` partition is
DESIGN §4's independent node sampling (overlapping clients).

The Louvain communities (networkx' ``louvain_communities``, seeded) are turned into exactly M
clients by the rule FedSage+ uses to balance owners:

1. every community larger than ``ceil(n / M)`` is cut into consecutive pieces of at most that size
   (nodes in ascending id order), so no client is forced above the balanced size by one community;
2. pieces are dealt largest first (ties: smallest first node id) to the client that holds the fewest
   nodes so far (ties: lowest client number).

With fewer pieces than clients a client would stay empty: that is refused (:class:`ConfigError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def balance_communities(communities: list[np.ndarray], num_nodes: int, num_clients: int) -> list[np.ndarray]:
    """Exactly ``num_clients`` disjoint, sorted node sets from ``communities`` (the module's split/merge rule)."""
    if num_clients < 1:
        raise ConfigError(f"invalid configuration: federation.num_clients: must be at least 1, got {num_clients}")
    cap = math.ceil(num_nodes / num_clients)
    pieces: list[np.ndarray] = []
    for community in communities:
        community = np.sort(community)
        pieces.extend(community[start : start + cap] for start in range(0, community.shape[0], cap))
    if len(pieces) < num_clients:
        raise ConfigError(
            f"invalid configuration: federation.num_clients: {num_clients} clients, but the graph splits into "
            f"only {len(pieces)} Louvain pieces; use fewer clients"
        )
    pieces.sort(key=lambda piece: (-piece.shape[0], int(piece[0])))
    sizes = np.zeros(num_clients, dtype=np.int64)
    members: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for piece in pieces:
        target = int(np.argmin(sizes))  # argmin returns the lowest index among ties
        members[target].append(piece)
        sizes[target] += piece.shape[0]
    return [np.sort(np.concatenate(parts)) for parts in members]


def louvain_partition(dataset: GraphDataset, num_clients: int, seed: int) -> list[np.ndarray]:
    """The node sets of ``num_clients`` disjoint clients covering ``dataset`` (Louvain + the balancing rule)."""
    return balance_communities(louvain_communities(dataset, seed), dataset.num_nodes, num_clients)


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


def louvain_clients(dataset: GraphDataset, num_clients: int, seed: int) -> list[GraphDataset]:
    """The clients' induced subgraphs of a Louvain partition (cross-client edges are not in them)."""
    return [
        induced_subgraph(dataset, nodes, name=f"{dataset.name}/client-{k}")
        for k, nodes in enumerate(louvain_partition(dataset, num_clients, seed))
    ]
