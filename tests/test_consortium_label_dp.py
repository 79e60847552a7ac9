"""The shipped label release in a real consortium (real processes, mTLS, CKKS): the banks fit the consortium prior
in the aggregator's label-prior rounds before round 1 and release their labels from it; a bank and the aggregator
killed mid-prior resume without drawing any label again or skipping a prior round; every bank records one ε, and the
exported run passes the audit. (A bank's own prior in the services: tests/test_bank_label_release.py, in-process.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from consortium_harness import BANKS, write_consortium

from fedgl_secure.audit.run import audit_run
from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.bank_data import consortium_slices
from fedgl_secure.consortium.bank_label_prior import STAGED_LABELS_FILE
from fedgl_secure.consortium.bank_state import LABEL_RELEASE_FILE, LEDGER_FILE, bank_graph_tensors
from fedgl_secure.consortium.config import load_consortium
from fedgl_secure.consortium.label_prior_rounds import PRIOR_BASE_VERSION, PRIOR_FITTED
from fedgl_secure.engine.aggregation import client_weight
from fedgl_secure.kinds import WEIGHTS
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.privacy import consortium_prior, label_mechanisms, label_release
from fedgl_secure.privacy.accounting import LABELS, PrivacyLedger, PureRelease
from fedgl_secure.services.run_export import collect_consortium_run
from fedgl_secure.wire.encodings import decode_arrays

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[1] / "policies" / "label-dp.toml"
# unpacked, as the shipped policy: packed, the prior's terms (and each bank's weight) would be rounded to the weights
# kind's 2^-7 steps, far above the 1e-4 the prior is compared at below. The prior's Adam steps turn any noise on a
# near-zero gradient into a step of the learning rate's size, so the sums are decrypted at a scale (2^90) where the
# decryption's flooding (σ·√(N/2) / 2^90 ≈ 1e-15 for this short run's 512 decryptions) is far below float32's
# rounding: N = 8192, two 60-bit data primes (as the shipped label-dp.toml)
UNPACKED = HEParameters(
    poly_modulus_degree=8192,
    coeff_mod_bit_sizes=(60, 60, 60),
    global_scale_bits=90,
    packing="none",
    max_decryptions=512,
)


def test_the_shipped_label_release_runs_in_a_consortium_through_restarts_and_passes_the_audit(tmp_path):
    labels = tomllib.loads(SHIPPED.read_text())["dp"]["labels"]
    assert labels["prior"] == "consortium-sgc"  # the shipped release, as it is
    policy = {
        "dp": {"unit": "label", "labels": labels},
        "budget": {"epsilon": labels["epsilon"], "delta": 1e-5, "rounds": 2},
    }
    # the harness's three banks: the quorum (it must exceed the decryption threshold t = 2); the prior needs every
    # bank anyway
    consortium = write_consortium(
        tmp_path, max_rounds=2, policy_extra=policy, he=UNPACKED, upload_seconds=10.0, liveness_seconds=2.0
    )
    state = consortium.root / "state"
    consortium.start("key-authority", "aggregator", *BANKS)
    try:
        consortium.wait_for(lambda s: len(fitted_prior_rounds(s)) >= 3, "three label-prior rounds")
        with np.load(state / "bank-b" / STAGED_LABELS_FILE) as staged:  # its stage 1, drawn at its start
            drawn = staged["labels"].copy()
        consortium.kill("bank-b")  # SIGKILL, mid-prior: its release is in progress
        consortium.kill("aggregator")
        consortium.start("aggregator", "bank-b")
        status = consortium.wait_for(lambda s: s["phase"] == "finished", "the end after the restarts", timeout=240)
    finally:
        consortium.stop_all()

    steps = consortium_prior.prior_steps(labels["stages"])
    fitted = fitted_prior_rounds(status)
    assert [row["round"] for row in fitted] == sorted(row["round"] for row in fitted) and len(fitted) == steps
    training = [row for row in status["rounds"] if row["status"] == "applied"]
    assert [row["base_version"] for row in training] == [0, 1]
    assert min(row["round"] for row in training) > max(row["round"] for row in fitted)
    assert "privacy.labels_in_progress" in consortium.logs("bank-b")  # taken back from disk, not drawn

    slices = consortium_slices(load_consortium(consortium.consortium_path).experiment_config(), None)
    for bank, graph in zip(BANKS, slices, strict=True):
        # one release of ε at round 0, nothing per round: every upload is post-processing of it
        assert PrivacyLedger.load(state / bank / LEDGER_FILE).releases == (
            PureRelease(round=0, channel=LABELS, epsilon=labels["epsilon"]),
        )
        assert not (state / bank / STAGED_LABELS_FILE).exists()  # the release in progress is complete
        with np.load(state / bank / LABEL_RELEASE_FILE) as kept:
            released = kept["labels"]
        untouched = ~(graph.train_mask | graph.val_mask)
        np.testing.assert_array_equal(released[untouched], graph.labels[untouched])
    with np.load(state / "bank-b" / LABEL_RELEASE_FILE) as kept:  # stage 1 (validation-first) is what it drew
        validation = slices[1].val_mask & ~slices[1].train_mask
        np.testing.assert_array_equal(kept["labels"][validation], drawn[validation])
    check_the_banks_released_with_the_consortium_prior(state, slices, labels, [row["round"] for row in fitted])

    report = audit_run(collect_consortium_run(consortium.consortium_path, tmp_path / "run"), attacks=False)
    assert report.with_status("red") == [], [(key, check.name) for key, check in report.checks()]
    statuses = {f"{key}/{check.name}": check.status for key, check in report.checks()}
    assert statuses["audit-log/chain"] == "green"


def check_the_banks_released_with_the_consortium_prior(
    state: Path, slices, labels: dict, prior_rounds: list[int]
) -> None:
    """Every label-prior round is the plaintext FedAvg round of the banks' stage-1 releases: its decrypted sum is the
    sum of each bank's ``prior_term`` from the θ̄ the round before published (from zero at a stage's first round),
    and the θ̄ it published is ``prior_average`` of that sum. Every bank's training labels were then released by
    RRWithPrior with the last θ̄: their likelihood rows are that prior's transition, recomputed here from the bank's
    own graph.

    Round by round, not against a whole plaintext fit: 20 rounds of 10 local Adam steps, which divide by √v̂,
    amplify float32 rounding on entries whose gradient is near zero, by how much depends on the labels the banks
    drew (the OS CSPRNG's). One full run measured 6e-8 between the simulation's and the consortium's first sums,
    2.6e-5 at the fourth, 1.1e-2 at the twentieth (3.0e-4 relative in L2 on θ̄, above the former 1e-4), while
    each of its rounds was the plaintext round of its own start to 6e-15 and its θ̄ that round's average exactly."""
    config = load_consortium(state.parent / "consortium.toml").experiment_config()
    propagated, released, likelihoods = [], [], []
    for bank, graph in zip(BANKS, slices, strict=True):
        tensors = bank_graph_tensors(state / bank, graph, torch.device("cpu"), config.training.normalize_features)
        propagated.append(label_release.propagated_features(graph.adjacency(), tensors.features.to_scipy()))
        with np.load(state / bank / LABEL_RELEASE_FILE) as kept:
            released.append(kept["labels"])
            likelihoods.append(kept["likelihood"])
    stage_one = [graph.val_mask & ~graph.train_mask for graph in slices]  # validation-first: the validation labels
    normaliser = client_weight(max(graph.num_nodes for graph in slices))
    classes = slices[0].num_classes
    store = AggregatorStore(state / "aggregator" / "aggregator.sqlite3")
    try:
        published = None
        for step, round_number in enumerate(prior_rounds, start=1):
            start = torch.zeros(consortium_prior.prior_size(propagated[0].shape[1], classes))
            if not consortium_prior.starts_stage(step):
                start = torch.from_numpy(published)
            terms = [
                consortium_prior.prior_term(start, x, likelihood, known, classes, normaliser).double().numpy()
                for x, likelihood, known in zip(propagated, likelihoods, stage_one, strict=True)
            ]
            _, decrypted, contributors = store.sums(round_number)[WEIGHTS]
            assert sorted(contributors) == list(BANKS), round_number
            # decrypted at 2^90 (UNPACKED above): what is left of CKKS's error is float64 rounding
            assert np.max(np.abs(decrypted - np.sum(terms, axis=0))) <= 1e-9, (step, round_number)
            published = decode_arrays(store.stage_model(round_number, consortium_prior.LABEL_PRIOR_STAGE))["prior"]
            averaged = consortium_prior.prior_average(torch.from_numpy(decrypted), start)
            np.testing.assert_array_equal(published, averaged.numpy(), err_msg=f"step {step}, round {round_number}")
    finally:
        store.close()
    for graph, x, labels_out, likelihood in zip(slices, propagated, released, likelihoods, strict=True):
        priors = label_release.at_temperature(
            consortium_prior.prior_probabilities(torch.from_numpy(published), x, classes), labels["prior_temperature"]
        )
        train = graph.train_mask
        expected = label_mechanisms.rr_with_prior_likelihood(priors[train], labels_out[train], labels["epsilon"])
        np.testing.assert_allclose(likelihood[train], expected, rtol=1e-5, atol=1e-9)


def fitted_prior_rounds(status: dict) -> list[dict]:
    prior = [row for row in status["rounds"] if row["base_version"] == PRIOR_BASE_VERSION]
    return [row for row in prior if row["status"] == PRIOR_FITTED]
