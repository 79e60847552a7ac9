"""The consortium-wide prior of the multi-stage label release (``[dp.labels] prior = "consortium-sgc"``).

Ghazi et al.'s multi-stage release ("Deep Learning with Label Differential Privacy", NeurIPS 2021, §3.2) inside
each bank (:mod:`~fedgl_secure.privacy.label_release`), with one change: the prior of every later stage is fitted
by **all banks together**. After a stage is released, the banks run FedAvg (McMahan et al., AISTATS 2017) on the
SGC prior — softmax regression on each bank's own Â²X (Wu et al., ICML 2019), fitted to the labels released so
far by the likelihood of each released label under the mechanism that released it, exactly as
:func:`~fedgl_secure.privacy.label_release.sgc_prior` — for :data:`ROUNDS` rounds of :data:`LOCAL_STEPS` local
steps, their weights summed by the simulation's summation (the CKKS secure summation under ``--secure``: the
aggregator never sees one bank's prior weights). Each bank then releases its next stage by RRWithPrior with the
consortium prior's predictions on its own nodes. A bank alone has 35–100 training labels and ≈ 80 validation
labels on Cora; pooling every bank's stage-1 release fits a better prior (docs/privacy.md §6.10).

**Privacy (label unit).** The prior used for stage s is a function of the banks' features and graphs (outside the
label unit) and of the labels *released* in stages < s (ε-label-DP outputs), never of a label of stage s or
later: each label is still released exactly once, by an ε-label-DP mechanism (RRWithPrior) chosen from earlier
outputs only. By parallel composition over disjoint labels with adaptive choice of the mechanism, the whole
release — every bank's, and the prior weights exchanged, which are post-processing of the stage-1 outputs — is
ε-label-DP; each bank's ledger records one release of ε at round 0, as for its own prior. (What crosses a bank's
boundary beyond that is its prior weights' contribution to an encrypted sum, from features and graphs the label
unit does not cover.) Tested: changing a bank's stage-2 labels leaves the consortium prior unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from fedgl_secure.engine.aggregation import fedavg
from fedgl_secure.log import get_logger
from fedgl_secure.privacy.accounting import WEIGHTS
from fedgl_secure.privacy.label_release import LabelRelease, StagedRelease, fit_softmax_regression, softmax_regression
from fedgl_secure.privacy.mechanisms import RandomBytes

# FedAvg of the prior: 20 rounds of 10 full-batch Adam steps from zero. An ad-hoc probe (docs/privacy.md §6.10)
# found 10–20 such rounds enough for the pooled prior to predict ≈ 72 % of Cora's training labels, against 67 %
# for a bank's own prior; the SGC learning rate and (tiny) weight decay are the per-bank prior's, for the same reason.
ROUNDS = 20
LOCAL_STEPS = 10

Summation = Callable[..., Mapping[str, torch.Tensor]]


class BankLabels(NamedTuple):
    """What one bank brings to the release: its true labels and masks (never leave it), Â²X of its own graph
    (:func:`~fedgl_secure.privacy.label_release.propagated_features`) and its byte source."""

    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    propagated: np.ndarray
    random_bytes: RandomBytes | None = None


def fit_consortium_prior(
    propagated: Sequence[np.ndarray],
    likelihoods: Sequence[np.ndarray],
    known: Sequence[np.ndarray],
    num_classes: int,
    summation: Summation,
    normaliser: float,
    rounds: int = ROUNDS,
    steps: int = LOCAL_STEPS,
    first_round: int = 1,
) -> torch.Tensor:
    r"""FedAvg of SGC's softmax regression over the banks (Eq. 10 with :math:`w_k` = the bank's released-label
    count): each round every bank runs
    :func:`~fedgl_secure.privacy.label_release.fit_softmax_regression` for ``steps`` from :math:`\bar\theta` and uploads
    :math:`\mathrm{cat}(\hat w_k\theta_k, [\hat w_k])`, :math:`\hat w_k = w_k/` ``normaliser`` (a public bound,
    so :math:`\hat w_k \le 1` as every upload's); ``summation`` adds them (as the ``weights`` kind, centred on
    :math:`\bar\theta` on the secure path) and :math:`\bar\theta = \sum_k \hat w_k\theta_k / \sum_k \hat w_k`.
    Rounds are numbered ``first_round`` onwards in ``summation``'s own sequence (a secure summation decrypts each
    round's weights once, so a run's training rounds need a summation of their own). Returns :math:`\bar\theta`.

    ``likelihoods[k][i, y]`` = P(bank k's released label of node i | y) at its ``known[k]`` nodes: the only label
    information read — the property the release's privacy rests on.
    """
    inputs = [torch.as_tensor(x, dtype=torch.float32) for x in propagated]
    targets = [
        torch.as_tensor(lik[np.flatnonzero(mask)], dtype=torch.float32)
        for lik, mask in zip(likelihoods, known, strict=True)
    ]
    counts = [float(np.count_nonzero(mask)) for mask in known]
    parameters = torch.zeros(inputs[0].shape[1] * num_classes + num_classes)
    log = get_logger(role="consortium-prior")
    for round_number in range(first_round, first_round + rounds):
        contributions = {}
        for k, (x, target, count) in enumerate(zip(inputs, targets, counts, strict=True)):
            local = (
                fit_softmax_regression(parameters, x[np.flatnonzero(known[k])], target, num_classes, steps)
                if count
                else parameters
            )
            scale = count / normaliser
            contributions[k] = {WEIGHTS: torch.cat([scale * local, torch.tensor([scale])])}
        total = summation(round_number, contributions, reference=parameters)[WEIGHTS].to(torch.float64)
        if total[-1] <= 0:  # no bank has released a label yet: the prior stays uniform (plain RR)
            return parameters
        parameters = fedavg(total[:-1], total[-1]).to(torch.float32)
    log.info("prior.fitted", rounds=rounds, banks=len(inputs), labelled=int(sum(counts)))
    return parameters


def consortium_release(
    banks: Sequence[BankLabels],
    num_classes: int,
    epsilon: float,
    stages: int,
    order: str,
    summation: Summation,
    normaliser: float,
    temperature: float = 1.0,
    rounds: int = ROUNDS,
    steps: int = LOCAL_STEPS,
) -> list[LabelRelease]:
    """Every bank's multi-stage release with the consortium prior (module doc): stage 1 of each bank by randomised
    response; before each later stage s, :func:`fit_consortium_prior` on every bank's labels released before s
    (summed by ``summation``, rounds numbered on from stage to stage), then each bank releases stage s by
    RRWithPrior with the prior's softmax on its own nodes, sharpened to ``temperature``
    (:func:`~fedgl_secure.privacy.label_release.at_temperature`). Returns each bank's
    :class:`~fedgl_secure.privacy.label_release.LabelRelease`."""
    releases = [
        StagedRelease(
            bank.labels,
            bank.train_mask,
            bank.val_mask,
            num_classes,
            epsilon,
            stages,
            order,
            temperature,
            _random_bytes=bank.random_bytes,
        )
        for bank in banks
    ]
    for number in range(1, stages):
        parameters = fit_consortium_prior(
            [bank.propagated for bank in banks],
            [release.likelihood for release in releases],
            [release.known(number) for release in releases],
            num_classes,
            summation,
            normaliser,
            rounds,
            steps,
            first_round=(number - 1) * rounds + 1,
        )
        for bank, release in zip(banks, releases, strict=True):
            logits = softmax_regression(parameters, torch.as_tensor(bank.propagated, dtype=torch.float32), num_classes)
            release.release(number, torch.softmax(logits, dim=1).double().numpy())
    return [release.result() for release in releases]
