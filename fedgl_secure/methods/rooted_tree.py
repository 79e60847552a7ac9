"""Rooted trees and their level sums (Fed²GNN §4, Proposition 1, Algorithm 1, Appendix A).

The *rooted tree* of node i with depth K is GNN message passing unrolled: its root is i, the
children of a tree node standing for graph node u are u's neighbours, down to depth K (a tree
node is a walk from i; the parent's node reappears among its children). A K-layer GCN evaluated
on the tree gives the root the embedding it gets on i's K-hop ego graph **provided** each tree
edge keeps the weight the GCN gives the graph edge, ``Â_uv = 1/√(d̃_u d̃_v)`` with the *graph's*
degrees, and each tree node keeps its self-loop ``Â_uu`` (the edge-weight correction of
Appendix A); messages flow from children to parents only.

Level k of the tree holds one copy of x_v per walk of length k from i, so its feature sum is
``S_k(i) = (A^k X)_i``, computed recursively ``S_k = A S_{k-1}`` (Algorithm 1): each level costs one
exchange of S_{k-1} at the boundary nodes, so communication grows linearly in K. The tree without
backtracking (a child never stands for its grandparent's node) has the level sums ``B_k`` of
non-backtracking walks, ``B_1 = A X``, ``B_2 = A B_1 − D X``, ``B_k = A B_{k−1} − (D − I) B_{k−2}``:
the subtracted ``η_k`` terms are the correction for the walks that step straight back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedgl_secure.model.adjacency import gcn_normalize


def walk_sums(adjacency: sp.spmatrix, features: np.ndarray, hops: int) -> list[np.ndarray]:
    """``[S_0, …, S_K]`` with ``S_0 = X`` and ``S_k = A S_{k−1}`` (Algorithm 1's recursion): row i of ``S_k`` is the
    feature sum of level k of i's rooted tree."""
    adjacency = sp.csr_matrix(adjacency, dtype=np.float64)
    sums = [np.asarray(features, dtype=np.float64)]
    for _ in range(hops):
        sums.append(adjacency @ sums[-1])
    return sums


def eta_correction(degree: np.ndarray, previous: np.ndarray, k: int) -> np.ndarray:
    """η_k: the backtracking walks to remove at level k, ``D B_0`` for k = 2 and ``(D − I) B_{k−2}`` beyond."""
    scale = degree if k == 2 else degree - 1.0
    return scale[:, None] * previous


def nonbacktracking_sums(adjacency: sp.spmatrix, features: np.ndarray, hops: int) -> list[np.ndarray]:
    """``[B_0, …, B_K]``: level sums of the rooted tree without backtracking, ``B_k = A B_{k−1} − η_k``."""
    adjacency = sp.csr_matrix(adjacency, dtype=np.float64)
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    sums = [np.asarray(features, dtype=np.float64)]
    for k in range(1, hops + 1):
        step = adjacency @ sums[-1]
        sums.append(step if k == 1 else step - eta_correction(degree, sums[-2], k))
    return sums


@dataclass(frozen=True)
class RootedTree:
    """A rooted tree as arrays over its tree nodes (tree node 0 is the root).

    ``node[t]``: the graph node tree node t stands for; ``parent[t]``: its parent (−1 for the root);
    ``depth[t]``: its level.
    """

    node: np.ndarray
    parent: np.ndarray
    depth: np.ndarray

    @property
    def size(self) -> int:
        return int(self.node.shape[0])


def rooted_tree(adjacency: sp.spmatrix, root: int, depth: int) -> RootedTree:
    """The depth-``depth`` rooted tree of ``root``: every walk from the root up to that length (with backtracking)."""
    adjacency = sp.csr_matrix(adjacency)
    nodes, parents, depths = [root], [-1], [0]
    frontier = [0]
    for level in range(1, depth + 1):
        next_frontier = []
        for t in frontier:
            u = nodes[t]
            for v in adjacency.indices[adjacency.indptr[u] : adjacency.indptr[u + 1]]:
                nodes.append(int(v))
                parents.append(t)
                depths.append(level)
                next_frontier.append(len(nodes) - 1)
        frontier = next_frontier
    return RootedTree(np.asarray(nodes), np.asarray(parents), np.asarray(depths))


def tree_propagation(adjacency: sp.spmatrix, tree: RootedTree) -> sp.csr_matrix:
    """The GCN operator on ``tree`` with Appendix A's edge-weight correction.

    Row t aggregates tree node t itself with weight ``Â_uu`` and each child c with weight ``Â_{u, node[c]}``,
    where ``Â`` is the *graph's* normalised adjacency (so the tree's own, smaller degrees never enter);
    parents send nothing down.
    """
    normalised = gcn_normalize(adjacency).tocsr()
    self_weight = normalised.diagonal()[tree.node]
    children = np.flatnonzero(tree.parent >= 0)
    parents = tree.parent[children]
    child_weight = np.asarray(normalised[tree.node[parents], tree.node[children]]).ravel()
    rows = np.concatenate([np.arange(tree.size), parents])
    cols = np.concatenate([np.arange(tree.size), children])
    values = np.concatenate([self_weight, child_weight])
    return sp.csr_matrix((values, (rows, cols)), shape=(tree.size, tree.size))


def grafted_propagation(
    adjacency: sp.spmatrix,
    degree: np.ndarray,
    parent: np.ndarray,
    multiplicity: np.ndarray,
    added_degree: np.ndarray,
) -> sp.csr_matrix:
    """The GCN operator of a bank's graph with rooted trees grafted on, with Appendix A's edge weights.

    ``adjacency``: the bank's own graph over its n nodes; ``degree``: their *true* degrees (foreign
    neighbours included); added node a (index n + a) hangs under ``parent[a]`` (an index below n + a),
    stands for ``multiplicity[a]`` graph nodes of degree ``added_degree[a]`` each. With ``d̃ = degree + 1``:
    row u holds ``1/d̃_u`` for itself, ``1/√(d̃_u d̃_v)`` for a real neighbour v, ``m_c/√(d̃_u d̃_c)`` for a
    grafted child c (its message counted once per node it stands for) and ``1/√(d̃_u d̃_p)`` for its
    parent p — the weights of ``Â`` on the graph the tree unrolls (Proposition 1). A grafted child also
    sends to its parent and hears from it: a child standing for foreign neighbour j of i must aggregate
    x_i, as j does; its other neighbours are its own children (the non-backtracking level below)."""
    adjacency = sp.coo_matrix(adjacency)
    n, added = adjacency.shape[0], parent.shape[0]
    scale = np.concatenate([np.asarray(degree, np.float64), np.asarray(added_degree, np.float64)]) + 1.0
    inv_sqrt = scale**-0.5
    child = n + np.arange(added)
    rows = np.concatenate([np.arange(n + added), adjacency.row, parent, child])
    cols = np.concatenate([np.arange(n + added), adjacency.col, child, parent])
    values = np.concatenate(
        [
            1.0 / scale,
            inv_sqrt[adjacency.row] * inv_sqrt[adjacency.col],
            multiplicity * inv_sqrt[parent] * inv_sqrt[child],
            inv_sqrt[parent] * inv_sqrt[child],
        ]
    )
    return sp.csr_matrix((values, (rows, cols)), shape=(n + added, n + added))
