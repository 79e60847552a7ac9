"""``simulate --secure``: the CKKS path gives the plaintext run's model, and refuses what policy forbids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.crypto.secure_summation import QuantisedSummation, SecureSummation
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import PolicyError
from fedgl_secure.methods.base import WEIGHTS, split_weights_sum
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.simulation.experiment import run_experiment

BASELINE = Path(__file__).resolve().parents[1] / "policies" / "baseline.toml"


class Recording:
    """Wraps a summation and keeps every round's sums (the final W̄ is derived from the last)."""

    def __init__(self, inner):
        self.inner, self.rounds = inner, []

    def __call__(self, round_number, contributions, reference=None):
        sums = self.inner(round_number, contributions, reference=reference)
        self.rounds.append(sums)
        return sums

    def final_weights(self):
        return [fedavg(*split_weights_sum(sums[WEIGHTS].double())) for sums in self.rounds]


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0)


def test_secure_run_gives_the_plaintext_global_model(dataset):
    """The baseline packs values: its plaintext twin sums the same quantised integers (unpacked CKKS against
    float sums: the next test; quantised against exact sums: test_packing.py)."""
    config = build_config({"method": "fedgl", "federation": {"max_rounds": 2}, "device": "cpu"})
    plain = Recording(QuantisedSummation(load_policy(BASELINE)))
    plain_result = run_experiment(config, dataset, progress=False, summation=plain)
    secure_summation = SecureSummation(load_policy(BASELINE))
    secure = Recording(secure_summation)
    try:
        secure_result = run_experiment(config, dataset, progress=False, summation=secure)
    finally:
        secure_summation.close()
    assert len(secure.rounds) == len(plain.rounds) == 2
    for plain_sums, secure_sums in zip(plain.rounds, secure.rounds, strict=True):
        assert set(plain_sums) == set(secure_sums)
        for kind in plain_sums:
            assert secure_sums[kind].dtype == torch.float32 and secure_sums[kind].shape == plain_sums[kind].shape
            scale = max(1.0, float(plain_sums[kind].abs().max()))
            assert float((secure_sums[kind] - plain_sums[kind]).abs().max()) <= 1e-6 * scale, kind
    assert float((secure.final_weights()[-1] - plain.final_weights()[-1]).abs().max()) <= 1e-4
    assert [h.val_accuracy for h in secure_result.history] == [h.val_accuracy for h in plain_result.history]
    assert secure_summation.wire.bytes_by_kind[WEIGHTS] > 0


def test_one_round_secure_and_plaintext_give_the_same_global_model(dataset, small_policy):
    """W̄ of round 1 (Eq. 10, with Σ_k w_k folded into the weights upload) agrees within 1e-5."""
    config = build_config({"method": "federated", "federation": {"max_rounds": 1}, "device": "cpu"})
    plain = Recording(PlaintextSummation())
    run_experiment(config, dataset, progress=False, summation=plain)
    summation = SecureSummation(small_policy)
    secure = Recording(summation)
    try:
        run_experiment(config, dataset, progress=False, summation=secure)
    finally:
        summation.close()
    _, plain_total = split_weights_sum(plain.rounds[0][WEIGHTS])
    _, secure_total = split_weights_sum(secure.rounds[0][WEIGHTS])
    assert plain_total == pytest.approx(secure_total, abs=1e-3) and plain_total > 0
    assert float((secure.final_weights()[0] - plain.final_weights()[0]).abs().max()) <= 1e-5
    assert set(summation.wire.bytes_by_kind) == {WEIGHTS}


def test_kinds_outside_the_policy_never_get_encrypted(dataset, small_policy):
    policy = small_policy.model_copy(update={"allowed_kinds": ("weights",)})
    summation = SecureSummation(policy)
    config = build_config({"method": "fedgl", "federation": {"max_rounds": 1}, "device": "cpu"})
    try:
        with pytest.raises(PolicyError, match=r"kinds \['embeddings', 'node_weight', 'predictions'\] may not leave"):
            run_experiment(config, dataset, progress=False, summation=summation)
        assert not summation.wire.bytes_by_kind
    finally:
        summation.close()


def test_cli_secure_flag_runs_and_reports_wire_size(tmp_path):
    # one float per slot: the synthetic banks' federated weights (up to |360|) leave the baseline's packed range,
    # which the baseline refuses (fail closed; test_packing.py)
    unpacked = tmp_path / "unpacked.toml"
    unpacked.write_text('[he]\npacking = "none"\n')
    result = CliRunner().invoke(
        app,
        ["simulate", "--secure", "--policy", str(unpacked), "--rounds", "1", "--method", "federated", "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["rounds_run"] == 1 and len(summary["secure"]["fingerprint"]) == 64
    assert set(summary["secure"]["wire_bytes"]) == {"weights"}


def test_cli_policy_errors_are_clear(tmp_path):
    bad = tmp_path / "weak.toml"
    bad.write_text("quorum = 1\n")
    result = CliRunner().invoke(app, ["simulate", "--secure", "--policy", str(bad), "--rounds", "1"])
    assert result.exit_code == 2 and f"{bad}: quorum:" in result.output
    result = CliRunner().invoke(app, ["simulate", "--policy", str(bad), "--rounds", "1"])
    assert result.exit_code == 2 and "--secure" in result.output
