"""Fail-closed defaults (issue 13, item 3): every pydantic model validates its defaults like given values.

pydantic skips field validators and constraints on defaults unless ``validate_default=True``. That let a
policy with only ``[he] poly_modulus_degree = 1024`` keep the default 60 + 60-bit moduli unchecked
(insecure at N = 1024). Each model below gets one case, which checks that:

* its ``model_config`` has ``validate_default=True``;
* where a rule relates fields, giving one field so that *another field's default* breaks the rule is
  refused, with the field named (``refused``);
* a minimal instance re-validates from its own dump to the same value;
* a probe subclass that only swaps one field's default for a value the field's own checks refuse
  (constraint, field validator or type) cannot be built — the part that fails if ``validate_default``
  is removed, for models whose cross-field rules are model validators (which run either way).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ValidationError, create_model

import fedgl_secure
from fedgl_secure.consortium.aggregator_port import RoundResponse
from fedgl_secure.crypto.receipts import Receipt, ReceiptFields
from fedgl_secure.data.splits import SplitConfig
from fedgl_secure.engine.config import (
    EvaluationConfig,
    ExperimentConfig,
    FederationConfig,
    SelfSupervisionConfig,
    TrainingConfig,
)
from fedgl_secure.methods.fgcl_graphs import GraphFederationConfig
from fedgl_secure.policy.budget import Budget
from fedgl_secure.policy.dp import DPSGD, DPSettings, EdgeDP, GaussianChannel, GraphBound
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.schema import Policy, Timeouts
from fedgl_secure.privacy.accounting import LEDGER_FORMAT, GaussianRelease, PureRelease, _LedgerFile
from fedgl_secure.services.aggregator_messages import (
    EnrolRequest,
    IndexResponse,
    ReportRequest,
    UploadResponse,
    WithdrawRequest,
    WithdrawResponse,
)
from fedgl_secure.services.key_authority_service import (
    AuditReport,
    DecryptRequest,
    HealthResponse,
    OpenRoundRequest,
    OpenRoundResponse,
)
from fedgl_secure.tomlio import FIELD_ERROR, format_validation_error

HEX64 = "0" * 64
CHANNEL = GaussianChannel(clip=1.0, noise_multiplier=1.0)
RECEIPT_FIELDS = {
    "federation": "fed",
    "round": 1,
    "nonce": "0" * 16,
    "kind": "weights",
    "sender": "bank-a",
    "ciphertext_sha256": HEX64,
    "context_fingerprint": HEX64,
    "values": 10,
    "c1_sha256": HEX64,
    "policy_sha256": HEX64,
    "participants": ("bank-a", "bank-b", "bank-c"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    model: type[BaseModel]
    minimal: dict[str, Any]  # the fewest arguments that make a valid instance
    probe: tuple[str, Any]  # (field, a default its own checks refuse)
    refused: tuple[dict[str, Any], str] | None = None  # (given fields, field whose default they contradict)


CASES = [
    # --- policy/he.py
    Case(
        HEParameters,
        {},
        ("global_scale_bits", 92),
        # N = 1024 makes the default (60, 60) moduli exceed the 128-bit bound: the original defect
        ({"poly_modulus_degree": 1024}, "coeff_mod_bit_sizes"),
    ),
    # --- policy/dp.py
    Case(GaussianChannel, {"clip": 1.0, "noise_multiplier": 1.0}, ("clip", -1.0), ({"noise_multiplier": 1.0}, "clip")),
    Case(
        DPSGD,
        {"max_grad_norm": 1.0, "noise_multiplier": 1.0, "local_epochs": 1},
        ("local_epochs", 0),
        ({"max_grad_norm": 1.0, "noise_multiplier": 1.0}, "local_epochs"),
    ),
    Case(EdgeDP, {}, ("mechanism", "exponential"), ({"epsilon": 1.0}, "epsilon")),
    Case(GraphBound, {}, ("num_layers", 0)),
    Case(DPSettings, {}, ("graph", {"max_degree": 0}), ({"predictions": CHANNEL}, "graph.max_degree")),
    # --- policy/budget.py
    Case(Budget, {"epsilon": 1.0, "rounds": 1}, ("on_exhausted", "continue")),
    # --- policy/schema.py
    Case(Timeouts, {}, ("upload_seconds", -1.0), ({"round_seconds": 60.0}, "upload_seconds")),
    Case(
        Policy,
        {},
        ("quorum", 1),
        # DP and a budget on weights only: the default allowed_kinds would let predictions out noiseless
        ({"dp": DPSettings(weights=CHANNEL), "budget": Budget(epsilon=1.0, rounds=1)}, "dp.predictions"),
    ),
    # --- data/splits.py (a random split's sizes given under the default standard split would be ignored)
    Case(SplitConfig, {}, ("val_size", 0), ({"train_per_class": 5}, "split")),
    # --- engine/config.py
    Case(TrainingConfig, {}, ("dropout", 1.0)),
    Case(FederationConfig, {}, ("proportions", (1.5,))),
    Case(SelfSupervisionConfig, {}, ("threshold", 1.0)),
    Case(EvaluationConfig, {}, ("top_fraction", 0.0)),
    Case(ExperimentConfig, {}, ("seed", -1)),
    # --- crypto/receipts.py (no defaults today: the probe gives a required field one)
    Case(ReceiptFields, RECEIPT_FIELDS, ("round", 0)),
    Case(Receipt, {**RECEIPT_FIELDS, "signature": "0" * 128}, ("signature", "not-hex")),
    # --- privacy/accounting.py
    Case(
        GaussianRelease, {"round": 0, "channel": "weights", "noise_multiplier": 1.0, "sample_rate": 1.0}, ("steps", 0)
    ),
    Case(PureRelease, {"round": 0, "channel": "edges", "epsilon": 1.0}, ("kind", "gaussian")),
    Case(
        _LedgerFile,
        {"format": LEDGER_FORMAT, "bank": "bank-a", "channels": ("weights",)},
        ("releases", [{"kind": "pure", "round": 0, "channel": "edges", "epsilon": -1.0}]),
    ),
    # --- services/aggregator_service.py
    Case(EnrolRequest, {"num_features": 1, "num_classes": 2, "pseudonyms": [HEX64]}, ("num_classes", 1)),
    Case(IndexResponse, {"num_global_nodes": 1, "positions": [0], "max_bank_nodes": 1}, ("max_bank_nodes", "many")),
    Case(UploadResponse, {"accepted": True, "duplicate": False}, ("duplicate", "maybe")),
    Case(WithdrawRequest, {"reason": "privacy-budget-exhausted", "round": 1}, ("round", 0)),
    Case(WithdrawResponse, {"withdrawn": True, "duplicate": False}, ("duplicate", "maybe")),
    Case(
        ReportRequest,
        {"version": 0, "val_correct": 0, "val_total": 0, "test_correct": 0, "test_total": 0},
        ("histograms", [[0]]),
    ),
    # --- consortium/aggregator_port.py
    Case(RoundResponse, {"phase": "open", "federation": "fed"}, ("round", "first")),
    # --- services/key_authority_service.py
    Case(HealthResponse, {"name": "key-authority", "fingerprint": HEX64}, ("status", None)),
    Case(
        OpenRoundRequest,
        {"federation": "fed", "round": 1, "nonce": "0" * 16, "participants": ["bank-a"], "policy_sha256": "0" * 64},
        ("nonce", "short"),
    ),
    Case(OpenRoundResponse, {"opened": True, "federation": "fed", "round": 1}, ("round", "first")),
    Case(
        DecryptRequest,
        {"federation": "fed", "round": 1, "kind": "weights", "context_fingerprint": HEX64, "length": 0, "receipts": []},
        ("length", -1),
    ),
    Case(AuditReport, {"ok": True, "records": 0, "head": HEX64}, ("broken_line", "three")),
    # --- methods/fgcl_graphs.py
    Case(GraphFederationConfig, {}, ("rounds", 0), ({"method": "fed_noise"}, "epsilon")),
]


def _with_default(model: type[BaseModel], name: str, default: Any) -> type[BaseModel]:
    """A subclass of ``model`` whose only change is ``name``'s default (constraints and validators kept)."""
    info = model.model_fields[name]
    annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return create_model(f"{model.__name__}Probe", __base__=model, **{name: (annotation, default)})


def _refusal(model: type[BaseModel], values: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as excinfo:
        model(**values)
    return excinfo.value


def _fields(error: ValidationError) -> list[str]:
    """The dotted field each error is located at (a cross-field ``field_error`` at the field it names)."""
    fields = []
    for e in error.errors():
        location = (*e["loc"], e["ctx"]["field"]) if e["type"] == FIELD_ERROR else e["loc"]
        fields.append(".".join(map(str, location)))
    return fields


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.model.__name__)
def test_defaults_are_validated(case: Case):
    assert case.model.model_config.get("validate_default") is True

    if case.refused is not None:
        given, field = case.refused
        assert field in format_validation_error(_refusal(case.model, given))

    instance = case.model(**case.minimal)
    assert case.model.model_validate(instance.model_dump()) == instance

    field, bad_default = case.probe
    probe = _with_default(case.model, field, bad_default)
    located = _fields(_refusal(probe, {k: v for k, v in case.minimal.items() if k != field}))
    assert any(where == field or where.startswith(f"{field}.") for where in located), located


def _package_models() -> set[type[BaseModel]]:
    for module in pkgutil.walk_packages(fedgl_secure.__path__, f"{fedgl_secure.__name__}."):
        if not module.name.endswith("__main__"):  # running it would start the CLI
            importlib.import_module(module.name)
    found, stack = set(), list(BaseModel.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith(f"{fedgl_secure.__name__}."):
            found.add(cls)
    return found


def test_every_package_model_validates_defaults():
    """A model added later without ``validate_default=True`` fails here (and should get a case above)."""
    models = _package_models()
    assert set(case.model for case in CASES) <= models
    skipping = sorted(
        f"{m.__module__}.{m.__qualname__}" for m in models if m.model_config.get("validate_default") is not True
    )
    assert not skipping, f"models that would skip validating their defaults: {skipping}"
