"""Three banks, each reading ITS OWN generated customer tables (two from Parquet, one from SQLite),
run the five-process consortium; the result equals the in-process simulation of the same data, and
every bank then scores all of its customers with ``fedgl-secure predict``.
"""

from __future__ import annotations

import io
import json
import re
import sqlite3

import numpy as np
import pyarrow.parquet as pq
import pytest
from consortium_harness import BANKS, NODES, UNPACKED_HE, LocalConsortium
from typer.testing import CliRunner

from fedgl_secure.audit.run import audit_run
from fedgl_secure.cli import app
from fedgl_secure.crypto.secure_summation import QuantisedSummation
from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import consortium_bank_graphs
from fedgl_secure.services.run_export import collect_consortium_run
from fedgl_secure.simulation.experiment import run_experiment

pytestmark = pytest.mark.slow

ROUNDS = 3
CUSTOMERS = 400
# Small (108 of 109 bits at N = 4096) but with scale 2^40: CKKS' error (~1e-8 here, ~1e-6 at 2^36) must stay
# below what flips a pseudo label: with balanced class weights many fused predictions sit near λ = 0.5, and
# a flipped label moves the next W̄ by ~3e-3 (measured with noise of 1e-6 on plaintext sums).
# Unpacked: packed terms computed in another float order can round one quantisation step apart (see
# test_consortium.py), far above the 1e-4 this test compares at.


def bank_data_tables(data_dir) -> dict[str, dict]:
    """bank-a and bank-b read Parquet files, bank-c its SQLite database."""
    tables = {
        bank: {
            "kind": "files",
            "customers": str(data_dir / bank / "customers.parquet"),
            "transactions": str(data_dir / bank / "transactions.parquet"),
        }
        for bank in BANKS[:2]
    }
    tables["bank-c"] = {
        "kind": "sql",
        "url": f"sqlite:///{data_dir / 'sqlite' / 'bank-c' / 'bank.sqlite'}",
        "customers": "customers",
        "transactions": "transactions",
    }
    return tables


@pytest.fixture(scope="module")
def finished_bank_consortium(tmp_path_factory):
    root = tmp_path_factory.mktemp("bank-consortium")
    data_dir = root / "bank-data"
    synthesize_banks(data_dir, banks=3, customers=CUSTOMERS, seed=0, fmt="parquet")
    synthesize_banks(data_dir / "sqlite", banks=3, customers=CUSTOMERS, seed=0, fmt="sqlite")
    experiment = {
        "method": "fedgl",
        "seed": 0,
        "device": "cpu",
        "federation": {"max_rounds": ROUNDS, "patience": ROUNDS + 10},
        # two classes: the output layer's 2-d logits make cosine similarities near-ties everywhere (the top-s
        # choice then hangs on summation order); the hidden layer gives the pseudo graph real neighbours
        "self_supervision": {"neighbors": 10, "embedding": "hidden"},
        # Unweighted classes here: with balanced weights the first rounds' fused predictions sit around 0.5, and
        # Eq. 13's argmax flips for a node within ~1e-6 of it — a float-order effect of the pseudo graph, so
        # the secret random union order alone moved W̄ by 3.6e-4 after 3 rounds in the plaintext simulation
        # (0.0 unweighted); a decision boundary, not an error of the secure path.
        "training": {"class_weighting": "none"},
    }
    write_loopback_consortium(
        root,
        banks=BANKS,
        experiment=experiment,
        he=UNPACKED_HE,
        federation="bank-federation",
        schema=synthetic_bank_schema().model_dump(mode="json", exclude_none=True),
        bank_data=bank_data_tables(data_dir),
    )
    consortium = LocalConsortium(root, ROUNDS)
    consortium.start(*NODES)
    try:
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "three rounds", timeout=300)
        for bank in BANKS:  # each bank saves the final model, then stops
            assert consortium.processes[bank].wait(timeout=120) == 0, consortium.logs(bank)[-3000:]
        status = consortium.status()  # now with the final version the banks waited for
        assert status["final_version"] is not None
        yield consortium, status
    finally:
        consortium.stop_all()


def test_bank_sources_consortium_matches_the_simulation_of_the_same_tables(finished_bank_consortium):
    consortium, status = finished_bank_consortium
    applied = [row for row in status["rounds"] if row["status"] == "applied"]
    assert len(applied) == ROUNDS and all(sorted(row["contributors"]) == list(BANKS) for row in applied)
    # imbalanced labels: ROC-AUC, PR-AUC, recall at the top 1 % from the banks' pooled score histograms
    metrics = status["best_test_metrics"]
    assert set(metrics) >= {"roc_auc", "pr_auc", "recall_at_top"}
    assert all(0.0 <= metrics[name] <= 1.0 for name in ("roc_auc", "pr_auc", "recall_at_top"))
    with consortium.client("bank-a", "aggregator") as http:
        response = http.get(f"/v1/models/{ROUNDS}")
    assert response.status_code == 200, response.text
    with np.load(io.BytesIO(response.content), allow_pickle=False) as archive:
        consortium_weights = archive["weights"].astype(np.float64)

    config_source, banks = consortium_bank_graphs(consortium.consortium_path)
    seen = []
    run_experiment(  # summed with the policy's packed quantisation, as the consortium's CKKS sums decode
        config_source.experiment_config(),
        clients=[bank.graph for bank in banks],
        progress=False,
        observer=seen.append,
        summation=QuantisedSummation(load_policy(config_source.policy)),
    )
    expected = seen[ROUNDS - 1].weights.double().numpy()
    assert consortium_weights.shape == expected.shape
    assert np.max(np.abs(consortium_weights - expected)) <= 1e-4


def test_every_bank_scores_each_of_its_customers(finished_bank_consortium, tmp_path):
    consortium, status = finished_bank_consortium
    runner = CliRunner()
    versions = set()
    for bank in BANKS[:2]:
        output = tmp_path / f"{bank}-scores.parquet"
        result = runner.invoke(app, ["predict", "--config", str(consortium.config_path(bank)), "--output", str(output)])
        assert result.exit_code == 0, result.output
        versions.add(json.loads(result.output.strip().splitlines()[-1])["model_version"])
        scores = pq.read_table(output).to_pydict()
        customers = pq.read_table(consortium.root / "bank-data" / bank / "customers.parquet").to_pydict()
        assert sorted(scores["customer_id"]) == sorted(map(str, customers["customer_id"]))
        probabilities = np.column_stack([scores["p_good"], scores["p_fraud"]])
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-6) and (probabilities >= 0).all()
        expected = np.where(probabilities[:, 1] > probabilities[:, 0], "fraud", "good")
        assert list(scores["predicted_class"]) == list(expected)
    # bank-c writes its scores back into its own database
    result = runner.invoke(app, ["predict", "--config", str(consortium.config_path("bank-c")), "--table", "scores"])
    assert result.exit_code == 0, result.output
    versions.add(json.loads(result.output.strip().splitlines()[-1])["model_version"])
    assert versions == {status["final_version"]}  # every bank scores with the one final model
    database = consortium.root / "bank-data" / "sqlite" / "bank-c" / "bank.sqlite"
    with sqlite3.connect(database) as db:
        (scored,) = db.execute("SELECT COUNT(*) FROM scores").fetchone()
        (customers,) = db.execute("SELECT COUNT(*) FROM customers").fetchone()
    assert scored == customers == CUSTOMERS


def test_services_log_where_each_round_spent_its_time(finished_bank_consortium):
    consortium, _ = finished_bank_consortium
    for bank in BANKS:
        uploaded = consortium.events(bank, "round.uploaded")
        assert len(uploaded) == ROUNDS
        for event in uploaded:
            phases = event["phases"]
            assert set(phases) == {"download", "evaluation", "training", "encryption", "upload"}
            assert all(seconds >= 0 for seconds in phases.values())
            assert sum(phases.values()) <= event["seconds"] + 0.01  # parts of the round, not more
    applied = consortium.events("aggregator", "round.applied")
    assert [event["version"] for event in applied] == list(range(1, ROUNDS + 1))
    for event in applied:
        assert set(event["phases"]) == {"aggregation", "decryption", "server_step"}
    discovered = consortium.events("aggregator", "pseudo_graph.discovered")
    assert len(discovered) == ROUNDS and all(event["neighbors"] == 10 for event in discovered)


def test_a_bank_runs_the_audits_attacks_on_its_own_customers(finished_bank_consortium, tmp_path):
    consortium, _ = finished_bank_consortium
    run_dir = collect_consortium_run(consortium.consortium_path, tmp_path / "run")

    def attack_checks(**options) -> dict:
        report = audit_run(run_dir, **options)
        return {check.name: check for key, check in report.checks() if key == "attacks"}, report

    # nobody holds the merged graph of banks' own tables: the attacks cannot run, and the report says who can
    merged, _ = attack_checks()
    assert merged["not-run"].status == "amber" and "--bank-config" in merged["not-run"].detail
    # bank-a's risk officer runs them on bank-a's customers (its tables and union index)
    own, report = attack_checks(bank_config=consortium.config_path("bank-a"))
    assert "not-run" not in own and own["membership"].status in ("green", "amber", "red")
    assert "membership-reference" in own and "every bank's data" in own["membership-reference"].detail
    _, banks = consortium_bank_graphs(consortium.consortium_path)
    bank_a = banks[BANKS.index("bank-a")].graph
    figures = next(s for s in report.sections if s.key == "attacks").data["membership"]["run"]
    assert 0 < figures["members"] <= int(bank_a.train_mask.sum())
    link = re.search(r"\((\d+) true edges", own["link"].detail)
    assert link is not None and 0 < int(link.group(1)) <= bank_a.adjacency().nnz // 2
    # another node's file is refused by name
    wrong, _ = attack_checks(bank_config=consortium.config_path("aggregator"))
    assert wrong["not-run"].status == "amber" and "role 'aggregator'" in wrong["not-run"].detail
