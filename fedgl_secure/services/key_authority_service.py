"""The key authority as an HTTP service over mutual TLS: a thin shell over :class:`KeyAuthority`.

Every rule lives in the library (``crypto/key_authority.py``); this module only moves bytes:

========================  ==========  =====================================================
endpoint                  who         what
========================  ==========  =====================================================
``GET /v1/health``        any node    service name, role, context fingerprint (null during the
                                      key ceremony), status
``GET /v1/context``       any node    the collective *public* CKKS context (octet-stream) and
                                      ``X-FedGL-Context-Fingerprint``; 409 ``not-ready`` until
                                      every bank has announced its public key share
``GET /v1/ceremony/       bank        the key authority's public key share p_0 (uint64 residues)
authority-share``
``POST /v1/ceremony/      bank        a signed :class:`ceremony_messages.Announcement` (JSON) of the
announce``                            calling bank
``GET /v1/ceremony/       bank        every announcement received so far (JSON list)
announcements``
``POST /v1/ceremony/      bank        the calling bank's Shamir shares, each sealed to its
deal``                                recipient (JSON list of :class:`ShareEnvelope`)
``GET /v1/ceremony/       bank        the envelopes dealt to the calling bank so far
envelopes``
``POST /v1/rounds/open``  aggregator  JSON :class:`OpenRoundRequest` → ``{"opened": true}``;
                                      a refused round is 409
``POST /v1/decrypt``      (any node)  body: each receipted upload's ``c1`` polynomials (uint64
                                      residues, one frame per upload and chunk,
                                      :func:`encodings.encode_chunks`); header
                                      ``X-FedGL-Decrypt``: :class:`DecryptRequest`; → the key
                                      authority's partial decryption of their sum, uint64
                                      (octet-stream; chunks x data primes x N, NTT form). The
                                      caller's mTLS role goes to the library, so a bank is
                                      refused *and audited* (403 ``not-aggregator``)
``GET /v1/audit/verify``  any node    :class:`AuditReport` of the hash-chained audit log
========================  ==========  =====================================================

Errors are JSON ``{"error": <code>, "detail": <message>}``: refusals are 403 with the stable
reason code of :class:`Refusal` (``bad-ciphertext`` is 400), malformed bodies and headers 400,
oversized bodies 413. :class:`KeyAuthorityClient` is the aggregator's side of the same API.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from typing import Annotated, Any

import httpx
import numpy as np
import structlog
from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from fedgl_secure.consortium.config import ConsortiumConfig, NodeConfig, NodeRole, PkiLayout
from fedgl_secure.crypto import ceremony_messages, ckks, share_envelopes
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.key_authority import KeyAuthority, Refusal
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.errors import ConfigError, ContextError, DecryptionRefused
from fedgl_secure.log import configure_logging, get_logger
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services import http_conventions, pki, tls
from fedgl_secure.wire import encodings

FINGERPRINT_HEADER = "X-FedGL-Context-Fingerprint"
DECRYPT_HEADER = "X-FedGL-Decrypt"
OCTET_STREAM = http_conventions.OCTET_STREAM
MAX_VALUES = 2**31 - 1
MAX_RECEIPTS = 1024
# A decryption request carries one kind's summed ciphertexts (M x C values, ~33 bytes each): 3 x 1,000,000
# customers make 161 MB of embeddings, past the 64 MiB cap of every other body (the aggregator's uploads
# have the same cap).
DECRYPT_MAX_BODY_BYTES = 1024 * 1024 * 1024
_HEX64 = r"^[0-9a-f]{64}$"
_HEX64_SCHEMA = {"type": "string", "pattern": _HEX64}

# Who may call: the mTLS caller, checked against roles (module-level so FastAPI can resolve the names).
# Any consortium node: pki.read_identity already refuses (401) a certificate without a known role.
AnyCaller = Annotated[tls.Caller, Depends(tls.caller_identity)]
AggregatorOnly = Annotated[tls.Caller, Depends(tls.require_roles(NodeRole.AGGREGATOR))]
BankOnly = Annotated[tls.Caller, Depends(tls.require_roles(NodeRole.BANK))]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class HealthResponse(_Schema):
    name: str
    role: str = NodeRole.KEY_AUTHORITY.value
    fingerprint: str | None  # None until the key ceremony completes
    status: str = "ok"


class OpenRoundRequest(_Schema):
    federation: str = Field(min_length=1, max_length=128)
    round: http_conventions.JsonInt = Field(ge=1, le=http_conventions.MAX_JSON_INT)
    nonce: str = Field(pattern=r"^[0-9a-f]{16,128}$")
    participants: list[str] = Field(min_length=1, max_length=MAX_RECEIPTS)
    policy_sha256: str = Field(pattern=_HEX64)  # the aggregator's policy digest: one policy for every node


class OpenRoundResponse(_Schema):
    opened: bool
    federation: str
    round: int


class DecryptRequest(_Schema):
    """What ``X-FedGL-Decrypt`` carries next to the summed ciphertext body.

    Receipts stay loose dicts here: the key authority parses and verifies them, so a malformed or
    forged receipt is a refusal in the audit log rather than a bare 400.
    """

    federation: str = Field(min_length=1, max_length=128)
    round: http_conventions.JsonInt = Field(ge=1, le=http_conventions.MAX_JSON_INT)
    kind: str = Field(min_length=1, max_length=64)
    context_fingerprint: str = Field(pattern=_HEX64)
    length: http_conventions.JsonInt = Field(ge=0, le=MAX_VALUES)
    receipts: list[dict[str, Any]] = Field(max_length=MAX_RECEIPTS)


class AuditReport(_Schema):
    ok: bool
    records: int
    head: str
    broken_line: int | None = None
    problem: str | None = None


def create_app(
    authority: KeyAuthority,
    max_body_bytes: int = encodings.DEFAULT_MAX_BODY_BYTES,
    name: str = "key-authority",
    decrypt_max_body_bytes: int = DECRYPT_MAX_BODY_BYTES,
) -> FastAPI:
    """The HTTP shell over ``authority`` (the caller keeps ownership: it closes the authority); decryption
    requests may be up to ``decrypt_max_body_bytes``, every other body up to ``max_body_bytes``."""
    log = get_logger(node=name, role=NodeRole.KEY_AUTHORITY.value)
    slots = authority.policy.he.poly_modulus_degree // 2
    # The authority serialises its own state changes and audit checks (one lock in the library).
    app = FastAPI(title="fedgl-secure key authority", version="1")
    http_conventions.install_error_handlers(
        app, log=log, max_body_bytes=max_body_bytes, path_limits={"/v1/decrypt": decrypt_max_body_bytes}
    )

    @app.get("/v1/health", response_model=HealthResponse)
    def health(caller: AnyCaller) -> HealthResponse:
        return HealthResponse(name=name, fingerprint=authority.fingerprint)

    @app.get(
        "/v1/context",
        response_class=Response,
        responses=http_conventions.binary_response(
            "the public CKKS context (no secret key)",
            headers={FINGERPRINT_HEADER: {"description": "SHA-256 of the body", "schema": _HEX64_SCHEMA}},
        ),
    )
    def context(caller: AnyCaller) -> Response:
        log.debug("context.served", caller=caller.name)
        return Response(
            authority.public_context, media_type=OCTET_STREAM, headers={FINGERPRINT_HEADER: authority.fingerprint}
        )

    @app.get(
        "/v1/ceremony/authority-share",
        response_class=Response,
        responses=http_conventions.binary_response(
            "the key authority's public key share p_0: little-endian uint64 residues, key-level primes x N, NTT form"
        ),
    )
    def authority_share(caller: BankOnly) -> Response:
        return Response(ceremony_messages.residue_bytes(authority.authority_share), media_type=OCTET_STREAM)

    @app.post(
        "/v1/ceremony/announce",
        responses=http_conventions.error_responses(400, 409),
        openapi_extra=http_conventions.json_request(
            "the bank's signed announcement (ceremony_messages.Announcement)",
            ceremony_messages.Announcement.json_schema(),
        ),
    )
    async def announce(request: Request, caller: BankOnly) -> dict:
        announcement = ceremony_messages.Announcement.from_json(await request.body())
        await run_in_threadpool(authority.accept_announcement, caller.name, announcement)
        log.info("ceremony.announced", caller=caller.name)
        return {"accepted": True}

    @app.get("/v1/ceremony/announcements")
    def announcements(caller: BankOnly) -> list[dict]:
        return [message.to_data() for message in authority.announcements()]

    @app.post(
        "/v1/ceremony/deal",
        responses=http_conventions.error_responses(400, 409),
        openapi_extra=http_conventions.json_request(
            "the Shamir shares the bank dealt, each sealed to its recipient (share_envelopes.ShareEnvelope)",
            {"type": "array", "maxItems": MAX_RECEIPTS, "items": share_envelopes.ShareEnvelope.json_schema()},
        ),
    )
    async def deal(request: Request, caller: BankOnly) -> dict:
        try:
            raw = json.loads(await request.body())
            if not isinstance(raw, list) or len(raw) > MAX_RECEIPTS:
                raise ValueError("expected a JSON list of share envelopes")
        except ValueError as error:
            raise encodings.WireError(f"share envelopes: {error}") from None
        envelopes = [share_envelopes.ShareEnvelope.from_data(item) for item in raw]
        await run_in_threadpool(authority.accept_envelopes, caller.name, envelopes)
        log.info("ceremony.dealt", caller=caller.name, envelopes=len(envelopes))
        return {"accepted": len(envelopes)}

    @app.get("/v1/ceremony/envelopes")
    def envelopes(caller: BankOnly) -> list[dict]:
        return [envelope.to_data() for envelope in authority.envelopes_for(caller.name)]

    @app.post("/v1/rounds/open", response_model=OpenRoundResponse, responses=http_conventions.error_responses(409))
    def open_round(request: OpenRoundRequest, caller: AggregatorOnly) -> OpenRoundResponse:
        authority.open_round(
            request.federation, request.round, request.nonce, request.participants, request.policy_sha256
        )
        log.info("round.opened", caller=caller.name, federation=request.federation, round=request.round)
        return OpenRoundResponse(opened=True, federation=request.federation, round=request.round)

    @app.post(
        "/v1/decrypt",
        response_class=Response,
        responses={
            **http_conventions.binary_response(
                "the key authority's partial decryption c1·s_0 + E of the uploads' sum (NTT form): little-endian "
                "uint64, ciphertexts x data primes x N"
            ),
            **http_conventions.error_responses(400, 403),
        },
        openapi_extra=http_conventions.binary_request(
            "each receipted upload's c1 polynomials (uint64 residues, one frame per upload and chunk), framed by "
            "encodings.encode_chunks",
            headers={DECRYPT_HEADER: "DecryptRequest as base64url compact JSON (encodings.encode_header)"},
        ),
    )
    async def decrypt(request: Request, caller: AnyCaller) -> Response:
        try:
            meta = encodings.decode_header(request.headers.get(DECRYPT_HEADER), DecryptRequest, DECRYPT_HEADER)
        except encodings.WireError:
            if caller.role is not NodeRole.AGGREGATOR:  # the role decides first: never a 400 for a bank
                raise DecryptionRefused(
                    Refusal.NOT_AGGREGATOR.value, f"role {caller.role.value!r} may not request decryption"
                ) from None
            raise
        bound = log.bind(caller=caller.name, federation=meta.federation, round=meta.round, kind=meta.kind)
        if caller.role is not NodeRole.AGGREGATOR:
            # Refused by the library, without reading the body, so the attempt lands in the audit log.
            await run_in_threadpool(_decrypt, authority, caller, meta, [])
            raise AssertionError(f"the key authority accepted a decryption request from role {caller.role.value!r}")
        # every rule that needs no c1 first: a request the key authority refuses anyway is refused (403) before its
        # body is read, so a malformed body (400) is reported only for a request that could be served
        await run_in_threadpool(authority.check_decryption, *_request_fields(caller, meta))
        body = await request.body()  # capped at max_body_bytes by http_conventions.BodyLimitMiddleware (413)
        c1s = decode_decrypt_body(body, meta, slots, authority.level.shape)
        bound.info("decrypt.requested", bytes=len(body), receipts=len(meta.receipts))
        residues = await run_in_threadpool(_decrypt, authority, caller, meta, c1s)
        return Response(encodings.encode_uint64(residues), media_type=OCTET_STREAM)

    @app.get("/v1/audit/verify", response_model=AuditReport)
    def audit_verify(caller: AnyCaller) -> AuditReport:
        report = authority.verify_audit()
        log.info("audit.verified", caller=caller.name, ok=report.ok, records=report.lines)
        return AuditReport(
            ok=report.ok, records=report.lines, head=report.head, broken_line=report.broken_line, problem=report.problem
        )

    return app


def _request_fields(caller: tls.Caller, meta: DecryptRequest) -> tuple:
    """What the key authority's rules read of a decryption request, in its methods' order."""
    return (
        caller.role.value,
        meta.federation,
        meta.round,
        meta.kind,
        meta.receipts,
        meta.context_fingerprint,
        meta.length,
    )


def _decrypt(
    authority: KeyAuthority,
    caller: tls.Caller,
    meta: DecryptRequest,
    c1s: Sequence[np.ndarray],
) -> np.ndarray:
    return authority.decrypt_sum(*_request_fields(caller, meta), c1s)


def encode_decrypt_body(upload_c1: Sequence[np.ndarray]) -> bytes:
    """A decryption request's body: each receipted upload's ``c1`` polynomials (one frame per upload and chunk,
    little-endian uint64 residues), chunk-framed."""
    return encodings.encode_uint64_frames(upload_c1)


def decode_decrypt_body(
    body: bytes, meta: DecryptRequest, slots: int, level_shape: tuple[int, int]
) -> list[np.ndarray]:
    """:func:`encode_decrypt_body` read back: per receipt, its upload's ``c1`` (chunks, k, N); a body whose frames do
    not divide into them is a :class:`encodings.WireError` naming the count."""
    return encodings.decode_uint64_frames(body, len(meta.receipts), ckks.chunk_count(meta.length, slots), level_shape)


class KeyAuthorityClient:
    """The aggregator's view of the key authority (over an mTLS :class:`httpx.Client`).

    Errors come back as the exceptions the library raises in-process: a refusal is
    :class:`DecryptionRefused` with its reason code; anything else is :class:`ServiceError`.
    """

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return http_conventions.call_service(self.http, "key authority", method, path, **kwargs)

    def health(self) -> HealthResponse:
        return HealthResponse.model_validate_json(self._call("GET", "/v1/health").content)

    def public_context(self) -> tuple[bytes, str]:
        """The public context bytes and their fingerprint, checked to be the SHA-256 of the bytes; 409 ``not-ready``
        (:class:`ProtocolConflict`) until the key ceremony completes."""
        response = self._call("GET", "/v1/context")
        data, announced = response.content, response.headers.get(FINGERPRINT_HEADER, "")
        actual = ckks.fingerprint(data)
        if announced != actual:
            raise ContextError(
                f"the key authority's context is {len(data)} bytes with SHA-256 {actual[:12]}…, but "
                f"{FINGERPRINT_HEADER} says {announced[:12] or '(missing)'}… (altered in transit?)"
            )
        return data, actual

    def open_round(
        self, federation: str, round_number: int, nonce: str, participants: Sequence[str], policy_sha256: str
    ) -> None:
        request = OpenRoundRequest(
            federation=federation,
            round=round_number,
            nonce=nonce,
            participants=participants,
            policy_sha256=policy_sha256,
        )
        self._call("POST", "/v1/rounds/open", json=request.model_dump(mode="json"))

    def authority_share(self) -> np.ndarray:
        """The key authority's public key share p_0, flat uint64 (the bank's ceremony checks its shape)."""
        return encodings.decode_uint64(self._call("GET", "/v1/ceremony/authority-share").content)

    def announce(self, announcement: ceremony_messages.Announcement) -> None:
        self._call(
            "POST",
            "/v1/ceremony/announce",
            content=announcement.to_json().encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )

    def announcements(self) -> list[ceremony_messages.Announcement]:
        items = self._call("GET", "/v1/ceremony/announcements").json()
        return [ceremony_messages.Announcement.from_data(item) for item in items]

    def deal(self, envelopes: Sequence[share_envelopes.ShareEnvelope]) -> None:
        self._call("POST", "/v1/ceremony/deal", json=[envelope.to_data() for envelope in envelopes])

    def envelopes(self) -> list[share_envelopes.ShareEnvelope]:
        items = self._call("GET", "/v1/ceremony/envelopes").json()
        return [share_envelopes.ShareEnvelope.from_data(item) for item in items]

    def decrypt(
        self,
        federation: str,
        round_number: int,
        kind: str,
        receipts: Sequence[Receipt | dict],
        fingerprint: str,
        length: int,
        upload_c1: Sequence[np.ndarray],
    ) -> np.ndarray:
        """The key authority's partial decryption of the receipted uploads' sum (flat uint64; the fusion checks its
        count and range); raises :class:`DecryptionRefused` with the authority's reason."""
        meta = DecryptRequest(
            federation=federation,
            round=round_number,
            kind=kind,
            context_fingerprint=fingerprint,
            length=length,
            receipts=[r.model_dump(mode="json") if isinstance(r, Receipt) else dict(r) for r in receipts],
        )
        response = self._call(
            "POST",
            "/v1/decrypt",
            content=encode_decrypt_body(upload_c1),
            headers={DECRYPT_HEADER: encodings.encode_header(meta), "Content-Type": OCTET_STREAM},
        )
        return encodings.decode_uint64(response.content)

    def audit_report(self) -> AuditReport:
        return AuditReport.model_validate_json(self._call("GET", "/v1/audit/verify").content)


# --- running the node ----------------------------------------------------------------------------


def read_operator_secret(node: NodeConfig, environ: dict[str, str] | None = None) -> bytes:
    """The node's operator secret (it seals the node's key share at rest): the key authority's from its
    ``key_authority`` section, a bank's from its ``bank`` section — ``operator_secret_file`` if it exists, else the
    environment variable ``operator_secret_env``.

    One trailing newline (``\\n`` or ``\\r\\n``) is stripped, as editors and ``echo`` add one.
    """
    environ = dict(os.environ) if environ is None else environ
    name = "bank" if node.role is NodeRole.BANK else "key_authority"
    section = node.bank if node.role is NodeRole.BANK else node.key_authority
    where = node.source or "the node config"
    from_file = section.operator_secret_file is not None and (
        section.operator_secret_file.exists() or not environ.get(section.operator_secret_env)
    )
    if from_file:  # a configured file that does not exist yet yields to the environment variable
        path = section.operator_secret_file
        try:
            secret = path.read_bytes()
            mode = path.stat().st_mode
        except OSError as error:
            raise ConfigError(
                f"{where}: {name}.operator_secret_file: cannot read {path} ({error.strerror or error})"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            get_logger(node=node.name).warning("operator_secret.readable_by_others", path=str(path), mode=oct(mode))
        source = str(path)
    elif environ.get(section.operator_secret_env):
        secret, source = environ[section.operator_secret_env].encode("utf-8"), f"${section.operator_secret_env}"
    else:
        raise ConfigError(
            f"{where}: no operator secret: set {name}.operator_secret_file to a file holding it, or the "
            f"environment variable {section.operator_secret_env} ({name}.operator_secret_env)"
        )
    secret = secret.removesuffix(b"\n").removesuffix(b"\r")
    if not secret:
        raise ConfigError(f"{where}: the operator secret from {source} is empty")
    return secret


def run_key_authority(node: NodeConfig, consortium: ConsortiumConfig) -> None:
    """Serve the key authority until SIGINT/SIGTERM (blocking); closes the authority on the way out."""
    configure_logging(node.log_level, json=True)
    structlog.contextvars.bind_contextvars(node=node.name, role=NodeRole.KEY_AUTHORITY.value)
    log = get_logger()
    policy = load_policy(consortium.policy)
    secret = read_operator_secret(node)
    state_dir = node.state_dir
    layout = PkiLayout(consortium.pki_dir)
    entry = consortium.node(node.name)
    banks = [bank.name for bank in consortium.banks]
    roster = Roster(consortium.federation, tuple(banks), policy.he.threshold, policy.digest)
    authority = KeyAuthority(state_dir, policy, secret, roster)
    try:
        for bank, public_key in pki.load_signing_public_keys(layout, banks).items():
            authority.register_bank(bank, public_key)
        app = create_app(authority, name=node.name)
        server = tls.make_server(app, entry.host, entry.port, layout, node.name, node.log_level)
        log.info(
            "key_authority.serving",
            url=entry.url,
            state_dir=str(state_dir),
            banks=banks,
            fingerprint=authority.fingerprint,
        )
        tls.serve_until_signalled(server)
    finally:
        authority.close()
        log.info("key_authority.stopped")
