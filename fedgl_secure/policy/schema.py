"""Privacy policy files (DESIGN §6): protection, HE parameters, quorum, upload kinds, timeouts, DP and budget.

A policy is the consortium's contract: every party loads the same file and refuses to run
below it. Validation happens here, at the edge, so an unsafe file fails before any key is
generated, with a message that names the file and the field (``policies/x.toml: quorum: ...``).

Each section has its own module: ``[he]`` in :mod:`~fedgl_secure.policy.he`, ``[dp]`` in
:mod:`~fedgl_secure.policy.dp`, ``[budget]`` in :mod:`~fedgl_secure.policy.budget`. This module holds the
policy itself: ``[timeouts]``, the top-level keys, the rules that cross sections, and loading a file.

Schema (TOML keys; every table is optional and unknown keys are errors)::

    protection = "he" | "none"     # "none": uploads in clear, for experiments only (the audit marks it red)
    description, quorum, allowed_kinds, [he], [timeouts]
    [dp.weights]     enabled, clip, noise_multiplier, noise = "distributed" | "central"
    [dp.predictions] enabled, clip, noise_multiplier, noise
    [dp.embeddings]  enabled, clip, noise_multiplier, noise
    [dp.sgd]         enabled, max_grad_norm, noise_multiplier, local_epochs
    [dp]             unit = "edge" | "label" | "node" | "bank" | "none"   # what one protected change is
    [dp.edges]       mechanism = "none" | "randomized-response" | "laplace", epsilon
    [dp.labels]      mechanism = "none" | "randomized-response" | "rr-with-prior", epsilon,
                     correction = "none" | "forward" | "gce" | "bootstrap-soft" | "bootstrap-hard",
                     gce_q (with "gce"), bootstrap_beta (with "bootstrap-*"),
                     stages, stage_order = "random" | "validation-first",
                     prior = "sgc" | "propagation" | "consortium-sgc", prior_temperature
                     # (the last four with rr-with-prior only)
    [dp.graph]       max_degree, neighbouring = "node" | "edge" | "features", num_layers
    [budget]         epsilon, delta, accountant = "rdp" | "prv", rounds, on_exhausted = "stop-contributing"

A file without ``[dp]`` and ``[budget]`` (``policies/baseline.toml``) means "HE only, no DP", as it
did before these tables existed. What a valid policy guarantees, in (ε, δ) per bank, is computed by
:func:`fedgl_secure.privacy.guarantees.effective_guarantees` (``fedgl-secure policy check FILE``).

Cross-field rules, and why (each error names the field to change):

* ``protection = "none"`` admits no ``[he]``, ``[dp]`` or ``[budget]``: a plaintext policy must not
  look like it protects anything or claim a budget nobody enforces.
* Any DP channel needs a ``[budget]``, and a ``[budget]`` needs a DP channel: noise without a
  budget has nothing to refuse against, and a budget without noise is a claim (decided: an error,
  not a warning — a policy is read by people who will trust what it says).
* With a budget, every kind in ``allowed_kinds`` that carries data (weights, predictions,
  embeddings) must have its DP channel enabled; one noiseless channel makes ε infinite.
  ``node_weight`` (which global nodes a bank holds, times w_k) has no DP channel: the guarantee
  treats node membership and w_k as public, and says so in its assumptions.
* DP on predictions, embeddings or DP-SGD needs ``dp.graph.max_degree``: their sensitivity
  depends on how many GCN rows one node moves (:func:`~fedgl_secure.privacy.graph_sensitivity.affected_rows`).
* ``dp.unit`` names what one protected change is, and each unit has its own mechanism
  (:data:`~fedgl_secure.policy.dp.UNIT_MECHANISMS`): ``"edge"`` (one link) — randomised response on each bank's
  adjacency, once at the source, after which every upload of every round is post-processing (no per-round
  channel needed, ε does not grow with rounds); ``"label"`` (one customer's label) — randomised
  response on the labels, once at the source, likewise; ``"node"`` (one customer with its features,
  label and links) — Gaussian channels and/or DP-SGD under a degree bound, composed per round;
  ``"bank"`` (a bank's whole data) — the weights channel only (sensitivity 2C for any change of a
  bank's data), so predictions and embeddings may not leave a bank. A policy without DP has unit
  ``"none"``. A file that omits ``unit`` gets the one its channels imply
  (:meth:`~fedgl_secure.policy.dp.DPSettings.effective_unit`).
* ``noise = "distributed"`` splits the noise over the *quorum* (the fewest banks a decrypted sum can
  hold); ``quorum >= 2`` is already enforced for every policy, so a sum always carries at least two
  shares.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedgl_secure.errors import PolicyError
from fedgl_secure.kinds import EMBEDDINGS, PREDICTIONS
from fedgl_secure.method_registry import in_method_mechanisms
from fedgl_secure.policy.base import KNOWN_KINDS, RETIRED_KINDS
from fedgl_secure.policy.budget import Budget
from fedgl_secure.policy.dp import DATA_KINDS, DPSettings
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.packing_layout import KindLayout
from fedgl_secure.tomlio import field_error, format_validation_error, read_toml


class Timeouts(BaseModel):
    """How long a round, and one bank's upload within it, may take before the aggregator moves on."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    round_seconds: float = Field(default=600.0, gt=0)
    upload_seconds: float = Field(default=120.0, gt=0)
    # how long the aggregator waits for a decrypting set's partial decryptions before it tries another set
    decryption_seconds: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _upload_within_round(self) -> Timeouts:
        if self.upload_seconds > self.round_seconds:
            raise ValueError(f"upload_seconds ({self.upload_seconds}) exceeds round_seconds ({self.round_seconds})")
        return self


class Policy(BaseModel):
    """One posture of the consortium (e.g. ``policies/baseline.toml``); the cross-field rules are in the module doc."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    description: str = ""
    protection: Literal["he", "none"] = "he"
    he: HEParameters = HEParameters()
    quorum: int = 3
    allowed_kinds: tuple[str, ...] = KNOWN_KINDS
    timeouts: Timeouts = Timeouts()
    dp: DPSettings = DPSettings()
    budget: Budget | None = None

    @property
    def has_dp(self) -> bool:
        return bool(self.dp.enabled_channels())

    @property  # not cached: model_copy(update=...) would carry a cached digest over to another policy
    def digest(self) -> str:
        """SHA-256 (hex) of the validated policy as canonical JSON (sorted keys): what every receipt, round opening
        and round view carries, so that nodes running different policies refuse each other by name."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def upload_layout(self, kind: str) -> KindLayout | None:
        """How banks pack ``kind`` (None: one float per slot, at the global scale).

        A kind with an enabled DP channel travels unpacked: Gaussian noise has no bound, so a fixed packed
        range would refuse (fail closed) a bank whose noise draw lands in the tail, and central noise, added
        by the key authority to the slots it decrypts, would spill from one packed value into the next."""
        if self.protection != "he" or self.dp.upload_channel(kind) is not None:
            return None
        return self.he.layout(kind)

    @model_validator(mode="after")
    def _quorum_within_packing_headroom(self) -> Policy:
        if self.protection == "he" and self.he.packing != "none" and self.quorum > self.he.max_banks:
            raise field_error(
                "he.max_banks",
                f"{self.he.max_banks} is below the quorum ({self.quorum}): no decryptable sum would fit the packed "
                "digits; raise he.max_banks or set he.packing = 'none'",
            )
        return self

    @model_validator(mode="after")
    def _quorum_above_threshold(self) -> Policy:
        """A sum must keep two honest banks in it against the coalition threshold decryption withstands (the
        aggregator, the key authority and t − 1 banks): with quorum q ≤ t, a sum over q banks, q − 1 of them in the
        coalition (their own terms known, or zero), decrypts to the one honest bank's upload."""
        if self.protection == "he" and self.quorum <= self.he.threshold:
            raise field_error(
                "quorum",
                f"{self.quorum} is not above he.threshold = {self.he.threshold}: the aggregator and the key authority "
                f"with t − 1 = {self.he.threshold - 1} colluding bank(s) would decrypt a sum over {self.quorum} banks "
                "that holds one honest bank's upload alone; set quorum >= he.threshold + 1 = "
                f"{self.he.threshold + 1}",
            )
        return self

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

    @model_validator(mode="after")
    def _claims_match_protection(self) -> Policy:
        if self.protection == "none":
            # [dp] with only unit = "none" states "no DP" and is allowed; anything more is a claim
            dp_claims = "dp" in self.model_fields_set and (
                self.dp.enabled_channels() or self.dp.model_fields_set - {"unit"}
            )
            for name in ("he", *(("dp",) if dp_claims else ()), "budget"):
                if name in self.model_fields_set:
                    raise field_error(
                        name,
                        "protection = 'none' sends uploads in clear; a policy without protection must not carry "
                        f"[{name}] settings nobody applies — remove them, or set protection = 'he'",
                    )
            return self
        enabled = self.dp.enabled_channels()
        if enabled and self.budget is None:
            raise field_error(
                "budget",
                f"required when DP is on ({list(enabled)}): a bank needs a budget to stop at; "
                "add [budget] with epsilon and rounds",
            )
        if self.budget is not None and not enabled:
            raise field_error(
                "budget",
                "no DP channel is enabled, so nothing would enforce this budget; enable a [dp.*] channel "
                "or remove [budget]",
            )
        node_kinds = [kind for kind in (PREDICTIONS, EMBEDDINGS) if kind in self.allowed_kinds]
        if self.budget is not None and node_kinds and self.dp.effective_unit == "bank":
            raise field_error(
                "allowed_kinds",
                f"unit = 'bank' has no mechanism that hides a whole bank in {node_kinds} (one row per customer); "
                f"remove them (FedAvg uploads weights only)",
            )
        if self.budget is not None:
            for name, release in (("edges", self.dp.edges), ("labels", self.dp.labels)):
                if release.enabled and release.epsilon > self.budget.epsilon:
                    # a per-round channel over budget only stops a bank after some rounds (policy check says when);
                    # a one-off release over budget would stop every bank before its first upload
                    raise field_error(
                        f"dp.{name}.epsilon",
                        f"{release.epsilon:g} exceeds budget.epsilon = {self.budget.epsilon:g}: the one-off release "
                        "alone spends more than the budget, so no bank could ever contribute; lower it or raise the "
                        "budget",
                    )
        if self.budget is not None and node_kinds and self.dp.node_mechanism in in_method_mechanisms():
            raise field_error(
                "allowed_kinds",
                f"node_mechanism = {self.dp.node_mechanism!r} uploads weights only (its method's model); "
                f"{node_kinds} would leave a bank outside its accounting — remove them",
            )
        if self.budget is not None and self.dp.node_mechanism == "gap":
            if self.budget.rounds < self.dp.gap.rounds:
                raise field_error(
                    "budget.rounds",
                    f"{self.budget.rounds} is shorter than GAP's schedule (dp.gap.encoder_rounds + classifier_rounds = "
                    f"{self.dp.gap.rounds}); GAP spends its ε over exactly that schedule",
                )
        if self.budget is not None and not self.dp.uploads_post_processed:
            for kind in DATA_KINDS:
                if kind in self.allowed_kinds and not self.dp.protects(kind):
                    also = " (or [dp.sgd], which covers weights)" if kind == "weights" else ""
                    raise field_error(
                        f"dp.{kind}",
                        f"allowed_kinds lets {kind!r} leave a bank without noise, which makes ε infinite and "
                        f"the budget meaningless; enable [dp.{kind}]{also} or remove {kind!r} from allowed_kinds",
                    )
        return self


def policy_from_dict(values: dict, source: str = "policy") -> Policy:
    """Validate a parsed policy; errors become one :class:`PolicyError` naming ``source`` and each field."""
    try:
        return Policy.model_validate(values)
    except ValidationError as error:
        raise PolicyError(format_validation_error(error, source=source, sep="\n")) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a TOML policy file."""
    return policy_from_dict(read_toml(path, "policy file", PolicyError), str(path))
