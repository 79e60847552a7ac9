"""One institution's side of a round: local training from W̄ and inference for the uploads."""

from __future__ import annotations

import torch
from torch import nn

from fedgl_secure.engine.config import TrainingConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.minibatch import NeighborSampledTraining, layerwise_inference
from fedgl_secure.errors import ConfigError
from fedgl_secure.model.backbones import build_backbone
from fedgl_secure.model.eager_adam import EagerAdam
from fedgl_secure.model.gcn import GCN, GCNOutput
from fedgl_secure.model.losses import balanced_class_weights, fedgl_loss, proximal_term
from fedgl_secure.model.sparse import SparseOperator
from fedgl_secure.seeding import torch_stream


class LocalTrainer:
    """A client's model, optimiser and private random stream.

    The optimiser state persists across rounds by default (each bank keeps its own Adam
    moments); the parameters are overwritten with W̄ at the start of every round.
    ``private_training`` (set by a DP policy with ``[dp.sgd]``, see
    :class:`~fedgl_secure.privacy.dp_sgd.NodeDPSGD`) replaces the full-batch steps with DP-SGD steps;
    ``training.batch_size`` replaces them with neighbour-sampled mini-batches and inference with the layer-wise
    kind (:mod:`fedgl_secure.engine.minibatch`).
    """

    def __init__(
        self, client_id: int, graph: GraphTensors, config: TrainingConfig, seed: int, model: nn.Module | None = None
    ) -> None:
        self.client_id = client_id
        self.graph = graph
        self.config = config
        # the method's backbone when it brings one (e.g. GraphFL's SGC), else the engine's (training.backbone)
        model = model or build_backbone(config, graph.features.shape[1], graph.num_classes)
        self.model = model.to(graph.device)
        self.generator = torch_stream(seed, "client", client_id, "dropout", device=graph.device)
        self.optimizer = self._new_optimizer()
        self.private_training = None
        self.mini_batches = None
        if config.batch_size is not None:
            if type(self.model) is not GCN:
                raise ConfigError(
                    f"training.batch_size: mini-batch training samples the 2-layer GCN's neighbourhoods; this "
                    f"method trains a {type(self.model).__name__} (leave batch_size unset)"
                )
            self.mini_batches = NeighborSampledTraining(self, seed)
        self._own_adjacency: tuple[GraphTensors, SparseOperator] | None = None
        # from the bank's own training labels: a local statistic that never leaves it
        self.class_weights = (
            balanced_class_weights(graph.labels, graph.train_mask, graph.num_classes)
            if config.class_weighting == "balanced"
            else None
        )

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return EagerAdam(
            [
                {"params": self.model.first_layer_parameters(), "weight_decay": self.config.weight_decay},
                {"params": self.model.second_layer_parameters(), "weight_decay": 0.0},
            ],
            lr=self.config.learning_rate,
        )

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def own_adjacency(self) -> SparseOperator:
        """Â of the bank's own graph, without the pseudo graph; built once per graph (it does not change)."""
        if self._own_adjacency is None or self._own_adjacency[0] is not self.graph:
            self._own_adjacency = (self.graph, self.graph.adjacency(None, 0.0, False))
        return self._own_adjacency[1]

    def train(
        self,
        adjacency: SparseOperator,
        start_parameters: torch.Tensor | None,
        pseudo_labels: torch.Tensor | None = None,
        alpha: float = 0.0,
        proximal_mu: float = 0.0,
        epochs: int | None = None,
    ) -> float:
        """E local epochs of (full- or mini-batch) Adam on Eq. 8 (plus FedProx's term when ``proximal_mu > 0``).

        Starts from ``start_parameters`` (W̄) when given, else continues from the current model
        (the Local and Centralized baselines). Returns the last epoch's loss.
        """
        if start_parameters is not None:
            self.model.load_flat_parameters(start_parameters)
        if self.config.reset_optimizer_each_round:
            self.optimizer = self._new_optimizer()
        if self.private_training is not None:
            if self.mini_batches is not None:
                raise ConfigError("training.batch_size: DP-SGD ([dp.sgd]) draws its own batches; leave it unset")
            return self.private_training.train(
                self, adjacency, pseudo_labels, alpha, proximal_mu, epochs or self.config.local_epochs
            )
        if not bool(self.graph.train_mask.any()) and (pseudo_labels is None or alpha == 0.0):
            # no labelled node (e.g. a subgraph client of GraphFL's overlap variant): nothing to fit. The mean
            # cross-entropy over no nodes is nan with a zero gradient, so the epochs would apply only the L2 weight
            # decay, which Adam turns into steps of ~lr towards 0; the client keeps W̄, as GraphFL's steps do
            return 0.0
        if self.mini_batches is not None:
            return self.mini_batches.train(
                adjacency, pseudo_labels, alpha, proximal_mu, epochs or self.config.local_epochs
            )
        anchor = [p.detach().clone() for p in self.model.parameters()] if proximal_mu > 0 else None
        self.model.train()
        loss = torch.zeros(())
        for _ in range(epochs or self.config.local_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            output = self.model(self.graph.features, adjacency, self.generator)
            loss = fedgl_loss(
                output.logits, self.graph.labels, self.graph.train_mask, pseudo_labels, alpha, self.class_weights
            )
            if anchor is not None:
                loss = loss + proximal_term(list(self.model.parameters()), anchor, proximal_mu)
            loss.backward()
            self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def infer(self, adjacency: SparseOperator) -> GCNOutput:
        """Eval-mode forward pass with the current local model (the P_k, H_k of a round)."""
        self.model.eval()
        if self.mini_batches is not None:
            return layerwise_inference(self.model, self.graph.features, adjacency, self.config.inference_rows)
        return self.model(self.graph.features, adjacency)
