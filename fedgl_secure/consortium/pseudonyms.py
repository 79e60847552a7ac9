"""Node pseudonyms (DESIGN §5.4): HMAC-SHA256 of a node id under the banks' shared pseudonym key.

Banks share customers; to build one union index without revealing raw customer ids, every bank
replaces each id with ``HMAC-SHA256(pseudonym_key, id)`` before it leaves the bank. The same
customer gets the same pseudonym at every bank, so the aggregator can form the union; without
the key (which only banks hold) a pseudonym cannot be linked back to an id by guessing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence

import numpy as np

from fedgl_secure.errors import ConfigError

PSEUDONYM_KEY_BYTES = 32
PSEUDONYM_PATTERN = r"^[0-9a-f]{64}$"


def pseudonymise(key: bytes, node_ids: Iterable[object]) -> list[str]:
    """Hex pseudonym of each id (ids are encoded as their decimal/str form)."""
    if len(key) < PSEUDONYM_KEY_BYTES:
        raise ConfigError(f"the node-pseudonym key is {len(key)} bytes; at least {PSEUDONYM_KEY_BYTES} are required")
    return [hmac.new(key, str(node_id).encode("utf-8"), hashlib.sha256).hexdigest() for node_id in node_ids]


def union_positions(pseudonym_sets: Sequence[Sequence[str]]) -> tuple[int, list[np.ndarray]]:
    """The union index over pseudonyms: its size M and, per set, each member's position in it.

    Positions follow a fresh secret random order, not the sorted pseudonyms: with a sorted union a
    bank could count how many other banks' customers fall between two of its own pseudonyms.
    """
    union = np.unique(np.concatenate([np.asarray(s, dtype="<U64") for s in pseudonym_sets]))
    order = list(range(union.size))  # order[i]: the position of the i-th sorted pseudonym
    secrets.SystemRandom().shuffle(order)  # the OS CSPRNG: the permutation cannot be reconstructed
    order = np.asarray(order, dtype=np.int64)
    return int(union.size), [
        order[np.searchsorted(union, np.asarray(s, dtype="<U64"))].astype(np.int64) for s in pseudonym_sets
    ]
