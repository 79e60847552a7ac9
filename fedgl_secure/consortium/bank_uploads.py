"""A bank's contribution as it leaves the bank: each kind's term encrypted into CKKS chunks with a signed receipt,
and sent to the aggregator as soon as it is encrypted.

:class:`BankUploads` holds what encrypting and signing need — the public context, the policy's HE parameters and
packed layouts, the bank's receipt-signing key (it never leaves this process) — and the bank's encryption pool: a
large upload's kinds are encrypted concurrently on worker processes (TenSEAL holds the GIL, so threads would take
turns), started by the first such upload.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from concurrent.futures import as_completed

import tenseal as ts
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.consortium.aggregator_port import AggregatorPort
from fedgl_secure.crypto.centring import bank_term, wire_reference
from fedgl_secure.crypto.encryption_pool import EncryptionPool, term_chunks
from fedgl_secure.crypto.upload import RoundTicket, Upload, finite_term, make_upload, sign_upload
from fedgl_secure.errors import CiphertextError, FedGLError
from fedgl_secure.phase_timer import PhaseTimer
from fedgl_secure.policy.schema import Policy


class EncryptionRefused(FedGLError):
    """The bank refused to encrypt a kind of its contribution (NaN, or a value outside the policy's range)."""


class BankUploads:
    """Encrypting, signing and sending a bank's contribution (module doc)."""

    def __init__(
        self,
        *,
        name: str,
        context: ts.Context,
        public_context: bytes,
        policy: Policy,
        signing_key: Ed25519PrivateKey,
        aggregator: AggregatorPort,
    ) -> None:
        self.name = name
        self.context = context  # ``public_context`` loaded; the pool's workers load their own
        # a large upload's kinds are encrypted on worker processes, started by the first such upload
        self.encryption = EncryptionPool(public_context, policy.he, workers=max(1, min(4, os.cpu_count() or 1)))
        self.policy = policy
        self.signing_key = signing_key
        self.aggregator = aggregator

    def encrypt_kinds(
        self, ticket: RoundTicket, contribution: Mapping[str, torch.Tensor], reference: torch.Tensor
    ) -> Iterator[Upload]:
        """Each kind's upload, in the order the encryptions finish: a large upload's kinds are encrypted
        concurrently on the bank's encryption pool (worker processes: TenSEAL holds the GIL, so threads would
        take turns), so the caller can send the first while the rest are still being encrypted (:meth:`send`
        times the waiting); a small one here, kind after kind. The weights are centred on ``reference``, the W̄
        this stage trained from (:mod:`~fedgl_secure.crypto.centring`). Receipts are signed here: the signing
        key never leaves this process."""
        centre = wire_reference(reference)
        kinds = sorted(contribution)
        terms = {kind: finite_term(kind, bank_term(kind, contribution[kind], centre)) for kind in kinds}
        layouts = {kind: self.policy.upload_layout(kind) for kind in kinds}
        chunks = sum(term_chunks(self.policy.he, layouts[kind], terms[kind].size) for kind in kinds)
        if not self.encryption.use_for(chunks):
            for kind in kinds:
                yield make_upload(
                    self.context, self.policy.he, ticket, self.name, self.signing_key, kind, terms[kind], layouts[kind]
                )
            return
        participants = len(ticket.participants)
        jobs = {self.encryption.submit(kind, terms[kind], layouts[kind], participants): kind for kind in kinds}
        try:
            for job in as_completed(jobs):
                kind = jobs[job]
                encrypted = job.result()
                yield sign_upload(
                    self.context,
                    ticket,
                    self.name,
                    self.signing_key,
                    kind,
                    encrypted.chunks,
                    terms[kind].size,
                    encrypted.c1_sha256,
                )
        finally:  # an abandoned round: do not encrypt the kinds nobody will send
            for job in jobs:
                job.cancel()

    def close(self) -> None:
        """Stop the encryption pool's workers (the node calls it when it shuts down)."""
        self.encryption.close()

    def send(self, round_number: int, uploads: Iterator[Upload], sent: list[Upload], timer: PhaseTimer) -> int:
        """Upload each of ``uploads`` as it comes (appending it to ``sent``); the bytes sent. Encryption and
        uploads overlap, so ``timer`` gets the parts of the round's time: ``encryption`` while it waited for
        the next kind to be encrypted, ``upload`` while it sent one."""
        total = 0
        while True:
            with timer.phase("encryption"):
                try:
                    upload = next(uploads, None)
                except CiphertextError as error:  # raised by make_upload in the pool, not by the aggregator
                    raise EncryptionRefused(str(error)) from error
            if upload is None:
                return total
            sent.append(upload)
            with timer.phase("upload"):
                self.aggregator.upload(round_number, upload.kind, upload.chunks, upload.receipt)
            total += upload.wire_bytes
