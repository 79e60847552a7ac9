"""Run-time noise calibration (DESIGN §6): each DP upload channel's sensitivity, its σ, central noise, and the
noise multiplier a bank records.

What the parties use while a run goes on to size noise: a bank's shares (:mod:`~fedgl_secure.privacy.dp_round`),
the key authority's central noise (:mod:`~fedgl_secure.crypto.key_authority`) and the audit's checks of it. It
sits low in ``privacy/``, beside :mod:`~fedgl_secure.privacy.secure_noise` and
:mod:`~fedgl_secure.privacy.graph_sensitivity`, so that ``crypto/`` can import it: it reads the policy and the
mechanisms and imports nothing above ``privacy/``. What each round releases for the
accountant is :mod:`~fedgl_secure.privacy.release_schedule`; the report of what a policy guarantees is
:mod:`~fedgl_secure.privacy.guarantees`.

Observers: :func:`accounted_noise_multiplier` is the multiplier against the weakest single observer of a
channel — for distributed noise a fellow bank, who knows its own share (σ√((q−1)/q), q = quorum); for central
noise every bank and the aggregator (σ); DP-SGD is applied by the bank to its own data.
"""

from __future__ import annotations

import numpy as np

from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy import graph_sensitivity, secure_noise
from fedgl_secure.privacy.accounting import DP_SGD, WEIGHTS


def graph_args(policy: Policy) -> tuple[int, int, graph_sensitivity.Neighbouring]:
    graph = policy.dp.graph
    if graph.max_degree is None:  # the policy validator makes this unreachable for enabled channels
        raise ValueError("dp.graph.max_degree is not set")
    return graph.max_degree, graph.num_layers, graph.neighbouring


def upload_sensitivity(policy: Policy, kind: str) -> float:
    """L2 sensitivity of one (unweighted) release of an upload kind under the policy's clip and degree bound."""
    channel = policy.dp.upload_channel(kind)
    if channel is None:
        raise ValueError(f"{kind!r} has no enabled DP channel in this policy")
    if kind == WEIGHTS:
        return graph_sensitivity.weight_update_sensitivity(channel.clip)
    return graph_sensitivity.prediction_sensitivity(channel.clip, *graph_args(policy))  # P and H rows alike


def noise_std(policy: Policy, kind: str) -> float:
    """σ = noise_multiplier × sensitivity of upload ``kind``, on the normalised (ŵ_k ≤ 1) scale (the class-sums
    release of ``node_mechanism = "centroids"``: z × 1 on the sums themselves, which that method does not normalise)."""
    if policy.dp.node_mechanism == "centroids" and kind == WEIGHTS:
        from fedgl_secure.privacy import class_sums

        return class_sums.noise_multiplier(policy.budget.epsilon, policy.budget.delta) * class_sums.SENSITIVITY
    channel = policy.dp.upload_channel(kind)
    if channel is None:
        raise ValueError(f"{kind!r} has no enabled DP channel in this policy")
    return secure_noise.gaussian_noise_std(channel.noise_multiplier, upload_sensitivity(policy, kind))


def central_noise_stds(policy: Policy) -> dict[str, float]:
    """σ of every kind whose DP channel asks the key authority for central noise (empty without such a channel)."""
    return {kind: noise_std(policy, kind) for kind in policy.dp.central_kinds()}


def central_noise_count(kind: str, length: int) -> int:
    """How many of a decrypted sum's ``length`` values get central noise: all, but for ``weights`` its last
    entry (Σ ŵ_k, the normaliser of Eq. 10), which is public by the policy and released exactly."""
    return max(length - 1, 0) if kind == WEIGHTS else length


def central_noise(
    kind: str, shape: int | tuple[int, ...], std: float, random_bytes: secure_noise.RandomBytes | None = None
) -> np.ndarray:
    """N(0, std²) for a decrypted sum of ``kind`` and ``shape``, on the values :func:`central_noise_count`
    counts (the last weights entry gets 0). ``random_bytes`` replaces the OS CSPRNG, for tests only."""
    noise = secure_noise.secure_gaussian(shape, std, _random_bytes=random_bytes)
    if kind == WEIGHTS and noise.size:
        noise.reshape(-1)[-1] = 0.0
    return noise


def accounted_noise_multiplier(policy: Policy, channel: str) -> float:
    """The noise multiplier a bank records for ``channel`` (an upload kind or ``dp_sgd``), weakest observer.

    Distributed uploads: z·√((q−1)/q), the noise a fellow bank faces (it knows its own share).
    Central uploads: z. DP-SGD: z / (2K − 1) on a GCN (``graph_dp_sgd_noise_multiplier``), q = 1.
    """
    if channel == DP_SGD:
        sgd = policy.dp.sgd
        if not policy.dp.sgd_enabled:
            raise ValueError("DP-SGD is not enabled in this policy")
        return graph_sensitivity.graph_dp_sgd_noise_multiplier(sgd.noise_multiplier, *graph_args(policy))
    settings = policy.dp.upload_channel(channel)
    if settings is None:
        raise ValueError(f"{channel!r} has no enabled DP channel in this policy")
    if settings.noise == "central":
        return float(settings.noise_multiplier)
    sensitivity = upload_sensitivity(policy, channel)
    sigma = secure_noise.gaussian_noise_std(settings.noise_multiplier, sensitivity)
    return secure_noise.residual_noise_std(sigma, policy.quorum, known_shares=1) / sensitivity
