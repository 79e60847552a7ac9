"""A real consortium under the node unit by private class sums (``consortium up``, central noise): one round, each
bank records the one release before it uploads, and the key authority adds the noise once to round 1's sum."""

from __future__ import annotations

import json

import pytest
from consortium_harness import BANKS, UNPACKED_HE, run_consortium_to_the_end, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.consortium.bank_data import consortium_slices
from fedgl_secure.consortium.bank_state import LEDGER_FILE
from fedgl_secure.consortium.config import load_consortium
from fedgl_secure.methods import apply_in_method_policy
from fedgl_secure.methods.centroids import centroids_releases
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.calibration import noise_std
from fedgl_secure.services.run_export import collect_consortium_run

pytestmark = pytest.mark.slow

# small but 128-bit parameters, unpacked as the shipped policy (the class sums are not a GCN's weight range)


def test_a_class_sums_consortium_releases_once_and_the_key_authority_adds_the_noise_once(tmp_path):
    policy_extra = {
        "allowed_kinds": ["weights", "node_weight"],
        "dp": {"unit": "node", "node_mechanism": "centroids", "centroids": {"noise": "central"}},
        "budget": {"epsilon": 8.0, "delta": 1e-5, "rounds": 1},
    }
    # the consortium file asks for 3 rounds: the policy fixes the one round of the release
    consortium = write_consortium(tmp_path, max_rounds=3, method="centroids", policy_extra=policy_extra, he=UNPACKED_HE)
    run_consortium_to_the_end(consortium, rounds=1)

    loaded = load_consortium(consortium.consortium_path)
    policy = load_policy(loaded.policy)
    config = apply_in_method_policy(loaded.experiment_config(), policy)
    assert config.federation.max_rounds == 1 and config.centroids.epsilon == 8.0
    _, releases_of_round = centroids_releases(config)
    state = consortium.root / "state"
    for bank in BANKS:  # the one Gaussian release of round 1, recorded once, within the budget
        ledger = PrivacyLedger.load(state / bank / LEDGER_FILE)
        assert ledger.releases == tuple(releases_of_round(1)) and len(ledger.releases) == 1
        assert 7.0 < ledger.epsilon(1e-5) <= 8.0

    # the key authority decrypted round 1's class sums once, with its central noise on every value but Σ ŵ_k
    records = [json.loads(line) for line in (state / "key-authority" / "audit.jsonl").read_text().splitlines()]
    allowed = [r for r in records if r["event"] == "decrypt" and r["decision"] == "allowed"]
    weights = [r for r in allowed if r["kind"] == "weights"]
    assert [r["round"] for r in weights] == [1]
    sigma = noise_std(policy, "weights")
    assert sigma > 0 and weights[0]["central_noise_std"] == pytest.approx(sigma)
    graph = consortium_slices(loaded.experiment_config(), None)[0]  # the class sums: C × F values (plus Σ ŵ_k)
    assert weights[0]["central_noise_values"] == graph.num_classes * graph.features.shape[1]

    # the exported run passes the audit's conformance, budget and log checks (no attacks: nobody holds the graph)
    report = audit_run(collect_consortium_run(consortium.consortium_path, tmp_path / "run"), attacks=False)
    assert report.with_status("red") == [], [(key, check.name, check.detail) for key, check in report.checks()]
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    assert statuses["audit-log/chain"] == "green"
