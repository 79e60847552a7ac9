"""In-process simulation of a federation: the round loop and the run record (the baselines: ``baselines.py``).

The loop is method-agnostic (see ``methods/base.py``) and takes the summation step as a
parameter, so a secure backend can replace the plaintext sum without touching anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from fedgl_secure.data.global_index import GlobalIndex, merge_client_graphs
from fedgl_secure.data.graph import GraphDataset
from fedgl_secure.data.partition import louvain_clients
from fedgl_secure.data.sampling import make_clients, select_participants
from fedgl_secure.engine.aggregation import (
    PlaintextSummation,
    StreamingSummation,
    Summation,
    client_weight,
)
from fedgl_secure.engine.client import LocalTrainer
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.evaluation import (
    EarlyStopping,
    SplitAccuracy,
    evaluate_model,
    ratio,
    selection_value,
)
from fedgl_secure.engine.graph_tensors import GraphTensors
from fedgl_secure.engine.metrics import RankingMetrics
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.engine.round_pipeline import (
    method_initial_parameters,
    protect_contributions,
    run_stages,
)
from fedgl_secure.errors import ConfigError
from fedgl_secure.log import get_logger
from fedgl_secure.method_registry import load, method_spec
from fedgl_secure.methods import build_method, check_method_privacy, in_method_mechanism, prepare_clients
from fedgl_secure.methods.base import (
    Broadcast,
    method_model,
    method_stages,
)
from fedgl_secure.seeding import numpy_stream
from fedgl_secure.simulation.executors import (
    BankExecutor,
    ExecutorSettings,
    InProcessExecutor,
    check_executor,
    local_trainers,
    training_graphs,
)

if TYPE_CHECKING:
    from fedgl_secure.privacy.dp_round import FederationPrivacy


def resolve_device(name: str) -> torch.device:
    """'auto' → CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass(frozen=True)
class Federation:
    """The simulated institutions of one run, their union index and the merged graph."""

    clients: list[GraphDataset]
    index: GlobalIndex
    merged: GraphTensors
    client_graphs: list[GraphTensors]

    @classmethod
    def build(cls, dataset: GraphDataset, config: ExperimentConfig, device: torch.device) -> Federation:
        """Benchmark slices: client k samples ``proportions[k]`` of ``dataset`` (DESIGN §4)."""
        federation = config.federation
        if federation.partition == "louvain":  # disjoint clients; cross-client edges known by id only
            clients = louvain_clients(
                dataset, federation.num_clients, config.seed, federation.louvain_balance, federation.louvain_delta
            )
        else:
            clients = make_clients(dataset, federation.proportions, config.seed, federation.overlap)
        clients = prepare_clients(config, dataset, clients)  # a method's one-off set-up (Fed²GNN's trees)
        return cls.from_clients(clients, config, device)

    @classmethod
    def from_clients(cls, clients: list[GraphDataset], config: ExperimentConfig, device: torch.device) -> Federation:
        """Institutions that bring their own graphs (e.g. banks' own customer tables); the union index
        is built from their ``node_ids`` (shared customer keys)."""
        index = GlobalIndex.from_id_sets([c.node_ids for c in clients])
        normalize = config.training.normalize_features
        merged = GraphTensors.from_graph(
            merge_client_graphs(clients, index), np.arange(index.size), index.size, device, normalize
        )
        client_graphs = [
            GraphTensors.from_graph(c, index.positions(c.node_ids), index.size, device, normalize) for c in clients
        ]
        return cls(clients, index, merged, client_graphs)


@dataclass
class RoundRecord:
    round: int
    participants: list[int]
    val_accuracy: float
    test_accuracy: float
    seconds: float
    pseudo_labels: int | None = None
    pseudo_label_accuracy: float | None = None
    pseudo_graph_edges: int | None = None
    pseudo_graph_homophily: float | None = None
    # ranking metrics for imbalanced labels on the global test set (engine/metrics.py); None: not computed
    test_roc_auc: float | None = None
    test_pr_auc: float | None = None
    test_recall_at_top: float | None = None
    val_pr_auc: float | None = None  # what evaluation.selection = "pr_auc" picks the best round by

    def set_ranking(self, ranking: RankingMetrics) -> None:
        """Record the round's test ROC-AUC, PR-AUC and recall at the top."""
        self.test_roc_auc, self.test_pr_auc = ranking.roc_auc, ranking.pr_auc
        self.test_recall_at_top = ranking.recall_at_top


def round_record(round_number: int, participants: list[int], scores: SplitAccuracy, seconds: float) -> RoundRecord:
    record = RoundRecord(round_number, participants, scores.val, scores.test, seconds)
    record.set_ranking(scores.test_ranking)
    record.val_pr_auc = scores.val_ranking.pr_auc
    return record


@dataclass
class RunResult:
    dataset: str
    method: str
    seed: int
    rounds_run: int
    best_round: int
    best_val_accuracy: float
    global_test_accuracy: float
    local_test_accuracy: list[float]
    wall_seconds: float
    num_clients: int
    num_global_nodes: int
    # ROC-AUC, PR-AUC, recall at the top (RankingMetrics.to_dict) at the best validation round: global test set,
    # and each client's own test nodes
    global_test_metrics: dict = field(default_factory=dict)
    local_test_metrics: list[dict] = field(default_factory=list)
    history: list[RoundRecord] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    stopped_reason: str | None = None  # set when a run ends early for privacy (too few banks within budget)

    def to_dict(self) -> dict:
        return asdict(self)


def pseudo_label_accuracy(pseudo_labels: torch.Tensor, labels: torch.Tensor) -> tuple[int, float]:
    """How many nodes got a pseudo label and how many of those (with a true label) are right."""
    labelled = (pseudo_labels >= 0) & (labels.cpu() >= 0)
    count = int((pseudo_labels >= 0).sum())
    return count, ratio(int((pseudo_labels[labelled] == labels.cpu()[labelled]).sum()), int(labelled.sum()))


def pseudo_graph_homophily(pseudo_graph: PseudoGraph, labels: torch.Tensor) -> tuple[int, float]:
    """Edges of the pseudo graph and the share of them joining two nodes of the same class."""
    labels = labels.cpu()
    rows = torch.arange(pseudo_graph.num_nodes)[:, None].expand_as(pseudo_graph.neighbors)
    keep = (pseudo_graph.weights > 0) & (labels[rows] >= 0) & (labels[pseudo_graph.neighbors] >= 0)
    same = labels[rows][keep] == labels[pseudo_graph.neighbors][keep]
    return int((pseudo_graph.weights > 0).sum()), ratio(int(same.sum()), int(keep.sum()))


def run_experiment(
    config: ExperimentConfig,
    dataset: GraphDataset | None = None,
    progress: bool = True,
    summation: Summation | None = None,
    observer: Callable[[Broadcast], None] | None = None,
    privacy: FederationPrivacy | None = None,
    clients: list[GraphDataset] | None = None,
    executor: ExecutorSettings | None = None,
) -> RunResult:
    """Run one simulated experiment (any of the six methods) and return its record.

    ``clients`` (instead of ``dataset``): the institutions' own graphs, e.g. banks' customer tables
    (:func:`fedgl_secure.data.sources.bank_graph.load_bank_data`); no slicing happens then.
    ``observer`` sees every federated round's broadcast (W̄, pseudo labels, pseudo graph) — how
    a consortium run is compared with the simulation, weight for weight. ``privacy`` (federated
    methods only) passes every bank's contribution through its DP step
    (:mod:`fedgl_secure.privacy.dp_round`); banks whose budget is spent drop out, and the run stops
    with ``stopped_reason`` once fewer than the policy's quorum remain. ``executor``: where the banks' local work
    runs (:mod:`fedgl_secure.simulation.executors`; default: in this process); the record is the same.
    """
    started = time.perf_counter()
    executor = executor or ExecutorSettings()
    spec = method_spec(config.method)  # the method's name never changes below, only its settings
    if privacy is not None and not privacy.active and executor.kind == "ray":
        # an HE-only policy: beyond encryption, which each bank's actor does, a bank applies nothing of its own
        privacy = None
    driver_encrypts = summation is not None and not isinstance(summation, (PlaintextSummation, StreamingSummation))
    check_executor(executor, baseline=spec.baseline, privacy=privacy is not None, driver_encrypts=driver_encrypts)
    # a node mechanism inside its method (GAP, centroids): the engine's DP step is off, only ledgers are kept
    in_method = in_method_mechanism(privacy.policy) if privacy is not None else None
    method_privacy = None
    if in_method is not None:
        config, method_privacy, privacy = in_method.apply_policy(config, privacy.policy), privacy, None
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)  # nothing should draw from it; pinned in case a library does
    if clients is not None:
        federation = Federation.from_clients(clients, config, device)
    else:
        if dataset is None:
            from fedgl_secure.data.registry import load_dataset

            dataset = load_dataset(config.dataset, config.data_root, seed=config.seed, split=config.data)
        federation = Federation.build(dataset, config, device)
    config.evaluation.check_classes(federation.merged.num_classes)
    if in_method is not None:
        weights = [client_weight(graph.num_nodes) for graph in federation.client_graphs]
        record = method_privacy.in_method_ledgers(len(weights), max(weights), *in_method.releases(config))
        observer = record if observer is None else _both(observer, record)
        # a mechanism whose noise the key authority adds (the class sums' central noise): the plaintext sum gets it
        # here, a secure summation from its own key authority
        summation = method_privacy.with_central_noise(summation or PlaintextSummation())
    check_method_privacy(config, method_privacy.policy if method_privacy is not None else None)
    log = get_logger(dataset=config.dataset, method=config.method, seed=config.seed)
    log.info("federation.built", clients=len(federation.clients), global_nodes=federation.index.size)
    if privacy is not None and spec.baseline:
        raise ConfigError(
            f"method {config.method!r} is a baseline that releases nothing; a privacy policy does not apply"
        )
    if spec.baseline:  # a runner of simulation/baselines.py, named by the registry
        result = load(spec.implementation)(config, federation, progress)
    else:
        result = _run_federated(
            config, federation, progress, summation or PlaintextSummation(), observer, privacy, executor
        )
    result.wall_seconds = time.perf_counter() - started
    result.config = config.model_dump(mode="json")
    log.info("run.finished", best_round=result.best_round, test=result.global_test_accuracy)
    return result


def _both(first: Callable[[Broadcast], None], second: Callable[[Broadcast], None]) -> Callable[[Broadcast], None]:
    """An observer that calls ``first`` then ``second``."""

    def observe(broadcast: Broadcast) -> None:
        first(broadcast)
        second(broadcast)

    return observe


def new_result(config: ExperimentConfig, federation: Federation) -> RunResult:
    return RunResult(
        dataset=config.dataset,
        method=config.method,
        seed=config.seed,
        rounds_run=0,
        best_round=0,
        best_val_accuracy=float("nan"),
        global_test_accuracy=float("nan"),
        local_test_accuracy=[],
        wall_seconds=0.0,
        num_clients=len(federation.clients),
        num_global_nodes=federation.index.size,
    )


def round_bar(config: ExperimentConfig, progress: bool) -> tqdm:
    return tqdm(
        range(1, config.federation.max_rounds + 1),
        desc=f"{config.dataset}/{config.method}/seed{config.seed}",
        unit="round",
        disable=not progress,
        leave=False,
    )


def keep_if_best(
    result: RunResult, stopper: EarlyStopping, round_number: int, scores: SplitAccuracy, config: ExperimentConfig
) -> bool:
    """Tell early stopping this round's selection value; on a new best round, record its validation and test
    accuracy and test metrics in ``result`` and say so."""
    if not stopper.update(round_number, selection_value(scores, config.evaluation.selection)):
        return False
    result.best_round, result.best_val_accuracy, result.global_test_accuracy = round_number, scores.val, scores.test
    result.global_test_metrics = scores.test_ranking.to_dict()
    return True


def record_local_goal(result: RunResult, local: list[SplitAccuracy]) -> None:
    """Each client's test accuracy and ranking metrics on its own graph, evaluated once, at the best round."""
    result.local_test_accuracy = [s.test for s in local]
    result.local_test_metrics = [s.test_ranking.to_dict() for s in local]


def _run_federated(
    config: ExperimentConfig,
    federation: Federation,
    progress: bool,
    summation: Summation,
    observer: Callable[[Broadcast], None] | None = None,
    privacy: FederationPrivacy | None = None,
    executor: ExecutorSettings | None = None,
) -> RunResult:
    method = build_method(config)
    merged = federation.merged
    client_graphs = federation.client_graphs
    if privacy is not None:
        client_graphs = _private_client_graphs(config, federation, privacy, summation)
        summation = privacy.with_central_noise(summation)
    if config.self_training.per_class > 0 and privacy is not None:
        # the labelling model reads every label and feature outside any accountant
        raise ConfigError("self_training.per_class: self-training is not accounted under a privacy policy")
    trainers: list[LocalTrainer] = []
    if executor is not None and executor.kind == "ray":  # the banks' side on Ray actors (no privacy there)
        from fedgl_secure.simulation.ray_executor import RayExecutor

        evaluator = _evaluator(config, method, merged)
        positions = [graph.positions for graph in client_graphs]
        banks: BankExecutor = RayExecutor(
            config, federation.clients, positions, federation.index.size, merged.num_classes, executor
        )
    else:
        ids = list(range(len(client_graphs)))
        trainers = local_trainers(config, method, training_graphs(config, client_graphs, ids, merged.num_classes), ids)
        evaluator = _evaluator(config, method, merged)  # after the trainers, as it always was
        banks = InProcessExecutor(method, trainers, federation.client_graphs, evaluator, config)
    if privacy is not None:
        for k, trainer in enumerate(trainers):
            privacy.attach_training(k, trainer)
    try:
        return _rounds(config, federation, method, banks, trainers, evaluator, progress, summation, observer, privacy)
    finally:
        banks.close()


def _evaluator(config: ExperimentConfig, method, merged: GraphTensors):
    """The global model's evaluator in this process: the method's model, without dropout."""
    num_features = merged.features.shape[1]
    return method_model(method, num_features, config.training.hidden, merged.num_classes, 0.0).to(merged.device)


def _rounds(
    config: ExperimentConfig,
    federation: Federation,
    method,
    banks: BankExecutor,
    trainers: list[LocalTrainer],
    evaluator,
    progress: bool,
    summation: Summation,
    observer: Callable[[Broadcast], None] | None,
    privacy: FederationPrivacy | None,
) -> RunResult:
    """The federated rounds, early stopping, and the local goal at the best round; ``trainers``: the banks' trainers
    of an in-process run, which the DP step reads (empty on Ray, where a policy is refused)."""
    merged = federation.merged
    num_features = merged.features.shape[1]
    staged = len(method_stages(method)) > 1  # under DP refused by check_runnable (privacy_checks.check_stages)
    broadcast = Broadcast(0, method_initial_parameters(method, config, num_features, merged.num_classes))
    stopper = EarlyStopping(config.federation.patience)
    result = new_result(config, federation)
    # the public w_max (aggregation.normalise_contribution), unless the method fixes its own scale (the class sums,
    # whose central noise is calibrated on the sums themselves)
    weight_normaliser = method.weight_normaliser or max(
        client_weight(graph.num_nodes) for graph in federation.client_graphs
    )
    best: Broadcast | None = None
    bar = round_bar(config, progress)
    for round_number in bar:
        round_started = time.perf_counter()
        participants = select_participants(banks.num_banks, config.federation.participation, config.seed, round_number)
        if privacy is None or staged:  # uploads are ŵ_k·X_k with the public w_max, as a bank's (so does the DP step)
            broadcast = run_stages(
                method, banks.contribute, participants, broadcast, round_number, summation, weight_normaliser
            )
        else:
            # a bank whose budget is spent refuses every later round: it does not train either; under DP,
            # P_k and H_k are computed once, with the public W̄, by protect_contributions
            contributions = {
                k: method.client_contribution(trainers[k], broadcast, with_node_terms=not privacy.recomputes_node_terms)
                for k in participants
                if privacy.banks[k].stopped_round is None
            }
            contributions = protect_contributions(privacy, method, trainers, broadcast, round_number, contributions)
            if len(contributions) < privacy.policy.quorum:
                result.stopped_reason = (
                    f"round {round_number}: only {len(contributions)} of {len(participants)} banks could contribute "
                    f"within their privacy budget, fewer than the quorum {privacy.policy.quorum}"
                )
                get_logger(dataset=config.dataset, method=config.method).warning(
                    "run.stopped", reason=result.stopped_reason
                )
                break
            participants = sorted(contributions)
            broadcast = method.server_update(
                summation(round_number, contributions, reference=broadcast.weights), round_number
            )
        if observer is not None:
            observer(broadcast)
        evaluator.load_flat_parameters(broadcast.weights)
        scores = evaluate_model(evaluator, merged, method.evaluation_adjacency(merged, broadcast), config.evaluation)
        record = round_record(round_number, participants, scores, time.perf_counter() - round_started)
        if broadcast.pseudo_labels is not None:
            record.pseudo_labels, record.pseudo_label_accuracy = pseudo_label_accuracy(
                broadcast.pseudo_labels, merged.labels
            )
        if broadcast.pseudo_graph is not None:
            record.pseudo_graph_edges, record.pseudo_graph_homophily = pseudo_graph_homophily(
                broadcast.pseudo_graph, merged.labels
            )
        result.history.append(record)
        result.rounds_run = round_number
        if keep_if_best(result, stopper, round_number, scores, config):
            best = broadcast
        bar.set_postfix(val=f"{scores.val:.3f}", test=f"{scores.test:.3f}", best=result.best_round)
        if stopper.should_stop(round_number):
            break
    if best is not None:  # the local goal, once, with the best round's W̄
        record_local_goal(result, banks.local_goal(best))
    return result


def _private_client_graphs(
    config: ExperimentConfig, federation: Federation, privacy: FederationPrivacy, summation: Summation
) -> list[GraphTensors]:
    """Each bank's graph after its one-off DP preparation (edge DP, degree bound, label release); checks the method
    first. A label release with the consortium prior sums the prior's weights on a summation like the run's
    (:func:`_release_summation`)."""
    from fedgl_secure.data.sampling import bank_name
    from fedgl_secure.methods.privacy_checks import check_runnable

    check_runnable(privacy.policy, config)
    graphs = federation.client_graphs
    adjacencies = privacy.setup(
        [bank_name(k) for k in range(len(graphs))],
        [client_weight(graph.num_nodes) for graph in graphs],
        [client.adjacency() for client in federation.clients],
        [numpy_stream(config.seed, "privacy", "degree", k) for k in range(len(graphs))],
        [graph.features.to_scipy for graph in graphs],  # read only by a weighting that needs them
    )
    if not privacy.active:
        return graphs
    return privacy.private_graphs(graphs, adjacencies, lambda: _release_summation(summation))


@contextmanager
def _release_summation(summation: Summation) -> Iterator[Summation]:
    """The summation of a label release before round 1 (``prior = "consortium-sgc"``), closed after it: under
    ``--secure`` a CKKS summation with a key authority of its own — the run's key authority decrypts each (round,
    kind) once and only in rising round order, and the release's rounds come before round 1 — so the aggregator still
    sees sums only; the plaintext summations hold no state and serve both."""
    from fedgl_secure.crypto.secure_summation import SecureSummation

    if not isinstance(summation, SecureSummation):
        yield summation
        return
    release = SecureSummation(
        summation.policy, encrypt_workers=summation.encrypt_workers, banks=len(summation.roster.banks)
    )
    try:
        yield release
    finally:
        release.close()
