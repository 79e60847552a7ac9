"""The settings GAP's node-level accounting depends on (policy ``[dp.gap]``, the run config's ``gap`` section).

Apart from :mod:`fedgl_secure.privacy.gap` (which needs torch) so that the policy schema, which every node
reads at start-up, stays free of it.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator


class GAPSettings(BaseModel):
    """What GAP's accounting depends on (policy ``[dp.gap]`` and the ``gap`` section of a run's config)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    max_degree: int = Field(5, ge=1, description="D: every node keeps at most D links (both ends bounded)")
    hops: int = Field(2, ge=1, le=8, description="K: perturbed aggregation hops")
    encoder_rounds: int = Field(5, ge=1, description="federated rounds that train the encoder (first phase)")
    classifier_rounds: int = Field(5, ge=1, description="federated rounds that train the classifier (after the hops)")
    local_steps: int = Field(2, ge=1, description="S: DP-SGD steps a bank takes per round and module")
    sample_rate: float = Field(1.0, gt=0.0, le=1.0, description="q: Poisson sampling rate of DP-SGD's examples")
    max_grad_norm: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="C: per-node gradient clip")
    epsilon_split: tuple[float, float, float] = Field(
        (0.4, 0.2, 0.4), description="shares of ε for encoder, aggregation, classifier (calibration only)"
    )

    @field_validator("epsilon_split")
    @classmethod
    def _split_is_a_distribution(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if not all(v > 0 for v in value) or not math.isclose(sum(value), 1.0, abs_tol=1e-6):
            raise ValueError(f"three positive shares summing to 1 (encoder, aggregation, classifier), got {value}")
        return value

    @property
    def rounds(self) -> int:
        """Rounds of the whole schedule: encoder, then classifier (the hops run once in between)."""
        return self.encoder_rounds + self.classifier_rounds
