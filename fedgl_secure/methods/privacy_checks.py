"""What a privacy policy refuses of a run before round 1, method by method (DESIGN §6): the checks the simulation
(:func:`check_runnable`) and every consortium node (:func:`check_consortium`) run before any key is used.

They name methods and read what each method is (its stages, its upload kinds, its own node mechanism), so they
sit on the methods' floor; the DP step they guard is :mod:`fedgl_secure.privacy.dp_round`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedgl_secure.errors import ConfigError
from fedgl_secure.kinds import NODE_WEIGHT
from fedgl_secure.method_registry import load, method_spec
from fedgl_secure.methods import build_method, mechanism_owner
from fedgl_secure.methods.base import method_stages
from fedgl_secure.policy.dp import DATA_KINDS
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy import label_release
from fedgl_secure.privacy.accounting import WEIGHTS
from fedgl_secure.privacy.dp_round import releases_labels_together


def check_local_epochs(policy: Policy, local_epochs: int) -> None:
    """Refuse more local DP-SGD steps per round than ``dp.sgd.local_epochs``, the number the budget accounts for."""
    if policy.dp.sgd_enabled and local_epochs > policy.dp.sgd.local_epochs:
        raise ConfigError(
            f"the experiment trains {local_epochs} local epochs per round, but dp.sgd.local_epochs = "
            f"{policy.dp.sgd.local_epochs}: every DP-SGD step is a release, and the budget covers only that many; "
            f"set training.local_epochs <= {policy.dp.sgd.local_epochs} or raise dp.sgd.local_epochs"
        )


def check_method(policy: Policy, method: str, beta: float) -> None:
    """Refuse a method whose graphs this policy's guarantee does not cover: the pseudo graph under DP-SGD.

    Under DP on predictions or embeddings, P and H are computed with the public W̄ on the bank's own
    degree-bounded graph (``round_pipeline.public_model_outputs``), never on the pseudo graph, and the weights
    channel's sensitivity holds for any graph: so FedGL's pseudo graph (Eq. 9) is allowed there.
    DP-SGD's examples are ego-nets of the graph the bank *trains* on, which with β > 0 includes the
    pseudo-graph edges, whose degree nothing bounds.
    """
    if policy.dp.sgd_enabled and beta > 0:
        raise ConfigError(
            f"method {method!r} trains on the pseudo graph (Eq. 9, beta = {beta:g}), but DP-SGD's sensitivity assumes "
            f"every graph the GCN trains on has degree <= {policy.dp.graph.max_degree} (dp.graph.max_degree), and "
            "the pseudo graph is not degree-bounded. Use --method fedgl-no-gpg or --set self_supervision.beta=0, "
            "or a policy without [dp.sgd]"
        )


def check_runnable(policy: Policy, config) -> None:
    """Everything refused under ``policy`` before round 1 of ``config`` (an ``ExperimentConfig``).

    β > 0 under DP-SGD (the pseudo graph's degree is not bounded), more local epochs per round than
    DP-SGD's budget accounts for, and a method of several stages per round (:func:`check_stages`).
    """
    spec = method_spec(config.method)
    owner = mechanism_owner(policy.dp.node_mechanism)
    if owner is not None and owner.check_mechanism_policy is not None:  # e.g. GAP's accounted settings
        load(owner.check_mechanism_policy)(policy, config)
    if owner is not None and owner.name != config.method:
        raise ConfigError(
            f"dp.node_mechanism = {policy.dp.node_mechanism!r} protects the node unit with method {owner.name!r}'s "
            f"own release; method {config.method!r} has none: run --method {owner.name}, or choose another "
            "dp.node_mechanism"
        )
    if spec.own_mechanism is not None and policy.has_dp and policy.dp.node_mechanism != spec.own_mechanism:
        raise ConfigError(
            f"method {config.method!r} carries its own node-level DP; under dp.unit = {policy.dp.effective_unit!r} "
            f"with {list(policy.dp.enabled_channels())} it would be noised twice and accounted wrongly: use a policy "
            f"with dp.node_mechanism = {spec.own_mechanism!r} (policies/node-dp-{spec.own_mechanism}.toml) or one "
            "without DP"
        )
    unit = policy.dp.effective_unit
    if spec.dp_units is not None and policy.has_dp and unit not in spec.dp_units:
        # fail closed: e.g. Fed²GNN's set-up exchange releases per-node sums of neighbours' features (and counts)
        # computed from the true edges, before any DP step; no channel covers or accounts for them
        raise ConfigError(
            f"method {config.method!r} {spec.dp_units_reason}: dp.unit = {unit!r} would not hold. Use a policy "
            f"without DP, or dp.unit = one of {list(spec.dp_units)}"
        )
    if policy.dp.sgd_enabled and config.training.backbone != "gcn":
        # DP-SGD clips per-node gradients of the 2-layer GCN's ego graphs (privacy/dp_sgd.py, degree-bounded
        # 2 hops); another backbone's receptive field and parameters are not what it bounds
        raise ConfigError(
            f"training.backbone: {config.training.backbone!r} under DP-SGD ([dp.sgd]): node-level DP-SGD clips the "
            "2-layer GCN's ego-graph gradients only; use training.backbone = 'gcn' or a policy without [dp.sgd]"
        )
    check_method(policy, config.method, config.effective_alpha_beta()[1])
    check_local_epochs(policy, config.training.local_epochs)
    method = build_method(config)
    check_stages(policy, method)
    check_upload_kinds(policy, config.method, method.upload_kinds)


def check_stages(policy: Policy, method) -> None:
    """Refuse, under any DP, a method whose round has several stages (e.g. GraphFL's meta step, then its
    fine-tuning): the DP step releases, clips and accounts one contribution per bank and round, and has no
    channel for a second upload of the same round (a query-loss gradient) — in the simulation and the
    consortium alike."""
    stages = method_stages(method)
    if policy.has_dp and len(stages) > 1:
        raise ConfigError(
            f"method {method.name!r} has {len(stages)} stages per round {list(stages)}; the DP step (clipping, "
            "noise, accounting) is defined for single-stage methods only: use a policy without [dp.*]"
        )


def check_upload_kinds(policy: Policy, method: str, kinds: Sequence[str]) -> None:
    """Refuse, under per-round DP, a method that uploads a kind with no DP channel and no claim to be public.

    Each data kind (``DATA_KINDS``) is clipped and noised by its channel; ``node_weight`` is public (which
    nodes a bank holds, already in the union index). Any other kind — e.g. GraphFL's ``meta_gradients``, a
    gradient of the bank's query loss — would leave the bank in clear while the accountant reports the run
    as DP. Source-only units (edge, label) are unaffected: everything uploaded is post-processing there.
    """
    if not policy.has_dp or policy.dp.source_only:
        return
    unprotected = [kind for kind in kinds if kind not in DATA_KINDS and kind != NODE_WEIGHT]
    if unprotected:
        raise ConfigError(
            f"method {method!r} uploads {unprotected}, which no DP channel of this policy covers (dp.unit = "
            f"{policy.dp.unit!r} protects only {list(DATA_KINDS)} per round); refusing rather than releasing them "
            "without noise. Use a source-only unit (edge, label), a policy without DP, or another method"
        )


def check_consortium(policy: Policy, config) -> None:
    """What a consortium (aggregator and banks) refuses at start: the simulation's rules, plus what only it lacks.

    A consortium always encrypts (``protection = "none"`` is refused). Central noise is run: the key
    authority adds it to what it decrypts (:meth:`~fedgl_secure.crypto.key_authority.KeyAuthority.decrypt_sum`).
    """
    if policy.protection == "none":
        raise ConfigError(
            "protection = 'none' sends uploads in clear, but a consortium always encrypts them (CKKS); use a policy "
            "with protection = 'he', or run a plaintext experiment with `simulate`"
        )
    if releases_labels_together(policy) and WEIGHTS not in policy.allowed_kinds:
        # the key authority would refuse every prior round's sum: the prior's rounds would be retried for ever
        raise ConfigError(
            f"dp.labels.prior = {label_release.CONSORTIUM_PRIOR!r} fits its prior from sums of the 'weights' kind "
            f"before round 1, but allowed_kinds = {list(policy.allowed_kinds)} keeps it inside the banks; allow "
            f"'weights', or use a bank-local prior (dp.labels.prior = one of {list(label_release.PRIORS)})"
        )
    owner = mechanism_owner(policy.dp.node_mechanism)
    if owner is not None and owner.check_consortium_policy is not None:  # e.g. the class sums' local noise
        load(owner.check_consortium_policy)(policy)
    check_runnable(policy, config)
