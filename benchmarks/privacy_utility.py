"""Privacy–utility curve of FedGL under node-level DP (issue 4, DESIGN §6): accuracy and MIA AUC per ε.

For every total ε target per bank (δ from the template, composed over ``--rounds`` rounds with the
policy's accountant), the script derives a policy with **the template policy's structure**
(``--policy``, default ``policies/strict-dp.toml``) — same clip bounds, degree bound, quorum, noise
placement and DP channels — and finds by bisection one factor t that scales every channel's noise
multiplier (Gaussian channels and DP-SGD alike, so their ratios stay the template's) until
:func:`~fedgl_secure.privacy.guarantees.effective_guarantees` gives ε ≤ target over ``--rounds``
rounds. ε = inf means no DP: the baseline HE-only policy (``policies/baseline.toml``), whose sums
are exact. With a DP-SGD template (``policies/strict-dp-sgd.toml``) every run trains
``dp.sgd.local_epochs`` local epochs, and so does the ε = inf row, so the rows differ only in noise.

It then runs FedGL on the dataset with the plaintext summation plus the DP step
(:class:`~fedgl_secure.privacy.dp_round.FederationPrivacy`), for seeds 0..n−1, and records the
global test accuracy (at the best validation round, as every other benchmark) and the
membership-inference AUC on the *final* global model W̄ (:func:`~fedgl_secure.audit.attacks.
membership_inference_auc` on the merged client graph), with its Hanley–McNeil standard error.
The secure path (CKKS + masks) gives the same sums up to ≈1e-8 and records the same releases, so
accuracy and accounting are those of a secure run; only the wall time differs.

Method: ``fedgl-no-gpg`` by default (no pseudo graph, so DP-SGD templates run too). Under DP on
uploads FedGL's pseudo graph (Eq. 9, β > 0) is allowed: P and H are computed with the public W̄ on
each bank's own degree-bounded graph, never on the pseudo graph, so ``--method fedgl`` runs with
``policies/strict-dp.toml``; :func:`~fedgl_secure.methods.privacy_checks.check_runnable` refuses it only
under DP-SGD, which trains on the fused graph whose degree nothing bounds. The non-DP reference
also runs full ``fedgl`` (``--reference-method``) so the table can be compared with the issue's
target "within 3 points of non-DP FedGL".

    FEDGL_DATA=/work/shared/datasets python benchmarks/privacy_utility.py --dataset cora \
        --output docs/results/privacy_utility_cora.json --seeds 3 --rounds 30
    FEDGL_DATA=/work/shared/datasets python benchmarks/privacy_utility.py --dataset cora \
        --policy policies/strict-dp-sgd.toml --output docs/results/privacy_utility_cora_dpsgd.json

Units of privacy (``--units edge,label``, issue 10): for each unit, ε and method (``--methods
fedgl,fgcl``) the policy is the unit's shipped template (``policies/strict-edge-dp.toml``,
``policies/label-dp.toml``) with its one-off ε set; ε = inf is the run without DP (shared by the
units). ``--units mlp`` adds the features-only baseline (the GCN on a graph without edges,
centralised: what a model learns with no graph at all). Each run records accuracy, the MIA AUC on
the final W̄, the attack floor (the same attack on the untrained initial W₀ of the same seed, which saw no data:
:func:`~fedgl_secure.audit.attack_section.membership_floor`) and, when the final broadcast carries a pseudo
graph, the link-inference AUC (:func:`~fedgl_secure.audit.attacks.link_inference_auc` against the real merged
graph). ``--units gap`` is
the node unit by GAP (``policies/node-dp-gap.toml`` with the budget's ε, ``--method gap``; ε = inf: GAP's
pipeline without noise); ``--units centroids`` the node unit by one release of noisy class sums
(``policies/node-dp-centroids.toml``, ``--method centroids``); every row's MIA attacks the method's own global
model (:func:`~fedgl_secure.audit.attacks.global_model_membership`). ``--label-options
key=value,...`` replaces keys of the label template's ``[dp.labels]`` (e.g. ``stages=3``; with ``mechanism=``
only the template's ε and correction are kept), to compare label releases (docs/privacy.md §6.10).
``--seeded-release`` (measurement only: it protects nothing) draws every DP release from a byte source seeded by
the run's seed instead of the OS CSPRNG, so runs that differ only in how they train (e.g. ``correction=gce``
against ``correction=none``) train on the same released labels; each run records a digest of the labels the
banks train on (``release_digest``) to show it.

    FEDGL_DATA=/work/shared/datasets python benchmarks/privacy_utility.py --dataset cora --units edge,label \
        --methods fedgl,fgcl --epsilons 0.5,1,2,4,8,inf --seeds 1 --rounds 20 \
        --output docs/results/privacy_units_cora.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedgl_secure.audit.attack_section import membership_floor
from fedgl_secure.audit.attacks import global_model_membership, link_inference_auc, true_edge_index
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import build_config
from fedgl_secure.policy.dp import DATA_KINDS
from fedgl_secure.policy.schema import Policy, load_policy, policy_from_dict
from fedgl_secure.privacy.dp_round import FederationPrivacy
from fedgl_secure.privacy.guarantees import effective_guarantees
from fedgl_secure.simulation.experiment import Federation, resolve_device, run_experiment

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 only
    import tomli as tomllib

POLICIES = Path(__file__).resolve().parents[1] / "policies"
STRICT = POLICIES / "strict-dp.toml"
BASELINE = POLICIES / "baseline.toml"


def parse_epsilons(text: str) -> list[float]:
    values = []
    for part in text.split(","):
        part = part.strip().lower()
        value = math.inf if part in ("inf", "infinity", "∞") else float(part)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"ε must be positive, got {part}")
        values.append(value)
    return values


def template_multipliers(policy: Policy) -> dict[str, float]:
    """The noise multiplier of every enabled channel of the (validated) template (upload kinds and ``sgd``)."""
    multipliers = {
        kind: float(channel.noise_multiplier)
        for kind in DATA_KINDS
        if (channel := policy.dp.upload_channel(kind)) is not None
    }
    if policy.dp.sgd_enabled:
        multipliers["sgd"] = float(policy.dp.sgd.noise_multiplier)
    return multipliers


def dp_policy(template: dict, multipliers: dict[str, float], scale: float, epsilon: float, rounds: int, source: str):
    """The template with every enabled channel's noise multiplier times ``scale`` and the budget (ε, rounds)."""
    values = json.loads(json.dumps(template))  # deep copy
    for name, multiplier in multipliers.items():
        values["dp"][name]["noise_multiplier"] = multiplier * float(scale)
    values["budget"]["epsilon"] = float(epsilon)
    values["budget"]["rounds"] = int(rounds)
    values["description"] = f"{source} structure, multipliers × {scale:.6g}, ε ≤ {epsilon:g} over {rounds} rounds"
    return policy_from_dict(values, source=f"{source} (× {scale:.6g})")


def calibrate(
    template: dict, multipliers: dict[str, float], epsilon: float, rounds: int, source: str, rel_tol: float = 1e-4
) -> tuple[float, object]:
    """Smallest scale t (to ``rel_tol``) whose effective guarantee over ``rounds`` rounds is ε ≤ ``epsilon``.

    ε decreases monotonically in t, so bisect on log t. Returns t and its Guarantees (ε accounted).
    """

    def accounted(scale: float) -> float:
        return effective_guarantees(dp_policy(template, multipliers, scale, epsilon, rounds, source)).epsilon

    low, high = 0.01, 0.1
    while accounted(high) > epsilon:  # grow until it fits
        low, high = high, high * 2
        if high > 1e6:
            raise RuntimeError(f"no scale below 1e6 reaches ε = {epsilon}")
    while accounted(low) <= epsilon:  # shrink until it does not
        high, low = low, low / 2
    while high / low - 1 > rel_tol:
        middle = math.sqrt(low * high)
        if accounted(middle) <= epsilon:
            high = middle
        else:
            low = middle
    guarantees = effective_guarantees(dp_policy(template, multipliers, high, epsilon, rounds, source))
    assert guarantees.epsilon <= epsilon and guarantees.budget_met and guarantees.rounds_within_budget == rounds
    return high, guarantees


def seeded_release_bytes(seed: int):
    """``--seeded-release``: a byte source seeded by the run's seed, for ``FederationPrivacy(random_bytes=...)``.

    Measurement only: noise from a known seed protects nothing. It makes two runs of one seed draw the same release,
    so what differs between them is how they train on it."""
    return np.random.default_rng([0x5EED, seed]).bytes


class DigestingPrivacy(FederationPrivacy):
    """A :class:`FederationPrivacy` that keeps a digest of every bank's labels as released (``release_digest``):
    runs with the same digest trained on the same released labels."""

    release_digest: str | None = None

    def private_graphs(self, graphs, adjacencies, summation) -> list:
        private = super().private_graphs(graphs, adjacencies, summation)
        digest = hashlib.sha256()
        for graph in private:
            digest.update(graph.labels.cpu().numpy().astype(np.int64).tobytes())
        self.release_digest = digest.hexdigest()[:16]
        return private


def run_one(
    config_values: dict, policy, dataset, privacy: FederationPrivacy | None = None, clients: list | None = None
) -> dict:
    """One run: accuracy and the ranking metrics (ROC-AUC, PR-AUC: the bank-like benchmark's) at the best
    validation round, MIA on the final broadcast W̄ (and link AUC on its pseudo graph, if any). ``clients``
    (instead of ``dataset``): the banks' own graphs (``--consortium``)."""
    config = build_config(config_values)
    broadcasts = []
    if privacy is None:
        privacy = FederationPrivacy(policy) if policy is not None else None
    result = run_experiment(
        config, dataset, progress=False, observer=broadcasts.append, privacy=privacy, clients=clients
    )
    ranking = {key: result.global_test_metrics.get(key) for key in ("roc_auc", "pr_auc")}
    # a baseline (centralized, local) has no broadcast to attack
    if not broadcasts:
        return {
            "seed": config.seed,
            "accuracy": result.global_test_accuracy,
            "val_accuracy": result.best_val_accuracy,
            "best_round": result.best_round,
            **ranking,
            "mia_auc": None,
            "link_auc": None,
            "wall_seconds": round(result.wall_seconds, 2),
        }
    final = broadcasts[-1]
    device = resolve_device(config.device)
    federation = (  # the attacks' merged graph
        Federation.from_clients(clients, config, device)
        if clients is not None
        else Federation.build(dataset, config, device)
    )
    # the run's own config (a policy sets GAP's and the class sums' ε there), the method's own model
    run_config = build_config(result.config)
    mia = global_model_membership(
        run_config, final.weights, federation.merged, round_number=final.round_number, seed=config.seed
    )
    floor = membership_floor(run_config, federation.merged, config.seed)  # the same nodes, the untrained W₀
    link = None
    if final.pseudo_graph is not None:
        merged = federation.merged
        link = link_inference_auc(
            final.pseudo_graph,
            true_edge_index(merged),
            merged.num_nodes,
            config.seed,
            embeddings=final.fused_predictions,
        )
    spent = None
    if privacy is not None and privacy.active:
        budget = policy.budget
        spent = max(ledger.epsilon(budget.delta, budget.accountant) for ledger in privacy.ledgers().values())
    return {
        "seed": config.seed,
        "accuracy": result.global_test_accuracy,
        "val_accuracy": result.best_val_accuracy,
        "best_round": result.best_round,
        **ranking,
        "rounds_run": result.rounds_run,
        "stopped_reason": result.stopped_reason,
        "mia_auc": mia.auc,
        "mia_auc_stderr": mia.auc_stderr,
        "mia_attack": mia.attack,
        "mia_floor_auc": floor.auc,
        "mia_members": mia.members,
        "link_auc": None if link is None else link.auc,
        "link_attack": None if link is None else link.attack,
        "epsilon_spent_max_bank": spent,
        "release_digest": getattr(privacy, "release_digest", None),
        "wall_seconds": round(result.wall_seconds, 2),
    }


def summarise(runs: list[dict]) -> dict:
    def mean(key):
        return statistics.fmean(r[key] for r in runs)

    def std(key):
        return statistics.stdev(r[key] for r in runs) if len(runs) > 1 else 0.0

    n = len(runs)
    # standard error of the seed-mean AUC: within-seed Hanley–McNeil errors, averaged (seeds share a test set)
    stderr = math.sqrt(sum(r["mia_auc_stderr"] ** 2 for r in runs)) / n
    return {
        "accuracy_mean": mean("accuracy"),
        "accuracy_std": std("accuracy"),
        "mia_auc_mean": mean("mia_auc"),
        "mia_auc_std": std("mia_auc"),
        "mia_auc_stderr": statistics.fmean(r["mia_auc_stderr"] for r in runs),
        "mia_auc_mean_stderr": stderr,
        "seeds": [r["seed"] for r in runs],
        "runs": runs,
    }


UNIT_TEMPLATES = {
    "edge": POLICIES / "strict-edge-dp.toml",
    "label": POLICIES / "label-dp.toml",
    "gap": POLICIES / "node-dp-gap.toml",  # the node unit by GAP (method gap); its noise is calibrated to ε
    # the node unit by one release of noisy class sums (method centroids); its noise is calibrated to ε
    "centroids": POLICIES / "node-dp-centroids.toml",
}
IN_METHOD_UNITS = ("gap", "centroids")  # units whose mechanism is a method of its own


def parse_options(text: str) -> dict:
    """``key=value,...`` → a dict; integer values become ints (``stages=3``), the others stay strings."""
    options = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, separator, value = item.partition("=")
        if not separator:
            raise argparse.ArgumentTypeError(f"{item!r}: expected key=value")
        options[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return options


def unit_policy(
    unit: str,
    epsilon: float,
    label_options: dict | None = None,
    centroids_noise: str | None = None,
    edge_options: dict | None = None,
):
    """The unit's shipped template with its one-off ε (and the budget) set to ``epsilon``; for the label unit,
    ``label_options`` replace keys of its ``[dp.labels]`` (``--label-options``); for the edge unit, ``edge_options``
    keys of its ``[dp.edges]`` (``--edge-options``); for the class sums, ``centroids_noise`` replaces
    ``[dp.centroids] noise`` (``--centroids-noise``)."""
    path = UNIT_TEMPLATES[unit]
    values = tomllib.loads(path.read_text(encoding="utf-8"))
    if unit not in IN_METHOD_UNITS:
        values["dp"]["edges" if unit == "edge" else "labels"]["epsilon"] = float(epsilon)
    if unit == "centroids" and centroids_noise:
        values["dp"].setdefault("centroids", {})["noise"] = centroids_noise
    if unit == "edge" and edge_options:
        values["dp"]["edges"] = {**values["dp"]["edges"], **edge_options}
    if unit == "label" and label_options:
        labels = values["dp"]["labels"]
        if "mechanism" in label_options:  # another mechanism: the template's own mechanism options do not apply
            labels = {key: labels[key] for key in ("epsilon", "correction") if key in labels}
        values["dp"]["labels"] = {**labels, **label_options}
    values["budget"]["epsilon"] = float(epsilon)
    return policy_from_dict(values, source=f"{path.name} (ε = {epsilon:g})")


def features_only(dataset):
    """The dataset without its edges: a GCN on it is an MLP on the features (Â = I)."""
    import dataclasses

    return dataclasses.replace(dataset, edge_index=np.zeros((2, 0), dtype=np.int64))


def consortium_banks(path: Path) -> tuple[dict, list]:
    """``--consortium``: the consortium file's ``[experiment]`` (as config values) and its banks' own graphs, read
    as each bank node reads them; a demo consortium's synthetic tables (``[generate]``, the bank-like benchmark)
    are written first if missing."""
    from fedgl_secure.consortium.config import load_consortium
    from fedgl_secure.services.orchestrate import consortium_bank_graphs, ensure_generated_bank_data

    ensure_generated_bank_data(load_consortium(path), echo=lambda line: print(line, file=sys.stderr))
    consortium, banks = consortium_bank_graphs(path)
    return consortium.experiment_config().model_dump(mode="json"), [bank.graph for bank in banks]


def run_units(args) -> int:
    """Accuracy / MIA / link AUC per unit, ε, method and seed (module doc); JSON rewritten after every run.
    With ``--consortium`` the runs train on the consortium's banks' own graphs under its ``[experiment]``
    (``--rounds`` / ``--patience`` still apply) and each row adds the test ROC-AUC and PR-AUC."""
    experiment, bank_graphs = consortium_banks(args.consortium) if args.consortium else ({}, None)
    datasets = (
        {}
        if bank_graphs
        else {seed: load_dataset(args.dataset, args.data_root, seed=seed) for seed in range(args.seeds)}
    )
    started = time.perf_counter()
    rows: list[dict] = []

    def config_values(method: str, seed: int) -> dict:
        federation = {"max_rounds": args.rounds, "patience": args.patience or args.rounds}
        if bank_graphs:  # the consortium's own experiment, with this row's method, seed and rounds
            return {
                **experiment,
                "method": method,
                "seed": seed,
                "device": args.device,
                "federation": {**experiment.get("federation", {}), **federation},
            }
        return {
            "dataset": args.dataset,
            "method": method,
            "seed": seed,
            "data_root": args.data_root,
            "device": args.device,
            "federation": federation,
        }

    def data_of(seed: int, without_edges: bool = False) -> tuple:
        """(dataset, clients) of one seed's run; ``without_edges``: the features-only baseline's."""
        strip = features_only if without_edges else (lambda graph: graph)
        if bank_graphs:
            return None, [strip(graph) for graph in bank_graphs]
        return strip(datasets[seed]), None

    def write(complete: bool) -> None:
        output = {
            "dataset": str(args.consortium) if args.consortium else args.dataset,
            "rounds": args.rounds,
            "patience": args.patience or args.rounds,
            "seeds": args.seeds,
            "seeded_release": args.seeded_release,
            "accuracy": "global test accuracy at the best validation round (merged client graph, clean)",
            "mia": "membership_inference_auc on the final W̄; link: link_inference_auc on the final pseudo graph",
            "torch_threads": torch.get_num_threads(),
            "complete": complete,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "command": "python benchmarks/privacy_utility.py " + " ".join(sys.argv[1:]),
            "results": rows,
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(output, indent=2) + "\n", encoding="utf-8")

    def record(unit: str, epsilon: float, method: str, policy, without_edges: bool = False) -> None:
        runs = []
        for seed in range(args.seeds):
            random_bytes = seeded_release_bytes(seed) if args.seeded_release else None
            privacy = DigestingPrivacy(policy, random_bytes=random_bytes) if policy is not None else None
            dataset, clients = data_of(seed, without_edges)
            run = run_one(config_values(method, seed), policy, dataset, privacy=privacy, clients=clients)
            runs.append(run)
            print(
                f"  {unit} ε = {epsilon:g} {method} seed {seed}: acc {run['accuracy']:.4f} "
                f"ROC-AUC {run['roc_auc']} val {run['val_accuracy']:.4f} MIA {run['mia_auc']} "
                f"link {run['link_auc']} release {run.get('release_digest')} ({run['wall_seconds']:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        accuracies = [r["accuracy"] for r in runs]
        links = [r["link_auc"] for r in runs if r["link_auc"] is not None]
        rows.append(
            {
                "unit": unit,
                "epsilon": "inf" if math.isinf(epsilon) else epsilon,
                "method": method,
                "accuracy_mean": statistics.fmean(accuracies),
                "accuracy_std": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
                "val_accuracy_mean": statistics.fmean(r["val_accuracy"] for r in runs),
                **({"roc_auc_mean": statistics.fmean(r["roc_auc"] for r in runs)} if bank_graphs else {}),
                **({"pr_auc_mean": statistics.fmean(r["pr_auc"] for r in runs)} if bank_graphs else {}),
                **({"label_options": args.label_options} if unit == "label" and args.label_options else {}),
                **({"edge_options": args.edge_options} if unit == "edge" and args.edge_options else {}),
                **({"centroids_noise": args.centroids_noise} if unit == "centroids" and args.centroids_noise else {}),
                "mia_auc_mean": statistics.fmean(r["mia_auc"] for r in runs) if runs[0]["mia_auc"] else None,
                "mia_floor_auc_mean": statistics.fmean(r["mia_floor_auc"] for r in runs)
                if runs[0]["mia_auc"]
                else None,
                "link_auc_mean": statistics.fmean(links) if links else None,
                "runs": runs,
            }
        )
        write(complete=False)

    for unit in args.units:
        if unit == "mlp":
            record("mlp", math.inf, "centralized", None, without_edges=True)
            continue
        for epsilon in args.epsilons:
            for method in [unit] if unit in IN_METHOD_UNITS else args.methods:  # GAP, centroids: own methods
                if math.isinf(epsilon):
                    if any(r["epsilon"] == "inf" and r["method"] == method for r in rows):
                        continue  # no DP: the same run for every unit
                    record("none", epsilon, method, None)
                else:
                    policy = unit_policy(unit, epsilon, args.label_options, args.centroids_noise, args.edge_options)
                    record(unit, epsilon, method, policy)
    write(complete=True)
    print(json.dumps({"output": str(args.output), "wall_seconds": round(time.perf_counter() - started, 1)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..n-1")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per run; ε is composed over this many")
    parser.add_argument(
        "--patience",
        type=int,
        default=None,
        help="early stopping after this many rounds without validation gain (default: --rounds, i.e. none); "
        "DESIGN §3's protocol is --rounds 300 --patience 30",
    )
    parser.add_argument("--epsilons", type=parse_epsilons, default=parse_epsilons("1,2,4,8,inf"))
    parser.add_argument("--method", default="fedgl-no-gpg")
    parser.add_argument(
        "--reference-method",
        default="fedgl",
        help="non-DP reference method (plain FedGL with the pseudo graph); 'none' to skip",
    )
    parser.add_argument(
        "--policy", type=Path, default=STRICT, help="template policy whose structure every DP row keeps"
    )
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--units",
        default=None,
        help="edge,label,gap,centroids,mlp: the units-of-privacy table (module doc; gap, centroids: node unit)",
    )
    parser.add_argument("--methods", default="fedgl,fgcl", help="methods of the units table")
    parser.add_argument(
        "--consortium",
        type=Path,
        default=None,
        help="units table only: train on this consortium file's banks' own tables under its [experiment] instead "
        "of --dataset, and add test ROC-AUC / PR-AUC (the bank-like benchmark: services/consortium.toml, whose "
        "synthetic tables are generated on first use)",
    )
    parser.add_argument(
        "--label-options",
        type=parse_options,
        default={},
        help="key=value,... replacing [dp.labels] keys of the label unit's policy, e.g. stages=3; with mechanism=... "
        "only the template's epsilon and correction are kept (mechanism=randomized-response: plain RR)",
    )
    parser.add_argument(
        "--edge-options",
        type=parse_options,
        default={},
        help="key=value,... replacing [dp.edges] keys of the edge unit's policy, e.g. weighting=feature-posterior",
    )
    parser.add_argument(
        "--seeded-release",
        action="store_true",
        help="MEASUREMENT ONLY, protects nothing: draw each run's DP release from a byte source seeded by the run's "
        "seed instead of the OS CSPRNG, so runs that differ only in training (e.g. --label-options correction=gce) "
        "train on the same released labels (units table)",
    )
    parser.add_argument(
        "--centroids-noise",
        choices=("central", "local"),
        default=None,
        help="[dp.centroids] noise of the class-sums unit (default: the shipped policy's, central)",
    )
    args = parser.parse_args(argv)
    if args.units is not None:
        args.units = [u.strip() for u in args.units.split(",") if u.strip()]
        unknown = [u for u in args.units if u not in (*UNIT_TEMPLATES, "mlp")]
        if unknown:
            parser.error(f"--units: unknown {unknown}; choose from {[*UNIT_TEMPLATES, 'mlp']}")
        args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        return run_units(args)
    if args.consortium is not None:
        parser.error("--consortium: only with --units")

    template_policy = load_policy(args.policy)  # validated, defaults filled, errors naming the file's fields
    if not template_policy.has_dp:
        parser.error(f"--policy {args.policy}: the template has no DP channel to scale")
    template = tomllib.loads(args.policy.read_text(encoding="utf-8"))  # the structure each derived policy keeps
    multipliers = template_multipliers(template_policy)
    source = args.policy.name
    budget = template_policy.budget
    local_epochs = template_policy.dp.sgd.local_epochs if template_policy.dp.sgd_enabled else None
    datasets = {seed: load_dataset(args.dataset, args.data_root, seed=seed) for seed in range(args.seeds)}

    def config_values(method: str, seed: int) -> dict:
        return {
            "dataset": args.dataset,
            "method": method,
            "seed": seed,
            "data_root": args.data_root,
            "device": args.device,
            "federation": {"max_rounds": args.rounds, "patience": args.patience or args.rounds},
            **({"training": {"local_epochs": local_epochs}} if local_epochs else {}),
        }

    started = time.perf_counter()
    rows: list[dict] = []
    reference = None

    def write(complete: bool) -> None:
        """The JSON so far: rewritten after every row, so an interrupted run keeps what it measured."""
        output = {
            "dataset": args.dataset,
            "method": args.method,
            "rounds": args.rounds,
            "patience": args.patience or args.rounds,
            "delta": budget.delta,
            "accountant": budget.accountant,
            "policy_template": f"policies/{source} (clip, max_degree, quorum, noise placement, channels)",
            "local_epochs": local_epochs,
            "summation": "plaintext + DP step (same sums and accounting as the secure path)",
            "accuracy": "global test accuracy at the best validation round",
            "mia": "membership_inference_auc on the final global model W̄, merged client graph; "
            "max over loss/entropy/modified-entropy",
            "torch_threads": torch.get_num_threads(),
            "complete": complete,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "command": "python benchmarks/privacy_utility.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "results": rows,
            "non_dp_reference": reference,
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(output, indent=2) + "\n", encoding="utf-8")

    for epsilon in args.epsilons:
        if math.isinf(epsilon):
            policy, z, accounted, guarantees = load_policy(BASELINE), None, math.inf, None
        else:
            t0 = time.perf_counter()
            scale, guarantees = calibrate(template, multipliers, epsilon, args.rounds, source)
            policy = dp_policy(template, multipliers, scale, epsilon, args.rounds, source)
            accounted = guarantees.epsilon
            z = {name: m * scale for name, m in multipliers.items()}
            print(
                f"ε = {epsilon:g}: multipliers {z} (ε accounted {accounted:.4f}, {time.perf_counter() - t0:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        runs = []
        for seed in range(args.seeds):
            run = run_one(config_values(args.method, seed), policy, datasets[seed])
            runs.append(run)
            print(
                f"  ε = {epsilon:g} seed {seed}: acc {run['accuracy']:.4f} MIA {run['mia_auc']:.4f} "
                f"({run['wall_seconds']:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        row = {
            "epsilon_target": "inf" if math.isinf(epsilon) else epsilon,
            "policy": "baseline.toml (HE only, no DP)" if z is None else f"{source} structure",
            "noise_multipliers": z,
            "epsilon_accounted": "inf" if math.isinf(accounted) else accounted,
        }
        if guarantees is not None:
            row["channels"] = {
                c.channel: {
                    "sensitivity": c.sensitivity,
                    "noise_std_in_sum": c.noise_std,
                    "accounted_noise_multiplier": c.accounted_noise_multiplier,
                    "epsilon_total": c.epsilon_total,
                }
                for c in guarantees.channels
            }
        row.update(summarise(runs))
        rows.append(row)
        write(complete=False)

    if args.reference_method != "none":
        runs = []
        for seed in range(args.seeds):
            run = run_one(config_values(args.reference_method, seed), None, datasets[seed])
            runs.append(run)
            print(
                f"  reference {args.reference_method} seed {seed}: acc {run['accuracy']:.4f} "
                f"MIA {run['mia_auc']:.4f} ({run['wall_seconds']:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
        reference = {"method": args.reference_method, "privacy": "none (plain sums)", **summarise(runs)}

    write(complete=True)
    print(json.dumps({"output": str(args.output), "wall_seconds": round(time.perf_counter() - started, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
