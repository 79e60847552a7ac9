"""Weights uploads centred on the broadcast they were trained from, so the packed range bounds one round's update.

A bank's WEIGHTS term is ``cat(ŵ_k·W_k, [ŵ_k])``. Encrypted as it is, its values grow with the model, and
after enough rounds some weight leaves the kind's packed range: the bank must then refuse to upload (fail
closed, :func:`~fedgl_secure.crypto.upload.check_magnitude`) and a long federation stalls. Every bank of a
round (or stage) trains from the same public W̄, the broadcast, so on the secure paths it uploads

    ``cat(ŵ_k·(W_k − W̄), [ŵ_k])  =  term − term[-1]·cat(W̄, 0)``                       (:func:`centre_term`)

and whoever decodes the sum adds ``(Σ_k ŵ_k)·W̄`` back, Σ_k ŵ_k being the sum's own last entry
(:func:`restore_sum`). The sum a method's server update reads is the same (to float64 rounding), so is Eq. 10's
W̄; nobody learns anything new, since W̄ is public to every party that adds or decodes. Under a weights DP
channel the term is ``ŵ_k·(W̄ + clip(W_k − W̄)) + share`` with an exact last entry, so the centred upload is
the clipped, noised update itself. Other kinds (predictions, embeddings, GraphFL's gradients) are not centred:
they do not accumulate across rounds.
"""

from __future__ import annotations

import numpy as np
import torch

from fedgl_secure.errors import CiphertextError
from fedgl_secure.kinds import WEIGHTS

CENTRED_KINDS = frozenset({WEIGHTS})


def wire_reference(weights: torch.Tensor | None) -> np.ndarray | None:
    """W̄ exactly as the banks download it (float32, as the broadcast is encoded), the reference both ends centre on."""
    if weights is None:
        return None
    return weights.detach().to(torch.float32).cpu().numpy().reshape(-1)


def _offset(kind: str, values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    reference = np.asarray(reference, dtype=np.float64).reshape(-1)
    if values.ndim != 1 or values.size != reference.size + 1:
        raise CiphertextError(
            f"{kind}: a term of {values.size} values cannot be centred on a broadcast of {reference.size} weights "
            "(expected the weights plus the folded client weight)"
        )
    return np.append(reference, 0.0)


def centre_term(kind: str, values: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
    """A bank's term of ``kind`` as it is encrypted: ``term − term[-1]·cat(W̄, 0)`` for a centred kind with a
    reference W̄; otherwise unchanged."""
    values = np.asarray(values, dtype=np.float64)
    if kind not in CENTRED_KINDS or reference is None:
        return values
    return values - values[-1] * _offset(kind, values, reference)


def bank_term(kind: str, contribution: torch.Tensor, reference: np.ndarray | None) -> np.ndarray:
    """A bank's contribution of ``kind`` (a tensor on any device) as the flat float64 term it encrypts, centred by
    :func:`centre_term`: what the bank node, the simulation's secure summation and its plaintext twin all sum."""
    return centre_term(kind, contribution.detach().to(torch.float64).cpu().numpy().reshape(-1), reference)


def restore_sum(kind: str, values: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
    """The decoded sum of ``kind`` as the method reads it: ``sum + sum[-1]·cat(W̄, 0)`` for a centred kind with
    a reference W̄ (the inverse of :func:`centre_term` summed over banks); otherwise unchanged."""
    values = np.asarray(values, dtype=np.float64)
    if kind not in CENTRED_KINDS or reference is None:
        return values
    return values + values[-1] * _offset(kind, values, reference)
