"""Flooding noise made ahead of the partial decryptions that use it (DESIGN §5.2, Li–Micciancio 2021).

Every partial decryption ``c1·s_i + E`` needs one fresh polynomial ``E`` of wide Gaussian noise per ciphertext, in
NTT form: drawn here, transformed by SEAL's own NTT (:func:`seal_residues.flooding_residues`) — a few milliseconds a
polynomial, most of it SEAL's serialisation, on the critical path of every sum the aggregator waits for. The noise
does not depend on the ciphertext, only on the policy, so a decryptor can make it before it is asked: a
:class:`FloodingReserve` keeps polynomials ready, made by one background thread between decryptions (while its bank
trains). They live in memory only; :meth:`FloodingReserve.take` hands each out once and drops it — never reused,
never written anywhere — and makes on the spot whatever the reserve lacks, so a decryption never waits for the
thread and never gets less fresh noise than before.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import tenseal as ts

from fedgl_secure.crypto import residues, seal_residues
from fedgl_secure.log import get_logger

INITIAL_DEPTH = 8  # polynomials kept ready once a first request shows this decryptor is one that decrypts
MAX_DEPTH = 256  # at most this many (16 MiB at N = 4096 with two data primes)
BATCH = 16  # polynomials per SEAL transform (seal_residues batches up to 16 into one ciphertext)


class FloodingReserve:
    """Fresh flooding polynomials of σ ``std`` at ``level``, shape (k, N) each, kept ready by a background thread.

    Nothing is made before the first request (a decryptor outside every decrypting set costs nothing); from then
    on the reserve aims at twice the largest request seen (at least :data:`INITIAL_DEPTH`, at most ``max_depth``),
    so a decryptor that decrypts kinds of ``c`` ciphertexts finds them ready next time. :meth:`close` stops the
    thread; a closed reserve still makes noise on the spot."""

    def __init__(self, context: ts.Context, level: residues.RingLevel, std: float, max_depth: int = MAX_DEPTH) -> None:
        if not (std > 0 and np.isfinite(std)):
            raise ValueError(f"flooding standard deviation must be positive and finite, got {std}")
        self._context, self._level, self._std = context, level, float(std)
        self._max_depth = max(1, max_depth)
        self._ready: deque[np.ndarray] = deque()
        self._target = 0  # until the first request
        self._closed = False
        self._changed = threading.Condition()
        self._log = get_logger(role="flooding-reserve")
        self._thread = threading.Thread(target=self._fill, name="flooding-reserve", daemon=True)
        self._thread.start()

    def take(self, count: int) -> np.ndarray:
        """``count`` fresh noise polynomials (count, k, N), each handed out once: the reserve's first, the rest made
        now."""
        if count < 0:
            raise ValueError(f"a negative number of noise polynomials: {count}")
        with self._changed:
            ready = [self._ready.popleft() for _ in range(min(count, len(self._ready)))]
            self._target = min(self._max_depth, max(self._target, INITIAL_DEPTH, 2 * count))
            self._changed.notify_all()
        missing = count - len(ready)
        if missing:
            ready.extend(seal_residues.flooding_residues(self._context, self._level, missing, self._std))
        if not ready:
            return np.empty((0, *self._level.shape), dtype=np.uint64)
        return np.stack(ready)

    def ready(self) -> int:
        """Polynomials ready now."""
        with self._changed:
            return len(self._ready)

    def close(self) -> None:
        """Stop the background thread and drop the noise it made."""
        with self._changed:
            self._closed = True
            self._ready.clear()
            self._changed.notify_all()
        self._thread.join(timeout=10)

    def _fill(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or len(self._ready) < self._target)
                if self._closed:
                    return
                wanted = min(BATCH, self._target - len(self._ready))
            try:
                made = seal_residues.flooding_residues(self._context, self._level, wanted, self._std)
            except Exception as error:  # a failing SEAL call: stop filling; take() makes noise on the spot
                self._log.warning("reserve.stopped", error=str(error))
                return
            with self._changed:
                if self._closed:
                    return
                self._ready.extend(made)
