"""Second-order MAML (methods/maml.py, ``graphfl.meta_order = 2``): by hand, by finite differences, and in GraphFL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graphfl_examples import HAND_FEATURES, HAND_LABELS, hand_graph

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.data.graphfl_split import graphfl_clients
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import META_GRADIENTS, Broadcast
from fedgl_secure.methods.graphfl import META, gradient_steps, loss_gradient
from fedgl_secure.methods.maml import adapted_parameters, functional_loss, second_order_meta_gradient
from fedgl_secure.model.gcn import GCN
from fedgl_secure.simulation.experiment import run_experiment


def _softmax(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _gradient(x, w, b, y):
    """∂/∂(W, b) of the mean cross-entropy of softmax(xW + b), flattened as the model's parameters: W row-major,
    then b."""
    residual = _softmax(x @ w + b) - np.eye(w.shape[1])[y]
    return np.concatenate([(x.T @ residual / len(y)).ravel(), residual.sum(axis=0) / len(y)])


def _hessian(x, w, b):
    r"""Hessian of that loss: mean over nodes of :math:`\tilde x\tilde x^\top \otimes (\mathrm{diag}(p) - pp^\top)`,
    :math:`\tilde x = (x, 1)` (the bias is the last input row, which the W-then-b layout puts last)."""
    p = _softmax(x @ w + b)
    augmented = np.hstack([x, np.ones((len(x), 1))])
    blocks = [np.kron(np.outer(a, a), np.diag(q) - np.outer(q, q)) for a, q in zip(augmented, p, strict=True)]
    return np.mean(blocks, axis=0)


def test_one_inner_step_meta_gradient_by_hand():
    """MAML's exact meta gradient after one inner step (Finn et al. 2017): (I − α H_s(θ)) ∇L_q(θ − α∇L_s(θ)), for a
    1-hop SGC on a graph without edges (softmax regression), recomputed in numpy's closed form. It differs from the
    first-order term ∇L_q(θ'), which this client uploads with meta_order = 1."""
    x, labels, graph = HAND_FEATURES, HAND_LABELS, hand_graph()
    alpha = 0.8
    settings = {"backbone": "sgc", "sgc_hops": 1, "inner_steps": 1, "inner_learning_rate": alpha, "meta_order": 2}
    config = build_config(
        {"method": "graphfl", "device": "cpu", "training": {"normalize_features": False}, "graphfl": settings}
    )
    method = build_method(config)
    tensors = GraphTensors.from_graph(graph, np.arange(6), 6, torch.device("cpu"), normalize_features=False)
    trainer = LocalTrainer(0, tensors, config.training, 0, method.build_model(2, 2))
    w0, b0 = np.array([[0.2, -0.1], [0.4, 0.3]]), np.array([0.05, -0.05])
    theta = torch.tensor(np.concatenate([w0.ravel(), b0]), dtype=torch.float32)
    support, query = (s.numpy() for s in method.support_query(trainer))

    contribution = method.stage_contribution(META, trainer, Broadcast(0, theta))

    adapted = np.concatenate([w0.ravel(), b0]) - alpha * _gradient(x[support], w0, b0, labels[support])
    w1, b1 = adapted[:4].reshape(2, 2), adapted[4:]
    first_order = _gradient(x[query], w1, b1, labels[query])
    exact = (np.eye(6) - alpha * _hessian(x[support], w0, b0)) @ first_order
    weight = 6.0  # w_k = N_k
    uploaded = contribution[META_GRADIENTS].numpy()
    assert np.allclose(uploaded, np.concatenate([weight * exact, [weight]]), atol=1e-6)
    assert np.abs(exact - first_order).max() > 1e-2  # the Jacobian term is not negligible here
    assert np.allclose(trainer.model.flat_parameters().numpy(), adapted, atol=1e-6)  # left adapted, as first-order


@pytest.fixture(scope="module")
def client():
    """A client of the synthetic consortium (whole graph, 12 labelled nodes) as GCN tensors."""
    dataset = synthetic_consortium(seed=0, num_nodes=200, num_features=40, num_val=40, num_test=40)
    graph = graphfl_clients(dataset, 2, 6, seed=0, test_size=40, val_size=40)[0]
    tensors = GraphTensors.from_graph(graph, np.arange(graph.num_nodes), graph.num_nodes, torch.device("cpu"), True)
    labelled = torch.nonzero(tensors.train_mask, as_tuple=True)[0]
    return tensors, tensors.adjacency(None, 0.0, False), labelled[::2], labelled[1::2], dataset.num_classes


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_differentiable_inner_loop_takes_the_first_order_paths_steps(client, optimizer):
    """With dropout drawn from the same generator, U(θ) equals the in-place steps of ``gradient_steps`` (plain SGD,
    or the fresh torch Adam: the only change, ε² under the square root, is far below this tolerance)."""
    graph, adjacency, support, _, classes = client
    model = GCN(graph.features.shape[1], 8, classes, dropout=0.5)
    model.reset_parameters(torch.Generator().manual_seed(0))
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    adapted = adapted_parameters(
        model, start, graph, adjacency, support, 5, 0.05, torch.Generator().manual_seed(3), optimizer
    )
    gradient_steps(model, graph, adjacency, support, 5, 0.05, torch.Generator().manual_seed(3), optimizer)
    for name, parameter in model.named_parameters():
        assert torch.allclose(adapted[name], parameter, atol=1e-6), name
        assert not torch.allclose(start[name], parameter, atol=1e-4), name  # the steps moved it


def test_the_meta_gradient_is_the_derivative_of_the_query_loss_after_adaptation(client):
    """Three fresh-Adam inner steps on a 2-layer GCN: the meta gradient's directional derivative along random
    directions matches central finite differences of θ ↦ L_q(U(θ)); the first-order term does not."""
    graph, adjacency, support, query, classes = client
    model = GCN(graph.features.shape[1], 8, classes, dropout=0.0)
    model.reset_parameters(torch.Generator().manual_seed(1))
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    theta = model.flat_parameters()

    def meta_loss(flat: torch.Tensor) -> float:
        start = dict(zip(names, torch.split(flat, [int(np.prod(s)) for s in shapes]), strict=True))
        start = {name: value.reshape(shape) for (name, value), shape in zip(start.items(), shapes, strict=True)}
        adapted = adapted_parameters(model, start, graph, adjacency, support, 3, 0.05, None, "adam")
        return float(functional_loss(model, adapted, graph, adjacency, query, None).detach())

    exact, _ = second_order_meta_gradient(model, graph, adjacency, support, query, 3, 0.05, None, "adam")
    model.load_flat_parameters(theta)
    gradient_steps(model, graph, adjacency, support, 3, 0.05, None, "adam")
    first_order = loss_gradient(model, graph, adjacency, query, None)
    generator = torch.Generator().manual_seed(7)
    first_order_misses = []
    for _ in range(3):
        direction = torch.randn(theta.shape, generator=generator)
        direction /= direction.norm()
        h = 1e-3
        numeric = (meta_loss(theta + h * direction) - meta_loss(theta - h * direction)) / (2 * h)
        assert float(exact @ direction) == pytest.approx(numeric, rel=0.03, abs=2e-4)
        first_order_misses.append(abs(float(first_order @ direction) - numeric) > 0.1 * abs(numeric))
    assert any(first_order_misses)  # so the check above could tell the two apart


def test_second_order_with_the_clients_own_adam_is_refused():
    with pytest.raises(ConfigError, match="meta_order"):
        build_config({"method": "graphfl", "graphfl": {"meta_order": 2, "inner_optimizer": "adam"}})
    build_config({"method": "graphfl", "graphfl": {"meta_order": 2, "inner_optimizer": "adam", "inner_state": "fresh"}})


def test_graphfl_runs_second_order_and_repeats_itself():
    """Two rounds of the engine with meta_order = 2 (GCN, fresh-Adam inner steps): finite, deterministic per seed,
    and its summed meta gradients are not the first-order run's."""
    dataset = synthetic_consortium(seed=0, num_nodes=200, num_features=40, num_val=40, num_test=40)
    clients = graphfl_clients(dataset, 4, 6, seed=0, test_size=40, val_size=40)

    def run(order: int):
        sums = []

        def summation(round_number, contributions, reference=None):
            result = PlaintextSummation()(round_number, contributions, reference=reference)
            sums.append(result)
            return result

        settings = {"meta_order": order, "inner_optimizer": "adam", "inner_state": "fresh", "inner_steps": 3}
        federation = {"participation": 0.5, "max_rounds": 2, "patience": 2}
        config = build_config(
            {"method": "graphfl", "device": "cpu", "seed": 0, "federation": federation, "graphfl": settings}
        )
        return run_experiment(config, clients=clients, progress=False, summation=summation), sums

    (second, meta_sums), (again, _), (_, first_sums) = run(2), run(2), run(1)
    assert second.rounds_run == 2 and np.isfinite(second.global_test_accuracy)
    assert [h.val_accuracy for h in again.history] == [h.val_accuracy for h in second.history]
    # round 1's meta stage starts from the same θ_0 with the same clients: only the order differs
    assert META_GRADIENTS in meta_sums[0] and META_GRADIENTS in first_sums[0]
    assert torch.isfinite(meta_sums[0][META_GRADIENTS]).all()
    assert not torch.allclose(meta_sums[0][META_GRADIENTS], first_sums[0][META_GRADIENTS], atol=1e-4)
