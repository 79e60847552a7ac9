"""``fedgl-secure board`` served in-process over a real run directory: a secure simulation under strict-dp (six banks,
CKKS, the key authority's ledger, the banks' privacy ledgers). The browser test, on a five-process consortium with
its logs and a live aggregator, is in test_bank_consortium.py.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fedgl_secure.audit.run_files import read_run_dir
from fedgl_secure.audit.templating import cell
from fedgl_secure.board.app import create_app
from fedgl_secure.board.command import board_sources
from fedgl_secure.cli import app

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 2
BANKS = [f"bank-{k}" for k in range(6)]  # the synthetic consortium's six banks


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> Path:
    """``fedgl-secure simulate --secure --policy policies/strict-dp.toml --run-dir``: two rounds of six banks."""
    run_dir = tmp_path_factory.mktemp("board") / "run"
    args = ["simulate", "--dataset", "synthetic", "--method", "federated", "--seed", "0", "--rounds", str(ROUNDS)]
    args += ["--device", "cpu", "--set", "training.local_epochs=1", "--no-progress", "--secure"]
    args += ["--policy", str(REPO / "policies" / "strict-dp.toml"), "--run-dir", str(run_dir)]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    return run_dir


@pytest.fixture
def run_dir(dp_run, tmp_path) -> Path:
    return Path(shutil.copytree(dp_run, tmp_path / "federation" / "run"))


def _client(run_dir: Path, **options) -> TestClient:
    return TestClient(create_app(board_sources(run_dir, **options)))


def test_a_dp_runs_board_shows_epsilon_per_bank_and_channel_and_the_ledger_in_summary(dp_run):
    files = read_run_dir(dp_run)
    page = _client(dp_run).get("/")
    assert page.status_code == 200
    html = page.text
    assert f'<span id="rounds-applied">{ROUNDS}</span>' in html and 'http-equiv="refresh"' not in html
    for bank in BANKS:  # every bank contributed to every round of the simulation
        assert f'<tr data-bank="{bank}"><td>{bank}</td><td>{ROUNDS}</td><td>{ROUNDS}</td>' in html
    budget = files.policy.budget
    channels = ("weights", "predictions", "embeddings")
    for bank, ledger in files.directory.ledgers.items():  # ε from the bank's own ledger, total and per channel
        spent = [ledger.epsilon(budget.delta, budget.accountant, channel=c) for c in channels]
        row = [bank, ledger.epsilon(budget.delta, budget.accountant), budget.epsilon, *spent]
        assert "<tr>" + "".join(f"<td>{cell(value)}</td>" for value in row) + "</tr>" in html
        assert f"ε spent by {bank} over rounds" in html  # its plot, inline, with text a browser can find
    decrypted = Counter(d.kind for d in files.ledger.decryptions)
    assert decrypted and f"{len(files.ledger.decryptions)} in all" in html
    for kind, count in decrypted.items():
        assert f"<td>{kind}</td><td>{count}</td><td>1–{ROUNDS}</td>" in html
    assert "No phase times" in html  # no logs beside this run directory
    assert "No audit yet" in html


def test_the_board_shows_this_runs_audit_and_not_another_runs(run_dir):
    audit_file = run_dir / "audit.json"
    outcome = CliRunner().invoke(
        app, ["audit", str(run_dir), "--no-attacks", "--format", "json", "--output", str(audit_file)]
    )
    assert outcome.exit_code == 0, outcome.output
    document = json.loads(audit_file.read_text(encoding="utf-8"))
    client = _client(run_dir)
    html = client.get("/").text
    status = document["status"]
    assert f'<div class="verdict {status}" id="audit-verdict">{status.upper()}</div>' in html
    amber = [c for s in document["sections"] for c in s["checks"] if c["status"] == "amber"]
    assert f"{len(amber)} amber of" in html and all(c["detail"] in html for c in amber)
    full = client.get("/audit")
    assert full.status_code == 200
    assert all(f'<section id="{s["key"]}">' in full.text for s in document["sections"])

    document["run"]["rounds_run"] = ROUNDS + 5  # an audit of another run
    audit_file.write_text(json.dumps(document), encoding="utf-8")
    html = client.get("/").text  # the changed file is read again
    assert f"audits another run (rounds_run {ROUNDS + 5} ≠ {ROUNDS})" in html and "audit-verdict" not in html
    assert client.get("/audit").status_code == 404

    audit_file.write_text("{}", encoding="utf-8")
    assert "not an audit report of `fedgl-secure audit --format json`" in client.get("/").text


def test_the_board_is_read_only_and_serves_nothing_else(dp_run):
    client = _client(dp_run)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert client.request(method, "/").status_code == 405
    for path in ("/docs", "/redoc", "/openapi.json", "/run.json", "/audit.json"):
        assert client.get(path).status_code == 404, path
    assert client.get("/audit").status_code == 404  # no audit of this run yet: said so
    assert "No audit report" in client.get("/audit").text


# A bank's and the aggregator's records as the services log them (structlog JSON, one a line), with what a log also
# holds: uvicorn's plain-text lines and a record cut short by a crash.
AGGREGATOR_LOG = """\
{"role": "aggregator", "round": 1, "participants": ["bank-0", "bank-1"], "event": "round.opened"}
{"role": "aggregator", "round": 1, "version": 1, "contributors": ["bank-0"], "seconds": 4.0, \
"phases": {"aggregation": 0.5, "decryption": 1.0, "server_step": 1.5}, "event": "round.applied"}
INFO:     Shutting down
{"role": "aggregator", "round": 2, "participants": ["bank-0", "bank-1"], "event": "round.opened"}
{"role": "aggregator", "round": 2, "ver
"""
BANK_LOG = """\
{"node": "bank-0", "role": "bank", "round": 1, "seconds": 2.0, "phases": {"download": 0.25, "training": 1.0}, \
"event": "round.uploaded"}
"""


def test_a_live_run_without_its_directory_is_drawn_from_the_logs_and_reloads(tmp_path):
    logs = tmp_path / "federation" / "state" / "logs"  # where `consortium up` writes them
    logs.mkdir(parents=True)
    (logs / "aggregator.log").write_text(AGGREGATOR_LOG, encoding="utf-8")
    (logs / "bank-0.log").write_text(BANK_LOG, encoding="utf-8")
    run_dir = tmp_path / "federation" / "run"  # not written yet
    sources = board_sources(run_dir)
    assert sources.logs == logs.resolve()  # found beside the run directory
    html = TestClient(create_app(sources, refresh_seconds=2)).get("/").text
    assert '<meta http-equiv="refresh" content="2">' in html and "running (from the logs)" in html
    assert '<span id="rounds-applied">1</span>' in html
    # round 1: bank-1 was invited and did not upload; round 2 is open
    assert '<tr data-bank="bank-1"><td>bank-1</td><td>2</td><td>0</td><td>1, 2</td>' in html
    assert "<tr><td>bank-0</td><td>1</td><td>1.25</td><td>0.25</td><td>1</td></tr>" in html  # its mean phases
    assert "Round time by phase" in html and "waiting for the banks" in html  # 4 s less the 3 s of its phases
    assert "validation accuracy per round: from the aggregator" in html


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["{missing}"], "does not exist (yet) and no live source is given"),
        (["{run}/run.json"], "not a directory"),
        (["{run}", "--aggregator", "https://127.0.0.1:8702"], "--aggregator needs --node-config"),
        (["{run}", "--audit", "{missing}/audit.json"], "no such file"),
        (["{run}", "--node-config", "{missing}/bank-a.toml"], "bank-a.toml"),
    ],
)
def test_the_command_names_the_bad_option_and_serves_nothing(dp_run, tmp_path, arguments, message):
    filled = [a.format(run=dp_run, missing=tmp_path / "missing") for a in arguments]
    outcome = CliRunner().invoke(app, ["board", *filled])
    assert outcome.exit_code == 2, outcome.output
    assert message in outcome.stderr
