"""End-to-end runs on the synthetic consortium: methods, determinism, per-client streams."""

from __future__ import annotations

import pytest
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.round_pipeline import initial_parameters
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import EMBEDDINGS, NODE_WEIGHT, PREDICTIONS, WEIGHTS, Broadcast
from fedgl_secure.simulation.experiment import Federation, run_experiment


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0)


def _config(method="fedgl", rounds=4, **sections):
    values = {"method": method, "seed": 0, "device": "cpu", "federation": {"max_rounds": rounds}}
    for section, overrides in sections.items():
        values.setdefault(section, {}).update(overrides)
    return build_config(values)


def test_fedgl_end_to_end_learns_and_records_everything(dataset):
    result = run_experiment(
        _config("fedgl", rounds=6, self_supervision={"similarity": "cosine"}), dataset, progress=False
    )
    assert result.rounds_run == 6 and 1 <= result.best_round <= 6
    assert result.num_clients == 6 and result.num_global_nodes <= dataset.num_nodes
    assert result.global_test_accuracy > 0.5  # 4 classes: chance is 0.25
    assert len(result.local_test_accuracy) == 6
    assert all(0.0 <= a <= 1.0 for a in result.local_test_accuracy)
    last = result.history[-1]
    assert last.pseudo_labels > 0 and last.pseudo_label_accuracy > 0.5
    assert last.pseudo_graph_edges > 0 and last.pseudo_graph_homophily > 0.4
    assert result.config["self_supervision"]["similarity"] == "cosine"


def test_same_seed_same_run_and_other_seed_differs(dataset):
    first = run_experiment(_config("fedgl", rounds=3), dataset, progress=False)
    second = run_experiment(_config("fedgl", rounds=3), dataset, progress=False)
    assert [h.val_accuracy for h in first.history] == [h.val_accuracy for h in second.history]
    assert first.global_test_accuracy == second.global_test_accuracy
    other = run_experiment(
        build_config({**_config("fedgl", rounds=3).model_dump(), "seed": 1}), dataset, progress=False
    )
    assert [h.val_accuracy for h in other.history] != [h.val_accuracy for h in first.history]


def test_each_client_owns_its_random_stream(dataset):
    """A client's upload depends on (seed, client id, broadcast) only — not on who ran before it.

    This is what lets a multi-process consortium reproduce an in-process simulation exactly."""
    config = _config("fedgl")
    federation = Federation.build(dataset, config, torch.device("cpu"))
    method = build_method(config)
    start = Broadcast(0, initial_parameters(config, dataset.num_features, dataset.num_classes))

    def uploads(order):
        trainers = {k: LocalTrainer(k, federation.client_graphs[k], config.training, config.seed) for k in order}
        return {k: method.client_contribution(trainers[k], start) for k in order}

    forward = uploads([0, 1, 2, 3, 4, 5])
    backward = uploads([5, 3, 4, 1, 2, 0])
    for k in range(6):
        for kind in forward[k]:
            assert torch.equal(forward[k][kind], backward[k][kind]), (k, kind)


@pytest.mark.parametrize(
    ("method", "kinds"),
    [
        ("federated", {WEIGHTS}),
        ("fedgl-no-gpg", {WEIGHTS, PREDICTIONS, NODE_WEIGHT}),
        ("fedgl-no-gpl", {WEIGHTS, EMBEDDINGS, NODE_WEIGHT}),
        ("fedgl", {WEIGHTS, PREDICTIONS, EMBEDDINGS, NODE_WEIGHT}),
    ],
)
def test_methods_upload_only_what_they_use(dataset, method, kinds):
    config = _config(method)
    federation = Federation.build(dataset, config, torch.device("cpu"))
    fed_method = build_method(config)
    assert set(fed_method.upload_kinds) == kinds
    trainer = LocalTrainer(0, federation.client_graphs[0], config.training, config.seed)
    start = Broadcast(0, initial_parameters(config, dataset.num_features, dataset.num_classes))
    contribution = fed_method.client_contribution(trainer, start)
    assert set(contribution) == kinds
    m = federation.index.size
    if PREDICTIONS in contribution:
        assert contribution[PREDICTIONS].shape == (m, dataset.num_classes)
        # rows of nodes the client does not hold are exactly zero
        held = torch.zeros(m, dtype=torch.bool)
        held[torch.as_tensor(trainer.graph.positions)] = True
        assert torch.all(contribution[PREDICTIONS][~held] == 0)
        torch.testing.assert_close(
            contribution[PREDICTIONS][held].sum(1), torch.full((int(held.sum()),), float(trainer.num_nodes))
        )


@pytest.mark.parametrize(
    ("method", "self_supervision"),
    [
        ("federated", {}),
        ("fedgl", {}),
        ("fedgl", {"embedding": "hidden"}),
        ("fedgl-no-gpg", {}),
        ("fedgl-no-gpl", {"embedding": "hidden"}),
    ],
)
def test_upload_shapes_are_what_clients_send(dataset, method, self_supervision):
    """``upload_shapes`` (what a receiver will accept) equals the shapes of a real contribution."""
    config = _config(method, training={"hidden": 8}, self_supervision=self_supervision)
    federation = Federation.build(dataset, config, torch.device("cpu"))
    fed_method = build_method(config)
    start = Broadcast(0, initial_parameters(config, dataset.num_features, dataset.num_classes))
    trainer = LocalTrainer(2, federation.client_graphs[2], config.training, config.seed)
    contribution = fed_method.client_contribution(trainer, start)
    shapes = fed_method.upload_shapes(start.weights.numel(), federation.index.size, dataset.num_classes)
    assert shapes == {kind: tuple(tensor.shape) for kind, tensor in contribution.items()}
    assert shapes[WEIGHTS] == (start.weights.numel() + 1,)
    if EMBEDDINGS in shapes:
        expected_dim = 8 if self_supervision.get("embedding") == "hidden" else dataset.num_classes
        assert shapes[EMBEDDINGS] == (federation.index.size, expected_dim)
    # the weights upload carries w_k = N_k as its last entry
    assert float(contribution[WEIGHTS][-1]) == float(trainer.num_nodes)


def test_federated_round_one_equals_fedavg_of_client_models(dataset):
    config = _config("federated", rounds=1)
    federation = Federation.build(dataset, config, torch.device("cpu"))
    method = build_method(config)
    start = Broadcast(0, initial_parameters(config, dataset.num_features, dataset.num_classes))
    trainers = [LocalTrainer(k, g, config.training, config.seed) for k, g in enumerate(federation.client_graphs)]
    params, sizes = [], []
    for trainer in trainers:
        trainer.train(trainer.graph.adjacency(None, 0.0, False), start.weights)
        params.append(trainer.model.flat_parameters().double())
        sizes.append(trainer.num_nodes)
    expected = sum(n * p for n, p in zip(sizes, params, strict=True)) / sum(sizes)
    fresh = [LocalTrainer(k, g, config.training, config.seed) for k, g in enumerate(federation.client_graphs)]
    from fedgl_secure.engine.aggregation import plaintext_sum

    broadcast = method.server_update(plaintext_sum([method.client_contribution(t, start) for t in fresh]), 1)
    torch.testing.assert_close(broadcast.weights.double(), expected, atol=1e-5, rtol=0)


def test_partial_participation_and_early_stopping(dataset):
    result = run_experiment(
        _config("federated", rounds=200, federation={"participation": 0.5, "patience": 3}),
        dataset,
        progress=False,
    )
    assert all(len(h.participants) == 3 for h in result.history)
    assert result.rounds_run == result.best_round + 3 < 200


@pytest.mark.parametrize("method", ["centralized", "local", "fedgl-no-gpg", "fedgl-no-gpl"])
def test_baselines_and_ablations_run(dataset, method):
    result = run_experiment(_config(method, rounds=3), dataset, progress=False)
    assert result.method == method and result.rounds_run == 3
    assert result.global_test_accuracy > 0.3
    assert len(result.local_test_accuracy) == 6


def test_fedprox_and_paper_fusion_options_run(dataset):
    result = run_experiment(
        _config(
            "fedgl",
            rounds=2,
            federation={"aggregation": "fedprox", "fedprox_mu": 0.1},
            self_supervision={"fusion": "paper", "embedding": "hidden", "renormalize_fused": True},
        ),
        dataset,
        progress=False,
    )
    assert result.rounds_run == 2
