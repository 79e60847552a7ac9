"""Fed²GNN's exchange through a relay (methods/fed2gnn_relay.py): banks that only talk to the relay get exactly the
simulation's level sums, the relay holds masked vectors only, and bad input is refused with nothing lost."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from test_fed2gnn import _banks

from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.config import NodeRole
from fedgl_secure.consortium.coordinator import Coordinator
from fedgl_secure.consortium.pseudonyms import pseudonymise
from fedgl_secure.crypto import pairwise_masks
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.key_authority import KeyAuthority
from fedgl_secure.crypto.secure_summation import local_key_ceremony
from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.methods.fed2gnn_exchange import exchange_context, exchange_level_sums
from fedgl_secure.methods.fed2gnn_relay import (
    BankIdentity,
    ExchangeKeyFile,
    ExchangeRelay,
    LocalPort,
    run_bank_exchange,
    sign_exchange_key,
)
from fedgl_secure.policy.schema import Policy
from fedgl_secure.services import http_conventions, tls
from fedgl_secure.services.aggregator_client import AggregatorClient
from fedgl_secure.services.aggregator_service import create_app
from fedgl_secure.wire import encodings

FEDERATION = "relay-test"
HOPS = 2
OCTET = {"Content-Type": http_conventions.OCTET_STREAM}


@pytest.fixture(scope="module")
def graph():
    return synthetic_consortium(seed=5, num_nodes=500, num_val=100, num_test=150)


class RecordingPort(LocalPort):
    """The relay's view of one bank: every masked term it uploaded (what crossed the wire)."""

    def __init__(self, relay, bank, log):
        super().__init__(relay, bank)
        self.log = log

    def upload_term(self, level, active, nonce, masked):
        self.log.append((self.bank, level, active, masked.copy()))
        super().upload_term(level, active, nonce, masked)


def _identities(names, signing):
    """Each bank's identity in the exchange: its signing key, every bank's verification key, shared pseudonyms."""
    verify = {name: key.public_key() for name, key in signing.items()}
    pseudonym_key = secrets.token_bytes(32)
    return {
        n: BankIdentity(n, FEDERATION, signing[n], verify, lambda ids: pseudonymise(pseudonym_key, ids)) for n in names
    }


def _in_threads(banks, exchange_of):
    """``exchange_of(bank)`` for every bank, each on a thread of its own (the banks wait for one another)."""
    results, errors = {}, []

    def bank_side(bank):
        try:
            results[bank.index] = exchange_of(bank)
        except Exception as error:  # reported below: a thread's exception would otherwise vanish
            errors.append(error)

    threads = [threading.Thread(target=bank_side, args=(bank,)) for bank in banks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


def _pause():
    time.sleep(0.002)


@pytest.fixture(scope="module")
def exchanged(graph):
    banks, *_ = _banks(graph, num_clients=3)
    names = [f"bank-{k}" for k in range(len(banks))]
    signing = {name: Ed25519PrivateKey.generate() for name in names}
    relay = ExchangeRelay(FEDERATION, names, HOPS, None, {n: k.public_key() for n, k in signing.items()})
    uploads, identities = [], _identities(names, signing)

    def exchange_of(bank):
        name = names[bank.index]
        return run_bank_exchange(bank, identities[name], RecordingPort(relay, name, uploads), HOPS, _pause)

    results = _in_threads(banks, exchange_of)
    return banks, names, signing, relay, uploads, results


def test_banks_through_the_relay_get_the_simulations_sums_bit_for_bit(exchanged):
    banks, _, _, _, _, results = exchanged
    expected = exchange_level_sums(banks, HOPS, secure=True, nonce=b"another nonce, other masks")
    for bank in banks:
        boundary, sums = results[bank.index]
        assert np.array_equal(boundary, expected.boundaries[bank.index])
        assert len(sums) == HOPS
        for got, want in zip(sums, expected.sums[bank.index], strict=True):
            assert got.shape == want.shape and np.array_equal(got, want)
    assert any(sums[0].size and np.abs(sums[0]).max() > 0 for _, sums in results.values())


def test_the_relay_never_holds_a_plain_or_recoverable_term(exchanged):
    banks, names, _, relay, uploads, results = exchanged
    # the relay now holds the sums only; each is not the plain sum
    held = relay.held()
    assert len(held) == HOPS * len(banks) and all(a.dtype == np.uint64 for a in held)
    for index, name in enumerate(names):
        boundary, sums = results[index]
        relayed = relay.relayed_sum(name, 1)
        assert not np.allclose(pairwise_masks.dequantise(relayed), sums[0].ravel(), atol=1.0)
    # every uploaded vector differs from the plain fixed-point term the bank computed
    for sender, level, active, masked in [u for u in uploads if u[1] == 1]:
        s, a = names.index(sender), names.index(active)
        term = banks[s].passive_term(banks[s].signals.astype(np.float64), a, results[a][0])
        plain = pairwise_masks.quantise(term.ravel())
        assert masked.shape == plain.shape and np.mean(masked == plain) < 0.01
        # even the relay together with the active bank (which removes its own mask m_pa) does not get the term
        # back: with two passive banks, the pairwise mask between them stays on it
        key = banks[a].key
        context = exchange_context(bytes.fromhex(relay.nonce), level, a)
        peer = pairwise_masks.public_bytes(banks[s].key)
        without_active = pairwise_masks.unmask_sum(masked, [pairwise_masks.pair_seed(key, peer, context)])
        assert np.mean(without_active == plain) < 0.01
        bits = np.unpackbits(masked.view(np.uint8))
        assert 0.45 < bits.mean() < 0.55


def test_bad_input_is_refused_and_nothing_is_lost(graph):
    names = ["bank-0", "bank-1", "bank-2"]
    signing = {name: Ed25519PrivateKey.generate() for name in names}
    relay = ExchangeRelay(FEDERATION, names, HOPS, 3, {n: k.public_key() for n, k in signing.items()})
    nonce = relay.nonce
    keys = {name: pairwise_masks.new_private_key() for name in names}

    def publish(name, signer=None):
        public = pairwise_masks.public_bytes(keys[name])
        signature = sign_exchange_key(signing[signer or name], FEDERATION, nonce, name, public)
        return relay.publish_key(name, nonce, public, signature)

    def code(call):
        with pytest.raises(ProtocolConflict) as caught:
            call()
        return caught.value.code

    assert code(lambda: publish("bank-0", signer="bank-1")) == "bad-signature"  # bank-1 signs a key for bank-0
    assert code(lambda: relay.publish_key("bank-9", nonce, b"\x00" * 32, "00" * 64)) == "unknown-bank"
    assert code(lambda: relay.publish_key("bank-0", "ab" * 16, b"\x00" * 32, "00" * 64)) == "stale-exchange"
    assert publish("bank-0") and not publish("bank-0")  # a repeat is a duplicate
    term = np.arange(6, dtype=np.uint64)
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-0", nonce, term)) == "not-ready"  # boundaries missing
    for name in names[1:]:
        publish(name)
    boundaries = {"bank-0": ["a" * 64, "b" * 64], "bank-1": ["c" * 64], "bank-2": []}
    assert code(lambda: relay.announce_boundary("bank-0", nonce, 4, boundaries["bank-0"])) == "bad-width"
    assert code(lambda: relay.announce_boundary("bank-0", nonce, 3, ["a" * 64] * 2)) == "bad-boundary"
    for name, pseudonyms in boundaries.items():
        assert relay.announce_boundary(name, nonce, 3, pseudonyms)
    assert not relay.announce_boundary("bank-1", nonce, 3, boundaries["bank-1"])
    assert code(lambda: relay.announce_boundary("bank-1", nonce, 3, ["d" * 64])) == "boundary-changed"
    assert relay.view().complete
    # bank-0's sum needs 2 boundary rows x width 3 = 6 values from bank-1 and bank-2
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-0", nonce, term[:5])) == "bad-term"
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-0", nonce, term.astype(np.float64))) == "bad-term"
    assert code(lambda: relay.accept_term("bank-0", 1, "bank-0", nonce, term)) == "not-passive"
    assert code(lambda: relay.accept_term("bank-1", 3, "bank-0", nonce, term)) == "bad-level"
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-7", nonce, term)) == "unknown-bank"
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-0", "00" * 16, term)) == "stale-exchange"
    assert relay.accept_term("bank-1", 1, "bank-0", nonce, term)
    assert not relay.accept_term("bank-1", 1, "bank-0", nonce, term.copy())  # replay of the same bytes
    assert code(lambda: relay.accept_term("bank-1", 1, "bank-0", nonce, term + np.uint64(1))) == "conflicting-upload"
    assert code(lambda: relay.relayed_sum("bank-0", 1)) == "not-ready"
    other = np.full(6, 2**64 - 1, dtype=np.uint64)
    assert relay.accept_term("bank-2", 1, "bank-0", nonce, other)
    # the refused uploads changed nothing: the sum is of the two accepted terms, mod 2^64
    assert np.array_equal(relay.relayed_sum("bank-0", 1), term + other)
    assert not relay.accept_term("bank-2", 1, "bank-0", nonce, other)  # a late repeat is still a duplicate
    assert code(lambda: relay.accept_term("bank-2", 1, "bank-0", nonce, term)) == "conflicting-upload"


@pytest.fixture
def http_relay(tmp_path, small_he, graph):
    """A fed2gnn aggregator behind its HTTP shell (one app per bank, each with that bank's identity)."""
    banks, *_ = _banks(graph, num_clients=3)
    names = ["bank-a", "bank-b", "bank-c"]
    signing = {name: Ed25519PrivateKey.generate() for name in names}
    policy = Policy(he=small_he, quorum=3)  # a quorum above t = 2, as the policy requires
    # the federation's collective public context, from the key ceremony of these banks (t from the policy)
    roster = Roster(FEDERATION, tuple(names), policy.he.threshold, policy.digest)
    authority = KeyAuthority(tmp_path / "ka", policy, b"operator-secret-for-tests-0123", roster)
    for name, key in signing.items():
        authority.register_bank(name, key.public_key())
    decryptors = local_key_ceremony(authority, signing, tmp_path / "banks")
    store = AggregatorStore(tmp_path / "aggregator.sqlite3")
    config = build_config(
        {
            "method": "fed2gnn",
            "federation": {"partition": "louvain", "num_clients": 3},
            "fed2gnn": {"hops": HOPS, "projection_dim": 2},  # p + 1 = 3: the test banks' signal width
        }
    )
    coordinator = Coordinator(
        federation=FEDERATION,
        config=config,
        policy=policy,
        banks=names,
        signing_keys={name: key.public_key() for name, key in signing.items()},
        public_context=authority.public_context,
        store=store,
        decryptor=None,  # the exchange never decrypts
    )
    clients = {}
    for name in names:
        app = create_app(coordinator)
        app.dependency_overrides[tls.caller_identity] = lambda name=name: tls.Caller(name, NodeRole.BANK)
        clients[name] = TestClient(app, base_url="https://aggregator", raise_server_exceptions=False)
    yield banks, names, signing, coordinator, clients
    for client in clients.values():
        client.close()
    store.close()
    for decryptor in decryptors.values():
        decryptor.close()
    authority.close()


def test_the_exchange_over_http_equals_the_simulation_and_bad_uploads_get_4xx(http_relay):
    banks, names, signing, coordinator, clients = http_relay
    relay = coordinator.exchange()
    assert relay.width == 3  # fixed by the configuration's projection
    # before the directory is complete a term is not-ready
    early = clients["bank-b"].put(
        f"/v1/exchange/levels/1/terms/bank-a?nonce={relay.nonce}", content=b"\x00" * 8, headers=OCTET
    )
    assert (early.status_code, early.json()["error"]) == (409, "not-ready")
    identities = _identities(names, signing)

    def exchange_of(bank):
        name = names[bank.index]
        return run_bank_exchange(bank, identities[name], AggregatorClient(clients[name]), HOPS, _pause)

    results = _in_threads(banks, exchange_of)
    expected = exchange_level_sums(banks, HOPS, secure=True, nonce=b"other masks")
    for bank in banks:
        boundary, sums = results[bank.index]
        assert np.array_equal(boundary, expected.boundaries[bank.index])
        assert all(np.array_equal(a, b) for a, b in zip(sums, expected.sums[bank.index], strict=True))
    sums_before = {(n, k): relay.relayed_sum(n, k).copy() for n in names for k in (1, 2)}

    http = clients["bank-b"]
    size = relay.term_length("bank-a")

    def put(path, body, nonce=relay.nonce):
        response = http.put(f"{path}?nonce={nonce}", content=body, headers=OCTET)
        return response.status_code, response.json().get("error", response.json().get("duplicate"))

    good = np.zeros(size, dtype=np.uint64)
    assert put("/v1/exchange/levels/1/terms/bank-a", encodings.encode_uint64(good)[:-8]) == (400, "bad-wire-format")
    assert put("/v1/exchange/levels/1/terms/bank-a", good.astype(np.float32).tobytes()) == (400, "bad-wire-format")
    assert put("/v1/exchange/levels/1/terms/bank-z", encodings.encode_uint64(good)) == (409, "unknown-bank")
    assert put("/v1/exchange/levels/1/terms/bank-b", b"") == (409, "not-passive")
    assert put("/v1/exchange/levels/3/terms/bank-a", encodings.encode_uint64(good)) == (409, "bad-level")
    assert put("/v1/exchange/levels/1/terms/bank-a", encodings.encode_uint64(good), "0" * 32) == (409, "stale-exchange")
    # another term for a sum already made (a replay with other bytes) is a conflict; nothing changes
    assert put("/v1/exchange/levels/1/terms/bank-a", encodings.encode_uint64(good)) == (409, "conflicting-upload")
    assert http.put("/v1/exchange/levels/1/terms/bank-a", content=b"", headers=OCTET).status_code == 422  # no nonce
    forged = {"nonce": relay.nonce, "public_key": "00" * 32, "signature": "00" * 64}
    assert http.put("/v1/exchange/key", json=forged).json()["error"] == "bad-signature"
    assert http.get("/v1/exchange/levels/9/sum").json()["error"] == "bad-level"
    assert all(np.array_equal(relay.relayed_sum(*k), v) for k, v in sums_before.items())
    # the relay serves each bank its own sum only (the caller is the active bank)
    served = clients["bank-c"].get("/v1/exchange/levels/1/sum")
    assert (
        served.status_code == 200
        and encodings.decode_uint64(served.content).tolist() == sums_before[("bank-c", 1)].tolist()
    )
    assert AggregatorClient(clients["bank-a"]).exchange_view().complete
    progress = clients["bank-a"].get("/v1/status").json()["exchange"]
    assert progress == {"keys": names, "boundaries": names, "sums_made": 6, "sums_expected": 6}


class Stopped(Exception):
    pass


def test_a_bank_restarted_mid_exchange_republishes_its_stored_key_and_finishes(graph, tmp_path):
    banks, *_ = _banks(graph, num_clients=3)
    names = [f"bank-{k}" for k in range(len(banks))]
    signing = {name: Ed25519PrivateKey.generate() for name in names}
    relay = ExchangeRelay(FEDERATION, names, HOPS, None, {n: k.public_key() for n, k in signing.items()})
    identities = _identities(names, signing)
    key_file = ExchangeKeyFile(tmp_path / "fed2gnn-exchange.key")

    def stop():
        raise Stopped

    def exchange_of(bank):
        name = names[bank.index]
        port = LocalPort(relay, name)
        if bank.index != 0:
            return run_bank_exchange(bank, identities[name], port, HOPS, _pause)
        # bank-0 dies at its first wait (for the others' keys, or for a sum), its key and boundary published
        with contextlib.suppress(Stopped):  # (it may, rarely, never have to wait: the restart then repeats every step)
            run_bank_exchange(bank, identities[name], port, HOPS, stop, key_file.key_for)
        assert (tmp_path / "fed2gnn-exchange.key").stat().st_mode & 0o077 == 0
        # a restarted process draws another key: the relay refuses it; the stored key is published again
        restarted = dataclasses.replace(bank, key=pairwise_masks.new_private_key())
        with pytest.raises(ProtocolConflict, match="key-changed"):
            run_bank_exchange(restarted, identities[name], port, HOPS, _pause)
        return run_bank_exchange(restarted, identities[name], port, HOPS, _pause, key_file.key_for), restarted.key

    results = _in_threads(banks, exchange_of)
    results[0], key = results[0]
    expected = exchange_level_sums(banks, HOPS, secure=True, nonce=b"other masks")
    for k in range(len(banks)):
        assert all(np.array_equal(a, b) for a, b in zip(results[k][1], expected.sums[k], strict=True))
    # a relay that restarted (another nonce) gets a fresh key from the same file
    assert not np.array_equal(
        pairwise_masks.public_bytes(key_file.key_for("ff" * 16)), pairwise_masks.public_bytes(key)
    )
