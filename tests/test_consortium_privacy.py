"""A real consortium under a DP policy: banks spend their budget, stop contributing, and the run stalls below quorum."""

from __future__ import annotations

import time

import pytest
from consortium_harness import BANKS, NODES, SMALL_HE, write_consortium

from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.audit import audit_run
from fedgl_secure.privacy.guarantees import planned_ledger
from fedgl_secure.privacy.policy import policy_from_dict
from fedgl_secure.privacy.run_record import load_run_dir
from fedgl_secure.services.bank import LEDGER_FILE
from fedgl_secure.services.run_export import collect_consortium_run

pytestmark = pytest.mark.slow

CHANNEL = 'clip = 1.0\nnoise_multiplier = 1.0\nnoise = "distributed"\n'


def dp_policy_text(epsilon: float) -> str:
    return (
        'allowed_kinds = ["weights", "predictions", "node_weight"]\n'
        f"\n[dp.weights]\n{CHANNEL}\n[dp.predictions]\n{CHANNEL}\n[dp.graph]\nmax_degree = 3\n"
        f"\n[budget]\nepsilon = {epsilon!r}\ndelta = 1e-5\nrounds = 10\n"
    )


def two_round_budget() -> float:
    """Between the ε of 2 and of 3 rounds of this policy: every bank can afford exactly 2 rounds."""
    channel = {"clip": 1.0, "noise_multiplier": 1.0, "noise": "distributed"}
    probe = policy_from_dict(
        {
            "he": SMALL_HE.model_dump(),
            "allowed_kinds": ["weights", "predictions", "node_weight"],
            "dp": {"weights": channel, "predictions": channel, "graph": {"max_degree": 3}},
            "budget": {"epsilon": 1000.0, "delta": 1e-5, "rounds": 10},
        }
    )
    two, three = (planned_ledger(probe, n).epsilon(1e-5) for n in (2, 3))
    return (two + three) / 2


def test_banks_stop_at_their_budget_and_the_run_stalls_below_quorum(tmp_path):
    budget = two_round_budget()
    consortium = write_consortium(
        tmp_path,
        max_rounds=5,
        upload_seconds=4.0,
        method="fedgl-no-gpg",
        policy_extra=dp_policy_text(budget),
    )
    consortium.start(*NODES)
    try:

        def stalled(status) -> bool:
            applied = [row for row in status["rounds"] if row["status"] == "applied"]
            third = [row for row in status["rounds"] if row["round"] == 3]
            return len(applied) == 2 and bool(third) and (third[0]["status"] == "aborted" or third[0]["attempts"] >= 2)

        status = consortium.wait_for(stalled, "two applied rounds, then round 3 aborted", timeout=90)
        assert status["phase"] != "finished"
        applied = [row for row in status["rounds"] if row["status"] == "applied"]
        assert [row["round"] for row in applied] == [1, 2]
        assert all(sorted(row["contributors"]) == list(BANKS) for row in applied)
        for bank in BANKS:
            ledger = PrivacyLedger.load(tmp_path / "state" / bank / LEDGER_FILE)
            assert {release.round for release in ledger.releases} == {1, 2}
            assert ledger.epsilon(1e-5) <= budget
            assert "privacy.budget_exhausted" in consortium.logs(bank)
        time.sleep(1.0)
        assert len([row for row in consortium.status()["rounds"] if row["status"] == "applied"]) == 2
    finally:
        consortium.stop_all()

    # the stopped consortium's run directory: what `consortium up --run-dir` writes, and the audit reads
    run_dir = collect_consortium_run(consortium.consortium_path, tmp_path / "run")
    loaded = load_run_dir(run_dir)
    assert loaded.secure and sorted(loaded.ledgers) == list(BANKS) and sorted(loaded.bank_keys) == list(BANKS)
    assert loaded.run["result"]["rounds_run"] == 2
    assert {(r.round, r.sender) for r in loaded.receipts} >= {(n, b) for n in (1, 2) for b in BANKS}
    report = audit_run(run_dir, attacks=False)
    assert report.with_status("red") == []
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    for name in ("audit-log/chain", "receipts/signatures", "receipts/keys-match-key-authority"):
        assert statuses[name] == "green", name
    assert statuses["decryptions/receipts-for-decryptions"] == "green"
