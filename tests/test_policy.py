"""Policy files: defaults, 128-bit security, CKKS constraints, and errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedgl_secure.crypto.ckks_params import sum_bound, upload_bound
from fedgl_secure.crypto.he_security import MAX_LOG_Q_128, security_check
from fedgl_secure.errors import PolicyError
from fedgl_secure.privacy.policy import KNOWN_KINDS, load_policy

BASELINE = Path(__file__).resolve().parents[1] / "policies" / "baseline.toml"


def _write(tmp_path, text: str):
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_baseline_policy_loads_with_the_design_defaults():
    policy = load_policy(BASELINE)
    assert policy.he.poly_modulus_degree == 8192
    assert policy.he.coeff_mod_bit_sizes == (60, 60) and policy.he.global_scale_bits == 40
    assert policy.quorum == 2 and set(policy.allowed_kinds) == set(KNOWN_KINDS)
    assert policy.timeouts.upload_seconds <= policy.timeouts.round_seconds


def test_empty_file_gives_safe_defaults(tmp_path):
    policy = load_policy(_write(tmp_path, ""))
    assert policy.he.coeff_mod_bit_sizes == (60, 60) and policy.quorum == 2


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("quorum = 1", "quorum", "below 2"),
        ("quorum = 0", "quorum", "below 2"),
        ("[he]\npoly_modulus_degree = 4096\ncoeff_mod_bit_sizes = [60, 60]", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\ncoeff_mod_bit_sizes = [60, 60, 60, 60]", "he.coeff_mod_bit_sizes", "128-bit"),
        ("[he]\npoly_modulus_degree = 3000", "he.poly_modulus_degree", "ring dimension"),
        ("[he]\ncoeff_mod_bit_sizes = [60]", "he.coeff_mod_bit_sizes", "at least 2 primes"),
        ("[he]\ncoeff_mod_bit_sizes = [60, 40]", "he.coeff_mod_bit_sizes", "special"),
        ("[he]\ncoeff_mod_bit_sizes = [61, 61]", "he.coeff_mod_bit_sizes", "outside"),
        ("[he]\ncoeff_mod_bit_sizes = [10, 60]", "he.coeff_mod_bit_sizes", "outside"),
        ("[he]\nglobal_scale_bits = 60", "he.global_scale_bits", "no room"),
        ("[he]\nglobal_scale_bits = 58", "he.global_scale_bits", "no room"),
        ("[he]\nglobal_scale_bits = 10", "he.global_scale_bits", "precision"),
        ("[he]\nsecurity = 80", "he.security", "Extra inputs"),
        ('allowed_kinds = ["weights", "graphs"]', "allowed_kinds", "graphs"),
        ('allowed_kinds = ["weights", "weights"]', "allowed_kinds", "twice"),
        ("[timeouts]\nround_seconds = 10\nupload_seconds = 20", "timeouts", "upload_seconds"),
        ("[timeouts]\nround_seconds = -1", "timeouts.round_seconds", "greater than 0"),
        ("dp = true", "dp", "Extra inputs"),
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
    policy = load_policy(_write(tmp_path, "[he]\ncoeff_mod_bit_sizes = [60, 40, 40, 60]"))
    assert sum(policy.he.coeff_mod_bit_sizes) == 200


def test_value_bounds_follow_the_data_primes():
    assert upload_bound((60, 60), 40) == 2.0**18 and sum_bound((60, 60), 40) == 2.0**19
    assert sum_bound((60, 40, 40, 60), 40) == 2.0**99
