"""``benchmarks/run_records.py compare``: two directories of run records are equal field by field except the
wall-clock fields, and the first difference of each record is named."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmark_scripts import load_benchmark


def _module():
    return load_benchmark("run_records")


RECORD = {
    "method": "fedgl",
    "global_test_accuracy": 0.8211,
    "wall_seconds": 12.5,
    "history": [{"round": 1, "val_accuracy": 0.5, "seconds": 0.3, "pseudo_label_accuracy": math.nan}],
}


def _write(directory: Path, name: str, record: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(record))


def test_records_equal_but_for_their_timing_are_equal(tmp_path):
    records = _module()
    slower = json.loads(json.dumps(RECORD))
    slower["wall_seconds"], slower["history"][0]["seconds"] = 99.0, 7.0
    _write(tmp_path / "before", "fedgl-seed0.json", RECORD)
    _write(tmp_path / "after", "fedgl-seed0.json", slower)
    result = records.compare(tmp_path / "before", tmp_path / "after")
    assert result["all_equal"] and result["records"] == {"fedgl-seed0.json": "equal"}
    assert records.main(["compare", str(tmp_path / "before"), str(tmp_path / "after")]) == 0


def test_a_changed_figure_a_missing_record_and_a_changed_type_are_named(tmp_path):
    records = _module()
    changed = json.loads(json.dumps(RECORD))
    changed["history"][0]["val_accuracy"] = 0.5000001
    _write(tmp_path / "before", "fedgl-seed0.json", RECORD)
    _write(tmp_path / "before", "fgcl-seed0.json", RECORD)
    _write(tmp_path / "after", "fedgl-seed0.json", changed)
    result = records.compare(tmp_path / "before", tmp_path / "after")
    assert not result["all_equal"]
    assert result["records"]["fedgl-seed0.json"] == "differs at .history[0].val_accuracy: 0.5 against 0.5000001"
    assert result["only_before"] == ["fgcl-seed0.json"]
    assert records.first_difference({"round": 1}, {"round": 1.0}) == ".round: 1 against 1.0"
    assert records.first_difference({"a": 1}, {"b": 1}).endswith("keys ['a', 'b'] on one side only")
    assert records.main(["compare", str(tmp_path / "before"), str(tmp_path / "after")]) == 1


def test_a_setting_new_in_the_later_commit_is_allowed_only_when_named(tmp_path):
    before = {**RECORD, "config": {"training": {"hidden": 16}}}
    after = {**RECORD, "config": {"training": {"hidden": 16, "batch_size": None}}}
    _write(tmp_path / "before", "fedgl-seed0.json", before)
    _write(tmp_path / "after", "fedgl-seed0.json", after)
    compare = _module().compare
    unnamed = compare(tmp_path / "before", tmp_path / "after")
    assert unnamed["records"]["fedgl-seed0.json"] == (
        "differs at .config.training: keys ['batch_size'] on one side only"
    )
    named = compare(tmp_path / "before", tmp_path / "after", frozenset({".config.training.batch_size"}))
    assert named["all_equal"] is True
    # named as added, but present before and gone after: still a difference
    reversed_ = compare(tmp_path / "after", tmp_path / "before", frozenset({".config.training.batch_size"}))
    assert reversed_["all_equal"] is False
