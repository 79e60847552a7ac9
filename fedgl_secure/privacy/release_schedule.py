"""Release schedules (DESIGN §6): what one bank releases in each round and once before round 1, for its accountant.

The releases a bank must record each round are :func:`round_releases` and, once before round 1,
:func:`setup_releases`; :func:`planned_ledger` is a bank's ledger after a given number of rounds, and
:func:`rounds_within_budget` the most rounds that fit the budget. A run records exactly these releases
(:mod:`~fedgl_secure.privacy.dp_round`), and :mod:`~fedgl_secure.privacy.guarantees` composes the same
ones over ``budget.rounds``, so a run spends what the guarantees predict. It sits above
:mod:`~fedgl_secure.privacy.calibration` (the noise multipliers recorded) and
:mod:`~fedgl_secure.privacy.accounting` (the release types and the ledger), below the report.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedgl_secure.policy.dp import DATA_KINDS
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.accounting import (
    DP_SGD,
    EDGES,
    LABELS,
    GaussianRelease,
    PrivacyLedger,
    PureRelease,
    Release,
    total_epsilon,
)
from fedgl_secure.privacy.calibration import accounted_noise_multiplier


def round_releases(policy: Policy, round_number: int) -> list[GaussianRelease]:
    """The Gaussian releases one bank records for one round in which it contributes (empty without DP).

    One per enabled upload channel (q = 1, one step: a whole clipped matrix) and, with DP-SGD,
    ``local_epochs`` full-batch steps (q = 1). A round's releases are recorded before any is made,
    after :meth:`~fedgl_secure.privacy.accounting.PrivacyLedger.would_exceed` said they fit.
    """
    releases = [
        GaussianRelease(
            round=round_number,
            channel=kind,
            noise_multiplier=accounted_noise_multiplier(policy, kind),
            sample_rate=1.0,
        )
        for kind in DATA_KINDS
        if policy.dp.upload_channel(kind) is not None
    ]
    if policy.dp.sgd_enabled:
        releases.append(
            GaussianRelease(
                round=round_number,
                channel=DP_SGD,
                noise_multiplier=accounted_noise_multiplier(policy, DP_SGD),
                sample_rate=1.0,
                steps=policy.dp.sgd.local_epochs,
            )
        )
    return releases


def setup_releases(policy: Policy) -> list[PureRelease]:
    """Releases made once before round 1 (round 0): the adjacency's and the labels' perturbation, if enabled.

    These are the whole cost of a source-only unit (``edge``, ``label``): every later upload is
    post-processing of the released graph and labels, so nothing is recorded per round.
    """
    edges, labels = policy.dp.edges, policy.dp.labels
    releases = [PureRelease(round=0, channel=EDGES, epsilon=edges.epsilon)] if edges.enabled else []
    if labels.enabled:
        releases.append(PureRelease(round=0, channel=LABELS, epsilon=labels.epsilon))
    return releases


def planned_ledger(policy: Policy, rounds: int, bank: str = "bank") -> PrivacyLedger:
    """A bank's ledger after contributing to ``rounds`` rounds under ``policy`` (what the guarantees compose)."""
    ledger = PrivacyLedger(bank)
    ledger.extend(setup_releases(policy))
    for round_number in range(1, rounds + 1):
        ledger.extend(round_releases(policy, round_number))
    return ledger


def rounds_within_budget(policy: Policy, releases: Sequence[Release], total: float) -> int:
    """Most rounds (≤ budget.rounds) whose releases, with the set-up ones, stay within budget.epsilon.

    ``releases`` are those of the full ``budget.rounds`` (the planned ledger's), ``total`` their ε; a
    prefix of rounds is sliced from them rather than rebuilt at every bisection step.
    """
    budget = policy.budget
    if total <= budget.epsilon:
        return budget.rounds

    def fits(rounds: int) -> bool:
        upto = [r for r in releases if r.round <= rounds]
        return total_epsilon(upto, budget.delta, budget.accountant) <= budget.epsilon

    low, high = 0, budget.rounds  # fits(high) is false
    if not fits(low):
        return 0
    while high - low > 1:  # ε grows with every round: bisect
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low
