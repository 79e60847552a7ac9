"""What each bank is served of a broadcast: its projection (W̄, its own rows of Ȳ and Ā), signed by the aggregator.

:class:`Projections` holds the broadcast last asked for, decoded once, and each bank's signed projection of it: the
banks of a round ask for the same broadcast at once, so it is decoded once and each projection made once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.consortium.enrolment import UnionIndex
from fedgl_secure.crypto.broadcast_signature import sign_broadcast
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.wire.broadcast import decode_broadcast, encode_projection


@dataclass
class Projection:
    """The broadcast last asked for (its signature label), decoded, and each bank's signed projection of it."""

    label: str
    source: Broadcast | None
    served: dict[str, tuple[bytes, str]] = field(default_factory=dict)


class Projections:
    """The latest broadcast served and its projections (module doc); ``broadcast_key`` signs each
    (``crypto/broadcast_signature.py``)."""

    def __init__(
        self, *, federation: str, config: ExperimentConfig, broadcast_key: Ed25519PrivateKey, index: UnionIndex
    ) -> None:
        self.federation = federation
        self.config = config
        self.broadcast_key = broadcast_key
        self.index = index
        self.latest = Projection("", None)  # the latest broadcast served, decoded, and its projections
        self.lock = threading.Lock()

    def project(self, bank: str, version: int, data: bytes, label: str) -> tuple[bytes, str]:
        """``bank``'s signed projection of the broadcast ``label``. The banks of a round ask for the same broadcast
        at once: it is decoded once and each projection made once, for the latest broadcast asked for."""
        size, positions = self.index.index_for(bank)
        with self.lock:
            if self.latest.label != label:
                self.index.shapes()
                neighbors = self.config.self_supervision.neighbors
                source = decode_broadcast(version, data, self.index.num_parameters, size, neighbors)
                self.latest = Projection(label, source)
            cache = self.latest
            served = cache.served.get(bank)
        if served is None:  # outside the lock: the banks' projections are made side by side
            body = encode_projection(cache.source, positions)
            served = cache.served.setdefault(
                bank, (body, sign_broadcast(self.broadcast_key, self.federation, bank, label, body))
            )
        return served

    def remember(self, label: str, broadcast: Broadcast) -> None:
        """``broadcast`` is the one the banks ask for next: projected from memory, not decoded again."""
        with self.lock:
            self.latest = Projection(label, broadcast)
