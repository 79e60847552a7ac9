"""Encrypting upload terms on worker processes, so that a bank's kinds (or, in the simulation, the banks of a
round) are really encrypted at the same time.

TenSEAL's bindings hold the GIL while SEAL encodes and encrypts, so threads take turns: measured on the 2-core
machine (N = 4096), 80 encryptions took 0.174 s on one thread and 0.192 s as 2 × 40 on two threads, while two
processes of 200 each finished in the time one process takes for 200. A pool of processes is therefore what
runs encryption in parallel; each worker loads the **public** context once (the pool's initializer), and a job
carries only the term's values and how to pack them, and returns the serialised chunks. Receipts are signed by
the caller, so signing keys never leave their process.

The pool uses the ``spawn`` start method: a forked child of a process whose other threads (torch's, the
aggregator's) may hold a lock inside SEAL or the allocator could deadlock; a spawned worker imports only this
module's dependencies (no torch).
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import ckks, packing
from fedgl_secure.crypto.receipts import c1_digest
from fedgl_secure.crypto.upload import encrypt_term, upload_c1
from fedgl_secure.policy.he import HEParameters

# Batches of fewer ciphertexts are encrypted by the caller: a chunk takes ~2.5 ms at N = 4096, and starting the
# workers about a second once (Cora's rounds of six banks have 42 chunks).
POOL_MIN_CHUNKS = 24

# A worker process's own copy of the public context, set once by the pool's initializer. ProcessPoolExecutor
# offers no other place to keep per-process state; it exists only in worker processes, never in the caller.
_worker_context: list[ts.Context] = []


@dataclass(frozen=True)
class EncryptedTerm:
    """One term's ciphertext chunks, the SHA-256 of their ``c1`` polynomials (what the bank's receipt binds:
    :func:`~fedgl_secure.crypto.upload.sign_upload`; read back from the chunks here, so the bank's process only
    signs) and the seconds the worker spent on both (the bank's own time)."""

    chunks: list[bytes]
    c1_sha256: str
    seconds: float


def _load_public_context(public_context: bytes) -> None:
    _worker_context.append(ckks.load_public_context(public_context))


def encrypt_with_digest(
    context: ts.Context,
    params: HEParameters,
    layout: packing.KindLayout | None,
    participants: int,
    kind: str,
    values: np.ndarray,
) -> EncryptedTerm:
    """One term's chunks under the public ``context`` and the digest of their ``c1`` polynomials, timed: what a
    bank's encryption hands to whoever signs its receipt (a pool worker's caller, or a simulated bank's round)."""
    started = time.perf_counter()
    chunks = encrypt_term(context, params, layout, participants, kind, values)
    return EncryptedTerm(chunks, c1_digest(upload_c1(context, chunks)), time.perf_counter() - started)


def _encrypt(
    params: HEParameters, layout: packing.KindLayout | None, participants: int, kind: str, values: np.ndarray
) -> EncryptedTerm:
    return encrypt_with_digest(_worker_context[0], params, layout, participants, kind, values)


def term_chunks(params: HEParameters, layout: packing.KindLayout | None, length: int) -> int:
    """Ciphertexts one term of ``length`` values takes (N/2 slots each; packed kinds take fewer slots)."""
    return ckks.chunk_count(packing.slot_length(layout, length), params.poly_modulus_degree // 2)


class EncryptionPool:
    """Up to ``workers`` processes that encrypt terms under one public context (the module doc says why
    processes), started on first use.

    :meth:`use_for` decides per batch: a batch of fewer than ``min_chunks`` ciphertexts is better encrypted by
    the caller (a chunk takes ~2.5 ms at N = 4096; starting the workers takes about a second once, and each
    hand-over a fraction of a millisecond), unless the workers are already running. Errors raised while
    encrypting (a value outside the packed range, more participants than the headroom) come back from the
    future as the same :class:`~fedgl_secure.errors.CiphertextError` the caller would have raised itself."""

    def __init__(
        self, public_context: bytes, params: HEParameters, workers: int, min_chunks: int = POOL_MIN_CHUNKS
    ) -> None:
        if workers < 1:
            raise ValueError(f"an encryption pool needs at least one worker, got {workers}")
        self.public_context = public_context
        self.params = params
        self.workers = workers
        self.min_chunks = min_chunks
        self._executor: ProcessPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._executor is not None

    def use_for(self, chunks: int) -> bool:
        """Whether a batch of ``chunks`` ciphertexts should go to the workers (starting them if needed)."""
        if self.workers == 1:
            return False
        if self._executor is None:
            if chunks < self.min_chunks:
                return False
            self._start()
        return True

    def _start(self) -> None:
        self._executor = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_load_public_context,
            initargs=(self.public_context,),
        )
        # start every worker now (spawning and importing take about a second), not behind a batch's first job
        for future in [self._executor.submit(time.sleep, 0.05) for _ in range(self.workers)]:
            future.result()

    def submit(
        self, kind: str, values: np.ndarray, layout: packing.KindLayout | None, participants: int
    ) -> Future[EncryptedTerm]:
        """Encrypt one pre-weighted term (flat float64) as :func:`~fedgl_secure.crypto.upload.encrypt_term`
        does, on a worker."""
        if self._executor is None:
            self._start()
        flat = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        return self._executor.submit(_encrypt, self.params, layout, participants, kind, flat)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
