"""Which round is "best" (the final model): validation accuracy, or validation PR-AUC for imbalanced labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedgl_secure.consortium.aggregator_store import AggregatorStore, best_report, validation_scores
from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.data.sources.bank_graph import load_bank_data
from fedgl_secure.data.sources.declaration import FileSource
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.score_histograms import NUM_BINS
from fedgl_secure.errors import ConfigError
from fedgl_secure.simulation.experiment import run_experiment


@pytest.fixture(scope="module")
def bank_graphs(tmp_path_factory):
    out = tmp_path_factory.mktemp("banks")
    synthesize_banks(out, banks=3, customers=400, seed=1)
    schema = synthetic_bank_schema()
    return [
        load_bank_data(
            FileSource(
                kind="files",
                customers=out / bank / "customers.parquet",
                transactions=out / bank / "transactions.parquet",
            ),
            schema,
            name=bank,
        ).graph
        for bank in ("bank-a", "bank-b", "bank-c")
    ]


def _config(selection: str, rounds: int = 8):
    return build_config(
        {
            "dataset": "bank-sources",
            "method": "fedgl-no-gpg",
            "device": "cpu",
            "training": {"normalize_features": False},
            "federation": {"proportions": [1.0, 1.0, 1.0], "max_rounds": rounds, "patience": rounds + 5},
            "evaluation": {"positive_class": 1, "selection": selection},
        }
    )


def _first_argmax(values: list[float]) -> int:
    finite = [v if not math.isnan(v) else -math.inf for v in values]
    return finite.index(max(finite))


@pytest.mark.parametrize(("selection", "field"), [("pr_auc", "val_pr_auc"), ("accuracy", "val_accuracy")])
def test_the_best_round_is_the_best_by_the_chosen_validation_metric(bank_graphs, selection, field):
    result = run_experiment(_config(selection), clients=bank_graphs, progress=False)
    values = [getattr(record, field) for record in result.history]
    assert result.best_round == result.history[_first_argmax(values)].round
    assert all(record.val_pr_auc is not None for record in result.history)


def test_pr_auc_selection_needs_a_ranked_class():
    config = build_config({"dataset": "synthetic", "evaluation": {"selection": "pr_auc"}})
    with pytest.raises(ConfigError, match="evaluation.selection"):
        run_experiment(config, progress=False)


def test_the_aggregator_picks_the_final_model_by_pooled_validation_pr_auc(tmp_path):
    store = AggregatorStore(tmp_path / "aggregator.sqlite3")
    positives_low, positives_high = np.zeros((4, NUM_BINS), np.int64), np.zeros((4, NUM_BINS), np.int64)
    # version 1: the 3 positives score at the bottom (PR-AUC low); version 2: at the top (PR-AUC 1)
    for histograms, positive_bin in ((positives_low, 0), (positives_high, NUM_BINS - 1)):
        histograms[0, NUM_BINS // 2] = 97  # validation negatives
        histograms[1, positive_bin] = 3  # validation positives
        histograms[2, NUM_BINS // 2], histograms[3, positive_bin] = 97, 3
    store.save_report(1, "bank-a", (97, 100, 97, 100), positives_low)  # "everybody good": 97 % accurate
    store.save_report(2, "bank-a", (90, 100, 90, 100), positives_high)
    reports = store.pooled_reports()
    assert best_report(reports, scores=validation_scores(store, reports, "accuracy"))[0] == 1
    pr_auc = validation_scores(store, reports, "pr_auc")
    assert pr_auc[2] == pytest.approx(1.0) and pr_auc[1] < 0.1
    assert best_report(reports, scores=pr_auc)[0] == 2
    store.close()
