"""Mutual TLS on loopback: the handshake authenticates, the role in the certificate authorises."""

from __future__ import annotations

import socket
import ssl
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from fedgl_secure.consortium.config import NodeRole, PkiLayout, load_consortium
from fedgl_secure.errors import ConfigError, CryptoError
from fedgl_secure.services.loopback import free_ports, write_loopback_consortium
from fedgl_secure.services.tls import (
    Caller,
    caller_identity,
    make_http_client,
    make_server,
    require_roles,
    run_server_in_thread,
)

AnyNode = Annotated[Caller, Depends(caller_identity)]
AggregatorOnly = Annotated[Caller, Depends(require_roles(NodeRole.AGGREGATOR))]


def create_app() -> FastAPI:
    app = FastAPI()

    @app.get("/whoami")
    def whoami(caller: AnyNode) -> dict:
        return {"name": caller.name, "role": caller.role.value}

    @app.post("/v1/decrypt")
    def decrypt(caller: AggregatorOnly) -> dict:
        return {"decrypted_for": caller.name}

    return app


def provisioned_layout(directory: Path, federation: str) -> PkiLayout:
    path = write_loopback_consortium(directory, banks=("bank-a", "bank-b"), federation=federation)
    return PkiLayout(load_consortium(path).pki_dir)


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> PkiLayout:
    return provisioned_layout(tmp_path_factory.mktemp("tls") / "consortium", "tls-test")


@pytest.fixture(scope="module")
def servers(layout):
    """The key authority's and bank-b's servers, by node name → base URL."""
    urls = {}
    with ExitStack() as stack:
        for name in ("key-authority", "bank-b"):
            port = free_ports(1)[0]
            stack.enter_context(run_server_in_thread(make_server(create_app(), "127.0.0.1", port, layout, name)))
            urls[name] = f"https://127.0.0.1:{port}"
        yield urls


def test_the_aggregator_reaches_both_endpoints_and_is_identified(layout, servers):
    url = servers["key-authority"]
    with make_http_client(layout, "aggregator", url, timeout=5, expect_role=NodeRole.KEY_AUTHORITY) as client:
        assert client.get("/whoami").json() == {"name": "aggregator", "role": "aggregator"}
        response = client.post("/v1/decrypt")
        assert response.status_code == 200 and response.json() == {"decrypted_for": "aggregator"}


def test_a_bank_is_refused_the_aggregator_only_endpoint_by_name_and_role(layout, servers):
    url = servers["key-authority"]
    with (
        make_http_client(layout, "bank-a", url, timeout=5) as bank,
        make_http_client(layout, "aggregator", url, timeout=5) as aggregator,
    ):
        assert bank.get("/whoami").json() == {"name": "bank-a", "role": "bank"}
        refused = bank.post("/v1/decrypt")
        assert refused.status_code == 403
        assert refused.json()["detail"] == "role 'bank' (bank-a) may not call POST /v1/decrypt; allowed: aggregator"
        # each kept-alive connection carries its own certificate: interleaving never mixes callers up
        assert aggregator.post("/v1/decrypt").status_code == 200
        assert bank.get("/whoami").json()["name"] == "bank-a"


def _sign_leaf(layout: PkiLayout, directory: Path, role: str, not_after: datetime) -> tuple[Path, Path]:
    """A bank-a style certificate signed by the *real* CA, with the given role and expiry."""
    ca_cert = x509.load_pem_x509_certificate(layout.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(layout.ca_key.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "bank-a"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_after - timedelta(days=10))
        .not_valid_after(not_after)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{role}.crt", directory / f"{role}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _client_trusting_the_real_ca(layout: PkiLayout, chain: tuple[Path, Path] | None) -> httpx.Client:
    """A client that verifies the real server (so any failure is the *server's* refusal) and presents ``chain``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=layout.ca_cert)
    if chain is not None:
        context.load_cert_chain(*chain)
    return httpx.Client(verify=context, timeout=5, trust_env=False)


def _no_certificate(layout: PkiLayout, tmp_path: Path) -> None:
    return None


def _another_ca(layout: PkiLayout, tmp_path: Path) -> tuple[Path, Path]:
    stranger = provisioned_layout(tmp_path / "stranger", "stranger-consortium")
    return stranger.tls_cert("aggregator"), stranger.tls_key("aggregator")


def _expired(layout: PkiLayout, tmp_path: Path) -> tuple[Path, Path]:
    return _sign_leaf(layout, tmp_path, "bank", datetime.now(timezone.utc) - timedelta(days=1))


@pytest.mark.parametrize("chain", [_no_certificate, _another_ca, _expired], ids=lambda f: f.__name__.strip("_"))
def test_the_handshake_refuses_clients_without_a_valid_consortium_certificate(layout, servers, tmp_path, chain):
    with _client_trusting_the_real_ca(layout, chain(layout, tmp_path)) as client:
        # TLS 1.3 clients finish their side of the handshake first, so the refusal may surface on first read
        with pytest.raises((httpx.TransportError, ssl.SSLError)):
            client.get(f"{servers['key-authority']}/whoami")
    valid = (layout.tls_cert("bank-a"), layout.tls_key("bank-a"))
    with _client_trusting_the_real_ca(layout, valid) as control:  # the same client with a good certificate gets in
        assert control.get(f"{servers['key-authority']}/whoami").status_code == 200


def test_a_certificate_without_a_known_role_passes_tls_but_gets_no_identity(layout, servers, tmp_path):
    chain = _sign_leaf(layout, tmp_path, "auditor", datetime.now(timezone.utc) + timedelta(days=1))
    with _client_trusting_the_real_ca(layout, chain) as client:
        response = client.get(f"{servers['key-authority']}/whoami")
    assert response.status_code == 401 and "unknown role OU='auditor'" in response.json()["detail"]


def test_a_server_of_the_wrong_role_is_not_believed(layout, servers):
    with make_http_client(layout, "bank-a", servers["bank-b"], timeout=5, expect_role=NodeRole.AGGREGATOR) as client:
        with pytest.raises(CryptoError, match=r"answered by 'bank-b' \(role 'bank'\), expected the aggregator"):
            client.get("/whoami")


def test_services_tests_can_act_as_any_node_by_overriding_caller_identity():
    app = create_app()
    with TestClient(app) as client:
        assert client.get("/whoami").status_code == 401  # no TLS, no certificate, no identity
        app.dependency_overrides[caller_identity] = lambda: Caller("bank-a", NodeRole.BANK)
        assert client.post("/v1/decrypt").status_code == 403
        app.dependency_overrides[caller_identity] = lambda: Caller("aggregator", NodeRole.AGGREGATOR)
        assert client.post("/v1/decrypt").json() == {"decrypted_for": "aggregator"}


def test_missing_tls_files_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"ca\.crt: missing .*fedgl-secure provision"):
        make_server(create_app(), "127.0.0.1", free_ports(1)[0], PkiLayout(tmp_path), "bank-a")
    with pytest.raises(ConfigError, match=r"ca\.crt: missing .*fedgl-secure provision"):
        make_http_client(PkiLayout(tmp_path), "bank-a", "https://127.0.0.1:1")


def test_a_server_that_cannot_bind_is_reported(layout):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = make_server(create_app(), "127.0.0.1", taken.getsockname()[1], layout, "bank-a", log_level="critical")
        with pytest.raises(ConfigError, match="stopped while starting"):
            with run_server_in_thread(server):
                pass


def test_a_request_head_large_enough_for_a_thousand_receipts_is_accepted(layout, servers):
    """h11 would refuse a head over 16 KiB; a decryption request carries ≈ 590 bytes per receipt."""
    url = servers["key-authority"]
    with make_http_client(layout, "aggregator", url, timeout=10) as client:
        response = client.post("/v1/decrypt", headers={"X-FedGL-Decrypt": "a" * (1000 * 600)})
    assert response.status_code == 200
