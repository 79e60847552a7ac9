"""What a policy guarantees (DESIGN §6): per channel sensitivity, noise and ε; per bank (ε, δ) over a whole run.

:func:`effective_guarantees` turns a validated :class:`~fedgl_secure.policy.schema.Policy` into
numbers a risk officer can check, with the assumptions they rest on. It only *reads* the
library: sensitivities come from :mod:`fedgl_secure.privacy.graph_sensitivity`, composition from
:class:`~fedgl_secure.privacy.accounting.PrivacyLedger` (Opacus' RDP or PRV accountant). The
releases a bank must record each round are
:func:`~fedgl_secure.privacy.release_schedule.round_releases` and, once before round 1,
:func:`~fedgl_secure.privacy.release_schedule.setup_releases`; the figures here are those releases
composed over ``budget.rounds``, so a run that records the same releases spends exactly what this
module predicts. The noise each channel carries is sized at run time by
:mod:`fedgl_secure.privacy.calibration`; this module is the report only, and its plain-language texts (what each
unit of privacy protects, the assumptions) are :mod:`fedgl_secure.privacy.guarantee_texts`.

Observers. Every figure is ε against the *weakest single observer* of a channel:

* distributed noise — a fellow bank, who receives the decrypted sum and knows its own share, so
  the noise it faces is σ√((q−1)/q) (q = quorum: the fewest shares a decrypted sum holds,
  :func:`~fedgl_secure.privacy.secure_noise.residual_noise_std`). The aggregator and key authority,
  even together, face the full σ;
* central noise — every bank and the aggregator face the full σ; the key authority sees only the
  masked sum. The aggregator and key authority together would see the sum without noise;
* DP-SGD and edge DP are applied by the bank to its own data: everyone faces them alike.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Literal

from fedgl_secure.policy.dp import DATA_KINDS
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy import secure_noise
from fedgl_secure.privacy.accounting import (
    DP_SGD,
    EDGES,
    LABELS,
    WEIGHTS,
    total_epsilon,
)
from fedgl_secure.privacy.calibration import accounted_noise_multiplier, upload_sensitivity
from fedgl_secure.privacy.guarantee_texts import (
    CENTROIDS_DO_NOT_PROTECT,
    CENTROIDS_PROTECTS,
    UNIT_DOES_NOT_PROTECT,
    UNIT_OF_PRIVACY,
    UNIT_PROTECTS,
    policy_assumptions,
)
from fedgl_secure.privacy.release_schedule import planned_ledger, rounds_within_budget

Status = Literal["no-protection", "he-only", "dp"]

# Opacus warns when the best Rényi order is its largest one: the (ε, δ) it returns is still a valid
# upper bound, only looser than a wider range of orders would give. We report that instead of hiding it.
_LARGEST_ALPHA_WARNING = "Optimal order is the largest alpha"


@dataclass(frozen=True)
class ChannelGuarantee:
    """One DP channel of one bank: what is released, with how much noise, and what it costs.

    ``noise_std`` is σ in the decrypted sum (uploads), or per DP-SGD step; ``share_std`` is each
    bank's share when noise is distributed. ``accounted_noise_multiplier`` is what the ledger
    records: σ over the sensitivity, as faced by the weakest observer (module doc). ``epsilon_per_round``
    and ``epsilon_total`` are this channel composed on its own, at the policy's δ; for edge DP
    (paid once) both are its ε.
    """

    channel: str
    mechanism: Literal["gaussian", "dp-sgd", "randomized-response", "laplace"]
    noise: Literal["distributed", "central", "local"]
    clip: float | None
    sensitivity: float | None
    noise_multiplier: float | None
    noise_std: float | None
    share_std: float | None
    accounted_noise_multiplier: float | None
    steps_per_round: int
    epsilon_per_round: float
    epsilon_total: float


@dataclass(frozen=True)
class Guarantees:
    """A policy's effective guarantees per bank (:func:`effective_guarantees`).

    ``status`` is ``"no-protection"`` (uploads in clear), ``"he-only"`` (sums exact, no DP: ε is
    unbounded) or ``"dp"``. ``epsilon`` is the total per bank over ``rounds`` rounds, composing
    every channel; ``rounds_within_budget`` the most rounds a bank can contribute before it must
    stop. ``released_without_dp`` lists allowed kinds that leave a bank with no DP channel.
    """

    status: Status
    protection: str
    quorum: int
    allowed_kinds: tuple[str, ...]
    released_without_dp: tuple[str, ...]
    unit: str = "none"
    protects: str = ""
    does_not_protect: str = ""
    channels: tuple[ChannelGuarantee, ...] = ()
    budget_epsilon: float | None = None
    delta: float | None = None
    accountant: str | None = None
    rounds: int | None = None
    epsilon: float | None = None
    budget_met: bool | None = None
    rounds_within_budget: int | None = None
    on_exhausted: str | None = None
    assumptions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- the summary ------------------------------------------------------------------------------


def _upload_guarantee(policy: Policy, kind: str) -> ChannelGuarantee:
    settings = policy.dp.upload_channel(kind)
    sensitivity = upload_sensitivity(policy, kind)
    sigma = secure_noise.gaussian_noise_std(settings.noise_multiplier, sensitivity)
    share = secure_noise.noise_share_std(sigma, policy.quorum) if settings.noise == "distributed" else None
    return ChannelGuarantee(
        channel=kind,
        mechanism="gaussian",
        noise=settings.noise,
        clip=settings.clip,
        sensitivity=sensitivity,
        noise_multiplier=settings.noise_multiplier,
        noise_std=sigma,
        share_std=share,
        accounted_noise_multiplier=accounted_noise_multiplier(policy, kind),
        steps_per_round=1,
        epsilon_per_round=math.nan,  # filled in by effective_guarantees
        epsilon_total=math.nan,
    )


def _sgd_guarantee(policy: Policy) -> ChannelGuarantee:
    sgd = policy.dp.sgd
    accounted = accounted_noise_multiplier(policy, DP_SGD)
    return ChannelGuarantee(
        channel=DP_SGD,
        mechanism="dp-sgd",
        noise="local",
        clip=sgd.max_grad_norm,
        sensitivity=sgd.noise_multiplier * sgd.max_grad_norm / accounted,  # (2K−1)·C: what one node moves
        noise_multiplier=sgd.noise_multiplier,
        noise_std=sgd.noise_multiplier * sgd.max_grad_norm,
        share_std=None,
        accounted_noise_multiplier=accounted,
        steps_per_round=sgd.local_epochs,
        epsilon_per_round=math.nan,
        epsilon_total=math.nan,
    )


def _label_guarantee(policy: Policy) -> ChannelGuarantee:
    epsilon = float(policy.dp.labels.epsilon)
    return ChannelGuarantee(
        channel=LABELS,
        mechanism=policy.dp.labels.mechanism,
        noise="local",
        clip=None,
        sensitivity=None,
        noise_multiplier=None,
        noise_std=None,
        share_std=None,
        accounted_noise_multiplier=None,
        steps_per_round=0,
        epsilon_per_round=epsilon,
        epsilon_total=epsilon,
    )


def _edge_guarantee(policy: Policy) -> ChannelGuarantee:
    epsilon = float(policy.dp.edges.epsilon)
    return ChannelGuarantee(
        channel=EDGES,
        mechanism=policy.dp.edges.mechanism,
        noise="local",
        clip=None,
        sensitivity=None,
        noise_multiplier=None,
        noise_std=None,
        share_std=None,
        accounted_noise_multiplier=None,
        steps_per_round=0,
        epsilon_per_round=epsilon,
        epsilon_total=epsilon,
    )


def effective_guarantees(policy: Policy) -> Guarantees:
    """What ``policy`` guarantees each bank: per channel noise and ε, total (ε, δ) over the run, assumptions.

    Pure: the same policy gives the same figures. Imports Opacus (and torch) on first use when the
    policy has DP.
    """
    unit = policy.dp.effective_unit if policy.protection == "he" else "none"
    common = {
        "protection": policy.protection,
        "quorum": policy.quorum,
        "allowed_kinds": policy.allowed_kinds,
        "unit": unit,
        "protects": UNIT_PROTECTS.get(unit, "") if policy.protection == "he" else "nothing: uploads leave in clear",
        "does_not_protect": UNIT_DOES_NOT_PROTECT.get(unit, "") if policy.protection == "he" else "everything",
    }
    if policy.protection == "none":
        return Guarantees(
            status="no-protection",
            released_without_dp=policy.allowed_kinds,
            assumptions=(
                "No protection: every upload leaves its bank in clear and nothing bounds what it reveals. "
                "For experiments on public data only; the audit marks this policy red.",
            ),
            **common,
        )
    if not policy.has_dp:
        return Guarantees(
            status="he-only",
            released_without_dp=policy.allowed_kinds,
            assumptions=(
                "No differential privacy: HE keeps each bank's upload from the aggregator, but every decrypted sum "
                "(W̄, fused predictions and embeddings, the pseudo graph built from them) is exact, so ε is "
                "unbounded for what the sums reveal about a bank's customers.",
                "Threshold decryption: the aggregator (possibly malicious), the key authority and up to t − 1 banks "
                "together decrypt nothing but the fused sums of at least quorum (> t) banks; banks and the key "
                "authority follow the protocol.",
            ),
            **common,
        )

    if policy.dp.node_mechanism == "gap":
        return _gap_guarantees(policy, common)
    if policy.dp.node_mechanism == "centroids":
        return _centroids_guarantees(
            policy, {**common, "protects": CENTROIDS_PROTECTS, "does_not_protect": CENTROIDS_DO_NOT_PROTECT}
        )
    budget = policy.budget
    channels = [_upload_guarantee(policy, kind) for kind in DATA_KINDS if policy.dp.upload_channel(kind)]
    if policy.dp.sgd_enabled:
        channels.append(_sgd_guarantee(policy))
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ledger = planned_ledger(policy, budget.rounds)
        by_channel = ledger.epsilon_by_channel(budget.delta, budget.accountant)
        total = ledger.epsilon(budget.delta, budget.accountant)
        one_round = planned_ledger(policy, 1)
        filled = [
            dataclasses.replace(
                channel,
                epsilon_per_round=one_round.epsilon(budget.delta, budget.accountant, channel=channel.channel),
                epsilon_total=by_channel[channel.channel],
            )
            for channel in channels
        ]
        within = rounds_within_budget(policy, ledger.releases, total)
    loose = [w for w in caught if _LARGEST_ALPHA_WARNING in str(w.message)]
    for other in caught:
        if other not in loose:  # not ours to silence
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if loose:
        notes.append(
            "RDP: the best Rényi order is the largest Opacus tries (63), so the ε reported is a valid upper bound "
            "but not tight; the PRV accountant gives a lower (also valid) figure."
        )
    if policy.dp.edges.enabled:
        filled.append(_edge_guarantee(policy))
    if policy.dp.labels.enabled:
        filled.append(_label_guarantee(policy))
    released_without_dp = tuple(
        kind
        for kind in policy.allowed_kinds
        # under a source-only unit every data kind is post-processing of the released graph and labels
        if kind not in DATA_KINDS or not (policy.dp.protects(kind) or policy.dp.source_only)
    )
    return _dp_guarantees(
        policy,
        common,
        released_without_dp=released_without_dp,
        channels=tuple(filled),
        rounds=budget.rounds,
        epsilon=total,
        rounds_within_budget=within,
        assumptions=tuple(policy_assumptions(policy)),
        notes=tuple(notes),
    )


def _dp_guarantees(policy: Policy, common: dict, **figures) -> Guarantees:
    """A ``"dp"`` :class:`Guarantees` with the budget's fields filled in from ``policy`` and ``figures`` (the
    channels, ε, rounds and assumptions a mechanism computed)."""
    budget = policy.budget
    return Guarantees(
        status="dp",
        budget_epsilon=budget.epsilon,
        delta=budget.delta,
        accountant=budget.accountant,
        budget_met=figures["epsilon"] <= budget.epsilon,
        on_exhausted=budget.on_exhausted,
        **figures,
        **common,
    )


def _gap_guarantees(policy: Policy, common: dict) -> Guarantees:
    """GAP node-level DP (``dp.node_mechanism = "gap"``): its three modules calibrated to the budget and composed.

    The noise multipliers are those :func:`~fedgl_secure.privacy.gap.calibrate` gives every bank for the
    budget's ε and δ (what ``--method gap`` runs with); each module's ε is that module alone, ``epsilon`` their
    composition by the budget's accountant (Eq. A3).
    """
    from fedgl_secure.privacy import gap

    budget, settings = policy.budget, policy.dp.gap
    noise = gap.calibrate(settings, budget.epsilon, budget.delta)
    parts = gap.releases(settings, noise)
    sensitivities = (settings.max_grad_norm, gap.aggregation_sensitivity(settings.max_degree), settings.max_grad_norm)
    per_round_steps = (settings.local_steps, 0, settings.local_steps)
    channels = tuple(
        ChannelGuarantee(
            channel=release.channel,
            mechanism="gaussian" if release.channel == gap.AGGREGATION else "dp-sgd",
            noise="local",
            clip=None if release.channel == gap.AGGREGATION else settings.max_grad_norm,
            sensitivity=sensitivity,
            noise_multiplier=release.noise_multiplier,
            noise_std=release.noise_multiplier * sensitivity,
            share_std=None,
            accounted_noise_multiplier=release.noise_multiplier,
            steps_per_round=steps,
            epsilon_per_round=math.nan,
            epsilon_total=total_epsilon([release], budget.delta, budget.accountant),
        )
        for release, sensitivity, steps in zip(parts, sensitivities, per_round_steps, strict=True)
    )
    epsilon = gap.composed_epsilon(settings, noise, budget.delta, budget.accountant)
    assumptions = (
        f"Unit of privacy (dp.unit = 'node', node_mechanism = 'gap'): {UNIT_OF_PRIVACY['node']}, under the degree "
        f"bound D = {settings.max_degree} (every bank projects its graph once, at the source, so that every customer "
        "keeps at most D links; the guarantee holds for the projected graph). ε is per bank at "
        f"δ = {budget.delta:g}, spent over GAP's schedule of {settings.rounds} rounds ({settings.encoder_rounds} "
        f"encoder, {settings.classifier_rounds} classifier); later rounds train nothing and cost nothing.",
        f"Encoder: an MLP on a customer's own features and label, DP-SGD on per-customer examples (Poisson rate "
        f"q = {settings.sample_rate:g}, clip C = {settings.max_grad_norm:g}, noise z = {noise.encoder:.3f}, "
        f"{settings.encoder_rounds * settings.local_steps} steps); it sees no link.",
        f"Aggregation: K = {settings.hops} hops x^k = normalise(A x^(k-1) + N(0, σ²)) of unit-norm embeddings; "
        f"removing a customer moves at most D of the other rows, each by a unit vector, so the sensitivity is "
        f"√D = {gap.aggregation_sensitivity(settings.max_degree):.3f} and σ = {noise.aggregation:.3f}·√D. "
        "The removed customer's own row is read only by its own classifier example, which DP-SGD covers.",
        f"Classifier: an MLP over [x⁰, …, x^K], DP-SGD on per-customer examples (q = {settings.sample_rate:g}, "
        f"noise z = {noise.classifier:.3f}, {settings.classifier_rounds * settings.local_steps} steps); the other "
        "customers' rows are post-processing of the noisy hops.",
        f"Composition: the three as Gaussian releases in Opacus' {budget.accountant.upper()} accountant "
        f"(noise calibrated for ε = {budget.epsilon:g} with shares {list(settings.epsilon_split)}). Uploads (FedAvg "
        "terms of the modules' weights) are post-processing; w_k and node membership are public, as everywhere.",
        "Noise (DP-SGD and the hops) is drawn from the OS CSPRNG inside the bank; HE hides each bank's weights "
        "from the aggregator, but the guarantee does not rely on it.",
    )
    return _dp_guarantees(
        policy,
        common,
        released_without_dp=tuple(kind for kind in policy.allowed_kinds if kind not in DATA_KINDS),
        channels=channels,
        rounds=settings.rounds,
        epsilon=epsilon,
        rounds_within_budget=settings.rounds if epsilon <= budget.epsilon else 0,
        assumptions=assumptions,
    )


def _centroids_guarantees(policy: Policy, common: dict) -> Guarantees:
    """Node-level DP by one release of noisy class sums (``dp.node_mechanism = "centroids"``, Eqs. C1–C2).

    One Gaussian release per bank, sensitivity 1 under node add/remove whatever the graph, its noise multiplier
    calibrated by :func:`~fedgl_secure.privacy.class_sums.noise_multiplier` to the budget's ε and δ (what
    ``--method centroids`` runs with).
    """
    from fedgl_secure.privacy import class_sums

    budget = policy.budget
    central = policy.dp.central_kinds() == (WEIGHTS,)
    z = class_sums.noise_multiplier(budget.epsilon, budget.delta)
    epsilon = class_sums.spent_epsilon(z, budget.delta, budget.accountant)
    channel = ChannelGuarantee(
        channel=class_sums.CLASS_SUMS,
        mechanism="gaussian",
        noise="central" if central else "local",
        clip=1.0,
        sensitivity=class_sums.SENSITIVITY,
        noise_multiplier=z,
        noise_std=z * class_sums.SENSITIVITY,
        share_std=None,
        accounted_noise_multiplier=z,
        steps_per_round=0,
        epsilon_per_round=math.nan,
        epsilon_total=epsilon,
    )
    assumptions = (
        f"Unit of privacy (dp.unit = 'node', node_mechanism = 'centroids'): {UNIT_OF_PRIVACY['node']}. ε is per bank "
        f"at δ = {budget.delta:g} and paid once: a run under this policy has one round (the model is final after it).",
        "Release: each bank sums its training customers' feature rows, each scaled to unit L2 norm, per class (a C × F "
        f"matrix), released once with N(0, σ²) on every entry, σ = {z:.3f} (z = {z:.3f} × sensitivity 1). Removing a "
        "customer removes at most its own row from one class sum; its links and the other customers' features enter "
        "nothing released, so no degree bound is needed and the guarantee holds for the bank's graph as it is.",
        "Inside the bank (post-processing, not released): the customers' cosines to the consortium's class directions, "
        "propagated over the bank's own graph. Scores a bank publishes are outside the guarantee.",
        (
            "Noise (dp.centroids.noise = 'central'): banks encrypt exact sums; the key authority adds N(0, σ²) once to "
            "its partial decryption of the sum of round 1 (the run has one round), so every bank and the aggregator "
            "face σ and the consortium's sum carries σ, not √K·σ. It relies on HE and on the key authority and the "
            "aggregator not colluding (together they would know the exact sum)."
            if central
            else "Noise (dp.centroids.noise = 'local'): drawn from the OS CSPRNG inside each bank; HE hides each "
            "bank's release from the aggregator, but the guarantee does not rely on it."
        ),
        "w_k and node membership are public, as everywhere.",
    )
    return _dp_guarantees(
        policy,
        common,
        released_without_dp=tuple(kind for kind in policy.allowed_kinds if kind not in DATA_KINDS),
        channels=(channel,),
        rounds=1,
        epsilon=epsilon,
        rounds_within_budget=policy.budget.rounds if epsilon <= budget.epsilon else 0,
        assumptions=assumptions,
    )
