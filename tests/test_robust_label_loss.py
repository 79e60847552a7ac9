"""Losses robust to wrong released labels under the label unit (``[dp.labels] correction``, docs/privacy.md §6.10).

Generalised cross-entropy (Zhang & Sabuncu, NeurIPS 2018, Eq. 6) and bootstrapping (Reed et al., ICLR 2015
workshop) on hand examples; the policy field's validation; a small federation that trains with them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from benchmark_scripts import load_benchmark

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import PolicyError
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.label_dp import (
    RobustLabelTraining,
    generalized_cross_entropy,
    hard_bootstrapping_loss,
    robust_label_loss,
    soft_bootstrapping_loss,
)
from fedgl_secure.simulation.experiment import run_experiment

LOGITS = torch.tensor([[2.0, 0.5, -1.0], [0.1, 1.5, 0.3], [-0.4, 0.2, 2.5]])
LABELS = torch.tensor([0, 2, 2])


def gradient(loss_fn, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = logits.clone().requires_grad_(True)
    loss_fn(logits, labels).backward()
    return logits.grad


def test_gce_tends_to_cross_entropy_as_q_goes_to_zero_and_is_half_the_mae_at_q_one():
    cross_entropy = float(F.cross_entropy(LOGITS, LABELS))
    assert float(generalized_cross_entropy(LOGITS, LABELS, 1e-6)) == pytest.approx(cross_entropy, rel=1e-5)
    assert abs(float(generalized_cross_entropy(LOGITS, LABELS, 0.1)) - cross_entropy) > 1e-3  # not CE itself
    probabilities = torch.softmax(LOGITS, dim=1)
    mae = (F.one_hot(LABELS, 3) - probabilities).abs().sum(dim=1).mean()
    assert float(generalized_cross_entropy(LOGITS, LABELS, 1.0)) == pytest.approx(float(mae) / 2, rel=1e-6)
    # Eq. 6 directly, q = 0.7
    p_y = probabilities[torch.arange(3), LABELS]
    assert float(generalized_cross_entropy(LOGITS, LABELS, 0.7)) == pytest.approx(float(((1 - p_y**0.7) / 0.7).mean()))


def test_gce_gradient_is_cross_entropys_scaled_by_p_y_to_the_q():
    """Zhang & Sabuncu Eq. 7 on a hand example: ∂L_q/∂z = p_y^q · ∂CE/∂z, node by node."""
    q = 0.7
    p_y = torch.softmax(LOGITS, dim=1)[torch.arange(3), LABELS]
    expected = gradient(F.cross_entropy, LOGITS, LABELS) * (p_y**q).unsqueeze(1)
    torch.testing.assert_close(gradient(lambda z, y: generalized_cross_entropy(z, y, q), LOGITS, LABELS), expected)
    # one node, logits (0, 0): p = 1/2 each; CE's gradient (p − e_y) = (−1/2, 1/2), times (1/2)^q
    hand = gradient(lambda z, y: generalized_cross_entropy(z, y, q), torch.zeros(1, 2), torch.tensor([0]))
    torch.testing.assert_close(hand, torch.tensor([[-0.5, 0.5]]) * 0.5**q)


def label_weight(loss_fn) -> float:
    """How hard a label the model contradicts pulls, relative to one it agrees with (gradient norms)."""
    logits = torch.tensor([[3.0, 0.0, 0.0], [3.0, 0.0, 0.0]])  # the model says class 0 for both nodes
    grad = gradient(loss_fn, logits, torch.tensor([0, 1]))  # node 0 labelled 0 (agrees), node 1 labelled 1
    return float(grad[1].norm() / grad[0].norm())


@pytest.mark.parametrize(
    "loss",
    [
        lambda z, y: generalized_cross_entropy(z, y, 0.7),
        lambda z, y: generalized_cross_entropy(z, y, 0.4),
        lambda z, y: soft_bootstrapping_loss(z, y, 0.8),
        lambda z, y: hard_bootstrapping_loss(z, y, 0.8),
    ],
)
def test_a_label_the_model_contradicts_pulls_less_than_under_cross_entropy(loss):
    assert label_weight(loss) < 0.9 * label_weight(F.cross_entropy)


def test_soft_bootstrapping_is_beta_cross_entropy_plus_entropy_and_cross_entropy_at_beta_one():
    log_p = torch.log_softmax(LOGITS, dim=1)
    entropy = -(log_p.exp() * log_p).sum(dim=1).mean()
    cross_entropy = F.cross_entropy(LOGITS, LABELS)
    assert float(soft_bootstrapping_loss(LOGITS, LABELS, 0.8)) == pytest.approx(
        float(0.8 * cross_entropy + 0.2 * entropy)
    )
    assert float(soft_bootstrapping_loss(LOGITS, LABELS, 1.0)) == pytest.approx(float(cross_entropy))
    # the prediction in the target is not detached (Reed et al.: minimum-entropy regularisation)
    torch.testing.assert_close(
        gradient(lambda z, y: soft_bootstrapping_loss(z, y, 0.8), LOGITS, LABELS),
        gradient(lambda z, y: 0.8 * F.cross_entropy(z, y) + 0.2 * _entropy(z), LOGITS, LABELS),
    )


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits, dim=1)
    return -(log_p.exp() * log_p).sum(dim=1).mean()


def test_hard_bootstrapping_targets_the_models_own_class_for_one_minus_beta():
    # node 1 is labelled 2 but the model's arg-max is 1: β·CE(2) + (1 − β)·CE(1); nodes 0 and 2 agree: CE
    log_p = torch.log_softmax(LOGITS, dim=1)
    expected = -(log_p[0, 0] + 0.8 * log_p[1, 2] + 0.2 * log_p[1, 1] + log_p[2, 2]) / 3
    assert float(hard_bootstrapping_loss(LOGITS, LABELS, 0.8)) == pytest.approx(float(expected))
    assert float(hard_bootstrapping_loss(LOGITS, LABELS, 1.0)) == pytest.approx(float(F.cross_entropy(LOGITS, LABELS)))
    # agreeing labels: exactly CE's gradient; no gradient flows through the arg-max itself
    agree = torch.tensor([0, 1, 2])
    torch.testing.assert_close(
        gradient(lambda z, y: hard_bootstrapping_loss(z, y, 0.8), LOGITS, agree),
        gradient(F.cross_entropy, LOGITS, agree),
    )


def test_the_losses_refuse_parameters_outside_their_range():
    with pytest.raises(ValueError, match="q in"):
        generalized_cross_entropy(LOGITS, LABELS, 0.0)
    with pytest.raises(ValueError, match="beta in"):
        soft_bootstrapping_loss(LOGITS, LABELS, 1.5)
    with pytest.raises(ValueError, match="no robust label loss"):
        robust_label_loss("forward", 0.7, 0.8)


# --- the policy field ---------------------------------------------------------------------------------


def label_policy(**labels) -> dict:
    settings = {"mechanism": "randomized-response", "epsilon": 2.0, **labels}
    return {"protection": "he", "dp": {"unit": "label", "labels": settings}, "budget": {"epsilon": 2.0, "rounds": 50}}


def test_the_policy_names_the_field_of_a_wrong_correction_or_parameter():
    with pytest.raises(PolicyError, match=r"dp\.labels\.correction"):
        policy_from_dict(label_policy(correction="lq"))
    with pytest.raises(PolicyError, match=r"dp\.labels\.gce_q: read only with correction = 'gce'"):
        policy_from_dict(label_policy(correction="bootstrap-soft", gce_q=0.5))
    with pytest.raises(PolicyError, match=r"dp\.labels\.bootstrap_beta: read only"):
        policy_from_dict(label_policy(bootstrap_beta=0.5))
    with pytest.raises(PolicyError, match=r"dp\.labels\.gce_q"):
        policy_from_dict(label_policy(correction="gce", gce_q=1.5))
    labels = policy_from_dict(label_policy(correction="gce")).dp.labels
    assert (labels.effective_gce_q, labels.effective_bootstrap_beta) == (0.7, 0.8)  # the papers' defaults


# --- in a federation ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)


def final_weights(
    small, labels: dict, method: str = "fedgl", class_weighting: str = "none"
) -> tuple[torch.Tensor, FederationPrivacy]:
    """The last broadcast W̄ of a 2-round run whose labels are released with one seeded byte source (tests only)."""
    privacy = FederationPrivacy(policy_from_dict(label_policy(**labels)), random_bytes=np.random.default_rng(5).bytes)
    config = build_config(
        {
            "method": method,
            "device": "cpu",
            "training": {"local_epochs": 2, "class_weighting": class_weighting},
            "federation": {"max_rounds": 2, "proportions": [0.6, 0.7, 0.5]},  # three banks: the default quorum
        }
    )
    seen: list = []
    run_experiment(config, small, progress=False, privacy=privacy, observer=seen.append)
    return seen[-1].weights, privacy


@pytest.mark.parametrize("class_weighting", ["none", "balanced"])
def test_a_federation_trains_the_released_labels_with_the_chosen_loss_and_pays_epsilon_once(small, class_weighting):
    plain, _ = final_weights(small, {}, class_weighting=class_weighting)
    # hard bootstrapping at β = 1 is cross-entropy: the hook's path (pseudo-label term included, and the class
    # weights of training.class_weighting = "balanced" in both terms) is the plain one
    same, privacy = final_weights(
        small, {"correction": "bootstrap-hard", "bootstrap_beta": 1.0}, class_weighting=class_weighting
    )
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-6)
    trainer = SimpleNamespace(private_training=None)  # what the simulation and a bank service hand it
    privacy.attach_training(0, trainer)
    hook = trainer.private_training
    assert isinstance(hook, RobustLabelTraining)
    assert hook.loss.func is hard_bootstrapping_loss and hook.loss.keywords == {"beta": 1.0}
    gce, privacy = final_weights(small, {"correction": "gce"}, class_weighting=class_weighting)
    assert not torch.allclose(gce, plain, atol=1e-4)  # another loss, the same released labels
    assert all(len(ledger.releases) == 1 for ledger in privacy.ledgers().values())


def test_fgcl_trains_its_views_with_the_chosen_label_loss(small):
    plain, _ = final_weights(small, {}, method="fgcl")
    # hard bootstrapping at β = 1 is cross-entropy: FGCL's supervised term on both views takes the hook's path
    same, _ = final_weights(small, {"correction": "bootstrap-hard", "bootstrap_beta": 1.0}, method="fgcl")
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-6)
    soft, _ = final_weights(small, {"correction": "bootstrap-soft"}, method="fgcl")  # β = 0.8 by default
    assert torch.isfinite(soft).all()
    assert (soft - plain).abs().max() > 1e-4  # the loss reached FGCL's training


def test_the_benchmarks_seeded_release_is_the_same_for_a_seed_and_differs_between_seeds():
    module = load_benchmark("privacy_utility")
    first, again, other = (module.seeded_release_bytes(s)(64) for s in (3, 3, 4))
    assert first == again and first != other


def test_class_weights_make_every_loss_a_weighted_mean_over_the_nodes():
    # training.class_weighting = "balanced": each node weighs as its label's class, as F.cross_entropy(weight=...)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, -0.5]])
    labels = torch.tensor([0, 1, 1, 0])
    class_weights = torch.tensor([3.0, 0.5])
    weights = class_weights[labels]
    ce = F.cross_entropy(logits, labels, weight=class_weights)
    torch.testing.assert_close(hard_bootstrapping_loss(logits, labels, 1.0, weights=weights), ce)
    torch.testing.assert_close(soft_bootstrapping_loss(logits, labels, 1.0, weights=weights), ce)
    p_y = torch.softmax(logits, dim=1)[torch.arange(4), labels]
    expected = (weights * (1 - p_y**0.5) / 0.5).sum() / weights.sum()
    torch.testing.assert_close(generalized_cross_entropy(logits, labels, 0.5, weights=weights), expected)
    assert not torch.allclose(generalized_cross_entropy(logits, labels, 0.5), expected)  # the weights matter
