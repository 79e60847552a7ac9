"""The aggregator's HTTP messages: request and response schemas (pydantic) and header names, shared by the
service (``services/aggregator_service.py``) and the banks' client (``services/aggregator_client.py``), so a bank's
process reads what the aggregator accepts without importing the aggregator's round state machine.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedgl_secure.consortium.pseudonyms import PSEUDONYM_PATTERN
from fedgl_secure.engine.score_histograms import NUM_BINS
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.methods.fed2gnn_relay import ExchangeView
from fedgl_secure.services import http_conventions

RECEIPT_HEADER = "X-FedGL-Receipt"
BROADCAST_SIGNATURE_HEADER = "X-FedGL-Broadcast-Signature"  # the aggregator's Ed25519 signature (hex) of a broadcast
MAX_PSEUDONYMS = 50_000_000
# Enrolment carries one 64-hex pseudonym per customer (~67 bytes in JSON): a 1,000,000-customer bank sends
# ~67 MB, past the 64 MiB cap of every other body; this cap admits ~7.5 M customers per bank.
ENROL_MAX_BODY_BYTES = 512 * 1024 * 1024
MAX_CHUNKS = 65_536  # 268 M values at N = 8192
_PSEUDONYM = re.compile(PSEUDONYM_PATTERN)


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _checked_pseudonyms(pseudonyms: list[str], code: str) -> list[str]:
    """``pseudonyms`` if each is 64 lowercase hex characters, else a 409 ``code`` naming the first that is not."""
    bad = next((p for p in pseudonyms if not _PSEUDONYM.match(p)), None)
    if bad is not None:
        raise ProtocolConflict(code, f"pseudonym {bad[:80]!r} is not 64 lowercase hex characters")
    return pseudonyms


class EnrolRequest(_Schema):
    num_features: http_conventions.JsonInt = Field(ge=1, le=http_conventions.MAX_JSON_INT)
    num_classes: http_conventions.JsonInt = Field(ge=2, le=http_conventions.MAX_JSON_INT)
    pseudonyms: list[str] = Field(min_length=1, max_length=MAX_PSEUDONYMS)

    def checked_pseudonyms(self) -> list[str]:
        return _checked_pseudonyms(self.pseudonyms, "bad-enrolment")


class IndexResponse(_Schema):
    num_global_nodes: int
    positions: list[int]
    max_bank_nodes: int  # the public w_max of the DP step: the largest bank's node count


class UploadResponse(_Schema):
    accepted: bool
    duplicate: bool


class WithdrawRequest(_Schema):
    """A bank leaves the run for good; ``round`` is the round it declined (for the record)."""

    reason: Literal["privacy-budget-exhausted"]
    round: http_conventions.JsonInt = Field(ge=1, le=http_conventions.MAX_JSON_INT)


class WithdrawResponse(_Schema):
    withdrawn: bool
    duplicate: bool  # the bank had already withdrawn; nothing changed


NONCE_PATTERN = r"^[0-9a-f]{32}$"


class ExchangeKey(_Schema):
    public_key: str = Field(pattern=r"^[0-9a-f]{64}$", description="X25519 public key, 32 bytes in hex")
    signature: str = Field(pattern=r"^[0-9a-f]{128}$", description="Ed25519 signature (fed2gnn_relay.key_statement)")


class ExchangeKeyRequest(ExchangeKey):
    nonce: str = Field(pattern=NONCE_PATTERN)


class ExchangeResponse(_Schema):
    federation: str
    nonce: str
    hops: int
    banks: list[str]
    width: int | None
    keys: dict[str, ExchangeKey]
    boundary_sizes: dict[str, int]

    def view(self) -> ExchangeView:
        keys = {bank: (key.public_key, key.signature) for bank, key in self.keys.items()}
        return ExchangeView(
            self.federation, self.nonce, self.hops, tuple(self.banks), self.width, keys, dict(self.boundary_sizes)
        )


class BoundaryRequest(_Schema):
    nonce: str = Field(pattern=NONCE_PATTERN)
    width: http_conventions.JsonInt = Field(
        ge=2, le=http_conventions.MAX_JSON_INT, description="p + 1: the signal width of every term"
    )
    pseudonyms: list[str] = Field(max_length=MAX_PSEUDONYMS)

    def checked_pseudonyms(self) -> list[str]:
        return _checked_pseudonyms(self.pseudonyms, "bad-boundary")


class BoundaryResponse(_Schema):
    bank: str
    pseudonyms: list[str]


class ReportRequest(_Schema):
    version: http_conventions.JsonInt = Field(ge=0, le=http_conventions.MAX_JSON_INT)
    val_correct: http_conventions.JsonInt = Field(ge=0, le=http_conventions.MAX_JSON_INT)
    val_total: http_conventions.JsonInt = Field(ge=0, le=http_conventions.MAX_JSON_INT)
    test_correct: http_conventions.JsonInt = Field(ge=0, le=http_conventions.MAX_JSON_INT)
    test_total: http_conventions.JsonInt = Field(ge=0, le=http_conventions.MAX_JSON_INT)
    # with a positive class: validation negatives, validation positives, test negatives, test positives,
    # each counted per score bin (engine/score_histograms.py)
    histograms: list[list[http_conventions.BoundedJsonInt]] | None = Field(None, min_length=4, max_length=4)

    def checked_histograms(self) -> np.ndarray | None:
        if self.histograms is None:
            return None
        if any(len(row) != NUM_BINS for row in self.histograms):  # ragged rows make no array at all
            raise ProtocolConflict("bad-report", f"histograms must be 4 x {NUM_BINS} non-negative counts")
        histograms = np.asarray(self.histograms, dtype=np.int64)
        if histograms.shape != (4, NUM_BINS) or (histograms < 0).any():
            raise ProtocolConflict("bad-report", f"histograms must be 4 x {NUM_BINS} non-negative counts")
        if histograms[:2].sum() > self.val_total or histograms[2:].sum() > self.test_total:
            raise ProtocolConflict("bad-report", "histograms count more customers than the report's totals")
        return histograms


TASK_ID_PATTERN = r"^[0-9a-f]{32}$"


class DecryptionTaskView(_Schema):
    """A partial-decryption task as a bank of its decrypting set sees it (``consortium/decryption_board.py``)."""

    task_id: str = Field(pattern=TASK_ID_PATTERN)
    round: int = Field(ge=1)
    kind: str = Field(min_length=1, max_length=64)
    receipts: list[dict[str, Any]] = Field(max_length=1024)  # the bank parses and verifies them itself
    decrypting_set: list[str] = Field(min_length=1, max_length=1024)
    chunks: int = Field(ge=1, le=MAX_CHUNKS)


class DecryptionTasks(_Schema):
    tasks: list[DecryptionTaskView]


class RefusalRequest(_Schema):
    reason: str = Field(min_length=1, max_length=64)
    detail: str = Field(max_length=4096)
