"""Ranking metrics for imbalanced labels (ROC-AUC, PR-AUC, recall at the top): hand-checked cases, and
every run reporting them (simulation, ``simulate`` summary and run record, the audit's run line)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.preprocessing import label_binarize
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.engine.metrics import (
    RankingMetrics,
    binary_ranking_metrics,
    class_scores,
    ranking_metrics,
    recall_at_top,
    top_count,
)

NAMES = ("roc_auc", "pr_auc", "recall_at_top")


def _binary(scores) -> np.ndarray:
    """Two-class probabilities with P(class 1) = ``scores``."""
    scores = np.asarray(scores, dtype=float)
    return np.stack([1.0 - scores, scores], axis=1)


def _all(n: int) -> np.ndarray:
    return np.ones(n, dtype=bool)


def test_perfect_ranking_scores_one_and_reversed_ranking_scores_zero():
    labels = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    scores = np.linspace(0.95, 0.05, 10)  # the two positives first
    perfect = ranking_metrics(_binary(scores), labels, _all(10), positive_class=1, top_fraction=0.2)
    assert perfect.roc_auc == 1.0 and perfect.pr_auc == 1.0 and perfect.recall_at_top == 1.0
    reversed_ = ranking_metrics(_binary(scores[::-1]), labels, _all(10), positive_class=1, top_fraction=0.2)
    assert reversed_.roc_auc == 0.0 and reversed_.recall_at_top == 0.0
    assert reversed_.pr_auc == pytest.approx((1 / 9 + 2 / 10) / 2)  # positives at ranks 9 and 10


def test_recall_at_top_by_hand():
    # 10 nodes, distinct scores; top 20 % = the 2 highest; positives ranked 1st, 5th and 8th: 1 of 3 found
    scores = np.array([10, 9, 8, 7, 6, 5, 4, 3, 2, 1], dtype=float)
    positive = np.zeros(10, dtype=bool)
    positive[[0, 4, 7]] = True
    assert recall_at_top(scores, positive, 0.2) == pytest.approx(1 / 3)
    assert recall_at_top(scores, positive, 0.5) == pytest.approx(2 / 3)  # top 5: ranks 1 and 5
    assert top_count(0.25, 10) == 3 and top_count(0.01, 300) == 3 and top_count(0.01, 50) == 1


def test_recall_at_top_shares_ties_at_the_cut_off_whatever_the_node_order():
    # k = ceil(0.3 · 10) = 3; two nodes above the 3rd score (0.5), one of them positive; four tied at 0.5, one
    # positive, sharing the one remaining place: (1 + 1/4) / 3 positives
    scores = np.array([0.9, 0.8, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1])
    positive = np.array([0, 1, 1, 0, 0, 0, 1, 0, 0, 0], dtype=bool)
    assert recall_at_top(scores, positive, 0.3) == pytest.approx(1.25 / 3)
    order = np.random.default_rng(0).permutation(10)
    assert recall_at_top(scores[order], positive[order], 0.3) == pytest.approx(1.25 / 3)
    assert recall_at_top(np.zeros(200), np.arange(200) < 10, 0.05) == pytest.approx(10 / 200)  # constant: k / n


def test_undefined_cases_give_nan_not_an_exception():
    outputs = _binary([0.9, 0.2, 0.7, 0.4])
    single_class = ranking_metrics(outputs, np.array([1, 1, 1, 1]), _all(4), positive_class=1)
    no_positive = ranking_metrics(outputs, np.array([0, 0, 0, 0]), _all(4), positive_class=1)
    empty = ranking_metrics(outputs, np.array([0, 1, 0, 1]), np.zeros(4, dtype=bool), positive_class=1)
    unlabelled = ranking_metrics(outputs, np.array([-1, -1, -1, -1]), _all(4))
    non_finite = ranking_metrics(_binary([0.9, np.nan, 0.7, 0.4]), np.array([0, 1, 0, 1]), _all(4))
    three = np.full((4, 3), 1 / 3)
    one_of_three = ranking_metrics(three, np.array([2, 2, 2, 2]), _all(4))  # macro: one class present
    none_of_three = ranking_metrics(three, np.array([2, 0, 1, 2]), np.zeros(4, dtype=bool))
    cases = (single_class, no_positive, empty, unlabelled, non_finite, one_of_three, none_of_three)
    for metrics in cases:
        assert all(math.isnan(getattr(metrics, name)) for name in NAMES)
        assert metrics.top_fraction == 0.01
    assert math.isnan(recall_at_top([0.3, 0.2], [False, False]))


def test_mask_and_unlabelled_nodes_select_the_nodes_and_two_classes_default_to_class_one():
    labels = np.array([1, 0, -1, 1, 0, 1])
    scores = np.array([0.9, 0.1, 0.99, 0.2, 0.8, 0.7])
    mask = np.array([True, True, True, False, True, True])  # node 2 unlabelled, node 3 outside the mask
    metrics = ranking_metrics(_binary(scores), labels, mask, top_fraction=0.25)
    kept = np.array([0, 1, 4, 5])
    assert metrics.roc_auc == pytest.approx(roc_auc_score(labels[kept], scores[kept]))
    assert metrics.pr_auc == pytest.approx(average_precision_score(labels[kept], scores[kept]))
    assert metrics.recall_at_top == pytest.approx(1 / 2)  # top 1 of 4: node 0, one of the two positives
    assert metrics == ranking_metrics(_binary(scores), labels, mask, positive_class=1, top_fraction=0.25)
    flipped = ranking_metrics(_binary(scores), labels, mask, positive_class=0, top_fraction=0.25)
    assert flipped.roc_auc == pytest.approx(roc_auc_score(labels[kept] == 0, 1 - scores[kept]))


def test_macro_one_vs_rest_agrees_with_scikit_learn_on_three_classes():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, size=60)
    logits = rng.normal(size=(60, 3)) + 1.5 * np.eye(3)[labels]
    probabilities = torch.softmax(torch.as_tensor(logits), dim=1).numpy()
    metrics = ranking_metrics(probabilities, labels, _all(60), top_fraction=0.1)
    assert metrics.roc_auc == pytest.approx(roc_auc_score(labels, probabilities, multi_class="ovr", average="macro"))
    onehot = label_binarize(labels, classes=[0, 1, 2])
    assert metrics.pr_auc == pytest.approx(average_precision_score(onehot, probabilities, average="macro"))
    per_class = [recall_at_top(probabilities[:, c], labels == c, 0.1) for c in range(3)]
    assert metrics.recall_at_top == pytest.approx(np.mean(per_class))
    # logits give the same numbers (log-odds rank like probabilities), torch or numpy alike
    logit_metrics = ranking_metrics(
        torch.as_tensor(logits), torch.as_tensor(labels), torch.ones(60, dtype=torch.bool), None, 0.1, from_logits=True
    )
    for name in NAMES:
        assert getattr(logit_metrics, name) == pytest.approx(getattr(metrics, name))


def test_macro_average_covers_only_the_classes_present_in_the_mask():
    rng = np.random.default_rng(5)
    probabilities = rng.dirichlet(np.ones(3), size=40)
    labels = np.where(np.arange(40) % 2 == 0, 0, 2)  # class 1 absent
    metrics = ranking_metrics(probabilities, labels, _all(40), top_fraction=0.1)
    per_class = [ranking_metrics(probabilities, labels, _all(40), c, 0.1) for c in (0, 2)]
    for name in NAMES:
        assert getattr(metrics, name) == pytest.approx(np.mean([getattr(m, name) for m in per_class]))
    assert per_class[0].roc_auc == pytest.approx(roc_auc_score(labels == 0, probabilities[:, 0]))


def test_log_odds_keep_confident_nodes_apart_where_probabilities_round_to_one():
    logits = np.array([[0.0, 40.0], [0.0, 45.0], [0.0, 50.0], [0.0, -1.0]])
    assert len(set(torch.softmax(torch.as_tensor(logits), dim=1)[:, 1].tolist())) < 4  # ties at exactly 1.0
    assert np.all(np.diff(class_scores(logits, 1, from_logits=True)[:3]) > 0)
    labels = np.array([0, 0, 1, 1])
    metrics = ranking_metrics(logits, labels, _all(4), top_fraction=0.25, from_logits=True)
    assert metrics.recall_at_top == 0.5  # node 2 alone tops the ranking, not a 3-way tie


def test_binary_metrics_and_dataclass():
    metrics = binary_ranking_metrics([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], top_fraction=0.5)
    assert metrics.roc_auc == pytest.approx(0.75) and metrics.recall_at_top == pytest.approx(0.5)
    assert metrics.to_dict() == {
        "roc_auc": metrics.roc_auc,
        "pr_auc": metrics.pr_auc,
        "recall_at_top": 0.5,
        "top_fraction": 0.5,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.roc_auc = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="top_fraction"):
        recall_at_top([0.1], [True], 0.0)
    assert RankingMetrics.undefined(0.05).top_fraction == 0.05


# --- every run reports them ------------------------------------------------------------------------------


def _in_unit_interval(metrics: dict) -> bool:
    return all(math.isfinite(metrics[name]) and 0.0 <= metrics[name] <= 1.0 for name in NAMES)


@pytest.mark.parametrize("method", ["fedgl", "centralized", "local"])
def test_a_short_run_reports_the_metrics_at_its_best_round(method):
    from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.simulation.experiment import run_experiment

    config = build_config({"method": method, "device": "cpu", "federation": {"max_rounds": 2}})
    result = run_experiment(config, synthetic_consortium(seed=0), progress=False)
    assert _in_unit_interval(result.global_test_metrics) and result.global_test_metrics["top_fraction"] == 0.01
    assert len(result.local_test_metrics) == result.num_clients == len(result.local_test_accuracy)
    assert all(_in_unit_interval(m) for m in result.local_test_metrics)
    best = result.history[result.best_round - 1]
    assert best.test_roc_auc == result.global_test_metrics["roc_auc"]
    assert best.test_pr_auc == result.global_test_metrics["pr_auc"]
    assert best.test_recall_at_top == result.global_test_metrics["recall_at_top"]
    assert result.to_dict()["history"][0]["test_roc_auc"] == result.history[0].test_roc_auc


def test_best_round_roc_auc_agrees_with_a_fresh_evaluation_of_its_weights():
    """Recomputed independently: the best round's W̄ on the merged graph, softmax, scikit-learn's macro OvR."""
    from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.methods import build_method
    from fedgl_secure.model.gcn import GCN
    from fedgl_secure.simulation.experiment import Federation, run_experiment

    config = build_config({"method": "fedgl", "device": "cpu", "federation": {"max_rounds": 12}})
    dataset = synthetic_consortium(seed=0)
    broadcasts = []
    result = run_experiment(config, dataset, progress=False, observer=broadcasts.append)
    best = broadcasts[result.best_round - 1]
    federation = Federation.build(dataset, config, torch.device("cpu"))
    model = GCN(federation.merged.features.shape[1], config.training.hidden, federation.merged.num_classes)
    model.load_flat_parameters(best.weights)
    model.eval()

    def roc_auc(graph) -> float:
        with torch.no_grad():
            logits = model(graph.features, build_method(config).evaluation_adjacency(graph, best)).logits
        mask = graph.test_mask & (graph.labels >= 0)
        probabilities = torch.softmax(logits[mask].double(), dim=1).numpy()
        return roc_auc_score(graph.labels[mask].numpy(), probabilities, multi_class="ovr", average="macro")

    assert result.global_test_metrics["roc_auc"] == pytest.approx(roc_auc(federation.merged), abs=1e-9)
    # the local goal (evaluated once, after the loop) is the best round's too, not the last round's
    assert result.best_round < result.rounds_run  # (seed 0: best 10 of 12), so the check below means something
    assert result.local_test_metrics[0]["roc_auc"] == pytest.approx(roc_auc(federation.client_graphs[0]), abs=1e-9)


def test_simulate_summary_and_run_record_carry_the_metrics(tmp_path):
    output = tmp_path / "run.json"
    args = ["simulate", "--rounds", "2", "--no-progress", "--device", "cpu", "--output", str(output)]
    completed = CliRunner().invoke(app, args)
    assert completed.exit_code == 0, completed.output
    summary = json.loads(completed.output.strip().splitlines()[-1])
    record = json.loads(output.read_text())
    assert _in_unit_interval(record["global_test_metrics"]) and len(record["local_test_metrics"]) == 6
    assert summary["global_test_metrics"] == {k: round(v, 4) for k, v in record["global_test_metrics"].items()}
    assert record["config"]["evaluation"] == {"positive_class": None, "top_fraction": 0.01, "selection": "accuracy"}


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("evaluation.top_fraction=2", "evaluation.top_fraction"),
        ("evaluation.top_fraction=0", "evaluation.top_fraction"),
        ("evaluation.positive_class=-1", "evaluation.positive_class"),
        ("evaluation.positive_class=4", "evaluation.positive_class"),  # the synthetic data has classes 0-3
        ("evaluation.recall_k=5", "evaluation.recall_k"),
    ],
)
def test_bad_evaluation_settings_are_refused_naming_the_field(assignment, fragment):
    completed = CliRunner().invoke(app, ["simulate", "--rounds", "1", "--no-progress", "--set", assignment])
    assert completed.exit_code == 2
    assert fragment in completed.output


def test_a_positive_class_scores_that_class_in_a_run():
    from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.simulation.experiment import run_experiment

    values = {"method": "federated", "device": "cpu", "federation": {"max_rounds": 1}}
    config = build_config({**values, "evaluation": {"positive_class": 3, "top_fraction": 0.05}})
    result = run_experiment(config, synthetic_consortium(seed=0), progress=False)
    assert _in_unit_interval(result.global_test_metrics) and result.global_test_metrics["top_fraction"] == 0.05
    macro = run_experiment(build_config(values), synthetic_consortium(seed=0), progress=False)
    assert result.global_test_accuracy == macro.global_test_accuracy  # same run, other metric
    assert result.global_test_metrics["roc_auc"] != macro.global_test_metrics["roc_auc"]


def test_the_audit_shows_the_metrics_or_not_recorded():
    from fedgl_secure.audit.run import NOT_RECORDED, recorded_ranking_metrics

    metrics = {"roc_auc": 0.91, "pr_auc": 0.4, "recall_at_top": 0.2, "top_fraction": 0.01}
    assert recorded_ranking_metrics({"global_test_metrics": metrics}) == {
        "global_test_roc_auc": 0.91,
        "global_test_pr_auc": 0.4,
        "global_test_recall_at_top": 0.2,
        "global_test_top_fraction": 0.01,
    }
    old = recorded_ranking_metrics({"global_test_accuracy": 0.8})  # a run record from before they were kept
    assert set(old.values()) == {NOT_RECORDED} and len(old) == 4
