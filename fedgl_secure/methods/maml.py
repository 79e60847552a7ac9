"""Second-order MAML's meta gradient (Finn et al., "Model-Agnostic Meta-Learning", ICML 2017, Eq. 1 and §2.2).

A client adapts θ by T_e steps on its support loss, θ' = U(θ), and the meta objective is its query loss at the
adapted parameters, L_q(U(θ)). Its exact gradient is the chain rule through every inner step,

    ∇_θ L_q(U(θ)) = J_U(θ)ᵀ ∇L_q(θ'),     with J_U = Π_t (I − α H_s(θ_t)) for plain gradient steps,

which needs the Hessian-vector products of the support loss: the inner steps are taken on a graph that autograd
keeps (``create_graph=True``) and the query loss is differentiated back to θ. First-order MAML drops J_U (uses
∇L_q(θ') as the gradient at θ); :mod:`fedgl_secure.methods.graphfl` offers both (``graphfl.meta_order``).

The inner steps are plain gradient descent (the paper) or a *fresh* Adam (Kingma & Ba, ICLR 2015, Algorithm 1:
zero moments, bias-corrected), written out so autograd can run through them. The one departure from
``torch.optim.Adam``: the denominator is ``sqrt(v̂ + ε²) + ε`` instead of ``sqrt(v̂) + ε``, because a weight that
no support node reaches has v̂ = 0, where the square root's derivative is infinite and would turn the meta
gradient into NaN; the step differs from torch's by less than 1e-7 relative (tested).

Dropout draws from the client's generator in the same order as the first-order path (T_e support forwards, then
one query forward), so both orders adapt to the very same θ'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.model.sparse import SparseOperator

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the first-order path's fresh Adam uses
ADAM_EPSILON = 1e-8

Parameters = dict[str, torch.Tensor]


def functional_loss(
    model: nn.Module,
    parameters: Parameters,
    graph: GraphTensors,
    adjacency: SparseOperator,
    nodes: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Mean cross-entropy at ``nodes`` of ``model`` run with ``parameters`` in place of its own (train mode)."""
    logits = functional_call(model, parameters, (graph.features, adjacency, generator)).logits
    return F.cross_entropy(logits[nodes], graph.labels[nodes])


def adapted_parameters(
    model: nn.Module,
    start: Parameters,
    graph: GraphTensors,
    adjacency: SparseOperator,
    nodes: torch.Tensor,
    steps: int,
    learning_rate: float,
    generator: torch.Generator | None,
    optimizer: str = "sgd",
) -> Parameters:
    """θ' = U(θ): ``steps`` inner steps on the support loss at ``nodes``, differentiable with respect to ``start``.

    ``sgd``: θ ← θ − α∇L_s(θ) (MAML's inner update). ``adam``: a fresh Adam at step size α (module doc). No steps
    without nodes (θ' = θ)."""
    if nodes.numel() == 0:
        return dict(start)
    # a constant start (no graph to θ) still needs gradients for the inner steps themselves
    parameters = {
        name: value if value.requires_grad else value.detach().requires_grad_(True) for name, value in start.items()
    }
    names = list(parameters)
    beta1, beta2 = ADAM_BETAS
    moments = optimizer == "adam"  # plain gradient steps keep no state
    first = {name: torch.zeros_like(value) for name, value in parameters.items()} if moments else {}
    second = {name: torch.zeros_like(value) for name, value in parameters.items()} if moments else {}
    model.train()
    for step in range(1, steps + 1):
        loss = functional_loss(model, parameters, graph, adjacency, nodes, generator)
        gradients = torch.autograd.grad(loss, [parameters[name] for name in names], create_graph=True)
        updated = {}
        for name, gradient in zip(names, gradients, strict=True):
            if not moments:
                updated[name] = parameters[name] - learning_rate * gradient
                continue
            first[name] = beta1 * first[name] + (1.0 - beta1) * gradient
            second[name] = beta2 * second[name] + (1.0 - beta2) * gradient * gradient
            corrected_first = first[name] / (1.0 - beta1**step)
            corrected_second = second[name] / (1.0 - beta2**step)
            denominator = torch.sqrt(corrected_second + ADAM_EPSILON**2) + ADAM_EPSILON
            updated[name] = parameters[name] - learning_rate * corrected_first / denominator
        parameters = updated
    return parameters


def second_order_meta_gradient(
    model: nn.Module,
    graph: GraphTensors,
    adjacency: SparseOperator,
    support: torch.Tensor,
    query: torch.Tensor,
    steps: int,
    learning_rate: float,
    generator: torch.Generator | None,
    optimizer: str = "sgd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """∇_θ L_q(U(θ)) at the model's current parameters θ, flattened in ``model.parameters()`` order (the layout of
    ``flat_parameters``), and θ' = U(θ) flattened likewise. Zero gradient without query nodes."""
    start = {name: parameter.detach().clone().requires_grad_(True) for name, parameter in model.named_parameters()}
    adapted = adapted_parameters(model, start, graph, adjacency, support, steps, learning_rate, generator, optimizer)
    flat_adapted = torch.cat([value.detach().reshape(-1) for value in adapted.values()])
    if query.numel() == 0:
        return torch.zeros_like(flat_adapted), flat_adapted
    loss = functional_loss(model, adapted, graph, adjacency, query, generator)
    gradients = torch.autograd.grad(loss, list(start.values()))
    return torch.cat([gradient.reshape(-1) for gradient in gradients]).detach(), flat_adapted
