"""Federated averaging of model parameters (Eq. 10), as a pure function on the floor every layer may use.

It sits with the model, not in ``engine/aggregation.py`` beside the summation, because ``privacy/`` (the label
prior's public model, ``privacy/consortium_prior.py``) averages parameters too and sits below the engine.
"""

from __future__ import annotations

import torch

from fedgl_secure.errors import ConfigError


def fedavg(weighted_parameter_sum: torch.Tensor, total_weight: torch.Tensor | float) -> torch.Tensor:
    """Eq. 10: ``W̄ = Σ_k w_k W_k / Σ_k w_k`` from the already-summed numerator and denominator."""
    total = float(total_weight)
    if total <= 0:
        raise ConfigError("aggregation: the total client weight must be positive")
    return weighted_parameter_sum / total
