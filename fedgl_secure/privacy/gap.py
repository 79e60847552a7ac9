r"""GAP node-level DP: aggregation perturbation with a degree bound (Sajadmanesh et al., USENIX Security 2023).

GAP splits a GNN into three modules so that each use of private data is released once and accounted:

1. **Encoder** — an MLP on a node's own features and label, trained with DP-SGD on per-node examples
   (Poisson sampling at rate q, per-example clip C, noise z_e·C). It sees no edges, so one customer is
   one example: standard DP-SGD add/remove neighbouring.
2. **Aggregation** — the encoder's embeddings, row-normalised to unit L2 (x⁰), then K hops of
   :math:`x^{k} = \mathrm{normalise}(A\,x^{k-1} + \mathcal N(0, \sigma^2 I))` (Eq. A1, :func:`perturbed_hops`) on the
   bank's degree-bounded graph (every node has at most D links,
   :func:`~fedgl_secure.privacy.graph_sensitivity.bound_degree`).
3. **Classifier** — an MLP over the concatenation :math:`[x^0, x^1, …, x^K]`, trained with DP-SGD on
   per-node examples (rate q, clip C, noise z_c·C).

**Sensitivity of one hop (Eq. A2, :func:`aggregation_sensitivity`).** Take neighbouring graphs G and
G' = G without node v and its links, both with degree ≤ D (the bounded-degree relation: the guarantee
holds for the projected graph, as for every node-unit mechanism here). For every node u ≠ v, row u of
:math:`A x` differs between G and G' by :math:`x_v` (unit norm) if u is a neighbour of v and not at all
otherwise; v has at most D neighbours. So the rows of the nodes present in both graphs move by at most
√D in Frobenius norm, and hop k is the Gaussian mechanism with noise multiplier :math:`z_a = \sigma/\sqrt D`.
v's own row exists only in G; it is read only by v's own classifier example, which DP-SGD's add/remove
analysis covers for *any* content (quasi-convexity of the Rényi divergence over the mixture on that row).
This is GAP's node-level analysis (its Lemma on node-level sensitivity √D under a degree bound), with
the degree bounded on both ends of every link: a bound on in-degree alone would not limit how many
rows one node enters.

**Composition (Eq. A3, :func:`composed_epsilon`).** The bank releases the encoder weights (after DP-SGD,
post-processing of its noisy gradients), then — inside the bank — the K noisy aggregates, then the
classifier weights (DP-SGD on examples built from the noisy aggregates and the node's own x⁰). These
compose adaptively in RDP: encoder ``(z_e, q, R_e·S)`` + aggregation ``(z_a, 1, K)`` + classifier
``(z_c, q, R_c·S)`` (R rounds of S local steps each), converted to (ε, δ) by Opacus' RDP (or PRV)
accountant (:func:`~fedgl_secure.privacy.accounting.gaussian_epsilon`). :func:`calibrate` finds the
three noise multipliers that spend a target ε in the policy's split.

The weights a bank uploads are the FedAvg terms of its DP-SGD-trained modules: post-processing, so the
weights kind needs no channel of its own, and the rounds after the schedule (``encoder_rounds +
classifier_rounds``) train nothing (:class:`~fedgl_secure.methods.gap.GAP` uploads the unchanged weights).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from fedgl_secure.policy.gap_settings import GAPSettings
from fedgl_secure.privacy import secure_noise
from fedgl_secure.privacy.accounting import (
    AccountantName,
    GaussianRelease,
    calibration_epsilon,
    gaussian_epsilon,
    smallest_noise_multiplier,
    warnings_ignored,
)

RandomBytes = Callable[[int], bytes]

ENCODER, AGGREGATION, CLASSIFIER = "gap_encoder", "gap_aggregation", "gap_classifier"


@dataclass(frozen=True)
class GAPNoise:
    """Noise multipliers of the three modules (0 everywhere: no DP)."""

    encoder: float
    aggregation: float
    classifier: float

    @property
    def private(self) -> bool:
        return self.encoder > 0


NO_NOISE = GAPNoise(0.0, 0.0, 0.0)


def aggregation_sensitivity(max_degree: int) -> float:
    """Eq. A2: L2 (Frobenius) sensitivity √D of one hop's neighbour sums of unit rows, node neighbouring."""
    if max_degree < 1:
        raise ValueError(f"max_degree must be at least 1, got {max_degree}")
    return math.sqrt(max_degree)


def schedule(settings: GAPSettings) -> tuple[tuple[str, float, int], ...]:
    """``(channel, sample rate, steps)`` of the three modules: encoder, aggregation (q = 1, one step per hop),
    classifier."""
    return (
        (ENCODER, settings.sample_rate, settings.encoder_rounds * settings.local_steps),
        (AGGREGATION, 1.0, settings.hops),
        (CLASSIFIER, settings.sample_rate, settings.classifier_rounds * settings.local_steps),
    )


def step_release(settings: GAPSettings, noise: GAPNoise, round_number: int) -> GaussianRelease | None:
    """The S DP-SGD steps round ``round_number`` (1-based) of GAP's schedule trains: the encoder's in rounds 1…R_e,
    the classifier's up to R_e + R_c; None later (or without noise)."""
    if not noise.private or round_number > settings.rounds:
        return None
    encoder = round_number <= settings.encoder_rounds
    return GaussianRelease(
        round=round_number,
        channel=ENCODER if encoder else CLASSIFIER,
        noise_multiplier=noise.encoder if encoder else noise.classifier,
        sample_rate=settings.sample_rate,
        steps=settings.local_steps,
    )


def hops_release(settings: GAPSettings, noise: GAPNoise, round_number: int) -> GaussianRelease | None:
    """The K perturbed hops, released once by each bank, as a release of round ``round_number`` (None without
    noise)."""
    if not noise.private:
        return None
    return GaussianRelease(
        round=round_number,
        channel=AGGREGATION,
        noise_multiplier=noise.aggregation,
        sample_rate=1.0,
        steps=settings.hops,
    )


def round_releases(settings: GAPSettings, noise: GAPNoise, round_number: int) -> list[GaussianRelease]:
    """What one bank releases in round ``round_number`` (1-based) of GAP's schedule: S encoder steps in rounds
    1…R_e; the K hops and S classifier steps in round R_e + 1; S classifier steps up to R_e + R_c; nothing later
    (or without noise). A bank's ledger records these; they compose to :func:`releases`."""
    step = step_release(settings, noise, round_number)
    if step is None:
        return []
    if round_number != settings.encoder_rounds + 1:
        return [step]
    return [hops_release(settings, noise, round_number), step]


def releases(settings: GAPSettings, noise: GAPNoise) -> list[GaussianRelease]:
    """The three modules as Opacus-accountable Gaussian releases (round 0: each is planned once)."""
    multipliers = (noise.encoder, noise.aggregation, noise.classifier)
    return [
        GaussianRelease(round=0, channel=channel, noise_multiplier=z, sample_rate=q, steps=steps)
        for z, (channel, q, steps) in zip(multipliers, schedule(settings), strict=True)
    ]


def composed_epsilon(settings: GAPSettings, noise: GAPNoise, delta: float, accountant: AccountantName = "rdp") -> float:
    """Eq. A3: ε at δ of encoder DP-SGD + K aggregation hops + classifier DP-SGD, composed by Opacus."""
    if not noise.private:
        return math.inf
    return gaussian_epsilon(releases(settings, noise), delta, accountant)


@functools.lru_cache(maxsize=64)
@warnings_ignored
def calibrate(settings: GAPSettings, epsilon: float, delta: float) -> GAPNoise:
    """The noise multipliers that spend ``epsilon`` at ``delta`` in the three modules together (Eq. A3).

    Each module gets the multiplier that spends ``s·f_i·ε`` alone (f = the split); s is bisected so that
    the RDP *composition* of the three (tighter than adding the parts' ε) is just within ``epsilon``.
    Everything is computed on :data:`~fedgl_secure.privacy.accounting.CALIBRATION_ORDERS`; the ε a run reports
    (:func:`composed_epsilon`, Opacus' accountant on its own orders) can only be lower. ``epsilon = inf``:
    no noise.
    """
    if math.isinf(epsilon):
        return NO_NOISE
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need ε > 0 and 0 < δ < 1, got ε = {epsilon}, δ = {delta}")
    parts = [(q, steps) for _, q, steps in schedule(settings)]

    def noise_for(scale: float) -> GAPNoise:
        shares = settings.epsilon_split
        return GAPNoise(
            *(
                smallest_noise_multiplier(scale * f * epsilon, delta, q, n)
                for f, (q, n) in zip(shares, parts, strict=True)
            )
        )

    def spent(noise: GAPNoise) -> float:
        multipliers = (noise.encoder, noise.aggregation, noise.classifier)
        return calibration_epsilon([(z, q, n) for z, (q, n) in zip(multipliers, parts, strict=True)], delta)

    low, high = 1.0, 1.0  # bracket s: spent(low) <= ε < spent(high)
    if spent(noise_for(1.0)) <= epsilon:
        while spent(noise_for(high)) <= epsilon:
            low, high = high, 1.5 * high
    else:  # the RDP bound of the composition can exceed the parts' sum at a coarse order grid: shrink
        while spent(noise_for(low)) > epsilon:
            low, high = low / 1.5, low
    best = noise_for(low)
    for _ in range(10):
        middle = (low + high) / 2
        candidate = noise_for(middle)
        if spent(candidate) <= epsilon:
            low, best = middle, candidate
        else:
            high = middle
    return best


def symmetric_pattern(adjacency: sp.spmatrix) -> sp.csr_matrix:
    """The binary, symmetric, loop-free link pattern of a (possibly GCN-normalised) adjacency."""
    pattern = sp.csr_matrix(adjacency, dtype=np.float64, copy=True)
    pattern.setdiag(0)
    pattern.eliminate_zeros()
    pattern.data[:] = 1.0
    return sp.csr_matrix(((pattern + pattern.T) > 0).astype(np.float64))


def normalise_rows(matrix: torch.Tensor) -> torch.Tensor:
    """Every row scaled to unit L2 norm (zero rows stay zero): the precondition of Eq. A2."""
    return F.normalize(matrix, p=2.0, dim=1)


def hop_noise(
    hops: int, shape: tuple[int, ...], noise_std: float, *, _random_bytes: RandomBytes | None = None
) -> tuple[torch.Tensor, ...]:
    """K draws of N(0, σ²) of ``shape`` from the OS CSPRNG (:func:`~.secure_noise.secure_gaussian`)."""
    return tuple(
        torch.as_tensor(
            secure_noise.secure_gaussian(shape, noise_std, _random_bytes=_random_bytes), dtype=torch.float32
        )
        for _ in range(hops)
    )


def perturbed_hops(
    embeddings: torch.Tensor,
    adjacency: torch.Tensor,
    hops: int,
    noise_std: float,
    *,
    noise: tuple[torch.Tensor, ...] | None = None,
    _random_bytes: RandomBytes | None = None,
) -> list[torch.Tensor]:
    r"""Eq. A1: ``[x⁰, x¹, …, x^K]`` with x⁰ = normalise(embeddings), :math:`x^k = \mathrm{normalise}(A x^{k-1} + N)`.

    ``adjacency`` is the degree-bounded binary A (a torch sparse or dense matrix, no self loops); ``noise_std``
    σ = z_a·√D, drawn from the OS CSPRNG (:func:`hop_noise`); 0 means no noise (no DP). ``noise``: the K draws
    to use instead (drawn once by :func:`hop_noise`, so that a graph scored again sees the same release).
    """
    current = normalise_rows(embeddings)
    out = [current]
    if noise is None and noise_std > 0:
        noise = hop_noise(hops, tuple(current.shape), noise_std, _random_bytes=_random_bytes)
    for hop in range(hops):
        summed = adjacency @ current
        if noise:
            summed = summed + noise[hop].to(summed.device, summed.dtype)
        current = normalise_rows(summed)
        out.append(current)
    return out


def dp_sgd_step(
    module: nn.Module,
    parameters: list[nn.Parameter],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    num_examples: int,
    settings: GAPSettings,
    noise_multiplier: float,
    optimizer: torch.optim.Optimizer,
    *,
    _random_bytes: RandomBytes | None = None,
) -> None:
    """One DP-SGD step on per-node examples (Abadi et al. 2016) with Opacus' per-sample gradients.

    ``module`` is an Opacus ``GradSampleModule``; ``loss_of(indices)`` returns the *summed* loss of those
    examples through it. Examples are Poisson-sampled at rate q from the CSPRNG; every per-example gradient
    is clipped to C, the clipped gradients summed, N(0, (zC)²) added, and the sum divided by the expected
    batch q·n (public). With ``noise_multiplier = 0`` (no DP) the same step runs unclipped and noiseless.
    """
    private = noise_multiplier > 0
    chosen = np.flatnonzero(
        secure_noise.secure_uniform(num_examples, _random_bytes=_random_bytes) < settings.sample_rate
    )
    optimizer.zero_grad(set_to_none=True)
    summed = [torch.zeros_like(p) for p in parameters]
    if chosen.size:
        module.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # the inputs need no gradient; Opacus' hooks read the layers' own
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss_of(torch.as_tensor(chosen, dtype=torch.int64)).backward()
        per_example = [p.grad_sample.reshape(chosen.size, -1) for p in parameters]
        if private:
            norms = torch.cat(per_example, dim=1).norm(dim=1)
            factors = (settings.max_grad_norm / (norms + 1e-12)).clamp(max=1.0)
        else:
            factors = torch.ones(chosen.size)
        for total, grads, p in zip(summed, per_example, parameters, strict=True):
            total += (factors[:, None] * grads).sum(dim=0).reshape(p.shape)
        module.zero_grad(set_to_none=True)
    for total, p in zip(summed, parameters, strict=True):
        if private:
            noise = secure_noise.secure_gaussian(
                tuple(p.shape), noise_multiplier * settings.max_grad_norm, _random_bytes=_random_bytes
            )
            total += torch.as_tensor(noise, dtype=total.dtype)
        p.grad = total / max(settings.sample_rate * num_examples, 1.0)
    optimizer.step()
