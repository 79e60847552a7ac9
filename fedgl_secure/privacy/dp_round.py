"""A bank's differential-privacy step between its contribution and the summation (DESIGN §6).

Each bank holds a :class:`BankPrivacy`: the policy, its own
:class:`~fedgl_secure.privacy.accounting.PrivacyLedger` and the quorum. Every round, before its
contribution reaches the (CKKS) summation, :meth:`BankPrivacy.protect` asks the ledger whether the
round's releases (:func:`~fedgl_secure.privacy.release_schedule.round_releases`) still fit the budget; if
not, the bank stops contributing for the rest of the run (``None``, logged: fail closed). Otherwise
it records exactly those releases — so a run spends what :mod:`~fedgl_secure.privacy.guarantees`
predicts — and returns the clipped, noised contribution. :class:`FederationPrivacy` holds the banks
of one simulated federation, prepares their graphs once (edge DP, degree bound) and provides the
central-noise hook of the summation.

Decisions, and why:

* **Normalised pre-weighting.** Under a DP policy every kind of a bank's upload (weights with its
  last entry w_k, predictions, embeddings, node_weight) is divided by the public normaliser
  ``w_max = max_k w_k`` over the federation's banks (w_k = N_k is public by the policy), so a bank
  pre-weights with ``ŵ_k = w_k / w_max ∈ (0, 1]``. Eq. 10 and Eqs. 12/14 are ratios of such sums, so
  W̄, P̄ and H̄ are unchanged; values stay inside the CKKS sum bound (with w_k = N_k, noise of std
  w_max·σ would not). On this scale bank k's release moves by at most ŵ_k·Δ ≤ Δ (Δ = the unweighted
  sensitivity of :func:`~fedgl_secure.privacy.calibration.upload_sensitivity`), and each bank adds a
  share of std **σ/√q** (σ = noise_multiplier × Δ, q = quorum) — in the original scale that is
  ``w_max·σ/√q``, the scaling the guarantees assume. Any sum of ≥ q shares carries ≥ σ, so the
  multiplier a fellow bank faces is at least z·√((q−1)/q), what
  :func:`~fedgl_secure.privacy.calibration.accounted_noise_multiplier` records. Scaling shares by a
  bank's own w_k instead would leave the heaviest bank under-protected.
* **Weights.** The release is ``ŵ_k·(W̄ + clip_vector(W_k − W̄, C))`` plus the share, and the last
  entry ŵ_k without noise (a bank's size is public).
* **Predictions and embeddings.** Every node row of the *unweighted* P_k / H_k is clipped to C
  (:func:`~fedgl_secure.privacy.secure_noise.clip_rows`), re-weighted by ŵ_k, and the share is added
  to **all M rows**, not only the bank's own: a row held by one bank would otherwise carry a single
  share (σ/√q < σ), breaking the distributed-noise argument, while noise on rows a bank does not
  hold reveals nothing (membership is public through node_weight anyway). P_k and H_k must be
  computed with the *public* global model W̄ (``round_pipeline.public_model_outputs``), the assumption of
  their sensitivity.
* **Central noise.** No bank-side noise; the key authority adds N(0, σ²) (normalised scale) to the
  masked sum s + r of that kind it decrypts (never to the Σ ŵ_k entry), in the services and in the
  secure simulation alike. A plaintext simulation adds it after summing
  (:meth:`FederationPrivacy.with_central_noise`), which is the same sum.
* **Graphs.** Randomised response (edge DP) is applied once to a bank's adjacency before training
  and recorded as a pure release at round 0; with DP on predictions, embeddings or DP-SGD the
  result is then projected to ``dp.graph.max_degree`` (:func:`~fedgl_secure.privacy.graph_sensitivity.bound_degree`).
  P and H are computed on that graph without the pseudo graph (``round_pipeline.public_model_outputs``), so
  FedGL's pseudo graph (β > 0) is allowed with DP on uploads; under DP-SGD, which trains on it, it
  is refused (:func:`~fedgl_secure.methods.privacy_checks.check_method`) rather than silently breaking the
  guarantee.
* **DP-SGD** (``[dp.sgd]``): :meth:`FederationPrivacy.attach_training` gives the bank's trainer a
  :class:`~fedgl_secure.privacy.dp_sgd.NodeDPSGD`, so local training takes noisy, clipped per-node
  gradient steps on the degree-bounded graph; the ledger records them with the round's releases.
  A run that trains more local epochs than ``dp.sgd.local_epochs`` is refused. Weights trained
  this way from the public W̄ are released without a weights channel of their own (post-processing),
  or additionally clipped and noised when ``[dp.weights]`` is also enabled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager

import numpy as np
import scipy.sparse as sp
import torch

from fedgl_secure.errors import PolicyError
from fedgl_secure.log import get_logger
from fedgl_secure.privacy import (
    edge_mechanisms,
    edge_posterior,
    graph_sensitivity,
    label_mechanisms,
    label_release,
    secure_noise,
)
from fedgl_secure.privacy.accounting import EDGES, LABELS, WEIGHTS, PrivacyLedger
from fedgl_secure.privacy.calibration import central_noise, noise_std
from fedgl_secure.privacy.dp_sgd import NodeDPSGD
from fedgl_secure.privacy.label_dp import ForwardCorrectedTraining, RobustLabelTraining, robust_label_loss
from fedgl_secure.privacy.release_schedule import round_releases, setup_releases

__all__ = ["BankPrivacy", "FederationPrivacy", "noise_std"]  # noise_std: re-exported
from fedgl_secure.kinds import NODE_WEIGHT
from fedgl_secure.policy.dp import DATA_KINDS
from fedgl_secure.policy.schema import Policy

RandomBytes = Callable[[int], bytes]


def releases_labels_together(policy: Policy) -> bool:
    """Whether the policy's label release is made by all banks together (``prior = "consortium-sgc"``,
    :mod:`~fedgl_secure.privacy.consortium_prior`) rather than by each bank alone."""
    labels = policy.dp.labels
    return labels.mechanism == "rr-with-prior" and labels.effective_prior == label_release.CONSORTIUM_PRIOR


class BankPrivacy:
    """One bank's DP step: its ledger, the policy and the public normaliser ``w_max``.

    ``random_bytes`` replaces the OS CSPRNG for the noise (tests only: noise from a known source
    protects nothing).
    """

    def __init__(
        self,
        bank: str,
        policy: Policy,
        normaliser: float,
        *,
        random_bytes: RandomBytes | None = None,
        ledger: PrivacyLedger | None = None,
    ) -> None:
        if not (math.isfinite(normaliser) and normaliser > 0):
            raise ValueError(f"normaliser (w_max) must be positive and finite, got {normaliser}")
        self.bank = bank
        self.policy = policy
        self.normaliser = float(normaliser)
        self.ledger = ledger if ledger is not None else PrivacyLedger(bank)
        self.stopped_round: int | None = None  # the first round it refused to contribute to
        # under rr-with-prior: P(released label | true class) per node, for the forward-corrected loss
        self.label_likelihood: np.ndarray | None = None
        self._random_bytes = random_bytes
        self.log = get_logger(role="bank-privacy", bank=bank)

    @property
    def active(self) -> bool:
        """Whether the policy asks for any DP (otherwise :meth:`protect` passes contributions through)."""
        return self.policy.has_dp

    # --- set-up --------------------------------------------------------------------------------

    def prepare_adjacency(
        self,
        adjacency: sp.spmatrix,
        degree_rng: np.random.Generator,
        read_features: Callable[[], sp.spmatrix] | None = None,
    ) -> sp.csr_matrix:
        """The bank's graph as it will train on it: edge DP once (recorded at round 0), then the degree bound,
        then the released edges' weights (post-processing). ``read_features`` gives the bank's node features; it
        is called only by a weighting that reads them (``weighting = "feature-posterior"``), so no other policy
        pays for a copy of them at start-up.

        ``degree_rng`` only orders :func:`~fedgl_secure.privacy.graph_sensitivity.bound_degree`'s greedy pass and draws
        the feature posterior's sample of pairs in a large bank (not privacy noise). Randomised response draws
        from the OS CSPRNG (or the injected test source).
        """
        graph = sp.csr_matrix(adjacency, dtype=np.float64)
        for release in setup_releases(self.policy):
            if release.channel != EDGES:
                continue
            if self.policy.dp.edges.mechanism == "laplace":
                graph = edge_mechanisms.laplace_edge_weights(graph, release.epsilon, _random_bytes=self._random_bytes)
            else:
                graph = edge_mechanisms.randomized_response_edges(
                    graph, release.epsilon, _random_bytes=self._random_bytes
                )
            self.ledger.extend([release])
        if self.policy.dp.needs_degree_bound:
            graph = graph_sensitivity.bound_degree(graph, self.policy.dp.graph.max_degree, degree_rng)
        edges = self.policy.dp.edges
        if edges.mechanism == "randomized-response" and edges.weighting == "posterior":
            # post-processing of the release: one weight from n, the released count and ε (all public)
            weight = edge_mechanisms.randomized_response_posterior(graph.shape[0], graph.nnz // 2, edges.epsilon)
            graph = graph * weight
            self.log.info("privacy.edges_released", edges=graph.nnz // 2, posterior_weight=round(weight, 6))
        elif edges.mechanism == "randomized-response" and edges.weighting == "feature-posterior":
            if read_features is None:
                raise ValueError('dp.edges.weighting = "feature-posterior" needs the bank\'s features')
            # post-processing: a weight per similarity bin of the endpoints' features (outside the edge unit)
            graph = edge_posterior.feature_posterior_weights(graph, read_features(), edges.epsilon, degree_rng)
            self.log.info(
                "privacy.edges_released",
                edges=graph.nnz // 2,
                posterior_weight_mean=round(float(graph.data.mean()), 6) if graph.nnz else 0.0,
                posterior_weight_max=round(float(graph.data.max()), 6) if graph.nnz else 0.0,
            )
        return graph

    def prepare_labels(
        self,
        labels: np.ndarray,
        train_mask: np.ndarray,
        val_mask: np.ndarray,
        num_classes: int,
        adjacency: sp.spmatrix,
        features: sp.spmatrix | np.ndarray | None = None,
    ) -> np.ndarray:
        """The bank's labels as it will use them, released once on its training and validation nodes (recorded at
        round 0): k-ary randomised response, or RRWithPrior in stages with a prior from ``adjacency`` (the bank's
        prepared graph), ``features`` and the labels released in earlier stages
        (:func:`~fedgl_secure.privacy.label_release.multi_stage_release`). Every label is released once with
        ε, whichever mechanism, so one release of ε is recorded. Without label DP the labels are returned unchanged.
        """
        labels = np.asarray(labels, dtype=np.int64)
        settings = self.policy.dp.labels
        train_mask, val_mask = np.asarray(train_mask, dtype=bool), np.asarray(val_mask, dtype=bool)
        for release in setup_releases(self.policy):
            if release.channel != LABELS:
                continue
            if settings.mechanism == "rr-with-prior":
                labels, self.label_likelihood = label_release.multi_stage_release(
                    labels,
                    train_mask,
                    val_mask,
                    adjacency,
                    num_classes,
                    release.epsilon,
                    settings.effective_stages,
                    settings.effective_stage_order,
                    settings.effective_prior,
                    features,
                    settings.effective_prior_temperature,
                    _random_bytes=self._random_bytes,
                )
            else:
                labels = label_mechanisms.randomized_response_labels(
                    labels, release.epsilon, num_classes, train_mask | val_mask, _random_bytes=self._random_bytes
                )
            self.ledger.extend([release])
        return labels

    def accept_label_release(self, release: label_release.LabelRelease) -> np.ndarray:
        """Record a release this bank made together with the others (``prior = "consortium-sgc"``,
        :func:`~fedgl_secure.privacy.consortium_prior.consortium_release`): one release of ε at round 0, exactly
        as :meth:`prepare_labels` records its own; returns the released labels."""
        self.record_label_release()
        return self.restore_label_release(release)

    def record_label_release(self) -> bool:
        """Record this bank's one label release (ε at round 0) unless the ledger already holds it; True when new.
        A bank service records it before the first upload that reads a released label (the consortium prior's)."""
        new = [
            record
            for record in setup_releases(self.policy)
            if record.channel == LABELS and record not in self.ledger.releases
        ]
        self.ledger.extend(new)
        return bool(new)

    def restore_label_release(self, release: label_release.LabelRelease) -> np.ndarray:
        """Take back a release this bank made and recorded in an earlier run (a restarted bank service): nothing is
        drawn or recorded — its ε is already in the ledger; returns the released labels."""
        self.label_likelihood = release.likelihood
        return release.labels

    # --- a round -------------------------------------------------------------------------------

    def release_in_method(
        self, round_number: int, contribution: Mapping[str, torch.Tensor], releases: Sequence
    ) -> dict[str, torch.Tensor] | None:
        """A bank service's upload under a node mechanism inside its method (the class sums): ``releases``, what
        the method releases this round, recorded first — unless the ledger already holds them (a restarted bank
        re-sending a round it paid for) — then the contribution normalised by the public w_max, as it is: its
        noise is the method's own, or the key authority's (central). None once the budget would be exceeded."""
        return self._normalised(contribution) if self.record_releases(round_number, releases) else None

    def record_releases(self, round_number: int, releases: Sequence) -> bool:
        """Record those of ``releases`` the ledger does not hold yet (a restarted bank re-sending a round it paid
        for records nothing new); False once the budget is, or would be, exceeded (:meth:`_spend`)."""
        if self.stopped_round is not None:
            return False
        new = [release for release in releases if release not in self.ledger.releases]
        return self._spend(round_number, new)

    def _normalised(self, contribution: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every kind divided by the public w_max, as every bank's upload is (module doc)."""
        return {kind: tensor / self.normaliser for kind, tensor in contribution.items()}

    def _spend(self, round_number: int, releases: Sequence) -> bool:
        """Record ``releases`` in the ledger, before anything is released; False, and no contribution from
        ``round_number`` on, when they would exceed the budget."""
        budget = self.policy.budget
        if self.ledger.would_exceed(budget.epsilon, budget.delta, releases, budget.accountant):
            self.stopped_round = round_number
            self.log.warning(
                "privacy.budget_exhausted",
                round=round_number,
                spent=self.ledger.epsilon(budget.delta, budget.accountant),
                budget=budget.epsilon,
                action=budget.on_exhausted,
            )
            return False
        self.ledger.extend(releases)
        return True

    def protect(
        self,
        round_number: int,
        contribution: Mapping[str, torch.Tensor],
        reference_weights: torch.Tensor,
        client_weight: float,
    ) -> dict[str, torch.Tensor] | None:
        """The bank's upload for this round after its DP step, or None once its budget is spent.

        ``contribution`` is the method's pre-weighted terms (``cat(w_k·W_k, [w_k])``, ``w_k·P_k`` …),
        ``reference_weights`` the W̄ the bank started from, ``client_weight`` w_k. See the module
        doc for the clipping, the noise scale and the normalisation by ``w_max``.
        """
        if not self.active:  # no DP: normalised by the public w_max only
            return self._normalised(contribution)
        if self.stopped_round is not None:
            return None
        if self.policy.dp.source_only:
            # edge / label unit: everything uploaded is post-processing of the one-off release; normalised only
            return self._normalised(contribution) if self._spend(round_number, []) else None
        kinds_without_dp = [k for k in contribution if k in DATA_KINDS and not self.policy.dp.protects(k)]
        if kinds_without_dp:
            raise PolicyError(f"{self.bank}: {kinds_without_dp} would leave the bank without a DP channel; refusing")
        if not self._spend(round_number, round_releases(self.policy, round_number)):
            return None
        scale = float(client_weight) / self.normaliser
        protected: dict[str, torch.Tensor] = {}
        for kind, tensor in contribution.items():
            values = tensor.detach().to(torch.float64).cpu().numpy()
            if kind == WEIGHTS:
                released = self._weights(values, reference_weights, float(client_weight), scale)
            elif kind in DATA_KINDS:
                released = self._rows(kind, values, float(client_weight), scale)
            elif kind == NODE_WEIGHT:  # public (which nodes the bank holds), only normalised
                released = values / self.normaliser
            else:  # fail closed: a kind no channel covers never leaves in clear under per-round DP
                raise PolicyError(f"{self.bank}: {kind!r} has no DP channel under this policy; refusing to release it")
            protected[kind] = torch.from_numpy(released).to(tensor.dtype)
        return protected

    def _share(self, kind: str, shape: tuple[int, ...]) -> np.ndarray | None:
        channel = self.policy.dp.upload_channel(kind)
        if channel.noise != "distributed":
            return None  # central: added once to the decrypted sum (FederationPrivacy.central_noise)
        return secure_noise.gaussian_share(
            shape, noise_std(self.policy, kind), self.policy.quorum, _random_bytes=self._random_bytes
        )

    def _weights(self, values: np.ndarray, reference: torch.Tensor, weight: float, scale: float) -> np.ndarray:
        channel = self.policy.dp.upload_channel(WEIGHTS)
        reference = reference.detach().to(torch.float64).cpu().numpy().reshape(-1)
        local = values[:-1] / weight
        if local.shape != reference.shape:
            raise ValueError(f"{self.bank}: weights of {local.size} values, W̄ of {reference.size}")
        if channel is None:  # DP-SGD trained them from the public W̄: post-processing, released as they are
            return np.concatenate([scale * local, [scale]])
        update = secure_noise.clip_vector(local - reference, channel.clip)
        released = scale * (reference + update)
        share = self._share(WEIGHTS, released.shape)
        if share is not None:
            released = released + share
        return np.concatenate([released, [scale]])

    def _rows(self, kind: str, values: np.ndarray, weight: float, scale: float) -> np.ndarray:
        channel = self.policy.dp.upload_channel(kind)
        rows = secure_noise.clip_rows(values / weight, channel.clip)  # rows the bank does not hold stay 0
        released = scale * rows
        share = self._share(kind, released.shape)  # on all M rows (module doc)
        if share is not None:
            released = released + share
        return released


class FederationPrivacy:
    """The DP step of every bank in one simulated federation, and the summation's central-noise hook.

    :meth:`setup` must run once, before round 1, with the banks' names, weights and adjacencies.
    """

    def __init__(self, policy: Policy, *, random_bytes: RandomBytes | None = None) -> None:
        self.policy = policy
        self.banks: dict[int, BankPrivacy] = {}
        self._random_bytes = random_bytes

    @property
    def random_bytes(self) -> RandomBytes | None:
        """The byte source that replaces the CSPRNG (tests only), for the draws a bank service makes itself."""
        return self._random_bytes

    @property
    def active(self) -> bool:
        return self.policy.has_dp

    @property
    def changes_graphs(self) -> bool:
        """Whether the one-off preparation changes a bank's graph (edge DP, degree bound); label DP does not."""
        return self.policy.dp.edges.enabled or self.policy.dp.needs_degree_bound

    @property
    def recomputes_node_terms(self) -> bool:
        """Whether P_k and H_k must be computed with the public W̄ (their Gaussian channels' sensitivity assumes
        it). Under a source-only unit (edge, label) they are post-processing and come from the trained model."""
        return self.active and not self.policy.dp.source_only

    def setup(
        self,
        names: Sequence[str],
        client_weights: Sequence[float],
        adjacencies: Sequence[sp.spmatrix],
        degree_rngs: Sequence[np.random.Generator],
        read_features: Sequence[Callable[[], sp.spmatrix]] | None = None,
    ) -> list[sp.csr_matrix]:
        """Create each bank's :class:`BankPrivacy` and return its prepared adjacency (same order); ``read_features``:
        each bank's node features, read only by a weighting that needs them (:meth:`BankPrivacy.prepare_adjacency`)."""
        normaliser = float(max(client_weights))
        readers = [None] * len(names) if read_features is None else read_features
        return [
            self.setup_bank(client_id, name, normaliser, adjacency, rng, read_features=reader)
            for client_id, (name, adjacency, rng, reader) in enumerate(
                zip(names, adjacencies, degree_rngs, readers, strict=True)
            )
        ]

    def setup_bank(
        self,
        client_id: int,
        name: str,
        normaliser: float,
        adjacency: sp.spmatrix,
        degree_rng: np.random.Generator,
        *,
        ledger: PrivacyLedger | None = None,
        prepared: sp.spmatrix | None = None,
        read_features: Callable[[], sp.spmatrix] | None = None,
    ) -> sp.csr_matrix:
        """One bank's part of :meth:`setup` (what a bank service runs for itself): its :class:`BankPrivacy`
        and its prepared adjacency.

        ``ledger`` continues a bank's earlier spending (a restarted bank). ``prepared`` is a graph this
        bank already prepared and paid for in ``ledger``: it is used as is, so a restart neither re-draws
        randomised response nor charges it twice.
        """
        bank = BankPrivacy(name, self.policy, normaliser, random_bytes=self._random_bytes, ledger=ledger)
        self.banks[client_id] = bank
        if prepared is not None:
            return sp.csr_matrix(prepared, dtype=np.float64)
        if not self.active:
            return sp.csr_matrix(adjacency)
        return bank.prepare_adjacency(adjacency, degree_rng, read_features)

    def attach_training(self, client_id: int, trainer) -> None:
        """Give bank ``client_id``'s :class:`~fedgl_secure.engine.client.LocalTrainer` DP-SGD when the policy asks.

        :func:`~fedgl_secure.methods.privacy_checks.check_runnable` has already refused more local steps per round
        than the budget accounts for.
        """
        labels = self.policy.dp.labels
        if labels.enabled and labels.correction == "forward":
            likelihood = self.banks[client_id].label_likelihood
            trainer.private_training = (
                ForwardCorrectedTraining(likelihood)
                if likelihood is not None  # RRWithPrior: each node's own transition
                else ForwardCorrectedTraining.for_randomized_response(
                    label_mechanisms.label_noise_matrix(labels.epsilon, trainer.graph.num_classes),
                    trainer.graph.labels.cpu().numpy(),
                )
            )
        elif labels.enabled and labels.correction != "none":  # a loss robust to the release's wrong labels
            trainer.private_training = RobustLabelTraining(
                robust_label_loss(labels.correction, labels.effective_gce_q, labels.effective_bootstrap_beta)
            )
        sgd = self.policy.dp.sgd
        if not self.policy.dp.sgd_enabled:
            return
        trainer.private_training = NodeDPSGD(
            sgd.max_grad_norm,
            sgd.noise_multiplier,
            self.policy.dp.graph.max_degree,
            random_bytes=self._random_bytes,
        )

    def protect(
        self,
        client_id: int,
        round_number: int,
        contribution: Mapping[str, torch.Tensor],
        reference_weights: torch.Tensor,
        client_weight: float,
    ) -> dict[str, torch.Tensor] | None:
        return self.banks[client_id].protect(round_number, contribution, reference_weights, client_weight)

    def central_noise(self, kind: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """N(0, σ²) for the decrypted sum of ``kind`` when its channel is central, else None.

        For ``weights`` the last entry (Σ ŵ_k, public) gets no noise.
        """
        if not self.active or kind not in self.policy.dp.central_kinds():
            return None
        return central_noise(kind, tuple(shape), noise_std(self.policy, kind), self._random_bytes)

    def with_central_noise(self, summation: Callable) -> Callable:
        """The summation with the policy's central noise: unchanged when it has none to add, or when its own key
        authority adds it (``adds_central_noise``, the secure summation); otherwise wrapped to add it once."""
        if not self.policy.dp.central_kinds():
            return summation
        if getattr(summation, "adds_central_noise", False):
            return summation
        return _CentrallyNoised(summation, self.central_noise)

    def private_graphs(
        self,
        graphs: Sequence,
        adjacencies: Sequence[sp.spmatrix],
        release_summation: Callable[[], AbstractContextManager[Callable]],
    ) -> list:
        """Every bank's :meth:`private_graph`; with the consortium prior the labels are first released by all banks
        together (:func:`~fedgl_secure.privacy.consortium_prior.consortium_release`), the prior's weights summed
        by the summation ``release_summation()`` opens for the release alone (its rounds are numbered from 1), and
        which is opened only then."""
        if not releases_labels_together(self.policy):
            return [
                self.private_graph(k, graph, adjacency)
                for k, (graph, adjacency) in enumerate(zip(graphs, adjacencies, strict=True))
            ]
        from fedgl_secure.privacy import consortium_prior

        settings = self.policy.dp.labels
        banks = [
            consortium_prior.BankLabels(
                graph.labels.cpu().numpy(),
                graph.train_mask.cpu().numpy(),
                graph.val_mask.cpu().numpy(),
                label_release.propagated_features(adjacency, graph.features.to_scipy()),
                self._random_bytes,
            )
            for graph, adjacency in zip(graphs, adjacencies, strict=True)
        ]
        with release_summation() as summation:
            releases = consortium_prior.consortium_release(
                banks,
                graphs[0].num_classes,
                float(settings.epsilon),
                settings.effective_stages,
                settings.effective_stage_order,
                summation,
                self.banks[0].normaliser,
                settings.effective_prior_temperature,
            )
        return [
            self.private_graph(k, graph, adjacency, self.banks[k].accept_label_release(release))
            for k, (graph, adjacency, release) in enumerate(zip(graphs, adjacencies, releases, strict=True))
        ]

    def private_graph(self, client_id: int, graph, adjacency: sp.spmatrix, released: np.ndarray | None = None):
        """Bank ``client_id``'s :class:`~fedgl_secure.engine.graph_tensors.GraphTensors` with its prepared
        adjacency and, under label DP, its randomised training and validation labels (``released`` when the
        banks released them together, :meth:`private_graphs`)."""
        import dataclasses

        from fedgl_secure.model.adjacency import gcn_normalize

        changes = {}
        if self.changes_graphs:  # else keep the graph's own operator (e.g. Fed²GNN's Appendix-A weights)
            changes["base_adjacency"] = gcn_normalize(adjacency)
        if self.policy.dp.labels.enabled and released is None:
            released = self.banks[client_id].prepare_labels(
                graph.labels.cpu().numpy(),
                graph.train_mask.cpu().numpy(),
                graph.val_mask.cpu().numpy(),
                graph.num_classes,
                adjacency,
                graph.features.to_scipy(),
            )
        if released is not None:
            changes["labels"] = torch.as_tensor(released, dtype=torch.int64, device=graph.device)
        return dataclasses.replace(graph, **changes)

    def in_method_ledgers(
        self,
        num_banks: int,
        normaliser: float,
        channels: Sequence[str],
        releases_of_round: Callable[[int], list],
    ) -> Callable:
        """Give each of ``num_banks`` banks a ledger of a method's own ``channels`` (a node mechanism that runs
        inside its method: GAP, the class sums), and return the observer that records
        ``releases_of_round(round)`` after each broadcast for every bank — selected or not, so no ledger
        under-reports."""
        from fedgl_secure.data.sampling import bank_name

        for k in range(num_banks):
            name = bank_name(k)
            ledger = PrivacyLedger(name, channels=tuple(channels))
            self.banks[k] = BankPrivacy(name, self.policy, normaliser, ledger=ledger)

        def record(broadcast) -> None:
            releases = releases_of_round(broadcast.round_number)
            for bank in self.banks.values():
                bank.ledger.extend(releases)

        return record

    def ledgers(self) -> dict[str, PrivacyLedger]:
        return {bank.bank: bank.ledger for bank in self.banks.values()}


class _CentrallyNoised:
    """A summation followed by central noise on the kinds whose channel asks for it."""

    def __init__(self, inner: Callable, noise: Callable[[str, tuple[int, ...]], np.ndarray | None]) -> None:
        self.inner, self.noise = inner, noise

    def __call__(
        self,
        round_number: int,
        contributions: Mapping[int, Mapping[str, torch.Tensor]],
        reference: torch.Tensor | None = None,
    ) -> dict:
        sums = self.inner(round_number, contributions, reference=reference)
        for kind, tensor in sums.items():
            noise = self.noise(kind, tuple(tensor.shape))
            if noise is not None:
                sums[kind] = (tensor.to(torch.float64) + torch.from_numpy(noise)).to(tensor.dtype)
        return sums
