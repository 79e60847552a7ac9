"""Wire formats shared by the services: round trips, and a clear WireError for every bad input."""

from __future__ import annotations

import base64
import io
import struct

import httpx
import numpy as np
import pytest
import torch
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from fedgl_secure.errors import CiphertextError, DecryptionRefused, PolicyError, ReceiptError, ServiceError
from fedgl_secure.services import http_conventions
from fedgl_secure.wire import encodings
from fedgl_secure.wire.encodings import WireError


def _framed(*chunks: bytes, count: int | None = None) -> bytes:
    parts = [b"FGC1", struct.pack(">I", len(chunks) if count is None else count)]
    for chunk in chunks:
        parts += [struct.pack(">Q", len(chunk)), chunk]
    return b"".join(parts)


# --- ciphertext chunks ---------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_chunks_round_trip(chunks):
    body = encodings.encode_chunks(chunks)
    assert body == _framed(*chunks)
    assert encodings.decode_chunks(body, max_chunks=8, max_chunk_bytes=64) == chunks


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=32), min_size=1, max_size=4), st.data())
def test_every_truncation_is_a_wire_error(chunks, data):
    body = encodings.encode_chunks(chunks)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(WireError, match="truncated|shorter"):
        encodings.decode_chunks(body[:cut], max_chunks=4, max_chunk_bytes=32)


def test_wire_error_is_a_ciphertext_error():
    assert issubclass(WireError, CiphertextError)


@pytest.mark.parametrize(
    "body, message",
    [
        (b"", r"0 bytes is shorter than the 8-byte header"),
        (b"FGC1\x00\x00", r"6 bytes is shorter than the 8-byte header"),
        (b"GARBAGE!" + b"\x00" * 16, r"does not start with b'FGC1' \(got b'GARB' at offset 0\)"),
        (_framed(b"abc") + b"xyz", r"3 bytes of trailing garbage after the last chunk, at offset 19"),
        (_framed(b"abc", count=2), r"chunk 1: length field at offset 19 is cut off; the body ends at 19"),
        (_framed(b"abc")[:-1], r"chunk 0 at offset 16: announces 3 bytes but only 2 remain \(truncated\)"),
        (_framed(b"a", b"b", b"c", b"d"), r"announces 4 chunks at offset 4, more than the 3 allowed"),
        (_framed(b"x" * 11), r"chunk 0 at offset 16: 11 bytes exceeds the 10-byte chunk limit"),
        (b"FGC1" + struct.pack(">I", 2**32 - 1), r"announces 4294967295 chunks"),
    ],
)
def test_malformed_chunks_name_the_problem(body, message):
    with pytest.raises(WireError, match=message):
        encodings.decode_chunks(body, max_chunks=3, max_chunk_bytes=10)


def test_huge_announced_chunk_length_is_refused_before_allocation():
    body = b"FGC1" + struct.pack(">I", 1) + struct.pack(">Q", 2**63)
    with pytest.raises(WireError, match=r"9223372036854775808 bytes exceeds"):
        encodings.decode_chunks(body, max_chunks=1, max_chunk_bytes=1 << 20)


def test_encode_chunks_refuses_non_bytes():
    with pytest.raises(WireError, match="chunk 1: expected bytes, got str"):
        encodings.encode_chunks([b"ok", "text"])


# --- float vectors -------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=32))
def test_float64_round_trip(values):
    array = np.array(values, dtype=np.float64)
    body = encodings.encode_float64(array)
    assert body == array.astype("<f8").tobytes()
    np.testing.assert_array_equal(encodings.decode_float64(body, len(values)), array)


def test_float64_is_little_endian():
    assert encodings.encode_float64(np.array([1.0])) == struct.pack("<d", 1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_floats_refused_both_ways(bad):
    values = np.array([1.0, 2.0, bad])
    with pytest.raises(WireError, match=r"1 NaN or infinite values \(first at flat index 2\)"):
        encodings.encode_float64(values)
    with pytest.raises(WireError, match=r"NaN or infinite values \(first at flat index 2\)"):
        encodings.decode_float64(values.astype("<f8").tobytes(), 3)


@pytest.mark.parametrize(
    "body, length, message",
    [
        (b"\x00" * 23, 3, "float64 body of 23 bytes; 3 values need exactly 24 bytes"),
        (b"\x00" * 32, 3, "float64 body of 32 bytes; 3 values need exactly 24 bytes"),
        (b"\x00" * 8, 0, "float64 body of 8 bytes; 0 values need exactly 0 bytes"),
    ],
)
def test_float64_length_checked(body, length, message):
    with pytest.raises(WireError, match=message):
        encodings.decode_float64(body, length)


# --- residue vectors -----------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=32))
def test_uint64_round_trip_is_exact_to_the_last_bit(values):
    array = np.array(values, dtype=np.uint64)
    body = encodings.encode_uint64(array)
    assert body == array.astype("<u8").tobytes()
    decoded = encodings.decode_uint64(body, len(values))
    assert decoded.dtype == np.uint64
    np.testing.assert_array_equal(decoded, array)


def test_uint64_is_little_endian_and_refuses_other_dtypes():
    assert encodings.encode_uint64(np.array([1], dtype=np.uint64)) == struct.pack("<Q", 1)
    with pytest.raises(WireError, match="expected uint64 values, got float64"):
        encodings.encode_uint64(np.array([1.0]))


def test_uint64_length_checked():
    with pytest.raises(WireError, match="not a whole number of 8-byte values"):
        encodings.decode_uint64(b"\x00" * 23)
    with pytest.raises(WireError, match="uint64 body of 3 values; expected exactly 4"):
        encodings.decode_uint64(b"\x00" * 24, 4)
    assert encodings.decode_uint64(b"").size == 0


# --- array bundles -------------------------------------------------------------------------------


def test_arrays_round_trip_with_names_dtypes_and_shapes():
    arrays = {"W": np.arange(6.0).reshape(2, 3), "index": np.array([3, 1, 2], dtype=np.int64)}
    decoded = encodings.decode_arrays(encodings.encode_arrays(arrays))
    assert decoded.keys() == arrays.keys()
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape


def test_pickled_npz_is_refused():
    buffer = io.BytesIO()
    np.savez(buffer, payload=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(WireError, match=r"array 'payload' is refused: Object arrays cannot be loaded"):
        encodings.decode_arrays(buffer.getvalue())


def test_bare_pickle_and_npy_are_refused():
    import pickle

    with pytest.raises(WireError, match=r"is not an .npz \(zip\) archive"):
        encodings.decode_arrays(pickle.dumps({"W": [1.0]}))
    buffer = io.BytesIO()
    np.save(buffer, np.arange(3.0))
    with pytest.raises(WireError, match=r"not an .npz \(zip\) archive \(starts with b'\\x93NUM'\)"):
        encodings.decode_arrays(buffer.getvalue())


def test_encode_arrays_refuses_objects_and_nans():
    with pytest.raises(WireError, match="array 'x': dtype object holds Python objects"):
        encodings.encode_arrays({"x": np.array([None], dtype=object)})
    with pytest.raises(WireError, match="array 'y': 1 NaN or infinite"):
        encodings.encode_arrays({"y": np.array([np.nan])})


def test_decoded_arrays_must_be_finite():
    buffer = io.BytesIO()
    np.savez(buffer, W=np.array([[1.0, np.inf]]))
    with pytest.raises(WireError, match=r"array 'W': 1 NaN or infinite values \(first at flat index 1\)"):
        encodings.decode_arrays(buffer.getvalue())


def test_damaged_and_bomb_archives_refused():
    body = encodings.encode_arrays({"W": np.zeros((100, 100))})
    with pytest.raises(WireError, match="damaged .npz archive|cannot be read as .npz"):
        encodings.decode_arrays(body[: len(body) // 2])
    with pytest.raises(WireError, match=r"expands to \d+ bytes, more than the 1000-byte limit"):
        encodings.decode_arrays(body, max_bytes=1000)


# --- headers -------------------------------------------------------------------------------------


class _Meta(BaseModel):
    round: int = Field(ge=1)
    kind: str


def test_header_round_trip_is_url_safe():
    meta = _Meta(round=3, kind="weights/?+")
    value = encodings.encode_header(meta)
    assert set(value) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert encodings.decode_header(value, _Meta, "X-Meta") == meta


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "missing header X-Meta: it must carry the _Meta"),
        ("  ", "missing header X-Meta"),
        ("!!!not-base64***", "header X-Meta: not base64url"),
        (base64.urlsafe_b64encode(b"not json").decode(), "header X-Meta: .*Invalid JSON"),
        (
            base64.urlsafe_b64encode(b'{"round": 0}').decode(),
            r"header X-Meta: round: Input should be greater than or equal to 1; kind: Field required",
        ),
    ],
)
def test_bad_headers_name_header_and_fields(value, message):
    with pytest.raises(WireError, match=message):
        encodings.decode_header(value, _Meta, "X-Meta")


# --- HTTP error conventions ----------------------------------------------------------------------


def _app() -> FastAPI:
    app = FastAPI()
    http_conventions.install_error_handlers(app, max_body_bytes=1000, path_limits={"/big-body": 3000, "/many/*": 2000})

    @app.post("/body")
    async def body(request: Request) -> dict:
        return {"size": len(await request.body())}

    @app.post("/big-body")
    async def big_body(request: Request) -> dict:
        return {"size": len(await request.body())}

    @app.post("/many/{name}")
    async def many(name: str, request: Request) -> dict:
        return {"size": len(await request.body())}

    @app.post("/json")
    def json_body(meta: _Meta) -> dict:
        return {"round": meta.round}

    @app.get("/raise/{what}")
    def raise_(what: str) -> dict:
        errors = {
            "wire": WireError("bad frame"),
            "receipt": ReceiptError("forged"),
            "refused": DecryptionRefused("below-quorum", "1 valid receipt"),
            "bad-ciphertext": DecryptionRefused("bad-ciphertext", "chunk 0 garbage"),
            "policy": PolicyError("round too old"),
            "crash": RuntimeError("secret internals"),
        }
        raise errors[what]

    return app


@pytest.fixture
def client():
    with TestClient(_app(), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(
    "what, status, code, detail",
    [
        ("wire", 400, "bad-wire-format", "bad frame"),
        ("receipt", 400, "bad-receipt", "forged"),
        ("refused", 403, "below-quorum", "1 valid receipt"),
        ("bad-ciphertext", 400, "bad-ciphertext", "chunk 0 garbage"),
        ("policy", 409, "policy-conflict", "round too old"),
        ("crash", 500, "internal-error", "internal error; the service logged the details"),
    ],
)
def test_errors_become_json(client, what, status, code, detail):
    response = client.get(f"/raise/{what}")
    assert response.status_code == status
    assert response.json() == {"error": code, "detail": detail}
    assert "secret internals" not in response.text
    assert client.post("/body", content=b"still alive").json() == {"size": 11}


def test_errors_come_back_as_exceptions(client):
    with pytest.raises(DecryptionRefused) as caught:
        http_conventions.raise_for_service_error(client.get("/raise/refused"))
    assert (caught.value.reason, caught.value.detail) == ("below-quorum", "1 valid receipt")
    with pytest.raises(DecryptionRefused, match="bad-ciphertext"):
        http_conventions.raise_for_service_error(client.get("/raise/bad-ciphertext"))
    with pytest.raises(ServiceError) as caught:
        http_conventions.raise_for_service_error(client.get("/raise/policy"))
    assert (caught.value.status, caught.value.error, caught.value.detail) == (409, "policy-conflict", "round too old")
    with pytest.raises(ServiceError, match=r"HTTP 404 .*\(not-found\)"):
        http_conventions.raise_for_service_error(client.get("/nowhere"))
    with pytest.raises(ServiceError, match=r"HTTP 502 \(http-502\): plain text"):
        http_conventions.raise_for_service_error(httpx.Response(502, text="plain text"))
    http_conventions.raise_for_service_error(client.post("/body", content=b""))


def test_body_limits(client):
    response = client.post("/body", content=b"x" * 1001)
    assert response.status_code == 413
    assert response.json() == {
        "error": "body-too-large",
        "detail": "request body declares 1001 bytes (Content-Length); the limit is 1000 bytes",
    }

    def stream():  # no Content-Length: the streamed size is what counts
        yield b"x" * 600
        yield b"x" * 600

    response = client.post("/body", content=stream())
    assert response.status_code == 413
    assert response.json()["detail"] == "request body exceeds the limit of 1000 bytes (1200 bytes read so far)"
    # the cap applies before JSON parsing too
    response = client.post("/json", content=b" " * 1001, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["detail"] == "request body declares 1001 bytes (Content-Length); the limit is 1000 bytes"

    def big_json():
        yield b'{"round": 1, "kind": "' + b"k" * 600
        yield b"k" * 600 + b'"}'

    response = client.post("/json", content=big_json(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert "exceeds the limit of 1000 bytes" in response.json()["detail"]
    response = client.post("/body", content=b"x", headers={"Content-Length": "-5"})
    assert response.status_code == 400
    assert "Content-Length '-5' is not a non-negative integer" in response.json()["detail"]
    assert client.post("/body", content=b"x" * 1000).json() == {"size": 1000}


def test_validation_errors_keep_the_error_shape(client):
    response = client.post("/json", json={"round": 0})
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid-request"
    assert "body.round: Input should be greater than or equal to 1" in body["detail"]
    assert "body.kind: Field required" in body["detail"]


def test_a_path_with_its_own_limit_takes_more_and_no_other_path_does(client):
    assert client.post("/big-body", content=b"x" * 2500).json() == {"size": 2500}
    assert client.post("/body", content=b"x" * 2500).status_code == 413
    response = client.post("/big-body", content=b"x" * 3001)
    assert response.status_code == 413 and "the limit is 3000 bytes" in response.json()["detail"]
    assert client.post("/many/one", content=b"x" * 1500).json() == {"size": 1500}  # a prefix pattern
    assert client.post("/many/two", content=b"x" * 2001).status_code == 413


def test_a_broadcast_is_bounded_by_the_shapes_the_bank_expects():
    from fedgl_secure.engine.pseudo_graph import PseudoGraph
    from fedgl_secure.methods.base import Broadcast
    from fedgl_secure.wire.broadcast import broadcast_bytes_bound, decode_broadcast, encode_broadcast

    # 3 banks x 100,000 customers, s = 100: ~300 MB, which the default 64 MiB cap would refuse
    assert broadcast_bytes_bound(100, 252_000, 100) > 300 * 10**6 > encodings.DEFAULT_MAX_BODY_BYTES
    assert broadcast_bytes_bound(100, 1_000, 10) == encodings.DEFAULT_MAX_BODY_BYTES
    m, s = 50, 4
    graph = PseudoGraph(torch.randint(0, m, (m, s)), torch.full((m, s), 1.0 / s))
    data = encode_broadcast(Broadcast(3, torch.zeros(7), torch.zeros(m, dtype=torch.int64), graph))
    decoded = decode_broadcast(3, data, 7, m, max_neighbors=s)
    assert decoded.pseudo_graph.neighbors.shape == (m, s)
    with pytest.raises(CiphertextError, match="malformed pseudo graph"):  # more neighbours than s: refused
        decode_broadcast(3, data, 7, m, max_neighbors=s - 1)


def test_metadata_headers_are_declared_non_empty_so_an_empty_one_is_not_schema_valid():
    """An empty ``X-FedGL-Receipt`` is refused (400): the OpenAPI document says so (schemathesis found it declared
    schema-valid), and the format names what the header carries."""
    extra = http_conventions.binary_request("chunks", {"X-FedGL-Receipt": "the signed receipt"})
    (parameter,) = extra["parameters"]
    assert parameter["in"] == "header" and parameter["required"]
    assert parameter["schema"] == {"type": "string", "format": "fedgl-receipt", "minLength": 1}
    with pytest.raises(WireError, match="missing header X-FedGL-Receipt"):
        encodings.decode_header("", _Meta, "X-FedGL-Receipt")
