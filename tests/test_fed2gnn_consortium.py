"""Fed²GNN in the secure consortium (five real processes, real TLS): the banks' set-up exchange goes through the
aggregator as a relay (signed keys, pseudonymised boundaries, masked terms), each bank rebuilds its graph, and the
FedAvg rounds that follow equal the in-process simulation with the same seed."""

from __future__ import annotations

import numpy as np
import pytest
from consortium_harness import NODES, SMALL_HE, write_consortium
from test_consortium import applied_rounds, final_weights, simulated_weights

from fedgl_secure.services.fuzzing import run_schemathesis
from fedgl_secure.services.predict import predict

pytestmark = pytest.mark.slow


def test_fed2gnn_consortium_on_cora_matches_the_simulation(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("FEDGL_DATA", str(data_root))  # the banks' processes and the simulation below read Cora
    # unpacked, as test_consortium's comparison at 1e-4 (packed sums round float-order differences)
    unpacked = SMALL_HE.model_copy(update={"packing": "none"})
    consortium = write_consortium(
        tmp_path,
        max_rounds=2,
        method="fed2gnn",
        he=unpacked,
        experiment_extra={
            "dataset": "cora",
            "federation": {"partition": "louvain", "num_clients": 3, "max_rounds": 2, "patience": 12},
            "fed2gnn": {"decoder_epochs": 2, "max_degree": 3, "projection_dim": 16, "decoder_hidden": 32},
        },
    )
    consortium.start(*NODES)
    try:
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "two rounds", timeout=300)
        rounds = applied_rounds(status)
        assert [row["base_version"] for row in rounds] == [0, 1]
        weights = final_weights(consortium, 2)
        expected = simulated_weights(consortium, 2)
        assert weights.shape == expected.shape
        assert np.max(np.abs(weights - expected)) <= 1e-4
        assert not np.allclose(weights, final_weights(consortium, 1))
    finally:
        consortium.stop_all()
    events = {name: consortium.events(name) for name in NODES}
    # every bank exchanged (none had sums saved from before) and trained on its reconstructed graph
    for bank in NODES[2:]:
        exchanged = [e for e in events[bank] if e.get("event") == "fed2gnn.exchanged"]
        rebuilt = [e for e in events[bank] if e.get("event") == "fed2gnn.reconstructed"]
        assert len(exchanged) == 1 and exchanged[0]["boundary"] > 0
        assert len(rebuilt) == 1 and rebuilt[0]["nodes"] > rebuilt[0]["own"]
    # the relay took K levels x (banks - 1) terms per active bank, and refused nothing (banks polling for a sum
    # or the union index before it exists are told "not-ready")
    accepted = [e for e in events["aggregator"] if e.get("event") == "exchange.term_accepted"]
    assert len(accepted) == 2 * 3 * 2
    rejected = [e for e in events["aggregator"] if e.get("event") == "request.rejected"]
    assert all(e["status"] == 409 and e["error"] == "not-ready" for e in rejected), rejected[:3]
    # predict scores the bank's own customers with the final model on its reconstructed graph (from the saved sums)
    own = next(e["own"] for e in events["bank-a"] if e.get("event") == "fed2gnn.reconstructed")
    summary = predict(consortium.config_path("bank-a"), output=tmp_path / "scores.csv")
    # the final model is the aggregator's best version on pooled validation (2 rounds: not always the last)
    fixed = [e["version"] for e in events["aggregator"] if e.get("event") == "final_version.fixed"]
    assert summary["customers_scored"] == own and [summary["model_version"]] == fixed


def test_schemathesis_finds_nothing_on_a_fed2gnn_aggregator(tmp_path):
    """test_fuzz_services fuzzes an aggregator whose method has no exchange (its exchange routes answer 409
    no-exchange); here the routes are live: keys, boundaries and terms reach the relay's own checks. Only the
    exchange's routes: every other route is the one test_fuzz_services fuzzes (the same code, whatever the method)."""
    consortium = write_consortium(
        tmp_path / "consortium",
        method="fed2gnn",
        experiment_extra={"dataset": "cora", "federation": {"partition": "louvain", "num_clients": 3}},
    )
    try:
        consortium.start("key-authority")
        consortium.wait_healthy("key-authority")
        consortium.run_key_ceremony()  # no bank runs; the aggregator needs the collective context
        consortium.start("aggregator")  # the aggregator never reads the dataset
        consortium.wait_healthy("aggregator")
        run = run_schemathesis(
            "aggregator",
            consortium.url("aggregator"),
            consortium.layout,
            "bank-c",
            seed=1,
            max_examples=4,
            report=tmp_path / "report.ndjson",
            include_path_regex="^/v1/exchange",
        )
        assert run.requests > 0 and not run.errors, run.output_tail
        assert run.server_errors == 0 and run.failures == [], (run.failures, run.output_tail)
        assert run.exit_code == 0 and run.statuses[409] > 0, run.output_tail
        # the six exchange routes (status, key, boundary, boundaries, terms, sum), nothing else
        assert len(run.operations) == 6 and all("/v1/exchange" in label for label in run.operations), run.operations
        assert consortium.processes["aggregator"].poll() is None
    finally:
        consortium.stop_all()
    assert "request.crashed" not in consortium.logs("aggregator")
