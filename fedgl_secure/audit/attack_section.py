"""Audit section 7: empirical attacks — membership inference on the final model (with a non-DP reference
beside a DP run's) and link inference from the pseudo graph (algorithms in ``audit.attacks``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgl_secure.audit.report_model import (
    AMBER,
    GREEN,
    INFO,
    LINK_AUC_GREEN,
    MEMBERSHIP_AUC_GREEN,
    MEMBERSHIP_AUC_RED,
    RED,
    Section,
    Table,
)
from fedgl_secure.audit.run_files import RunFiles
from fedgl_secure.errors import FedGLError
from fedgl_secure.method_registry import NEIGHBOUR_EXCHANGE, method_spec
from fedgl_secure.wire.run_record import (
    RUN_FILE,
)

if TYPE_CHECKING:
    from fedgl_secure.audit.attacks import LinkResult, MembershipResult
    from fedgl_secure.audit.reference import ReferenceModel, ReferencePlan
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig
    from fedgl_secure.engine.graph_tensors import GraphTensors

# --- 7. empirical attacks ------------------------------------------------------------------------------


def attack_section(
    files: RunFiles,
    data_root: str | Path | None = None,
    seed: int = 0,
    reference: ReferencePlan | None = None,
    bank_config: str | Path | None = None,
) -> Section:
    """Membership inference on W̄ (beside a non-DP reference for a DP run) and link inference on Ā.

    Amber "not run" when the graph cannot be rebuilt. ``reference`` (default: retrain) says where
    the without-DP model comes from (:mod:`fedgl_secure.audit.reference`). ``bank_config`` (a bank's node
    file) runs the attacks on that bank's own customers instead of the merged graph (:func:`_bank_view`).
    """
    from fedgl_secure.audit.reference import ReferencePlan

    section = Section("attacks", "Empirical attacks")
    try:
        if bank_config is not None:
            config, dataset, merged = _bank_view(files, Path(bank_config))
        else:
            config, dataset = _experiment(files, data_root)
            merged = _merged(config, dataset)
    except (FedGLError, OSError, ValueError, KeyError) as error:
        what = (
            "the bank's graph could not be read" if bank_config is not None else "the merged graph could not be rebuilt"
        )
        hint = "" if bank_config is not None else "; a bank's risk officer can run them on its own data: --bank-config"
        section.add("not-run", AMBER, f"attacks not run: {what} ({error}){hint}")
        return section
    rows: list[tuple[Any, ...]] = []
    membership = _membership(section, files, config, merged, seed)
    if membership is not None:
        rows.append(
            (
                "membership",
                membership.attack,
                membership.auc,
                membership.auc_stderr,
                membership.members,
                json.dumps(membership.variants),
            )
        )
    if bank_config is not None:
        _reference_note(
            section,
            "not-available",
            "no reference on one bank's data: a without-DP model of the same experiment needs every bank's data",
        )
    else:
        _membership_reference(section, files, membership, (config, dataset, merged), seed, reference or ReferencePlan())
    _membership_floor(section, config, merged, seed)
    link = _link(section, files, merged, seed)
    if link is not None:
        rows.append(("link", link.attack, link.auc, link.auc_stderr, link.positives, json.dumps(link.variants)))
    if rows:
        section.tables.insert(
            0, Table("Attack AUCs", ("attack", "best variant", "AUC", "± s.e.", "positives", "variants"), tuple(rows))
        )
    section.notes.append(
        "AUC 0.5 = guessing, 1.0 = perfect inference; the best variant is reported (favours the attacker)."
    )
    return section


def membership_floor(config: ExperimentConfig, merged: GraphTensors, seed: int) -> MembershipResult:
    """The membership attack's AUC on ``config``'s untrained initial model W₀, which saw no data: what "no
    leakage" scores on ``merged`` (the same members and non-members as the run's own attack with ``seed``).

    Members (training nodes) and non-members (test nodes) differ in ways a model that learned nothing
    still reflects (degree, feature density), and the best of three variants is taken, so the floor
    is not exactly 0.5. Raises ValueError or RuntimeError when the attack cannot run.
    """
    from fedgl_secure.engine.round_pipeline import method_initial_parameters
    from fedgl_secure.methods import build_method

    method = None if method_spec(config.method).baseline else build_method(config)
    untrained = method_initial_parameters(method, config, merged.features.shape[1], merged.num_classes)
    return _membership_auc(untrained, config, merged, seed, 0)


def _membership_floor(section: Section, config: ExperimentConfig, merged: GraphTensors, seed: int) -> None:
    """The audit's information line with :func:`membership_floor`. Informational: it calibrates the membership
    thresholds, never decides them."""
    try:
        floor = membership_floor(config, merged, seed)
    except (ValueError, RuntimeError) as error:
        section.add("membership-floor", INFO, f"attack floor not computed: {error}")
        return
    section.add(
        "membership-floor",
        INFO,
        f"attack floor: AUC {floor.auc:.3f} ± {floor.auc_stderr:.3f} on the untrained initial model W₀ (seed "
        f"{config.seed}), which saw no data; an AUC near it means the attack finds nothing beyond how members "
        "and non-members differ anyway",
    )
    section.data.setdefault("membership", {})["floor"] = _auc_figures(floor)


def _dp_phrase(files: RunFiles) -> str:
    return "with DP" if files.policy.has_dp else "without DP"


def _membership_auc(
    weights: Any, config: ExperimentConfig, merged: GraphTensors, seed: int, round_number: int
) -> MembershipResult:
    """Membership inference on a flat parameter vector (array or tensor) of ``config``'s global model after round
    ``round_number`` (:func:`~fedgl_secure.audit.attacks.global_model_membership`: the method's own model where
    it builds one, e.g. GAP's modules or the class sums).

    The same ``seed`` picks the same member and non-member nodes, so the run, its reference and the
    attack floor are scored on the same nodes.
    """
    from fedgl_secure.audit.attacks import global_model_membership

    return global_model_membership(config, weights, merged, round_number=round_number, seed=seed)


def _membership(
    section: Section, files: RunFiles, config: ExperimentConfig, merged: GraphTensors, seed: int
) -> MembershipResult | None:
    """The run's own membership inference check (its thresholds); the result, or None when it could not run."""
    try:
        rounds = files.run.get("rounds_run")  # model.npz holds the final broadcast, after this round
        final_round = rounds if isinstance(rounds, int) and rounds >= 0 else 0
        membership = _membership_auc(files.directory.model["weights"], config, merged, seed, final_round)
    except (ValueError, RuntimeError) as error:
        section.add("membership", AMBER, f"membership inference not run: {error}")
        return None
    auc, se = membership.auc, membership.auc_stderr
    status = GREEN if auc <= MEMBERSHIP_AUC_GREEN else AMBER if auc <= MEMBERSHIP_AUC_RED else RED
    unit = files.policy.dp.effective_unit if files.policy.protection == "he" else "none"
    outside = unit in ("edge", "label")  # a customer's membership is not what these units protect
    section.add(
        "membership",
        INFO if outside else status,
        (f"not covered by unit {unit!r} (information only): " if outside else "")
        + f"membership inference on the final global model ({_dp_phrase(files)}): AUC {auc:.3f} ± {se:.3f} "
        f"(best of {', '.join(membership.variants)}: {membership.attack}; {membership.members} members vs "
        f"{membership.nonmembers} non-members; green ≤ {MEMBERSHIP_AUC_GREEN}, red > {MEMBERSHIP_AUC_RED})",
    )
    section.data["membership"] = {"dp": files.policy.has_dp, "run": _auc_figures(membership)}
    return membership


def _auc_figures(result: MembershipResult) -> dict[str, Any]:
    """The JSON figures of a :class:`~fedgl_secure.audit.attacks.MembershipResult`."""
    return {
        "auc": result.auc,
        "auc_stderr": result.auc_stderr,
        "attack": result.attack,
        "members": result.members,
        "variants": dict(result.variants),
    }


def _membership_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult | None,
    experiment: tuple[ExperimentConfig, GraphDataset, GraphTensors],
    seed: int,
    plan: ReferencePlan,
) -> None:
    """The without-DP side of membership inference, always ``info``.

    It describes the attack (how well it does when nothing protects the model), not the run: a high
    reference AUC is expected and must not colour the report; the run's own check carries the verdict.
    ``experiment`` is ``(config, dataset, merged graph)`` as the audit rebuilt them.
    """
    if membership is None:
        _reference_note(section, "not-run", "no reference: the run's own membership inference did not run")
    elif not files.policy.has_dp:
        _reference_note(section, "not-needed", "run has no DP; its AUC is the without-DP figure")
    elif plan.skipped:
        _reference_note(
            section,
            "skipped",
            "reference skipped (--no-reference): the membership AUC without DP was not measured, so this report "
            "does not show what DP changed",
        )
    else:
        _computed_reference(section, files, membership, experiment, seed, plan)


def _reference_note(section: Section, status: str, detail: str) -> None:
    """An info line (and its JSON status) for a reference that was not computed, or not needed."""
    section.add("membership-reference", INFO, detail)
    section.data.setdefault("membership", {})["reference"] = {"status": status, "detail": detail}


def _computed_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult,
    experiment: tuple[ExperimentConfig, GraphDataset, GraphTensors],
    seed: int,
    plan: ReferencePlan,
) -> None:
    """The reference from ``--reference`` or retrained, attacked; a failure is an info line, not an error,
    since the run's own verdict stands without it."""
    from fedgl_secure.audit.reference import completed_rounds, reference_config, retrain_reference

    config, dataset, merged = experiment
    try:
        model = plan.model or retrain_reference(config, dataset, completed_rounds(files.run), progress=plan.progress)
        rounds = model.rounds or completed_rounds(files.run)
        reference = _membership_auc(model.weights, reference_config(config), merged, seed, rounds)
    except (FedGLError, OSError, ValueError, RuntimeError) as error:
        _reference_note(section, "failed", f"reference not computed: {error}")
        return
    _report_reference(section, files, membership, model, reference)


def _report_reference(
    section: Section,
    files: RunFiles,
    membership: MembershipResult,
    model: ReferenceModel,
    reference: MembershipResult,
) -> None:
    """The info check, the with/without-DP table and the JSON figures of a computed reference.

    The difference's standard error treats the two AUCs as independent; as both score the same
    nodes they are positively correlated, so it overstates the uncertainty (conservative).
    """
    difference = membership.auc - reference.auc
    difference_se = math.hypot(membership.auc_stderr, reference.auc_stderr)
    rounds = files.run.get("rounds_run")
    lag = f"; it trained {model.rounds} rounds, the run {rounds}" if model.rounds != rounds else ""
    section.add(
        "membership-reference",
        INFO,
        f"reference without DP, {model.source}{lag}: AUC {reference.auc:.3f} ± {reference.auc_stderr:.3f}; "
        f"this run with DP: {membership.auc:.3f} ± {membership.auc_stderr:.3f}; difference (run − reference) "
        f"{difference:+.3f} ± {difference_se:.3f}. Information, not a verdict: the attack's power on the model "
        "without DP",
    )
    section.tables.append(
        Table(
            "Membership inference with and without DP",
            ("model", "DP", "source", "AUC", "± s.e.", "best variant", "members"),
            (
                (
                    "audited run",
                    "yes",
                    str(files.directory.path),
                    membership.auc,
                    membership.auc_stderr,
                    membership.attack,
                    membership.members,
                ),
                (
                    "reference",
                    "no",
                    model.source,
                    reference.auc,
                    reference.auc_stderr,
                    reference.attack,
                    reference.members,
                ),
                ("difference (run − reference)", "", "", difference, difference_se, "", ""),
            ),
        )
    )
    figures = section.data.setdefault("membership", {})
    figures["reference"] = {
        "status": "computed",
        "source": model.source,
        "rounds": model.rounds,
        **_auc_figures(reference),
    }
    figures["difference"] = difference
    figures["difference_stderr"] = difference_se


def _link(section: Section, files: RunFiles, merged: GraphTensors, seed: int) -> LinkResult | None:
    """Link inference from the broadcast pseudo graph; the result, or None when there is none or it failed."""
    import torch

    from fedgl_secure.audit.attacks import link_inference_auc, restricted_pseudo_graph, true_edge_index
    from fedgl_secure.engine.pseudo_graph import PseudoGraph

    if "pseudo_graph_neighbors" not in files.directory.model or "pseudo_graph_weights" not in files.directory.model:
        section.add("link", GREEN, "no pseudo graph in model.npz: nothing to infer links from")
        return None
    try:
        pseudo = PseudoGraph(
            torch.as_tensor(files.directory.model["pseudo_graph_neighbors"], dtype=torch.int64),
            torch.as_tensor(files.directory.model["pseudo_graph_weights"], dtype=torch.float32),
        )
        # the attacker's pairs: every pair of the merged graph, or of one bank's own customers (bank view)
        link = link_inference_auc(
            restricted_pseudo_graph(pseudo, merged.positions), true_edge_index(merged), merged.num_nodes, seed
        )
    except (ValueError, RuntimeError) as error:
        section.add("link", AMBER, f"link inference not run: {error}")
        return None
    section.add("link", *link_grade(link, _edge_guarantee(files), _dp_phrase(files)))
    return link


def link_grade(link: LinkResult, guarantee: tuple[float, int] | None, dp_phrase: str) -> tuple[str, str]:
    """The link check's status and text. Without an edge guarantee, a fixed threshold (green ≤
    ``LINK_AUC_GREEN``). Under the edge unit (``guarantee`` = ε per bank, banks that may hold one link), the
    run is checked against what it promised: green while the attack stays within the AUC that guarantee allows
    (:func:`edge_dp_auc_bound`), red when it beats it by more than two standard errors — the guarantee would
    then not hold."""
    measured = (
        f"link inference from the pseudo graph ({dp_phrase}): AUC {link.auc:.3f} ± {link.auc_stderr:.3f} "
        f"({link.positives} true edges vs {link.negatives} non-edges"
    )
    if guarantee is None:
        status = GREEN if link.auc <= LINK_AUC_GREEN else AMBER
        return status, f"{measured}; green ≤ {LINK_AUC_GREEN}; homophily alone lifts it above 0.5)"
    epsilon, holders = guarantee
    bound = edge_dp_auc_bound(epsilon * holders)
    contradicted = link.auc - 2 * link.auc_stderr > bound
    verdict = "the attack exceeds it: the guarantee does not hold" if contradicted else "the attack is within it"
    return RED if contradicted else GREEN, (
        f"{measured}): the edge unit's guarantee (ε = {epsilon:g} per bank, a link held by up to {holders} "
        f"banks: {epsilon * holders:g}-DP) allows any test of one link an AUC up to {bound:.4f}; {verdict} "
        f"(without the edge unit this check is green only ≤ {LINK_AUC_GREEN})"
    )


def edge_dp_auc_bound(epsilon: float) -> float:
    """The largest ROC AUC any test of "is this link present?" reaches against an ε-DP release of the links:
    ε-DP bounds every test's power by TPR ≤ min(e^ε·FPR, 1 − e^−ε·(1 − FPR)) (the hypothesis-testing view of
    DP, Kairouz, Oh and Viswanath, ICML 2015), and the area under that curve is e^ε / (1 + e^ε)."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def _edge_guarantee(files: RunFiles) -> tuple[float, int] | None:
    """(ε per bank, banks that may hold one link) when the run is under the edge unit with randomised
    response on the links; None otherwise (the link check then keeps its fixed threshold). Banks that share two
    customers may each hold their link and each randomise it, so a link's guarantee composes over its holders:
    every bank of the run is the worst case."""
    policy = files.policy
    if policy.protection != "he" or policy.dp.effective_unit != "edge":
        return None
    edges = policy.dp.edges
    if edges.mechanism != "randomized-response" or edges.epsilon is None:
        return None
    return float(edges.epsilon), max(1, len(files.banks))


def _bank_view(files: RunFiles, bank_config: Path) -> tuple[ExperimentConfig, GraphDataset, GraphTensors]:
    """One bank's own customers as the attacks' graph: what a bank's risk officer can audit without anyone
    else's data — its tables read as for training (:func:`~fedgl_secure.consortium.bank_data.bank_graph`), its rows
    placed at their union-index positions (saved by the bank at enrolment), so W̄ is attacked on its customers
    and Ā on the pairs of its customers. For a consortium on banks' own tables, whose merged graph nobody
    holds. Raises ValueError naming the mismatch for a node file of another role or federation."""
    import torch

    from fedgl_secure.consortium.bank_data import bank_graph
    from fedgl_secure.consortium.bank_state import bank_graph_tensors
    from fedgl_secure.consortium.config import NodeRole, load_node_config

    node, consortium = load_node_config(bank_config)
    if node.role is not NodeRole.BANK:
        raise ValueError(f"{bank_config}: a node of role {node.role.value!r}; --bank-config needs a bank's node file")
    federation = files.directory.run.get("federation")
    if federation is not None and federation != consortium.federation:
        raise ValueError(f"{bank_config}: a bank of federation {consortium.federation!r}, the run is {federation!r}")
    config = consortium.experiment_config()
    if NEIGHBOUR_EXCHANGE in method_spec(config.method).phases:
        raise ValueError("the bank view does not rebuild Fed²GNN's reconstructed graph; audit the simulation instead")
    data = bank_graph(node, consortium)
    graph = bank_graph_tensors(node.state_dir, data.graph, torch.device("cpu"), config.training.normalize_features)
    return config, data.graph, graph


def _experiment(files: RunFiles, data_root: str | Path | None) -> tuple[ExperimentConfig, GraphDataset]:
    """The run's experiment configuration from run.json (on the CPU; ``data_root`` if given) and its dataset."""
    config_values = files.run.get("config")
    if not config_values:
        raise ValueError(f"{RUN_FILE} has no 'config' to rebuild the federation from")
    from fedgl_secure.data.registry import load_dataset
    from fedgl_secure.engine.config import build_config

    values = dict(config_values)
    values["device"] = "cpu"
    if data_root is not None:
        values["data_root"] = str(data_root)
    config = build_config(values)
    return config, load_dataset(config.dataset, config.data_root, seed=config.seed, split=config.data)


def _merged(config: ExperimentConfig, dataset: GraphDataset) -> GraphTensors:
    """The federation's merged client graph (on the CPU): what the simulation evaluates W̄ on."""
    from fedgl_secure.simulation.experiment import Federation, resolve_device

    return Federation.build(dataset, config, resolve_device("cpu")).merged
