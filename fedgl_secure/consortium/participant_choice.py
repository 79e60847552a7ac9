"""Who takes part in the aggregator's next round: the banks' liveness, their withdrawals, the participants chosen.

:class:`Participation` holds when each bank was last heard from, the banks that withdrew (recorded in the store: a
bank whose privacy budget is spent takes no further part) and, per base version, the banks that missed an upload
deadline of a round from it (its reopening goes without them). It chooses a round's participants
(:meth:`Participation.choose`), or says why no round can ever be decrypted again (:meth:`Participation.exhausted`:
fewer than the quorum left, the simulation's rule).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fedgl_secure.consortium.aggregator_store import AggregatorStore, Withdrawal
from fedgl_secure.data.sampling import select_participants
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.policy.schema import Policy

BUDGET_EXHAUSTED = "privacy-budget-exhausted"
WITHDRAWAL_REASONS = {BUDGET_EXHAUSTED: "privacy budget exhausted"}  # code → what a stopped_reason says


def quorum(policy: Policy) -> int:
    """Banks a round's sum needs: the policy's quorum (never below two, which the policy's validator
    enforces: one bank's sum is its data)."""
    return policy.quorum


@dataclass(frozen=True)
class Choice:
    """Who takes part in the next round and how many must upload everything — or why the run stops."""

    participants: tuple[str, ...] = ()
    stopped_reason: str | None = None


class Participation:
    """The consortium's banks as the round loop sees them (module doc). ``changed`` is the coordinator's condition:
    every change here notifies it, and the waits here wait on it."""

    def __init__(
        self,
        *,
        banks: Sequence[str],
        config: ExperimentConfig,
        policy: Policy,
        store: AggregatorStore,
        changed: threading.Condition,
        liveness_seconds: float,
        log,
    ) -> None:
        self.banks = tuple(banks)
        self.config = config
        self.policy = policy
        self.store = store
        self.changed = changed
        self.liveness_seconds = liveness_seconds
        self.log = log
        self.seen: dict[str, float] = {}
        self.started = time.monotonic()
        self.withdrawn: dict[str, Withdrawal] = store.withdrawals()
        # base version → banks that missed an upload deadline of a round from it: its reopening goes without them
        self.missed: dict[int, set[str]] = {}

    def bank_index(self, bank: str) -> int:
        if bank not in self.banks:
            raise ProtocolConflict("unknown-bank", f"{bank!r} is not a bank of this consortium")
        return self.banks.index(bank)

    def heartbeat(self, bank: str) -> None:
        self.bank_index(bank)
        with self.changed:
            self.seen[bank] = time.monotonic()
            self.changed.notify_all()

    def withdraw(self, bank: str, reason: str, round_number: int) -> bool:
        """Record that ``bank`` takes no further part (``reason``: a :data:`WITHDRAWAL_REASONS` code; it
        declined round ``round_number``). True when new, False when it repeats a recorded withdrawal.

        Durable before it counts; the round loop stops inviting the bank, stops waiting for it in an
        open round, and ends the run once too few banks are left (:meth:`choose`).
        """
        self.bank_index(bank)
        if reason not in WITHDRAWAL_REASONS:
            raise ProtocolConflict("bad-withdrawal", f"unknown reason {reason!r}; known: {sorted(WITHDRAWAL_REASONS)}")
        with self.changed:
            # a bank declines a round it was invited to: one this aggregator opened (or is about to open)
            latest = self.store.last_round_number()
            if round_number > latest + 1:
                raise ProtocolConflict(
                    "bad-withdrawal", f"round {round_number} was never opened (the latest is {latest}); not recorded"
                )
            self.seen[bank] = time.monotonic()
            if bank in self.withdrawn:
                return False
            self.withdrawn[bank] = self.store.withdraw(bank, reason, round_number)
            left = [b for b in self.banks if b not in self.withdrawn]
            self.changed.notify_all()
        self.log.warning("bank.withdrew", bank=bank, reason=reason, round=round_number, banks_left=left)
        return True

    def alive(self, bank: str) -> bool:
        """Whether ``bank`` polled within the liveness window (its decryption thread polls while it trains)."""
        seen = self.seen.get(bank)
        return seen is not None and time.monotonic() - seen <= self.liveness_seconds

    def wait_for_every_bank(self, stop: threading.Event) -> bool:
        """Wait until every bank was heard from within ``liveness_seconds`` (the label prior needs them all)."""
        with self.changed:
            while not stop.is_set():
                now = time.monotonic()
                if all(now - self.seen.get(bank, -1e18) <= self.liveness_seconds for bank in self.banks):
                    return True
                self.changed.wait(0.2)
        return False

    def chosen(self, training_round: int) -> tuple[str, ...]:
        """The banks :func:`select_participants` draws for ``training_round``, withdrawn ones included."""
        chosen = select_participants(
            len(self.banks), self.config.federation.participation, self.config.seed, training_round
        )
        return tuple(self.banks[k] for k in chosen)

    def participants(self, training_round: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(chosen for this round and not withdrawn, of those the banks heard from within ``liveness_seconds``)."""
        names = tuple(b for b in self.chosen(training_round) if b not in self.withdrawn)
        now = time.monotonic()
        return names, tuple(b for b in names if now - self.seen.get(b, -1e18) <= self.liveness_seconds)

    def exhausted(self, version: int, pinned: tuple[str, ...]) -> str | None:
        """Why no round from ``version`` can ever be decrypted, now that banks withdrew; None while one can.

        Fewer than the quorum of the banks chosen for the training round are left (with every bank
        chosen: fewer than the quorum in the federation) — the simulation stops on the same rule — or
        a pinned retry (:meth:`pinned_contributors`) lost one of the banks it must have exactly.
        """
        if not self.withdrawn:
            return None
        withdrawn = sorted(self.withdrawn.values(), key=lambda w: (w.round, w.bank))
        why = "; ".join(sorted({WITHDRAWAL_REASONS[w.reason] for w in withdrawn}))
        listed = ", ".join(f"{w.bank} at round {w.round}" for w in withdrawn)
        if gone := [bank for bank in pinned if bank in self.withdrawn]:
            return (
                f"{why}: {', '.join(gone)} withdrew, but the retry of an abandoned round from version {version} "
                f"must have exactly its contributors {list(pinned)} (withdrawn: {listed})"
            )
        chosen = self.chosen(version + 1)
        left = [bank for bank in chosen if bank not in self.withdrawn]
        needed = quorum(self.policy)
        if len(left) >= needed:
            return None
        banks = f"{len(left)} bank{'' if len(left) == 1 else 's'}"
        if len(chosen) == len(self.banks):
            return f"{why}: {banks} left, quorum {needed} (withdrawn: {listed})"
        return (
            f"{why}: {banks} left of the {len(chosen)} chosen for training round {version + 1}, quorum {needed} "
            f"(withdrawn: {listed})"
        )

    def pinned_contributors(self, version: int) -> tuple[str, ...]:
        """Banks whose sums for a round from ``version`` were already decrypted, if that round never applied.

        A retry from the same version must have exactly these contributors: banks retrain from
        the same state, so their terms repeat, and a sum over another set would let the
        difference of the two decrypted sums reveal one bank's term.
        """
        for row in self.store.rounds():
            if row.base_version == version and row.status != "applied":
                sums = self.store.sums(row.round)
                if sums:  # a later stage's banks are among the first's: the union is the first stage's
                    decrypted = {bank for _, _, banks in sums.values() for bank in banks}
                    return tuple(bank for bank in self.banks if bank in decrypted)
        return ()

    def choose(self, stop: threading.Event, version: int) -> Choice | None:
        """The participants of a round from ``version`` (each must upload everything), or the reason the run
        stops (:meth:`exhausted`); None if ``stop`` was set.

        Every chosen bank that has not withdrawn, or — once a silent bank has had ``liveness_seconds``
        since this aggregator (re)started to show up — at least the quorum of live ones; banks that missed
        an attempt from ``version`` are left out while the others reach the quorum; a pinned set (see
        :meth:`pinned_contributors`) must be live in full.
        """
        pinned = self.pinned_contributors(version)
        with self.changed:
            while not stop.is_set():
                reason = self.exhausted(version, pinned)
                if reason is not None:
                    return Choice(stopped_reason=reason)
                chosen, live = self.participants(version + 1)
                if pinned:
                    if set(pinned) <= set(live):
                        return Choice(pinned)
                else:
                    missed = self.missed.get(version, set())
                    if len([bank for bank in live if bank not in missed]) >= quorum(self.policy):
                        chosen = tuple(bank for bank in chosen if bank not in missed)
                        live = tuple(bank for bank in live if bank not in missed)
                    waited_long_enough = time.monotonic() - self.started >= self.liveness_seconds
                    if len(live) >= quorum(self.policy) and (len(live) == len(chosen) or waited_long_enough):
                        return Choice(live)
                self.changed.wait(0.2)
        return None
