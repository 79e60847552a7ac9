"""The plain-language texts of a policy's guarantees (DESIGN §6): what each unit of privacy protects and what it
leaves open, and the assumptions the figures of :func:`~fedgl_secure.privacy.guarantees.effective_guarantees`
rest on.

They sit beside :mod:`~fedgl_secure.privacy.guarantees`, which computes the figures and attaches these texts to
its :class:`~fedgl_secure.privacy.guarantees.Guarantees`: ``fedgl-secure policy check`` prints them and the audit
records them. Wording only: the texts quote the policy's settings (and K, the rows one change moves, from
:func:`~fedgl_secure.privacy.graph_sensitivity.affected_rows`); every ε is computed in ``guarantees``.
:func:`policy_assumptions` assembles the assumptions of a policy whose DP is the per-round channels, DP-SGD and
the source releases (GAP and the class sums write their own, in ``guarantees``).
"""

from __future__ import annotations

from fedgl_secure.policy.schema import DATA_KINDS, Policy
from fedgl_secure.privacy import graph_sensitivity
from fedgl_secure.privacy.accounting import EMBEDDINGS, PREDICTIONS, WEIGHTS
from fedgl_secure.privacy.calibration import graph_args

UNIT_OF_PRIVACY = {
    "node": "one customer (node) with all its features, its label and all its links",
    "edge": "one link (edge) between two customers",
    "features": "the features of one customer (node), the graph fixed",
    "label": "one customer's label (e.g. its default or fraud flag)",
    "bank": "a bank's whole data (every customer, label and link it holds)",
}

# What each unit (dp.unit) protects and what it leaves open: printed by `policy check`, recorded in the audit.
UNIT_PROTECTS = {
    "edge": (
        "whether any one link (transaction) between two customers of a bank exists, in everything the bank "
        "releases in every round: ε-edge-DP, paid once at the source, the same after any number of rounds"
    ),
    "label": (
        "any one customer's label (training and validation labels) in everything the bank releases: ε-label-DP, "
        "paid once at the source, the same after any number of rounds"
    ),
    "node": "one customer with all its features, its label and its links, under the degree bound",
    "features": "one customer's features, the graph fixed (a weaker unit than node)",
    "bank": (
        "a bank's whole data in the released model: whatever a bank holds, the model sum moves by at most 2C "
        "(sensitivity of the weights channel), hidden by the noise against other banks and the aggregator"
    ),
    "none": "nothing beyond what HE hides from the aggregator: decrypted sums are exact",
}
UNIT_DOES_NOT_PROTECT = {
    "edge": (
        "customers' features, labels and membership; roughly how many links a bank has (the released graph's "
        "size); a link's weight or amount beyond its existence"
    ),
    "label": "customers' features and links; which customers are labelled and how many; the class frequencies "
    "up to the noise",
    "node": "a bank's size and which (pseudonymous) global nodes it holds; anything above the degree bound is "
    "protected for the trimmed graph only",
    "features": "customers' links, labels and membership",
    "bank": (
        "nothing per customer beyond the bank-level bound; with six banks the noise that hides a whole bank is "
        "as large as the signal of the whole federation, so the model learns little; which banks take part and "
        "their sizes are public; predictions and embeddings may not leave a bank under this unit"
    ),
    "none": "everything the decrypted sums reveal",
}

# The node unit under the class-sums release (dp.node_mechanism = "centroids"): no degree bound is involved.
CENTROIDS_PROTECTS = "one customer with all its features, its label and its links, whatever its degree"
CENTROIDS_DO_NOT_PROTECT = (
    "a bank's size and which (pseudonymous) global nodes it holds; the scores a bank computes for its own "
    "customers, if it publishes them"
)


# what each [dp.edges] weighting reads, for policy check's assumptions (docs/privacy.md §6.2, §6.13)
EDGE_WEIGHTING_ASSUMPTIONS = {
    "posterior": "Each released edge is weighted by P(true edge | released), from n, the released count and ε only "
    "(post-processing).",
    "feature-posterior": "Each released edge is weighted by P(true edge | released) estimated within bins of its "
    "endpoints' feature similarity, from the released graph, the bank's features, n and ε (post-processing: features "
    "are outside the edge unit).",
    "none": "Released edges keep weight 1.",
}


# --- assumptions ------------------------------------------------------------------------------


def policy_assumptions(policy: Policy) -> list[str]:
    dp, budget = policy.dp, policy.budget
    graph = dp.graph
    q = policy.quorum
    unit = dp.effective_unit
    if dp.source_only:
        first = (
            f"Unit of privacy (dp.unit = {unit!r}): {UNIT_OF_PRIVACY[unit]}. ε is per bank and paid once, at the "
            "source, before round 1: every upload of every round (weights, predictions, embeddings) is computed "
            "from the released graph and labels and is post-processing, so ε does not grow with rounds "
            f"(δ = 0 for randomised response; the budget's δ = {budget.delta:g} is not used)."
        )
    else:
        first = (
            f"Unit of privacy (dp.unit = {unit!r}): {UNIT_OF_PRIVACY.get(unit, UNIT_OF_PRIVACY['node'])}. ε is per "
            f"bank over {budget.rounds} rounds at δ = {budget.delta:g}, Gaussian releases composed with Opacus' "
            f"{budget.accountant.upper()} accountant, one-off releases added by basic composition."
        )
    lines = [
        first,
        f"Before every release a bank checks its ledger; once the next release would exceed ε = "
        f"{budget.epsilon:g} it stops contributing for the rest of the run (on_exhausted = "
        f"{budget.on_exhausted!r}: fail closed, never continue silently).",
    ]
    if dp.needs_degree_bound:
        k = graph_sensitivity.affected_rows(*graph_args(policy))
        lines.append(
            f"Degree bound: every graph a release propagates over has degree ≤ {graph.max_degree} in both "
            "neighbouring datasets: the bank's own graph, which banks project with "
            "graph_sensitivity.bound_degree (above the "
            "bound the guarantee holds for the projected graph only). Predictions and embeddings are computed on it "
            "without the pseudo graph of Eq. 9; DP-SGD, which trains on the fused graph, refuses the pseudo graph "
            f"(β > 0). One change then moves at most K = {k} rows of the {graph.num_layers}-layer GCN."
        )
    if dp.upload_channel(PREDICTIONS) or dp.upload_channel(EMBEDDINGS):
        lines.append(
            "Public model for P and H: predictions and embeddings are computed with the global model W̄ received "
            "that round (public), not with weights trained on the bank's data without DP, and on the bank's own "
            "graph without the pseudo graph; otherwise one node can move every row and the sensitivity above is "
            "false."
        )
    if dp.upload_channel(WEIGHTS):
        lines.append(
            "Weights: a bank releases W̄ + clip(W_k − W̄, C) plus noise; the 2C sensitivity holds for any change of "
            "its data, with no degree assumption."
        )
    if any(dp.upload_channel(kind) for kind in DATA_KINDS):
        lines.append(
            "Pre-weighting: uploads are multiplied by w_k (= N_k). The figures are for the unweighted release; "
            "noise must be scaled by the largest weight in the round, w_max (public), i.e. each share has std "
            "w_max·σ/√q (scaling each bank's share by its own w_k would leave a bank heavier than the others "
            "protected by its own share alone, z/√q). w_k, Σ_k w_k (the last entry of weights) and node_weight "
            "(which global nodes a bank holds) carry no noise: a bank's size and node membership are public."
        )
    distributed = [kind for kind in DATA_KINDS if (c := dp.upload_channel(kind)) and c.noise == "distributed"]
    central = list(dp.central_kinds())
    if distributed:
        lines.append(
            f"Distributed noise on {distributed}: each bank adds N(0, σ²/{q}) to its term before encrypting "
            f"(q = quorum = {q}, the fewest banks in a decrypted sum), so the sum carries σ. Accounted against a "
            f"fellow bank, which knows its own share: z·√({q - 1}/{q}). The aggregator and key authority, even "
            "colluding, face the full σ. Banks do not collude (c colluding banks leave σ√((q−c)/q))."
        )
    if central:
        lines.append(
            f"Central noise on {central}: the key authority adds N(0, σ²) to its partial decryption of the sum, "
            "which is the same as adding it to s; it never sees s in clear and the aggregator never sees the "
            "noise. Holds only while the key authority and the aggregator do not collude."
        )
    if dp.sgd_enabled:
        lines.append(
            f"DP-SGD: full-batch, at most {dp.sgd.local_epochs} steps (local epochs) per round. Each training (or "
            "pseudo-labelled) node's example is its ego-net, and its gradient (Opacus per-example gradients) is "
            "clipped to max_grad_norm; sample_rate = 1, no amplification by subsampling claimed (message passing "
            "breaks its premise); one node enters up to K examples, so the multiplier accounted is z/(2K−1) "
            "(graph_sensitivity.graph_dp_sgd_noise_multiplier). The number of training labels and of "
            "pseudo-labelled nodes "
            "at a bank is treated as public (it normalises the gradient)."
        )
        if not dp.upload_channel(WEIGHTS):
            lines.append(
                "Weights under DP-SGD: a bank's weights are computed from the public W̄ and the noisy gradients only, "
                "so releasing them is post-processing and needs no noise of its own (no [dp.weights])."
            )
    if dp.edges.enabled and dp.edges.mechanism == "randomized-response":
        lines.append(
            f"Edge DP: randomised response on each bank's adjacency once before round 1 (ε = {dp.edges.epsilon:g}); "
            "it protects links only — not node features, labels or membership; training on the released graph is "
            "post-processing for links. Non-edges are never materialised (a binomial count of new pairs is drawn). "
            "The degree bound, when there is one, is applied to the released graph (post-processing). Links between "
            "customers of different banks are in no bank's graph and are not released at all. "
            + EDGE_WEIGHTING_ASSUMPTIONS[dp.edges.weighting]
        )
    if dp.edges.enabled and dp.edges.mechanism == "laplace":
        lines.append(
            f"Edge weights: Laplace(1/{dp.edges.epsilon:g}) noise on each existing edge's weight once before round 1 "
            "(the FGCL paper's mechanism): ε-DP for one edge's weight changing by at most 1; which pairs are edges "
            "is released as is, so a link's existence is NOT hidden."
        )
    if dp.labels.enabled:
        lines.append(_label_assumption(dp.labels))
    lines.append(
        "Noise comes from the OS CSPRNG (secure_noise.secure_gaussian): floating-point Gaussians with tails cut at "
        "≈ 8σ, a loss far below δ."
    )
    if policy.protection == "he":
        lines.append(
            "Honest-but-curious parties running the protocol as written; HE keeps each bank's upload from the "
            "aggregator, DP bounds what the released sums reveal."
        )
    return lines


def _label_assumption(labels) -> str:
    """The assumption line of ``[dp.labels]``: which mechanism releases the labels, and why ε is paid once."""
    common = (
        "Training with the forward correction uses only ε and the number of classes C, both public, and a robust loss "
        "(correction = 'gce' or 'bootstrap-*') only the released labels and the model: post-processing. "
        "Test labels are used by the simulation to measure accuracy only (a deployment has none). Which customers "
        "are labelled is not hidden."
    )
    if labels.mechanism != "rr-with-prior":
        return (
            "Label DP (mechanism = 'randomized-response'): k-ary randomised response on each bank's training and "
            f"validation labels once before round 1 (ε = {labels.epsilon:g}; a label is kept with e^ε/(e^ε + C − 1)). "
            + common
        )
    return (
        f"Label DP (mechanism = 'rr-with-prior', {labels.effective_stages} stages, stage_order = "
        f"'{labels.effective_stage_order}', prior = '{labels.effective_prior}'): each bank releases its training and "
        "validation labels once before round 1, in disjoint stages — the first by k-ary randomised response, each "
        "later one by RRWithPrior (Ghazi et al., NeurIPS 2021) with a prior "
        + (
            "all banks fit together (FedAvg of an SGC prior, the weights summed as the run's) from their features, "
            "graphs and the labels released in earlier stages, "
            if labels.effective_prior == "consortium-sgc"
            else "the bank computes from its features, its graph and the labels released in earlier stages, "
        )
        + (
            f"sharpened to temperature {labels.effective_prior_temperature:g}, "
            if labels.effective_prior_temperature != 1.0
            else ""
        )
        + "never from the label being released. Each label is "
        f"released once by an ε-label-DP mechanism (ε = {labels.epsilon:g}), so the whole release is ε-label-DP "
        "(parallel composition over disjoint labels), recorded as one release. " + common
    )
