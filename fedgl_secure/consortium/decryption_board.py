"""The aggregator's board of partial-decryption tasks: how it gathers ``t`` banks' partial decryptions of a sum.

Banks run no HTTP server; they poll the aggregator. For each sum the aggregator posts a task naming the decrypting
set ``T`` (``t`` banks), the receipts and, per receipt, the upload's ``c1`` polynomials; each bank of ``T`` fetches
it, checks and computes its partial decryption (``crypto/partial_decryption.BankDecryptor``) and posts it back, or
posts its refusal. When a bank of ``T`` neither answers within ``timeouts.decryption_seconds`` nor is alive, or
refuses, the aggregator posts a new task for another set without it (the key authority's partial does not depend on
``T`` and is kept); the sum is abandoned once fewer than ``t`` banks remain. The Lagrange coefficients bind a partial
to its set, so partials of two sets never mix (``threshold.fuse``'s rule, kept here by task).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.crypto.residues import RingLevel, check_residues
from fedgl_secure.errors import CiphertextError, DecryptionRefused, FedGLError, ProtocolConflict
from fedgl_secure.log import get_logger


@dataclass
class DecryptionTask:
    """One request for the partial decryptions of one sum by one decrypting set."""

    task_id: str
    round: int
    kind: str
    receipts: tuple[Receipt, ...]
    upload_c1: tuple[np.ndarray, ...] = field(repr=False)
    decrypting_set: tuple[str, ...]
    chunks: int
    partials: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    refusals: dict[str, str] = field(default_factory=dict)

    def answered(self) -> set[str]:
        return set(self.partials) | set(self.refusals)


class DecryptionUnavailable(FedGLError):
    """Fewer than ``t`` banks could give their partial decryption of a sum: it is not decrypted."""


class DecryptionBoard:
    """Tasks by id, guarded by one condition; handlers run on the HTTP service's threads, :meth:`gather` on the
    aggregator's round loop."""

    def __init__(self, level: RingLevel) -> None:
        self.level = level
        self._tasks: dict[str, DecryptionTask] = {}
        self._changed = threading.Condition()
        self.log = get_logger(role="aggregator", part="decryption-board")

    # --- bank side (HTTP handlers) ---------------------------------------------------------------

    def pending_for(self, bank: str) -> list[DecryptionTask]:
        """The open tasks whose decrypting set holds ``bank`` and that it has not answered."""
        with self._changed:
            return [
                task for task in self._tasks.values() if bank in task.decrypting_set and bank not in task.answered()
            ]

    def task_for(self, task_id: str, bank: str) -> DecryptionTask:
        with self._changed:
            task = self._tasks.get(task_id)
        if task is None:
            raise ProtocolConflict("no-such-task", f"decryption task {task_id[:12]}… is closed or unknown")
        if bank not in task.decrypting_set:
            raise ProtocolConflict("not-in-decrypting-set", f"{bank!r} is not in the decrypting set of this task")
        return task

    def accept_partial(self, task_id: str, bank: str, residues: np.ndarray) -> None:
        """Keep ``bank``'s partial decryption (chunks, k, N) of the task's sum; once per bank and task."""
        task = self.task_for(task_id, bank)
        try:
            checked = check_residues(self.level, residues, task.chunks, f"the partial decryption of {bank!r}")
        except CiphertextError as error:
            raise ProtocolConflict("bad-partial", str(error)) from None
        with self._changed:
            if bank in task.answered():
                raise ProtocolConflict("already-answered", f"{bank!r} already answered this decryption task")
            task.partials[bank] = checked
            self._changed.notify_all()

    def accept_refusal(self, task_id: str, bank: str, reason: str, detail: str) -> None:
        task = self.task_for(task_id, bank)
        with self._changed:
            if bank in task.answered():
                raise ProtocolConflict("already-answered", f"{bank!r} already answered this decryption task")
            task.refusals[bank] = f"{reason}: {detail}"
            self._changed.notify_all()
        self.log.warning("partial.refused", bank=bank, round=task.round, kind=task.kind, reason=reason, detail=detail)

    # --- aggregator side ------------------------------------------------------------------------

    def gather(
        self,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt],
        upload_c1: Sequence[np.ndarray],
        candidates: Sequence[str],
        threshold: int,
        timeout: float,
        alive: Callable[[str], bool],
        stop: threading.Event,
        left_out: set[str] | None = None,
    ) -> tuple[tuple[str, ...], list[np.ndarray]]:
        """The partial decryptions of ``threshold`` banks, trying decrypting sets from ``candidates`` in order:
        returns (the set, its partials in set order). A bank that refuses, or that is not alive or has not answered
        when ``timeout`` runs out, is left out of the next set — and added to ``left_out`` when given, so that the
        caller asks no bank that just failed for its next sums. :class:`DecryptionUnavailable` when fewer than
        ``threshold`` candidates remain; :class:`DecryptionRefused` (reason ``stopped``) when ``stop`` is set."""
        chunks = len(upload_c1[0]) if upload_c1 else 0
        remaining = list(dict.fromkeys(candidates))
        failed: dict[str, str] = {}
        while len(remaining) >= threshold:
            chosen = tuple(remaining[:threshold])
            task = DecryptionTask(
                secrets.token_hex(16), round_number, kind, tuple(receipts), tuple(upload_c1), chosen, chunks
            )
            with self._changed:
                self._tasks[task.task_id] = task
                self._changed.notify_all()
            self.log.info("partials.requested", round=round_number, kind=kind, decrypting_set=list(chosen))
            try:
                missing = self._wait(task, timeout, alive, stop)
            finally:
                with self._changed:
                    self._tasks.pop(task.task_id, None)
            if not missing:
                return chosen, [task.partials[bank] for bank in chosen]
            for bank in missing:
                failed[bank] = task.refusals.get(bank, "did not answer")
            if left_out is not None:
                left_out.update(missing)
            remaining = [bank for bank in remaining if bank not in missing]
            self.log.warning("partials.retry", round=round_number, kind=kind, left_out=missing, remaining=remaining)
        raise DecryptionUnavailable(
            f"{kind!r} of round {round_number}: fewer than t = {threshold} banks gave their partial decryption "
            f"({', '.join(f'{bank}: {why}' for bank, why in sorted(failed.items())) or 'no candidates'})"
        )

    def _wait(
        self, task: DecryptionTask, timeout: float, alive: Callable[[str], bool], stop: threading.Event
    ) -> list[str]:
        """Until every bank of the set answered, the timeout ran out, or one is no longer alive; returns the banks
        that did not give a partial (refused, silent or gone) — empty when all did."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if stop.is_set():
                    raise DecryptionRefused("stopped", "the aggregator is stopping")
                if task.refusals:
                    return sorted(task.refusals)
                silent = [bank for bank in task.decrypting_set if bank not in task.partials]
                if not silent:
                    return []
                gone = [bank for bank in silent if not alive(bank)]
                if gone or time.monotonic() >= deadline:
                    return gone or silent
                self._changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
