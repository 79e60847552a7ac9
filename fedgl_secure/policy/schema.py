"""Privacy policy files (DESIGN §6): protection, HE parameters, quorum, upload kinds, timeouts, DP and budget.

A policy is the consortium's contract: every party loads the same file and refuses to run
below it. Validation happens here, at the edge, so an unsafe file fails before any key is
generated, with a message that names the file and the field (``policies/x.toml: quorum: ...``).

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
  depends on how many GCN rows one node moves (:func:`~fedgl_secure.privacy.mechanisms.affected_rows`).
* ``dp.unit`` names what one protected change is, and each unit has its own mechanism
  (:data:`UNIT_MECHANISMS`): ``"edge"`` (one link) — randomised response on each bank's adjacency,
  once at the source, after which every upload of every round is post-processing (no per-round
  channel needed, ε does not grow with rounds); ``"label"`` (one customer's label) — randomised
  response on the labels, once at the source, likewise; ``"node"`` (one customer with its features,
  label and links) — Gaussian channels and/or DP-SGD under a degree bound, composed per round;
  ``"bank"`` (a bank's whole data) — the weights channel only (sensitivity 2C for any change of a
  bank's data), so predictions and embeddings may not leave a bank. A policy without DP has unit
  ``"none"``. A file that omits ``unit`` gets the one its channels imply (:meth:`DPSettings.effective_unit`).
* ``noise = "distributed"`` splits the noise over the *quorum* (the fewest banks a decrypted sum can
  hold); ``quorum >= 2`` is already enforced for every policy, so a sum always carries at least two
  shares.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from fedgl_secure.errors import PolicyError
from fedgl_secure.kinds import EMBEDDINGS, META_GRADIENTS, NODE_WEIGHT, PREDICTIONS, WEIGHTS
from fedgl_secure.policy.ckks_params import data_bits, moduli_problems, scale_problems
from fedgl_secure.policy.gap_settings import GAPSettings
from fedgl_secure.policy.he_security import MAX_LOG_Q_128, security_check
from fedgl_secure.policy.packing_layout import (
    MIN_STATISTICAL_SECURITY,
    KindLayout,
    flooding_std,
    kind_layout,
    noise_bound,
)
from fedgl_secure.tomlio import field_error, format_validation_error, read_toml

# The DP accountants a budget may name (privacy/accounting.py implements them with Opacus).
AccountantName = Literal["rdp", "prv"]

KNOWN_KINDS = (WEIGHTS, PREDICTIONS, EMBEDDINGS, NODE_WEIGHT, META_GRADIENTS)
# Kinds that no longer exist, and where their values went. Σ_k w_k was its own one-value kind, which
# cost a whole ciphertext (N/2 slots) per bank and round; it is now the last entry of "weights".
RETIRED_KINDS = {"sample_weight": WEIGHTS}


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
    channel travels unpacked, see :meth:`Policy.upload_layout`).
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


# --- differential privacy (DESIGN §6) ----------------------------------------------------------

DATA_KINDS = (WEIGHTS, PREDICTIONS, EMBEDDINGS)  # the kinds with a DP channel of their own
DEGREE_BOUND_CHANNELS = (PREDICTIONS, EMBEDDINGS, "sgd")  # channels whose sensitivity needs dp.graph.max_degree
EDGE_MECHANISMS = ("none", "randomized-response", "laplace")
LABEL_MECHANISMS = ("none", "randomized-response", "rr-with-prior")
UNITS = ("edge", "label", "node", "bank", "none")
Unit = Literal["edge", "label", "node", "bank", "none"]
# Which mechanism each unit is protected by (dp.unit's validator refuses the others).
UNIT_MECHANISMS = {
    "edge": "dp.edges (randomised response once at the source; uploads are post-processing)",
    "label": "dp.labels (randomised response, or RRWithPrior in stages, once at the source; uploads are "
    "post-processing)",
    "node": "Gaussian channels dp.weights / dp.predictions / dp.embeddings and/or dp.sgd, degree-bounded "
    "(dp.node_mechanism = 'channels'), GAP's modules (dp.node_mechanism = 'gap' with [dp.gap]), or one release of "
    "noisy class sums (dp.node_mechanism = 'centroids')",
    "bank": "dp.weights only (bank-level sensitivity 2C); predictions and embeddings may not leave a bank",
    "none": "no differential privacy",
}
# Node-unit mechanisms that run inside their own method (GAP's modules, the class-sums release): every upload is
# post-processing of them, and they are the policy's only mechanism.
IN_METHOD_MECHANISMS = ("gap", "centroids")
ON_EXHAUSTED = ("stop-contributing",)
MAX_DELTA = 1e-3


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class GaussianChannel(_Section):
    r"""DP on one upload kind: clip, then add :math:`\mathcal N(0, \sigma^2)`, σ = noise_multiplier × sensitivity.

    ``clip`` is the L2 bound C: of the whole update W_k − W̄ for ``weights``
    (:func:`~fedgl_secure.privacy.mechanisms.clip_vector`, sensitivity 2C), of every node row for
    ``predictions`` and ``embeddings`` (:func:`~fedgl_secure.privacy.mechanisms.clip_rows`,
    sensitivity 2C√K with K rows moved, see ``[dp.graph]``).

    ``noise`` says who adds it:

    * ``"distributed"`` — each bank adds its share N(0, σ²/q), q = quorum, to its own term before
      encrypting (:func:`~fedgl_secure.privacy.mechanisms.gaussian_share` with ``num_banks = quorum``),
      so only the decrypted sum, over at least q banks, carries the full σ. No party ever holds a
      noiseless sum, not even the aggregator and key authority together. A bank that receives the
      sum knows its own share, so against a fellow bank the noise left is σ√((q−1)/q)
      (:func:`~fedgl_secure.privacy.mechanisms.residual_noise_std`); the guarantees account that.
    * ``"central"`` — the key authority adds N(0, σ²) once to what it decrypts. Since the aggregator
      pads every sum with a uniform element r of the plaintext ring, the key authority decrypts
      s + r and returns s + r + n (n CKKS-encoded); the aggregator removes r and obtains s + n.
      Adding n to s + r is the same as adding it to s: the key authority never sees s (its view is
      uniform whatever s is), the aggregator never sees n, and every bank and the aggregator face
      the full σ. It relies on the key authority and the aggregator
      not colluding — together they know s exactly.
    """

    enabled: bool = True
    clip: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    noise_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    noise: Literal["distributed", "central"] = "distributed"

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> GaussianChannel:
        if self.enabled:
            for name in ("clip", "noise_multiplier"):
                if getattr(self, name) is None:
                    raise field_error(name, "required when the channel is enabled (set it, or enabled = false)")
        return self


class DPSGD(_Section):
    """DP-SGD for local training through Opacus: per-node gradients clipped to ``max_grad_norm``, noise z·C.

    The engine trains full-batch (one step per local epoch), so every step uses every node:
    ``sample_rate = 1`` and no amplification by subsampling is claimed. On a GCN one node enters the
    losses of K nodes around it, so the multiplier that holds is z / (2K − 1) (node neighbouring),
    :func:`~fedgl_secure.privacy.mechanisms.graph_dp_sgd_noise_multiplier`; that is what is accounted.
    ``local_epochs`` is the number of steps per round the budget assumes: a run must not train more
    local epochs per round than this.
    """

    enabled: bool = True
    max_grad_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    noise_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    local_epochs: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> DPSGD:
        if self.enabled:
            for name in ("max_grad_norm", "noise_multiplier", "local_epochs"):
                if getattr(self, name) is None:
                    raise field_error(name, "required when DP-SGD is enabled (set it, or enabled = false)")
        return self


class _SourceRelease(_Section):
    """A mechanism applied once at the source with its ε (edge or label DP): ``mechanism = "none"`` or one of
    the subclass's ``mechanisms``, and ε exactly when a mechanism spends it."""

    mechanisms: ClassVar[tuple[str, ...]] = ("none",)
    mechanism: str = "none"
    epsilon: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("mechanism")
    @classmethod
    def _known_mechanism(cls, value: str) -> str:
        if value not in cls.mechanisms:
            raise ValueError(f"unknown mechanism {value!r}; choose one of {list(cls.mechanisms)}")
        return value

    @model_validator(mode="after")
    def _epsilon_with_mechanism(self) -> _SourceRelease:
        if self.mechanism == "none" and self.epsilon is not None:
            spenders = " or ".join(repr(m) for m in self.mechanisms if m != "none")
            raise field_error("epsilon", f"set only with mechanism = {spenders}; here nothing spends it")
        if self.mechanism != "none" and self.epsilon is None:
            raise field_error("epsilon", f"required with mechanism = {self.mechanism!r}")
        return self

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"


class EdgeDP(_SourceRelease):
    """Edge-level DP on each bank's adjacency, applied once before round 1: ε-edge-DP, paid once.

    ``"randomized-response"`` flips every node pair with probability 1/(1 + e^ε)
    (:func:`~fedgl_secure.privacy.mechanisms.randomized_response_edges`); everything computed from the
    released graph afterwards is post-processing *for edges*. It protects edges only, not node
    features, labels or membership.

    ``"laplace"`` is the FGCL paper's mechanism (Yang et al., Information Sciences 2023,
    arXiv 2207.11836): Laplace(1/ε) noise on the weight of every existing edge
    (:func:`~fedgl_secure.privacy.mechanisms.laplace_edge_weights`). It is ε-DP for a change of one
    edge's weight by at most 1, and hides nothing about *whether* an edge exists (the set of pairs
    is released as is); ``unit = "edge"`` therefore needs randomised response.
    """

    mechanisms: ClassVar[tuple[str, ...]] = EDGE_MECHANISMS
    # "posterior": weight each released edge by P(true edge | released), estimated from n, the released
    # count and ε only (post-processing, mechanisms.randomized_response_posterior); "feature-posterior": the
    # same estimate within bins of the endpoints' feature similarity (features are outside the edge unit;
    # privacy.edge_posterior); "none": weight 1
    weighting: Literal["posterior", "feature-posterior", "none"] = "posterior"


class LabelDP(_SourceRelease):
    """Label-level DP: k-ary randomised response on each bank's labels, once before round 1 (pure ε, paid once).

    Every label a bank trains or selects models with (training and validation nodes) is kept with
    probability e^ε / (e^ε + C − 1) and otherwise replaced by one of the C − 1 other classes uniformly
    (:func:`~fedgl_secure.privacy.mechanisms.randomized_response_labels`). Everything computed from the
    released labels is post-processing *for labels*; features, links and membership are not covered.
    ``correction = "forward"`` trains with the known noise matrix T (loss on softmax(H)·T, Patrini et
    al., CVPR 2017), which uses only the public ε and C: still post-processing. It is an option, not the
    default: on Cora (FedGL, 25 rounds) it measured worse than plain cross-entropy (ε = 2, seed 1:
    63.0 % against 77.0 %; at ε = 1 one seed collapsed to 6.3 %), docs/privacy.md §6.

    ``mechanism = "rr-with-prior"`` is Ghazi et al.'s multi-stage release (NeurIPS 2021, RRWithPrior): the
    labels are split into ``stages`` disjoint stages (``stage_order = "random"``: equal random parts of
    training and validation; ``"validation-first"``: the validation labels in the first stages − 1 parts,
    the training labels last); stage 1 by randomised response, every later stage by RRWithPrior with a
    label-propagation prior from the labels released before it
    (:func:`~fedgl_secure.privacy.label_release.multi_stage_release`). Each label is released once by an
    ε-label-DP mechanism whose prior does not depend on it, so the guarantee and the ledger are the same
    ε, paid once. ``prior = "consortium-sgc"`` fits the SGC prior by FedAvg over all banks' earlier releases
    (:mod:`~fedgl_secure.privacy.consortium_prior`), the same guarantee. ``prior_temperature`` T sharpens the
    prior to p^(1/T) (renormalised) before RRWithPrior reads it: post-processing of the prior, the same guarantee.

    ``correction = "gce"`` (generalised cross-entropy, ``gce_q``) and ``"bootstrap-soft"`` / ``"bootstrap-hard"``
    (Reed et al.'s bootstrapping, ``bootstrap_beta``) replace cross-entropy on the released training labels by a loss
    robust to wrong labels (:mod:`~fedgl_secure.privacy.label_dp`); the pseudo-label term stays cross-entropy. They
    read the released labels and the model only: post-processing, the same guarantee (docs/privacy.md §6.10).
    """

    mechanisms: ClassVar[tuple[str, ...]] = LABEL_MECHANISMS
    correction: Literal["none", "forward", "gce", "bootstrap-soft", "bootstrap-hard"] = "none"
    # Zhang & Sabuncu's q (their default 0.7) and Reed et al.'s β (0.8, their hard bootstrapping's); None: the default
    gce_q: float | None = Field(default=None, gt=0, le=1)
    bootstrap_beta: float | None = Field(default=None, ge=0, le=1)
    stages: int | None = Field(default=None, ge=2)
    stage_order: Literal["random", "validation-first"] | None = None
    prior: Literal["sgc", "propagation", "consortium-sgc"] | None = None
    # the prior sharpened as p^(1/T), renormalised, before RRWithPrior reads it (1: as fitted); docs/privacy.md §6.10
    prior_temperature: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _stages_with_prior(self) -> LabelDP:
        if self.mechanism != "rr-with-prior":
            for name in ("stages", "stage_order", "prior", "prior_temperature"):
                if getattr(self, name) is not None:
                    raise field_error(name, f"read only with mechanism = 'rr-with-prior' (here {self.mechanism!r})")
        return self

    @model_validator(mode="after")
    def _loss_settings_with_their_loss(self) -> LabelDP:
        if self.gce_q is not None and self.correction != "gce":
            raise field_error("gce_q", f"read only with correction = 'gce' (here {self.correction!r})")
        if self.bootstrap_beta is not None and not self.correction.startswith("bootstrap"):
            raise field_error(
                "bootstrap_beta",
                f"read only with correction = 'bootstrap-soft' or 'bootstrap-hard' (here {self.correction!r})",
            )
        return self

    @property
    def effective_stages(self) -> int:
        """How many stages the release has: ``stages`` (default 2) under RRWithPrior, else 1."""
        if self.mechanism != "rr-with-prior":
            return 1
        return 2 if self.stages is None else self.stages

    @property
    def effective_stage_order(self) -> str:
        return "random" if self.stage_order is None else self.stage_order

    @property
    def effective_prior(self) -> str:
        return "sgc" if self.prior is None else self.prior

    @property
    def effective_prior_temperature(self) -> float:
        return 1.0 if self.prior_temperature is None else float(self.prior_temperature)

    @property
    def effective_gce_q(self) -> float:
        return 0.7 if self.gce_q is None else float(self.gce_q)

    @property
    def effective_bootstrap_beta(self) -> float:
        return 0.8 if self.bootstrap_beta is None else float(self.bootstrap_beta)


class GraphBound(_Section):
    """What the node-level sensitivities rely on (:func:`~fedgl_secure.privacy.mechanisms.affected_rows`).

    ``max_degree`` D must bound the degree of every graph a release propagates over, in both
    neighbouring datasets: the bank's own graph, which banks project with
    :func:`~fedgl_secure.privacy.mechanisms.bound_degree` (the guarantee then holds for the projected
    graph). P and H under DP are computed on that graph without the pseudo graph of Eq. 9, so FedGL's
    pseudo graph is allowed with DP on uploads; DP-SGD trains on the fused graph, whose pseudo-graph
    edges nothing bounds, so it refuses the pseudo graph (β > 0).

    ``neighbouring`` is the unit of privacy: one customer with all its data and links (``"node"``),
    one link (``"edge"``), or one customer's features (``"features"``). ``num_layers`` is the GCN's
    depth (the engine's GCN has 2; H from the hidden layer moves fewer rows, so 2 covers it).
    """

    max_degree: int | None = Field(default=None, ge=1)
    neighbouring: Literal["node", "edge", "features"] = "node"
    num_layers: int = Field(default=2, ge=1)


class CentroidsRelease(_Section):
    """``[dp.centroids]``: who adds the noise of the class-sums release (``node_mechanism = "centroids"``).

    * ``"local"`` — each bank adds N(0, z²) to its own sums before encrypting: the guarantee needs nobody's
      honesty, and the consortium's sum carries √K·z.
    * ``"central"`` — banks encrypt exact sums; the key authority adds N(0, z²) once to its partial decryption of
      the sum, as for a central Gaussian channel (:class:`GaussianChannel`): every bank and the aggregator face z,
      the sum carries z. It relies on the key authority and the aggregator not colluding (DESIGN §5.1).
    """

    noise: Literal["local", "central"] = "local"


class DPSettings(_Section):
    """``[dp]``: the unit of privacy and one optional table per channel; an absent table means no DP on that channel."""

    unit: Unit | None = None
    # "channels": the Gaussian channels and DP-SGD below; "gap": GAP's encoder, perturbed hops and classifier
    # (privacy/gap.py, method gap), whose uploads are post-processing of its DP-SGD; "centroids": one Gaussian
    # release of each bank's class sums (privacy/class_sums.py, method centroids)
    node_mechanism: Literal["channels", "gap", "centroids"] = "channels"
    gap: GAPSettings | None = None
    centroids: CentroidsRelease | None = None
    weights: GaussianChannel | None = None
    predictions: GaussianChannel | None = None
    embeddings: GaussianChannel | None = None
    sgd: DPSGD | None = None
    edges: EdgeDP = EdgeDP()
    labels: LabelDP = LabelDP()
    graph: GraphBound = GraphBound()

    def upload_channel(self, kind: str) -> GaussianChannel | None:
        """The enabled DP channel of an upload kind, or None when that kind is released without noise."""
        channel = getattr(self, kind) if kind in DATA_KINDS else None
        return channel if channel is not None and channel.enabled else None

    @property
    def sgd_enabled(self) -> bool:
        return self.sgd is not None and self.sgd.enabled

    def protects(self, kind: str) -> bool:
        """Whether a data kind leaves a bank under DP: its own Gaussian channel, or for ``weights`` DP-SGD.

        Weights trained by DP-SGD from the public W̄ are post-processing of the noisy gradients, so they
        need no channel of their own.
        """
        return self.upload_channel(kind) is not None or (kind == "weights" and self.sgd_enabled)

    def enabled_channels(self) -> tuple[str, ...]:
        """Names of the enabled channels, in the order weights, predictions, embeddings, sgd, edges, labels."""
        names = list(self.round_channels())
        if self.node_mechanism in IN_METHOD_MECHANISMS:
            names.append(self.node_mechanism)
        if self.edges.enabled:
            names.append("edges")
        if self.labels.enabled:
            names.append("labels")
        return tuple(names)

    def round_channels(self) -> tuple[str, ...]:
        """Enabled channels that release something every round (Gaussian uploads, DP-SGD): composed per round."""
        names = [kind for kind in DATA_KINDS if self.upload_channel(kind) is not None]
        if self.sgd_enabled:
            names.append("sgd")
        return tuple(names)

    @property
    def source_only(self) -> bool:
        """Whether every DP mechanism acts once at the source (edges, labels): uploads are post-processing."""
        return (
            bool(self.enabled_channels())
            and not self.round_channels()
            and self.node_mechanism not in IN_METHOD_MECHANISMS
        )

    @property
    def uploads_post_processed(self) -> bool:
        """Whether every upload is post-processing of a mechanism inside the bank (source-only units, GAP), so the
        data kinds need no Gaussian channel of their own."""
        return self.source_only or self.node_mechanism in IN_METHOD_MECHANISMS

    @property
    def effective_unit(self) -> str:
        """``unit`` as written, else the one the enabled channels imply (a file written before units existed)."""
        if self.unit is not None:
            return self.unit
        if self.round_channels():
            return "node"
        if self.labels.enabled:
            return "label"
        if self.edges.enabled:
            return "edge"
        return "none"

    def central_kinds(self) -> tuple[str, ...]:
        """Data kinds whose enabled channel asks for central noise (added once by the key authority)."""
        if self.node_mechanism == "centroids":  # the class sums travel as the weights kind
            return (WEIGHTS,) if self.centroids is not None and self.centroids.noise == "central" else ()
        channels = {kind: self.upload_channel(kind) for kind in DATA_KINDS}
        return tuple(kind for kind, channel in channels.items() if channel is not None and channel.noise == "central")

    def degree_bound_channels(self) -> tuple[str, ...]:
        """Enabled channels whose sensitivity rests on ``graph.max_degree``: predictions, embeddings, sgd."""
        return tuple(name for name in self.enabled_channels() if name in DEGREE_BOUND_CHANNELS)

    @property
    def needs_degree_bound(self) -> bool:
        """Whether any release's sensitivity rests on ``graph.max_degree`` (banks then bound their graph's degree)."""
        return bool(self.degree_bound_channels())

    @model_validator(mode="after")
    def _mechanisms_fit_unit(self) -> DPSettings:
        """Each unit is protected by its own mechanism (:data:`UNIT_MECHANISMS`); a mismatch names ``unit``."""
        unit, enabled, per_round = self.unit, self.enabled_channels(), self.round_channels()
        if self.gap is not None and self.node_mechanism != "gap":
            raise field_error("gap", "[dp.gap] is read only with node_mechanism = 'gap'; set it, or remove [dp.gap]")
        if self.centroids is not None and self.node_mechanism != "centroids":
            raise field_error(
                "centroids", "[dp.centroids] is read only with node_mechanism = 'centroids'; set it, or remove it"
            )
        if self.node_mechanism in IN_METHOD_MECHANISMS:
            self._check_in_method(unit, per_round)
        if unit is None:
            return self
        wanted = f"unit = {unit!r} is protected by {UNIT_MECHANISMS[unit]}"
        if unit == "none" and enabled:
            raise field_error("unit", f"'none' (no DP) but {list(enabled)} are enabled; name the unit they protect")
        if unit == "edge":
            if self.edges.mechanism != "randomized-response":
                raise field_error(
                    "unit",
                    f"{wanted}; set [dp.edges] mechanism = 'randomized-response' ('laplace' hides an edge's weight, "
                    "not whether the edge exists)",
                )
            if per_round or self.labels.enabled:
                raise field_error(
                    "unit",
                    f"{wanted}; {list(per_round) + (['labels'] if self.labels.enabled else [])} protect "
                    "another unit — one unit per policy",
                )
        if unit == "label":
            if not self.labels.enabled:
                raise field_error(
                    "unit",
                    f"{wanted}; set [dp.labels] mechanism = 'randomized-response' or 'rr-with-prior' and epsilon",
                )
            if per_round or self.edges.enabled:
                raise field_error(
                    "unit",
                    f"{wanted}; {list(per_round) + (['edges'] if self.edges.enabled else [])} protect "
                    "another unit — one unit per policy",
                )
        if unit in ("node", "bank"):
            if not per_round and self.node_mechanism not in IN_METHOD_MECHANISMS:
                raise field_error("unit", f"{wanted}; no such channel is enabled")
            if self.labels.enabled:
                raise field_error("labels", f"label DP protects unit 'label', not {unit!r}; remove [dp.labels]")
        if unit == "node" and self.graph.neighbouring != "node":
            raise field_error(
                "graph.neighbouring",
                f"{self.graph.neighbouring!r} contradicts unit = 'node'; set neighbouring = 'node'",
            )
        if unit == "bank":
            extra = [name for name in per_round if name != WEIGHTS]
            if extra:
                raise field_error(
                    "unit",
                    f"'bank' hides a bank's whole data through the weights channel (sensitivity 2C); {extra} are "
                    "calibrated to one customer, not a bank — remove them (and their kinds from allowed_kinds)",
                )
        return self

    def _check_in_method(self, unit: str | None, per_round: tuple[str, ...]) -> None:
        """GAP and the class-sums release are node-unit mechanisms on their own: unit 'node', GAP's [dp.gap] table,
        and no other DP mechanism."""
        mechanism = self.node_mechanism
        if unit != "node":
            raise field_error(
                "node_mechanism",
                f"{mechanism!r} protects unit 'node' (one customer); set dp.unit = 'node' (got {unit!r})",
            )
        if mechanism == "gap" and self.gap is None:
            raise field_error("gap", "required with node_mechanism = 'gap' (max_degree, hops, rounds, DP-SGD settings)")
        others = [*per_round, *(["edges"] if self.edges.enabled else []), *(["labels"] if self.labels.enabled else [])]
        if others:
            raise field_error(
                "node_mechanism",
                f"{mechanism!r} brings its own noise; {others} would be a second mechanism on the same "
                "uploads — remove them, or use node_mechanism = 'channels'",
            )

    @model_validator(mode="after")
    def _degree_bound_when_needed(self) -> DPSettings:
        needing = list(self.degree_bound_channels())
        if needing and self.graph.max_degree is None:
            raise field_error(
                "graph.max_degree",
                f"required when DP is on for {needing}: their sensitivity grows with how many GCN rows one "
                "node moves, which only a degree bound limits (see mechanisms.prediction_sensitivity)",
            )
        return self


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
        if self.budget is not None and node_kinds and self.dp.node_mechanism in IN_METHOD_MECHANISMS:
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
