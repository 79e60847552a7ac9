"""Mutual TLS between consortium nodes (DESIGN §5.5): who is calling, and may they call this?

Every node is both a TLS server and a TLS client with a certificate from the consortium CA
(:mod:`fedgl_secure.services.pki`). The handshake authenticates: a server started by
:func:`make_server` refuses any client without a valid, unexpired certificate from that CA. The
endpoints authorise: :func:`require_roles` reads the role the certificate binds and answers 403
to every other role, naming the caller and what is allowed.

uvicorn verifies client certificates but does not hand them to the application, so
:class:`ClientCertProtocol` puts the peer's DER certificate into each request's ASGI scope
(``scope["extensions"]["tls"]["client_cert_der"]``) and :func:`caller_identity` reads it there.
Services' in-process tests override :func:`caller_identity` to act as any node.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Annotated, Any

import httpx
import uvicorn
from cryptography import x509
from fastapi import Depends, HTTPException, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from fedgl_secure.consortium.config import NodeRole, PkiLayout
from fedgl_secure.errors import ConfigError, CryptoError
from fedgl_secure.log import get_logger
from fedgl_secure.services.pki import HINT, NodeIdentity, read_identity

# The node at the other end of a request, as its client certificate names it.
Caller = NodeIdentity

ASGIApp = Callable[..., Any]


# ------------------------------------------------------------------------------------------- server


class ClientCertProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus the client certificate in every request's scope.

    uvicorn creates one protocol object per connection and calls ``self.app`` for each request
    on it, so wrapping ``self.app`` here binds this connection's certificate to its requests only.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der:
            self.app = _with_client_certificate(self.app, der)


def _with_client_certificate(app: ASGIApp, der: bytes) -> ASGIApp:
    async def app_with_certificate(scope: dict, receive: Callable, send: Callable) -> None:
        # Each request has its own scope dict, so setting a key in it touches no other request.
        scope.setdefault("extensions", {})["tls"] = {"client_cert_der": der}
        await app(scope, receive, send)

    return app_with_certificate


GRACEFUL_SHUTDOWN_SECONDS = 3.0
MAX_REQUEST_HEAD_BYTES = 1024 * 1024


def make_server(
    app: ASGIApp, host: str, port: int, layout: PkiLayout, name: str, log_level: str = "warning"
) -> uvicorn.Server:
    """A uvicorn server for node ``name`` that only talks to holders of a consortium certificate.

    OpenSSL checks the client's chain to the consortium CA and its validity period during the
    handshake; Python (3.10+) server contexts refuse anything below TLS 1.2.
    """
    _require_files(layout, name)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=str(layout.tls_cert(name)),
        ssl_keyfile=str(layout.tls_key(name)),
        ssl_ca_certs=str(layout.ca_cert),
        ssl_cert_reqs=ssl.CERT_REQUIRED,
        http=ClientCertProtocol,
        ws="none",  # the websocket protocol would not carry the certificate; no endpoint needs it
        lifespan="on",
        log_config=None,  # logging is the embedding process's business (structlog), not uvicorn's
        log_level=log_level,
        access_log=False,
        proxy_headers=False,  # callers are identified by certificate, never by forwarded headers
        server_header=False,
        # An idle peer that never answers TLS close_notify would hold shutdown for asyncio's 30 s
        # SSL shutdown timeout; in-flight requests are short, so a few seconds is plenty.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # h11's default 16 KiB request head would cap a decryption request's receipts header at
        # ≈ 26 banks; 1 MiB holds the key authority's MAX_RECEIPTS (1024 × ≈ 590 bytes)
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
    )
    return uvicorn.Server(config)


@contextmanager
def run_server_in_thread(server: uvicorn.Server, startup_timeout: float = 10.0) -> Iterator[uvicorn.Server]:
    """Serve in a background thread until the ``with`` block ends (tests, embedding)."""
    thread = threading.Thread(target=_serve, args=(server,), name=f"uvicorn-{server.config.port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    try:
        while not server.started:
            if not thread.is_alive():
                raise ConfigError(
                    f"server on {server.config.host}:{server.config.port} stopped while starting "
                    "(address in use? see its log)"
                )
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"server on {server.config.host}:{server.config.port} not up after {startup_timeout}s"
                )
            time.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=startup_timeout)


def _serve(server: uvicorn.Server) -> None:
    # uvicorn calls sys.exit() when it cannot start (a taken port, say); the thread just ends and
    # run_server_in_thread, seeing it gone before ``started``, reports it.
    with suppress(SystemExit):
        server.run()


# ------------------------------------------------------------------------------------ authorisation


def caller_identity(request: Request) -> Caller:
    """FastAPI dependency: the node whose certificate opened this connection."""
    der = request.scope.get("extensions", {}).get("tls", {}).get("client_cert_der")
    if not der:
        raise HTTPException(401, detail="no client certificate: connect with your consortium TLS certificate")
    try:
        return read_identity(x509.load_der_x509_certificate(der))
    except (ValueError, CryptoError) as error:
        raise HTTPException(401, detail=f"client certificate does not identify a consortium node: {error}") from None


# What these dependencies can answer, so every route using them documents it
# (http_conventions.ERROR_STATUSES_ATTRIBUTE).
caller_identity.error_statuses = (401,)  # type: ignore[attr-defined]


def require_roles(*roles: NodeRole) -> Callable[..., Caller]:
    """FastAPI dependency factory: the caller, if its role is one of ``roles``; 403 naming them otherwise."""
    if not roles:
        raise ValueError("require_roles() needs at least one role")
    allowed = ", ".join(role.value for role in roles)

    def caller_with_role(request: Request, caller: Annotated[Caller, Depends(caller_identity)]) -> Caller:
        if caller.role not in roles:
            detail = (
                f"role {caller.role.value!r} ({caller.name}) may not call {request.method} {request.url.path}; "
                f"allowed: {allowed}"
            )
            get_logger(component="tls").warning(
                "forbidden", caller=caller.name, role=caller.role.value, method=request.method, path=request.url.path
            )
            raise HTTPException(403, detail=detail)
        return caller

    caller_with_role.error_statuses = (403,)  # type: ignore[attr-defined]
    return caller_with_role


# ------------------------------------------------------------------------------------------- client


def client_ssl_context(layout: PkiLayout, name: str) -> ssl.SSLContext:
    """TLS ≥ 1.2 client context: trusts only the consortium CA, checks host names, presents ``name``'s certificate."""
    _require_files(layout, name)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server's chain and host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cafile=str(layout.ca_cert))
    context.load_cert_chain(str(layout.tls_cert(name)), str(layout.tls_key(name)))
    return context


def make_http_client(
    layout: PkiLayout, name: str, base_url: str, timeout: float = 30.0, expect_role: NodeRole | None = None
) -> httpx.Client:
    """An HTTP client for node ``name``; with ``expect_role``, every response must come from a node of that role.

    Any consortium node passes the CA and host-name checks (on one host they share
    ``127.0.0.1``), so without the role check a bank listening on the aggregator's port would be
    believed. The check runs as each response arrives, before the caller sees it; it raises
    :class:`CryptoError` and the response is discarded.
    """
    hooks = {"response": [_server_role_check(expect_role)]} if expect_role is not None else {}
    return httpx.Client(
        base_url=base_url,
        verify=client_ssl_context(layout, name),
        timeout=timeout,
        event_hooks=hooks,
        trust_env=False,  # no proxy or .netrc from the environment between consortium nodes
    )


def _server_role_check(expected: NodeRole) -> Callable[[httpx.Response], None]:
    def check_server_role(response: httpx.Response) -> None:
        where = f"{response.request.method} {response.request.url}"
        stream = response.extensions.get("network_stream")
        ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
        # Positional: httpcore's sync stream hands out the C-level ``_ssl._SSLSocket``, whose
        # getpeercert takes no keywords; ``ssl.SSLObject`` (async, TLS-in-TLS) accepts both.
        der = ssl_object.getpeercert(True) if ssl_object is not None else None
        if not der:  # fail closed: an unverifiable answer is not the expected node's
            raise CryptoError(f"{where}: cannot see the server's certificate to check it is the {expected.value}")
        server = read_identity(x509.load_der_x509_certificate(der))
        if server.role is not expected:
            raise CryptoError(
                f"{where}: answered by {server.name!r} (role {server.role.value!r}), expected the {expected.value}; "
                "check the address in consortium.toml"
            )

    return check_server_role


def _require_files(layout: PkiLayout, name: str) -> None:
    for path in (layout.ca_cert, layout.tls_cert(name), layout.tls_key(name)):
        if not path.is_file():
            raise ConfigError(f"{path}: missing (TLS material of {name!r}); {HINT}")


def serve_until_signalled(server: uvicorn.Server) -> None:
    """``server.run()``, returning normally on SIGINT/SIGTERM so the caller's cleanup runs.

    uvicorn shuts down gracefully on those signals, then restores the previous handlers and raises
    the signal again; with the default handlers the process would die right there (SIGTERM) or
    unwind with a KeyboardInterrupt (SIGINT). The handlers installed here only ask the server to
    stop, which is a no-op once it has.
    """
    if threading.current_thread() is not threading.main_thread():  # signals belong to the main thread
        server.run()
        return

    def stop(_signal: int, _frame: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
