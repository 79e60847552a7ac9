"""``benchmarks/units_table.py``: the docs' tables from a units-of-privacy run's JSON."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark


def units_table():
    return load_benchmark("units_table")


def row(unit: str, epsilon, method: str, accuracies: list[float], **extra) -> dict:
    runs = [{"seed": s, "accuracy": a, "best_round": 10 + s, **extra} for s, a in enumerate(accuracies)]
    return {"unit": unit, "epsilon": epsilon, "method": method, "runs": runs}


RESULTS = [
    row("none", "inf", "fedgl", [0.80, 0.82], mia_auc=0.70, mia_floor_auc=0.52),
    row("edge", 8.0, "fedgl", [0.78, 0.80], mia_auc=0.66, mia_floor_auc=0.52),
    row("edge", 1.0, "fedgl", [0.50, 0.60], mia_auc=0.60, mia_floor_auc=0.52),
    row("label", 8.0, "fedgl", [0.81, 0.79], mia_auc=0.68, mia_floor_auc=0.52),
]


def test_the_pivot_has_one_row_per_unit_with_the_no_dp_run_in_every_infinity_column():
    table = units_table().pivot_table(RESULTS, "accuracy").splitlines()
    assert table[0] == "| unit | method | ε = ∞ | ε = 8 | ε = 1 | seeds |"
    assert table[2] == "| edge | fedgl | 81.0 | 79.0 | 55.0 | 2 |"
    assert table[3] == "| label | fedgl | 81.0 | 80.0 | – | 2 |"  # no label row at ε = 1
    assert len(table) == 4


def test_the_rows_table_shows_each_seed_and_the_membership_floor():
    lines = units_table().rows_table(RESULTS).splitlines()
    assert lines[4] == "| edge | 1 | fedgl | **55.0** (50.0, 60.0) | 10, 11 | – | 0.600 | 0.520 | – |"


def test_a_file_that_is_not_a_units_run_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"rows": []}), encoding="utf-8")
    with pytest.raises(SystemExit):
        units_table().main([str(path)])
    assert f"{path}: not a privacy_utility.py --units output" in capsys.readouterr().err
