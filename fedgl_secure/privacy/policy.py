"""Privacy policy files (DESIGN §6, first part): HE parameters, quorum, upload kinds, timeouts.

A policy is the consortium's contract: every party loads the same file and refuses to run
below it. Validation happens here, at the edge, so an unsafe file fails before any key is
generated, with a message that names the file and the field (``policies/x.toml: quorum: ...``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from fedgl_secure.crypto.ckks_params import moduli_problems, scale_problems
from fedgl_secure.crypto.he_security import MAX_LOG_Q_128, security_check
from fedgl_secure.errors import PolicyError
from fedgl_secure.fedgl.methods import EMBEDDINGS, NODE_WEIGHT, PREDICTIONS, WEIGHTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

KNOWN_KINDS = (WEIGHTS, PREDICTIONS, EMBEDDINGS, NODE_WEIGHT)
# Kinds that no longer exist, and where their values went. Σ_k w_k was its own one-value kind, which
# cost a whole ciphertext (N/2 slots) per bank and round; it is now the last entry of "weights".
RETIRED_KINDS = {"sample_weight": WEIGHTS}


class HEParameters(BaseModel):
    """CKKS parameters: ring dimension N, prime chain (bits, special prime last), scale 2^bits.

    The defaults (N = 8192, [60, 60], 2^40) use one data prime because banks pre-weight their
    terms and ciphertexts are only ever added: ≈ 32 bytes per value on the wire.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 60)
    global_scale_bits: int = 40

    @field_validator("poly_modulus_degree")
    @classmethod
    def _degree_in_standard_table(cls, value: int) -> int:
        if value not in MAX_LOG_Q_128:
            raise ValueError(f"{value} is not a supported ring dimension; choose one of {sorted(MAX_LOG_Q_128)}")
        return value

    @field_validator("coeff_mod_bit_sizes")
    @classmethod
    def _moduli_secure_and_usable(cls, value: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        degree = info.data.get("poly_modulus_degree")
        if degree is None:  # the degree itself was invalid and is reported on its own
            return value
        problems = moduli_problems(degree, value)
        if problems:
            raise ValueError("; ".join(problems))
        security_check(degree, value)
        return value

    @field_validator("global_scale_bits")
    @classmethod
    def _scale_fits_data_primes(cls, value: int, info: ValidationInfo) -> int:
        bit_sizes = info.data.get("coeff_mod_bit_sizes")
        if bit_sizes is None:
            return value
        problems = scale_problems(bit_sizes, value)
        if problems:
            raise ValueError("; ".join(problems))
        return value


class Timeouts(BaseModel):
    """How long a round, and one bank's upload within it, may take before the aggregator moves on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round_seconds: float = Field(default=600.0, gt=0)
    upload_seconds: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _upload_within_round(self) -> Timeouts:
        if self.upload_seconds > self.round_seconds:
            raise ValueError(f"upload_seconds ({self.upload_seconds}) exceeds round_seconds ({self.round_seconds})")
        return self


class Policy(BaseModel):
    """One posture of the consortium (e.g. ``policies/baseline.toml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    he: HEParameters = HEParameters()
    quorum: int = 2
    allowed_kinds: tuple[str, ...] = KNOWN_KINDS
    timeouts: Timeouts = Timeouts()

    @field_validator("quorum")
    @classmethod
    def _quorum_at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"{value} is below 2: a 'sum' over one bank is that bank's contribution in clear; set quorum >= 2"
            )
        return value

    @field_validator("allowed_kinds")
    @classmethod
    def _kinds_known_and_unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        retired = [kind for kind in value if kind in RETIRED_KINDS]
        if retired:
            moves = ", ".join(f"{kind!r} was folded into {RETIRED_KINDS[kind]!r}" for kind in retired)
            raise ValueError(
                f"{moves} (Σ_k w_k is the last entry of each weights upload); remove {retired} from the list"
            )
        unknown = [kind for kind in value if kind not in KNOWN_KINDS]
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; known kinds are {list(KNOWN_KINDS)}")
        if len(set(value)) != len(value):
            raise ValueError(f"kinds listed twice in {list(value)}")
        return value


def _field_path(location: tuple) -> str:
    return ".".join(str(part) for part in location) or "(top level)"


def policy_from_dict(values: dict, source: str = "policy") -> Policy:
    """Validate a parsed policy; errors become one :class:`PolicyError` naming ``source`` and each field."""
    try:
        return Policy.model_validate(values)
    except ValidationError as error:
        lines = [f"{source}: {_field_path(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors()]
        raise PolicyError("\n".join(lines)) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a TOML policy file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PolicyError(f"{path}: cannot read policy file ({error.strerror or error})") from None
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PolicyError(f"{path}: not valid TOML: {error}") from None
    return policy_from_dict(values, str(path))
