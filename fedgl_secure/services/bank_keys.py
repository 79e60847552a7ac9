"""A bank node's share of the federation's CKKS key: the key ceremony at its first start, its sealed share after.

At its first start a bank runs its side of the dealer-free key generation (``crypto/key_ceremony.py``) through the
key authority's relay: it announces its public key share signed with its receipt-signing key, waits for every bank's
announcement, checks each against the signing keys it holds from provisioning, deals its Shamir shares sealed to each
recipient's announced X25519 key, waits for the shares dealt to it, and computes the collective public context itself
from the signed public shares and the key authority's ``p_0`` (fetched over the key authority's own mutual-TLS
channel). It then checks that the key authority publishes the same context, and seals what it keeps — its Shamir
share and that context — under its operator secret. Later starts unseal it. The bank never holds its own ``s_b``
after dealing, nor anyone's secret.

A bank interrupted between announcing and finishing cannot resume (its ``s_b`` was never written anywhere): the key
authority refuses a second, different announcement, naming the bank, and the federation needs a fresh key.

:class:`PartialDecryptionWorker` is the bank's other duty: next to training, it polls the aggregator for the sums it
is asked to decrypt and answers each with its partial decryption or its refusal (``crypto/partial_decryption.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedgl_secure.consortium.retry import StopRequested, retry_until_ready
from fedgl_secure.crypto import ckks, held_share, threshold
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.held_share import HeldShare
from fedgl_secure.crypto.key_ceremony import BankCeremony
from fedgl_secure.crypto.partial_decryption import BankDecryptor
from fedgl_secure.errors import CryptoError, DecryptionRefused, FedGLError, ProtocolConflict
from fedgl_secure.fileio import PRIVATE_FILE_MODE, write_atomically
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.services.aggregator_client import AggregatorClient
from fedgl_secure.services.key_authority_service import KeyAuthorityClient

KEY_SHARE_FILE = "key_share.sealed"
T = TypeVar("T")


class _Pending(FedGLError):
    """The ceremony waits for other banks (retried)."""


def ensure_key_share(
    state_dir: Path,
    roster: Roster,
    bank: str,
    he: HEParameters,
    operator_secret: bytes,
    key_authority: KeyAuthorityClient,
    signing_key: Ed25519PrivateKey,
    verify_keys: Mapping[str, Ed25519PublicKey],
    log,
    stop: threading.Event | None = None,
    timeout: float = 600.0,
) -> HeldShare:
    """This bank's held share: unsealed from ``state_dir`` when it exists (for this roster), else made by the key
    ceremony (module doc) and sealed there."""
    rings = threshold.rings_for(he)
    path = Path(state_dir) / KEY_SHARE_FILE
    if path.exists():
        held = held_share.unseal_held_share(path.read_bytes(), operator_secret, rings)
        if held.roster.digest() != roster.digest() or held.party != roster.party(bank):
            raise CryptoError(
                f"{path}: the key share was made for another federation or bank list than {roster.federation!r} "
                f"with banks {list(roster.banks)} and t = {roster.threshold}; a new federation key needs fresh state"
            )
        log.info("key_share.unsealed", fingerprint=ckks.fingerprint(held.public_context)[:12])
        return held

    def wait(call: Callable[[], T], what: str) -> T:
        def once() -> T:
            try:
                return call()
            except ProtocolConflict as conflict:
                if conflict.code != "not-ready":  # e.g. already-announced: a real answer, not a wait
                    raise
                raise _Pending(conflict.detail) from None

        return retry_until_ready(once, what, log, timeout=timeout, retry_on=(_Pending,), stop=stop)

    crp = threshold.common_random_polynomial(rings, roster.digest())
    ceremony = BankCeremony(rings, roster, bank, signing_key, crp)
    wait(lambda: key_authority.announce(ceremony.announcement()), "the key authority (announcement)")
    log.info("ceremony.announced", banks=len(roster.banks), threshold=roster.threshold)
    announcements = wait(lambda: _all(key_authority.announcements(), len(roster.banks)), "every bank's public share")
    envelopes = ceremony.deal(announcements, verify_keys)
    wait(lambda: key_authority.deal(envelopes), "the key authority (shares)")
    received = wait(lambda: _all(key_authority.envelopes(), len(roster.banks) - 1), "the shares dealt to this bank")
    authority_share = wait(key_authority.authority_share, "the key authority's public share")
    if authority_share.size != rings.key.size:
        raise CryptoError(f"the key authority's public share has {authority_share.size} residues, not {rings.key.size}")
    held = ceremony.finish(received, authority_share.reshape(rings.key.shape))
    published, fingerprint = wait(key_authority.public_context, "the key authority's collective context")
    if published != held.public_context:
        raise CryptoError(
            f"the key authority publishes context {fingerprint[:12]}…, but the signed public shares make "
            f"{ckks.fingerprint(held.public_context)[:12]}…: refusing to encrypt under a key the banks did not make"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, held_share.seal_held_share(held, operator_secret), PRIVATE_FILE_MODE)
    log.info("ceremony.complete", fingerprint=fingerprint[:12])
    return held


def _all(items: list[T], expected: int) -> list[T]:
    if len(items) < expected:
        raise _Pending(f"{len(items)} of {expected} received")
    return items


class PartialDecryptionWorker:
    """Polls the aggregator for the partial decryptions asked of this bank and answers each (module doc)."""

    def __init__(self, aggregator: AggregatorClient, decryptor: BankDecryptor, poll_seconds: float, log) -> None:
        self.aggregator = aggregator
        self.decryptor = decryptor
        self.poll_seconds = poll_seconds
        self.log = log.bind(part="partial-decryption")
        self.shape = decryptor.rings.data.shape

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_seconds):
            try:
                self.serve_once()
            except (httpx.TransportError, FedGLError) as error:  # the aggregator restarting, a task closed meanwhile
                self.log.debug("decryption.poll_failed", error=str(error)[:300])
            except StopRequested:
                return

    def serve_once(self) -> int:
        """Answer every pending task once; returns how many were answered."""
        answered = 0
        for task in self.aggregator.decryption_tasks():
            c1s = self.aggregator.decryption_c1(task, self.shape)
            downloaded = sum(c1.nbytes for c1 in c1s)  # the verification download: every receipted upload's c1
            try:
                residues = self.decryptor.partial(task.round, task.kind, task.receipts, c1s, task.decrypting_set)
            except DecryptionRefused as refusal:
                self.aggregator.refuse_decryption(task.task_id, refusal.reason, refusal.detail)
                self.log.info("decryption.refusal_sent", round=task.round, kind=task.kind, c1_bytes=downloaded)
            else:
                self.aggregator.post_partial(task.task_id, np.ascontiguousarray(residues))
                self.log.info(
                    "decryption.partial_sent",
                    round=task.round,
                    kind=task.kind,
                    chunks=len(residues),
                    c1_bytes=downloaded,
                    partial_bytes=residues.nbytes,
                )
            answered += 1
        return answered
