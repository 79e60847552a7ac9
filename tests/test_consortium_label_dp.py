"""A real consortium under the label unit (``consortium up``): every bank releases its labels once, before round 1,
keeps them in its state directory, records one ε, and the exported run passes the audit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
from consortium_harness import BANKS, SMALL_HE, run_consortium_to_the_end, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.privacy.accounting import LABELS, PrivacyLedger, PureRelease
from fedgl_secure.services.bank import LABEL_RELEASE_FILE, LEDGER_FILE, consortium_slices
from fedgl_secure.services.config import load_consortium
from fedgl_secure.services.run_export import collect_consortium_run

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[1] / "policies" / "label-dp.toml"


def test_a_label_dp_consortium_releases_once_per_bank_and_its_run_passes_the_audit(tmp_path):
    # the shipped label release with each bank's own prior (the shipped consortium prior is refused by the services)
    labels = {**tomllib.loads(SHIPPED.read_text())["dp"]["labels"], "prior": "sgc"}
    policy = {
        "dp": {"unit": "label", "labels": labels},
        "budget": {"epsilon": labels["epsilon"], "delta": 1e-5, "rounds": 2},
    }
    consortium = write_consortium(tmp_path, max_rounds=2, method="fedgl", policy_extra=policy, he=SMALL_HE)
    run_consortium_to_the_end(consortium, rounds=2)

    state = consortium.root / "state"
    slices = consortium_slices(load_consortium(consortium.consortium_path).experiment_config(), None)
    for bank, graph in zip(BANKS, slices, strict=True):
        # one release of ε at round 0, nothing per round: every upload is post-processing of it
        assert PrivacyLedger.load(state / bank / LEDGER_FILE).releases == (
            PureRelease(round=0, channel=LABELS, epsilon=labels["epsilon"]),
        )
        with np.load(state / bank / LABEL_RELEASE_FILE) as kept:
            released = kept["labels"]
            assert kept["likelihood"].shape == (graph.num_nodes, graph.num_classes)
        untouched = ~(graph.train_mask | graph.val_mask)
        np.testing.assert_array_equal(released[untouched], graph.labels[untouched])
        assert "privacy.ready" in (state / "logs" / f"{bank}.log").read_text()

    run_dir = collect_consortium_run(consortium.consortium_path, tmp_path / "run")
    report = audit_run(run_dir, attacks=False)
    assert report.with_status("red") == [], [(key, check.name) for key, check in report.checks()]
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    assert statuses["audit-log/chain"] == "green"
