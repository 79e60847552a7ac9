"""FGCL (methods/fgcl.py): InfoNCE against hand-computed values, the views, and a few federated rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import WEIGHTS
from fedgl_secure.methods.fgcl import FGCL, FedGLContrastive, info_nce, perturbed_view, released_adjacency
from fedgl_secure.model.adjacency import gcn_normalize
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.simulation.experiment import run_experiment


def test_info_nce_in_batch_matches_a_hand_computed_example():
    # cosine similarities: matching rows 1, others 0 (the scale of a row does not matter)
    anchors = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    positives = torch.tensor([[1.0, 0.0], [0.0, 0.5]])
    # τ = 1: each row's loss is -log(e^1 / (e^1 + e^0)) = log(1 + e^-1)
    assert float(info_nce(anchors, positives, 1.0)) == pytest.approx(math.log(1 + math.exp(-1)))
    # τ = 0.5: logits 2 and 0
    assert float(info_nce(anchors, positives, 0.5)) == pytest.approx(math.log(1 + math.exp(-2)))


def test_info_nce_with_a_queue_uses_the_positive_against_the_queued_negatives():
    anchors = torch.tensor([[1.0, 0.0]])
    positives = torch.tensor([[1.0, 1.0]])  # cosine 1/√2
    negatives = torch.tensor([[-1.0, 0.0], [0.0, 1.0]])  # cosines -1 and 0
    s = 1 / math.sqrt(2)
    expected = -math.log(math.exp(s / 0.5) / (math.exp(s / 0.5) + math.exp(-1 / 0.5) + math.exp(0.0)))
    assert float(info_nce(anchors, positives, 0.5, negatives=negatives)) == pytest.approx(expected)


def test_info_nce_falls_as_the_two_views_agree():
    rng = torch.Generator().manual_seed(0)
    z = torch.randn(32, 8, generator=rng)
    close = info_nce(z, z + 0.01 * torch.randn(32, 8, generator=rng), 0.5)
    far = info_nce(z, torch.randn(32, 8, generator=rng), 0.5)
    assert float(close) < float(far)


def test_views_are_perturbed_differently_and_stay_symmetric():
    rng = np.random.default_rng(0)
    upper = sp.triu(sp.random(80, 80, 0.08, random_state=rng, data_rvs=np.ones), k=1)
    adjacency = ((upper + upper.T) > 0).astype(np.float64)
    stream = np.random.default_rng(1)
    first = perturbed_view(adjacency, "laplace", 1.0, stream)
    second = perturbed_view(adjacency, "laplace", 1.0, stream)
    assert abs(first - first.T).max() == 0 and (first != second).nnz > 0
    flipped = perturbed_view(adjacency, "randomized-response", 2.0, stream)
    assert abs(flipped - flipped.T).max() == 0 and (flipped != adjacency).nnz > 0


def test_views_keep_the_weights_of_the_graph_the_bank_trains_on():
    rng = np.random.default_rng(2)
    upper = sp.triu(sp.random(60, 60, 0.1, random_state=rng), k=1)
    weighted = sp.csr_matrix((upper + upper.T) * 0.01)  # e.g. a posterior-weighted edge-DP release
    recovered = released_adjacency(gcn_normalize(weighted))
    assert abs(recovered - weighted).max() < 1e-12  # Â inverts exactly
    view = perturbed_view(weighted, "laplace", 4.0, np.random.default_rng(3))
    assert view.max() < 0.1  # multiplicative noise: the 0.01 scale survives (additive Lap(1/4) would not)
    assert ((view != 0).astype(int) - (view != 0).multiply(weighted != 0)).nnz == 0


@pytest.fixture(scope="module")
def small():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=60, num_test=100)


def config(**values):
    return build_config(
        {
            "device": "cpu",
            "training": {"local_epochs": 2},
            "federation": {"max_rounds": 2, "proportions": [0.6, 0.7, 0.5]},  # three banks: the default quorum
            **values,
        }
    )


@pytest.mark.parametrize(
    "values",
    [
        {"method": "fgcl"},
        {"method": "fgcl", "fgcl": {"negatives": "queue", "queue_size": 48, "batch_size": 16}},
        {"method": "fedgl", "fgcl": {"enabled": True}},
    ],
)
def test_fgcl_runs_federated_rounds_and_is_reproducible(small, values):
    method = build_method(config(**values))
    assert isinstance(method, FGCL if values["method"] == "fgcl" else FedGLContrastive)
    if values["method"] == "fgcl":
        assert method.upload_kinds == (WEIGHTS,)
    seen: list = []
    first = run_experiment(config(**values), small, progress=False, observer=seen.append)
    again: list = []
    run_experiment(config(**values), small, progress=False, observer=again.append)
    assert first.rounds_run == 2 and 0.0 <= first.global_test_accuracy <= 1.0
    assert torch.equal(seen[-1].weights, again[-1].weights)  # seeded views and batches: the same run twice
    plain: list = []
    run_experiment(
        config(method="federated" if values["method"] == "fgcl" else "fedgl"),
        small,
        progress=False,
        observer=plain.append,
    )
    assert not torch.equal(seen[-1].weights, plain[-1].weights)  # the contrastive term changed training


def test_fgcl_trains_on_the_edge_dp_graph_and_refuses_dp_sgd(small):
    privacy = FederationPrivacy(
        load_policy("policies/strict-edge-dp.toml"), random_bytes=np.random.default_rng(0).bytes
    )
    result = run_experiment(config(method="fgcl"), small, progress=False, privacy=privacy)
    assert result.rounds_run == 2
    assert all(ledger.epsilon(1e-5) == 8.0 for ledger in privacy.ledgers().values())
    sgd = FederationPrivacy(load_policy("policies/strict-dp-sgd.toml"), random_bytes=np.random.default_rng(0).bytes)
    with pytest.raises(ConfigError, match="fgcl: DP-SGD"):
        run_experiment(config(method="fgcl", training={"local_epochs": 2}), small, progress=False, privacy=sgd)
