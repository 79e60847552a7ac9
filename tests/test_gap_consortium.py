"""GAP (node unit by aggregation perturbation) in a real consortium: every bank draws its perturbed hops once, keeps
them in its state directory before anything derived from them leaves it, records each release in the round number
that made it, and a bank killed after its hops takes them back instead of drawing (and paying for) them again."""

from __future__ import annotations

import numpy as np
import pytest
from consortium_harness import BANKS, UNPACKED_HE, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.consortium.bank_state import LEDGER_FILE, METHOD_RELEASE_FILE
from fedgl_secure.privacy import gap
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.services.run_export import collect_consortium_run

pytestmark = pytest.mark.slow

# small but 128-bit parameters, unpacked as the shipped policy
ENCODER_ROUNDS, CLASSIFIER_ROUNDS = 2, 2


def test_a_gap_consortium_keeps_each_banks_hops_across_a_restart_and_records_them_once(tmp_path):
    schedule = {"encoder_rounds": ENCODER_ROUNDS, "classifier_rounds": CLASSIFIER_ROUNDS, "local_steps": 1}
    policy_extra = {
        "allowed_kinds": ["weights", "node_weight"],
        "dp": {"unit": "node", "node_mechanism": "gap", "gap": {"max_degree": 5, "hops": 2, **schedule}},
        "budget": {"epsilon": 8.0, "delta": 1e-5, "rounds": ENCODER_ROUNDS + CLASSIFIER_ROUNDS},
    }
    # rounds after GAP's schedule train nothing and release nothing; twenty of them keep the run going while the
    # test sees the hops on disk and kills bank-b (rounds take ~0.15 s here: with one trailing round the run once
    # finished before the restarted bank-b logged anything)
    rounds = ENCODER_ROUNDS + CLASSIFIER_ROUNDS + 20
    # the harness's three banks: the quorum (it must exceed the decryption threshold t = 2), so a round waits for
    # the restarted one
    consortium = write_consortium(
        tmp_path,
        max_rounds=rounds,
        method="gap",
        policy_extra=policy_extra,
        he=UNPACKED_HE,
        upload_seconds=20.0,
    )
    state = consortium.root / "state"
    consortium.start("key-authority", "aggregator", *BANKS)
    try:
        # the classifier's first round draws the hops; bank-b keeps them before it uploads that round
        kept_hops = state / "bank-b" / METHOD_RELEASE_FILE
        consortium.wait_for(lambda s: kept_hops.exists(), "bank-b's kept hops")
        with np.load(kept_hops) as kept:
            hops_before = kept["hops"].copy()
        consortium.kill("bank-b")  # SIGKILL, after its hops: a restart must not draw them again
        consortium.start("bank-b")
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "the end after the restart", timeout=240)
    finally:
        consortium.stop_all()

    assert status["latest_version"] == rounds and not status["stopped_reason"]
    assert "privacy.method_release_reused" in consortium.logs("bank-b")
    with np.load(state / "bank-b" / METHOD_RELEASE_FILE) as kept:
        np.testing.assert_array_equal(kept["hops"], hops_before)  # the same draw, never replaced
    for bank in BANKS:
        releases = PrivacyLedger.load(state / bank / LEDGER_FILE).releases
        channels = [release.channel for release in releases]
        assert channels.count(gap.AGGREGATION) == 1  # the hops: once, whatever the restarts
        assert channels.count(gap.ENCODER) == ENCODER_ROUNDS  # every encoder round took every bank (before the kill)
        assert channels.count(gap.CLASSIFIER) <= CLASSIFIER_ROUNDS  # bank-b may have missed one while restarting
        assert len({(r.round, r.channel) for r in releases}) == len(releases)  # nothing recorded twice
        assert PrivacyLedger.load(state / bank / LEDGER_FILE).epsilon(1e-5) <= 8.0

    # the exported run passes the audit's conformance, budget and log checks (no attacks: nobody holds the graph)
    report = audit_run(collect_consortium_run(consortium.consortium_path, tmp_path / "run"), attacks=False)
    assert report.with_status("red") == [], [(key, check.name, check.detail) for key, check in report.checks()]
