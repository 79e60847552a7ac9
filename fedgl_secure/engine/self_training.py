"""Self-training (GraphFL §4.3): each client labels its most confident unlabelled nodes, n per class.

Before federated training every client trains its own model on its labelled nodes alone (nothing leaves the
client), labels, for every class, the n unlabelled nodes that model predicts as that class with the highest
probability, and trains on them afterwards as if labelled (``self_training.per_class``; FedAvg and GraphFL).

Where the paper is silent we follow the authors' code (``selftraining`` in their ``utils_gnn.py``): the
pseudo label is the model's arg-max, the n per class are the most confident nodes predicted as that class,
a client's own labelled nodes are never candidates, and the picked nodes extend GraphFL's *support* set
(``user_groups``), not its query set. We differ in two places: validation and test nodes are never candidates
(theirs are: their code excludes only the client's labelled nodes), and each client's model is its own,
trained from the run's initial weights (theirs is one model trained client after client, so the model
that labels client k has seen the labels of clients 0..k-1, which no bank could do).
"""

from __future__ import annotations

import dataclasses

import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig, TrainingConfig
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.errors import ConfigError


def most_confident_per_class(
    probabilities: torch.Tensor, candidates: torch.Tensor, per_class: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(nodes, pseudo labels): for every class c, the ``per_class`` candidate nodes predicted as c whose
    probability of c is highest (fewer when fewer candidates are predicted as c).

    ``probabilities``: N x C softmax rows; ``candidates``: N bool (the client's unlabelled nodes).
    Ties are broken by the lower node index, so the choice does not depend on the sort's stability.
    Nodes come back grouped by class, each group in decreasing confidence.
    """
    if per_class < 0:
        raise ValueError(f"per_class = {per_class}: must be >= 0")
    confidence, predicted = probabilities.max(dim=1)
    nodes, labels = [], []
    for c in range(probabilities.shape[1]):
        pool = torch.nonzero(candidates & (predicted == c), as_tuple=True)[0]
        if pool.numel() == 0 or per_class == 0:
            continue
        # sort by index first, then stably by confidence: equal confidences keep the lower index first
        order = torch.sort(confidence[pool], descending=True, stable=True).indices
        chosen = pool[order[:per_class]]
        nodes.append(chosen)
        labels.append(torch.full_like(chosen, c))
    if not nodes:
        empty = torch.zeros(0, dtype=torch.int64, device=probabilities.device)
        return empty, empty.clone()
    return torch.cat(nodes), torch.cat(labels)


def candidate_nodes(graph: GraphTensors) -> torch.Tensor:
    """The nodes a client may pseudo-label: neither its labelled nodes nor any validation or test node."""
    return ~(graph.train_mask | graph.val_mask | graph.test_mask)


def local_class_probabilities(
    graph: GraphTensors, training: TrainingConfig, start: torch.Tensor, epochs: int, seed: int, client_id: int
) -> torch.Tensor:
    """N x C softmax of the client's own model (the engine's backbone) after ``epochs`` full-batch Adam epochs
    on its labelled nodes from ``start``. The trainer is a throw-away one, so the federated run's trainer
    starts with fresh Adam moments whether or not the client self-trained."""
    trainer = LocalTrainer(client_id, graph, training, seed)
    adjacency = trainer.own_adjacency()
    trainer.train(adjacency, start, epochs=epochs)
    return torch.softmax(trainer.infer(adjacency).logits, dim=1)


def with_pseudo_labels(graph: GraphTensors, nodes: torch.Tensor, labels: torch.Tensor) -> GraphTensors:
    """``graph`` with ``nodes`` labelled ``labels`` (the local model's predictions) and added to its training
    nodes; ``self_trained_mask`` marks them, so a method can tell them from the true labels (GraphFL puts them
    in the support set only). Refuses a node that is labelled already, or a validation or test node."""
    if not bool(candidate_nodes(graph)[nodes].all()):
        raise ValueError("self-training: a pseudo-labelled node is a labelled, validation or test node")
    new_labels = graph.labels.clone()
    new_labels[nodes] = labels.to(new_labels.dtype)
    marked = torch.zeros_like(graph.train_mask)
    marked[nodes] = True
    return dataclasses.replace(graph, labels=new_labels, train_mask=graph.train_mask | marked, self_trained_mask=marked)


def self_trained_graphs(
    config: ExperimentConfig, graphs: list[GraphTensors], start: torch.Tensor, client_ids: list[int] | None = None
) -> list[GraphTensors]:
    """Every client's graph with its ``self_training.per_class`` most confident pseudo labels per class added,
    from its own model (the engine's backbone at ``self_training``'s learning rate, weight decay and epochs,
    from ``start``); the same for every method, so FedAvg and GraphFL train on the same pseudo labels.
    ``client_ids``: the clients' numbers, whose random streams their models draw from (default 0, 1, ...; a
    Ray actor holding some of the banks passes theirs)."""
    settings = config.self_training
    training = config.training.model_copy(
        update={"learning_rate": settings.learning_rate, "weight_decay": settings.weight_decay}
    )
    enlarged = []
    for k, graph in zip(range(len(graphs)) if client_ids is None else client_ids, graphs, strict=True):
        probabilities = local_class_probabilities(graph, training, start, settings.epochs, config.seed, k)
        nodes, labels = most_confident_per_class(probabilities, candidate_nodes(graph), settings.per_class)
        enlarged.append(with_pseudo_labels(graph, nodes, labels))
    return enlarged


def check_services(config: ExperimentConfig) -> None:
    """The consortium services do not self-train: refuse the option there rather than ignore it silently."""
    if config.self_training.per_class > 0:
        raise ConfigError(
            "self_training.per_class: the consortium services do not self-train; it runs only in the in-process "
            "simulation (fedgl-secure simulate / reproduce graphfl)"
        )
