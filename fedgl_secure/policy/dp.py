"""The policy's ``[dp]`` table (DESIGN §6): the unit of privacy and its mechanisms, one section per channel.

Per-round channels (Gaussian noise on an upload kind, DP-SGD), releases once at the source (edges, labels), the
degree bound node-level sensitivities rest on, and the node-unit mechanisms that run inside their own method (GAP,
the class-sums release). :class:`DPSettings` checks that they fit the unit; the rules that need the rest of the
policy (the budget, ``allowed_kinds``) are in :mod:`~fedgl_secure.policy.schema`. What a policy guarantees is
computed by :mod:`~fedgl_secure.privacy.guarantees`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from fedgl_secure.kinds import EMBEDDINGS, PREDICTIONS, WEIGHTS
from fedgl_secure.method_registry import in_method_mechanisms
from fedgl_secure.policy.base import _Section
from fedgl_secure.policy.gap_settings import GAPSettings
from fedgl_secure.tomlio import field_error

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


class GaussianChannel(_Section):
    r"""DP on one upload kind: clip, then add :math:`\mathcal N(0, \sigma^2)`, σ = noise_multiplier × sensitivity.

    ``clip`` is the L2 bound C: of the whole update W_k − W̄ for ``weights``
    (:func:`~fedgl_secure.privacy.secure_noise.clip_vector`, sensitivity 2C), of every node row for
    ``predictions`` and ``embeddings`` (:func:`~fedgl_secure.privacy.secure_noise.clip_rows`,
    sensitivity 2C√K with K rows moved, see ``[dp.graph]``).

    ``noise`` says who adds it:

    * ``"distributed"`` — each bank adds its share N(0, σ²/q), q = quorum, to its own term before
      encrypting (:func:`~fedgl_secure.privacy.secure_noise.gaussian_share` with ``num_banks = quorum``),
      so only the decrypted sum, over at least q banks, carries the full σ. No party ever holds a
      noiseless sum, not even the aggregator and key authority together. A bank that receives the
      sum knows its own share, so against a fellow bank the noise left is σ√((q−1)/q)
      (:func:`~fedgl_secure.privacy.secure_noise.residual_noise_std`); the guarantees account that.
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
    :func:`~fedgl_secure.privacy.graph_sensitivity.graph_dp_sgd_noise_multiplier`; that is what is accounted.
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
    (:func:`~fedgl_secure.privacy.edge_mechanisms.randomized_response_edges`); everything computed from the
    released graph afterwards is post-processing *for edges*. It protects edges only, not node
    features, labels or membership.

    ``"laplace"`` is the FGCL paper's mechanism (Yang et al., Information Sciences 2023,
    arXiv 2207.11836): Laplace(1/ε) noise on the weight of every existing edge
    (:func:`~fedgl_secure.privacy.edge_mechanisms.laplace_edge_weights`). It is ε-DP for a change of one
    edge's weight by at most 1, and hides nothing about *whether* an edge exists (the set of pairs
    is released as is); ``unit = "edge"`` therefore needs randomised response.
    """

    mechanisms: ClassVar[tuple[str, ...]] = EDGE_MECHANISMS
    # "posterior": weight each released edge by P(true edge | released), estimated from n, the released
    # count and ε only (post-processing, edge_mechanisms.randomized_response_posterior); "feature-posterior": the
    # same estimate within bins of the endpoints' feature similarity (features are outside the edge unit;
    # privacy.edge_posterior); "none": weight 1
    weighting: Literal["posterior", "feature-posterior", "none"] = "posterior"


class LabelDP(_SourceRelease):
    """Label-level DP: k-ary randomised response on each bank's labels, once before round 1 (pure ε, paid once).

    Every label a bank trains or selects models with (training and validation nodes) is kept with
    probability e^ε / (e^ε + C − 1) and otherwise replaced by one of the C − 1 other classes uniformly
    (:func:`~fedgl_secure.privacy.label_mechanisms.randomized_response_labels`). Everything computed from the
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
    """What the node-level sensitivities rely on (:func:`~fedgl_secure.privacy.graph_sensitivity.affected_rows`).

    ``max_degree`` D must bound the degree of every graph a release propagates over, in both
    neighbouring datasets: the bank's own graph, which banks project with
    :func:`~fedgl_secure.privacy.graph_sensitivity.bound_degree` (the guarantee then holds for the projected
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
    # release of each bank's class sums (privacy/class_sums.py, method centroids). Which of them run inside their
    # method is the method registry's to say (MethodSpec.own_mechanism, read by in_method_mechanisms())
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
        if self.node_mechanism in in_method_mechanisms():
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
            and self.node_mechanism not in in_method_mechanisms()
        )

    @property
    def uploads_post_processed(self) -> bool:
        """Whether every upload is post-processing of a mechanism inside the bank (source-only units, GAP), so the
        data kinds need no Gaussian channel of their own."""
        return self.source_only or self.node_mechanism in in_method_mechanisms()

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
        if self.node_mechanism in in_method_mechanisms():
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
            if not per_round and self.node_mechanism not in in_method_mechanisms():
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
                "node moves, which only a degree bound limits (see graph_sensitivity.prediction_sensitivity)",
            )
        return self
