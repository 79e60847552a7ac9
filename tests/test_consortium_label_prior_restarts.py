"""Restarts during the consortium label prior's rounds (real processes, mTLS, CKKS): a bank and the aggregator killed
mid-prior resume it without drawing any label again and without skipping or repeating a prior round."""

from __future__ import annotations

import numpy as np
import pytest
from consortium_harness import NODES, write_consortium
from test_consortium_label_dp import UNPACKED, label_policy

from fedgl_secure.privacy import consortium_prior
from fedgl_secure.privacy.accounting import LABELS, PrivacyLedger, PureRelease
from fedgl_secure.services.aggregator import PRIOR_BASE_VERSION, PRIOR_FITTED
from fedgl_secure.services.bank import LABEL_RELEASE_FILE, LEDGER_FILE, consortium_slices
from fedgl_secure.services.bank_label_prior import STAGED_LABELS_FILE
from fedgl_secure.services.config import load_consortium

pytestmark = pytest.mark.slow


def test_restarts_during_the_label_prior_rounds_neither_draw_again_nor_skip_a_round(tmp_path):
    labels, policy = label_policy("consortium-sgc")
    consortium = write_consortium(
        tmp_path, max_rounds=2, policy_extra=policy, he=UNPACKED, upload_seconds=10.0, liveness_seconds=2.0
    )
    state = consortium.root / "state"
    consortium.start(*NODES)
    try:
        consortium.wait_for(lambda s: len(fitted_prior_rounds(s)) >= 3, "three label-prior rounds")
        with np.load(state / "bank-c" / STAGED_LABELS_FILE) as staged:  # its stage 1, drawn at its start
            drawn = staged["labels"].copy()
        consortium.kill("bank-c")  # SIGKILL, mid-prior: its release is in progress
        consortium.kill("aggregator")
        consortium.start("aggregator", "bank-c")
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "the end after the restarts", timeout=300)
    finally:
        consortium.stop_all()

    steps = consortium_prior.prior_steps(labels["stages"])
    fitted = fitted_prior_rounds(status)
    assert [row["round"] for row in fitted] == sorted(row["round"] for row in fitted) and len(fitted) == steps
    training = [row for row in status["rounds"] if row["status"] == "applied"]
    assert [row["base_version"] for row in training] == [0, 1]
    assert min(row["round"] for row in training) > max(row["round"] for row in fitted)
    assert "privacy.labels_in_progress" in consortium.logs("bank-c")  # taken back from disk, not drawn
    graph = consortium_slices(load_consortium(consortium.consortium_path).experiment_config(), None)[2]
    with np.load(state / "bank-c" / LABEL_RELEASE_FILE) as kept:
        released = kept["labels"]
    validation = graph.val_mask & ~graph.train_mask  # stage 1 under validation-first
    np.testing.assert_array_equal(released[validation], drawn[validation])
    assert PrivacyLedger.load(state / "bank-c" / LEDGER_FILE).releases == (
        PureRelease(round=0, channel=LABELS, epsilon=labels["epsilon"]),
    )


def fitted_prior_rounds(status: dict) -> list[dict]:
    return [
        row for row in status["rounds"] if row["base_version"] == PRIOR_BASE_VERSION and row["status"] == PRIOR_FITTED
    ]
