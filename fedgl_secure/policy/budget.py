"""The policy's ``[budget]`` table (DESIGN §6): the (ε, δ) each bank may spend, the accountant, and what
happens when it is spent.

Apart from ``[dp]`` (:mod:`~fedgl_secure.policy.dp`): the mechanisms say what each release costs, the budget
what a bank may spend in all; :mod:`~fedgl_secure.policy.schema` checks that the two come together.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fedgl_secure.policy.base import _Section

# The DP accountants a budget may name (privacy/accounting.py implements them with Opacus).
AccountantName = Literal["rdp", "prv"]
ON_EXHAUSTED = ("stop-contributing",)
MAX_DELTA = 1e-3


class Budget(_Section):
    """``[budget]``: the (ε, δ) each bank may spend over a whole run, and what happens when it is spent.

    ``rounds`` is the most rounds the budget is computed for (the guarantees report ε after that
    many). Before every release a bank asks its ledger whether the release would take it above
    ``epsilon`` (:meth:`~fedgl_secure.privacy.accounting.PrivacyLedger.would_exceed`); if so it stops
    contributing for the rest of the run — fail closed, never silently continue.
    """

    epsilon: float = Field(gt=0, allow_inf_nan=False)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    accountant: AccountantName = "rdp"
    rounds: int = Field(ge=1)
    on_exhausted: str = "stop-contributing"

    @field_validator("delta")
    @classmethod
    def _delta_meaningful(cls, value: float) -> float:
        if value > MAX_DELTA:
            raise ValueError(
                f"{value} is too large to mean anything (δ is the chance the guarantee fails outright; "
                f"it should be well below 1 / number of customers); use at most {MAX_DELTA}"
            )
        return value

    @field_validator("on_exhausted")
    @classmethod
    def _fail_closed(cls, value: str) -> str:
        if value not in ON_EXHAUSTED:
            raise ValueError(
                f"{value!r} is not allowed: a bank whose budget is spent must stop contributing (fail closed), "
                "never continue or only warn; set on_exhausted = 'stop-contributing'"
            )
        return value
