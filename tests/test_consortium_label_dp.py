"""A real consortium under the label unit (``consortium up``): every bank releases its labels once, before round 1,
keeps them in its state directory, records one ε, and the exported run passes the audit — with each bank's own
prior, and with the shipped policy's consortium prior, fitted in the aggregator's label-prior rounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from consortium_harness import BANKS, SMALL_HE, run_consortium_to_the_end, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.engine.aggregation import PlaintextSummation, client_weight
from fedgl_secure.privacy import consortium_prior, label_release, mechanisms
from fedgl_secure.privacy.accounting import LABELS, PrivacyLedger, PureRelease
from fedgl_secure.services.aggregator import PRIOR_BASE_VERSION, PRIOR_FITTED
from fedgl_secure.services.aggregator_store import AggregatorStore
from fedgl_secure.services.bank import LABEL_RELEASE_FILE, LEDGER_FILE, bank_graph_tensors, consortium_slices
from fedgl_secure.services.bank_label_prior import STAGED_LABELS_FILE
from fedgl_secure.services.config import load_consortium
from fedgl_secure.services.run_export import collect_consortium_run
from fedgl_secure.wire.encodings import decode_arrays

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[1] / "policies" / "label-dp.toml"
# unpacked, as the shipped policy: packed, the prior's terms (and each bank's weight) would be rounded to the weights
# kind's 2^-7 steps, far above the 1e-4 the prior is compared at below
UNPACKED = SMALL_HE.model_copy(update={"packing": "none"})


def label_policy(prior: str) -> tuple[dict, dict]:
    """The shipped ``[dp.labels]`` with ``prior``, and the policy additions that carry it."""
    labels = {**tomllib.loads(SHIPPED.read_text())["dp"]["labels"], "prior": prior}
    policy = {
        "dp": {"unit": "label", "labels": labels},
        "budget": {"epsilon": labels["epsilon"], "delta": 1e-5, "rounds": 2},
    }
    return labels, policy


@pytest.mark.parametrize("prior", ["consortium-sgc", "sgc"])
def test_a_label_dp_consortium_releases_once_per_bank_and_its_run_passes_the_audit(tmp_path, prior):
    # the shipped label release (its consortium prior), and the same with each bank's own prior
    labels, policy = label_policy(prior)
    consortium = write_consortium(tmp_path, max_rounds=2, method="fedgl", policy_extra=policy, he=UNPACKED)
    summary = run_consortium_to_the_end(consortium, rounds=2)
    # `consortium up` counts the label prior's rounds (its progress bar shows them before round 1)
    expected_prior_rounds = consortium_prior.prior_steps(labels["stages"]) if prior == "consortium-sgc" else 0
    assert summary.get("prior_rounds", 0) == expected_prior_rounds

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

    if prior == "consortium-sgc":
        check_the_banks_released_with_the_consortium_prior(state, slices, labels)

    run_dir = collect_consortium_run(consortium.consortium_path, tmp_path / "run")
    report = audit_run(run_dir, attacks=False)
    assert report.with_status("red") == [], [(key, check.name) for key, check in report.checks()]
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    assert statuses["audit-log/chain"] == "green"


def check_the_banks_released_with_the_consortium_prior(state: Path, slices, labels: dict) -> None:
    """The label-prior rounds came first (one round number each, all fitted), training took the next numbers; the
    prior the last of them published is the simulation's (``fit_consortium_prior`` on the banks' stage-1 releases,
    summed in plaintext); and every bank's training labels were released by RRWithPrior with it: their likelihood
    rows are that prior's transition, recomputed here from the bank's own graph."""
    store = AggregatorStore(state / "aggregator" / "aggregator.sqlite3")
    try:
        rows = store.rounds()
        steps = consortium_prior.prior_steps(labels["stages"])
        assert [(row.round, row.base_version, row.status) for row in rows[:steps]] == [
            (number, PRIOR_BASE_VERSION, PRIOR_FITTED) for number in range(1, steps + 1)
        ]
        assert [(row.round, row.status) for row in rows[steps:]] == [(steps + 1, "applied"), (steps + 2, "applied")]
        published = decode_arrays(store.stage_model(steps, consortium_prior.LABEL_PRIOR_STAGE))["prior"]
    finally:
        store.close()
    config = load_consortium(state.parent / "consortium.toml").experiment_config()
    propagated, released, likelihoods = [], [], []
    for bank, graph in zip(BANKS, slices, strict=True):
        assert not (state / bank / STAGED_LABELS_FILE).exists()  # the release in progress is complete
        tensors = bank_graph_tensors(state / bank, graph, torch.device("cpu"), config.training.normalize_features)
        propagated.append(label_release.propagated_features(graph.adjacency(), tensors.features.to_scipy()))
        with np.load(state / bank / LABEL_RELEASE_FILE) as kept:
            released.append(kept["labels"])
            likelihoods.append(kept["likelihood"])
    stage_one = [graph.val_mask & ~graph.train_mask for graph in slices]  # validation-first: the validation labels
    normaliser = client_weight(max(graph.num_nodes for graph in slices))
    classes = slices[0].num_classes
    simulated = consortium_prior.fit_consortium_prior(
        propagated, likelihoods, stage_one, classes, PlaintextSummation(), normaliser
    )
    np.testing.assert_allclose(published, simulated.numpy(), rtol=1e-4, atol=1e-4)
    for graph, x, labels_out, likelihood in zip(slices, propagated, released, likelihoods, strict=True):
        priors = label_release.at_temperature(
            consortium_prior.prior_probabilities(torch.from_numpy(published), x, classes), labels["prior_temperature"]
        )
        train = graph.train_mask
        expected = mechanisms.rr_with_prior_likelihood(priors[train], labels_out[train], labels["epsilon"])
        np.testing.assert_allclose(likelihood[train], expected, rtol=1e-5, atol=1e-9)
