"""The command-line contract: names, JSON output, and clear errors for bad flags and bad data."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedgl_secure
from fedgl_secure.cli import app
from fedgl_secure.tomlio import tomllib

REQUIRED_KEYS = {
    "dataset",
    "method",
    "seed",
    "rounds_run",
    "best_round",
    "global_test_accuracy",
    "local_test_accuracy",
    "wall_seconds",
}


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_console_script_simulate_writes_the_run_record(tmp_path):
    output = tmp_path / "out" / "run.json"
    completed = subprocess.run(
        [
            Path(sys.executable).parent / "fedgl-secure",
            "simulate",
            "--rounds",
            "2",
            "--output",
            str(output),
            "--method",
            "fedgl-no-gpg",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    record = json.loads(output.read_text())
    assert REQUIRED_KEYS <= set(record)
    assert record["dataset"] == "synthetic" and record["method"] == "fedgl-no-gpg" and record["seed"] == 3
    assert record["rounds_run"] == 2 and len(record["local_test_accuracy"]) == 6
    assert 0.0 <= record["global_test_accuracy"] <= 1.0
    assert json.loads(completed.stdout.strip().splitlines()[-1])["rounds_run"] == 2


def test_version_is_the_installed_package_version_from_pyproject():
    completed = subprocess.run(
        [Path(sys.executable).parent / "fedgl-secure", "--version"], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert completed.stdout.strip() == f"fedgl-secure {declared}"
    assert declared == metadata.version("fedgl-secure") == fedgl_secure.__version__


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["simulate", "--dataset", "pubmedd"], "pubmedd"),
        (["simulate", "--method", "fedsgd"], "fedsgd"),
        (["simulate", "--seed", "-1"], "--seed"),
        (["simulate", "--rounds", "0"], "--rounds"),
        (["simulate", "--set", "self_supervision.beta=-1"], "self_supervision.beta"),
        (["simulate", "--set", "self_supervision.similarity=euclid"], "self_supervision.similarity"),
        (["simulate", "--set", "federation.proportions=[0.3, 1.4]"], "federation.proportions"),
        (["simulate", "--set", "nosuchsection.x=1"], "nosuchsection"),
        (["simulate", "--set", "novalue"], "section.field=value"),
        (["reproduce", "table2", "--datasets", "cora,mnist"], "mnist"),
        (["reproduce", "table2", "--methods", "fedgl,fedsgd", "--datasets", "synthetic"], "fedsgd"),
    ],
)
def test_bad_flags_exit_nonzero_and_name_the_problem(args, fragment):
    result = _invoke(*args)
    assert result.exit_code == 2
    assert fragment in result.output


POLICIES = Path(__file__).resolve().parents[1] / "policies"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--secure", "--policy", str(POLICIES / "research-plaintext.toml")], "protection = 'none'"),
        (["--policy", str(POLICIES / "strict-dp.toml")], "needs --secure"),
        (
            ["--secure", "--policy", str(POLICIES / "strict-dp-sgd.toml"), "--method", "fedgl"],
            "trains on the pseudo graph",
        ),
    ],
)
def test_simulate_refuses_a_policy_it_cannot_honour(args, fragment, tmp_path):
    result = _invoke("simulate", "--rounds", "1", "--no-progress", "--device", "cpu", *args)
    assert result.exit_code == 2
    assert fragment in result.output


def test_simulate_plaintext_policy_writes_a_run_directory(tmp_path):
    from fedgl_secure.wire.run_record import load_run_dir

    args = ["--policy", str(POLICIES / "research-plaintext.toml"), "--run-dir", str(tmp_path / "run")]
    result = _invoke("simulate", "--rounds", "1", "--no-progress", "--device", "cpu", *args)
    assert result.exit_code == 0, result.output
    loaded = load_run_dir(tmp_path / "run")
    assert not loaded.secure and loaded.policy_text is not None and len(loaded.ledgers) == 6
    assert all(not ledger.releases for ledger in loaded.ledgers.values())  # no DP: nothing recorded, nothing spent


def test_missing_data_root_names_the_flag_and_variable(monkeypatch):
    monkeypatch.delenv("FEDGL_DATA", raising=False)
    result = _invoke("simulate", "--dataset", "cora")
    assert result.exit_code == 2
    assert "--data-root" in result.output and "FEDGL_DATA" in result.output


def test_missing_files_are_named(tmp_path):
    (tmp_path / "cora" / "raw").mkdir(parents=True)
    result = _invoke("simulate", "--dataset", "cora", "--data-root", str(tmp_path))
    assert result.exit_code == 2
    assert "ind.cora.graph" in result.output and str(tmp_path / "cora" / "raw") in result.output


def test_corrupt_file_is_named(tmp_path, data_root):
    target = tmp_path / "acm" / "raw"
    shutil.copytree(data_root / "acm" / "raw", target)
    (target / "acm.label").write_text("0\n1\nnot-a-number\n")
    result = _invoke("simulate", "--dataset", "acm", "--data-root", str(tmp_path), "--rounds", "1")
    assert result.exit_code == 2
    assert "acm.label" in result.output


def test_reproduce_table2_writes_markdown_and_json(tmp_path):
    args = ["reproduce", "table2", "--datasets", "synthetic", "--methods", "federated,fedgl-no-gpg"]
    args += ["--seeds", "2", "--output-dir", str(tmp_path), "--set", "federation.max_rounds=2"]
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "table2.json").read_text())
    cell = table["synthetic"]["federated"]
    assert cell["seeds"] == [0, 1] and len(cell["global_test_accuracy"]) == 2
    assert cell["mean"] == pytest.approx(sum(cell["global_test_accuracy"]) / 2)
    markdown = (tmp_path / "table2.md").read_text()
    assert "| synthetic |" in markdown and "±" in markdown
    # a second call re-uses the stored runs (files untouched) instead of training again
    stored = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    assert len(stored) == 4
    again = _invoke(*args)
    assert again.exit_code == 0
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()} == stored
    assert json.loads((tmp_path / "table2.json").read_text()) == table
