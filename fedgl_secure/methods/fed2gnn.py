"""Fed²GNN: each bank rebuilds its customers' cross-bank neighbourhoods as rooted trees, then FedAvg.

Before round 1 (a one-off set-up exchange, :func:`reconstruct_clients`):

1. every bank projects its (row-normalised) features with a public random matrix R and appends a count
   channel: ``S_0 = [X̄ R, 1]``;
2. the banks run the K level exchanges of ``fed2gnn_exchange.py`` under pairwise masks: for each
   boundary node i the active bank receives ``E_k(i)``, the level-k sum of i's rooted tree over the
   walks that leave the bank on their first step (its count channel counts them);
3. the η correction (``rooted_tree.eta_correction``) removes the walks that step straight back to i:
   ``E_2(i) − d_ext(i) S_0(i)``; the count channel then gives the size of each level exactly (the
   paper's neighbour-count predictor ϕ_d is not needed: the count travels in the sum);
4. the bank trains a set decoder ϕ per level on its *own* graph — input: a node's local level sum (mean
   and log count), target: at most d sampled nodes of that level, loss: mean squared error under the
   best (Hungarian, ``scipy.optimize.linear_sum_assignment``) matching of generated to true nodes;
5. it decodes each received ``E_k(i)`` into ``min(count, d)`` nodes and grafts the tree onto i: level-1
   nodes as i's neighbours, level-2 nodes dealt round robin under them; with ``edge_correction`` the GCN runs
   on Appendix A's weights (``rooted_tree.grafted_propagation``): the bank's nodes keep their true degrees, a
   decoded node stands for its share of the level's count, with the mean degree the counts give.
   ``reconstruction = "mean"`` (not the paper's) grafts one node per level instead, the level's mean row
   standing for the whole level.

The GNN is then trained by FedAvg on the augmented graphs (generated nodes carry no label), and
evaluated on them. ``fedavg-full`` is the same FedAvg on each bank's true K-hop neighbourhood (the
upper target), ``federated`` on the Louvain clients the lower one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn
from tqdm.auto import tqdm

from fedgl_secure.data.graph import GraphDataset, canonical_edge_index, induced_subgraph
from fedgl_secure.data.partition import louvain_clients, partition_owner
from fedgl_secure.engine.config import ExperimentConfig, Fed2GNNConfig
from fedgl_secure.errors import ConfigError
from fedgl_secure.log import get_logger
from fedgl_secure.methods.fed2gnn_exchange import ExchangeBank, ExchangeResult, exchange_level_sums
from fedgl_secure.methods.fedavg import FedAvg
from fedgl_secure.methods.rooted_tree import eta_correction, grafted_propagation, nonbacktracking_sums
from fedgl_secure.model.adjacency import row_normalize_features
from fedgl_secure.model.eager_adam import EagerAdam
from fedgl_secure.seeding import numpy_stream, torch_stream

GENERATED_ID_STRIDE = 10_000_000  # generated node ids: n + client · stride + t (never a real row number)
# A decoded row keeps its largest entries only: the MSE decoder spreads small positive mass over every
# feature, and dense rows made each epoch's sparse X·W0 an order of magnitude dearer than the real rows
# (Cora's have 18 non-zeros on average).
DECODED_NONZEROS = 32
# A regressed level mean stands for a dozen rows and is denser (the mean of 4 Cora rows has ~70 non-zeros).
MEAN_NONZEROS = 256


class Fed2GNN(FedAvg):
    """FedAvg on the reconstructed graphs (the reconstruction runs before round 1: :func:`prepare_clients`)."""

    name = "fed2gnn"


class FedAvgFull(FedAvg):
    """FedAvg with every bank seeing its nodes' true neighbourhoods (no information loss): K hops, or the
    backbone's receptive field where it is deeper (``training.receptive_field``, e.g. DAGNN's K = 5)."""

    name = "fedavg-full"


def prepare_clients(config: ExperimentConfig, dataset: GraphDataset, clients: list[GraphDataset]) -> list[GraphDataset]:
    """The clients a method trains on: reconstructed (``fed2gnn``), expanded (``fedavg-full``), else as given."""
    if config.method not in (Fed2GNN.name, FedAvgFull.name):
        return clients
    if config.federation.partition != "louvain":
        raise ConfigError(
            f"invalid configuration: federation.partition: method {config.method!r} needs disjoint clients "
            "(partition = 'louvain'); sampled clients overlap"
        )
    node_sets = [np.asarray(c.node_ids, dtype=np.int64) for c in clients]
    if config.method == "fedavg-full":
        # no information loss for the model trained: the halo covers the backbone's receptive field (DAGNN's K)
        hops = max(config.fed2gnn.hops, config.training.receptive_field)
        return full_neighbourhood_clients(dataset, node_sets, hops)
    return reconstruct_clients(dataset, node_sets, config)[0]


def check_services(config: ExperimentConfig, bank_sources: bool) -> None:
    """Refuse, with a clear error, what the consortium services cannot run of these methods.

    ``fed2gnn`` runs there (its set-up exchange goes bank to bank through the aggregator as a relay,
    ``methods/fed2gnn_relay.py``) on benchmark slices of a Louvain partition; banks reading their own tables
    (``bank_sources``) are refused: those tables do not say at which bank a transfer's counterpart is.
    ``fedavg-full`` is an oracle (each bank would read other banks' customers) and stays simulation-only."""
    where = "runs only in the in-process simulation (fedgl-secure simulate / reproduce fed2gnn)"
    if config.method == "fedavg-full":
        raise ConfigError(
            f"invalid configuration: method: 'fedavg-full' {where}: it gives each bank other banks' customers"
        )
    if config.method != "fed2gnn":
        return
    if bank_sources:
        raise ConfigError(
            f"invalid configuration: method: 'fed2gnn' with banks' own tables {where}; the consortium runs it on "
            "benchmark slices (a bank's tables do not name the counterpart bank of an inter-bank transfer yet)"
        )
    if config.federation.partition != "louvain":
        raise ConfigError(
            "invalid configuration: federation.partition: method 'fed2gnn' needs disjoint banks (partition = "
            "'louvain', num_clients = the number of banks)"
        )
    if not config.fed2gnn.secure:
        raise ConfigError(
            "invalid configuration: fed2gnn.secure: the consortium always masks the bank-to-bank exchange; "
            "secure = false (plain sums) exists only in the simulation"
        )


@dataclass(frozen=True)
class BankReconstruction:
    """One bank's part of the set-up in the consortium services (benchmark slices: client ``bank.index`` of the
    seeded Louvain partition, as the simulation makes it): its share of the exchange and what its decoder reads."""

    dataset: GraphDataset
    bank: ExchangeBank
    features: np.ndarray

    def local_graph(self) -> GraphDataset:
        """The bank's own graph before the set-up (its Louvain client, as ``louvain_clients`` makes it)."""
        return induced_subgraph(self.dataset, self.bank.nodes, name=f"{self.dataset.name}/client-{self.bank.index}")

    def augment(self, boundary: np.ndarray, received: list[np.ndarray], config: ExperimentConfig) -> GraphDataset:
        """The bank's graph with its trees grafted on, from the sums the exchange gave it (steps 3-5)."""
        return augment_bank(self.dataset, self.bank, boundary, received, self.features, config)


def bank_reconstruction(config: ExperimentConfig, dataset: GraphDataset, client_index: int) -> BankReconstruction:
    """Bank ``client_index``'s :class:`BankReconstruction` (the clients of ``Federation.build``, in its order)."""
    federation = config.federation
    clients = louvain_clients(
        dataset, federation.num_clients, config.seed, federation.louvain_balance, federation.louvain_delta
    )
    banks, features = exchange_banks(dataset, [np.asarray(c.node_ids, dtype=np.int64) for c in clients], config)
    return BankReconstruction(dataset, banks[client_index], features)


def full_neighbourhood_clients(dataset: GraphDataset, node_sets: list[np.ndarray], hops: int) -> list[GraphDataset]:
    """Each client's nodes plus every node within ``hops`` hops (features and edges as they are), with the
    split masks of the added nodes cleared: FedAvg-Full's clients."""
    adjacency = dataset.adjacency().tocsr()
    clients = []
    for k, nodes in enumerate(node_sets):
        reach = np.zeros(dataset.num_nodes, dtype=bool)
        reach[nodes] = True
        frontier = reach.copy()
        for _ in range(hops):
            frontier = (adjacency @ frontier.astype(np.float32)) > 0
            reach |= frontier
        expanded = induced_subgraph(dataset, np.flatnonzero(reach), name=f"{dataset.name}/client-{k}-full")
        own = np.isin(expanded.node_ids, nodes)
        clients.append(
            GraphDataset(
                name=expanded.name,
                features=expanded.features,
                labels=expanded.labels,
                edge_index=expanded.edge_index,
                train_mask=expanded.train_mask & own,
                val_mask=expanded.val_mask & own,
                test_mask=expanded.test_mask & own,
                num_classes=expanded.num_classes,
                node_ids=expanded.node_ids,
            )
        )
    return clients


def projection_matrix(num_features: int, dim: int, seed: int) -> np.ndarray:
    """The public projection R (``F x dim``, Gaussian / √dim, from the seed's "fed2gnn" stream); identity for 0."""
    if dim == 0:
        return np.eye(num_features)
    return numpy_stream(seed, "fed2gnn", "projection").standard_normal((num_features, dim)) / np.sqrt(dim)


def node_signals(features: np.ndarray, projection: np.ndarray) -> np.ndarray:
    """``S_0 = [X̄ R, 1]``: the projected features and the count channel."""
    return np.hstack([features @ projection, np.ones((features.shape[0], 1))])


def decoder_input(level_sums: np.ndarray) -> torch.Tensor:
    """What ϕ reads from a level sum: the mean of the projected part and log(1 + count)."""
    count = np.maximum(level_sums[:, -1:], 0.0)
    mean = level_sums[:, :-1] / np.maximum(count, 1.0)
    return torch.as_tensor(np.hstack([mean, np.log1p(count)]), dtype=torch.float32)


class SetDecoder(nn.Module):
    """ϕ: a level sum → d generated feature vectors (an MLP; the first ``min(count, d)`` slots are used)."""

    def __init__(self, in_dim: int, hidden: int, slots: int, out_dim: int) -> None:
        super().__init__()
        self.slots, self.out_dim = slots, out_dim
        self.body = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, slots * out_dim),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.body(inputs).view(-1, self.slots, self.out_dim)


def best_matching(cost: np.ndarray) -> np.ndarray:
    """For each row b of ``cost`` (B x s x s), the column matched to each generated slot under the cheapest
    one-to-one matching: ``scipy.optimize.linear_sum_assignment``'s optimum. For s ≤ 5 every permutation is
    scored at once (at most 120, vectorised over the batch, the same optimum without a Python loop per node);
    beyond, Hungarian row by row."""
    batch, size = cost.shape[0], cost.shape[1]
    if size > 5:
        # imported here: scipy.optimize is a tenth of a bank node's start-up imports, for this branch only
        from scipy.optimize import linear_sum_assignment

        return np.stack([linear_sum_assignment(c)[1] for c in cost]) if batch else np.zeros((0, size), np.int64)
    permutations = np.asarray(list(itertools.permutations(range(size))), dtype=np.int64)  # (P, s)
    totals = cost[:, np.arange(size)[None, :], permutations].sum(axis=2)  # (B, P)
    return permutations[np.argmin(totals, axis=1)]


def matched_loss(generated: torch.Tensor, targets: torch.Tensor, sizes: np.ndarray) -> torch.Tensor:
    """Eqs. 5-8 in matched form: mean squared error between generated and true sets after the best one-to-one
    matching (Hungarian) of the first ``sizes[b]`` slots of row b with its ``sizes[b]`` targets."""
    cost = torch.cdist(generated, targets).pow(2).detach().cpu().numpy()  # (B, d, d)
    batch_parts, slot_parts, target_parts = [], [], []
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        columns = best_matching(cost[rows][:, :size, :size])
        batch_parts.append(np.repeat(rows, size))
        slot_parts.append(np.tile(np.arange(size), rows.size))
        target_parts.append(columns.ravel())
    b_idx = torch.as_tensor(np.concatenate(batch_parts))
    r_idx, c_idx = torch.as_tensor(np.concatenate(slot_parts)), torch.as_tensor(np.concatenate(target_parts))
    return (generated[b_idx, r_idx] - targets[b_idx, c_idx]).pow(2).sum(dim=1).mean()


def sparsify(rows: torch.Tensor, keep: int) -> torch.Tensor:
    """``rows`` (…, F) with all but the ``keep`` largest entries of each row set to zero."""
    if keep >= rows.shape[-1]:
        return rows
    values, indices = rows.topk(keep, dim=-1)
    return torch.zeros_like(rows).scatter_(-1, indices, values)


def level_targets(
    adjacency: sp.csr_matrix, level: int, max_degree: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Nodes of the local graph with a non-empty level ``level`` (1 or 2) and, for each, at most d sampled nodes
    of that level of its tree without backtracking (level 2: the off-diagonal of A², with multiplicity)."""
    walks = adjacency if level == 1 else (adjacency @ adjacency).tocsr()
    if level == 2:
        walks.setdiag(0)
        walks.eliminate_zeros()
    roots, samples = [], []
    for u in range(walks.shape[0]):
        ends = walks.indices[walks.indptr[u] : walks.indptr[u + 1]]
        if ends.size == 0:
            continue
        weights = walks.data[walks.indptr[u] : walks.indptr[u + 1]].astype(np.int64)
        multiset = np.repeat(ends, weights)
        take = min(max_degree, multiset.size)
        roots.append(u)
        samples.append(rng.choice(multiset, size=take, replace=False))
    return np.asarray(roots, dtype=np.int64), samples


def train_decoder(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    sizes: np.ndarray,
    config: Fed2GNNConfig,
    generator: torch.Generator,
) -> SetDecoder:
    """ϕ trained full batch with Adam on the matched loss (the bank's own graph only): row b of ``targets``
    (B x slots x F) holds ``sizes[b]`` true nodes."""
    slots, out_dim = targets.shape[1], targets.shape[2]
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))  # nn.Linear's init
    decoder = SetDecoder(inputs.shape[1], config.decoder_hidden, slots, out_dim)
    optimizer = EagerAdam(decoder.parameters(), lr=config.decoder_learning_rate)
    for _ in range(config.decoder_epochs):
        optimizer.zero_grad(set_to_none=True)
        loss = matched_loss(decoder(inputs), targets, sizes)
        loss.backward()
        optimizer.step()
    decoder.eval()
    return decoder


def sampled_targets(features: torch.Tensor, samples: list[np.ndarray], slots: int) -> tuple[torch.Tensor, np.ndarray]:
    """The decoder's targets: row b holds the features of ``samples[b]`` (zero-padded to ``slots``), and the sizes."""
    targets = torch.zeros(len(samples), slots, features.shape[1])
    for b, sample in enumerate(samples):
        targets[b, : sample.size] = features[torch.as_tensor(sample)]
    return targets, np.asarray([s.size for s in samples])


@dataclass(frozen=True)
class LevelDecoding:
    """What a bank decodes its received level sums with: its share of the exchange, its own (normalised) feature
    rows, the level sums of its own trees (``local_sums[k]`` = B_k of its local graph), the settings and its
    seeded streams."""

    bank: ExchangeBank
    own_features: torch.Tensor
    local_sums: list[np.ndarray]
    settings: Fed2GNNConfig
    rng: np.random.Generator
    generator: torch.Generator


def decode_sets(level: int, sums: np.ndarray, counts: np.ndarray, ctx: LevelDecoding) -> list[np.ndarray]:
    """``reconstruction = "decoder"`` (the paper): ϕ trained on the bank's own level-``level`` trees decodes each
    received sum into ``min(count, d)`` feature rows."""
    settings = ctx.settings
    roots, samples = level_targets(ctx.bank.adjacency, level, settings.max_degree, ctx.rng)
    shown = np.minimum(counts, settings.max_degree).astype(np.int64)
    if roots.size == 0:  # nothing to learn from: this level stays empty
        return [np.zeros((0, ctx.own_features.shape[1]), np.float32) for _ in shown]
    targets, sizes = sampled_targets(ctx.own_features, samples, settings.max_degree)
    decoder = train_decoder(decoder_input(ctx.local_sums[level][roots]), targets, sizes, settings, ctx.generator)
    with torch.no_grad():
        decoded = sparsify(decoder(decoder_input(sums)).clamp_min(0.0), DECODED_NONZEROS).numpy()
    return [decoded[b, : shown[b]] for b in range(shown.shape[0])]


def decode_means(level: int, sums: np.ndarray, counts: np.ndarray, ctx: LevelDecoding) -> list[np.ndarray]:
    """``reconstruction = "mean"`` (a deviation from the paper): one row per non-empty level, the mean feature row
    of the level's nodes. Without projection (p = 0) the received sum holds the features, so the mean is exact;
    with R it is regressed (a one-slot ϕ, mean squared error) from the projected mean on the bank's own trees."""
    if ctx.settings.projection_dim == 0:
        means = sums[:, :-1] / np.maximum(counts, 1.0)[:, None]
    else:
        own = ctx.own_features.numpy().astype(np.float64)
        local = nonbacktracking_sums(ctx.bank.adjacency, np.hstack([own, np.ones((own.shape[0], 1))]), level)[level]
        roots = np.flatnonzero(local[:, -1] > 0)
        if roots.size == 0:
            return [np.zeros((0, own.shape[1]), np.float32) for _ in counts]
        targets = torch.as_tensor(local[roots, :-1] / local[roots, -1:], dtype=torch.float32)[:, None, :]
        sizes = np.ones(roots.size, np.int64)
        decoder = train_decoder(
            decoder_input(ctx.local_sums[level][roots]), targets, sizes, ctx.settings, ctx.generator
        )
        with torch.no_grad():
            means = sparsify(decoder(decoder_input(sums))[:, 0].clamp_min(0.0), MEAN_NONZEROS).numpy()
    return [
        means[b : b + 1].astype(np.float32) if counts[b] > 0 else means[b:b].astype(np.float32)
        for b in range(counts.shape[0])
    ]


def reconstruct_clients(
    dataset: GraphDataset, node_sets: list[np.ndarray], config: ExperimentConfig, progress: bool = False
) -> tuple[list[GraphDataset], ExchangeResult]:
    """Every bank's graph with its boundary nodes' rooted trees grafted on (the module's steps 1-5)."""
    banks, features = exchange_banks(dataset, node_sets, config)
    nonce = numpy_stream(config.seed, "fed2gnn", "nonce").bytes(16)
    exchange = exchange_level_sums(banks, config.fed2gnn.hops, config.fed2gnn.secure, nonce)
    log = get_logger(dataset=dataset.name, method="fed2gnn")
    log.info("fed2gnn.exchanged", bytes_per_bank=exchange.bytes_sent, boundary=[b.size for b in exchange.boundaries])
    clients = []
    for bank in tqdm(banks, desc="fed2gnn: rooted trees", unit="bank", disable=not progress, leave=False):
        k = bank.index
        clients.append(augment_bank(dataset, bank, exchange.boundaries[k], exchange.sums[k], features, config))
    return clients, exchange


def exchange_banks(
    dataset: GraphDataset, node_sets: list[np.ndarray], config: ExperimentConfig
) -> tuple[list[ExchangeBank], np.ndarray]:
    """Each client's share of the exchange (step 1: its nodes, local graph, S_0 and inter-bank edges) and the
    (normalised, dense) features the decoders learn from."""
    settings = config.fed2gnn
    if settings.hops > 2:
        raise ConfigError("invalid configuration: fed2gnn.hops: trees deeper than 2 levels are not implemented")
    owner = partition_owner(dataset.num_nodes, node_sets)
    normalised = row_normalize_features(dataset.features) if config.training.normalize_features else dataset.features
    features = np.asarray(normalised.todense(), dtype=np.float32)
    projection = projection_matrix(dataset.num_features, settings.projection_dim, config.seed)
    adjacency = dataset.adjacency().tocsr()
    src, dst = dataset.edge_index
    banks = []
    for k, nodes in enumerate(node_sets):
        outgoing = (owner[src] == k) & (owner[dst] != k)
        banks.append(
            ExchangeBank(
                index=k,
                nodes=nodes,
                adjacency=adjacency[nodes][:, nodes].tocsr(),
                signals=node_signals(features[nodes], projection),
                cross=np.stack([src[outgoing], dst[outgoing]]),
                foreign_owner=owner[dst[outgoing]],
            )
        )
    return banks, features


def signal_width(config: ExperimentConfig, num_features: int) -> int:
    """p + 1: the width of S_k (the projected features and the count channel; F + 1 without projection)."""
    dim = config.fed2gnn.projection_dim
    return (dim if dim > 0 else num_features) + 1


def augment_bank(
    dataset: GraphDataset,
    bank: ExchangeBank,
    boundary: np.ndarray,
    received: list[np.ndarray],
    features: np.ndarray,
    config: ExperimentConfig,
) -> GraphDataset:
    """One bank's steps 3-5: η-correct its received sums ``received[k − 1]`` = E_k over ``boundary``, train ϕ per
    level on its own graph, graft the trees."""
    settings = config.fed2gnn
    k = bank.index
    local = induced_subgraph(dataset, bank.nodes, name=f"{dataset.name}/client-{k}")
    own_features = torch.as_tensor(features[bank.nodes])
    rows = bank.local_rows(boundary)
    d_ext = received[0][:, -1]
    level_sums = [received[0]]
    if settings.hops >= 2:  # η_2: the walks i → j → i, one per foreign neighbour j
        level_sums.append(received[1] - eta_correction(d_ext, bank.signals[rows], 2))
    local_sums = nonbacktracking_sums(bank.adjacency, bank.signals, settings.hops)
    counts = [np.rint(np.maximum(sums[:, -1], 0.0)) for sums in level_sums]  # exact level sizes (count channel)
    ctx = LevelDecoding(
        bank,
        own_features,
        local_sums,
        settings,
        numpy_stream(config.seed, "fed2gnn", "decoder", k),
        torch_stream(config.seed, "fed2gnn", "decoder", k),
    )
    decode = decode_means if settings.reconstruction == "mean" else decode_sets
    # per level: the decoded feature rows of each boundary node
    generated = [
        decode(level, sums, count, ctx)
        for level, (sums, count) in enumerate(zip(level_sums, counts, strict=True), start=1)
    ]
    true_degree = None
    if settings.edge_correction:  # the bank knows its own nodes' inter-bank edges, so their true degrees
        cross = np.bincount(bank.local_rows(bank.cross[0]), minlength=bank.nodes.size)
        true_degree = np.asarray(bank.adjacency.sum(axis=1)).ravel() + cross
    return _graft(local, rows, generated, counts, dataset.num_nodes + k * GENERATED_ID_STRIDE, true_degree)


def tree_weights(
    generated: list[list[np.ndarray]], counts: list[np.ndarray], default_degree: float
) -> tuple[np.ndarray, np.ndarray]:
    """For the grafted nodes in ``_graft``'s order: how many graph nodes each stands for, and their degree.

    Root i has ``c_1`` foreign neighbours and ``c_2`` non-backtracking level-2 nodes (the count channel): each of
    its n_1 level-1 nodes stands for ``c_1/n_1`` of them, of degree ``1 + c_2/c_1`` (their mean degree: the edge
    to i and their level-2 nodes); a level-2 node dealt to a child with k of them stands for ``(c_2/c_1)/k``
    nodes, of the same degree (its own is not sent). With K = 1 the degree is ``default_degree``."""
    multiplicity, degree = [], []
    for b, children in enumerate(generated[0]):
        n1 = children.shape[0]
        if n1 == 0:
            continue
        c1 = counts[0][b]
        below = counts[1][b] / c1 if len(counts) > 1 else default_degree - 1.0
        multiplicity.append(np.full(n1, c1 / n1))
        degree.append(np.full(n1, 1.0 + below))
        if len(generated) > 1:
            n2 = generated[1][b].shape[0]
            under = np.arange(n2) % n1
            per_child = np.bincount(under, minlength=n1)
            multiplicity.append(below / per_child[under])
            degree.append(np.full(n2, 1.0 + below))
    if not multiplicity:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(multiplicity), np.concatenate(degree)


def _graft(
    local: GraphDataset,
    roots: np.ndarray,
    generated: list[list[np.ndarray]],
    counts: list[np.ndarray],
    first_id: int,
    true_degree: np.ndarray | None,
) -> GraphDataset:
    """``local`` plus, for each root, its decoded level-1 nodes as neighbours and level-2 nodes under them (dealt
    round robin: the sum does not say how they split among the children). With ``true_degree`` (the local
    nodes' degrees in the whole graph) the GCN runs on Appendix A's weights (:func:`tree_weights`,
    ``rooted_tree.grafted_propagation``); without, on the plain edges."""
    n = local.num_nodes
    rows_added: list[np.ndarray] = []
    parents: list[np.ndarray] = []
    next_index = n
    for b, root in enumerate(roots):
        children = generated[0][b]
        child_ids = np.arange(next_index, next_index + children.shape[0])
        next_index += children.shape[0]
        rows_added.append(children)
        parents.append(np.full(child_ids.size, root))
        if len(generated) > 1 and child_ids.size:
            grandchildren = generated[1][b]
            next_index += grandchildren.shape[0]
            rows_added.append(grandchildren)
            parents.append(child_ids[np.arange(grandchildren.shape[0]) % child_ids.size])
    added = next_index - n
    parent = np.concatenate(parents) if parents else np.zeros(0, np.int64)
    extra = sp.csr_matrix(np.vstack(rows_added)) if added else sp.csr_matrix((0, local.num_features))
    total = n + added
    new_ids = n + np.arange(added)
    edge_index = canonical_edge_index(
        np.concatenate([local.edge_index[0], parent]), np.concatenate([local.edge_index[1], new_ids]), total
    )
    propagation = None
    if true_degree is not None:
        multiplicity, degree = tree_weights(generated, counts, float(true_degree.mean()) if n else 1.0)
        propagation = grafted_propagation(local.adjacency(), true_degree, parent, multiplicity, degree)
    no = np.zeros(added, dtype=bool)
    return GraphDataset(
        name=f"{local.name}-fed2gnn",
        features=sp.vstack([local.features, extra.astype(np.float32)]).tocsr(),
        labels=np.concatenate([local.labels, np.full(added, -1, dtype=np.int64)]),
        edge_index=edge_index,
        train_mask=np.concatenate([local.train_mask, no]),
        val_mask=np.concatenate([local.val_mask, no]),
        test_mask=np.concatenate([local.test_mask, no]),
        num_classes=local.num_classes,
        node_ids=np.concatenate([local.node_ids, first_id + np.arange(added, dtype=np.int64)]),
        propagation=propagation,
    )
