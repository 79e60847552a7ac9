"""Fed²GNN's bank-to-bank exchange: the passive banks' per-node level sums, one exchange per tree level.

Every bank is at once *active* (for its own boundary nodes, those with neighbours at other banks)
and *passive* (for the other banks' boundary nodes its customers transact with). At level k a
passive bank b sends active bank a, for each of a's boundary nodes i, the sum over b's neighbours j
of i of ``S_{k−1}(j)`` (``methods/rooted_tree.py``: S_0 = the projected features with a count
channel, S_k = A S_{k−1}); a adds the sums of all passive banks into ``E_k(i)``, and every bank
completes ``S_k`` of its own nodes from its local part and the ``E_k`` it received, ready for the
next level (Algorithm 1; K exchanges in all).

The sums travel under pairwise masks (``crypto/pairwise_masks.py``): the relay adds uploads it cannot
read, and the active bank recovers only the sum over the passive banks. Every passive bank sends a
value (zero where it has no neighbour) for **every** boundary node of the active bank, so the set of
contributors — the mask pattern — is the same for all entries and reveals nothing about which bank
is connected to which node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedgl_secure.crypto import pairwise_masks


@dataclass
class ExchangeBank:
    """One bank's share of the exchange: only its own nodes, graph and cross-edge list.

    ``nodes``: its node ids (sorted); ``adjacency``: its local graph over ``nodes``; ``signals``: S_0 of
    its nodes; ``cross``: ``2 x E`` (own node id, foreign node id) of its inter-bank edges;
    ``foreign_owner``: the bank holding each foreign end (known: the counterpart of a transfer).
    """

    index: int
    nodes: np.ndarray
    adjacency: sp.csr_matrix
    signals: np.ndarray
    cross: np.ndarray
    foreign_owner: np.ndarray
    key: X25519PrivateKey = field(default_factory=pairwise_masks.new_private_key, repr=False)

    def boundary(self) -> np.ndarray:
        """The node ids the bank announces as having foreign neighbours (the rows it receives sums for)."""
        return np.unique(self.cross[0])

    def local_rows(self, node_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.nodes, node_ids)

    def edges_to(self, active: int) -> tuple[np.ndarray, np.ndarray]:
        """(own node id, foreign node id) of this bank's edges to customers of bank ``active``."""
        to_active = self.foreign_owner == active
        return self.cross[0][to_active], self.cross[1][to_active]

    def passive_term(self, level_signals: np.ndarray, active: int, active_boundary: np.ndarray) -> np.ndarray:
        """Σ_{j ∈ this bank, j ~ i} S_{k−1}(j) for each boundary node i of bank ``active`` (zero rows where none)."""
        own, foreign = self.edges_to(active)
        return self.term_at_rows(level_signals, own, np.searchsorted(active_boundary, foreign), active_boundary.size)

    def term_at_rows(self, level_signals: np.ndarray, own: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
        """The passive term with edge e's S_{k−1}(own[e]) added to row ``rows[e]`` of ``size`` rows (the active
        bank's boundary order: by id in the simulation, by announced pseudonym in the services)."""
        term = np.zeros((size, level_signals.shape[1]))
        np.add.at(term, rows, level_signals[self.local_rows(own)])
        return term


@dataclass(frozen=True)
class ExchangeResult:
    """What each active bank received: ``sums[a][k − 1]`` is E_k over ``boundaries[a]`` (rows), for k = 1..K;
    ``bytes_sent[b]`` counts bank b's uploads (8 bytes per value, all levels)."""

    boundaries: list[np.ndarray]
    sums: list[list[np.ndarray]]
    bytes_sent: list[int]


def _secure_sum(
    banks: list[ExchangeBank], terms: dict[int, np.ndarray], active: int, context: bytes
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The masked path: each passive bank masks its term, the relay adds, the active bank unmasks.

    Returns the recovered sum and the relay's view (the uploads it held), for tests and audits.
    """
    passive = sorted(terms)
    publics = {b.index: pairwise_masks.public_bytes(b.key) for b in banks}
    shape = terms[passive[0]].shape
    uploads = [
        pairwise_masks.passive_upload(banks[p].key, p, passive, active, publics, terms[p], context) for p in passive
    ]
    relayed = pairwise_masks.relay_sum(uploads)
    recovered = pairwise_masks.active_recover(banks[active].key, passive, publics, relayed, context)
    return recovered.reshape(shape), uploads


def exchange_context(nonce: bytes, level: int, active: int) -> bytes:
    """The masks' context of one exchange: run nonce, level k and active bank (fresh seeds for each)."""
    return b"fed2gnn/" + nonce + f"/level={level}/active={active}".encode()


def exchange_level_sums(banks: list[ExchangeBank], hops: int, secure: bool, nonce: bytes) -> ExchangeResult:
    """Run the K exchanges among ``banks`` (every bank active for its boundary); ``nonce`` makes the masks
    of this run fresh (a context bound into every pair seed)."""
    boundaries = [bank.boundary() for bank in banks]
    current = [bank.signals.astype(np.float64) for bank in banks]
    sums: list[list[np.ndarray]] = [[] for _ in banks]
    bytes_sent = [0] * len(banks)
    for level in range(1, hops + 1):
        received = []
        for active, boundary in enumerate(boundaries):
            terms = {b.index: b.passive_term(current[b.index], active, boundary) for b in banks if b.index != active}
            for p, term in terms.items():
                bytes_sent[p] += 8 * term.size
            if not terms or boundary.size == 0:
                received.append(np.zeros((boundary.shape[0], current[active].shape[1])))
                continue
            if secure:
                total, _ = _secure_sum(banks, terms, active, exchange_context(nonce, level, active))
            else:
                total = np.sum([terms[p] for p in sorted(terms)], axis=0)
            received.append(total)
        for bank, total in zip(banks, received, strict=True):
            sums[bank.index].append(total)
        # S_k of each bank's own nodes: its local part plus the foreign part it just received
        current = [
            next_level(bank, current[bank.index], boundaries[bank.index], received[bank.index]) for bank in banks
        ]
    return ExchangeResult(boundaries, sums, bytes_sent)


def upload_values(boundary_sizes: list[int], width: int, hops: int) -> list[int]:
    """Values each bank uploads over the K exchanges: for every other bank a, one ``width``-vector per boundary node of
    a and level (zeros included, so the count depends on the boundaries only)."""
    total = sum(boundary_sizes)
    return [hops * width * (total - own) for own in boundary_sizes]


def next_level(bank: ExchangeBank, previous: np.ndarray, boundary: np.ndarray, foreign: np.ndarray) -> np.ndarray:
    """S_k of the bank's own nodes: its local part A S_{k−1} plus the foreign part E_k at its boundary rows."""
    following = bank.adjacency @ previous
    following[bank.local_rows(boundary)] += foreign
    return following
