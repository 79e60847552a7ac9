"""GraphFL (Wang et al., 2020), Algorithm 1: MAML-style federated training in two stages per round.

Stage ``meta``: every sampled client starts from θ_t, takes T_e gradient steps on its support loss
(θ_k = θ_t − α ∇L_support, repeated) and uploads the gradient of its query loss at θ_k; the server
takes the meta step θ̂_t = θ_t − β ḡ with ḡ the clients' weighted mean gradient.
Stage ``finetune``: every sampled client fine-tunes θ̂_t on its support set for T_e steps and uploads
its weights; the server averages them (FedAvg, Eq. 10 of FedGL) into θ_{t+1}.

**First-order MAML** (``graphfl.meta_order = 1``, the default). The query gradient is taken at the
adapted parameters and used as the gradient at θ_t (the Jacobian of the inner steps is dropped), as the
authors' code does (its inner gradients are not differentiated through); the client's cost is one
backward pass per step. ``meta_order = 2`` uploads the exact gradient of the query loss with respect to
θ_t through the T_e inner steps (:mod:`fedgl_secure.methods.maml`): the same upload, at the cost of
Hessian-vector products.

**The meta step's β** applies to the weighted *mean* of the query gradients; the paper writes
``θ_t − β Σ_i g_i``, which equals ours with β multiplied by the number of sampled clients when their
weights are equal. ``graphfl.meta_optimizer = "adam"`` (the authors' code) replaces the plain step
with an Adam step on ḡ, whose state the server keeps across rounds.

Both uploads are pre-weighted terms like every other kind (``cat(w_k·g_k, [w_k])``, ``cat(w_k·W_k,
[w_k])``), so they travel through the same plaintext or CKKS summation; the kinds differ
(``meta_gradients``, then ``weights``) because the key authority decrypts each (round, kind) once.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fedgl_secure.data.graphfl_split import support_query_split
from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.methods.base import (
    META_GRADIENTS,
    WEIGHTS,
    Broadcast,
    FederatedMethod,
    split_weights_sum,
    weights_term,
)
from fedgl_secure.methods.maml import second_order_meta_gradient
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.model.eager_adam import EagerAdam
from fedgl_secure.model.gcn import GCN
from fedgl_secure.model.sgc import SGC
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.seeding import numpy_stream

META = "meta"
FINETUNE = "finetune"
_ADAM_MOMENTS = ("step", "exp_avg", "exp_avg_sq")  # the meta optimiser's state per parameter
# Σ ŵ_k of the meta stage below which no sampled client had query nodes (well above CKKS noise, ~1e-7;
# a contributing client's ŵ_k = w_k / w_max is far larger)
NO_QUERY_WEIGHT = 1e-3


def supervised_loss(model: nn.Module, graph: GraphTensors, adjacency: SparseOperator, nodes: torch.Tensor, generator):
    """Mean cross-entropy of ``model`` at ``nodes`` (train mode: dropout from the client's own stream)."""
    logits = model(graph.features, adjacency, generator).logits
    return F.cross_entropy(logits[nodes], graph.labels[nodes])


def gradient_steps(
    model: nn.Module,
    graph: GraphTensors,
    adjacency: SparseOperator,
    nodes: torch.Tensor,
    steps: int,
    learning_rate: float,
    generator: torch.Generator | None = None,
    optimizer: str = "sgd",
) -> None:
    """``steps`` steps on the loss at ``nodes`` (Algorithm 1's inner loop and its fine-tuning), in place:
    plain gradient descent θ ← θ − α ∇L(θ) (the paper), or Adam at step size α with a fresh state and no
    weight decay (``optimizer = "adam"``). No steps without nodes."""
    if nodes.numel() == 0:
        return
    model.train()
    parameters = list(model.parameters())
    if optimizer == "adam":
        adam = EagerAdam(parameters, lr=learning_rate)
        for _ in range(steps):
            adam.zero_grad(set_to_none=True)
            supervised_loss(model, graph, adjacency, nodes, generator).backward()
            adam.step()
        return
    for _ in range(steps):
        gradients = torch.autograd.grad(supervised_loss(model, graph, adjacency, nodes, generator), parameters)
        with torch.no_grad():
            for parameter, gradient in zip(parameters, gradients, strict=True):
                parameter -= learning_rate * gradient


def loss_gradient(
    model: nn.Module,
    graph: GraphTensors,
    adjacency: SparseOperator,
    nodes: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """∇L at the model's current parameters, flattened (zero without nodes)."""
    parameters = list(model.parameters())
    if nodes.numel() == 0:
        return torch.zeros(sum(p.numel() for p in parameters))
    model.train()
    gradients = torch.autograd.grad(supervised_loss(model, graph, adjacency, nodes, generator), parameters)
    return torch.cat([g.reshape(-1) for g in gradients]).detach()


def meta_step(theta: torch.Tensor, gradient_sum: torch.Tensor, total_weight: float, beta: float) -> torch.Tensor:
    """Algorithm 1's meta update ``θ̂_t = θ_t − β · Σ_k w_k g_k / Σ_k w_k`` (plain gradient descent)."""
    if total_weight <= 0:
        raise ValueError("meta step: the total client weight must be positive")
    return theta - beta * gradient_sum / total_weight


class GraphFL(FederatedMethod):
    """GraphFL for non-IID clients (Algorithm 1); stages ``meta`` and ``finetune`` (module doc)."""

    name = "graphfl"
    stages = (META, FINETUNE)

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.settings = config.graphfl
        self._splits: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._meta_parameters: nn.Parameter | None = None  # the server's Adam state lives with these
        self._meta_optimizer: torch.optim.Optimizer | None = None

    # --- what the method declares -----------------------------------------------------------

    @property
    def upload_kinds(self) -> tuple[str, ...]:
        return (META_GRADIENTS, WEIGHTS)

    def stage_upload_kinds(self, stage: str) -> tuple[str, ...]:
        if stage == META:
            return (META_GRADIENTS,)
        if stage == FINETUNE:
            return (WEIGHTS,)
        raise ValueError(f"graphfl has no stage {stage!r}; its stages are {self.stages}")

    def upload_shapes(self, num_parameters: int, num_global_nodes: int, num_classes: int) -> dict[str, tuple[int, ...]]:
        """Both kinds are a flat parameter-sized vector plus the folded weight w_k."""
        return {META_GRADIENTS: (num_parameters + 1,), WEIGHTS: (num_parameters + 1,)}

    def build_model(self, num_features: int, num_classes: int) -> nn.Module:
        """The backbone: Kipf's 2-layer GCN, or SGC (``graphfl.backbone``)."""
        if self.settings.backbone == "sgc":
            return SGC(num_features, num_classes, self.settings.sgc_hops)
        training = self.config.training
        return GCN(num_features, training.hidden, num_classes, training.dropout)

    def evaluation_adjacency(self, graph: GraphTensors, broadcast: Broadcast) -> SparseOperator:
        return graph.adjacency(None, 0.0, False)

    # --- the client's side ------------------------------------------------------------------

    def support_query(self, trainer: LocalTrainer) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's support and query nodes: its truly labelled nodes halved at random (its own seeded
        stream); self-training's pseudo-labelled nodes join the support set only, as the authors' code extends
        its support groups: the query loss, which drives the meta step, stays on true labels."""
        key = trainer.client_id
        if key not in self._splits:
            graph = trainer.graph
            pseudo = graph.self_trained_mask
            labelled = graph.train_mask if pseudo is None else graph.train_mask & ~pseudo
            nodes = torch.nonzero(labelled, as_tuple=True)[0].cpu().numpy()
            rng = numpy_stream(self.config.seed, "graphfl", "support-query", key)
            support, query = support_query_split(nodes, self.settings.query_fraction, rng)
            support = torch.as_tensor(support, device=graph.device)
            if pseudo is not None:
                support = torch.sort(torch.cat([support, torch.nonzero(pseudo, as_tuple=True)[0]])).values
            self._splits[key] = (support, torch.as_tensor(query, device=graph.device))
        return self._splits[key]

    def adapt(
        self,
        model: nn.Module,
        graph: GraphTensors,
        adjacency: SparseOperator,
        nodes,
        generator,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """T_e steps on ``nodes`` with the configured inner optimiser (meta stage, fine-tuning, and the new
        label domain's fine-tuning). With ``inner_optimizer = "adam"`` and a client's own ``optimizer`` (its
        trainer's Adam, Kipf's weight decay, moments kept across rounds as every bank keeps them), the steps
        are that optimiser's; a fresh Adam restarts at sign-like steps each round and measured far worse in the
        non-IID setting. Otherwise (plain SGD, ``inner_state = "fresh"``, or no client optimiser) the steps are
        :func:`gradient_steps` at α on the support loss alone: no weight decay, since with Adam an L2 term on a
        weight no labelled node reaches becomes a step of ~α towards 0."""
        settings = self.settings
        own = settings.inner_state == "client" and optimizer is not None
        if settings.inner_optimizer == "adam" and own and nodes.numel() > 0:
            model.train()
            for _ in range(settings.inner_steps):
                optimizer.zero_grad(set_to_none=True)
                supervised_loss(model, graph, adjacency, nodes, generator).backward()
                optimizer.step()
            return
        gradient_steps(
            model,
            graph,
            adjacency,
            nodes,
            settings.inner_steps,
            settings.inner_learning_rate,
            generator,
            settings.inner_optimizer,
        )

    def stage_contribution(self, stage: str, trainer: LocalTrainer, broadcast: Broadcast) -> dict[str, torch.Tensor]:
        """``meta``: T_e support steps from θ_t, then the query gradient; ``finetune``: T_e support steps from θ̂_t."""
        support, query = self.support_query(trainer)
        model = trainer.model
        model.load_flat_parameters(broadcast.weights)
        weight = client_weight(trainer.num_nodes)
        if stage == META:
            gradient = self._meta_gradient(trainer, support, query)
            # a client without query nodes has no term in the meta objective: weight 0, or its zero gradient
            # would shrink ḡ by its share (most clients at 10 labels per class hold one node, support only)
            return {META_GRADIENTS: weights_term(weight if query.numel() > 0 else 0.0, gradient.cpu())}
        if stage == FINETUNE:
            self.adapt(model, trainer.graph, trainer.own_adjacency(), support, trainer.generator, trainer.optimizer)
            return {WEIGHTS: weights_term(weight, model.flat_parameters().cpu())}
        raise ValueError(f"graphfl has no stage {stage!r}; its stages are {self.stages}")

    def _meta_gradient(self, trainer: LocalTrainer, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The client's meta term from θ_t (loaded in its model): first-order, ∇L_q at the adapted parameters after
        T_e support steps; second-order, ∇_θ L_q(U(θ)) through those steps
        (:func:`~fedgl_secure.methods.maml.second_order_meta_gradient`). Either way the model is left adapted."""
        adjacency = trainer.own_adjacency()
        model, graph, generator = trainer.model, trainer.graph, trainer.generator
        settings = self.settings
        if settings.meta_order == 1:
            self.adapt(model, graph, adjacency, support, generator, trainer.optimizer)
            return loss_gradient(model, graph, adjacency, query, generator)
        gradient, adapted = second_order_meta_gradient(
            model,
            graph,
            adjacency,
            support,
            query,
            settings.inner_steps,
            settings.inner_learning_rate,
            generator,
            settings.inner_optimizer,
        )
        model.load_flat_parameters(adapted)
        return gradient

    # --- the server's side ------------------------------------------------------------------

    def stage_update(
        self, stage: str, sums: Mapping[str, torch.Tensor], round_number: int, broadcast: Broadcast
    ) -> Broadcast:
        """``meta``: θ̂_t from θ_t and the summed query gradients; ``finetune``: θ_{t+1} = FedAvg."""
        if stage == FINETUNE:
            return Broadcast(round_number, fedavg(*split_weights_sum(sums[WEIGHTS])))
        if stage != META:
            raise ValueError(f"graphfl has no stage {stage!r}; its stages are {self.stages}")
        gradient_sum, total = split_weights_sum(sums[META_GRADIENTS])
        theta = broadcast.weights.to(torch.float32)
        if total < NO_QUERY_WEIGHT:  # no sampled client holds query nodes: no meta step this round
            return Broadcast(round_number, theta)
        settings = self.settings
        if settings.meta_optimizer == "sgd":
            gradient_sum = gradient_sum + settings.meta_weight_decay * total * theta
            return Broadcast(round_number, meta_step(theta, gradient_sum, total, settings.meta_learning_rate))
        if self._meta_parameters is None:
            self._start_meta_optimizer(theta)
        with torch.no_grad():
            self._meta_parameters.copy_(theta)
        self._meta_parameters.grad = (gradient_sum / total).to(torch.float32)
        self._meta_optimizer.step()
        return Broadcast(round_number, self._meta_parameters.detach().clone())

    def _start_meta_optimizer(self, initial: torch.Tensor) -> None:
        """The server's Adam over θ (its moments persist across rounds: :meth:`server_state`)."""
        settings = self.settings
        self._meta_parameters = nn.Parameter(initial.to(torch.float32).clone())
        self._meta_optimizer = EagerAdam(
            [self._meta_parameters], lr=settings.meta_learning_rate, weight_decay=settings.meta_weight_decay
        )

    def server_state(self) -> dict[str, torch.Tensor]:
        """The meta optimiser's Adam state between rounds (empty before its first step, and with plain SGD)."""
        if self._meta_optimizer is None:
            return {}
        moments = self._meta_optimizer.state[self._meta_parameters]
        return {name: moments[name].detach().clone() for name in _ADAM_MOMENTS}

    def load_server_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore :meth:`server_state` (empty: no meta step taken yet)."""
        self._meta_parameters, self._meta_optimizer = None, None
        if not state:
            return
        self._start_meta_optimizer(torch.zeros_like(state["exp_avg"]))  # θ itself is set by each meta step
        self._meta_optimizer.state[self._meta_parameters] = {
            name: torch.as_tensor(state[name], dtype=torch.float32).clone() for name in _ADAM_MOMENTS
        }

    # --- the single-stage interface does not apply ------------------------------------------

    def client_contribution(self, trainer: LocalTrainer, broadcast: Broadcast, *, with_node_terms: bool = True):
        raise TypeError("graphfl has two stages per round; run it through methods.base.stage_contribution")

    def server_update(self, sums: Mapping[str, torch.Tensor], round_number: int) -> Broadcast:
        raise TypeError("graphfl has two stages per round; run it through methods.base.stage_update")
