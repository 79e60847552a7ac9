"""The baselines of DESIGN §4 that train without a federation: one model on the merged client graph
(``centralized``) and each client alone (``local``). They release nothing; the registry names them
(``fedgl_secure/method_registry.py``) and the simulation runs them with the federated methods' run record.
"""

from __future__ import annotations

import time

import torch

from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import EarlyStopping, evaluate_model, ratio, split_ranking
from fedgl_secure.engine.graph_tensors import accuracy
from fedgl_secure.engine.metrics import RankingMetrics
from fedgl_secure.engine.round_pipeline import initial_parameters
from fedgl_secure.simulation.experiment import (
    Federation,
    RoundRecord,
    RunResult,
    keep_if_best,
    new_result,
    record_local_goal,
    round_bar,
    round_record,
)


def run_centralized(config: ExperimentConfig, federation: Federation, progress: bool) -> RunResult:
    """One model (``training.backbone``) on the merged client graph; a "round" is E epochs (comparable schedules)."""
    merged = federation.merged
    trainer = LocalTrainer(-1, merged, config.training, config.seed)
    trainer.model.load_flat_parameters(initial_parameters(config, merged.features.shape[1], merged.num_classes))
    adjacency = merged.adjacency(None, 0.0, False)
    client_adjacencies = [graph.adjacency(None, 0.0, False) for graph in federation.client_graphs]
    stopper = EarlyStopping(config.federation.patience)
    result = new_result(config, federation)
    best_weights: torch.Tensor | None = None
    bar = round_bar(config, progress)
    for round_number in bar:
        round_started = time.perf_counter()
        trainer.train(adjacency, None)
        scores = evaluate_model(trainer.model, merged, adjacency, config.evaluation)
        result.history.append(round_record(round_number, [], scores, time.perf_counter() - round_started))
        result.rounds_run = round_number
        if keep_if_best(result, stopper, round_number, scores, config):
            best_weights = trainer.model.flat_parameters()
        bar.set_postfix(val=f"{scores.val:.3f}", test=f"{scores.test:.3f}", best=result.best_round)
        if stopper.should_stop(round_number):
            break
    if best_weights is not None:  # the local goal, once, with the best round's model
        trainer.model.load_flat_parameters(best_weights)
        record_local_goal(
            result,
            [
                evaluate_model(trainer.model, graph, adj, config.evaluation, val_ranking=False)
                for graph, adj in zip(federation.client_graphs, client_adjacencies, strict=True)
            ],
        )
    return result


def _ranking_of_all(logits: torch.Tensor, labels: torch.Tensor, config: ExperimentConfig) -> RankingMetrics:
    return split_ranking(logits, labels, torch.ones_like(labels, dtype=torch.bool), config.evaluation)


def run_local(config: ExperimentConfig, federation: Federation, progress: bool) -> RunResult:
    """Each client alone. Its global score pools every (client, own test node) prediction,
    because there is no global model; model selection uses the pooled validation accuracy (or PR-AUC).
    The pooled ranking metrics rank the clients' scores together, each from its own model."""
    graphs = federation.client_graphs
    start = initial_parameters(config, graphs[0].features.shape[1], graphs[0].num_classes)
    trainers = [LocalTrainer(k, graph, config.training, config.seed) for k, graph in enumerate(graphs)]
    for trainer in trainers:
        trainer.model.load_flat_parameters(start)
    adjacencies = [graph.adjacency(None, 0.0, False) for graph in graphs]
    stopper = EarlyStopping(config.federation.patience)
    result = new_result(config, federation)
    best_own_tests: list[tuple[torch.Tensor, torch.Tensor]] = []
    bar = round_bar(config, progress)
    for round_number in bar:
        round_started = time.perf_counter()
        val_counts, test_counts, local_tests = [0, 0], [0, 0], []
        own_tests, own_vals = [], []  # (logits, labels) at each client's own test / validation nodes
        for trainer, adjacency in zip(trainers, adjacencies, strict=True):
            trainer.train(adjacency, None)
            trainer.model.eval()
            with torch.no_grad():
                logits = trainer.model(trainer.graph.features, adjacency).logits
            for counts, mask in (
                (val_counts, trainer.graph.val_mask),
                (test_counts, trainer.graph.test_mask),
            ):
                correct, total = accuracy(logits, trainer.graph.labels, mask)
                counts[0] += correct
                counts[1] += total
            local_tests.append(ratio(*accuracy(logits, trainer.graph.labels, trainer.graph.test_mask)))
            own_tests.append((logits[trainer.graph.test_mask], trainer.graph.labels[trainer.graph.test_mask]))
            own_vals.append((logits[trainer.graph.val_mask], trainer.graph.labels[trainer.graph.val_mask]))
        val, test = ratio(*val_counts), ratio(*test_counts)
        pooled = _ranking_of_all(*(torch.cat(parts) for parts in zip(*own_tests, strict=True)), config)
        record = RoundRecord(round_number, list(range(len(trainers))), val, test, time.perf_counter() - round_started)
        record.set_ranking(pooled)
        result.history.append(record)
        result.rounds_run = round_number
        record.val_pr_auc = _ranking_of_all(*(torch.cat(parts) for parts in zip(*own_vals, strict=True)), config).pr_auc
        if stopper.update(round_number, val if config.evaluation.selection == "accuracy" else record.val_pr_auc):
            result.best_round, result.best_val_accuracy, result.global_test_accuracy = round_number, val, test
            result.local_test_accuracy = local_tests
            result.global_test_metrics, best_own_tests = pooled.to_dict(), own_tests
        bar.set_postfix(val=f"{val:.3f}", test=f"{test:.3f}", best=result.best_round)
        if stopper.should_stop(round_number):
            break
    result.local_test_metrics = [_ranking_of_all(*own, config).to_dict() for own in best_own_tests]
    return result
