"""HTTP conventions shared by every service (DESIGN §5.5); the encodings of what travels are
``fedgl_secure/wire/encodings.py``.

:func:`install_error_handlers` turns the package's typed errors into JSON
``{"error": <code>, "detail": <message>}`` responses (:class:`ErrorBody`) with a 4xx status, so bad input
never takes a service down (a :class:`~fedgl_secure.wire.encodings.WireError` is 400 ``bad-wire-format``),
and documents every error status each route can send with that one model in the service's OpenAPI
document; :class:`BodyLimitMiddleware` refuses oversized bodies before they are read;
:func:`raise_for_service_error` turns error responses back into exceptions on the client side, so an
in-process call and the same call over HTTP fail the same way.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fedgl_secure.crypto.key_authority import Refusal
from fedgl_secure.errors import (
    CiphertextError,
    ConfigError,
    ContextError,
    DecryptionRefused,
    FedGLError,
    PolicyError,
    ProtocolConflict,
    ReceiptError,
    ServiceError,
)
from fedgl_secure.log import get_logger
from fedgl_secure.tomlio import format_validation_error
from fedgl_secure.wire.encodings import WireError

REFUSAL_CODES = frozenset(refusal.value for refusal in Refusal)
"""Error codes that mean "the key authority refused to decrypt" (see :class:`Refusal`)."""

_HTTP_CODES = {
    400: "bad-request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    411: "length-required",
    413: "body-too-large",
    415: "unsupported-media-type",
    422: "invalid-request",
    429: "too-many-requests",
    500: "internal-error",
    503: "unavailable",
}


OCTET_STREAM = "application/octet-stream"
JSON = "application/json"
BINARY_SCHEMA = {"type": "string", "format": "binary"}
CHUNKS_FORMAT = "fedgl-chunks"
"""OpenAPI ``format`` of a chunk-framed ciphertext body (:func:`encode_chunks`); JSON Schema cannot say more."""


MAX_JSON_INT = 2**53 - 1
"""The bound of every request integer: the largest that every JSON parser keeps exact (RFC 7493 §2.2; a
double's mantissa), well inside what SQLite stores (an unbounded one crashed a store with OverflowError)."""


def _json_integer(value: Any) -> Any:
    if isinstance(value, str | bytes | bool):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]
"""A request integer as JSON Schema means it: ``3`` or ``3.0``, never ``"3"`` or ``true`` (pydantic's lax mode takes
both, strict mode refuses ``3.0``); give it bounds with ``Field(ge=..., le=...)`` where it is declared."""
BoundedJsonInt = Annotated[int, Field(ge=-MAX_JSON_INT, le=MAX_JSON_INT), BeforeValidator(_json_integer)]
"""A bounded :data:`JsonInt`, for list items (where a ``Field`` cannot be attached)."""


class ErrorBody(BaseModel):
    """The one error body of every service: a stable code to branch on and a message for a person.

    Codes: a :class:`Refusal` reason (403; ``bad-ciphertext`` 400), a protocol conflict (409, e.g.
    ``stale-round``), ``bad-wire-format``/``bad-receipt``/``bad-context`` (400), ``policy-conflict`` (409),
    ``invalid-request`` (422), and for framework errors the status's name (``forbidden``, ``body-too-large``...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    error: str = Field(min_length=1, description="stable machine-readable code, e.g. 'stale-round'")
    detail: str = Field(description="what was wrong, naming the field, header, byte offset or limit")


def validation_problems(error: ValidationError | RequestValidationError, whole: str = "(whole value)") -> str:
    """One line naming every field pydantic rejected (``round: Input should be ...; ...``)."""
    return format_validation_error(error, whole=whole)


# --- body limits ---------------------------------------------------------------------------------


def _too_large(size: int, limit: int, declared: bool) -> HTTPException:
    if declared:
        detail = f"request body declares {size} bytes (Content-Length); the limit is {limit} bytes"
    else:
        detail = f"request body exceeds the limit of {limit} bytes ({size} bytes read so far)"
    return HTTPException(status_code=413, detail=detail)


def _declared_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        length = -1
    if length < 0:
        raise HTTPException(status_code=400, detail=f"Content-Length {value!r} is not a non-negative integer")
    return length


class BodyLimitMiddleware:
    """Caps every request body at ``max_bytes`` (JSON bodies included, before they are parsed).

    A declared ``Content-Length`` over the limit is answered 413 at once, without reading; a body
    streamed past the limit raises a 413 :class:`HTTPException` inside the endpoint reading it.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int | Callable[[], int]] | None = None
    ) -> None:
        """``path_limits``: a different cap for a path (e.g. enrolment, whose body grows with the bank); a key
        ending in ``*`` matches every path that starts with what precedes it; a callable limit is asked at each
        request (a limit that depends on the service's state, e.g. the upload shapes once they are known)."""
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    def _limit(self, path: str) -> int:
        limit = self.path_limits.get(path)
        if limit is None:
            limit = next(
                (value for key, value in self.path_limits.items() if key.endswith("*") and path.startswith(key[:-1])),
                self.max_bytes,
            )
        return limit() if callable(limit) else limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope.get("path", ""))
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        try:
            declared = _declared_length(headers)
            if declared is not None and declared > limit:
                raise _too_large(declared, limit, declared=True)
        except HTTPException as error:
            await error_response(error.status_code, _HTTP_CODES[error.status_code], str(error.detail))(
                scope, receive, send
            )
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(received, limit, declared=False)
            return message

        await self.app(scope, limited_receive, send)


# --- errors over HTTP ----------------------------------------------------------------------------


def error_response(status: int, error: str, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The one error body every service sends: ``{"error": <code>, "detail": <message>}`` (:class:`ErrorBody`)."""
    body = ErrorBody(error=error, detail=detail)
    return JSONResponse(body.model_dump(), status_code=status, headers=dict(headers or {}))


# --- OpenAPI: every error a route can send -------------------------------------------------------

_ERROR_DESCRIPTIONS = {
    400: "malformed input: a bad wire format, receipt, context or Content-Length (the detail names it)",
    401: "the client certificate names no consortium node",
    403: "the caller's role may not call this, or the key authority refused (the code is the reason)",
    404: "no such resource",
    409: "the request conflicts with the protocol state or the policy (the code says which)",
    413: "the body is larger than this route accepts",
    422: "the parameters or JSON body do not match this document (every bad field is named)",
    429: "too many requests",
    500: "an unexpected error; the service logged it and keeps serving",
}

ERROR_STATUSES_ATTRIBUTE = "error_statuses"
"""A FastAPI dependency may carry the error statuses it can answer (e.g. the mTLS role check: 401, 403); every
route that depends on it documents them."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for a route: each status answered with :class:`ErrorBody`."""
    return {status: {"model": ErrorBody, "description": _ERROR_DESCRIPTIONS[status]} for status in statuses}


def binary_response(description: str, headers: Mapping[str, Any] | None = None) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entry of a route whose 200 answer is raw bytes (``application/octet-stream``)."""
    ok: dict[str, Any] = {"description": description, "content": {OCTET_STREAM: {"schema": dict(BINARY_SCHEMA)}}}
    if headers:
        ok["headers"] = dict(headers)
    return {200: ok}


def binary_request(description: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads a chunk-framed binary body (:func:`encode_chunks`) and, for each
    entry of ``headers`` (name → description), a required metadata header (:func:`encode_header`)."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {OCTET_STREAM: {"schema": {**BINARY_SCHEMA, "x-fedgl-format": CHUNKS_FORMAT}}},
        },
        "parameters": [
            {
                "name": name,
                "in": "header",
                "required": True,
                "description": text,
                # non-empty, so an empty value is not schema-valid; the format names the base64url model inside
                # (fuzzing.py registers its values). A pattern would be true as well, but generators would then
                # draw base64url strings of no model instead of asking for the format
                "schema": {"type": "string", "format": header_format(name), "minLength": 1},
            }
            for name, text in (headers or {}).items()
        ],
    }


def json_request(description: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of a route that parses its JSON body itself (ceremony messages): the body's schema, as
    strict as the parser, so that a body matching it is read and only the protocol can refuse it."""
    return {"requestBody": {"required": True, "description": description, "content": {JSON: {"schema": schema}}}}


def uint64_request(description: str) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads a raw little-endian uint64 body (:func:`encodings.encode_uint64`)."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {OCTET_STREAM: {"schema": dict(BINARY_SCHEMA)}},
        }
    }


def header_format(name: str) -> str:
    """The OpenAPI ``format`` of metadata header ``name``: ``X-FedGL-Receipt`` → ``fedgl-receipt``."""
    return name.lower().removeprefix("x-")


def _route_error_statuses(route: APIRoute, body_limits: bool) -> set[int]:
    """Statuses any request to ``route`` can get besides its own: 500 (the safety net), 400/413 (body limits),
    422 (FastAPI's validation of declared parameters or body), and what its dependencies declare."""
    statuses = {500}
    if body_limits:
        statuses |= {400, 413}
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        pending.extend(dependant.dependencies)
        statuses.update(getattr(dependant.call, ERROR_STATUSES_ATTRIBUTE, ()))
        if dependant.path_params or dependant.query_params or dependant.header_params or dependant.body_params:
            statuses.add(422)
    return statuses


def _documented_openapi(app: FastAPI, body_limits: bool) -> dict[str, Any]:
    """FastAPI's document, with :class:`ErrorBody` for every error status each route can send (its own
    ``responses`` plus :func:`_route_error_statuses`) in place of FastAPI's validation-error shape, which no
    service sends, and the consortium's mutual TLS as the security scheme."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(title=app.title, version=app.version, routes=app.routes, description=app.description)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas[ErrorBody.__name__] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components["securitySchemes"] = {
        "consortiumCertificate": {
            "type": "mutualTLS",
            "description": "a client certificate from the consortium CA; its role decides what may be called",
        }
    }
    document["security"] = [{"consortiumCertificate": []}]
    error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}}}
    for route in app.routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods:
            operation = document["paths"][route.path_format][method.lower()]
            responses = operation.setdefault("responses", {})
            for status in _route_error_statuses(route, body_limits):
                responses.setdefault(str(status), {"description": _ERROR_DESCRIPTIONS[status]})
            for status, response in responses.items():
                if status.isdigit() and int(status) >= 400:
                    response["description"] = _ERROR_DESCRIPTIONS.get(int(status), response.get("description", ""))
                    response["content"] = error
            operation["responses"] = dict(sorted(responses.items()))
    app.openapi_schema = document
    return document


_GENERIC_CONFLICTS = frozenset({"conflict", "config-conflict", "policy-conflict"})
"""409 codes that are not a :class:`ProtocolConflict` (those carry their own code)."""


def status_and_code(error: FedGLError) -> tuple[int, str]:
    """HTTP status and error code of a package error (refusals and protocol conflicts carry their own code).

    :func:`raise_for_service_error` is the inverse on the client side.
    """
    if isinstance(error, DecryptionRefused):
        # A ciphertext that does not decrypt is bad input (nothing was consumed); the rest are refusals.
        return (400 if error.reason == Refusal.BAD_CIPHERTEXT.value else 403), error.reason
    if isinstance(error, ProtocolConflict):
        return 409, error.code
    for error_type, status, code in (
        (WireError, 400, "bad-wire-format"),
        (CiphertextError, 400, "bad-ciphertext"),
        (ReceiptError, 400, "bad-receipt"),
        (ContextError, 400, "bad-context"),
        (PolicyError, 409, "policy-conflict"),
        (ConfigError, 409, "config-conflict"),
    ):
        if isinstance(error, error_type):
            return status, code
    return 400, "bad-request"


class _InternalErrorMiddleware:
    """Unexpected exceptions become a generic 500 (traceback logged, not sent); the server lives on."""

    def __init__(self, app: ASGIApp, log: Any) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as error:
            self.log.error(
                "request.crashed",
                method=scope.get("method"),
                path=scope.get("path"),
                error=repr(error),
                traceback=traceback.format_exc(),
            )
            if started:
                raise
            response = error_response(500, "internal-error", "internal error; the service logged the details")
            await response(scope, receive, send)


def install_error_handlers(
    app: FastAPI,
    log: Any = None,
    max_body_bytes: int | None = None,
    path_limits: Mapping[str, int | Callable[[], int]] | None = None,
) -> None:
    """Map package errors to JSON 4xx, framework errors to the same body shape, the rest to 500.

    WireError/CiphertextError/ReceiptError/ContextError → 400; DecryptionRefused → 403 with its
    reason code (400 for ``bad-ciphertext``); ProtocolConflict → 409 with its code;
    PolicyError/ConfigError → 409; other FedGLError → 400; HTTP and validation errors keep their
    status. With ``max_body_bytes`` every request body is capped as well (see :class:`BodyLimitMiddleware`).
    The app's OpenAPI document then declares :class:`ErrorBody` for every error status each route can send.
    """
    log = log if log is not None else get_logger()

    async def on_package_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, FedGLError)
        status, code = status_and_code(error)
        detail = error.detail if isinstance(error, DecryptionRefused | ProtocolConflict) else str(error)
        log.warning("request.rejected", path=request.url.path, status=status, error=code, detail=detail)
        return error_response(status, code, detail)

    async def on_http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        code = _HTTP_CODES.get(error.status_code, f"http-{error.status_code}")
        if error.status_code >= 400:
            log.info("request.rejected", path=request.url.path, status=error.status_code, error=code)
        return error_response(error.status_code, code, str(error.detail), error.headers)

    async def on_validation_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        detail = validation_problems(error, whole="(request)")
        log.info("request.rejected", path=request.url.path, status=422, error="invalid-request", detail=detail)
        return error_response(422, "invalid-request", detail)

    app.add_exception_handler(FedGLError, on_package_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    # built on first request, once every route exists
    app.openapi = lambda: _documented_openapi(app, body_limits=max_body_bytes is not None)
    if max_body_bytes is not None:
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, path_limits=path_limits)
    app.add_middleware(_InternalErrorMiddleware, log=log)


def call_service(http: httpx.Client, peer: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to another service: a transport failure is :class:`ServiceError` ``unreachable`` (status
    None), an error answer the exception the service raised (:func:`raise_for_service_error`)."""
    try:
        response = http.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise ServiceError(None, "unreachable", f"{peer} at {http.base_url}{path}: {error}") from None
    raise_for_service_error(response)
    return response


def raise_for_service_error(response: httpx.Response) -> None:
    """Turn an error response back into the exception the service raised (inverse of :func:`status_and_code`).

    A JSON ``{"error", "detail"}`` body whose code is a key-authority refusal reason raises
    :class:`DecryptionRefused`, a 409 with a protocol code (not ``config-conflict`` /
    ``policy-conflict``) raises :class:`ProtocolConflict` — so an over-the-wire error looks like an
    in-process one; any other error raises :class:`ServiceError` with the status, code and detail.
    """
    if response.is_success:
        return
    error, detail = _HTTP_CODES.get(response.status_code, f"http-{response.status_code}"), response.text[:500]
    try:
        payload = json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        error, detail = payload["error"], str(payload.get("detail", ""))
    if error in REFUSAL_CODES:
        raise DecryptionRefused(error, detail)
    if response.status_code == 409 and error not in _GENERIC_CONFLICTS:
        raise ProtocolConflict(error, detail)
    try:
        url = str(response.request.url)
    except RuntimeError:  # a response built by hand has no request
        url = ""
    raise ServiceError(response.status_code, error, detail, url)
