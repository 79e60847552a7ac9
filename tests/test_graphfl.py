"""GraphFL (methods/graphfl.py): its meta step by hand, its splits, self-training, and its two stages in the engine."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from graphfl_examples import HAND_FEATURES, HAND_LABELS, hand_graph

from fedgl_secure.crypto.secure_summation import SecureSummation
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.graphfl_split import (
    evaluation_draw,
    graphfl_clients,
    split_label_domains,
    support_query_split,
    task_client,
)
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.round_pipeline import method_initial_parameters
from fedgl_secure.engine.self_training import most_confident_per_class
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import META_GRADIENTS, WEIGHTS, Broadcast, method_stages, stage_upload_kinds
from fedgl_secure.methods.graphfl import FINETUNE, META, GraphFL, meta_step
from fedgl_secure.policy.schema import Policy
from fedgl_secure.seeding import numpy_stream
from fedgl_secure.simulation.experiment import run_experiment


@pytest.fixture(scope="module")
def dataset():
    return synthetic_consortium(seed=0, num_nodes=400, num_features=40, num_val=80, num_test=100)


class Recording:
    """Keeps the kinds of every summation call, in order; with a ``twin``, also the twin's sums of the very same
    contributions (``twins``)."""

    def __init__(self, inner, twin=None):
        self.inner, self.twin, self.calls, self.twins = inner, twin, [], []

    def __call__(self, round_number, contributions, reference=None):
        sums = self.inner(round_number, contributions, reference=reference)
        self.calls.append((round_number, tuple(sorted(sums)), sums))
        if self.twin is not None:
            self.twins.append(self.twin(round_number, contributions, reference=reference))
        return sums


def test_meta_step_by_hand():
    """θ̂ = θ − β Σ w_k g_k / Σ w_k: θ = (1, −2), two clients with w = 1 and 3, g = (4, 0) and (0, 8), β = 0.5:
    Σ w g = (4, 24), Σ w = 4, mean (1, 6), θ̂ = (0.5, −5)."""
    theta = torch.tensor([1.0, -2.0])
    gradient_sum = 1.0 * torch.tensor([4.0, 0.0]) + 3.0 * torch.tensor([0.0, 8.0])
    assert torch.allclose(meta_step(theta, gradient_sum, 4.0, 0.5), torch.tensor([0.5, -5.0]))


def _linear_softmax_gradient(x: np.ndarray, w: np.ndarray, b: np.ndarray, y: np.ndarray):
    """∂/∂(W, b) of the mean cross-entropy of softmax(xW + b): (xᵀ(P − Y)/n, Σ(P − Y)/n)."""
    logits = x @ w + b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    residual = p - np.eye(w.shape[1])[y]
    return x.T @ residual / len(y), residual.sum(axis=0) / len(y)


def test_one_client_round_of_the_meta_stage_by_hand():
    """A 1-hop SGC on a graph without edges (Â = I) is softmax(XW + b): one support step, the query gradient
    at the adapted parameters, and the plain meta step, all recomputed with numpy's closed form."""
    x, labels, graph = HAND_FEATURES, HAND_LABELS, hand_graph()
    config = build_config(
        {
            "method": "graphfl",
            "device": "cpu",
            "training": {"normalize_features": False},
            "graphfl": {
                "backbone": "sgc",
                "sgc_hops": 1,
                "inner_steps": 1,
                "inner_learning_rate": 0.3,
                "meta_optimizer": "sgd",
                "meta_learning_rate": 0.7,
                "meta_weight_decay": 0.0,
            },
        }
    )
    method = build_method(config)
    tensors = GraphTensors.from_graph(graph, np.arange(6), 6, torch.device("cpu"), normalize_features=False)
    trainer = LocalTrainer(0, tensors, config.training, 0, method.build_model(2, 2))
    w0 = np.array([[0.2, -0.1], [0.4, 0.3]], dtype=np.float64)
    b0 = np.array([0.05, -0.05])
    theta = torch.tensor(np.concatenate([w0.ravel(), b0]), dtype=torch.float32)
    support, query = (s.numpy() for s in method.support_query(trainer))
    assert len(support) == len(query) == 3

    contribution = method.stage_contribution(META, trainer, Broadcast(0, theta))
    gw, gb = _linear_softmax_gradient(x[support], w0, b0, labels[support])
    w1, b1 = w0 - 0.3 * gw, b0 - 0.3 * gb
    qw, qb = _linear_softmax_gradient(x[query], w1, b1, labels[query])
    weight = 6.0  # w_k = N_k
    expected = np.concatenate([weight * qw.ravel(), weight * qb, [weight]])
    assert np.allclose(contribution[META_GRADIENTS].numpy(), expected, atol=1e-6)

    updated = method.stage_update(META, contribution, 1, Broadcast(0, theta))
    expected_theta = np.concatenate([w0.ravel(), b0]) - 0.7 * np.concatenate([qw.ravel(), qb])
    assert np.allclose(updated.weights.numpy(), expected_theta, atol=1e-6)


def _one_client(labelled: int, seed: int = 0):
    """A GraphFL method and the trainer of a 6-node client without edges holding ``labelled`` training nodes."""
    x = np.eye(6, 2, dtype=np.float32) + 0.5
    train = np.zeros(6, dtype=bool)
    train[:labelled] = True
    graph = GraphDataset(
        "tiny",
        sp.csr_matrix(x),
        np.array([0, 1, 0, 1, 0, 1]),
        np.zeros((2, 0), dtype=np.int64),
        train,
        np.zeros(6, dtype=bool),
        np.zeros(6, dtype=bool),
        2,
        np.arange(6),
    )
    config = build_config(
        {"method": "graphfl", "device": "cpu", "seed": seed, "graphfl": {"backbone": "sgc", "sgc_hops": 1}}
    )
    method = build_method(config)
    tensors = GraphTensors.from_graph(graph, np.arange(6), 6, torch.device("cpu"), normalize_features=False)
    return method, LocalTrainer(0, tensors, config.training, seed, method.build_model(2, 2))


def test_a_client_without_query_nodes_has_no_weight_in_the_meta_step():
    """One labelled node is support only: the client's meta term is all zeros *with weight 0*, so it does not
    shrink the other clients' mean query gradient; a round where no sampled client has query nodes takes no
    meta step (θ̂ = θ) instead of dividing by zero."""
    method, trainer = _one_client(labelled=1)
    assert method.support_query(trainer)[1].numel() == 0
    # explicit θ: a model fresh from build_model holds torch.empty's memory until reset_parameters, which once
    # held NaNs in a full run (and made alone and together NaN)
    theta = torch.tensor([0.2, -0.1, 0.4, 0.3, 0.05, -0.05])
    term = method.stage_contribution(META, trainer, Broadcast(0, theta))[META_GRADIENTS]
    assert float(term[-1]) == 0.0 and bool(torch.all(term == 0))
    other, holder = _one_client(labelled=4)
    with_query = other.stage_contribution(META, holder, Broadcast(0, theta))[META_GRADIENTS]
    alone = other.stage_update(META, {META_GRADIENTS: with_query}, 1, Broadcast(0, theta)).weights
    other.load_server_state({})
    together = other.stage_update(META, {META_GRADIENTS: with_query + term}, 1, Broadcast(0, theta)).weights
    assert torch.allclose(alone, together) and not torch.allclose(alone, theta)
    assert torch.equal(method.stage_update(META, {META_GRADIENTS: term}, 1, Broadcast(0, theta)).weights, theta)


def test_support_query_split_halves_the_labelled_nodes():
    nodes = np.arange(100, 111)
    support, query = support_query_split(nodes, 0.5, numpy_stream(0, "t"))
    assert np.intersect1d(support, query).size == 0
    assert np.array_equal(np.sort(np.concatenate([support, query])), nodes)
    assert abs(len(support) - len(query)) <= 1 and len(query) == 6  # round(5.5) = 6
    again = support_query_split(nodes, 0.5, numpy_stream(0, "t"))
    assert np.array_equal(support, again[0]) and np.array_equal(query, again[1])
    other = support_query_split(nodes, 0.5, numpy_stream(1, "t"))
    assert not np.array_equal(query, other[1])
    lone, empty = support_query_split(np.array([7]), 0.5, numpy_stream(0, "t"))
    assert lone.tolist() == [7] and empty.size == 0
    with pytest.raises(ConfigError, match="query_fraction"):
        support_query_split(nodes, 1.0, numpy_stream(0, "t"))


def test_graphfl_clients_spread_the_labelled_nodes(dataset):
    clients = graphfl_clients(dataset, 8, 10, seed=3, test_size=100, val_size=50)
    assert len(clients) == 8
    train = np.concatenate([np.flatnonzero(c.train_mask) for c in clients])
    assert train.size == 10 * dataset.num_classes and np.unique(train).size == train.size  # disjoint
    assert np.bincount(dataset.labels[train], minlength=dataset.num_classes).tolist() == [10] * dataset.num_classes
    sizes = [int(c.train_mask.sum()) for c in clients]
    assert max(sizes) - min(sizes) <= 1
    for client in clients:  # the whole graph, the same validation and test nodes, never a training node
        assert client.num_nodes == dataset.num_nodes and client.edge_index.shape == dataset.edge_index.shape
        assert client.test_mask.sum() == 100 and client.val_mask.sum() == 50
        assert np.array_equal(client.test_mask, clients[0].test_mask)
        assert not (client.test_mask & client.val_mask).any()
        assert not (clients[0].test_mask | clients[0].val_mask)[train].any()


def test_self_training_picks_the_most_confident_per_class():
    probabilities = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # 0: class 0, 0.9
            [0.6, 0.4, 0.0],  # 1: class 0, 0.6
            [0.8, 0.2, 0.0],  # 2: class 0, 0.8
            [0.1, 0.7, 0.2],  # 3: class 1, 0.7
            [0.95, 0.05, 0.0],  # 4: class 0, 0.95 — but labelled already (not a candidate)
            [0.0, 0.2, 0.8],  # 5: class 2, 0.8
            [0.3, 0.5, 0.2],  # 6: class 1, 0.5
            [0.1, 0.9, 0.0],  # 7: class 1, 0.9
            [0.8, 0.1, 0.1],  # 8: class 0, 0.8 (ties node 2: the lower index wins)
        ]
    )
    candidates = torch.ones(9, dtype=torch.bool)
    candidates[4] = False
    nodes, labels = most_confident_per_class(probabilities, candidates, 2)
    assert nodes.tolist() == [0, 2, 7, 3, 5] and labels.tolist() == [0, 0, 1, 1, 2]
    nodes, labels = most_confident_per_class(probabilities, candidates, 0)
    assert nodes.numel() == 0


def test_new_label_domain_split_has_no_class_leakage(dataset):
    """Meta-training tasks hold no node of a new class; each evaluation draw's fine-tuning shots, validation
    nodes and test nodes are of the new classes only and pairwise disjoint (the experiment's own functions)."""
    from fedgl_secure.simulation.graphfl_experiments import new_label_tasks

    for seed in range(5):
        old, new, tasks = new_label_tasks(dataset, 2, seed, num_clients=8)
        assert np.intersect1d(old, new).size == 0 and np.union1d(old, new).tolist() == list(range(dataset.num_classes))
        training_nodes = np.concatenate([task.nodes for task in tasks])
        assert set(dataset.labels[training_nodes]) <= set(old.tolist())
        client = task_client(dataset, tasks[0], "c")
        labelled = np.flatnonzero(client.labels >= 0)
        assert np.array_equal(np.sort(labelled), np.sort(tasks[0].nodes)) and client.num_classes == 2
        rng = numpy_stream(seed, "evaluation")
        for shots in (2, 6, 10):
            draw = evaluation_draw(dataset.labels, new, 2, shots, rng, per_class=15)
            parts = (draw.fine_tune.nodes, draw.val.nodes, draw.test.nodes)
            assert [p.size for p in parts] == [2 * shots, 30, 30]
            assert np.unique(np.concatenate(parts)).size == sum(p.size for p in parts)
            assert set(dataset.labels[np.concatenate(parts)]) == set(new.tolist())
            for part in (draw.val, draw.test):
                assert np.array_equal(part.classes, draw.fine_tune.classes)
                assert np.array_equal(dataset.labels[part.nodes], part.classes[part.labels])
            client = task_client(dataset, draw.fine_tune, "new", val=draw.val, test=draw.test)
            masks = np.stack([client.train_mask, client.val_mask, client.test_mask])
            assert masks.sum(axis=1).tolist() == [p.size for p in parts] and masks.sum(axis=0).max() == 1
    with pytest.raises(ConfigError, match="new_classes"):
        split_label_domains(dataset.num_classes, dataset.num_classes, 0)


def _graphfl_config(**graphfl):
    return build_config(
        {
            "method": "graphfl",
            "device": "cpu",
            "federation": {"participation": 0.5, "max_rounds": 2},
            "graphfl": {"inner_steps": 3, **graphfl},
        }
    )


def test_graphfl_round_is_two_stages_with_their_own_kinds(dataset):
    method = build_method(_graphfl_config())
    assert method_stages(method) == (META, FINETUNE)
    assert stage_upload_kinds(method, META) == (META_GRADIENTS,) and stage_upload_kinds(method, FINETUNE) == (WEIGHTS,)
    clients = graphfl_clients(dataset, 6, 10, seed=0, test_size=100, val_size=50)
    summation = Recording(PlaintextSummation())
    result = run_experiment(_graphfl_config(), clients=clients, progress=False, summation=summation)
    assert [(r, kinds) for r, kinds, _ in summation.calls] == [
        (1, (META_GRADIENTS,)),
        (1, (WEIGHTS,)),
        (2, (META_GRADIENTS,)),
        (2, (WEIGHTS,)),
    ]
    assert result.rounds_run == 2 and len(result.history[0].participants) == 3
    again = run_experiment(_graphfl_config(), clients=clients, progress=False)
    assert [h.val_accuracy for h in again.history] == [h.val_accuracy for h in result.history]


def test_graphfl_secure_summation_gives_the_plaintext_run(dataset, small_policy):
    clients = graphfl_clients(dataset, 6, 10, seed=0, test_size=100, val_size=50)
    plain = Recording(PlaintextSummation())
    plain_result = run_experiment(_graphfl_config(), clients=clients, progress=False, summation=plain)
    secure_summation = SecureSummation(small_policy)
    secure = Recording(secure_summation, twin=PlaintextSummation())
    try:
        secure_result = run_experiment(_graphfl_config(), clients=clients, progress=False, summation=secure)
    finally:
        secure_summation.close()
    assert [c[:2] for c in secure.calls] == [c[:2] for c in plain.calls]
    # every CKKS sum equals the plaintext sum of the contributions it was given, to CKKS noise (~1e-7 here); the
    # two runs' later contributions differ by that noise amplified through training (measured up to 1.5e-4 by
    # round 2), so sums are compared across runs only before anything was summed: the first call
    for (_, kinds, secure_sums), plain_sums in zip(secure.calls, secure.twins, strict=True):
        for kind in kinds:
            assert float((secure_sums[kind] - plain_sums[kind]).abs().max()) <= 1e-6, kind
    (_, kinds, first_plain), (_, _, first_secure) = plain.calls[0], secure.calls[0]
    assert all(float((first_secure[kind] - first_plain[kind]).abs().max()) <= 1e-6 for kind in kinds)
    assert secure_summation.wire.bytes_by_kind[META_GRADIENTS] > 0
    assert [h.val_accuracy for h in secure_result.history] == [h.val_accuracy for h in plain_result.history]


def test_graphfl_refuses_a_dp_policy(dataset):
    from fedgl_secure.privacy.dp_round import FederationPrivacy

    policy = Policy.model_validate(
        {
            "dp": {"weights": {"enabled": True, "clip": 1.0, "noise_multiplier": 1.0}},
            "budget": {"epsilon": 10.0, "delta": 1e-5, "rounds": 2},
            "allowed_kinds": ["weights", "node_weight", "meta_gradients"],
        }
    )
    clients = graphfl_clients(dataset, 6, 10, seed=0, test_size=100, val_size=50)
    with pytest.raises(ConfigError, match="single-stage"):
        run_experiment(_graphfl_config(), clients=clients, progress=False, privacy=FederationPrivacy(policy))


def test_the_consortium_runs_graphfl_but_refuses_it_under_any_dp_policy():
    """Without DP the aggregator accepts graphfl's two stages; under a DP policy, per round or once at the source
    (edge DP), the consortium refuses it before any key is used, as the simulation does
    (privacy_checks.check_stages)."""
    from pathlib import Path

    from fedgl_secure.consortium.setup_checks import check_consortium_can_run
    from fedgl_secure.policy.schema import load_policy

    policies = Path(__file__).resolve().parents[1] / "policies"
    check_consortium_can_run(_graphfl_config(), load_policy(policies / "baseline.toml"), 6)
    for name in ("strict-dp.toml", "strict-edge-dp.toml"):
        with pytest.raises(ConfigError, match="2 stages per round.*single-stage methods only"):
            check_consortium_can_run(_graphfl_config(), load_policy(policies / name), 6)


def test_a_method_whose_stages_share_a_kind_is_refused():
    """A key authority decrypts each (round, kind) once: a kind in two stages of a round could never be fused."""
    from fedgl_secure.methods.base import check_stage_kinds

    class SameKindTwice(GraphFL):
        def stage_upload_kinds(self, stage: str) -> tuple[str, ...]:
            return (WEIGHTS,)

    check_stage_kinds(build_method(_graphfl_config()))  # meta_gradients, then weights
    with pytest.raises(ValueError, match="'weights' is uploaded in stages 'meta' and 'finetune'"):
        check_stage_kinds(SameKindTwice(_graphfl_config()))


def test_the_central_reference_trains_on_exactly_the_clients_labelled_nodes(dataset):
    """The non-IID ceiling (``centralized`` on the same clients) sees the union of the clients' labelled nodes and
    the very validation and test nodes every client is scored on, nothing more."""
    from fedgl_secure.simulation.experiment import Federation

    clients = graphfl_clients(dataset, 7, 3, seed=0, test_size=100, val_size=50)
    config = build_config({"method": "centralized", "device": "cpu"})
    merged = Federation.from_clients(clients, config, torch.device("cpu")).merged
    union = np.logical_or.reduce([c.train_mask for c in clients])
    assert merged.train_mask.cpu().numpy().tolist() == union.tolist()
    assert int(union.sum()) == 3 * dataset.num_classes
    for name in ("val_mask", "test_mask"):
        assert getattr(merged, name).cpu().numpy().tolist() == getattr(clients[0], name).tolist()


def test_the_non_iid_schedule_is_applied_and_a_set_override_wins_field_by_field():
    from fedgl_secure.simulation.graphfl_experiments import merge_sections, non_iid_schedule, protocol_config

    schedule = non_iid_schedule("federated")
    config = protocol_config("cora", "federated", 0, merge_sections(schedule, {"training": {"local_epochs": 3}}))
    assert config.training.local_epochs == 3  # the override
    assert config.training.weight_decay == schedule["training"]["weight_decay"] == 0.0  # the schedule, kept
    assert config.training.learning_rate == schedule["training"]["learning_rate"]
    graphfl = protocol_config("cora", "graphfl", 0, non_iid_schedule("graphfl"))
    assert graphfl.graphfl.inner_optimizer == "adam" and graphfl.graphfl.inner_steps == 15
    assert non_iid_schedule("local") == non_iid_schedule("centralized") == {}


def test_the_new_label_experiment_runs_its_chosen_adaptation_and_meta_step_and_a_set_override_wins():
    from fedgl_secure.simulation.graphfl_experiments import (
        NEW_LABEL_ADAPTATION,
        NEW_LABEL_META_STEP,
        new_label_adaptation,
        protocol_config,
    )

    chosen = protocol_config("cora", "graphfl", 0, new_label_adaptation({})).graphfl
    assert (
        chosen.meta_learning_rate
        == NEW_LABEL_META_STEP["meta_learning_rate"]
        != build_config({}).graphfl.meta_learning_rate
    )
    assert (chosen.inner_optimizer, chosen.inner_learning_rate) == (
        NEW_LABEL_ADAPTATION["inner_optimizer"],
        NEW_LABEL_ADAPTATION["inner_learning_rate"],
    )
    overridden = protocol_config("cora", "graphfl", 0, new_label_adaptation({"graphfl": {"meta_learning_rate": 0.02}}))
    assert overridden.graphfl.meta_learning_rate == 0.02
    assert overridden.graphfl.inner_learning_rate == NEW_LABEL_ADAPTATION["inner_learning_rate"]


def test_new_label_models_trained_alone_equal_those_trained_together(dataset):
    """The grid trains FL+TL's model once for every adaptation setting: that must be the same model."""
    from fedgl_secure.simulation.graphfl_experiments import (
        evaluate_new_label,
        new_label_tasks,
        protocol_config,
        train_new_label_models,
    )

    config = protocol_config(
        "synthetic", "graphfl", 3, {"graphfl": {"inner_optimizer": "adam", "inner_state": "fresh"}}
    )
    _, new, tasks = new_label_tasks(dataset, 2, 3, num_clients=10)
    both = train_new_label_models(dataset, config, tasks, 2, episodes=2)
    alone = {
        name: train_new_label_models(dataset, config, tasks, 2, methods=(name,), episodes=2)[name]
        for name in ("fl+tl", "graphfl")
    }
    for name in ("graphfl", "fl+tl"):
        assert torch.equal(both[name], alone[name])
    assert not torch.equal(both["graphfl"], both["fl+tl"])
    scores = evaluate_new_label(dataset, config, both, new, repeats=1)
    for name in ("graphfl", "fl+tl"):
        assert len(scores[name]) == len(scores["val"][name]) == 3
        assert all(0.0 <= s <= 1.0 for s in scores[name] + scores["val"][name])


def test_fresh_inner_state_leaves_the_clients_adam_alone_and_repeats_itself(dataset):
    """``inner_state = "fresh"``: every T_e steps start a new Adam (MAML's inner loop, the new-label protocol), so
    the trainer's own optimiser gets no state and the same start gives the same contribution twice; ``client``
    steps the trainer's Adam, whose moments then make a second call from the same start differ."""
    clients = graphfl_clients(dataset, 2, 10, seed=0, test_size=100, val_size=50)
    for state in ("fresh", "client"):
        method = GraphFL(_graphfl_config(inner_optimizer="adam", inner_state=state, inner_learning_rate=0.05))
        graph = GraphTensors.from_graph(
            clients[0], np.arange(clients[0].num_nodes), clients[0].num_nodes, torch.device("cpu"), True
        )
        model = method.build_model(graph.features.shape[1], graph.num_classes)
        trainer = LocalTrainer(0, graph, method.config.training, 0, model)
        start = Broadcast(
            0, method_initial_parameters(method, method.config, graph.features.shape[1], graph.num_classes)
        )
        contributions = []
        for _ in range(2):
            trainer.generator.manual_seed(0)  # the same dropout masks: only the optimiser's state may differ
            contributions.append(method.stage_contribution(FINETUNE, trainer, start)[WEIGHTS])
        first, second = contributions
        assert not torch.equal(first[:-1], start.weights)
        if state == "fresh":
            assert not trainer.optimizer.state and torch.equal(first, second)
        else:
            assert trainer.optimizer.state and not torch.equal(first, second)
