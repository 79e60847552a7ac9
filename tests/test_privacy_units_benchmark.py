"""``benchmarks/privacy_utility.py --units … --consortium``: the units-of-privacy table on banks' own tables
(the bank-like benchmark), with ROC-AUC and PR-AUC beside accuracy (issue 10, deliverable 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import consortium_bank_graphs
from fedgl_secure.simulation.experiment import Federation

BANKS = ("bank-a", "bank-b", "bank-c")  # three banks: the default quorum


def benchmark_module():
    return load_benchmark("privacy_utility")


@pytest.fixture(scope="module")
def bank_consortium(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bank-units")
    synthesize_banks(root / "bank-data", banks=len(BANKS), customers=300, seed=1, fmt="parquet")
    return write_loopback_consortium(
        root,
        banks=BANKS,
        experiment={
            "method": "fedgl",
            "seed": 0,
            "device": "cpu",
            "federation": {"max_rounds": 1, "patience": 1},
            "self_supervision": {"neighbors": 5, "embedding": "hidden"},
        },
        schema=synthetic_bank_schema().model_dump(mode="json", exclude_none=True),
        bank_data={
            bank: {
                "kind": "files",
                "customers": str(root / "bank-data" / bank / "customers.parquet"),
                "transactions": str(root / "bank-data" / bank / "transactions.parquet"),
            }
            for bank in BANKS
        },
    )


def test_the_units_table_runs_on_the_banks_own_tables_and_reports_roc_auc(bank_consortium, tmp_path):
    output = tmp_path / "units.json"
    argv = ["--consortium", str(bank_consortium), "--units", "edge,mlp", "--methods", "fedgl"]
    argv += ["--epsilons", "inf,4", "--seeds", "1", "--rounds", "2", "--output", str(output)]
    assert benchmark_module().main(argv) == 0
    table = json.loads(output.read_text(encoding="utf-8"))
    assert table["complete"] and table["dataset"] == str(bank_consortium)
    rows = {(row["unit"], row["method"]): row for row in table["results"]}
    assert set(rows) == {("none", "fedgl"), ("edge", "fedgl"), ("mlp", "centralized")}
    for row in rows.values():
        (run,) = row["runs"]
        assert 0.0 <= run["roc_auc"] <= 1.0 and 0.0 < run["pr_auc"] <= 1.0
        assert row["roc_auc_mean"] == run["roc_auc"] and row["pr_auc_mean"] == run["pr_auc"]
    private, plain = rows[("edge", "fedgl")]["runs"][0], rows[("none", "fedgl")]["runs"][0]
    assert private["epsilon_spent_max_bank"] == pytest.approx(4.0)  # one release at the source, paid once
    assert plain["epsilon_spent_max_bank"] is None
    # the consortium's [experiment] applies, with the row's rounds: two rounds, the pseudo graph attacked
    assert private["rounds_run"] == plain["rounds_run"] == 2
    assert private["link_auc"] is not None and plain["link_auc"] is not None
    # membership inference attacked the banks' merged customers (balanced: as many members as test customers)
    consortium, banks = consortium_bank_graphs(bank_consortium)
    merged = Federation.from_clients(
        [b.graph for b in banks], consortium.experiment_config(), torch.device("cpu")
    ).merged
    expected = min(int(merged.train_mask.sum()), int(merged.test_mask.sum()))
    assert private["mia_members"] == plain["mia_members"] == expected
    # the attack floor: the same attack on the untrained W₀ of the same seed, so the same for both rows
    assert 0.0 <= plain["mia_floor_auc"] <= 1.0
    assert private["mia_floor_auc"] == plain["mia_floor_auc"]
    assert rows[("none", "fedgl")]["mia_floor_auc_mean"] == plain["mia_floor_auc"]


def test_the_consortium_option_is_refused_outside_the_units_table(bank_consortium, tmp_path, capsys):
    with pytest.raises(SystemExit):
        benchmark_module().main(["--consortium", str(bank_consortium), "--output", str(tmp_path / "x.json")])
    assert "--consortium: only with --units" in capsys.readouterr().err
