"""The label unit in the bank service, in-process: the release the simulation's bank makes, kept across restarts.

A :class:`BankWorker` runs against ``test_bank_privacy``'s scripted aggregator (no network), with the plaintext
it would encrypt recorded; the simulation runs with the same seeded byte source, so both draw the same release.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import test_bank_privacy
from test_bank_privacy import CONFIG, run_worker, seeded_bytes

from fedgl_secure.consortium.bank_label_prior import STAGED_LABELS_FILE, load_staged_release, save_staged_release
from fedgl_secure.consortium.bank_state import (
    LABEL_RELEASE_FILE,
    LEDGER_FILE,
    PREPARED_GRAPH_FILE,
    RELEASE_FIELDS,
    release_settings,
)
from fedgl_secure.consortium.setup_checks import check_consortium_can_run
from fedgl_secure.crypto.centring import centre_term
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy.accounting import LABELS, PrivacyLedger, PureRelease
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.label_release import StagedRelease
from fedgl_secure.simulation.experiment import run_experiment

world = test_bank_privacy.world  # its fixture: the synthetic federation and bank-a's scripted rounds

RANDOMISED_RESPONSE = {"mechanism": "randomized-response", "epsilon": 1.0}
# each bank's own SGC prior, with the forward correction: the release's likelihood rows are what it trains with
OWN_SGC_PRIOR = {
    "mechanism": "rr-with-prior",
    "epsilon": 1.0,
    "stages": 2,
    "stage_order": "validation-first",
    "prior": "sgc",
    "prior_temperature": 0.5,
    "correction": "forward",
}
OWN_PROPAGATION_PRIOR = {"mechanism": "rr-with-prior", "epsilon": 1.0, "stages": 3, "prior": "propagation"}
CONSORTIUM_PRIOR = {**OWN_SGC_PRIOR, "prior": "consortium-sgc", "correction": "none"}
# a loss robust to wrong labels on the released ones (the simulation's training code, docs/privacy.md §6.10)
ROBUST_LOSS = {**OWN_PROPAGATION_PRIOR, "correction": "gce", "gce_q": 0.5}
ONCE = (PureRelease(round=0, channel=LABELS, epsilon=1.0),)  # a bank's ledger after its release, whatever the rounds


def label_policy_dict(labels: dict, he=None) -> dict:
    policy = {
        "protection": "he",
        "quorum": 3,
        "allowed_kinds": ["weights", "predictions", "embeddings", "node_weight"],
        "dp": {"unit": "label", "labels": labels},
        "budget": {"epsilon": labels["epsilon"], "delta": 1e-5, "rounds": 10},
    }
    return policy if he is None else {**policy, "he": he.model_dump()}


def dont_draw(size: int) -> bytes:
    raise AssertionError("a restarted bank drew randomness for a release it already made")


def uploads(encrypted) -> dict:
    return {(nonce, kind): values for _, nonce, kind, values in encrypted}


def assert_same_round(first, again) -> None:
    """A restarted bank's upload of round 1 (nonce n2) is its first process's (n1), kind for kind."""
    first, again = uploads(first), uploads(again)
    assert {kind for _, kind in again} == {kind for _, kind in first} and ("n2", "weights") in again
    for _, kind in first:
        np.testing.assert_array_equal(again[("n2", kind)], first[("n1", kind)])


@pytest.mark.parametrize("labels", [RANDOMISED_RESPONSE, OWN_SGC_PRIOR, OWN_PROPAGATION_PRIOR, ROBUST_LOSS])
def test_the_bank_trains_on_the_labels_the_simulation_releases_and_records_them_once(
    world, small_he, tmp_path, monkeypatch, labels
):
    policy = policy_from_dict(label_policy_dict(labels, small_he))
    _, encrypted = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, random_bytes=seeded_bytes(7))

    graphs, seen, references = [], {}, {}
    private_graphs = FederationPrivacy.private_graphs

    def keep_graphs(self, *args):
        graphs.extend(private_graphs(self, *args))
        return graphs

    def summation(round_number, contributions, reference=None):
        seen.setdefault(round_number, contributions)
        references.setdefault(round_number, reference.double().numpy())
        return PlaintextSummation()(round_number, contributions)

    monkeypatch.setattr(FederationPrivacy, "private_graphs", keep_graphs)
    # bank 0 draws first in the simulation's release, so the same byte source gives bank-a the same release
    simulation = FederationPrivacy(policy, random_bytes=seeded_bytes(7))
    run_experiment(CONFIG, world.dataset, False, summation, privacy=simulation)

    true = world.clients[0]
    with np.load(tmp_path / LABEL_RELEASE_FILE) as kept:
        released = kept["labels"]
        likelihood = kept["likelihood"] if "likelihood" in kept.files else None
    np.testing.assert_array_equal(released, graphs[0].labels.numpy())
    released_nodes = true.train_mask | true.val_mask
    assert (released[released_nodes] != true.labels[released_nodes]).any()  # ε = 1: the release changed labels
    np.testing.assert_array_equal(released[~released_nodes], true.labels[~released_nodes])  # test labels: never
    expected_likelihood = simulation.banks[0].label_likelihood
    assert (likelihood is None) == (expected_likelihood is None) == (labels["mechanism"] == "randomized-response")
    if likelihood is not None:
        np.testing.assert_array_equal(likelihood, expected_likelihood)

    # one release of ε at round 0 in both ledgers, nothing per round (source-only unit)
    ledger = PrivacyLedger.load(tmp_path / LEDGER_FILE)
    assert ledger.releases == simulation.banks[0].ledger.releases == ONCE

    # trained on the same released labels: the round-1 upload is the simulation's bank-0 contribution
    sent = uploads(encrypted)
    assert {kind for _, kind in sent} == set(seen[1][0])
    for kind, tensor in seen[1][0].items():
        expected = centre_term(kind, tensor.detach().double().numpy().reshape(-1), references[1])
        np.testing.assert_array_equal(sent[("n1", kind)].reshape(-1), expected)


def test_a_restarted_bank_reuses_its_release_without_drawing_or_paying_again(world, small_he, tmp_path, monkeypatch):
    policy = policy_from_dict(label_policy_dict(OWN_SGC_PRIOR, small_he))
    _, first = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, random_bytes=seeded_bytes(3))
    ledger, release = (tmp_path / LEDGER_FILE).read_bytes(), (tmp_path / LABEL_RELEASE_FILE).read_bytes()

    # a new process on the same state directory, round 1 reopened: any draw fails the test
    worker, again = run_worker(world, policy, tmp_path, [(1, "n2")], monkeypatch, random_bytes=dont_draw)
    assert worker.rounds_done == [1]
    assert (tmp_path / LEDGER_FILE).read_bytes() == ledger  # ε not charged again
    assert (tmp_path / LABEL_RELEASE_FILE).read_bytes() == release
    # the same labels and likelihood rows (forward correction): the same training, the same upload
    assert_same_round(first, again)

    # stopped between writing the release and the ledger: the kept release is taken and recorded once
    PrivacyLedger("bank-a").save(tmp_path / LEDGER_FILE)
    run_worker(world, policy, tmp_path, [], monkeypatch, random_bytes=dont_draw)
    assert PrivacyLedger.load(tmp_path / LEDGER_FILE).releases == ONCE

    # paid for, but the labels are gone: refused, never drawn again
    (tmp_path / LABEL_RELEASE_FILE).unlink()
    with pytest.raises(ConfigError, match="privacy-labels.npz: missing.*spend ε a second time"):
        run_worker(world, policy, tmp_path, [], monkeypatch, random_bytes=dont_draw)


def test_a_kept_release_made_under_other_label_settings_is_refused(world, small_he, tmp_path, monkeypatch):
    run_worker(world, policy_from_dict(label_policy_dict(RANDOMISED_RESPONSE, small_he)), tmp_path, [], monkeypatch)
    other = policy_from_dict(label_policy_dict({**RANDOMISED_RESPONSE, "epsilon": 4.0}, small_he))
    with pytest.raises(ConfigError, match="a label release made under dp.labels = .*'epsilon': 1.0"):
        run_worker(world, other, tmp_path, [], monkeypatch, random_bytes=dont_draw)


@pytest.mark.parametrize(
    "labels", [RANDOMISED_RESPONSE, OWN_SGC_PRIOR, OWN_PROPAGATION_PRIOR, CONSORTIUM_PRIOR, ROBUST_LOSS]
)
def test_the_consortium_accepts_every_label_release(small_he, labels):
    # the consortium prior too: the aggregator runs its FedAvg rounds before round 1 (test_consortium_label_dp.py)
    config = build_config({"method": "fedgl"})
    check_consortium(policy_from_dict(label_policy_dict(labels)), config)
    check_consortium_can_run(config, policy_from_dict(label_policy_dict(labels, small_he)), 3)


def test_the_consortium_refuses_the_consortium_prior_when_its_weights_may_not_leave_a_bank():
    # the key authority would refuse every prior round's sum: refused at start, naming the fields
    values = {**label_policy_dict(CONSORTIUM_PRIOR), "allowed_kinds": ["predictions", "node_weight"]}
    with pytest.raises(
        ConfigError, match=r"consortium-sgc.*'weights'.*allowed_kinds = \['predictions', 'node_weight'\]"
    ):
        check_consortium(policy_from_dict(values), build_config({"method": "fedgl"}))


def test_a_release_is_kept_across_settings_that_only_change_training():
    # correction (and any training-only field added later) never invalidates a kept release; ε does
    forward = policy_from_dict(label_policy_dict(OWN_SGC_PRIOR))
    plain = policy_from_dict(label_policy_dict({**OWN_SGC_PRIOR, "correction": "none"}))
    assert release_settings(forward) == release_settings(plain)
    assert set(release_settings(forward)) == RELEASE_FIELDS
    other = policy_from_dict(label_policy_dict({**OWN_SGC_PRIOR, "epsilon": 2.0}))
    assert release_settings(other) != release_settings(forward)


def test_a_release_in_progress_is_taken_back_as_it_was_and_refused_under_other_settings(tmp_path):
    policy = policy_from_dict(label_policy_dict(CONSORTIUM_PRIOR))
    settings = release_settings(policy)
    rng = np.random.default_rng(0)
    labels, train, val = rng.integers(0, 3, 40), np.arange(40) < 10, (np.arange(40) >= 10) & (np.arange(40) < 25)
    release = StagedRelease(labels, train, val, 3, 1.0, 2, "validation-first", 0.5, _random_bytes=seeded_bytes(1))
    path = tmp_path / STAGED_LABELS_FILE
    save_staged_release(path, release, settings)

    back = load_staged_release(path, policy, settings, 40, random_bytes=dont_draw)
    assert back.released == 1 and not back.complete
    for name, array in release.state().items():
        np.testing.assert_array_equal(back.state()[name], array)
    with pytest.raises(ValueError, match="stage 0 cannot be released: 1 of 2 are"):
        back.release(0, np.full((40, 3), 1 / 3))  # a stage is released once, in order

    other = policy_from_dict(label_policy_dict({**CONSORTIUM_PRIOR, "epsilon": 2.0}))
    with pytest.raises(
        ConfigError, match="privacy-labels-staged.npz: a label release in progress made under dp.labels"
    ):
        load_staged_release(path, other, release_settings(other), 40)
    with pytest.raises(ConfigError, match="a release of 40 nodes, but this bank's graph has 41"):
        load_staged_release(path, policy, settings, 41)


def test_under_the_edge_unit_the_bank_still_releases_its_graph_once_and_keeps_it(
    world, small_he, tmp_path, monkeypatch
):
    # the edge unit's path through the same start-up (FederationPrivacy.private_graph): one draw, kept, reused
    edges = {"mechanism": "randomized-response", "epsilon": 4.0}
    policy = policy_from_dict(
        {
            **label_policy_dict(RANDOMISED_RESPONSE, small_he),
            "dp": {"unit": "edge", "edges": edges},
            "budget": {"epsilon": 4.0, "delta": 1e-5, "rounds": 10},
        }
    )
    _, first = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, random_bytes=seeded_bytes(5))
    assert (tmp_path / PREPARED_GRAPH_FILE).exists() and not (tmp_path / LABEL_RELEASE_FILE).exists()
    ledger = (tmp_path / LEDGER_FILE).read_bytes()
    _, again = run_worker(world, policy, tmp_path, [(1, "n2")], monkeypatch, random_bytes=dont_draw)
    assert (tmp_path / LEDGER_FILE).read_bytes() == ledger
    assert_same_round(first, again)

    # under other [dp.edges] settings the kept graph is not the release the ledger paid for: refused, nothing drawn
    kept = (tmp_path / PREPARED_GRAPH_FILE).read_bytes()
    for other in ({**edges, "epsilon": 2.0}, {**edges, "weighting": "none"}):
        changed = policy_from_dict(
            {
                **label_policy_dict(RANDOMISED_RESPONSE, small_he),
                "dp": {"unit": "edge", "edges": other},
                "budget": {"epsilon": 4.0, "delta": 1e-5, "rounds": 10},
            }
        )
        with pytest.raises(ConfigError, match=f"{PREPARED_GRAPH_FILE}: a graph released made under the edge settings"):
            run_worker(world, changed, tmp_path, [(1, "n3")], monkeypatch, random_bytes=dont_draw)
        assert (tmp_path / PREPARED_GRAPH_FILE).read_bytes() == kept and (tmp_path / LEDGER_FILE).read_bytes() == ledger

    # a graph kept by an earlier version (scipy's own file, no settings) is reused as it is
    with np.load(tmp_path / PREPARED_GRAPH_FILE) as archive:
        graph = sp.csr_matrix((archive["data"], archive["indices"], archive["indptr"]), shape=tuple(archive["shape"]))
    sp.save_npz(tmp_path / PREPARED_GRAPH_FILE, graph)
    _, legacy = run_worker(world, policy, tmp_path, [(1, "n2")], monkeypatch, random_bytes=dont_draw)
    assert_same_round(first, legacy)


def test_a_bank_weights_its_released_graph_by_the_feature_posterior_as_the_simulation_does(
    world, small_he, tmp_path, monkeypatch
):
    # [dp.edges] weighting = "feature-posterior" reads the bank's features (privacy/edge_posterior.py): the bank
    # service hands them over as the simulation does, so bank-a keeps the simulation's bank-0 graph, weights included
    edges = {"mechanism": "randomized-response", "epsilon": 2.0, "weighting": "feature-posterior"}
    policy = policy_from_dict(
        {
            **label_policy_dict(RANDOMISED_RESPONSE, small_he),
            "dp": {"unit": "edge", "edges": edges},
            "budget": {"epsilon": 2.0, "delta": 1e-5, "rounds": 10},
        }
    )
    run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, random_bytes=seeded_bytes(5))
    with np.load(tmp_path / PREPARED_GRAPH_FILE) as archive:  # kept as CSR arrays beside the settings
        kept = sp.csr_matrix((archive["data"], archive["indices"], archive["indptr"]), shape=tuple(archive["shape"]))

    prepared = []
    setup = FederationPrivacy.setup

    def keep_adjacencies(self, *args):
        prepared.extend(setup(self, *args))
        return prepared

    monkeypatch.setattr(FederationPrivacy, "setup", keep_adjacencies)
    run_experiment(
        CONFIG,
        world.dataset,
        False,
        PlaintextSummation(),
        privacy=FederationPrivacy(policy, random_bytes=seeded_bytes(5)),
    )
    assert np.unique(kept.data).size > 1  # weights per similarity bin
    np.testing.assert_array_equal(kept.toarray(), prepared[0].toarray())
