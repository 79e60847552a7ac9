"""Policy files: defaults, 128-bit security, CKKS constraints, and errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.base import KNOWN_KINDS
from fedgl_secure.policy.ckks_params import sum_bound, upload_bound
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.he_security import MAX_LOG_Q_128, security_check
from fedgl_secure.policy.schema import load_policy, policy_from_dict

POLICIES = Path(__file__).resolve().parents[1] / "policies"
BASELINE = POLICIES / "baseline.toml"


def _write(tmp_path, text: str):
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_baseline_policy_loads_with_the_design_defaults():
    policy = load_policy(BASELINE)
    assert policy.he.poly_modulus_degree == 4096
    assert policy.he.coeff_mod_bit_sizes == (46, 47, 16) and policy.he.global_scale_bits == 60
    assert policy.he.packing == "quantised" and policy.he == HEParameters()  # the file states the defaults
    assert policy.quorum == 3 and policy.he.threshold == 2 and set(policy.allowed_kinds) == set(KNOWN_KINDS)
    assert policy.timeouts.upload_seconds <= policy.timeouts.round_seconds
    assert policy.protection == "he" and not policy.has_dp and policy.budget is None


def test_empty_file_gives_safe_defaults(tmp_path):
    policy = load_policy(_write(tmp_path, ""))
    assert policy.he.coeff_mod_bit_sizes == (46, 47, 16) and policy.quorum == 3
    assert policy.he.packing == "quantised" and policy.he.threshold == 2
    assert policy.quorum > policy.he.threshold  # the default quorum is one the default threshold admits


@pytest.mark.parametrize(
    ("text", "needed"),
    [
        ("quorum = 2", 3),  # the old default: q = t
        ("quorum = 3\n[he]\nthreshold = 3", 4),
        ("quorum = 3\n[he]\nthreshold = 4", 5),  # q < t
        ("quorum = 5\n[he]\nthreshold = 5\nmax_banks = 7", 6),
    ],
)
def test_a_quorum_not_above_the_threshold_is_refused_naming_the_quorum_it_needs(tmp_path, text, needed):
    """With q <= t, the aggregator, the key authority and t − 1 banks could decrypt a legitimate sum over q
    banks, q − 1 of them colluding: that sum is the remaining bank's upload alone."""
    path = _write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert f"{path}: quorum: " in message
    assert "is not above he.threshold" in message
    assert f"quorum >= he.threshold + 1 = {needed}" in message


def test_a_quorum_one_above_the_threshold_is_accepted(tmp_path):
    policy = load_policy(_write(tmp_path, "quorum = 4\n[he]\nthreshold = 3"))
    assert policy.quorum == 4 and policy.he.threshold == 3


def test_a_threshold_above_max_banks_is_refused(tmp_path):
    path = _write(tmp_path, 'quorum = 5\n[he]\nmax_banks = 3\nthreshold = 4\npacking = "none"')
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert f"{path}: he.threshold: " in message
    assert "t = 4 exceeds he.max_banks = 3" in message


def test_without_he_a_quorum_of_two_still_loads(tmp_path):
    """No threshold decryption without HE: the rule q > t is about HE policies only."""
    policy = load_policy(_write(tmp_path, 'protection = "none"\nquorum = 2'))
    assert policy.protection == "none" and policy.quorum == 2
    assert policy_from_dict({"protection": "none", "quorum": 2}).quorum == 2


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("quorum = 1", "quorum", "below 2"),
        ("quorum = 0", "quorum", "below 2"),
        ("[he]\npoly_modulus_degree = 4096\ncoeff_mod_bit_sizes = [60, 60]", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\ncoeff_mod_bit_sizes = [60, 60, 60, 60]", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\npoly_modulus_degree = 3000", "he.poly_modulus_degree", "ring dimension"),
        # only N given: the default moduli (60, 60) must be checked against it, not skipped as defaults
        ("[he]\npoly_modulus_degree = 1024", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\npoly_modulus_degree = 2048", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\npoly_modulus_degree = 2048", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\ncoeff_mod_bit_sizes = [60]", "he.coeff_mod_bit_sizes", "at least 2 primes"),
        ("[he]\ncoeff_mod_bit_sizes = [61, 61]", "he.coeff_mod_bit_sizes", "outside"),
        ("[he]\ncoeff_mod_bit_sizes = [10, 60]", "he.coeff_mod_bit_sizes", "outside"),
        ("[he]\nglobal_scale_bits = 92", "he.global_scale_bits", "no room"),
        ("[he]\nglobal_scale_bits = 50", "he.global_scale_bits", "noise flooding"),
        ("[he]\nglobal_scale_bits = 10", "he.global_scale_bits", "precision"),
        ("[he]\nsecurity = 80", "he.security", "Extra inputs"),
        ('allowed_kinds = ["weights", "graphs"]', "allowed_kinds", "graphs"),
        ('allowed_kinds = ["weights", "weights"]', "allowed_kinds", "twice"),
        ("[timeouts]\nround_seconds = 10\nupload_seconds = 20", "timeouts", "upload_seconds"),
        ("[timeouts]\nround_seconds = -1", "timeouts.round_seconds", "greater than 0"),
        ("privacy = true", "privacy", "Extra inputs"),
        ("dp = true", "dp", "valid dictionary"),
        ('protection = "partial"', "protection", "'he' or 'none'"),
        # claims without enforcement
        ("[budget]\nepsilon = 8\nrounds = 10", "budget", "no DP channel is enabled"),
        ('protection = "none"\n[he]\npoly_modulus_degree = 8192', "he", "protection = 'none'"),
        ('protection = "none"\n[budget]\nepsilon = 8\nrounds = 10', "budget", "protection = 'none'"),
        ('protection = "none"\n[dp.edges]\nmechanism = "none"', "dp", "protection = 'none'"),
    ],
)
def test_bad_policies_name_the_file_and_field(tmp_path, text, field, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert f"{path}: {field}: " in message
    assert fragment in message


def test_retired_sample_weight_kind_says_where_it_went(tmp_path):
    path = _write(tmp_path, 'allowed_kinds = ["weights", "sample_weight", "predictions"]')
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert f"{path}: allowed_kinds: " in message
    assert "'sample_weight' was folded into 'weights'" in message
    assert "sample_weight" not in KNOWN_KINDS


def test_invalid_toml_and_missing_file_are_named(tmp_path):
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(_write(tmp_path, "quorum = = 2"))
    with pytest.raises(PolicyError, match="nope.toml: cannot read"):
        load_policy(tmp_path / "nope.toml")


@pytest.mark.parametrize(("n", "limit"), sorted(MAX_LOG_Q_128.items()))
def test_security_table_bound_is_inclusive(n, limit):
    security_check(n, [limit])  # exactly at the bound: 128-bit secure
    with pytest.raises(ValueError, match="128-bit"):
        security_check(n, [limit - 30, 31])


def test_common_four_prime_chain_is_accepted(tmp_path):
    policy = load_policy(_write(tmp_path, "[he]\npoly_modulus_degree = 8192\ncoeff_mod_bit_sizes = [60, 40, 40, 60]"))
    assert sum(policy.he.coeff_mod_bit_sizes) == 200


def test_value_bounds_follow_the_data_primes():
    assert upload_bound((60, 60), 40) == 2.0**18 and sum_bound((60, 60), 40) == 2.0**19
    assert sum_bound((60, 40, 40, 60), 40) == 2.0**99


# --- the DP part of the schema ------------------------------------------------------------------


def test_shipped_policies_load():
    strict = load_policy(POLICIES / "strict-dp.toml")
    assert strict.protection == "he" and strict.has_dp
    assert strict.dp.enabled_channels() == ("weights", "predictions", "embeddings")
    assert strict.budget.epsilon <= 8 and strict.budget.delta == 1e-5
    assert strict.budget.on_exhausted == "stop-contributing"
    plaintext = load_policy(POLICIES / "research-plaintext.toml")
    assert plaintext.protection == "none" and not plaintext.has_dp and plaintext.budget is None


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _deep_merge(merged[key], value) if isinstance(value, dict) and key in merged else value
    return merged


_CHANNEL = {"clip": 1.0, "noise_multiplier": 10.0}
# A valid DP policy: every data kind noised, a degree bound, a budget.
DP_POLICY = {
    "dp": {
        "weights": dict(_CHANNEL),
        "predictions": dict(_CHANNEL),
        "embeddings": dict(_CHANNEL),
        "graph": {"max_degree": 4},
    },
    "budget": {"epsilon": 8.0, "rounds": 10},
}


def test_a_valid_dp_policy_has_the_documented_defaults():
    policy = policy_from_dict(DP_POLICY)
    assert policy.dp.weights.enabled and policy.dp.weights.noise == "distributed"
    assert policy.dp.graph.neighbouring == "node" and policy.dp.graph.num_layers == 2
    assert policy.dp.edges.mechanism == "none" and not policy.dp.sgd_enabled
    assert policy.budget.delta == 1e-5 and policy.budget.accountant == "rdp"
    assert policy.budget.on_exhausted == "stop-contributing"


def test_a_disabled_channel_needs_no_settings_but_counts_as_no_noise():
    policy = policy_from_dict(
        _deep_merge(DP_POLICY, {"allowed_kinds": ["weights", "node_weight"], "dp": {"predictions": {"enabled": False}}})
    )
    assert policy.dp.upload_channel("predictions") is None
    assert policy.dp.enabled_channels() == ("weights", "embeddings")


@pytest.mark.parametrize(
    ("extra", "field", "fragment"),
    [
        ({"dp": {"weights": {"noise_multiplier": 0}}}, "dp.weights.noise_multiplier", "greater than 0"),
        ({"dp": {"weights": {"noise_multiplier": -1.0}}}, "dp.weights.noise_multiplier", "greater than 0"),
        ({"dp": {"weights": {"noise_multiplier": None}}}, "dp.weights.noise_multiplier", "required when"),
        ({"dp": {"predictions": {"clip": 0}}}, "dp.predictions.clip", "greater than 0"),
        ({"dp": {"embeddings": {"clip": None}}}, "dp.embeddings.clip", "required when"),
        ({"dp": {"weights": {"noise": "server"}}}, "dp.weights.noise", "'distributed' or 'central'"),
        ({"dp": {"weights": {"sigma": 3}}}, "dp.weights.sigma", "Extra inputs"),
        ({"dp": {"graph": {"max_degree": None}}}, "dp.graph.max_degree", "required when DP is on"),
        ({"dp": {"graph": {"max_degree": 0}}}, "dp.graph.max_degree", "greater than or equal to 1"),
        ({"dp": {"graph": {"neighbouring": "user"}}}, "dp.graph.neighbouring", "'node', 'edge' or 'features'"),
        ({"dp": {"sgd": {"max_grad_norm": 1.0, "noise_multiplier": 1.0}}}, "dp.sgd.local_epochs", "required when"),
        (
            {"dp": {"sgd": {"max_grad_norm": 1.0, "noise_multiplier": 0, "local_epochs": 3}}},
            "dp.sgd.noise_multiplier",
            "greater than 0",
        ),
        ({"dp": {"unit": "edge", "edges": {"mechanism": "laplace", "epsilon": 1}}}, "dp.unit", "'laplace' hides"),
        ({"dp": {"edges": {"mechanism": "coin"}}}, "dp.edges.mechanism", "unknown mechanism"),
        ({"dp": {"edges": {"mechanism": "randomized-response"}}}, "dp.edges.epsilon", "required with"),
        ({"dp": {"edges": {"epsilon": 1.0}}}, "dp.edges.epsilon", "only with mechanism"),
        ({"budget": {"on_exhausted": "continue"}}, "budget.on_exhausted", "must stop contributing"),
        ({"budget": {"on_exhausted": "warn"}}, "budget.on_exhausted", "fail closed"),
        ({"budget": {"accountant": "gdp"}}, "budget.accountant", "'rdp' or 'prv'"),
        ({"budget": {"epsilon": 0}}, "budget.epsilon", "greater than 0"),
        ({"budget": {"epsilon": float("inf")}}, "budget.epsilon", "finite"),
        ({"budget": {"delta": 0.1}}, "budget.delta", "too large"),
        ({"budget": {"rounds": 0}}, "budget.rounds", "greater than or equal to 1"),
        ({"budget": {"spend": 1}}, "budget.spend", "Extra inputs"),
        ({"budget": None}, "budget", "required when DP is on"),
        ({"dp": {"predictions": {"enabled": False}}}, "dp.predictions", "without noise"),
        ({"quorum": 1}, "quorum", "below 2"),  # distributed noise can never be split over fewer than 2 banks
        ({"quorum": 2}, "quorum", "is not above he.threshold = 2"),  # nor over a sum the coalition can isolate
        ({"protection": "none"}, "dp", "protection = 'none'"),
    ],
)
def test_dp_validation_errors_name_the_field(extra, field, fragment):
    values = _deep_merge(DP_POLICY, extra)
    if values.get("budget") is None:
        values.pop("budget", None)
    with pytest.raises(PolicyError) as caught:
        policy_from_dict(values, "x.toml")
    message = str(caught.value)
    assert f"x.toml: {field}: " in message
    assert fragment in message


def test_missing_budget_fields_are_named():
    with pytest.raises(PolicyError) as caught:
        policy_from_dict({**DP_POLICY, "budget": {"epsilon": 8}}, "x.toml")
    assert "x.toml: budget.rounds: Field required" in str(caught.value)
