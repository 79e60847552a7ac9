"""What a bank calls on the aggregator over HTTP: :class:`AggregatorClient`, the aggregator's port for banks
(:class:`~fedgl_secure.consortium.aggregator_port.AggregatorPort`) over a mutual-TLS ``httpx.Client``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
import numpy as np
from pydantic import BaseModel, ValidationError

from fedgl_secure.consortium.aggregator_port import IndexView, RoundResponse, Served
from fedgl_secure.consortium.participant_choice import BUDGET_EXHAUSTED
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.methods.fed2gnn_relay import ExchangeView
from fedgl_secure.services import http_conventions
from fedgl_secure.services.aggregator_messages import (
    BROADCAST_SIGNATURE_HEADER,
    RECEIPT_HEADER,
    BoundaryResponse,
    DecryptionTasks,
    DecryptionTaskView,
    ExchangeKeyRequest,
    ExchangeResponse,
    IndexResponse,
    UploadResponse,
    WithdrawRequest,
    WithdrawResponse,
)
from fedgl_secure.wire import encodings

ModelT = TypeVar("ModelT", bound=BaseModel)


def _served(response: httpx.Response) -> Served:
    return Served(response.content, response.headers.get(BROADCAST_SIGNATURE_HEADER))


class AggregatorClient:
    """What a bank calls on the aggregator (over an mTLS ``httpx.Client``).

    Errors come back as the exceptions the coordinator raises in-process
    (:func:`http_conventions.raise_for_service_error`): a 409 is :class:`ProtocolConflict` with its code; an
    unreachable aggregator or any other error is :class:`ServiceError` (status None when there was
    no answer); an answer that does not parse is :class:`encodings.WireError`. Every one is a
    :class:`~fedgl_secure.errors.FedGLError`.
    """

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return http_conventions.call_service(self.http, "aggregator", method, path, **kwargs)

    def _parse(self, model: type[ModelT], method: str, path: str, **kwargs: Any) -> ModelT:
        try:
            return model.model_validate_json(self._call(method, path, **kwargs).content)
        except ValidationError as error:
            raise encodings.WireError(
                f"aggregator answer to {method} {path}: {http_conventions.validation_problems(error)}"
            ) from None

    def health(self) -> dict:
        return self._call("GET", "/v1/health").json()

    def status(self) -> dict:
        return self._call("GET", "/v1/status").json()

    def enrol(self, num_features: int, num_classes: int, pseudonyms: Sequence[str]) -> None:
        payload = {"num_features": num_features, "num_classes": num_classes, "pseudonyms": list(pseudonyms)}
        self._call("POST", "/v1/enrol", json=payload)

    def index(self) -> IndexView:
        body = self._parse(IndexResponse, "GET", "/v1/index")
        return IndexView(body.num_global_nodes, np.asarray(body.positions, dtype=np.int64), body.max_bank_nodes)

    def current_round(self) -> RoundResponse:
        return self._parse(RoundResponse, "GET", "/v1/round")

    def model(self, version: int) -> Served:
        """Model ``version`` as this bank is served it (its projection) with the aggregator's signature."""
        return _served(self._call("GET", f"/v1/models/{version}"))

    def stage_model(self, round_number: int, stage: str) -> Served:
        """The broadcast published after ``stage`` of round ``round_number`` (projected, signed)."""
        return _served(self._call("GET", f"/v1/rounds/{round_number}/stages/{stage}"))

    def upload(self, round_number: int, kind: str, chunks: Sequence[bytes], receipt: Receipt) -> UploadResponse:
        return self._parse(
            UploadResponse,
            "PUT",
            f"/v1/rounds/{round_number}/uploads/{kind}",
            content=encodings.encode_chunks(chunks),
            headers={RECEIPT_HEADER: encodings.encode_header(receipt), "Content-Type": http_conventions.OCTET_STREAM},
        )

    def decryption_tasks(self) -> list[DecryptionTaskView]:
        return self._parse(DecryptionTasks, "GET", "/v1/decryptions").tasks

    def decryption_c1(self, task: DecryptionTaskView, shape: tuple[int, int]) -> list[np.ndarray]:
        body = self._call("GET", f"/v1/decryptions/{task.task_id}/c1").content
        return encodings.decode_uint64_frames(body, len(task.receipts), task.chunks, shape)

    def post_partial(self, task_id: str, residues: np.ndarray) -> None:
        self._call(
            "PUT",
            f"/v1/decryptions/{task_id}/partial",
            content=encodings.encode_uint64(np.ascontiguousarray(residues, dtype=np.uint64)),
            headers={"Content-Type": http_conventions.OCTET_STREAM},
        )

    def refuse_decryption(self, task_id: str, reason: str, detail: str) -> None:
        self._call("PUT", f"/v1/decryptions/{task_id}/refusal", json={"reason": reason, "detail": detail[:4096]})

    def report(self, version: int, counts: tuple[int, int, int, int], histograms: np.ndarray | None = None) -> None:
        names = ("val_correct", "val_total", "test_correct", "test_total")
        payload = {"version": version, **dict(zip(names, counts, strict=True))}
        if histograms is not None:
            payload["histograms"] = histograms.tolist()
        self._call("POST", "/v1/reports", json=payload)

    # --- Fed²GNN's set-up exchange (methods.fed2gnn_relay.RelayPort) ---

    def exchange_view(self) -> ExchangeView:
        return self._parse(ExchangeResponse, "GET", "/v1/exchange").view()

    def publish_exchange_key(self, nonce: str, public: bytes, signature: str) -> None:
        request = ExchangeKeyRequest(nonce=nonce, public_key=public.hex(), signature=signature)
        self._parse(UploadResponse, "PUT", "/v1/exchange/key", json=request.model_dump())

    def announce_boundary(self, nonce: str, width: int, pseudonyms: list[str]) -> None:
        payload = {"nonce": nonce, "width": width, "pseudonyms": list(pseudonyms)}
        self._parse(UploadResponse, "PUT", "/v1/exchange/boundary", json=payload)

    def exchange_boundary(self, bank: str) -> list[str]:
        return self._parse(BoundaryResponse, "GET", f"/v1/exchange/boundaries/{bank}").pseudonyms

    def upload_term(self, level: int, active: str, nonce: str, masked: np.ndarray) -> None:
        self._parse(
            UploadResponse,
            "PUT",
            f"/v1/exchange/levels/{level}/terms/{active}",
            params={"nonce": nonce},
            content=encodings.encode_uint64(masked),
            headers={"Content-Type": http_conventions.OCTET_STREAM},
        )

    def exchange_sum(self, level: int) -> np.ndarray:
        return encodings.decode_uint64(self._call("GET", f"/v1/exchange/levels/{level}/sum").content)

    def withdraw(self, round_number: int, reason: str = BUDGET_EXHAUSTED) -> WithdrawResponse:
        request = WithdrawRequest(reason=reason, round=round_number)
        return self._parse(WithdrawResponse, "POST", "/v1/withdraw", json=request.model_dump())
