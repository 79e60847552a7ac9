"""What the policy's sections share: the upload kinds a policy knows, and the base of its DP and budget tables.

Below :mod:`~fedgl_secure.policy.he`, :mod:`~fedgl_secure.policy.dp`, :mod:`~fedgl_secure.policy.budget` and
:mod:`~fedgl_secure.policy.schema`, which all read it, so that none of them imports another for these.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fedgl_secure.kinds import EMBEDDINGS, META_GRADIENTS, NODE_WEIGHT, PREDICTIONS, WEIGHTS

KNOWN_KINDS = (WEIGHTS, PREDICTIONS, EMBEDDINGS, NODE_WEIGHT, META_GRADIENTS)
# Kinds that no longer exist, and where their values went. Σ_k w_k was its own one-value kind, which
# cost a whole ciphertext (N/2 slots) per bank and round; it is now the last entry of "weights".
RETIRED_KINDS = {"sample_weight": WEIGHTS}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
