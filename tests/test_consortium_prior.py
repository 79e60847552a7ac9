"""The consortium-wide prior of the multi-stage label release (``[dp.labels] prior = "consortium-sgc"``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.aggregation import PlaintextSummation, plaintext_sum
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy import consortium_prior, label_release
from fedgl_secure.privacy.accounting import LABELS, WEIGHTS
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.simulation.experiment import run_experiment


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


def consortium_policy(epsilon: float = 2.0, **labels) -> dict:
    settings = {"mechanism": "rr-with-prior", "prior": "consortium-sgc", "stage_order": "validation-first"}
    return {
        "protection": "he",
        "dp": {"unit": "label", "labels": {**settings, "epsilon": epsilon, **labels}},
        "budget": {"epsilon": epsilon, "rounds": 50},
    }


def planted_banks(banks: int = 3, nodes: int = 150, classes: int = 4):
    """Small homophilous banks whose features are noisy class indicators; a quarter training, a quarter validation."""
    result = []
    for seed in range(banks):
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, classes, nodes)
        same = labels[:, None] == labels[None, :]
        upper = np.triu(rng.random((nodes, nodes)) < np.where(same, 0.06, 0.004), k=1)
        features = np.eye(classes)[labels] * 0.6 + rng.random((nodes, classes))
        train, val = np.zeros(nodes, dtype=bool), np.zeros(nodes, dtype=bool)
        train[: nodes // 4], val[nodes // 4 : nodes // 2] = True, True
        propagated = label_release.propagated_features(sp.csr_matrix(upper | upper.T, dtype=float), features)
        result.append(consortium_prior.BankLabels(labels, train, val, propagated, seeded_bytes(10 + seed)))
    return result


class RecordingSummation(PlaintextSummation):
    """The plaintext summation, keeping every round's sums (the consortium prior is a function of them)."""

    def __init__(self) -> None:
        self.sums: list[torch.Tensor] = []

    def __call__(self, round_number, contributions, reference=None):
        sums = super().__call__(round_number, contributions, reference)
        self.sums.append(sums[WEIGHTS].clone())
        return sums


def test_a_banks_stage_two_labels_never_reach_the_consortium_prior():
    banks = planted_banks()
    before, after = RecordingSummation(), RecordingSummation()
    released = consortium_prior.consortium_release(banks, 4, 2.0, 2, "validation-first", before, 150.0, rounds=3)
    # bank 1's training labels (its stage 2 under validation-first) all change; the byte sources restart
    changed = [bank._replace(random_bytes=seeded_bytes(10 + k)) for k, bank in enumerate(planted_banks())]
    labels = changed[1].labels.copy()
    labels[changed[1].train_mask] = (labels[changed[1].train_mask] + 1) % 4
    changed[1] = changed[1]._replace(labels=labels)
    released_after = consortium_prior.consortium_release(changed, 4, 2.0, 2, "validation-first", after, 150.0, rounds=3)
    assert len(before.sums) == 3
    for first, second in zip(before.sums, after.sums, strict=True):
        assert torch.equal(first, second)  # every upload of the prior's FedAvg, hence the prior, is unchanged
    # … while the stage-2 release itself does read the changed labels
    train = banks[1].train_mask
    assert not np.array_equal(released[1].labels[train], released_after[1].labels[train])
    assert np.array_equal(released[0].labels, released_after[0].labels)


def test_the_pooled_prior_learns_from_every_banks_stage_one_release():
    banks = planted_banks()
    releases = [
        label_release.StagedRelease(b.labels, b.train_mask, b.val_mask, 4, 2.0, 2, "validation-first") for b in banks
    ]
    parameters = consortium_prior.fit_consortium_prior(
        [b.propagated for b in banks],
        [r.likelihood for r in releases],
        [r.known(1) for r in releases],
        4,
        PlaintextSummation(),
        150.0,
    )
    for bank in banks:  # the prior is far better than chance on training labels it never saw
        logits = consortium_prior.softmax_regression(parameters, torch.as_tensor(bank.propagated).float(), 4)
        right = (logits.argmax(1).numpy() == bank.labels)[bank.train_mask].mean()
        assert right > 0.6


class CheckedSummation:
    """A summation that also keeps, for every round, the exact float64 sum of the very contributions it was given:
    each decrypted sum can then be compared with what it should be, round by round."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.rounds: list[tuple[torch.Tensor, torch.Tensor]] = []  # (summed by ``inner``, exact)

    def __call__(self, round_number, contributions, reference=None):
        sums = self.inner(round_number, contributions, reference=reference)
        exact = plaintext_sum([contributions[k] for k in sorted(contributions)])
        self.rounds.append((sums[WEIGHTS].double(), exact[WEIGHTS].double()))
        return sums


def test_the_secure_summation_fits_the_plaintext_prior():
    """Round by round, not end to end: round 2 starts from round 1's decrypted θ̄, so its uploads (10 Adam steps
    from there) already differ from the plaintext run's by the flooding noise of round 1; comparing only the final
    θ̄ of the two runs measured that chain (≤ 4.4e-5 in 100 fits, once 2e-4 in the suite), not the summation."""
    from fedgl_secure.crypto.secure_summation import SecureSummation

    banks = planted_banks()
    inputs = (
        [b.propagated for b in banks],
        [label_release.StagedRelease(b.labels, b.train_mask, b.val_mask, 4, 2.0, 2).likelihood for b in banks],
        [b.val_mask for b in banks],
        4,
    )
    plain = CheckedSummation(PlaintextSummation())
    consortium_prior.fit_consortium_prior(*inputs, plain, 150.0, rounds=2)
    values = {**consortium_policy(), "he": {"packing": "none"}}  # as policies/label-dp.toml: one float per slot
    summation = SecureSummation(policy_from_dict(values), encrypt_workers=1)
    secure = CheckedSummation(summation)
    try:
        encrypted = consortium_prior.fit_consortium_prior(*inputs, secure, 150.0, rounds=2)
        assert len(summation.accepted_receipts) == 2 * len(banks)  # every bank's weights went through the CKKS sum
    finally:
        summation.close()
    assert len(secure.rounds) == 2
    # round 1 starts from zero in both runs: the very same uploads
    assert torch.equal(secure.rounds[0][1], plain.rounds[0][1])
    for decrypted, exact in secure.rounds:  # every decrypted sum is the sum of that round's uploads
        assert float((decrypted - exact).abs().max()) <= 1e-4
    # and the prior is Eq. 10's average of the last round's exact sum, up to that sum's decryption noise
    assert torch.allclose(encrypted, consortium_prior.prior_average(secure.rounds[-1][1], encrypted), atol=1e-4)


def test_at_temperature_sharpens_a_prior_and_keeps_its_order():
    priors = np.random.default_rng(0).dirichlet(np.ones(5), size=20)
    assert label_release.at_temperature(priors, 1.0) is priors
    sharp = label_release.at_temperature(priors, 0.5)
    assert np.allclose(sharp.sum(axis=1), 1.0)
    assert np.array_equal(sharp.argsort(axis=1), priors.argsort(axis=1))
    assert (sharp.max(axis=1) > priors.max(axis=1)).all()
    assert np.allclose(sharp, priors**2 / (priors**2).sum(axis=1, keepdims=True))


def test_a_consortium_prior_run_records_one_epsilon_per_bank_and_trains_on_the_release():
    small = synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)
    policy = policy_from_dict(consortium_policy(2.0, prior_temperature=0.5))
    privacy = FederationPrivacy(policy, random_bytes=seeded_bytes(0))
    config = build_config(
        {
            "method": "fedgl",
            "device": "cpu",
            "training": {"local_epochs": 2},
            "federation": {"max_rounds": 2, "proportions": [0.6, 0.7, 0.5]},  # three banks: the default quorum
        }
    )
    result = run_experiment(config, small, progress=False, privacy=privacy)
    assert result.rounds_run == 2 and result.stopped_reason is None
    for ledger in privacy.ledgers().values():
        assert [(r.channel, r.epsilon) for r in ledger.releases] == [(LABELS, 2.0)]
    assert all(bank.label_likelihood is not None for bank in privacy.banks.values())
    text = " ".join(effective_guarantees(policy).assumptions)
    assert "all banks fit together" in text and "temperature 0.5" in text


def test_a_single_bank_cannot_fit_the_consortium_prior_alone():
    banks = planted_banks(1)
    with pytest.raises(ValueError, match="all banks together"):
        label_release.multi_stage_release(
            banks[0].labels, banks[0].train_mask, banks[0].val_mask, sp.eye(150), 4, 2.0, 2, prior="consortium-sgc"
        )


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"prior_temperature": 0.0}, "prior_temperature"),
        ({"prior": "consortium-gcn"}, "prior"),
        ({"mechanism": "randomized-response", "prior": None, "stage_order": None, "prior_temperature": 0.5}, None),
    ],
)
def test_the_policy_names_the_field_it_refuses(labels, field):
    values = consortium_policy()
    values["dp"]["labels"] = {k: v for k, v in {**values["dp"]["labels"], **labels}.items() if v is not None}
    with pytest.raises(PolicyError, match=f"dp.labels.{field or 'prior_temperature'}"):
        policy_from_dict(values, source="test")
