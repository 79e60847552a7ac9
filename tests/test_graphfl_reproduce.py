"""``reproduce graphfl --non-iid-methods``: which non-IID columns run, and the summary shows only those."""

from __future__ import annotations

import inspect
import json

import pytest
from typer.testing import CliRunner

from fedgl_secure import cli
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.errors import ConfigError
from fedgl_secure.simulation import graphfl_experiments
from fedgl_secure.simulation.graphfl_experiments import (
    NON_IID_METHODS,
    non_iid_columns,
    reproduction_jobs,
    run_graphfl_reproduction,
    undrawable,
)

WITHOUT_SELF_TRAINING = ("local", "federated", "graphfl", "centralized")


@pytest.fixture(scope="module")
def dataset():
    """1,700 nodes in 4 classes leave ~50 per class outside the 1,000 test and 500 validation nodes: 10 labels per
    class can be drawn, 100 cannot."""
    return synthetic_consortium(seed=0, num_nodes=1700, num_features=40)


def test_the_asked_columns_come_back_in_table_order_once_each():
    assert non_iid_columns(["centralized", "graphfl", "local", "federated", "graphfl"]) == WITHOUT_SELF_TRAINING
    assert non_iid_columns(list(reversed(NON_IID_METHODS))) == NON_IID_METHODS


@pytest.mark.parametrize("names", [["local", "fl"], ["GraphFL"], ["graphfl+ST"], []])
def test_an_unknown_or_empty_column_list_is_refused_naming_the_allowed_ones(names):
    with pytest.raises(ConfigError, match="--non-iid-methods") as refused:
        non_iid_columns(names)
    message = str(refused.value)
    assert all(method in message for method in NON_IID_METHODS)
    assert all(repr(name) in message for name in names if name not in NON_IID_METHODS)


def test_the_job_list_holds_only_the_asked_non_iid_columns():
    jobs = reproduction_jobs(["cora", "citeseer"], 2, ["non-iid"], [40, 80], ["gcn"], WITHOUT_SELF_TRAINING)
    assert {variant for _, _, _, variant, _ in jobs} == set(WITHOUT_SELF_TRAINING)
    assert len(jobs) == 2 * 2 * 2 * len(WITHOUT_SELF_TRAINING)  # datasets x seeds x label counts x columns
    assert {(name, seed, lpc) for _, name, seed, _, lpc in jobs} == {
        (name, seed, lpc) for name in ("cora", "citeseer") for seed in (0, 1) for lpc in (40, 80)
    }
    everything = reproduction_jobs(["cora"], 1, ["non-iid", "self-training"], [10], ["gcn"])
    assert [variant for part, *_, variant, _ in everything if part == "non-iid"] == list(NON_IID_METHODS)
    assert sum(part == "self-training" for part, *_ in everything) == 1


def test_the_command_runs_and_reports_only_the_asked_columns(tmp_path, monkeypatch, dataset):
    """The wiring, with every cell stubbed (no training): only the asked variants are computed, and the markdown
    header and the JSON name those columns and no other."""
    computed = []

    def fake_cell(runs, dataset, variant, lpc, seed, overrides):
        computed.append((variant, lpc, seed))
        return {"test": 0.5, "val": 0.5, "best_round": 1}

    monkeypatch.setattr(graphfl_experiments, "load_dataset", lambda name, root, seed: dataset)
    monkeypatch.setattr(graphfl_experiments, "cached_non_iid_cell", fake_cell)
    asked = ("federated", "graphfl")
    run_graphfl_reproduction(["cora"], 1, tmp_path, None, {}, ["non-iid"], [10], non_iid_methods=asked)
    assert sorted(computed) == [("federated", 10, 0), ("graphfl", 10, 0)]
    header = next(line for line in (tmp_path / "graphfl.md").read_text().splitlines() if "labels per class |" in line)
    assert header == "| dataset | labels per class | FL | GraphFL |"
    report = json.loads((tmp_path / "graphfl.json").read_text())
    assert report["non_iid_methods"] == list(asked)
    assert sorted(report["summary"]["non_iid"]) == ["cora/10/federated", "cora/10/graphfl"]
    assert report["not_drawn"] == []


def test_the_cli_refuses_a_bad_column_before_running_and_defaults_to_every_column(tmp_path):
    args = ["reproduce", "graphfl", "--parts", "non-iid", "--non-iid-methods", "local,fedavg"]
    result = CliRunner().invoke(cli.app, [*args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "'fedavg'" in result.output and "graphfl+st" in result.output
    assert not (tmp_path / "graphfl.md").exists()
    default = inspect.signature(cli.reproduce_graphfl).parameters["non_iid_methods"].default
    assert tuple(default.split(",")) == NON_IID_METHODS


def test_a_seed_whose_split_cannot_be_drawn_is_skipped_and_named(tmp_path, monkeypatch, dataset):
    """A cell whose clients cannot be drawn is skipped (not run, not summarised) and named in the JSON and the
    markdown; the drawable cells still run."""
    assert undrawable(dataset, 10, 0) is None
    assert "labels_per_class = 100" in undrawable(dataset, 100, 0)
    computed = []

    def fake_cell(runs, data, variant, lpc, seed, overrides):
        computed.append((variant, lpc))
        return {"test": 0.5, "val": 0.5, "best_round": 1}

    monkeypatch.setattr(graphfl_experiments, "load_dataset", lambda name, root, seed: dataset)
    monkeypatch.setattr(graphfl_experiments, "cached_non_iid_cell", fake_cell)
    run_graphfl_reproduction(["cora"], 1, tmp_path, None, {}, ["non-iid"], [10, 100], non_iid_methods=["graphfl"])
    assert computed == [("graphfl", 10)]
    report = json.loads((tmp_path / "graphfl.json").read_text())
    assert report["not_drawn"] == [{"part": "non-iid", "dataset": "cora", "seed": 0, "variant": "graphfl", "lpc": 100}]
    assert list(report["summary"]["non_iid"]) == ["cora/10/graphfl"]
    assert "* non-iid cora at 100 labels per class: seeds 0" in (tmp_path / "graphfl.md").read_text()
