"""Self-training before federated training (engine/self_training.py): which nodes a client pseudo-labels, with
which labels, and how FedAvg and GraphFL train on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graphfl_split import graphfl_clients
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import initial_parameters
from fedgl_secure.engine.self_training import (
    candidate_nodes,
    local_class_probabilities,
    most_confident_per_class,
    self_trained_graphs,
    with_pseudo_labels,
)
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.graphfl import GraphFL
from fedgl_secure.simulation.experiment import run_experiment


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=80, num_test=100)


@pytest.fixture(scope="module")
def clients(dataset):
    return graphfl_clients(dataset, 6, 10, seed=0, test_size=100, val_size=50)


def _tensors(client) -> GraphTensors:
    return GraphTensors.from_graph(client, np.arange(client.num_nodes), client.num_nodes, torch.device("cpu"))


def _config(method: str, per_class: int, **extra):
    values = {
        "method": method,
        "device": "cpu",
        "federation": {"participation": 0.5, "max_rounds": 2},
        "graphfl": {"inner_steps": 3},
        "self_training": {"per_class": per_class, "epochs": 20},
    }
    return build_config({**values, **extra})


def test_validation_and_test_nodes_are_never_picked_even_when_most_confident(clients):
    graph = _tensors(clients[0])
    probabilities = torch.full((graph.num_nodes, graph.num_classes), 0.1 / (graph.num_classes - 1))
    probabilities[:, 0] = 0.9  # every node predicted as class 0, at 0.9 ...
    held_out = torch.nonzero(graph.val_mask | graph.test_mask, as_tuple=True)[0]
    probabilities[held_out, 0] = 0.99  # ... the validation and test nodes most confidently
    probabilities[torch.nonzero(graph.train_mask, as_tuple=True)[0], 0] = 0.999  # and the labelled ones more
    nodes, labels = most_confident_per_class(probabilities, candidate_nodes(graph), 5)
    assert nodes.numel() == 5 and labels.tolist() == [0] * 5
    assert not (graph.val_mask | graph.test_mask | graph.train_mask)[nodes].any()


def test_pseudo_labels_are_the_predictions_and_join_the_training_nodes(clients):
    graph = _tensors(clients[0])
    free = torch.nonzero(candidate_nodes(graph), as_tuple=True)[0][:3]
    wrong = (graph.labels[free] + 1) % graph.num_classes  # predictions that disagree with the truth
    enlarged = with_pseudo_labels(graph, free, wrong)
    assert enlarged.labels[free].tolist() == wrong.tolist()  # the predicted labels, never the true ones
    assert enlarged.train_mask[free].all() and enlarged.self_trained_mask.sum() == 3
    assert int(enlarged.train_mask.sum()) == int(graph.train_mask.sum()) + 3
    untouched = ~enlarged.self_trained_mask
    assert torch.equal(enlarged.labels[untouched], graph.labels[untouched])
    for taken in (graph.val_mask, graph.test_mask, graph.train_mask):
        node = torch.nonzero(taken, as_tuple=True)[0][:1]
        with pytest.raises(ValueError, match="validation or test"):
            with_pseudo_labels(graph, node, graph.labels[node])


def test_each_client_adds_its_own_models_most_confident_n_per_class(dataset, clients):
    config = _config("federated", 4)
    graphs = [_tensors(c) for c in clients]
    start = initial_parameters(config, dataset.num_features, dataset.num_classes)
    enlarged = self_trained_graphs(config, graphs, start)
    training = config.training.model_copy(update={"learning_rate": 0.01, "weight_decay": 5e-4})
    for k, (before, after) in enumerate(zip(graphs, enlarged, strict=True)):
        probabilities = local_class_probabilities(before, training, start, 20, config.seed, k)
        expected, predicted = most_confident_per_class(probabilities, candidate_nodes(before), 4)
        added = torch.nonzero(after.self_trained_mask, as_tuple=True)[0]
        assert sorted(added.tolist()) == sorted(expected.tolist()) and added.numel() > 0
        assert torch.bincount(after.labels[added], minlength=dataset.num_classes).max() <= 4
        order = torch.argsort(expected)
        assert after.labels[expected[order]].tolist() == predicted[order].tolist()  # the local model's arg-max
        assert not (before.val_mask | before.test_mask | before.train_mask)[added].any()


def test_graphfl_puts_pseudo_labelled_nodes_in_the_support_set_only(dataset, clients):
    config = _config("graphfl", 4)
    graph = _tensors(clients[0])
    start = initial_parameters(config, dataset.num_features, dataset.num_classes)
    enlarged = self_trained_graphs(config, [graph], start)[0]
    plain = GraphFL(config).support_query(LocalTrainer(0, graph, config.training, 0))
    support, query = GraphFL(config).support_query(LocalTrainer(0, enlarged, config.training, 0))
    pseudo = torch.nonzero(enlarged.self_trained_mask, as_tuple=True)[0]
    assert torch.equal(query, plain[1])  # the query set: the same true-labelled nodes as without self-training
    assert sorted(support.tolist()) == sorted(plain[0].tolist() + pseudo.tolist())


def test_self_training_changes_fedavg_and_graphfl_and_is_refused_elsewhere(clients):
    def broadcasts(method: str, per_class: int) -> list[torch.Tensor]:
        seen: list[torch.Tensor] = []
        observer = lambda broadcast: seen.append(broadcast.weights.clone())  # noqa: E731
        run_experiment(_config(method, per_class), clients=clients, progress=False, observer=observer)
        return seen

    for method in ("federated", "graphfl"):
        plain, trained, again = broadcasts(method, 0), broadcasts(method, 4), broadcasts(method, 4)
        assert len(trained) == len(plain) == 2 and all(map(torch.equal, trained, again))  # deterministic
        assert not torch.equal(trained[0], plain[0])  # the pseudo labels changed the very first round
    for method in ("fedgl", "local", "centralized"):
        with pytest.raises(ConfigError, match="self_training.per_class"):
            _config(method, 4)


def test_the_self_trained_non_iid_variants_add_only_self_training_to_their_methods_schedule():
    from fedgl_secure.simulation.graphfl_experiments import NON_IID_SELF_TRAINING, non_iid_schedule, protocol_config

    for method in ("federated", "graphfl"):
        schedule = non_iid_schedule(f"{method}+st")
        assert schedule == {**non_iid_schedule(method), "self_training": {"per_class": NON_IID_SELF_TRAINING}}
        assert "self_training" not in non_iid_schedule(method)  # the plain cells keep their settings (and cache)
        config = protocol_config("cora", method, 0, non_iid_schedule(f"{method}+st", 7))
        assert config.method == method and config.self_training.per_class == 7


def test_the_consortium_refuses_self_training_instead_of_ignoring_it():
    from pathlib import Path

    from fedgl_secure.consortium.setup_checks import check_consortium_can_run
    from fedgl_secure.policy.schema import load_policy

    baseline = load_policy(Path(__file__).resolve().parents[1] / "policies" / "baseline.toml")
    check_consortium_can_run(_config("graphfl", 0), baseline, 6)
    with pytest.raises(ConfigError, match="services do not self-train"):
        check_consortium_can_run(_config("graphfl", 4), baseline, 6)
