"""Privacy ledger: ε equal to Opacus' own figures, per-channel spend, budget refusal at the boundary, JSON."""

from __future__ import annotations

import json
import math

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from fedgl_secure.errors import ConfigError
from fedgl_secure.privacy.accounting import (
    DP_SGD,
    EDGES,
    EMBEDDINGS,
    PREDICTIONS,
    PRV_EPS_ERROR,
    WEIGHTS,
    GaussianRelease,
    PrivacyLedger,
    PureRelease,
)

DELTA = 1e-5

# (channel, noise multiplier, sample rate, steps) released every round.
PARAMETER_SETS = {
    "three uploads": [(WEIGHTS, 2.0, 1.0, 1), (PREDICTIONS, 3.0, 1.0, 1), (EMBEDDINGS, 4.0, 1.0, 1)],
    "uploads + dp-sgd": [(WEIGHTS, 5.0, 1.0, 1), (DP_SGD, 1.1, 0.05, 20)],
    "one noisy channel": [(PREDICTIONS, 0.8, 1.0, 1)],
}


def fill(ledger: PrivacyLedger, per_round, rounds: int) -> None:
    for r in range(1, rounds + 1):
        for channel, z, q, steps in per_round:
            ledger.record(r, channel, z, q, steps)


def opacus_epsilon(engine, per_round, rounds: int, channel: str | None = None, **kwargs) -> float:
    """Opacus' own figure: feed the accountant every step, in time order, through its public API."""
    for _ in range(rounds):
        for name, z, q, steps in per_round:
            if channel is None or name == channel:
                for _ in range(steps):
                    engine.step(noise_multiplier=z, sample_rate=q)
    return engine.get_epsilon(delta=DELTA, **kwargs)


@pytest.mark.parametrize("name", list(PARAMETER_SETS))
@pytest.mark.parametrize("rounds", [1, 6])
def test_rdp_epsilon_equals_opacus(name, rounds):
    per_round = PARAMETER_SETS[name]
    ledger = PrivacyLedger("bank-a")
    fill(ledger, per_round, rounds)
    # Same RDP curves summed in another order: equal up to floating-point rounding.
    assert ledger.epsilon(DELTA) == pytest.approx(opacus_epsilon(RDPAccountant(), per_round, rounds), rel=1e-9)
    for channel in {c for c, *_ in per_round}:
        expected = opacus_epsilon(RDPAccountant(), per_round, rounds, channel=channel)
        assert ledger.epsilon(DELTA, channel=channel) == pytest.approx(expected, rel=1e-9)


# Opacus' PRV evaluates log(1 − q) = log 0 for q = 1 when called directly (the ledger silences it).
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("name", list(PARAMETER_SETS))
def test_prv_epsilon_equals_opacus(name):
    per_round, rounds = PARAMETER_SETS[name], 2
    ledger = PrivacyLedger("bank-a")
    fill(ledger, per_round, rounds)
    ours = ledger.epsilon(DELTA, "prv")
    theirs = opacus_epsilon(PRVAccountant(), per_round, rounds, eps_error=PRV_EPS_ERROR)
    if len(per_round) == 1:
        assert ours == theirs  # identical history: identical computation
    else:
        # The ledger merges equal (z, q) entries (composition commutes); Opacus discretises the
        # interleaved history instead. Each result is an upper bound within eps_error of the true ε,
        # so they can differ by at most 2·eps_error.
        assert abs(ours - theirs) <= 2 * PRV_EPS_ERROR
    assert ours == pytest.approx(ledger.epsilon(DELTA), rel=0.15)  # and close to the RDP figure


def test_pure_releases_add_to_the_gaussian_part():
    ledger = PrivacyLedger("bank-a")
    ledger.record_pure(EDGES, 0.7)
    assert ledger.epsilon(DELTA) == pytest.approx(0.7)  # opacus not needed for pure-only
    fill(ledger, PARAMETER_SETS["three uploads"], 5)
    gaussian = opacus_epsilon(RDPAccountant(), PARAMETER_SETS["three uploads"], 5)
    assert ledger.epsilon(DELTA) == pytest.approx(gaussian + 0.7, rel=1e-9)
    by_channel = ledger.epsilon_by_channel(DELTA)
    assert by_channel[EDGES] == pytest.approx(0.7) and by_channel[DP_SGD] == 0.0
    assert max(by_channel.values()) <= ledger.epsilon(DELTA) <= sum(by_channel.values())


def test_history_is_cumulative_per_round_and_ends_at_the_total():
    ledger = PrivacyLedger("bank-a")
    ledger.record_pure(EDGES, 0.5)
    fill(ledger, PARAMETER_SETS["uploads + dp-sgd"], 6)
    points = ledger.history(DELTA)
    assert [p.round for p in points] == list(range(7))
    assert points[0].epsilon == pytest.approx(0.5)
    assert all(a.epsilon < b.epsilon for a, b in zip(points, points[1:], strict=False))
    assert points[-1].epsilon == pytest.approx(ledger.epsilon(DELTA), rel=1e-9)
    for channel, value in points[-1].by_channel.items():
        assert value == pytest.approx(ledger.epsilon(DELTA, channel=channel), rel=1e-9)


def test_prv_history_ends_at_the_prv_total():
    ledger = PrivacyLedger("bank-a", channels=(WEIGHTS, EDGES))
    ledger.record_pure(EDGES, 0.5)
    for r in (1, 2):
        ledger.record(r, WEIGHTS, 3.0, 1.0)
    points = ledger.history(DELTA, "prv")
    assert [p.round for p in points] == [0, 1, 2]
    assert points[0].epsilon == pytest.approx(0.5) and points[0].by_channel[WEIGHTS] == 0.0
    assert points[-1].epsilon == pytest.approx(ledger.epsilon(DELTA, "prv"))


def test_would_exceed_refuses_exactly_past_the_budget():
    ledger = PrivacyLedger("bank-a")
    fill(ledger, PARAMETER_SETS["three uploads"], 3)
    before = ledger.releases
    nxt = [GaussianRelease(round=4, channel=WEIGHTS, noise_multiplier=2.0, sample_rate=1.0)]
    after = PrivacyLedger("bank-a")
    fill(after, PARAMETER_SETS["three uploads"], 3)
    after.record(4, WEIGHTS, 2.0, 1.0)
    spent = after.epsilon(DELTA)
    assert not ledger.would_exceed(spent, DELTA, nxt)  # spending exactly the budget is allowed
    assert ledger.would_exceed(math.nextafter(spent, 0), DELTA, nxt)  # one ulp less is not
    assert ledger.releases == before  # asking does not record
    # Pure parts compose exactly, so the boundary is exact too.
    pure = PrivacyLedger("bank-b")
    pure.record_pure(EDGES, 0.25)
    assert not pure.would_exceed(1.0, DELTA, [PureRelease(round=0, channel=EDGES, epsilon=0.75)])
    assert pure.would_exceed(0.999999, DELTA, [PureRelease(round=0, channel=EDGES, epsilon=0.75)])
    assert pure.would_exceed(0.0, DELTA, nxt)


def test_json_round_trip(tmp_path):
    ledger = PrivacyLedger("bank-a")
    ledger.record_pure(EDGES, 1.0)
    fill(ledger, PARAMETER_SETS["uploads + dp-sgd"], 3)
    path = tmp_path / "privacy-ledger.json"
    ledger.save(path)
    loaded = PrivacyLedger.load(path)
    assert loaded.bank == "bank-a" and loaded.channels == ledger.channels
    assert loaded.releases == ledger.releases
    assert loaded.epsilon(DELTA) == ledger.epsilon(DELTA)
    assert PrivacyLedger.from_json(PrivacyLedger("x").to_json()).releases == ()
    assert not (tmp_path / "privacy-ledger.json.tmp").exists()  # written atomically: no temporary left


def test_extend_records_planned_releases_as_they_are():
    planned = [
        PureRelease(round=0, channel=EDGES, epsilon=1.0),
        GaussianRelease(round=1, channel=WEIGHTS, noise_multiplier=2.0, sample_rate=1.0),
        GaussianRelease(round=1, channel=DP_SGD, noise_multiplier=1.1, sample_rate=1.0, steps=3),
    ]
    ledger = PrivacyLedger("bank-a")
    ledger.extend(planned)
    by_hand = PrivacyLedger("bank-a")
    by_hand.record_pure(EDGES, 1.0)
    by_hand.record(1, WEIGHTS, 2.0, 1.0)
    by_hand.record(1, DP_SGD, 1.1, 1.0, 3)
    assert ledger.releases == by_hand.releases == tuple(planned)
    with pytest.raises(ValueError, match="append-only"):
        ledger.extend([PureRelease(round=0, channel=EDGES, epsilon=1.0)])
    with pytest.raises(TypeError, match="not a release"):
        ledger.extend([(1, WEIGHTS, 2.0, 1.0)])


def test_a_corrupt_ledger_file_names_the_field(tmp_path):
    ledger = PrivacyLedger("bank-a")
    ledger.record(1, WEIGHTS, 2.0, 1.0)
    document = json.loads(ledger.to_json())
    document["releases"][0]["noise_multiplier"] = -1.0
    with pytest.raises(ConfigError, match="releases.0.gaussian.noise_multiplier"):
        PrivacyLedger.from_json(json.dumps(document), source="run/privacy-ledger.json")
    document["releases"][0]["noise_multiplier"] = 2.0
    document["releases"][0]["channel"] = "wieghts"
    with pytest.raises(ConfigError, match="unknown channel 'wieghts'"):
        PrivacyLedger.from_json(json.dumps(document))


def test_recording_validates_its_input():
    ledger = PrivacyLedger("bank-a")
    with pytest.raises(ValueError, match="unknown channel"):
        ledger.record(1, "wieghts", 1.0, 1.0)
    with pytest.raises(ValueError, match="sample_rate"):
        ledger.record(1, WEIGHTS, 1.0, 1.5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        ledger.record(1, WEIGHTS, 0.0, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        ledger.record_pure(EDGES, math.inf)
    ledger.record(3, WEIGHTS, 1.0, 1.0)
    with pytest.raises(ValueError, match="append-only"):
        ledger.record(2, WEIGHTS, 1.0, 1.0)
    with pytest.raises(ValueError, match="delta"):
        ledger.epsilon(0.0)
    with pytest.raises(ValueError, match="accountant"):
        ledger.epsilon(DELTA, "gdp")  # type: ignore[arg-type]
    assert PrivacyLedger("bank-a").epsilon(DELTA) == 0.0
