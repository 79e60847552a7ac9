"""Effective guarantees of a policy: sensitivities, noise, ε equal to Opacus' own, statuses, and `policy check`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from opacus.accountants import PRVAccountant, RDPAccountant
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy.accounting import DP_SGD, EDGES, PRV_EPS_ERROR
from fedgl_secure.privacy.calibration import central_noise, central_noise_count, central_noise_stds, noise_std
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.privacy.release_schedule import planned_ledger, round_releases, setup_releases

POLICIES = Path(__file__).resolve().parents[1] / "policies"
STRICT = POLICIES / "strict-dp.toml"


def _k_node(d: int) -> int:
    """Rows of a 2-layer GCN one node add/remove moves at max degree d: 1 + d(1 + (d−1) + (d−1)²)."""
    return 1 + d * (1 + (d - 1) + (d - 1) ** 2)


def _opacus(engine, steps: list[tuple[float, int]], delta: float, **kwargs) -> float:
    """Opacus' own figure: every full-batch release fed as a step through its public API."""
    for z, count in steps:
        for _ in range(count):
            engine.step(noise_multiplier=z, sample_rate=1.0)
    return engine.get_epsilon(delta=delta, **kwargs)


def _policy(**dp_and_budget) -> dict:
    values = {
        "dp": {
            "weights": {"clip": 1.0, "noise_multiplier": 8.0},
            "predictions": {"clip": 1.0, "noise_multiplier": 8.0},
            "embeddings": {"clip": 2.0, "noise_multiplier": 8.0, "noise": "central"},
            "graph": {"max_degree": 3},
        },
        "budget": {"epsilon": 8.0, "rounds": 20},
    }
    for section, extra in dp_and_budget.items():
        values[section] = {**values[section], **extra}
    return values


def test_strict_dp_meets_its_budget_and_equals_opacus_computed_independently():
    policy = load_policy(STRICT)
    budget = policy.budget
    guarantees = effective_guarantees(policy)
    assert guarantees.status == "dp" and budget.accountant == "rdp"
    # Independently: each distributed channel is a Gaussian whose noise, against a bank that knows its own
    # share out of q, is z·√((q−1)/q); one full-batch release per channel per round.
    q = policy.quorum
    steps = [
        (getattr(policy.dp, kind).noise_multiplier * math.sqrt((q - 1) / q), budget.rounds)
        for kind in ("weights", "predictions", "embeddings")
    ]
    expected = _opacus(RDPAccountant(), steps, delta=1e-5)
    assert guarantees.epsilon == pytest.approx(expected, rel=1e-9)
    assert guarantees.epsilon <= 8.0 and guarantees.delta == 1e-5
    assert guarantees.budget_met and guarantees.rounds_within_budget == budget.rounds == guarantees.rounds
    assert guarantees.released_without_dp == ("node_weight",)


def test_strict_dp_sensitivities_follow_clip_and_degree_bound():
    policy = load_policy(STRICT)
    channels = {c.channel: c for c in effective_guarantees(policy).channels}
    d = policy.dp.graph.max_degree
    assert channels["weights"].sensitivity == pytest.approx(2 * policy.dp.weights.clip)
    assert channels["predictions"].sensitivity == pytest.approx(2 * policy.dp.predictions.clip * math.sqrt(_k_node(d)))
    for c in channels.values():
        assert c.noise_std == pytest.approx(c.noise_multiplier * c.sensitivity)
        assert c.share_std == pytest.approx(c.noise_std / math.sqrt(policy.quorum))
        assert 0 < c.epsilon_per_round < c.epsilon_total


def test_baseline_reports_no_dp_and_plaintext_no_protection():
    baseline = effective_guarantees(load_policy(POLICIES / "baseline.toml"))
    assert baseline.status == "he-only" and baseline.epsilon is None and baseline.channels == ()
    assert "No differential privacy" in baseline.assumptions[0]
    plaintext = effective_guarantees(load_policy(POLICIES / "research-plaintext.toml"))
    assert plaintext.status == "no-protection" and plaintext.epsilon is None
    assert "No protection" in plaintext.assumptions[0] and "red" in plaintext.assumptions[0]


def test_central_noise_dp_sgd_and_edge_dp_compose_as_opacus_plus_pure_epsilon():
    values = _policy(dp={"sgd": {"max_grad_norm": 1.0, "noise_multiplier": 50.0, "local_epochs": 2}})
    values["dp"]["edges"] = {"mechanism": "randomized-response", "epsilon": 0.5}
    policy = policy_from_dict(values)
    guarantees = effective_guarantees(policy)
    by_channel = {c.channel: c for c in guarantees.channels}
    # Central noise: every single observer faces the full σ. Distributed: a bank that knows its own share out of
    # q faces z·√((q−1)/q). DP-SGD on a GCN: z / (2K − 1), K rows moved.
    q = policy.quorum
    distributed_z = 8.0 * math.sqrt((q - 1) / q)
    assert by_channel["embeddings"].accounted_noise_multiplier == 8.0
    assert by_channel["predictions"].accounted_noise_multiplier == pytest.approx(distributed_z)
    sgd_z = 50.0 / (2 * _k_node(3) - 1)
    assert by_channel[DP_SGD].accounted_noise_multiplier == pytest.approx(sgd_z)
    assert by_channel[DP_SGD].steps_per_round == 2
    assert by_channel[EDGES].epsilon_total == 0.5 and by_channel[EDGES].steps_per_round == 0
    rounds = policy.budget.rounds
    steps = [(distributed_z, 2 * rounds), (8.0, rounds), (sgd_z, 2 * rounds)]
    assert guarantees.epsilon == pytest.approx(_opacus(RDPAccountant(), steps, 1e-5) + 0.5, rel=1e-9)
    assert any("randomised response" in a for a in guarantees.assumptions)
    assert any("z/(2K−1)" in a for a in guarantees.assumptions)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # Opacus' PRV evaluates log(1 − q) at q = 1
def test_prv_accountant_equals_opacus_prv():
    policy = policy_from_dict(_policy(budget={"accountant": "prv", "rounds": 5}))
    q = policy.quorum  # weights and predictions distributed (z·√((q−1)/q) against a bank), embeddings central
    steps = [(8.0 * math.sqrt((q - 1) / q), 2 * 5), (8.0, 5)]
    expected = _opacus(PRVAccountant(), steps, 1e-5, eps_error=PRV_EPS_ERROR)
    assert effective_guarantees(policy).epsilon == pytest.approx(expected, rel=1e-6)


def test_over_budget_reports_the_round_at_which_a_bank_stops():
    policy = policy_from_dict(_policy(budget={"epsilon": 4.0, "rounds": 200}))
    guarantees = effective_guarantees(policy)
    assert not guarantees.budget_met and guarantees.epsilon > 4.0
    n = guarantees.rounds_within_budget
    assert 0 < n < 200
    assert planned_ledger(policy, n).epsilon(1e-5) <= 4.0 < planned_ledger(policy, n + 1).epsilon(1e-5)


def test_edge_dp_above_the_budget_is_refused_as_it_would_allow_no_round():
    # it used to load with rounds_within_budget == 0, every bank stopping before its first upload
    values = _policy(budget={"epsilon": 1.0})
    values["dp"]["edges"] = {"mechanism": "randomized-response", "epsilon": 2.0}
    with pytest.raises(PolicyError, match=r"dp\.edges\.epsilon: 2 exceeds budget\.epsilon = 1"):
        policy_from_dict(values)


def test_round_releases_are_what_the_planned_ledger_records():
    policy = policy_from_dict(_policy())
    releases = round_releases(policy, 3)
    assert [r.channel for r in releases] == ["weights", "predictions", "embeddings"]
    assert all(r.round == 3 and r.sample_rate == 1.0 and r.steps == 1 for r in releases)
    assert setup_releases(policy) == []
    assert len(planned_ledger(policy, 4).releases) == 12
    assert round_releases(load_policy(POLICIES / "baseline.toml"), 1) == []


# --- fedgl-secure policy check ------------------------------------------------------------------


def _invoke(*args: str):
    return CliRunner().invoke(app, ["policy", "check", *args])


def test_policy_check_prints_the_guarantees():
    result = _invoke(str(STRICT))
    assert result.exit_code == 0, result.output
    assert "HE + differential privacy" in result.output
    assert "within budget" in result.output and "predictions" in result.output
    assert "assumptions:" in result.output and "Degree bound" in result.output


def test_policy_check_json_and_other_statuses():
    result = _invoke(str(STRICT), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["status"] == "dp" and document["epsilon"] <= 8.0 and document["budget_met"] is True
    assert {c["channel"] for c in document["channels"]} == {"weights", "predictions", "embeddings"}
    plaintext = _invoke(str(POLICIES / "research-plaintext.toml"))
    assert plaintext.exit_code == 0 and "NO PROTECTION" in plaintext.output
    baseline = _invoke(str(POLICIES / "baseline.toml"), "--format", "json")
    assert baseline.exit_code == 0 and json.loads(baseline.output)["status"] == "he-only"


def test_policy_check_bad_file_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(STRICT.read_text().replace('on_exhausted = "stop-contributing"', 'on_exhausted = "continue"'))
    result = _invoke(str(path))
    assert result.exit_code == 2
    assert f"{path}: budget.on_exhausted: " in result.output
    missing = _invoke(str(tmp_path / "nope.toml"))
    assert missing.exit_code == 2 and "cannot read policy file" in missing.output


def test_policy_check_over_budget_exits_1(tmp_path):
    path = tmp_path / "long.toml"
    path.write_text(STRICT.read_text().replace("rounds = 100", "rounds = 150"))
    result = _invoke(str(path))
    assert result.exit_code == 1
    assert "OVER BUDGET" in result.output


def test_a_loose_rdp_bound_is_reported_not_hidden():
    # Very large noise: the best Rényi order lies beyond Opacus' largest, so RDP's figure is valid but loose.
    values = _policy(budget={"rounds": 1})
    for kind in ("weights", "predictions", "embeddings"):
        values["dp"][kind]["noise_multiplier"] = 500.0
    guarantees = effective_guarantees(policy_from_dict(values))
    assert guarantees.budget_met and any("not tight" in note for note in guarantees.notes)


def test_central_noise_is_drawn_in_one_place_for_every_party():
    policy = policy_from_dict(_policy(dp={"weights": {"clip": 1.0, "noise_multiplier": 8.0, "noise": "central"}}))
    assert policy.dp.central_kinds() == ("weights", "embeddings")
    stds = central_noise_stds(policy)
    assert stds == {"weights": noise_std(policy, "weights"), "embeddings": noise_std(policy, "embeddings")}
    assert stds["weights"] == 8.0 * 2 * 1.0  # z × 2C
    assert central_noise_stds(policy_from_dict(_policy())) == {"embeddings": noise_std(policy, "embeddings")}
    assert central_noise_stds(load_policy(POLICIES / "baseline.toml")) == {}
    # Σ ŵ_k, the last weights entry, is public: never noised; every value of other kinds is
    assert central_noise_count("weights", 11) == 10 and central_noise_count("weights", 0) == 0
    assert central_noise_count("embeddings", 11) == 11
    noise = central_noise("weights", 20_001, 3.0, np.random.default_rng(0).bytes)
    assert noise.shape == (20_001,) and noise[-1] == 0.0 and np.count_nonzero(noise) == 20_000
    assert float(noise[:-1].std()) == pytest.approx(3.0, rel=0.03)
    rows = central_noise("embeddings", (4, 3), 1.0, np.random.default_rng(1).bytes)
    assert rows.shape == (4, 3) and np.count_nonzero(rows) == 12
    assert central_noise("weights", 0, 1.0).shape == (0,)


def test_needs_degree_bound_is_read_from_the_policy():
    assert policy_from_dict(_policy()).dp.needs_degree_bound
    weights_only = policy_from_dict(
        {
            "allowed_kinds": ["weights"],
            "dp": {"weights": {"clip": 1.0, "noise_multiplier": 8.0}},
            "budget": {"epsilon": 8.0, "rounds": 20},
        }
    )
    assert not weights_only.dp.needs_degree_bound and weights_only.dp.degree_bound_channels() == ()
    assert not any("Degree bound" in a for a in effective_guarantees(weights_only).assumptions)
    assert any("Degree bound" in a for a in effective_guarantees(policy_from_dict(_policy())).assumptions)


def test_policy_check_refuses_a_ring_too_small_for_the_default_moduli(tmp_path):
    # The probe of issue 13: only N is set, the default moduli (60, 60) = 120 bits > 27 allowed at N = 1024.
    path = tmp_path / "small-ring.toml"
    path.write_text("[he]\npoly_modulus_degree = 1024\n")
    result = _invoke(str(path))
    assert result.exit_code == 2
    assert f"{path}: he.coeff_mod_bit_sizes: " in result.output and "128-bit" in result.output
