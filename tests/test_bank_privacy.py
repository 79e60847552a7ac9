"""The bank service's DP step in-process: the same release as the simulation, a persisted ledger, fail closed.

A :class:`BankWorker` runs against a scripted aggregator (no network); ``make_upload`` is replaced by
a recorder so the test sees the plaintext values the bank would encrypt.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.consortium import bank_uploads
from fedgl_secure.consortium.aggregator_port import IndexView, RoundResponse, Served
from fedgl_secure.consortium.bank_releases import BankReleases
from fedgl_secure.consortium.bank_state import LEDGER_FILE
from fedgl_secure.consortium.bank_worker import BankWorker
from fedgl_secure.consortium.setup_checks import check_consortium_can_run
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.broadcast_signature import sign_broadcast
from fedgl_secure.crypto.centring import centre_term, wire_reference
from fedgl_secure.crypto.receipts import verify_receipt
from fedgl_secure.crypto.upload import RoundTicket
from fedgl_secure.data.global_index import GlobalIndex
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.data.sampling import make_clients
from fedgl_secure.engine.aggregation import PlaintextSummation
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.round_pipeline import initial_parameters
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.policy.schema import policy_from_dict
from fedgl_secure.privacy.accounting import PrivacyLedger
from fedgl_secure.privacy.dp_round import FederationPrivacy, noise_std
from fedgl_secure.privacy.release_schedule import planned_ledger
from fedgl_secure.privacy.secure_noise import clip_vector
from fedgl_secure.simulation.experiment import run_experiment
from fedgl_secure.wire.broadcast import encode_broadcast, model_label

BANKS = ("bank-a", "bank-b", "bank-c")
PROPORTIONS = [0.5, 0.6, 0.7]


def seeded_bytes(seed: int):
    """A deterministic byte source (tests only: noise from a known source protects nothing)."""
    return np.random.default_rng(seed).bytes


def experiment(method: str = "fedgl-no-gpg"):
    return build_config(
        {
            "dataset": "synthetic",
            "method": method,
            "device": "cpu",
            "federation": {"proportions": PROPORTIONS, "max_rounds": 1, "patience": 5},
        }
    )


def dp_policy(he, *, epsilon: float = 1000.0, noise: str = "distributed", **dp):
    channel = {"clip": 1.0, "noise_multiplier": 1.0, "noise": noise}
    return policy_from_dict(
        {
            "protection": "he",
            "quorum": 3,
            "he": he.model_dump(),
            "allowed_kinds": ["weights", "predictions", "node_weight"],
            "dp": {"weights": channel, "predictions": channel, "graph": {"max_degree": 3}, **dp},
            "budget": {"epsilon": epsilon, "delta": 1e-5, "rounds": 10},
        }
    )


def two_round_budget(policy_of) -> float:
    """A budget between the ε of 2 and of 3 rounds, so exactly 2 rounds fit."""
    probe = policy_of(1000.0)
    two, three = (planned_ledger(probe, n).epsilon(1e-5) for n in (2, 3))
    return (two + three) / 2


class ScriptedAggregator:
    """Serves round views from a script, then ``finished``; the model of every version is W̄ of round 0."""

    def __init__(self, config, index: GlobalIndex, node_ids, views, max_bank_nodes: int):
        self.index_size, self.positions = index.size, index.positions(node_ids)
        self.max_bank_nodes = max_bank_nodes
        self.views = list(views)
        self.model_bytes = None
        self.uploads = []
        self.withdrawals = []

    def enrol(self, features, classes, pseudonyms):
        self.model_bytes = encode_broadcast(Broadcast(0, initial_parameters(CONFIG, features, classes)))

    def index(self):
        return IndexView(self.index_size, self.positions, self.max_bank_nodes)

    def current_round(self):
        return self.views.pop(0) if self.views else RoundResponse(phase="finished", federation="fed", final_version=0)

    def model(self, version):
        body = self.model_bytes
        return Served(body, sign_broadcast(AGGREGATOR_KEY, "fed", "bank-a", model_label(version), body))

    def report(self, version, counts, histograms=None):
        pass

    def upload(self, round_number, kind, chunks, receipt):
        self.uploads.append((round_number, kind))

    def withdraw(self, round_number, reason):
        self.withdrawals.append((round_number, reason))
        return SimpleNamespace(withdrawn=True, duplicate=len(self.withdrawals) > 1)


CONFIG = experiment()
AGGREGATOR_KEY = Ed25519PrivateKey.generate()  # signs what the scripted aggregator serves


@pytest.fixture(scope="module")
def world(small_context):
    dataset = load_dataset("synthetic", None, seed=CONFIG.seed)
    clients = make_clients(dataset, PROPORTIONS, CONFIG.seed, CONFIG.federation.overlap)
    index = GlobalIndex.from_id_sets([c.node_ids for c in clients])
    public = ckks.public_context_bytes(small_context)
    num_parameters = int(initial_parameters(CONFIG, clients[0].features.shape[1], clients[0].num_classes).numel())
    shapes = build_method(CONFIG).upload_shapes(num_parameters, index.size, clients[0].num_classes)
    return SimpleNamespace(dataset=dataset, clients=clients, index=index, public=public, shapes=shapes)


def view(world, round_number: int, nonce: str, policy_sha256: str) -> RoundResponse:
    return RoundResponse(
        phase="open",
        federation="fed",
        round=round_number,
        nonce=nonce,
        base_version=round_number - 1,
        participants=list(BANKS),
        shapes={k: list(v) for k, v in world.shapes.items()},
        context_fingerprint=ckks.fingerprint(world.public),
        policy_sha256=policy_sha256,
    )


def bank_a(world, policy, aggregator, config=CONFIG, **options) -> BankWorker:
    """bank-a's worker over the world's first client (``options``: state_dir, random_bytes)."""
    return BankWorker(
        name="bank-a",
        federation="fed",
        client_index=0,
        config=config,
        graph=world.clients[0],
        aggregator=aggregator,
        public_context=world.public,
        policy=policy,
        signing_key=Ed25519PrivateKey.generate(),
        pseudonym_key=b"k" * 32,
        broadcast_key=AGGREGATOR_KEY.public_key(),
        poll_seconds=0.01,
        **options,
    )


def run_worker(
    world, policy, state_dir, rounds, monkeypatch, *, random_bytes=None, config=CONFIG, aggregator_policy=None
):
    """One bank-a process over the scripted ``rounds`` ((round, nonce) pairs); returns what it would encrypt.
    ``aggregator_policy``: the policy the rounds announce (by default the bank's)."""
    encrypted = []

    def record(context, params, ticket, sender, key, kind, values, layout=None):
        encrypted.append((ticket.round, ticket.nonce, kind, np.array(values, dtype=np.float64)))
        return SimpleNamespace(kind=kind, chunks=[], receipt=None, wire_bytes=0)

    monkeypatch.setattr(bank_uploads, "make_upload", record)
    aggregator = ScriptedAggregator(
        config,
        world.index,
        world.clients[0].node_ids,
        [view(world, r, n, (aggregator_policy or policy).digest) for r, n in rounds],
        max_bank_nodes=max(client.num_nodes for client in world.clients),
    )
    worker = bank_a(world, policy, aggregator, config, state_dir=state_dir, random_bytes=random_bytes)
    worker.run(stop=SimpleNamespace(is_set=lambda: False, wait=lambda seconds: None))
    return worker, encrypted


def test_the_bank_releases_exactly_what_the_simulation_releases(world, small_he, tmp_path, monkeypatch):
    policy = dp_policy(small_he)
    _, encrypted = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, random_bytes=seeded_bytes(7))
    released = {kind: values for _, _, kind, values in encrypted}

    seen, references = {}, {}

    def summation(round_number, contributions, reference=None):
        seen.setdefault(round_number, contributions)
        references.setdefault(round_number, reference.double().numpy())
        return PlaintextSummation()(round_number, contributions)

    # bank 0 draws its noise first in the simulation's round 1, so the same byte source gives the same noise
    run_experiment(
        CONFIG, world.dataset, False, summation, privacy=FederationPrivacy(policy, random_bytes=seeded_bytes(7))
    )
    simulated = seen[1][0]
    assert set(released) == set(simulated)
    for kind, tensor in simulated.items():
        # the bank encrypts its weights centred on W̄, as the simulation's secure summation would (centring.py)
        expected = centre_term(kind, tensor.detach().double().numpy().reshape(-1), references[1])
        np.testing.assert_array_equal(released[kind].reshape(-1), expected)


def released_weights_and_plain(world, policy, tmp_path, monkeypatch):
    """One round of bank-a: the weights it would encrypt, and its contribution and W̄ before the DP step."""
    plain = {}
    original = BankReleases.release

    def spy(self, session, view, broadcast, contribution):
        plain.update(contribution=dict(contribution), reference=broadcast.weights.double().numpy())
        return original(self, session, view, broadcast, contribution)

    monkeypatch.setattr(BankReleases, "release", spy)
    _, encrypted = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch)
    return {kind: values for _, _, kind, values in encrypted}["weights"], plain


def test_released_weights_carry_a_clipped_update_and_a_share_of_the_right_scale(world, small_he, tmp_path, monkeypatch):
    policy = dp_policy(small_he)
    released, plain = released_weights_and_plain(world, policy, tmp_path, monkeypatch)
    weights = plain["contribution"]["weights"].double().numpy()
    w_k, w_max = weights[-1], max(client.num_nodes for client in world.clients)
    scale = w_k / w_max
    # encrypted centred on W̄ (centring.py): ŵ_k·clip(W_k − W̄) plus the share
    expected = scale * clip_vector(weights[:-1] / w_k - plain["reference"], 1.0)
    assert released[-1] == pytest.approx(scale)  # the public ŵ_k, no noise
    noise = released[:-1] - expected
    share = noise_std(policy, "weights") / np.sqrt(policy.quorum)
    # n ≈ thousands of values: the sample std is within 4·std/√(2n) (< 10 %) of the share's std
    tolerance = 4 / np.sqrt(2 * noise.size)
    assert abs(noise.std() / share - 1) < tolerance
    assert abs(noise.mean()) < 4 * share / np.sqrt(noise.size)


def test_a_central_channel_gets_no_bank_share_but_is_recorded_in_the_ledger(world, small_he, tmp_path, monkeypatch):
    policy = dp_policy(small_he, noise="central")
    released, plain = released_weights_and_plain(world, policy, tmp_path, monkeypatch)
    weights = plain["contribution"]["weights"].double().numpy()
    w_k = weights[-1]
    scale = w_k / max(client.num_nodes for client in world.clients)
    expected = scale * clip_vector(weights[:-1] / w_k - plain["reference"], 1.0)  # centred on W̄ (centring.py)
    # clipped and scaled (float32, as every release), with no share: a share here would be of std σ/√q = 2/√3 ≈ 1.15
    np.testing.assert_allclose(released[:-1], expected, rtol=0, atol=1e-6)
    ledger = PrivacyLedger.load(tmp_path / LEDGER_FILE)
    assert {(r.round, r.channel) for r in ledger.releases} == {(1, "weights"), (1, "predictions")}
    assert ledger.epsilon(1e-5) == pytest.approx(planned_ledger(policy, 1).epsilon(1e-5))


def test_a_bank_under_dp_sgd_trains_privately_and_uploads_weights_without_a_channel(
    world, small_he, tmp_path, monkeypatch
):
    from fedgl_secure.privacy import dp_sgd

    steps = []
    original = dp_sgd.NodeDPSGD.train

    def counting(self, trainer, *args):
        steps.append(args[-1])
        return original(self, trainer, *args)

    monkeypatch.setattr(dp_sgd.NodeDPSGD, "train", counting)
    sgd = {"max_grad_norm": 1.0, "noise_multiplier": 5.0, "local_epochs": 2}
    policy = policy_from_dict(
        {
            **dp_policy(small_he).model_dump(exclude={"dp"}),
            "dp": {
                "sgd": sgd,
                "predictions": {"clip": 1.0, "noise_multiplier": 1.0},
                "graph": {"max_degree": 3},
            },
        }
    )
    config = build_config({**CONFIG.model_dump(), "training": {**CONFIG.training.model_dump(), "local_epochs": 2}})
    _, encrypted = run_worker(world, policy, tmp_path, [(1, "n1")], monkeypatch, config=config)
    assert steps == [2]  # the bank's one round trained by DP-SGD, 2 steps
    released = {kind: values for _, _, kind, values in encrypted}
    scale = released["weights"][-1]
    assert 0 < scale <= 1  # ŵ_k: normalised by the public w_max, no noise on it
    ledger = PrivacyLedger.load(tmp_path / LEDGER_FILE)
    assert {(r.round, r.channel, r.steps) for r in ledger.releases} == {(1, "dp_sgd", 2), (1, "predictions", 1)}


def test_the_ledger_survives_a_restart_and_the_bank_stops_at_its_budget(world, small_he, tmp_path, monkeypatch):
    budget = two_round_budget(lambda eps: dp_policy(small_he, epsilon=eps))
    policy = dp_policy(small_he, epsilon=budget)
    ledger_path = tmp_path / LEDGER_FILE

    # round 1, then round 1 reopened (fresh nonce): the same release, charged once
    _, encrypted = run_worker(world, policy, tmp_path, [(1, "n1"), (1, "n2")], monkeypatch)
    first = {(nonce, kind): values for _, nonce, kind, values in encrypted}
    for kind in world.shapes:
        np.testing.assert_array_equal(first[("n1", kind)], first[("n2", kind)])
    after_one = PrivacyLedger.load(ledger_path)
    assert {r.round for r in after_one.releases} == {1}
    assert after_one.epsilon(1e-5) == pytest.approx(planned_ledger(policy, 1).epsilon(1e-5))

    # a restarted bank keeps its spent ε: round 2 fits, round 3 does not
    worker, encrypted = run_worker(world, policy, tmp_path, [(2, "n3"), (3, "n4"), (4, "n5")], monkeypatch)
    assert sorted({r for r, *_ in encrypted}) == [2]
    assert worker.rounds_done == [2]
    assert worker.releases.bank_privacy.stopped_round == 3
    assert worker.withdrawn and worker.aggregator.withdrawals == [(3, "privacy-budget-exhausted")]  # told once
    spent = PrivacyLedger.load(ledger_path).epsilon(1e-5)
    assert spent == pytest.approx(planned_ledger(policy, 2).epsilon(1e-5)) and spent <= budget

    # restarted again: still nothing more to release, and the ledger is unchanged
    after_two = json.loads(ledger_path.read_text())
    worker, encrypted = run_worker(world, policy, tmp_path, [(5, "n6")], monkeypatch)
    assert encrypted == [] and worker.releases.bank_privacy.stopped_round == 5
    assert worker.aggregator.withdrawals == [(5, "privacy-budget-exhausted")]  # withdraws again (idempotent there)
    assert json.loads(ledger_path.read_text()) == after_two


def test_without_dp_the_bank_uploads_its_contribution_over_the_public_w_max(world, small_policy, tmp_path, monkeypatch):
    contributions, references = [], []
    original = BankReleases.release

    def spy(self, session, view, broadcast, contribution):
        contributions.append({k: v.detach().double().numpy().reshape(-1) for k, v in contribution.items()})
        references.append(broadcast.weights.double().numpy())
        return original(self, session, view, broadcast, contribution)

    monkeypatch.setattr(BankReleases, "release", spy)
    worker, encrypted = run_worker(world, small_policy, tmp_path, [(1, "n1")], monkeypatch)
    assert worker.releases.privacy is None and not (tmp_path / LEDGER_FILE).exists()
    w_max = max(client.num_nodes for client in world.clients)  # what the union index told the bank
    assert worker.releases.privacy_normaliser == w_max
    assert {kind for _, _, kind, _ in encrypted} == set(contributions[0])
    for _, _, kind, values in encrypted:
        expected = centre_term(kind, contributions[0][kind] / w_max, references[0])  # weights centred on W̄
        np.testing.assert_allclose(values.reshape(-1), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("method", "dp", "match"),
    [
        ("fedgl", {"sgd": {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "local_epochs": 10}}, "pseudo graph"),
        (
            "fedgl-no-gpg",
            {"sgd": {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "local_epochs": 1}},
            r"trains 10 local epochs per round, but dp\.sgd\.local_epochs = 1",
        ),
    ],
)
def test_the_consortium_refuses_at_start_what_the_simulation_refuses(small_he, method, dp, match):
    policy = dp_policy(small_he, **dp)
    config = experiment(method)
    with pytest.raises(ConfigError, match=match):
        check_consortium_can_run(config, policy, 3)
    with pytest.raises(ConfigError, match=match):  # the same message from the simulation's check
        run_experiment(config, progress=False, privacy=FederationPrivacy(policy))


def test_the_consortium_runs_central_noise_and_refuses_plaintext(small_he):
    check_consortium_can_run(CONFIG, dp_policy(small_he, noise="central"), 3)  # the key authority adds it
    plaintext = policy_from_dict({"protection": "none", "quorum": 2})
    with pytest.raises(ConfigError, match="protection = 'none'"):
        check_consortium_can_run(CONFIG, plaintext, 3)


def test_a_large_upload_is_encrypted_on_the_banks_pool_and_decrypts_to_its_terms(world, small_policy, small_context):
    worker = bank_a(world, small_policy, None)  # encrypt_kinds only encrypts and signs; nothing is sent
    worker.uploads.encryption.min_chunks = 0  # this small upload on the workers too
    generator = torch.Generator().manual_seed(3)
    contribution = {kind: torch.rand(shape, generator=generator) for kind, shape in world.shapes.items()}
    reference = torch.rand(contribution["weights"].numel() - 1, generator=generator)
    ticket = RoundTicket("fed", 1, "ab" * 16, tuple(BANKS), ckks.fingerprint(world.public), small_policy.digest)
    try:
        uploads = list(worker.uploads.encrypt_kinds(ticket, contribution, reference))
        assert worker.uploads.encryption.started or worker.uploads.encryption.workers == 1
    finally:
        worker.close()
    assert sorted(upload.kind for upload in uploads) == sorted(contribution)
    centre = wire_reference(reference)
    for upload in uploads:
        verify_receipt(worker.signing_key.public_key(), upload.receipt)
        term = centre_term(upload.kind, contribution[upload.kind].double().numpy().reshape(-1), centre)
        decrypted = ckks.decrypt_vector(small_context, upload.chunks, upload.length)
        np.testing.assert_allclose(decrypted, term, atol=1e-4)


def test_a_bank_refuses_self_training_at_start_as_the_aggregator_does(world, small_policy):
    """A consortium bank does not self-train: its worker refuses the option by name instead of ignoring it."""
    config = build_config({**CONFIG.model_dump(mode="json"), "method": "graphfl", "self_training": {"per_class": 3}})
    with pytest.raises(ConfigError, match="self_training.per_class: the consortium services do not self-train"):
        bank_a(world, small_policy, None, config=config)


def test_a_bank_does_not_take_part_in_a_round_under_another_policy(world, small_policy, tmp_path, monkeypatch):
    """One policy for all: the round announces the aggregator's policy digest; a bank running another policy
    (here: another quorum, which would size its DP noise shares otherwise) encrypts nothing for it."""
    other = small_policy.model_copy(update={"quorum": small_policy.quorum + 1})
    _, encrypted = run_worker(world, small_policy, tmp_path, [(1, "n1")], monkeypatch, aggregator_policy=other)
    assert encrypted == []
    _, encrypted = run_worker(world, small_policy, tmp_path / "same", [(1, "n1")], monkeypatch)
    assert {kind for _, _, kind, _ in encrypted}  # the same rounds under its own policy: it takes part
