"""The policy's ``[he]`` table (DESIGN §6): CKKS parameters and the range and precision of each packed kind.

Its own module because it is validated against the CKKS rules, not against DP: the HomomorphicEncryption.org
128-bit table (:mod:`~fedgl_secure.policy.he_security`), the moduli and scale rules
(:mod:`~fedgl_secure.policy.ckks_params`) and the packing layout they imply
(:mod:`~fedgl_secure.policy.packing_layout`). The policy itself (:mod:`~fedgl_secure.policy.schema`) holds it.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fedgl_secure.policy.base import KNOWN_KINDS
from fedgl_secure.policy.ckks_params import data_bits, moduli_problems, scale_problems
from fedgl_secure.policy.he_security import MAX_LOG_Q_128, security_check
from fedgl_secure.policy.packing_layout import (
    MIN_STATISTICAL_SECURITY,
    KindLayout,
    flooding_std,
    kind_layout,
    noise_bound,
)
from fedgl_secure.tomlio import field_error


class KindPrecision(BaseModel):
    """What one upload kind needs when it is packed (``crypto/packing.py``): a bank's pre-weighted value
    must lie in ``[lower, upper]`` (refused otherwise, never clipped) and is rounded to a multiple of
    ``2^-step_bits``. The decoded sum over K banks is then within ``K · 2^-step_bits / 2`` of the exact sum."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    lower: float = Field(allow_inf_nan=False)
    upper: float = Field(allow_inf_nan=False)
    step_bits: int = Field(ge=0, le=40)

    @model_validator(mode="after")
    def _ordered(self) -> KindPrecision:
        if not self.upper > self.lower:
            raise field_error("upper", f"{self.upper} must exceed lower ({self.lower})")
        return self


class KindPrecisions(BaseModel):
    """``[he.precision.<kind>]``: the range and precision of each kind's packed values.

    Defaults, measured on Cora (6 banks, FedGL, 20 rounds): ŵ_k·W within [-2.09, 1.84], ŵ_k·H (logits)
    within [-11.8, 17.2]; softmax rows and node weights within [0, 1] (no DP noise: a kind with a DP
    channel travels unpacked, see :meth:`~fedgl_secure.policy.schema.Policy.upload_layout`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    weights: KindPrecision = KindPrecision(lower=-2.25, upper=2.25, step_bits=7)
    predictions: KindPrecision = KindPrecision(lower=0.0, upper=1.0, step_bits=6)
    embeddings: KindPrecision = KindPrecision(lower=-24.0, upper=24.0, step_bits=3)
    node_weight: KindPrecision = KindPrecision(lower=0.0, upper=1.0, step_bits=6)
    # GraphFL's ŵ_k·g_k, a query-loss gradient: small values that the meta step scales by β, so finer steps
    meta_gradients: KindPrecision = KindPrecision(lower=-2.0, upper=2.0, step_bits=16)


class HEParameters(BaseModel):
    """CKKS parameters: ring dimension N, prime chain (bits, special prime last), scale 2^bits, packing.

    The defaults (N = 4096, [46, 47, 16], values packed) use two data primes: banks pre-weight their terms
    and ciphertexts are only ever added, so the data primes hold the packed values and the guard bits of the
    decryption's noise flooding (``statistical_security``, ``max_decryptions``); ``packing = "quantised"``
    puts several fixed-point values into each slot (``crypto/packing.py``), ``"none"`` one float per slot at
    scale ``2^global_scale_bits`` (≈ 43 bytes per value). Packed kinds are encrypted at the scale of their
    guard bits; the global scale applies to unpacked kinds (``packing = "none"``, and kinds whose DP noise is central).

    ``validate_default=True`` and the model validator: every field, default or given, is checked
    together — a file that sets only ``poly_modulus_degree`` has the default moduli checked against
    *its* N, and the packing layout against both.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    poly_modulus_degree: int = 4096
    coeff_mod_bit_sizes: tuple[int, ...] = (46, 47, 16)
    global_scale_bits: int = 60
    packing: Literal["quantised", "none"] = "quantised"
    max_banks: int = Field(default=7, ge=2, le=1024)
    # Noise flooding of every decryption reply (packing_layout.flooding_std): the replies to at most
    # ``max_decryptions`` ciphertexts over the key's lifetime reveal at most 2^-statistical_security about it.
    statistical_security: int = Field(default=MIN_STATISTICAL_SECURITY, ge=MIN_STATISTICAL_SECURITY, le=128)
    max_decryptions: int = Field(default=2**19, ge=1, le=2**40)
    # Threshold decryption (crypto/threshold.py): the key authority's share and t banks' Shamir shares decrypt a
    # sum; fewer than t banks, or no key authority, cannot. 2 <= t <= the consortium's banks (checked at start).
    threshold: int = Field(default=2, ge=2, le=1024)
    precision: KindPrecisions = KindPrecisions()

    # what a decrypted unpacked value may be off by (flooding and encryption noise, at the global scale)
    UNPACKED_PRECISION: ClassVar[float] = 1e-4

    @model_validator(mode="before")
    @classmethod
    def _mask_bits_retired(cls, data: object) -> object:
        if isinstance(data, dict) and "mask_bits" in data:
            raise field_error(
                "mask_bits",
                "retired: no slot bits are spent on a mask (threshold decryption reveals only the fused sum, to the "
                "aggregator); remove the key",
            )
        return data

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

    def flooding_std(self) -> float:
        """σ, per coefficient, of the noise flooding each decryption reply (packing_layout.flooding_std)."""
        return flooding_std(self.poly_modulus_degree, self.max_banks, self.statistical_security, self.max_decryptions)

    def fused_flooding_std(self) -> float:
        """σ, per coefficient, of the flooding a fused decryption carries: the key authority's and ``threshold``
        banks' partial decryptions each add their own, independent, so the variances add."""
        return self.flooding_std() * math.sqrt(self.threshold + 1)

    def unpacked_error(self) -> float:
        """Worst-case error of a decrypted unpacked value (one float per slot at the global scale)."""
        bound = noise_bound(self.poly_modulus_degree, self.max_banks, self.fused_flooding_std())
        return bound / 2.0**self.global_scale_bits

    @model_validator(mode="after")
    def _flooding_fits_global_scale(self) -> HEParameters:
        error = self.unpacked_error()
        if error > self.UNPACKED_PRECISION:
            needed = self.global_scale_bits + max(1, int(math.ceil(math.log2(error / self.UNPACKED_PRECISION))))
            raise field_error(
                "global_scale_bits",
                f"2^{self.global_scale_bits} leaves no room for the decryption's noise flooding (σ = 2^"
                f"{math.log2(self.flooding_std()):.1f} per coefficient for {self.max_decryptions} decryptions at "
                f"{self.statistical_security}-bit statistical security): unpacked values would be off by up to "
                f"{error:.3g} (> {self.UNPACKED_PRECISION:g}); raise global_scale_bits to at least {needed} (with data "
                "primes to hold it), or lower max_decryptions / statistical_security",
            )
        return self

    @model_validator(mode="after")
    def _threshold_within_banks(self) -> HEParameters:
        if self.threshold > self.max_banks:
            raise field_error(
                "threshold",
                f"t = {self.threshold} exceeds he.max_banks = {self.max_banks}: no consortium this policy admits could "
                "ever gather t banks to decrypt; lower threshold or raise max_banks",
            )
        return self

    @model_validator(mode="after")
    def _packing_fits_slots(self) -> HEParameters:
        if self.packing == "none":
            return self
        for kind in KNOWN_KINDS:
            try:
                self.layout(kind)
            except ValueError as error:
                raise field_error(f"precision.{kind}", str(error)) from None
        return self

    def layout(self, kind: str) -> KindLayout | None:
        """How ``kind`` is packed under these parameters, or None when it travels unpacked."""
        if self.packing == "none":
            return None
        spec: KindPrecision = getattr(self.precision, kind)
        return kind_layout(
            kind,
            spec.lower,
            spec.upper,
            spec.step_bits,
            poly_modulus_degree=self.poly_modulus_degree,
            data_bits=data_bits(self.coeff_mod_bit_sizes),
            max_banks=self.max_banks,
            flooding=self.fused_flooding_std(),
        )
