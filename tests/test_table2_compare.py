"""``benchmarks/table2_compare.py``: a Table 2 run against another, cell by cell, within the reference's seed spread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[1]


def cell(accuracies: list[float], seeds: list[int] | None = None) -> dict:
    return {"seeds": seeds or list(range(len(accuracies))), "global_test_accuracy": accuracies}


REFERENCE = {"cora": {"federated": cell([0.80, 0.81, 0.79]), "fedgl": cell([0.82, 0.83, 0.81])}}


def test_a_cell_inside_the_seed_range_is_within_and_one_outside_is_named():
    compare = load_benchmark("table2_compare").compare
    candidate = {"cora": {"federated": cell([0.805, 0.80, 0.795]), "fedgl": cell([0.70, 0.71, 0.72], [0, 1, 3])}}
    result = compare(REFERENCE, candidate)
    federated, fedgl = result["cells"]["cora"]["federated"], result["cells"]["cora"]["fedgl"]
    assert federated["within_seed_range"] and federated["same_seeds"]
    assert federated["difference"] == pytest.approx(0.0, abs=1e-9)
    assert not fedgl["within_seed_range"] and not fedgl["within_two_std"] and not fedgl["same_seeds"]
    assert fedgl["difference"] == pytest.approx(-0.11)
    assert result["outside"] == ["cora/fedgl"] and not result["all_within"] and result["compared"] == 2


def test_cells_only_one_table_holds_are_not_compared():
    compare = load_benchmark("table2_compare").compare
    result = compare(REFERENCE, {"cora": {"local": cell([0.6])}, "wiki": {"fedgl": cell([0.7])}})
    assert result["compared"] == 0 and result["cells"] == {"cora": {}}


def test_the_command_exits_non_zero_naming_the_cells_outside(tmp_path):
    reference, candidate = tmp_path / "reference.json", tmp_path / "candidate.json"
    reference.write_text(json.dumps(REFERENCE))
    candidate.write_text(json.dumps({"cora": {"fedgl": cell([0.5, 0.5, 0.5])}}))
    output = tmp_path / "compare.json"
    command = [sys.executable, str(REPO / "benchmarks/table2_compare.py"), str(reference), str(candidate)]
    finished = subprocess.run([*command, "--output", str(output)], capture_output=True, text=True)
    assert finished.returncode != 0 and "cora/fedgl" in finished.stderr
    assert json.loads(output.read_text())["outside"] == ["cora/fedgl"]


def test_reference_cells_replace_the_reference_and_name_their_file(tmp_path):
    """A cell run again under changed settings replaces the reference's; the others stay, each naming its file."""
    reference, rerun, candidate = tmp_path / "reference.json", tmp_path / "rerun.json", tmp_path / "candidate.json"
    reference.write_text(json.dumps(REFERENCE))
    rerun.write_text(json.dumps({"cora": {"fedgl": cell([0.70, 0.72, 0.71])}}))
    candidate.write_text(json.dumps({"cora": {"federated": cell([0.80]), "fedgl": cell([0.71])}}))
    output = tmp_path / "compare.json"
    command = [sys.executable, str(REPO / "benchmarks/table2_compare.py"), str(reference), str(candidate)]
    finished = subprocess.run(
        [*command, "--reference-cells", str(rerun), "--output", str(output)], capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr
    record = json.loads(output.read_text())
    federated, fedgl = record["cells"]["cora"]["federated"], record["cells"]["cora"]["fedgl"]
    assert fedgl["reference_mean"] == pytest.approx(0.71) and fedgl["reference_file"] == str(rerun)
    assert federated["reference_mean"] == pytest.approx(0.80) and federated["reference_file"] == str(reference)
    assert record["reference_cells"] == [str(rerun)] and record["all_within"]
    without = subprocess.run([*command, "--output", str(output)], capture_output=True, text=True)
    assert without.returncode != 0 and "cora/fedgl" in without.stderr  # 0.71 is below the original 0.81-0.83
