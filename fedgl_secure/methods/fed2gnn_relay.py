"""Fed²GNN's set-up exchange between processes: the relay's state and each bank's side (protocol §12).

``fed2gnn_exchange.py`` runs the K level exchanges among banks held in one process. Here the same
exchange runs between banks that only talk to a relay (the consortium's aggregator), which never
reads: it holds public keys, pseudonymised boundary lists and masked ``uint64`` vectors, and adds the
latter mod 2^64.

1. **Key directory.** The relay draws a fresh exchange nonce. Each bank draws an X25519 key and
   publishes its public half signed with its Ed25519 signing key over (federation, nonce, bank, key)
   (:func:`key_statement`); the relay and every bank verify the signatures against the consortium's
   bank verification keys, so the relay cannot substitute a key of its own.
2. **Boundary lists.** Each bank announces the pseudonyms (HMAC under the banks' pseudonym key) of its
   boundary customers, in its own order (by customer id), and the signal width p + 1.
3. **Levels.** For k = 1..K and every active bank a with a non-empty boundary, every other bank uploads
   its masked term (``pairwise_masks.passive_upload``, rows in a's announced order, context
   ``fed2gnn_exchange.exchange_context``); once every passive bank has uploaded, the relay adds the
   uploads, forgets them (it keeps their digests, for repeats) and serves the sum to a alone, who removes
   its masks (``pairwise_masks.active_recover``) and completes S_k for the next level.

Every call is idempotent: a bank repeats a step with the same bytes (same key, same nonce, hence the
same masks), which the relay answers as a duplicate; different bytes for a step already taken are a
conflict. A relay that restarted has another nonce, and a bank that meets it (``stale-exchange``)
starts the exchange again with a fresh key.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from fedgl_secure.crypto import pairwise_masks
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.fileio import PRIVATE_FILE_MODE, write_atomically
from fedgl_secure.log import get_logger
from fedgl_secure.methods.fed2gnn_exchange import ExchangeBank, exchange_context, next_level

KEY_DOMAIN = b"fedgl-secure/fed2gnn-exchange-key/v1\n"
NOT_READY = "not-ready"
STALE = "stale-exchange"
MAX_RESTARTS = 3  # a bank starts the exchange again at most this often after the relay restarted


def key_statement(federation: str, nonce: str, bank: str, public: bytes) -> bytes:
    """The bytes a bank signs to bind its exchange key to itself and to this exchange (domain-separated)."""
    return KEY_DOMAIN + f"{federation}\n{nonce}\n{bank}\n{public.hex()}".encode()


def sign_exchange_key(signing_key: Ed25519PrivateKey, federation: str, nonce: str, bank: str, public: bytes) -> str:
    return signing_key.sign(key_statement(federation, nonce, bank, public)).hex()


def verify_exchange_key(
    verify_key: Ed25519PublicKey, federation: str, nonce: str, bank: str, public: bytes, signature: str
) -> None:
    """Raise :class:`ProtocolConflict` ``bad-signature`` unless ``bank`` signed ``public`` for this exchange (a 409,
    not a 400: the request is well formed, and a forged signature can only be told from a real one by the keys)."""
    try:
        verify_key.verify(bytes.fromhex(signature), key_statement(federation, nonce, bank, public))
    except (InvalidSignature, ValueError):
        raise ProtocolConflict(
            "bad-signature",
            f"exchange key of {bank!r}: bad signature (forged, altered, for another exchange, or another key)",
        ) from None


@dataclass(frozen=True)
class ExchangeView:
    """What the relay publishes: the exchange's parameters, the signed keys so far and the boundary sizes."""

    federation: str
    nonce: str
    hops: int
    banks: tuple[str, ...]
    width: int | None
    keys: dict[str, tuple[str, str]]  # bank → (public key hex, signature hex)
    boundary_sizes: dict[str, int]

    @property
    def complete(self) -> bool:
        return set(self.keys) == set(self.banks) == set(self.boundary_sizes)


@dataclass
class _Level:
    """One (level, active bank) sum at the relay: the masked uploads until all are in, then their sum only."""

    uploads: dict[str, np.ndarray] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    total: np.ndarray | None = None


class ExchangeRelay:
    """The relay's state (the aggregator's part): it verifies, checks sizes and adds; it never unmasks.

    Thread-safe (the HTTP service calls it from worker threads). ``width`` is p + 1 when the projection
    fixes it, else None: the first boundary announcement fixes it and every other must agree.
    """

    def __init__(
        self,
        federation: str,
        banks: Sequence[str],
        hops: int,
        width: int | None,
        verify_keys: Mapping[str, Ed25519PublicKey],
        nonce: str | None = None,
    ) -> None:
        self.federation = federation
        self.banks = tuple(banks)
        self.hops = hops
        self.width = width
        self.verify_keys = dict(verify_keys)
        self.nonce = nonce or secrets.token_hex(16)
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, str]] = {}
        self._boundaries: dict[str, tuple[str, ...]] = {}
        self._levels: dict[tuple[int, str], _Level] = {}
        self.log = get_logger(role="aggregator", federation=federation, exchange="fed2gnn")

    def view(self) -> ExchangeView:
        with self._lock:
            sizes = {bank: len(b) for bank, b in self._boundaries.items()}
            return ExchangeView(self.federation, self.nonce, self.hops, self.banks, self.width, dict(self._keys), sizes)

    def _check(self, bank: str, nonce: str) -> None:
        if bank not in self.banks:
            raise ProtocolConflict("unknown-bank", f"{bank!r} is not a bank of this consortium")
        if nonce != self.nonce:
            raise ProtocolConflict(STALE, f"exchange {nonce[:32]!r} is not the relay's current exchange; start again")

    def publish_key(self, bank: str, nonce: str, public: bytes, signature: str) -> bool:
        """Record ``bank``'s signed exchange key; True when new, False for a repeat of the same key."""
        self._check(bank, nonce)
        if len(public) != 32:
            raise ProtocolConflict("bad-key", f"an X25519 public key is 32 bytes, not {len(public)}")
        verify_exchange_key(self.verify_keys[bank], self.federation, nonce, bank, public, signature)
        with self._lock:
            existing = self._keys.get(bank)
            if existing is not None:
                if existing[0] != public.hex():
                    raise ProtocolConflict("key-changed", f"{bank} published another exchange key before")
                return False
            self._keys[bank] = (public.hex(), signature)
        self.log.info("exchange.key_published", bank=bank)
        return True

    def announce_boundary(self, bank: str, nonce: str, width: int, pseudonyms: Sequence[str]) -> bool:
        """Record ``bank``'s boundary pseudonyms (distinct) and signal width; True when new."""
        self._check(bank, nonce)
        if len(set(pseudonyms)) != len(pseudonyms):
            raise ProtocolConflict("bad-boundary", f"{bank}: boundary pseudonyms must be distinct")
        with self._lock:
            if self.width is not None and width != self.width:
                raise ProtocolConflict("bad-width", f"{bank} announces width {width}; this exchange has {self.width}")
            existing = self._boundaries.get(bank)
            if existing is not None:
                if existing != tuple(pseudonyms):
                    raise ProtocolConflict("boundary-changed", f"{bank} announced another boundary before")
                return False
            self.width = width
            self._boundaries[bank] = tuple(pseudonyms)
        self.log.info("exchange.boundary_announced", bank=bank, size=len(pseudonyms))
        return True

    def boundary(self, bank: str) -> tuple[str, ...]:
        if bank not in self.banks:
            raise ProtocolConflict("unknown-bank", f"{bank!r} is not a bank of this consortium")
        with self._lock:
            if bank not in self._boundaries:
                raise ProtocolConflict(NOT_READY, f"{bank} has not announced its boundary yet")
            return self._boundaries[bank]

    def term_length(self, active: str) -> int:
        """Values in one passive term for ``active``: its boundary size times the width (409 until known)."""
        boundary = self.boundary(active)
        with self._lock:
            if set(self._keys) != set(self.banks) or set(self._boundaries) != set(self.banks):
                raise ProtocolConflict(NOT_READY, "terms are taken once every bank's key and boundary are in")
            return len(boundary) * int(self.width)

    def check_term(self, sender: str, level: int, active: str, nonce: str) -> int:
        """The uint64 values a term of ``sender`` for (``level``, ``active``) must have, once everything but its body
        is checked (the service calls it before it reads the body)."""
        self._check(sender, nonce)
        self._check(active, nonce)
        if sender == active:
            raise ProtocolConflict("not-passive", f"{sender} is the active bank of this sum; it uploads no term")
        if not 1 <= level <= self.hops:
            raise ProtocolConflict("bad-level", f"level {level}: this exchange has levels 1..{self.hops}")
        return self.term_length(active)

    def accept_term(self, sender: str, level: int, active: str, nonce: str, masked: np.ndarray) -> bool:
        """Hold passive bank ``sender``'s masked term for (``level``, ``active``); True when new, False for a repeat
        of the same bytes. ``masked`` must have :meth:`check_term` uint64 values (the service decodes the body
        against it). When the last passive bank's term is in, they are added and dropped."""
        expected = self.check_term(sender, level, active, nonce)
        if masked.dtype != np.uint64 or masked.shape != (expected,):
            raise ProtocolConflict("bad-term", f"a term for {active} is {expected} uint64 values")
        digest = hashlib.sha256(masked.tobytes()).hexdigest()
        with self._lock:
            entry = self._levels.setdefault((level, active), _Level())
            if sender in entry.digests:
                if entry.digests[sender] != digest:
                    raise ProtocolConflict(
                        "conflicting-upload", f"{sender} already uploaded another term for level {level}, {active}"
                    )
                return False
            entry.digests[sender] = digest
            entry.uploads[sender] = masked
            passive = [b for b in self.banks if b != active]
            if set(entry.uploads) == set(passive):
                entry.total = pairwise_masks.relay_sum([entry.uploads[b] for b in passive])
                entry.uploads = {}  # the relay keeps the sum only
        self.log.info("exchange.term_accepted", sender=sender, level=level, active=active, values=expected)
        return True

    def relayed_sum(self, active: str, level: int) -> np.ndarray:
        """The masked sum of the passive terms for (``level``, ``active``), for ``active`` only (409 until complete)."""
        if active not in self.banks:
            raise ProtocolConflict("unknown-bank", f"{active!r} is not a bank of this consortium")
        if not 1 <= level <= self.hops:
            raise ProtocolConflict("bad-level", f"level {level}: this exchange has levels 1..{self.hops}")
        with self._lock:
            entry = self._levels.get((level, active))
            if entry is None or entry.total is None:
                waiting = [b for b in self.banks if b != active and (entry is None or b not in entry.digests)]
                raise ProtocolConflict(NOT_READY, f"level {level} for {active}: waiting for {waiting}")
            return entry.total

    def progress(self) -> dict:
        """For the aggregator's status: which banks published a key and a boundary, and how many of the K level
        sums per bank with a non-empty boundary are made (no values, no pseudonyms)."""
        with self._lock:
            active = [bank for bank, boundary in self._boundaries.items() if boundary]
            made = sum(1 for (_, bank), entry in self._levels.items() if entry.total is not None and bank in active)
            return {
                "keys": sorted(self._keys),
                "boundaries": sorted(self._boundaries),
                "sums_made": made,
                "sums_expected": self.hops * len(active) if len(self._boundaries) == len(self.banks) else None,
            }

    def held(self) -> list[np.ndarray]:
        """Every vector the relay holds now (uploads still waiting and finished sums), for audits and tests."""
        with self._lock:
            return [a for e in self._levels.values() for a in (*e.uploads.values(), e.total) if a is not None]


class RelayPort(Protocol):
    """A bank's way to the relay (over HTTP: ``AggregatorClient``; in-process: :class:`LocalPort`)."""

    def exchange_view(self) -> ExchangeView: ...

    def publish_exchange_key(self, nonce: str, public: bytes, signature: str) -> None: ...

    def announce_boundary(self, nonce: str, width: int, pseudonyms: list[str]) -> None: ...

    def exchange_boundary(self, bank: str) -> list[str]: ...

    def upload_term(self, level: int, active: str, nonce: str, masked: np.ndarray) -> None: ...

    def exchange_sum(self, level: int) -> np.ndarray: ...


@dataclass
class LocalPort:
    """:class:`RelayPort` onto an in-process relay, as bank ``bank`` (tests; the services use HTTP)."""

    relay: ExchangeRelay
    bank: str

    def exchange_view(self) -> ExchangeView:
        return self.relay.view()

    def publish_exchange_key(self, nonce: str, public: bytes, signature: str) -> None:
        self.relay.publish_key(self.bank, nonce, public, signature)

    def announce_boundary(self, nonce: str, width: int, pseudonyms: list[str]) -> None:
        self.relay.announce_boundary(self.bank, nonce, width, pseudonyms)

    def exchange_boundary(self, bank: str) -> list[str]:
        return list(self.relay.boundary(bank))

    def upload_term(self, level: int, active: str, nonce: str, masked: np.ndarray) -> None:
        self.relay.accept_term(self.bank, level, active, nonce, masked)

    def exchange_sum(self, level: int) -> np.ndarray:
        return self.relay.relayed_sum(self.bank, level)


@dataclass(frozen=True)
class BankIdentity:
    """Who a bank is in the exchange: its name, the federation, its signing key, the banks' verification keys,
    and its pseudonym function (HMAC under the banks' shared key)."""

    name: str
    federation: str
    signing_key: Ed25519PrivateKey
    verify_keys: Mapping[str, Ed25519PublicKey]
    pseudonymise: Callable[[Sequence[int]], list[str]]


class ExchangeKeyFile:
    """A bank's exchange key on disk with the nonce it was drawn for (mode 0600, replaced atomically): a bank
    restarted in the middle of an exchange publishes the same key again (a duplicate) instead of another one,
    which the relay would refuse (its terms masked under the first key may already be in sums)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def key_for(self, nonce: str) -> X25519PrivateKey:
        """The key drawn for exchange ``nonce``: the stored one, else a fresh one, stored before it is used."""
        try:
            stored_nonce, key_hex = self.path.read_text().split()
            if stored_nonce == nonce:
                return X25519PrivateKey.from_private_bytes(bytes.fromhex(key_hex))
        except (OSError, ValueError):  # none yet, or unreadable: a fresh key (a new exchange for this bank)
            pass
        key = pairwise_masks.new_private_key()
        raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        write_atomically(self.path, f"{nonce} {raw.hex()}\n".encode(), mode=PRIVATE_FILE_MODE)
        return key


def run_bank_exchange(
    bank: ExchangeBank,
    identity: BankIdentity,
    port: RelayPort,
    hops: int,
    wait: Callable[[], None],
    key_for: Callable[[str], X25519PrivateKey] | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Bank ``identity.name``'s side of the whole exchange: its boundary (customer ids) and E_1..E_K over it,
    exactly what ``exchange_level_sums`` gives it in-process. ``wait()`` pauses between polls of a step that is
    not ready (and raises to stop). ``key_for(nonce)`` gives the bank's key for the relay's exchange (e.g.
    :meth:`ExchangeKeyFile.key_for`, which survives a restart of the bank); without it ``bank.key`` is used. A
    relay that restarted (``stale-exchange``) restarts the exchange with a fresh key, at most
    :data:`MAX_RESTARTS` times."""
    for attempt in range(MAX_RESTARTS + 1):
        try:
            return _exchange_once(bank, identity, port, hops, wait, key_for)
        except ProtocolConflict as conflict:
            if conflict.code != STALE or attempt == MAX_RESTARTS:
                raise
            get_logger(node=identity.name, role="bank").warning("exchange.restarted", detail=conflict.detail[:200])
            if key_for is None:
                bank.key = pairwise_masks.new_private_key()
    raise AssertionError("unreachable")


def _until_ready(call: Callable[[], object], wait: Callable[[], None]):
    while True:
        try:
            return call()
        except ProtocolConflict as conflict:
            if conflict.code != NOT_READY:
                raise
            wait()


def _exchange_once(
    bank: ExchangeBank,
    identity: BankIdentity,
    port: RelayPort,
    hops: int,
    wait: Callable[[], None],
    key_for: Callable[[str], X25519PrivateKey] | None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    me = identity.name
    view = port.exchange_view()
    if view.federation != identity.federation or view.hops != hops or view.banks.index(me) != bank.index:
        raise ProtocolConflict(
            "foreign-exchange",
            f"the relay's exchange ({view.federation}, K = {view.hops}, banks {list(view.banks)}) is not this "
            f"bank's ({identity.federation}, K = {hops}, bank {bank.index})",
        )
    nonce, width = view.nonce, bank.signals.shape[1]
    if key_for is not None:
        bank.key = key_for(nonce)
    public = pairwise_masks.public_bytes(bank.key)
    signature = sign_exchange_key(identity.signing_key, view.federation, nonce, me, public)
    port.publish_exchange_key(nonce, public, signature)
    boundary = bank.boundary()
    port.announce_boundary(nonce, width, identity.pseudonymise(boundary.tolist()))

    def directory() -> ExchangeView:
        current = port.exchange_view()
        if current.nonce != nonce:
            raise ProtocolConflict(STALE, "the relay started another exchange")
        if not current.complete:
            raise ProtocolConflict(NOT_READY, "keys or boundaries missing")
        return current

    view = _until_ready(directory, wait)
    if view.width != width:
        raise ProtocolConflict("bad-width", f"the exchange's width is {view.width}; this bank's signals have {width}")
    publics = {}
    for index, name in enumerate(view.banks):
        key_hex, signature = view.keys[name]
        verify_exchange_key(identity.verify_keys[name], view.federation, nonce, name, bytes.fromhex(key_hex), signature)
        publics[index] = bytes.fromhex(key_hex)
    if publics[bank.index] != public:
        raise ProtocolConflict("key-changed", "the relay lists another exchange key for this bank")
    targets = {}  # active index → (own nodes, rows in its announced order, its boundary size)
    for index, name in enumerate(view.banks):
        if index == bank.index or view.boundary_sizes[name] == 0:
            continue
        announced = {p: row for row, p in enumerate(port.exchange_boundary(name))}
        own, foreign = bank.edges_to(index)
        pseudonyms = identity.pseudonymise(foreign.tolist())
        missing = [p for p in pseudonyms if p not in announced]
        if missing or len(announced) != view.boundary_sizes[name]:
            raise ProtocolConflict(
                "bad-boundary", f"{name}'s announced boundary lacks {len(missing)} customers this bank transacts with"
            )
        targets[index] = (own, np.asarray([announced[p] for p in pseudonyms], dtype=np.int64), len(announced))
    current = bank.signals.astype(np.float64)
    received = []
    for level in range(1, hops + 1):
        for index, (own, rows, size) in targets.items():
            context = exchange_context(bytes.fromhex(nonce), level, index)
            term = bank.term_at_rows(current, own, rows, size)
            passive = [b for b in range(len(view.banks)) if b != index]
            masked = pairwise_masks.passive_upload(bank.key, bank.index, passive, index, publics, term, context)
            port.upload_term(level, view.banks[index], nonce, masked)
        if boundary.size == 0:
            foreign_sum = np.zeros((0, width))
        else:
            relayed = _until_ready(lambda level=level: port.exchange_sum(level), wait)
            passive = [b for b in range(len(view.banks)) if b != bank.index]
            context = exchange_context(bytes.fromhex(nonce), level, bank.index)
            foreign_sum = pairwise_masks.active_recover(bank.key, passive, publics, relayed, context).reshape(
                boundary.size, width
            )
        received.append(foreign_sum)
        current = next_level(bank, current, boundary, foreign_sum)
    return boundary, received
