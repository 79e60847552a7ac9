"""DP applied in rounds: clipping and noise per bank, fail-closed budgets, and the run directory for the audit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.crypto.audit_log import verify_audit_chain
from fedgl_secure.crypto.receipts import load_public_key, verify_receipt
from fedgl_secure.crypto.secure_summation import SecureSummation
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError, PolicyError
from fedgl_secure.methods.base import META_GRADIENTS, NODE_WEIGHT, PREDICTIONS, WEIGHTS, weights_term
from fedgl_secure.methods.privacy_checks import check_upload_kinds
from fedgl_secure.policy.schema import load_policy, policy_from_dict
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.dp_round import BankPrivacy, FederationPrivacy, noise_std
from fedgl_secure.privacy.release_schedule import planned_ledger, round_releases
from fedgl_secure.privacy.secure_noise import clip_vector, gaussian_share, noise_share_std
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.wire.run_record import RunDirectoryError, load_run_dir

POLICIES = Path(__file__).resolve().parents[1] / "policies"
HE_ONLY = {"protection": "he", "quorum": 3, "allowed_kinds": [WEIGHTS]}


def weights_policy(epsilon: float = 1000.0, rounds: int = 100, noise: str = "distributed", quorum: int = 3):
    return policy_from_dict(
        {
            **HE_ONLY,
            "quorum": quorum,
            "dp": {"weights": {"clip": 1.0, "noise_multiplier": 2.0, "noise": noise}},
            "budget": {"epsilon": epsilon, "delta": 1e-5, "rounds": rounds},
        }
    )


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0)


# --- clipping and noise -------------------------------------------------------------------------


def test_weights_update_is_clipped_and_carries_the_bank_share():
    policy = weights_policy(quorum=3)
    size, weight, w_max = 40_000, 300.0, 800.0
    reference = torch.randn(size, generator=torch.Generator().manual_seed(1))
    local = reference + 5.0 * torch.randn(size, generator=torch.Generator().manual_seed(2))  # ‖Δ‖ ≫ C
    bank = BankPrivacy("bank-0", policy, w_max, random_bytes=seeded_bytes(7))
    released = bank.protect(1, {WEIGHTS: weights_term(weight, local)}, reference, weight)[WEIGHTS].double().numpy()

    scale = weight / w_max
    assert released[-1] == pytest.approx(scale, rel=1e-7)  # ŵ_k: public, no noise
    sigma = noise_std(policy, WEIGHTS)  # z × 2C on the normalised scale
    assert sigma == pytest.approx(2.0 * 2 * 1.0)
    expected = scale * (reference.double().numpy() + clip_vector((local - reference).double().numpy(), 1.0))
    noise = released[:-1] - expected
    # the same byte source regenerates the share: what is left is the clipped update, ‖w_k·clip(Δ)‖ ≤ C·w_k
    share = gaussian_share((size,), sigma, 3, _random_bytes=seeded_bytes(7))
    update = released[:-1] - share - scale * reference.double().numpy()
    assert np.linalg.norm(update) * w_max <= 1.0 * weight * (1 + 1e-4)  # float32 upload rounding allowed
    assert np.linalg.norm(update) * w_max == pytest.approx(weight, rel=1e-3)  # Δ ≫ C was clipped to the bound
    # std of the share: σ/√q. With n = 40 000 draws the sample std has relative standard error
    # 1/√(2n) ≈ 0.35 %; 2 % is more than 5 standard errors (the seed is fixed, so it never flakes).
    assert float(np.std(noise)) == pytest.approx(noise_share_std(sigma, 3), rel=0.02)
    assert abs(float(np.mean(noise))) < 5 * noise_share_std(sigma, 3) / math.sqrt(size)
    assert [r.channel for r in bank.ledger.releases] == [r.channel for r in round_releases(policy, 1)]


def test_prediction_rows_are_clipped_and_noised_on_every_row():
    policy = load_policy(POLICIES / "strict-dp.toml")
    m, c, weight, w_max = 500, 4, 50.0, 100.0
    rows = np.zeros((m, c))
    held = np.arange(0, m, 2)
    rows[held] = 3.0  # norm 6 > C = 1
    contribution = {  # predictions first: the byte source feeds their share alone
        PREDICTIONS: torch.from_numpy(weight * rows).float(),
        NODE_WEIGHT: torch.from_numpy(np.where(np.arange(m) % 2 == 0, weight, 0.0)).float(),
    }
    released = BankPrivacy("bank-1", policy, w_max, random_bytes=seeded_bytes(3)).protect(
        1, contribution, torch.zeros(10), weight
    )
    assert released[NODE_WEIGHT].max() == pytest.approx(weight / w_max)  # normalised, no noise
    sigma = noise_std(policy, PREDICTIONS)
    values = released[PREDICTIONS].double().numpy()
    share = gaussian_share((m, c), sigma, policy.quorum, _random_bytes=seeded_bytes(3))
    clipped = values - share
    # held rows: clipped to C before re-weighting by ŵ_k; other rows: zero before noise
    assert np.linalg.norm(clipped[held], axis=1).max() * w_max <= weight * (1 + 1e-3)
    assert np.abs(clipped[1::2]).max() < 1e-2 * sigma  # float32 rounding of the noisy values only
    assert np.all(values[1::2] != 0)  # rows the bank does not hold carry its share too
    # 1 000 draws: relative standard error of the std ≈ 2.2 %; 10 % is > 4 of them
    assert float(np.std(values[1::2])) == pytest.approx(sigma / math.sqrt(policy.quorum), rel=0.10)


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext-sum", "secure-sum"])
def test_central_noise_is_added_once_to_the_sum_and_not_to_the_weight_total(secure):
    # 50 000 values: the sample std's relative standard error is 0.3 %, so 2 % is ≈ 6 errors wide, and
    # noise added twice (std √2·σ, 41 % more) could not pass
    policy = weights_policy(noise="central")
    privacy = FederationPrivacy(policy, random_bytes=seeded_bytes(5))
    banks = policy.quorum  # a sum over the fewest banks the policy decrypts
    privacy.setup(
        [f"bank-{k}" for k in range(banks)],
        [10.0] * banks,
        [np.zeros((2, 2))] * banks,
        [np.random.default_rng(0)] * banks,
    )
    contributions = {
        k: privacy.protect(k, 1, {WEIGHTS: weights_term(10.0, torch.zeros(50_000))}, torch.zeros(50_000), 10.0)
        for k in range(banks)
    }
    assert all(float(c[WEIGHTS][:-1].abs().max()) == 0.0 for c in contributions.values())  # no bank-side noise
    summation = SecureSummation(policy) if secure else PlaintextSummation()  # secure: the key authority adds it
    sums = privacy.with_central_noise(summation)(1, contributions)[WEIGHTS].double()
    # Σ ŵ_k gets no DP noise; decrypted, it carries only the error the policy states (CKKS and the flooding)
    assert float(sums[-1]) == pytest.approx(banks, abs=policy.he.unpacked_error() if secure else 1e-12)
    assert float(sums[:-1].std()) == pytest.approx(noise_std(policy, WEIGHTS), rel=0.02)


# --- budget: fail closed ------------------------------------------------------------------------


def test_an_exhausted_budget_stops_that_bank_and_only_that_bank():
    probe = weights_policy()
    budget = planned_ledger(probe, 3).epsilon(1e-5) * 1.0001  # room for exactly three rounds
    policy = weights_policy(epsilon=budget, rounds=3)
    size = 100
    reference = torch.zeros(size)
    fresh = BankPrivacy("bank-0", policy, 10.0, random_bytes=seeded_bytes(1))
    spent = PrivacyLedger("bank-1")
    for release in round_releases(policy, 1):  # bank-1 has already spent one round elsewhere
        spent.record(0, release.channel, release.noise_multiplier, release.sample_rate, release.steps)
    late = BankPrivacy("bank-1", policy, 10.0, random_bytes=seeded_bytes(2), ledger=spent)

    outcomes = {bank.bank: [] for bank in (fresh, late)}
    for round_number in range(1, 6):
        for bank in (fresh, late):
            upload = bank.protect(round_number, {WEIGHTS: weights_term(10.0, torch.ones(size))}, reference, 10.0)
            outcomes[bank.bank].append(upload is not None)
            assert bank.ledger.epsilon(1e-5) <= budget  # never above, not even for a moment
    assert outcomes == {"bank-0": [True, True, True, False, False], "bank-1": [True, True, False, False, False]}
    assert fresh.stopped_round == 4 and late.stopped_round == 3


def test_a_run_ends_with_a_reason_when_fewer_than_the_quorum_remain(dataset):
    probe = weights_policy()
    budget = planned_ledger(probe, 2).epsilon(1e-5) * 1.0001
    policy = weights_policy(epsilon=budget, rounds=2)
    config = build_config({"method": "federated", "federation": {"max_rounds": 5}, "device": "cpu"})
    privacy = FederationPrivacy(policy, random_bytes=seeded_bytes(0))
    result = run_experiment(config, dataset, progress=False, privacy=privacy)
    assert result.rounds_run == 2 and len(result.history) == 2
    assert policy.quorum == 3 and len(privacy.banks) >= policy.quorum  # the first two rounds reached the quorum
    assert "round 3" in result.stopped_reason and "fewer than the quorum 3" in result.stopped_reason
    assert all(bank.stopped_round == 3 for bank in privacy.banks.values())
    for ledger in privacy.ledgers().values():
        assert ledger.epsilon(1e-5) == pytest.approx(planned_ledger(policy, 2).epsilon(1e-5))


def test_under_dp_each_bank_infers_once_per_round_and_a_spent_bank_stops_training(dataset, monkeypatch):
    from fedgl_secure.engine.client import LocalTrainer

    policy = load_policy(POLICIES / "strict-dp.toml")

    class FirstBankSpent(FederationPrivacy):
        def setup_bank(self, client_id, name, normaliser, adjacency, degree_rng, **kwargs):
            if client_id == 0:  # already spent far more than the whole budget elsewhere
                kwargs["ledger"] = planned_ledger(policy, 10 * policy.budget.rounds, bank=name)
            return super().setup_bank(client_id, name, normaliser, adjacency, degree_rng, **kwargs)

    calls = {"train": [], "infer": []}
    original_train, original_infer = LocalTrainer.train, LocalTrainer.infer

    def train(self, *args, **kwargs):
        calls["train"].append(self.client_id)
        return original_train(self, *args, **kwargs)

    def infer(self, adjacency):
        calls["infer"].append(self.client_id)
        return original_infer(self, adjacency)

    monkeypatch.setattr(LocalTrainer, "train", train)
    monkeypatch.setattr(LocalTrainer, "infer", infer)
    config = build_config({"method": "fedgl", "federation": {"max_rounds": 3, "participation": 1.0}, "device": "cpu"})
    privacy = FirstBankSpent(policy, random_bytes=seeded_bytes(3))
    result = run_experiment(config, dataset, progress=False, privacy=privacy)
    banks = len(privacy.banks)
    assert banks >= 3 and result.rounds_run == 3 and result.stopped_reason is None
    assert privacy.banks[0].stopped_round == 1
    assert all(0 not in record.participants for record in result.history)
    assert calls["train"].count(0) == 1  # round 1 only: once refused, it trains no more
    assert all(calls["train"].count(k) == 3 for k in range(1, banks))
    # one inference per trained contribution (the public-W̄ one), not a local one as well
    assert sorted(calls["infer"]) == sorted(calls["train"])


def test_without_dp_the_run_is_the_plain_run(dataset):
    config = build_config({"method": "fedgl", "federation": {"max_rounds": 2}, "device": "cpu"})
    plain = run_experiment(config, dataset, progress=False)
    with_policy = run_experiment(
        config, dataset, progress=False, privacy=FederationPrivacy(load_policy(POLICIES / "baseline.toml"))
    )
    strip = [(r.participants, r.val_accuracy, r.test_accuracy, r.pseudo_labels) for r in plain.history]
    assert strip == [(r.participants, r.val_accuracy, r.test_accuracy, r.pseudo_labels) for r in with_policy.history]


# --- what cannot be honoured is refused ---------------------------------------------------------


def test_without_dp_a_policy_still_normalises_uploads_by_the_public_w_max():
    """Under an HE-only policy the packed ranges assume ŵ_k·X_k (w_k / w_max ≤ 1), as every bank uploads."""
    baseline = load_policy(POLICIES / "baseline.toml")
    w_max, weight = 800.0, 400.0
    contribution = {WEIGHTS: weights_term(weight, torch.full((10,), 2.0)), NODE_WEIGHT: torch.full((5,), weight)}
    released = BankPrivacy("bank-0", baseline, w_max).protect(1, contribution, torch.zeros(10), weight)
    torch.testing.assert_close(released[WEIGHTS], contribution[WEIGHTS] / w_max)
    torch.testing.assert_close(released[NODE_WEIGHT], torch.full((5,), 0.5))


def test_a_kind_without_a_dp_channel_is_refused_under_per_round_dp_and_never_released():
    """GraphFL's meta_gradients (a query-loss gradient) has no DP channel: under strict-dp it must not leave."""
    strict = load_policy(POLICIES / "strict-dp.toml")
    with pytest.raises(ConfigError, match=r"'graphfl' uploads \['meta_gradients'\].*no DP channel"):
        check_upload_kinds(strict, "graphfl", (META_GRADIENTS, WEIGHTS))
    check_upload_kinds(strict, "fedgl", (WEIGHTS, PREDICTIONS, NODE_WEIGHT))  # every kind covered or public
    bank = BankPrivacy("bank-0", strict, 10.0, random_bytes=seeded_bytes(1))
    with pytest.raises(PolicyError, match="'meta_gradients' has no DP channel"):
        bank.protect(1, {META_GRADIENTS: weights_term(5.0, torch.ones(10))}, torch.zeros(10), 5.0)
    # a source-only unit releases nothing per round: the same method runs (everything is post-processing)
    check_upload_kinds(load_policy(POLICIES / "strict-edge-dp.toml"), "graphfl", (META_GRADIENTS, WEIGHTS))


def test_the_pseudo_graph_runs_under_dp_on_uploads_but_is_refused_under_dp_sgd(dataset, monkeypatch):
    from fedgl_secure.engine import round_pipeline

    config = build_config({"method": "fedgl", "federation": {"max_rounds": 2}, "device": "cpu"})
    # DP on uploads: P and H are computed on each bank's own bounded graph, never on the pseudo graph
    used = []
    original = round_pipeline.public_model_outputs

    def spy(trainer, weights, adjacency):
        used.append((trainer, adjacency.values.numel()))
        return original(trainer, weights, adjacency)

    monkeypatch.setattr(round_pipeline, "public_model_outputs", spy)
    broadcasts = []
    strict = FederationPrivacy(load_policy(POLICIES / "strict-dp.toml"))
    result = run_experiment(config, dataset, progress=False, privacy=strict, observer=broadcasts.append)
    assert result.rounds_run == 2 and result.stopped_reason is None
    assert broadcasts[0].pseudo_graph is not None  # round 2 trained on a fused graph
    beta = config.effective_alpha_beta()[1]
    assert len(used) == 2 * len(strict.banks)
    for trainer, edges in used[len(strict.banks) :]:  # round 2
        own = trainer.graph.adjacency(None, 0.0, False).values.numel()
        fused = trainer.graph.adjacency(broadcasts[0].pseudo_graph, beta, False).values.numel()
        assert edges == own < fused
    sgd_only = policy_from_dict(
        {
            **HE_ONLY,
            "dp": {
                "sgd": {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "local_epochs": 10},
                "graph": {"max_degree": 5},
            },
            "budget": {"epsilon": 8.0, "rounds": 10},
        }
    )
    with pytest.raises(ConfigError, match=r"trains on the pseudo graph .* DP-SGD's sensitivity"):
        run_experiment(config, dataset, progress=False, privacy=FederationPrivacy(sgd_only))


# --- the run directory --------------------------------------------------------------------------


def test_strict_dp_secure_run_writes_a_complete_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    args = ["simulate", "--secure", "--policy", str(POLICIES / "strict-dp.toml"), "--method", "fedgl-no-gpg"]
    args += ["--rounds", "2", "--no-progress", "--device", "cpu", "--run-dir", str(run_dir)]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    assert json.loads(outcome.output.strip().splitlines()[-1])["run_dir"] == str(run_dir)

    loaded = load_run_dir(run_dir)
    policy = load_policy(run_dir / "policy.toml")
    assert loaded.secure and loaded.run["result"]["rounds_run"] == 2
    assert len(loaded.ledgers) == 6 and set(loaded.bank_keys) == set(loaded.ledgers)
    planned = planned_ledger(policy, 2).epsilon(policy.budget.delta)
    for ledger in loaded.ledgers.values():
        assert ledger.epsilon(policy.budget.delta) == pytest.approx(planned)
    assert loaded.model["weights"].ndim == 1 and "pseudo_labels" in loaded.model
    # 2 rounds × 6 banks × (weights, predictions, node_weight), each signed by its bank
    assert len(loaded.receipts) == 2 * 6 * 3
    for receipt in loaded.receipts:
        verify_receipt(load_public_key(bytes.fromhex(loaded.bank_keys[receipt.sender])), receipt)
    chain = verify_audit_chain(loaded.key_authority_dir / "audit.jsonl", loaded.audit_head)
    assert chain.head == loaded.audit_head

    (run_dir / "privacy" / "bank-3.ledger.json").unlink()
    with pytest.raises(RunDirectoryError, match="bank-3.ledger.json: missing"):
        load_run_dir(run_dir)
    (run_dir / "receipts.jsonl").write_text("{not json\n")
    (run_dir / "privacy" / "bank-3.ledger.json").write_text(loaded.ledgers["bank-3"].to_json())
    with pytest.raises(RunDirectoryError, match="receipts.jsonl: line 1"):
        load_run_dir(run_dir)
