"""Privacy accounting per bank (DESIGN §6): every release of every channel, composed over all rounds.

A :class:`PrivacyLedger` is the append-only record of what one bank has released. Gaussian
releases are composed with Opacus' accountants (RDP or PRV); pure-ε releases (randomised response
on the adjacency) are added on top by basic composition. The ledger answers "how much has been
spent" (:meth:`PrivacyLedger.epsilon`, :meth:`PrivacyLedger.history`) and, before a release,
"may this bank still contribute" (:meth:`PrivacyLedger.would_exceed`): a bank that would go over
its budget must refuse *before* releasing — fail closed.

Conventions (Opacus'): a Gaussian release is described by its noise multiplier z = noise std / L2
sensitivity, its sampling rate q and its number of steps. A per-round upload of a whole clipped
matrix (weights, predictions, embeddings) is a Gaussian mechanism: q = 1, steps = 1. DP-SGD during
local training is the Poisson-subsampled Gaussian with q = batch / N and one step per batch.
Sensitivities, and how graph coupling inflates them, are in :mod:`fedgl_secure.privacy.graph_sensitivity`.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedgl_secure.errors import ConfigError
from fedgl_secure.fileio import write_atomically
from fedgl_secure.policy.budget import AccountantName

ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")

# Release channels. The first three are FedGL's upload kinds (fedgl.methods), named here as
# literals so that accounting does not depend on any one federated method.
WEIGHTS = "weights"
PREDICTIONS = "predictions"
EMBEDDINGS = "embeddings"
DP_SGD = "dp_sgd"
EDGES = "edges"
LABELS = "labels"
CHANNELS: tuple[str, ...] = (WEIGHTS, PREDICTIONS, EMBEDDINGS, DP_SGD, EDGES, LABELS)

LEDGER_FORMAT = "fedgl-secure/privacy-ledger/1"

# PRV's accuracy target: Opacus returns an upper bound within this of the true ε.
PRV_EPS_ERROR = 0.01


class GaussianRelease(BaseModel):
    """One (possibly subsampled, possibly repeated) Gaussian release on one channel in one round."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    kind: Literal["gaussian"] = "gaussian"
    round: int = Field(ge=0)
    channel: str = Field(min_length=1)
    noise_multiplier: float = Field(gt=0, allow_inf_nan=False)
    sample_rate: float = Field(gt=0, le=1)
    steps: int = Field(default=1, ge=1)


class PureRelease(BaseModel):
    """A pure ε-DP release (δ = 0), e.g. randomised response on the adjacency."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    kind: Literal["pure"] = "pure"
    round: int = Field(ge=0)
    channel: str = Field(min_length=1)
    epsilon: float = Field(gt=0, allow_inf_nan=False)


Release = GaussianRelease | PureRelease


class _LedgerFile(BaseModel):
    """On-disk form of a ledger; validated on load so a corrupt file names the bad field."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    format: Literal["fedgl-secure/privacy-ledger/1"]
    bank: str = Field(min_length=1)
    channels: tuple[str, ...]
    releases: list[Annotated[Release, Field(discriminator="kind")]] = Field(default_factory=list)


@dataclass(frozen=True)
class RoundSpend:
    """Cumulative spend after a round: total ε and ε per channel, at the ``delta`` it was computed for."""

    round: int
    epsilon: float
    by_channel: dict[str, float]


# --- pure accounting functions ----------------------------------------------------------------


def _check_delta(delta: float) -> float:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return float(delta)


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def opacus_history(releases: Iterable[Release]) -> list[tuple[float, float, int]]:
    """Opacus accountant history ``[(noise_multiplier, sample_rate, steps), ...]`` of the Gaussian releases.

    Releases with equal (z, q) are merged into one entry (steps added), in order of first
    appearance. Composition is commutative, so the figure is the same as feeding Opacus every step
    in time order; merging keeps PRV fast, since its cost grows with the number of distinct entries.
    """
    steps: dict[tuple[float, float], int] = {}
    for release in releases:
        if isinstance(release, GaussianRelease):
            key = (release.noise_multiplier, release.sample_rate)
            steps[key] = steps.get(key, 0) + release.steps
    return [(z, q, n) for (z, q), n in steps.items()]


def gaussian_epsilon(releases: Iterable[Release], delta: float, accountant: AccountantName = "rdp") -> float:
    """ε at ``delta`` of the composition of all Gaussian releases, by Opacus' RDP or PRV accountant.

    Pure releases are ignored here (see :func:`total_epsilon`). No release costs ε = 0.
    """
    delta = _check_delta(delta)
    history = opacus_history(releases)
    if not history:
        return 0.0
    # Imported here: opacus pulls in torch and its whole privacy engine (seconds), which loading,
    # validating or plotting a ledger does not need.
    from opacus.accountants import PRVAccountant, RDPAccountant

    engine = RDPAccountant() if _check_accountant(accountant) == "rdp" else PRVAccountant()
    engine.load_state_dict({"history": history, "mechanism": engine.mechanism()})
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # PRV evaluates log(1 − q), which is log 0 for full-batch releases (q = 1): harmless, masked by np.where.
        warnings.simplefilter("ignore", RuntimeWarning)
        if accountant == "rdp":
            return float(engine.get_epsilon(delta=delta))
        return float(engine.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))


def pure_epsilon(releases: Iterable[Release]) -> float:
    """Sum of the ε of the pure releases (basic composition)."""
    return float(sum(r.epsilon for r in releases if isinstance(r, PureRelease)))


def total_epsilon(releases: Iterable[Release], delta: float, accountant: AccountantName = "rdp") -> float:
    r"""(ε, δ) of everything released: :math:`\varepsilon_{\text{Gauss}}(\delta) + \sum \varepsilon_{\text{pure}}`.

    Basic composition: an (ε₁, δ)-DP and an ε₂-DP mechanism together are (ε₁ + ε₂, δ)-DP, also
    adaptively. It is valid but not tight (converting pure ε to RDP would compose more tightly); the
    pure part is a one-off edge-DP release, so the slack is paid once, not per round.
    """
    releases = list(releases)
    return gaussian_epsilon(releases, delta, accountant) + pure_epsilon(releases)


# --- the ledger -------------------------------------------------------------------------------


class PrivacyLedger:
    """Append-only record of one bank's DP releases, with ε per channel and per round.

    ``channels`` is the closed set of channel names this ledger accepts (a typo must fail, not
    open a new, unbudgeted channel). Rounds never go backwards.
    """

    def __init__(self, bank: str, channels: Iterable[str] = CHANNELS) -> None:
        if not bank:
            raise ValueError("bank must be a non-empty name")
        self.bank = bank
        self.channels: tuple[str, ...] = tuple(channels)
        if not self.channels or len(set(self.channels)) != len(self.channels):
            raise ValueError(f"channels must be non-empty and distinct, got {self.channels}")
        self._releases: list[Release] = []

    # recording

    def _check_channel(self, channel: str) -> None:
        if channel not in self.channels:
            raise ValueError(f"unknown channel {channel!r}; this ledger accepts {self.channels}")

    def _append(self, release: Release) -> Release:
        self._check_channel(release.channel)
        if self._releases and release.round < self._releases[-1].round:
            raise ValueError(
                f"round {release.round} is before the last recorded round {self._releases[-1].round}; "
                "the ledger is append-only"
            )
        self._releases.append(release)
        return release

    def record(
        self, round: int, channel: str, noise_multiplier: float, sample_rate: float, steps: int = 1
    ) -> GaussianRelease:
        """Record a Gaussian release: q = 1, steps = 1 for a per-round upload; q = batch/N for DP-SGD."""
        return self._append(
            GaussianRelease(
                round=round, channel=channel, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps
            )
        )

    def record_pure(self, channel: str, epsilon: float, *, round: int = 0) -> PureRelease:
        """Record a pure ε-DP release, e.g. randomised response on the adjacency (once, before round 1)."""
        return self._append(PureRelease(round=round, channel=channel, epsilon=epsilon))

    def extend(self, releases: Iterable[Release]) -> None:
        """Record planned releases as they are (:func:`~fedgl_secure.privacy.release_schedule.round_releases`,
        :func:`~fedgl_secure.privacy.release_schedule.setup_releases`), in order."""
        for release in releases:
            if not isinstance(release, GaussianRelease | PureRelease):
                raise TypeError(f"not a release: {release!r}")
            self._append(release)

    @property
    def releases(self) -> tuple[Release, ...]:
        return tuple(self._releases)

    # spending

    def epsilon(self, delta: float, accountant: AccountantName = "rdp", *, channel: str | None = None) -> float:
        """ε spent at ``delta``: over every channel (default), or over one ``channel`` alone."""
        if channel is not None:
            self._check_channel(channel)
        releases = [r for r in self._releases if channel is None or r.channel == channel]
        return total_epsilon(releases, delta, accountant)

    def epsilon_by_channel(self, delta: float, accountant: AccountantName = "rdp") -> dict[str, float]:
        """ε of each channel composed on its own. These do not add up to the total: composition is sub-additive."""
        return {channel: self.epsilon(delta, accountant, channel=channel) for channel in self.channels}

    def history(self, delta: float, accountant: AccountantName = "rdp") -> list[RoundSpend]:
        """Cumulative ε (total and per channel) after each recorded round, for plots over rounds.

        RDP is additive, so each release's RDP curve is computed once and summed incrementally. PRV
        is recomputed from scratch for every round (correct, but slow over hundreds of rounds).
        """
        delta = _check_delta(delta)
        if _check_accountant(accountant) == "prv":
            rounds = sorted({r.round for r in self._releases})
            points = []
            for last in rounds:
                upto = [r for r in self._releases if r.round <= last]
                by_channel = {
                    c: total_epsilon([r for r in upto if r.channel == c], delta, "prv") for c in self.channels
                }
                points.append(RoundSpend(last, total_epsilon(upto, delta, "prv"), by_channel))
            return points
        return _rdp_history(self._releases, self.channels, delta)

    def would_exceed(
        self,
        budget_epsilon: float,
        delta: float,
        next_releases: Sequence[Release],
        accountant: AccountantName = "rdp",
    ) -> bool:
        """Whether recording ``next_releases`` would take the total ε at ``delta`` above ``budget_epsilon``.

        Call it before releasing and refuse when True. Spending exactly the budget is allowed. A
        NaN ε counts as exceeding (fail closed); errors from the accountant propagate, so the caller
        does not release either.
        """
        if not (budget_epsilon >= 0):
            raise ValueError(f"budget_epsilon must be non-negative, got {budget_epsilon}")
        for release in next_releases:
            self._check_channel(release.channel)
        spent = total_epsilon([*self._releases, *next_releases], delta, accountant)
        return not spent <= budget_epsilon

    # persistence

    def to_json(self) -> str:
        """Serialise to JSON (a versioned format) for the run directory."""
        document = _LedgerFile(format=LEDGER_FORMAT, bank=self.bank, channels=self.channels, releases=self._releases)
        return json.dumps(document.model_dump(mode="json"), indent=2)

    @classmethod
    def from_json(cls, text: str, *, source: str = "ledger") -> PrivacyLedger:
        """Load a ledger from :meth:`to_json` output, re-checking every release; errors name the field."""
        try:
            document = _LedgerFile.model_validate_json(text)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ConfigError(f"{source}: {where}: {first['msg']}") from error
        ledger = cls(document.bank, document.channels)
        try:
            for release in document.releases:
                ledger._append(release)
        except ValueError as error:
            raise ConfigError(f"{source}: releases: {error}") from error
        return ledger

    def save(self, path: str | Path) -> None:
        """Write the ledger atomically (temporary file, fsync, rename): a crash never leaves half a ledger."""
        write_atomically(Path(path), (self.to_json() + "\n").encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        path = Path(path)
        return cls.from_json(path.read_text(encoding="utf-8"), source=str(path))


def _rdp_history(releases: Sequence[Release], channels: Sequence[str], delta: float) -> list[RoundSpend]:
    """Cumulative RDP → (ε, δ) after each round, per channel and in total (see PrivacyLedger.history)."""
    if not releases:
        return []
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    orders = RDPAccountant.DEFAULT_ALPHAS

    def to_epsilon(curve: np.ndarray, pure: float) -> float:
        if not curve.any():
            return pure
        eps, _ = rdp_analysis.get_privacy_spent(orders=orders, rdp=curve, delta=delta)
        return float(eps) + pure

    # RDP of one step, per distinct (q, z): a run repeats the same few releases hundreds of times, and a
    # subsampled-Gaussian curve costs tens of milliseconds to evaluate.
    unit_curves: dict[tuple[float, float], np.ndarray] = {}
    curves = {c: np.zeros(len(orders)) for c in channels}
    pure = dict.fromkeys(channels, 0.0)
    points: list[RoundSpend] = []
    for index, release in enumerate(releases):
        if isinstance(release, GaussianRelease):
            key = (release.sample_rate, release.noise_multiplier)
            if key not in unit_curves:
                unit_curves[key] = rdp_analysis.compute_rdp(q=key[0], noise_multiplier=key[1], steps=1, orders=orders)
            curves[release.channel] = curves[release.channel] + release.steps * unit_curves[key]
        else:
            pure[release.channel] += release.epsilon
        if index + 1 == len(releases) or releases[index + 1].round != release.round:
            by_channel = {c: to_epsilon(curves[c], pure[c]) for c in channels}
            total = to_epsilon(sum(curves.values()), sum(pure.values()))
            points.append(RoundSpend(release.round, total, by_channel))
    return points


# Integer Rényi orders: Opacus evaluates the subsampled Gaussian at an integer order in closed form (fast);
# a bound at fewer orders is still a valid RDP bound, so calibrating on these is sound, if a little loose.
CALIBRATION_ORDERS: tuple[float, ...] = (*range(2, 33), 40, 48, 64, 96, 128, 256)


def warnings_ignored(function: Callable) -> Callable:
    """Run ``function`` with Opacus' "optimal order is the smallest alpha" warning silenced: at order 2 the bound
    is valid, only looser than fractional orders would give, and calibration asks thousands of times."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
            return function(*args, **kwargs)

    return wrapper


def calibration_epsilon(parts: list[tuple[float, float, int]], delta: float) -> float:
    """ε at δ of the ``(noise multiplier, sample rate, steps)`` parts composed, on :data:`CALIBRATION_ORDERS`
    (Opacus' RDP analysis; one part: that module alone)."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    rdp = sum(compute_rdp(q=q, noise_multiplier=z, steps=n, orders=CALIBRATION_ORDERS) for z, q, n in parts)
    return float(get_privacy_spent(orders=CALIBRATION_ORDERS, rdp=rdp, delta=delta)[0])


def smallest_noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier (to 0.1 %) with which one Gaussian release (``steps`` at ``sample_rate``) alone
    spends at most ``epsilon`` at ``delta``, on :data:`CALIBRATION_ORDERS`."""
    low, high = 0.0, 1.0
    while calibration_epsilon([(high, sample_rate, steps)], delta) > epsilon:
        low, high = high, 2 * high
    while high - low > 1e-3 * high:
        middle = (low + high) / 2
        if calibration_epsilon([(middle, sample_rate, steps)], delta) > epsilon:
            low = middle
        else:
            high = middle
    return high
