"""The key authority's HTTP shell: status codes, reason codes, limits, persistence, and a real mTLS process.

The decryption rules themselves are tested in-process in ``test_key_authority.py``; here we check
that they survive the trip over HTTP unchanged, that bad input is a 4xx that leaves the service
serving, and that the mTLS role reaches the library (so a bank's attempt is refused *and* audited).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import ssl
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.audit import verify_audit_chain
from fedgl_secure.crypto.key_authority import KeyAuthority, Refusal
from fedgl_secure.crypto.masking import mask_sum, unmask
from fedgl_secure.crypto.receipts import sign_receipt
from fedgl_secure.crypto.upload import RoundTicket, make_upload, upload_c1
from fedgl_secure.errors import ConfigError, DecryptionRefused
from fedgl_secure.log import get_logger
from fedgl_secure.methods.base import PREDICTIONS, WEIGHTS
from fedgl_secure.services import tls, wire
from fedgl_secure.services.config import KeyAuthoritySection, NodeConfig, NodeRole, PkiLayout
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
from fedgl_secure.services.retry import retry_until_ready
from fedgl_secure.wire import encodings

OPERATOR_SECRET = "correct horse battery staple"
FEDERATION = "fed-test"
BANKS = ("bank-a", "bank-b", "bank-c")
LENGTH = 50
MAX_BODY = 512 * 1024  # a small-parameter chunk is ≈ 90 KB, and each receipted upload adds its c1 (64 KB)


class Service:
    """A key authority behind its HTTP shell, driven through a TestClient as any node."""

    def __init__(self, state_dir: Path, policy, keys: dict[str, Ed25519PrivateKey] | None = None) -> None:
        self.policy = policy
        self.authority = KeyAuthority(state_dir, policy, OPERATOR_SECRET)
        self.keys = keys or {name: Ed25519PrivateKey.generate() for name in BANKS}
        for name, key in self.keys.items():
            self.authority.register_bank(name, key.public_key())
        self.app = create_app(self.authority, max_body_bytes=MAX_BODY, decrypt_max_body_bytes=MAX_BODY)
        self.http = TestClient(self.app, base_url="https://key-authority", raise_server_exceptions=False)
        self.client = KeyAuthorityClient(self.http)
        self.act_as("aggregator", NodeRole.AGGREGATOR)
        self.public = ckks.load_public_context(self.client.public_context()[0])
        self.values = {name: np.linspace(-1.0, 1.0, LENGTH) * (i + 1) for i, name in enumerate(BANKS)}

    def act_as(self, name: str, role: NodeRole) -> None:
        self.app.dependency_overrides[tls.caller_identity] = lambda: tls.Caller(name, role)

    def close(self) -> None:
        self.http.close()
        self.authority.close()

    @property
    def fingerprint(self) -> str:
        return self.authority.fingerprint

    def open(self, round_number: int, participants=BANKS) -> RoundTicket:
        digest = self.policy.digest
        ticket = RoundTicket(
            FEDERATION, round_number, secrets.token_hex(16), len(participants), self.fingerprint, digest
        )
        self.client.open_round(FEDERATION, round_number, ticket.nonce, participants, digest)
        return ticket

    def summed(self, ticket: RoundTicket, kind: str = WEIGHTS, senders=BANKS[:2]):
        """The aggregator's padded sum (SEAL ciphertexts for the key authority) and the receipts; the pad is
        kept in ``self.last`` for :meth:`opened`."""
        uploads = [
            make_upload(self.public, self.policy.he, ticket, name, self.keys[name], kind, self.values[name])
            for name in senders
        ]
        self.last = mask_sum(self.public, ckks.add_serialized(self.public, [u.chunks for u in uploads]), LENGTH)
        self.last_c1 = [upload_c1(self.public, u.chunks) for u in uploads]  # sent beside the sum
        self.last_receipts = [u.receipt for u in uploads]
        return self.last.chunks, [u.receipt for u in uploads]

    def opened(self, residues) -> np.ndarray:
        """What the aggregator makes of a decryption reply (a response or residues): unpad and decode."""
        if isinstance(residues, httpx.Response):
            assert residues.headers["content-type"] == "application/octet-stream"
            residues = encodings.decode_uint64(residues.content)
        return unmask(self.public, self.last, residues)

    def post_decrypt(self, ticket, kind=WEIGHTS, chunks=None, receipts=None, fingerprint=None, round_number=None):
        summed, signed = self.summed(ticket, kind)
        meta = DecryptRequest(
            federation=FEDERATION,
            round=ticket.round if round_number is None else round_number,
            kind=kind,
            context_fingerprint=fingerprint or self.fingerprint,
            length=LENGTH,
            receipts=[r.model_dump(mode="json") for r in (signed if receipts is None else receipts)],
        )
        # one c1 frame set per receipt sent, so that the receipts themselves are what the authority judges
        c1s = self.last_c1 if receipts is None else [self.last_c1[0]] * len(receipts)
        body = encode_decrypt_body(summed if chunks is None else chunks, c1s)
        return self.http.post("/v1/decrypt", content=body, headers={DECRYPT_HEADER: encodings.encode_header(meta)})

    def expected(self, senders=BANKS[:2]) -> np.ndarray:
        return sum(self.values[name] for name in senders)

    def audit_records(self) -> list[dict]:
        return [json.loads(line) for line in self.authority.audit.path.read_text().splitlines()]


@pytest.fixture
def service(tmp_path, small_policy):
    service = Service(tmp_path / "ka", small_policy)
    yield service
    service.close()


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code, body
    return body["detail"]


def test_health_and_public_context_for_every_role(service):
    for name, role in [("aggregator", NodeRole.AGGREGATOR), ("bank-a", NodeRole.BANK)]:
        service.act_as(name, role)
        assert service.http.get("/v1/health").json() == {
            "name": "key-authority",
            "role": "key-authority",
            "fingerprint": service.fingerprint,
            "status": "ok",
        }
        response = service.http.get("/v1/context")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers[FINGERPRINT_HEADER] == hashlib.sha256(response.content).hexdigest()
        assert response.headers[FINGERPRINT_HEADER] == service.fingerprint
        context = ckks.load_public_context(response.content)  # refuses a context with a secret key
        assert not ckks.has_secret_key(context)
    data, fingerprint = service.client.public_context()
    assert fingerprint == service.fingerprint and data == service.authority.public_context
    assert service.client.health().fingerprint == service.fingerprint


def test_bank_is_refused_and_audited(service):
    ticket = service.open(1)
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
    detail = _error(service.post_decrypt(ticket), 403, Refusal.NOT_AGGREGATOR.value)
    assert "role 'bank' may not request decryption" in detail
    with pytest.raises(DecryptionRefused) as caught:
        service.client.decrypt(FEDERATION, 1, WEIGHTS, [b"x"], [], service.fingerprint, LENGTH, [])
    assert caught.value.reason == Refusal.NOT_AGGREGATOR.value
    refused = [r for r in service.audit_records() if r["event"] == "decrypt"]
    assert [(r["decision"], r["reason"], r["caller"]) for r in refused] == [("refused", "not-aggregator", "bank")] * 2
    # the bank's attempts consumed nothing: the aggregator still gets the sum
    service.act_as("aggregator", NodeRole.AGGREGATOR)
    assert service.post_decrypt(ticket).status_code == 200


def test_full_round_over_http(service):
    ticket = service.open(1)
    summed, receipts = service.summed(ticket, WEIGHTS)
    residues = service.client.decrypt(
        FEDERATION, 1, WEIGHTS, summed, receipts, service.fingerprint, LENGTH, service.last_c1
    )
    assert residues.dtype == np.uint64 and residues.size == service.authority.level.size  # one chunk's, flat
    np.testing.assert_allclose(service.opened(residues), service.expected(), atol=1e-6)
    response = service.post_decrypt(ticket, kind=PREDICTIONS)
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    np.testing.assert_allclose(service.opened(response), service.expected(), atol=1e-6)
    report = service.client.audit_report()
    assert report.ok and report.problem is None and report.records == len(service.audit_records())


def test_refusals_map_to_403_with_reason_and_service_keeps_serving(service):
    ticket = service.open(1)
    _, (receipt_a, receipt_b) = service.summed(ticket)
    forged = sign_receipt(Ed25519PrivateKey.generate(), receipt_a.fields())  # right fields, wrong key
    cases = [
        (dict(receipts=[receipt_a]), Refusal.BELOW_QUORUM, "1 valid receipts, the quorum is 2"),
        (dict(receipts=[forged, receipt_b]), Refusal.BAD_RECEIPT, "receipt 0: "),
        (dict(receipts=[receipt_a, receipt_a]), Refusal.DUPLICATE_SENDER, "two receipts from 'bank-a'"),
        (dict(fingerprint="ab" * 32), Refusal.FOREIGN_CONTEXT, "is not this authority's"),
        (dict(round_number=7), Refusal.STALE_ROUND, "round 7 is not the open round 1"),
    ]
    for kwargs, reason, detail in cases:
        assert detail in _error(service.post_decrypt(ticket, **kwargs), 403, reason.value)
    assert service.post_decrypt(ticket).status_code == 200
    assert "was already decrypted" in _error(service.post_decrypt(ticket), 403, Refusal.ALREADY_DECRYPTED.value)
    with pytest.raises(DecryptionRefused) as caught:
        summed, receipts = service.summed(ticket)
        service.client.decrypt(FEDERATION, 1, WEIGHTS, summed, receipts, service.fingerprint, LENGTH, service.last_c1)
    assert caught.value.reason == Refusal.ALREADY_DECRYPTED.value

    second = service.open(2)
    assert "round 1 is not the open round 2" in _error(
        service.post_decrypt(ticket, kind=PREDICTIONS), 403, Refusal.STALE_ROUND.value
    )
    response = service.post_decrypt(second, kind=PREDICTIONS)
    assert response.status_code == 200
    np.testing.assert_allclose(service.opened(response), service.expected(), atol=1e-6)
    decisions = [(r["decision"], r.get("reason")) for r in service.audit_records() if r["event"] == "decrypt"]
    assert decisions.count(("allowed", None)) == 2 and len(decisions) == 10
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
    with pytest.raises(wire.ServiceError) as caught:
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
    summed, _ = service.summed(ticket)
    framed = encode_decrypt_body(summed, service.last_c1)
    header = encodings.encode_header(_meta(service))

    def post(body: bytes, value: str | None = header) -> httpx.Response:
        return service.http.post("/v1/decrypt", content=body, headers={DECRYPT_HEADER: value} if value else {})

    assert "does not start with b'FGC1'" in _error(post(b"garbage!" * 4), 400, "bad-wire-format")
    detail = _error(post(framed[:-100]), 400, "bad-wire-format")
    assert "announces" in detail and "(truncated)" in detail
    assert "trailing garbage" in _error(post(framed + b"junk"), 400, "bad-wire-format")
    detail = _error(service.post_decrypt(ticket, chunks=[summed[0], summed[0]]), 400, "bad-wire-format")
    assert "announces 4 chunks at offset 4, more than the 3 allowed" in detail
    detail = _error(service.post_decrypt(ticket, chunks=[b"\x00" * 1000]), 400, Refusal.BAD_CIPHERTEXT.value)
    assert "not a CKKS ciphertext of this context" in detail
    assert f"missing header {DECRYPT_HEADER}" in _error(post(framed, None), 400, "bad-wire-format")
    assert f"header {DECRYPT_HEADER}: " in _error(post(framed, "e30" + header), 400, "bad-wire-format")
    negative = encodings.encode_header(_meta(service).model_copy(update={"length": -1}))
    detail = _error(post(framed, negative), 400, "bad-wire-format")
    assert f"header {DECRYPT_HEADER}: length: Input should be greater than or equal to 0" in detail
    detail = _error(service.post_decrypt(ticket, chunks=[b"\x00" * (MAX_BODY + 1)]), 413, "body-too-large")
    assert f"the limit is {MAX_BODY} bytes" in detail
    # nothing was consumed: the same (round, kind) still decrypts
    response = service.post_decrypt(ticket)
    assert response.status_code == 200
    np.testing.assert_allclose(service.opened(response), service.expected(), atol=1e-6)


def _meta(service: Service) -> DecryptRequest:
    return DecryptRequest(
        federation=FEDERATION,
        round=1,
        kind=WEIGHTS,
        context_fingerprint=service.fingerprint,
        length=LENGTH,
        receipts=[receipt.model_dump(mode="json") for receipt in service.last_receipts],
    )


def test_restart_keeps_ledger_and_audit_chain(tmp_path, small_policy):
    first = Service(tmp_path / "ka", small_policy)
    ticket = first.open(1)
    assert first.post_decrypt(ticket).status_code == 200
    before = first.client.audit_report()
    assert before.ok
    first.close()

    second = Service(tmp_path / "ka", small_policy, keys=first.keys)
    try:
        assert second.fingerprint == first.fingerprint
        _error(second.post_decrypt(ticket), 403, Refusal.ALREADY_DECRYPTED.value)
        after = second.client.audit_report()
        assert after.ok and after.records > before.records
        assert verify_audit_chain(second.authority.audit.path, expected_head=before.head).ok  # old records kept
        records = second.audit_records()
        assert records[: before.records][-1]["hash"] == before.head
        assert (records[-1]["event"], records[-1]["reason"]) == ("decrypt", "already-decrypted")
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


# --- a real process over mutual TLS --------------------------------------------------------------


def _write_consortium(root: Path, small_he) -> Path:
    """A provisioned two-bank loopback consortium whose key authority reads its secret from a file."""
    write_loopback_consortium(root, banks=("bank-a", "bank-b"), he=small_he, federation=FEDERATION)
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
    from fedgl_secure.services.config import load_node_config

    config = _write_consortium(tmp_path, small_he)
    node, consortium = load_node_config(config)
    layout, url = PkiLayout(consortium.pki_dir), consortium.key_authority.url
    log_path = tmp_path / "key-authority.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            node_command(config),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "FEDGL_KA_SECRET": ""},
        )
    try:
        aggregator = tls.make_http_client(layout, "aggregator", url, timeout=5.0, expect_role=NodeRole.KEY_AUTHORITY)
        bank = tls.make_http_client(layout, "bank-a", url, timeout=5.0)

        def health():
            assert process.poll() is None, log_path.read_text()
            return KeyAuthorityClient(aggregator).health()

        health = retry_until_ready(health, "key authority", get_logger(), timeout=90, interval=0.25)
        data, fingerprint = KeyAuthorityClient(aggregator).public_context()
        assert health.fingerprint == fingerprint and not ckks.has_secret_key(ckks.load_public_context(data))

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
        aggregator.close()
        bank.close()
    finally:
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
    audit = (tmp_path / "state" / "key-authority" / "audit.jsonl").read_text().splitlines()
    assert any('"reason":"not-aggregator"' in line for line in audit)
    assert verify_audit_chain(tmp_path / "state" / "key-authority" / "audit.jsonl").ok
