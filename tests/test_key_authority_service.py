"""The key authority's HTTP shell: status codes, reason codes, limits, persistence, and a real mTLS process.

Threshold CKKS: the key authority holds only its key share ``s_0``; it relays the banks' key ceremony
(``/v1/ceremony/*``, banks only) and answers a decryption request with its *partial* decryption, which the
aggregator fuses with ``t`` banks' (``partial_decryption.fused_values``). The decryption rules themselves are tested
in-process in ``test_key_authority.py``; here we check that the ceremony and the rules survive the trip over HTTP
unchanged, that bad input is a 4xx that leaves the service serving and consumes nothing, and that the mTLS role
reaches the library (so a bank's attempt to decrypt is refused *and* audited).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import signal
import ssl
import subprocess
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.consortium.config import BankSection, KeyAuthoritySection, NodeConfig, NodeRole, PkiLayout
from fedgl_secure.consortium.retry import retry_until_ready
from fedgl_secure.crypto import ckks, packing, residue_sum, threshold
from fedgl_secure.crypto.audit_log import verify_audit_chain
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.held_share import HeldShare
from fedgl_secure.crypto.key_authority import SEALED_FILE, KeyAuthority, Refusal
from fedgl_secure.crypto.key_ceremony import BankCeremony
from fedgl_secure.crypto.partial_decryption import BankDecryptor, fused_values
from fedgl_secure.crypto.receipts import sign_receipt
from fedgl_secure.crypto.upload import RoundTicket, make_upload, upload_c1
from fedgl_secure.errors import CiphertextError, ConfigError, DecryptionRefused, ProtocolConflict, ServiceError
from fedgl_secure.log import get_logger
from fedgl_secure.methods.base import PREDICTIONS, WEIGHTS
from fedgl_secure.policy.schema import Policy
from fedgl_secure.services import tls
from fedgl_secure.services.bank_keys import ensure_key_share
from fedgl_secure.services.key_authority_service import (
    DECRYPT_HEADER,
    FINGERPRINT_HEADER,
    DecryptRequest,
    KeyAuthorityClient,
    create_app,
    encode_decrypt_body,
    read_operator_secret,
)
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.orchestrate import node_command
from fedgl_secure.services.pki import load_signing_key
from fedgl_secure.wire import encodings

OPERATOR_SECRET = "correct horse battery staple"
FEDERATION = "fed-test"
BANKS = ("bank-a", "bank-b", "bank-c")
DECRYPTING = ("bank-a", "bank-b")  # the t = 2 banks that decrypt a sum here
LENGTH = 50
MAX_BODY = 512 * 1024  # each receipted upload's c1 is one 64 KB frame per chunk under the small parameters
CEREMONY_PATHS = [
    ("GET", "/v1/ceremony/authority-share"),
    ("POST", "/v1/ceremony/announce"),
    ("GET", "/v1/ceremony/announcements"),
    ("POST", "/v1/ceremony/deal"),
    ("GET", "/v1/ceremony/envelopes"),
]


class Service:
    """A key authority behind its HTTP shell, driven through a TestClient as any node; the banks' side of the key
    ceremony runs over the same HTTP API (:meth:`run_ceremony`), and their partial decryptions in-process."""

    def __init__(self, state_dir: Path, policy, keys: dict[str, Ed25519PrivateKey] | None = None) -> None:
        self.policy = policy
        self.roster = Roster(FEDERATION, BANKS, policy.he.threshold, policy.digest)
        self.authority = KeyAuthority(state_dir, policy, OPERATOR_SECRET, self.roster)
        self.keys = keys or {name: Ed25519PrivateKey.generate() for name in BANKS}
        for name, key in self.keys.items():
            self.authority.register_bank(name, key.public_key())
        self.app = create_app(self.authority, max_body_bytes=MAX_BODY, decrypt_max_body_bytes=MAX_BODY)
        self.http = TestClient(self.app, base_url="https://key-authority", raise_server_exceptions=False)
        self.client = KeyAuthorityClient(self.http)
        self.act_as("aggregator", NodeRole.AGGREGATOR)
        self.values = {name: np.linspace(-1.0, 1.0, LENGTH) * (i + 1) for i, name in enumerate(BANKS)}
        self.rings = threshold.rings_for(policy.he)  # the banks' own, from the policy: no key
        self.banks: dict[str, BankDecryptor] = {}

    def act_as(self, name: str, role: NodeRole) -> None:
        self.app.dependency_overrides[tls.caller_identity] = lambda: tls.Caller(name, role)

    def as_bank(self, name: str) -> KeyAuthorityClient:
        self.act_as(name, NodeRole.BANK)
        return self.client

    def close(self) -> None:
        for bank in self.banks.values():
            bank.close()
        self.http.close()
        self.authority.close()

    @property
    def fingerprint(self) -> str:
        return self.authority.fingerprint

    # --- the key ceremony, every bank in turn over HTTP ---------------------------------------------------

    def ceremonies(self) -> dict[str, BankCeremony]:
        crp = threshold.common_random_polynomial(self.rings, self.roster.digest())
        return {name: BankCeremony(self.rings, self.roster, name, key, crp) for name, key in self.keys.items()}

    def run_ceremony(self, ceremonies: dict[str, BankCeremony] | None = None, announced=()) -> dict[str, HeldShare]:
        """Every bank's side (announce, deal, finish) through :class:`KeyAuthorityClient`, each bank calling as
        itself; ``announced``: the banks that already announced. Returns what each bank keeps."""
        ceremonies = ceremonies or self.ceremonies()
        verify_keys = {name: key.public_key() for name, key in self.keys.items()}
        for name, ceremony in ceremonies.items():
            if name not in announced:
                self.as_bank(name).announce(ceremony.announcement())
        for name, ceremony in ceremonies.items():
            client = self.as_bank(name)
            client.deal(ceremony.deal(client.announcements(), verify_keys))
        held = {}
        for name, ceremony in ceremonies.items():
            client = self.as_bank(name)
            authority_share = client.authority_share().reshape(self.rings.key.shape)
            held[name] = ceremony.finish(client.envelopes(), authority_share)
        self.act_as("aggregator", NodeRole.AGGREGATOR)
        return held

    def start_banks(self, held: dict[str, HeldShare], root: Path) -> None:
        """Each bank's partial decryptor over its held share (its ledger under ``root/<bank>``), and the public
        context the aggregator fetches, checked to be the one every bank computed itself."""
        verify_keys = {name: key.public_key() for name, key in self.keys.items()}
        self.banks = {
            name: BankDecryptor(root / name, self.policy, self.rings, share, verify_keys)
            for name, share in held.items()
        }
        data, _ = self.client.public_context()
        assert all(share.public_context == data for share in held.values())
        self.public = ckks.load_public_context(data)

    # --- a round, as the aggregator drives it ----------------------------------------------------------------

    def open(self, round_number: int, participants=BANKS) -> RoundTicket:
        digest = self.policy.digest
        ticket = RoundTicket(
            FEDERATION, round_number, secrets.token_hex(16), tuple(participants), self.fingerprint, digest
        )
        self.client.open_round(FEDERATION, round_number, ticket.nonce, participants, digest)
        return ticket

    def slots(self, kind: str) -> int:
        return packing.slot_length(self.policy.upload_layout(kind), LENGTH)

    def summed(self, ticket: RoundTicket, kind: str = WEIGHTS, senders=BANKS):
        """Fresh uploads of ``senders`` for the round; kept (with their c1 polynomials, sent beside the receipts)
        for :meth:`opened`. Returns the receipts."""
        layout = self.policy.upload_layout(kind)
        self.last_uploads = [
            make_upload(self.public, self.policy.he, ticket, name, self.keys[name], kind, self.values[name], layout)
            for name in senders
        ]
        self.last_ticket, self.last_kind = ticket, kind
        self.last_c1 = [upload_c1(self.public, u.chunks) for u in self.last_uploads]
        self.last_receipts = [u.receipt for u in self.last_uploads]
        return self.last_receipts

    def opened(self, reply, decrypting=DECRYPTING) -> np.ndarray:
        """What the aggregator makes of the key authority's partial decryption (a response or residues) of the last
        sum: fused with the decrypting set's partials, decoded."""
        if isinstance(reply, httpx.Response):
            assert reply.status_code == 200, reply.text
            assert reply.headers["content-type"] == "application/octet-stream"
            reply = encodings.decode_uint64(reply.content)
        round_number, kind = self.last_ticket.round, self.last_kind
        partials = [reply] + [
            self.banks[name].partial(round_number, kind, self.last_receipts, self.last_c1, list(decrypting))
            for name in decrypting
        ]
        layout = self.policy.upload_layout(kind)
        slots = packing.slot_length(layout, LENGTH)
        read = [residue_sum.read_upload(self.public, u.chunks, slots, u.kind) for u in self.last_uploads]
        summed = residue_sum.add(self.public, read)
        return fused_values(self.public, summed, partials, LENGTH, layout, len(self.last_uploads))

    def post(self, ticket, kind=WEIGHTS, receipts=None, c1s=None, fingerprint=None, round_number=None):
        """POST /v1/decrypt for the last uploads (or ``receipts`` and ``c1s`` instead)."""
        meta = DecryptRequest(
            federation=FEDERATION,
            round=ticket.round if round_number is None else round_number,
            kind=kind,
            context_fingerprint=fingerprint or self.fingerprint,
            length=self.slots(kind),
            receipts=[r.model_dump(mode="json") for r in (self.last_receipts if receipts is None else receipts)],
        )
        # one c1 frame set per receipt sent, so that the receipts themselves are what the authority judges
        if c1s is None:
            c1s = self.last_c1 if receipts is None else [self.last_c1[0]] * len(receipts)
        body = encode_decrypt_body(c1s)
        return self.http.post("/v1/decrypt", content=body, headers={DECRYPT_HEADER: encodings.encode_header(meta)})

    def post_decrypt(self, ticket, kind=WEIGHTS, **request):
        self.summed(ticket, kind)
        return self.post(ticket, kind, **request)

    def expected(self, senders=BANKS) -> np.ndarray:
        return sum(self.values[name] for name in senders)

    def audit_records(self) -> list[dict]:
        return [json.loads(line) for line in self.authority.audit.path.read_text().splitlines()]


@pytest.fixture
def policy(small_he):
    """The small parameters, t = 2 of the three banks, and a quorum above t (every bank contributes here)."""
    return Policy(he=small_he, quorum=3)


@pytest.fixture
def fresh(tmp_path, policy):
    """A key authority before the key ceremony."""
    service = Service(tmp_path / "ka", policy)
    yield service
    service.close()


@pytest.fixture
def service(fresh, tmp_path):
    """A key authority after the key ceremony (run over HTTP), with the banks' partial decryptors."""
    fresh.start_banks(fresh.run_ceremony(), tmp_path / "banks")
    return fresh


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code, body
    return body["detail"]


ROLES = [("aggregator", NodeRole.AGGREGATOR), ("bank-a", NodeRole.BANK)]


def test_health_for_every_role_and_the_public_context_once_the_ceremony_is_done(fresh):
    for name, role in ROLES:
        fresh.act_as(name, role)
        health = {"name": "key-authority", "role": "key-authority", "fingerprint": None, "status": "ok"}
        assert fresh.http.get("/v1/health").json() == health  # no context before the ceremony
        assert "bank-c" in _error(fresh.http.get("/v1/context"), 409, "not-ready")
    held = fresh.run_ceremony()
    fingerprint = ckks.fingerprint(held["bank-a"].public_context)
    assert fresh.fingerprint == fingerprint
    for name, role in ROLES:
        fresh.act_as(name, role)
        assert fresh.http.get("/v1/health").json() == {
            "name": "key-authority",
            "role": "key-authority",
            "fingerprint": fingerprint,
            "status": "ok",
        }
        response = fresh.http.get("/v1/context")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers[FINGERPRINT_HEADER] == hashlib.sha256(response.content).hexdigest() == fingerprint
        assert response.content == held["bank-c"].public_context  # the context every bank computed itself
        context = ckks.load_public_context(response.content)  # refuses a context with a secret key
        assert not ckks.has_secret_key(context)
    fresh.act_as("aggregator", NodeRole.AGGREGATOR)
    data, served = fresh.client.public_context()
    assert served == fingerprint and data == fresh.authority.public_context
    assert fresh.client.health().fingerprint == fingerprint


# --- the key ceremony's endpoints ----------------------------------------------------------------------------


def test_the_context_is_not_ready_until_the_last_bank_announces(fresh):
    ceremonies = fresh.ceremonies()
    for count, name in enumerate(BANKS, start=1):
        fresh.act_as("aggregator", NodeRole.AGGREGATOR)
        with pytest.raises(ProtocolConflict) as caught:
            fresh.client.public_context()
        assert caught.value.code == "not-ready"
        assert caught.value.detail.endswith(f"{list(BANKS[count - 1 :])}")  # the banks still awaited
        assert fresh.client.health().fingerprint is None
        fresh.as_bank(name).announce(ceremonies[name].announcement())
        assert [a.bank for a in fresh.client.announcements()] == list(BANKS[:count])
    fresh.act_as("aggregator", NodeRole.AGGREGATOR)
    data, fingerprint = fresh.client.public_context()  # every public share is in: the context exists
    assert fresh.client.health().fingerprint == fingerprint
    held = fresh.run_ceremony(ceremonies, announced=BANKS)  # dealing changes nothing of it
    assert all(share.public_context == data for share in held.values())
    events = [(r["event"], r.get("bank")) for r in fresh.audit_records() if r["event"] != "register"]
    assert events[1:5] == [
        ("announce", "bank-a"),
        ("announce", "bank-b"),
        ("announce", "bank-c"),
        ("ceremony-complete", None),
    ]


def test_a_bank_cannot_announce_or_deal_for_another_bank(fresh):
    ceremonies = fresh.ceremonies()
    fresh.act_as("bank-a", NodeRole.BANK)
    posted = fresh.http.post("/v1/ceremony/announce", content=ceremonies["bank-b"].announcement().to_json())
    detail = _error(posted, 409, "not-your-share")
    assert detail == "'bank-a' cannot announce for 'bank-b'"
    assert fresh.client.announcements() == []  # nothing stored
    fresh.as_bank("bank-b").announce(ceremonies["bank-b"].announcement())
    fresh.as_bank("bank-b").announce(ceremonies["bank-b"].announcement())  # the same one again: a no-op
    with pytest.raises(ProtocolConflict) as caught:  # another key share: one per bank for the federation's life
        fresh.as_bank("bank-b").announce(fresh.ceremonies()["bank-b"].announcement())
    assert caught.value.code == "already-announced"
    assert [a.bank for a in fresh.client.announcements()] == ["bank-b"]
    for name in ("bank-a", "bank-c"):
        fresh.as_bank(name).announce(ceremonies[name].announcement())

    verify_keys = {name: key.public_key() for name, key in fresh.keys.items()}
    announcements = fresh.as_bank("bank-b").announcements()
    dealt_by_b = ceremonies["bank-b"].deal(announcements, verify_keys)
    with pytest.raises(ProtocolConflict) as caught:  # bank-a relays bank-b's envelopes as its own
        fresh.as_bank("bank-a").deal(dealt_by_b)
    assert caught.value.code == "not-your-share"
    assert all(fresh.as_bank(name).envelopes() == [] for name in BANKS)  # nothing stored
    fresh.as_bank("bank-b").deal(dealt_by_b)
    assert [e.dealer for e in fresh.as_bank("bank-a").envelopes()] == [fresh.roster.party("bank-b")]
    assert fresh.as_bank("bank-b").envelopes() == []  # a bank deals no share to itself


def test_an_aggregator_may_not_take_part_in_the_ceremony(fresh):
    announcement = fresh.ceremonies()["bank-a"].announcement()
    for role_name, role in [("aggregator", NodeRole.AGGREGATOR), ("key-authority", NodeRole.KEY_AUTHORITY)]:
        fresh.act_as(role_name, role)
        for method, path in CEREMONY_PATHS:
            body = announcement.to_json() if path.endswith("announce") else "[]"
            response = fresh.http.request(method, path, content=body if method == "POST" else None)
            detail = _error(response, 403, "forbidden")
            assert role_name in detail and "allowed: bank" in detail
    fresh.act_as("bank-a", NodeRole.BANK)
    assert fresh.client.announcements() == [] and fresh.client.envelopes() == []  # nothing was stored


def test_malformed_ceremony_bodies_are_4xx_and_store_nothing(fresh):
    ceremony = fresh.ceremonies()["bank-a"]
    good = ceremony.announcement()
    fields = json.loads(good.to_json())
    other_key = Ed25519PrivateKey.generate()
    unsigned = dataclasses.replace(good, roster_sha256="0" * 64, signature=b"")
    foreign = dataclasses.replace(unsigned, signature=fresh.keys["bank-a"].sign(unsigned.signed_bytes()))
    cases = [
        (b"not json", "announcement: not JSON"),
        (b"[]", "expected a JSON object"),
        (json.dumps({**fields, "type": "share-envelope"}).encode(), "field 'type' is 'share-envelope'"),
        (json.dumps({k: v for k, v in fields.items() if k != "signature"}).encode(), "missing fields ['signature']"),
        (json.dumps({**fields, "public_share": "%%%"}).encode(), "'public_share' is not valid base64"),
        (json.dumps({**fields, "party": -1}).encode(), "'party' must be a non-negative integer"),
    ]
    # well formed (what the OpenAPI document describes), but not bank-a's: signed by another key, or made for
    # another roster — the ceremony refuses them, 409
    refused = [
        (
            dataclasses.replace(good, signature=other_key.sign(good.signed_bytes())).to_json().encode(),
            "bad signature",
        ),
        (foreign.to_json().encode(), "is for another roster"),
    ]
    client = fresh.as_bank("bank-a")
    for body, problem in cases:
        assert problem in _error(fresh.http.post("/v1/ceremony/announce", content=body), 400, "bad-request")
    for body, problem in refused:
        assert problem in _error(fresh.http.post("/v1/ceremony/announce", content=body), 409, "bad-announcement")
    for body, code, problem in [
        (b"{}", "bad-wire-format", "expected a JSON list of share envelopes"),
        (b"[1, 2", "bad-wire-format", "share envelopes: "),
        (b'[{"type": "announcement"}]', "bad-request", "share envelope: field 'type' is 'announcement'"),
    ]:
        assert problem in _error(fresh.http.post("/v1/ceremony/deal", content=body), 400, code)
    assert client.announcements() == [] and client.envelopes() == []  # nothing was stored
    refused = [r for r in fresh.audit_records() if r["event"] == "announce"]
    assert [r["decision"] for r in refused] == ["refused"] * 2  # the two that parsed were checked and audited
    client.announce(good)  # the service still serves, and the right announcement is taken
    assert client.announcements() == [good]


def test_a_refused_batch_of_envelopes_stores_none_of_them(fresh):
    ceremonies = fresh.ceremonies()
    for name, ceremony in ceremonies.items():
        fresh.as_bank(name).announce(ceremony.announcement())
    verify_keys = {name: key.public_key() for name, key in fresh.keys.items()}
    dealt = ceremonies["bank-a"].deal(fresh.client.announcements(), verify_keys)
    stray = dataclasses.replace(dealt[1], recipient=fresh.roster.party("bank-a"))  # a share dealt to itself
    with pytest.raises(ProtocolConflict) as caught:
        fresh.as_bank("bank-a").deal([dealt[0], stray])
    assert caught.value.code == "bad-envelope"
    assert fresh.as_bank("bank-b").envelopes() == []


# --- decryption ----------------------------------------------------------------------------------------------


def test_bank_is_refused_and_audited(service):
    ticket = service.open(1)
    service.summed(ticket)
    service.act_as("bank-a", NodeRole.BANK)
    detail = _error(
        service.http.post(
            "/v1/rounds/open",
            json={"federation": FEDERATION, "round": 2, "nonce": "ab" * 16, "participants": list(BANKS)},
        ),
        403,
        "forbidden",
    )
    assert "'bank'" in detail and "bank-a" in detail and "allowed: aggregator" in detail
    detail = _error(service.post(ticket), 403, Refusal.NOT_AGGREGATOR.value)
    assert "role 'bank' may not request decryption" in detail
    with pytest.raises(DecryptionRefused) as caught:
        service.client.decrypt(FEDERATION, 1, WEIGHTS, [], service.fingerprint, LENGTH, [])
    assert caught.value.reason == Refusal.NOT_AGGREGATOR.value
    refused = [r for r in service.audit_records() if r["event"] == "decrypt"]
    assert [(r["decision"], r["reason"], r["caller"]) for r in refused] == [("refused", "not-aggregator", "bank")] * 2
    # the bank's attempts consumed nothing: the aggregator still gets the sum
    service.act_as("aggregator", NodeRole.AGGREGATOR)
    np.testing.assert_allclose(service.opened(service.post(ticket)), service.expected(), atol=1e-6)


def test_full_round_over_http(service):
    ticket = service.open(1)
    receipts = service.summed(ticket, WEIGHTS)
    residues = service.client.decrypt(
        FEDERATION, 1, WEIGHTS, receipts, service.fingerprint, service.slots(WEIGHTS), service.last_c1
    )
    level = service.authority.level
    assert residues.dtype == np.uint64 and residues.size == level.size  # one chunk's partial decryption, flat
    assert np.all(residues.reshape(level.shape) < level.column())  # reduced modulo the data primes
    np.testing.assert_allclose(service.opened(residues), service.expected(), atol=1e-6)
    # the key authority's partial alone, or with fewer than t banks', decodes to nothing
    with pytest.raises(CiphertextError, match="wrap-around bound"):
        service.opened(residues, decrypting=())
    response = service.post_decrypt(ticket, kind=PREDICTIONS)
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    np.testing.assert_allclose(service.opened(response, decrypting=("bank-b", "bank-c")), service.expected(), atol=1e-6)
    report = service.client.audit_report()
    assert report.ok and report.problem is None and report.records == len(service.audit_records())


def test_refusals_map_to_403_with_reason_and_service_keeps_serving(service):
    ticket = service.open(1)
    receipt_a, receipt_b, receipt_c = service.summed(ticket)
    forged = sign_receipt(Ed25519PrivateKey.generate(), receipt_a.fields())  # right fields, wrong key
    cases = [
        (dict(receipts=[receipt_a, receipt_b]), Refusal.BELOW_QUORUM, "2 valid receipts, the quorum is 3"),
        (dict(receipts=[forged, receipt_b, receipt_c]), Refusal.BAD_RECEIPT, "receipt 0: "),
        (dict(receipts=[receipt_a, receipt_a, receipt_b]), Refusal.DUPLICATE_SENDER, "two receipts from 'bank-a'"),
        (dict(fingerprint="ab" * 32), Refusal.FOREIGN_CONTEXT, "is not this federation's"),
        (dict(round_number=7), Refusal.STALE_ROUND, "round 7 is not the open round 1"),
    ]
    for kwargs, reason, detail in cases:
        assert detail in _error(service.post_decrypt(ticket, **kwargs), 403, reason.value)
    # each upload's c1 must be the one its receipt signed: swapped, they are refused
    service.summed(ticket)
    swapped = _error(service.post(ticket, c1s=service.last_c1[::-1]), 403, Refusal.NOT_A_SUM.value)
    assert "are not the ones it signed" in swapped
    response = service.post(ticket)
    np.testing.assert_allclose(service.opened(response), service.expected(), atol=1e-6)
    assert "was already decrypted" in _error(service.post_decrypt(ticket), 403, Refusal.ALREADY_DECRYPTED.value)
    with pytest.raises(DecryptionRefused) as caught:
        receipts = service.summed(ticket)
        service.client.decrypt(
            FEDERATION, 1, WEIGHTS, receipts, service.fingerprint, service.slots(WEIGHTS), service.last_c1
        )
    assert caught.value.reason == Refusal.ALREADY_DECRYPTED.value

    second = service.open(2)
    assert "round 1 is not the open round 2" in _error(
        service.post_decrypt(ticket, kind=PREDICTIONS), 403, Refusal.STALE_ROUND.value
    )
    response = service.post_decrypt(second, kind=PREDICTIONS)
    np.testing.assert_allclose(service.opened(response), service.expected(), atol=1e-6)
    decisions = [(r["decision"], r.get("reason")) for r in service.audit_records() if r["event"] == "decrypt"]
    assert decisions.count(("allowed", None)) == 2 and len(decisions) == 11
    assert service.client.audit_report().ok


def test_open_round_conflicts_are_409(service):
    service.open(3)
    detail = _error(
        service.http.post(
            "/v1/rounds/open",
            json={
                "federation": FEDERATION,
                "round": 2,
                "nonce": "cd" * 16,
                "participants": list(BANKS),
                "policy_sha256": service.policy.digest,
            },
        ),
        409,
        "policy-conflict",
    )
    assert "round 2 is older than the open round 3" in detail
    with pytest.raises(ServiceError) as caught:
        service.client.open_round(FEDERATION, 4, "ef" * 16, ["bank-a", "bank-x"], service.policy.digest)
    assert caught.value.status == 409 and "['bank-x'] are not registered banks" in caught.value.detail
    detail = _error(
        service.http.post("/v1/rounds/open", json={"federation": FEDERATION, "round": 0, "nonce": "zz"}),
        422,
        "invalid-request",
    )
    assert "body.round" in detail and "body.nonce" in detail and "body.participants: Field required" in detail


def test_bad_bodies_are_4xx_and_consume_nothing(service):
    ticket = service.open(1)
    service.summed(ticket)
    framed = encode_decrypt_body(service.last_c1)
    header = encodings.encode_header(_meta(service))
    level = service.authority.level

    def post(body: bytes, value: str | None = header) -> httpx.Response:
        return service.http.post("/v1/decrypt", content=body, headers={DECRYPT_HEADER: value} if value else {})

    assert "does not start with b'FGC1'" in _error(post(b"garbage!" * 4), 400, "bad-wire-format")
    detail = _error(post(framed[:-100]), 400, "bad-wire-format")
    assert "announces" in detail and "(truncated)" in detail
    assert "trailing garbage" in _error(post(framed + b"junk"), 400, "bad-wire-format")
    # three receipts of one chunk each: three c1 frames, no more, no fewer, each one ciphertext's residues
    detail = _error(
        service.post(ticket, c1s=[service.last_c1[0]] * 4, receipts=service.last_receipts), 400, "bad-wire-format"
    )
    assert "announces 4 chunks at offset 4, more than the 3 allowed" in detail
    one = encodings.encode_uint64_frames(service.last_c1[:1])
    assert "1 frames; 3 arrays of 1 chunks make 3" in _error(post(one), 400, "bad-wire-format")
    short = encodings.encode_chunks([encodings.encode_uint64(service.last_c1[0].reshape(-1)[:-1])] * 3)
    assert f"expected exactly {level.size}" in _error(post(short), 400, "bad-wire-format")
    # well framed, but residues that are no ring element, or a c1 that is not the one the receipt signed: refused
    unreduced = [np.full_like(c1, np.iinfo(np.uint64).max) for c1 in service.last_c1]
    detail = _error(service.post(ticket, c1s=unreduced), 403, Refusal.WRONG_SHAPE.value)
    assert "not reduced modulo the data primes" in detail
    _error(service.post(ticket, c1s=[service.last_c1[0]] * 3), 403, Refusal.NOT_A_SUM.value)
    assert f"missing header {DECRYPT_HEADER}" in _error(post(framed, None), 400, "bad-wire-format")
    assert f"header {DECRYPT_HEADER}: " in _error(post(framed, "e30" + header), 400, "bad-wire-format")
    negative = encodings.encode_header(_meta(service).model_copy(update={"length": -1}))
    detail = _error(post(framed, negative), 400, "bad-wire-format")
    assert f"header {DECRYPT_HEADER}: length: Input should be greater than or equal to 0" in detail
    detail = _error(post(framed + b"\x00" * MAX_BODY), 413, "body-too-large")
    assert f"the limit is {MAX_BODY} bytes" in detail
    # nothing was consumed: the same (round, kind) still decrypts
    np.testing.assert_allclose(service.opened(service.post(ticket)), service.expected(), atol=1e-6)


def _meta(service: Service) -> DecryptRequest:
    return DecryptRequest(
        federation=FEDERATION,
        round=1,
        kind=WEIGHTS,
        context_fingerprint=service.fingerprint,
        length=service.slots(WEIGHTS),
        receipts=[receipt.model_dump(mode="json") for receipt in service.last_receipts],
    )


def test_restart_keeps_ledger_audit_chain_and_the_sealed_share(tmp_path, policy):
    first = Service(tmp_path / "ka", policy)
    held = first.run_ceremony()
    first.start_banks(held, tmp_path / "banks")
    ticket = first.open(1)
    np.testing.assert_allclose(first.opened(first.post_decrypt(ticket)), first.expected(), atol=1e-6)
    before = first.client.audit_report()
    assert before.ok
    context, fingerprint = first.client.public_context()
    sealed = (tmp_path / "ka" / SEALED_FILE).read_bytes()
    first.close()

    second = Service(tmp_path / "ka", policy, keys=first.keys)
    try:
        assert second.fingerprint == fingerprint and second.client.public_context() == (context, fingerprint)
        assert (tmp_path / "ka" / SEALED_FILE).read_bytes() == sealed  # unsealed, not drawn again
        assert [a.bank for a in second.as_bank("bank-c").announcements()] == list(BANKS)  # the ceremony is kept
        second.act_as("aggregator", NodeRole.AGGREGATOR)
        second.start_banks(held, tmp_path / "banks")  # the banks restart too, with their sealed shares and ledgers
        second.last_uploads, second.last_c1, second.last_receipts = (
            first.last_uploads,
            first.last_c1,
            first.last_receipts,
        )
        _error(second.post(ticket), 403, Refusal.ALREADY_DECRYPTED.value)
        after = second.client.audit_report()
        assert after.ok and after.records > before.records
        assert verify_audit_chain(second.authority.audit.path, expected_head=before.head).ok  # old records kept
        records = second.audit_records()
        assert records[: before.records][-1]["hash"] == before.head
        assert (records[-1]["event"], records[-1]["reason"]) == ("decrypt", "already-decrypted")
        # the same s_0 was unsealed: its partial still fuses with the banks' into the sum of a new round
        np.testing.assert_allclose(second.opened(second.post_decrypt(second.open(2))), second.expected(), atol=1e-6)
    finally:
        second.close()


# --- operator secret -----------------------------------------------------------------------------


def _node(tmp_path: Path, secret_file: Path | None = None) -> NodeConfig:
    return NodeConfig(
        name="key-authority",
        role=NodeRole.KEY_AUTHORITY,
        consortium=tmp_path / "consortium.toml",
        key_authority=KeyAuthoritySection(operator_secret_file=secret_file, operator_secret_env="TEST_KA_SECRET"),
        source=tmp_path / "key-authority.toml",
    )


def test_operator_secret_file_wins_and_loses_one_newline(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"from the file, long enough\n")
    path.chmod(0o600)
    assert read_operator_secret(_node(tmp_path, path), {"TEST_KA_SECRET": "from env"}) == b"from the file, long enough"
    assert read_operator_secret(_node(tmp_path), {"TEST_KA_SECRET": "from env\r\n"}) == b"from env"


def test_operator_secret_missing_names_both_options(tmp_path):
    with pytest.raises(ConfigError, match=r"operator_secret_file.*TEST_KA_SECRET"):
        read_operator_secret(_node(tmp_path), {})
    with pytest.raises(ConfigError, match=r"key_authority.operator_secret_file: cannot read .*nowhere"):
        read_operator_secret(_node(tmp_path, tmp_path / "nowhere"), {})
    # a configured file that does not exist (yet) yields to the environment variable
    assert read_operator_secret(_node(tmp_path, tmp_path / "nowhere"), {"TEST_KA_SECRET": "from-env"}) == b"from-env"
    (tmp_path / "empty").write_bytes(b"\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_operator_secret(_node(tmp_path, tmp_path / "empty"), {})


def _bank_node(tmp_path: Path, secret_file: Path | None = None, env: str = "TEST_BANK_SECRET") -> NodeConfig:
    """A bank node whose key-authority section (which a bank must not read) points elsewhere."""
    decoy = tmp_path / "ka-secret"
    decoy.write_bytes(b"the key authority's secret, not the bank's")
    return NodeConfig(
        name="bank-a",
        role=NodeRole.BANK,
        consortium=tmp_path / "consortium.toml",
        key_authority=KeyAuthoritySection(operator_secret_file=decoy, operator_secret_env="TEST_KA_SECRET"),
        bank=BankSection(operator_secret_file=secret_file, operator_secret_env=env),
        source=tmp_path / "bank-a.toml",
    )


def test_a_bank_reads_its_own_operator_secret(tmp_path):
    path = tmp_path / "bank-secret"
    path.write_bytes(b"the bank's own secret\r\n")
    path.chmod(0o600)
    environ = {"TEST_KA_SECRET": "ka from env", "TEST_BANK_SECRET": "bank from env"}
    assert read_operator_secret(_bank_node(tmp_path, path), environ) == b"the bank's own secret"
    assert read_operator_secret(_bank_node(tmp_path), environ) == b"bank from env"
    # by default a bank reads FEDGL_BANK_SECRET, never the key authority's variable
    default = _bank_node(tmp_path, env=BankSection().operator_secret_env)
    assert BankSection().operator_secret_env == "FEDGL_BANK_SECRET"
    assert read_operator_secret(default, {"FEDGL_BANK_SECRET": "bank default"}) == b"bank default"
    with pytest.raises(ConfigError, match=r"bank.operator_secret_file.*FEDGL_BANK_SECRET \(bank.operator_secret_env\)"):
        read_operator_secret(default, {"FEDGL_KA_SECRET": "the key authority's"})
    with pytest.raises(ConfigError, match=r"bank-a.toml: bank.operator_secret_file: cannot read .*nowhere"):
        read_operator_secret(_bank_node(tmp_path, tmp_path / "nowhere"), {})
    (tmp_path / "empty").write_bytes(b"\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_operator_secret(_bank_node(tmp_path, tmp_path / "empty"), environ)


# --- a real process over mutual TLS --------------------------------------------------------------


def _write_consortium(root: Path, small_he) -> Path:
    """A provisioned three-bank loopback consortium (t = 2, a quorum above it) whose key authority reads its secret
    from a file."""
    write_loopback_consortium(root, banks=BANKS, he=small_he, federation=FEDERATION, policy_extra={"quorum": 3})
    (root / "secret.txt").write_text(OPERATOR_SECRET + "\n")
    (root / "secret.txt").chmod(0o600)
    config = root / "key-authority.toml"
    config.write_text(config.read_text() + '\n[key_authority]\noperator_secret_file = "secret.txt"\n')
    return config


@pytest.mark.parametrize(
    "name, role, module, function",
    [
        ("key-authority", "key-authority", "key_authority_service", "run_key_authority"),
        ("aggregator", "aggregator", "aggregator_service", "run_aggregator"),
        ("bank-a", "bank", "bank", "run_bank"),
    ],
)
def test_start_node_dispatches_on_role(tmp_path, small_he, monkeypatch, name, role, module, function):
    import importlib

    from fedgl_secure.services.node import start_node

    _write_consortium(tmp_path, small_he)
    config = tmp_path / f"{name}.toml"
    calls = []
    monkeypatch.setattr(
        importlib.import_module(f"fedgl_secure.services.{module}"), function, lambda *a: calls.append(a)
    )
    start_node(config)
    (node, consortium), *_ = calls
    assert (node.name, node.role.value, consortium.federation) == (name, role, FEDERATION)
    config.write_text(f'name = "{name}"\nrole = "bank"\nconsortium = "consortium.toml"\n')
    if role != "bank":  # the consortium lists it with another role: one line, exit 2
        result = CliRunner().invoke(app, ["node", "start", "--config", str(config)])
        assert result.exit_code == 2, result.output
        assert result.output.strip().count("\n") == 0 and "role: 'bank', but" in result.output
    assert CliRunner().invoke(app, ["node", "start"]).exit_code == 2  # --config is required


@pytest.mark.slow
def test_real_process_over_mutual_tls(tmp_path, small_he):
    from fedgl_secure.consortium.config import load_node_config
    from fedgl_secure.policy.schema import load_policy

    config = _write_consortium(tmp_path, small_he)
    node, consortium = load_node_config(config)
    layout, url = PkiLayout(consortium.pki_dir), consortium.key_authority.url
    banks = tuple(bank.name for bank in consortium.banks)
    policy = load_policy(consortium.policy)
    log_path = tmp_path / "key-authority.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            node_command(config),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "FEDGL_KA_SECRET": ""},
        )
    clients: list[httpx.Client] = []

    def connect(name: str, **kwargs) -> httpx.Client:
        clients.append(tls.make_http_client(layout, name, url, timeout=5.0, **kwargs))
        return clients[-1]

    try:
        aggregator = connect("aggregator", expect_role=NodeRole.KEY_AUTHORITY)
        bank_http = {name: connect(name, expect_role=NodeRole.KEY_AUTHORITY) for name in banks}

        def health():
            assert process.poll() is None, log_path.read_text()
            return KeyAuthorityClient(aggregator).health()

        health = retry_until_ready(health, "key authority", get_logger(), timeout=90, interval=0.25)
        assert health.fingerprint is None  # no context before the ceremony
        with pytest.raises(ProtocolConflict) as caught:
            KeyAuthorityClient(aggregator).public_context()
        assert caught.value.code == "not-ready"
        _error(aggregator.get("/v1/ceremony/announcements"), 403, "forbidden")  # the ceremony is the banks' only

        # the key ceremony, every bank as a bank node runs it: its own mTLS client, its provisioned signing key
        verify_keys = {name: load_signing_key(layout, name).public_key() for name in banks}
        held, failures = {}, []

        def ceremony(name: str) -> None:
            try:
                held[name] = ensure_key_share(
                    tmp_path / "banks" / name,
                    Roster(FEDERATION, banks, policy.he.threshold, policy.digest),
                    name,
                    policy.he,
                    b"bank operator secret",
                    KeyAuthorityClient(bank_http[name]),
                    load_signing_key(layout, name),
                    verify_keys,
                    get_logger(bank=name),
                    timeout=60,
                )
            except Exception as error:  # reported below, on the test's thread
                failures.append((name, error))

        threads = [threading.Thread(target=ceremony, args=(name,)) for name in banks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        assert not failures and set(held) == set(banks), failures
        data, fingerprint = KeyAuthorityClient(aggregator).public_context()
        assert all(share.public_context == data for share in held.values())  # the banks computed it themselves
        assert KeyAuthorityClient(aggregator).health().fingerprint == fingerprint
        assert not ckks.has_secret_key(ckks.load_public_context(data))

        # a round over mTLS: the key authority's partial fused with the t = 2 banks' partials is the sum
        public = ckks.load_public_context(data)
        nonce = secrets.token_hex(16)
        KeyAuthorityClient(aggregator).open_round(FEDERATION, 1, nonce, list(banks), policy.digest)
        ticket = RoundTicket(FEDERATION, 1, nonce, tuple(banks), fingerprint, policy.digest)
        values = {name: np.linspace(0.0, 1.0, LENGTH) * (i + 1) for i, name in enumerate(banks)}
        layout_w = policy.upload_layout(WEIGHTS)
        uploads = [
            make_upload(
                public, policy.he, ticket, name, load_signing_key(layout, name), WEIGHTS, values[name], layout_w
            )
            for name in banks
        ]
        receipts, c1s = [u.receipt for u in uploads], [upload_c1(public, u.chunks) for u in uploads]
        slots = packing.slot_length(layout_w, LENGTH)
        authority = KeyAuthorityClient(aggregator).decrypt(FEDERATION, 1, WEIGHTS, receipts, fingerprint, slots, c1s)
        rings = threshold.rings_for(policy.he)
        partials = [authority]
        decrypting = list(banks[: policy.he.threshold])
        for name in decrypting:
            decryptor = BankDecryptor(tmp_path / "banks" / name, policy, rings, held[name], verify_keys)
            partials.append(decryptor.partial(1, WEIGHTS, receipts, c1s, decrypting))
            decryptor.close()
        summed = residue_sum.add(public, [residue_sum.read_upload(public, u.chunks, slots, u.kind) for u in uploads])
        fused = fused_values(public, summed, partials, LENGTH, layout_w, len(uploads))
        np.testing.assert_allclose(fused, sum(values.values()), atol=1e-6)

        bank = bank_http["bank-a"]
        meta = DecryptRequest(
            federation=FEDERATION, round=1, kind=WEIGHTS, context_fingerprint=fingerprint, length=1, receipts=[]
        )
        response = bank.post(
            "/v1/decrypt",
            content=encodings.encode_chunks([b"x"]),
            headers={DECRYPT_HEADER: encodings.encode_header(meta)},
        )
        assert _error(response, 403, Refusal.NOT_AGGREGATOR.value)
        _error(bank.post("/v1/rounds/open", json={}), 403, "forbidden")

        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.load_verify_locations(cafile=str(layout.ca_cert))
        with httpx.Client(base_url=url, verify=anonymous, timeout=5.0) as stranger, pytest.raises(httpx.HTTPError):
            stranger.get("/v1/health")  # no client certificate: the handshake fails
        assert KeyAuthorityClient(aggregator).health().status == "ok"  # and the service is still up
    finally:
        for client in clients:
            client.close()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    output = log_path.read_text()
    assert code == 0, output
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "key_authority.stopped" and e.get("node") == "key-authority" for e in events), output
    audit_path = tmp_path / "state" / "key-authority" / "audit.jsonl"
    audit = [json.loads(line) for line in audit_path.read_text().splitlines()]
    assert sorted(r["bank"] for r in audit if r["event"] == "announce") == sorted(banks)
    assert any(r.get("event") == "ceremony-complete" and r.get("fingerprint") == fingerprint for r in audit)
    assert any(r.get("decision") == "allowed" and r.get("event") == "decrypt" for r in audit)
    assert any(r.get("reason") == "not-aggregator" for r in audit)
    assert verify_audit_chain(audit_path).ok
