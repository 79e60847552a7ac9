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

from fedgl_secure.log import get_logger
from fedgl_secure.model.averaging import fedavg
from fedgl_secure.privacy.accounting import WEIGHTS
from fedgl_secure.privacy.label_release import LabelRelease, StagedRelease, fit_softmax_regression, softmax_regression
from fedgl_secure.privacy.secure_noise import RandomBytes

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


LABEL_PRIOR_STAGE = "label-prior"
"""The stage name of the prior's FedAvg rounds in the consortium services (before training round 1)."""


def prior_size(num_features: int, num_classes: int) -> int:
    """The prior's parameter count, cat(vec(W), b): a bank's upload adds one entry, its weight."""
    return num_features * num_classes + num_classes


def prior_steps(stages: int, rounds: int = ROUNDS) -> int:
    """FedAvg rounds of the whole release: ``rounds`` before each stage after the first."""
    return max(0, stages - 1) * rounds


def step_stage(step: int, rounds: int = ROUNDS) -> int:
    """The (0-based) stage whose prior the FedAvg round ``step`` (1-based, over the whole release) fits: every
    stage before it must be released first. The first round of a stage's prior starts from zero."""
    return (step - 1) // rounds + 1


def starts_stage(step: int, rounds: int = ROUNDS) -> bool:
    """Whether FedAvg round ``step`` (1-based, over the whole release) is the first of a stage's prior: it then
    starts from zero, as :func:`fit_consortium_prior` does, not from the θ̄ of the round before."""
    return (step - 1) % rounds == 0


def prior_term(
    parameters: torch.Tensor,
    propagated: np.ndarray,
    likelihood: np.ndarray,
    known: np.ndarray,
    num_classes: int,
    normaliser: float,
    steps: int = LOCAL_STEPS,
) -> torch.Tensor:
    r"""One bank's term of one FedAvg round of the prior (Eq. 10): ``steps`` of
    :func:`~fedgl_secure.privacy.label_release.fit_softmax_regression` from :math:`\bar\theta` = ``parameters`` on its
    ``known`` nodes, as :math:`\mathrm{cat}(\hat w_k\theta_k, [\hat w_k])`, :math:`\hat w_k` = its released-label count
    / ``normaliser`` (a public bound, so :math:`\hat w_k \le 1` as every upload's). A bank with no released label
    uploads a zero weight. ``likelihood[i, y]`` = P(released label of node i | y): the only label information read."""
    index = np.flatnonzero(known)
    count = float(index.size)
    local = parameters
    if count:
        inputs = torch.as_tensor(propagated[index], dtype=torch.float32)
        target = torch.as_tensor(likelihood[index], dtype=torch.float32)
        local = fit_softmax_regression(parameters, inputs, target, num_classes, steps)
    scale = count / normaliser
    return torch.cat([scale * local, torch.tensor([scale])])


def prior_average(total: torch.Tensor, parameters: torch.Tensor) -> torch.Tensor:
    r""":math:`\bar\theta = \sum_k \hat w_k\theta_k / \sum_k \hat w_k` from the summed terms (Eq. 10); ``parameters``
    unchanged while no bank has released a label (the prior stays uniform: plain RR)."""
    total = total.to(torch.float64)
    if total[-1] <= 0:
        return parameters
    return fedavg(total[:-1], total[-1]).to(torch.float32)


def prior_probabilities(parameters: torch.Tensor, propagated: np.ndarray, num_classes: int) -> np.ndarray:
    """The prior's softmax on a bank's own nodes (rows of ``propagated``), what RRWithPrior reads."""
    with torch.no_grad():
        logits = softmax_regression(parameters, torch.as_tensor(propagated, dtype=torch.float32), num_classes)
    return torch.softmax(logits, dim=1).double().numpy()


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
    r"""FedAvg of SGC's softmax regression over the banks: each round every bank uploads its :func:`prior_term`,
    ``summation`` adds them (as the ``weights`` kind, centred on :math:`\bar\theta` on the secure path) and
    :func:`prior_average` gives the next :math:`\bar\theta`, from zero. Rounds are numbered ``first_round`` onwards
    in ``summation``'s own sequence (a secure summation decrypts each round's weights once, so a run's training
    rounds need a summation of their own). Returns :math:`\bar\theta`. The consortium services run the same
    rounds between the aggregator and the banks (``consortium/label_prior_rounds.py``,
    ``consortium/bank_label_prior.py``)."""
    parameters = torch.zeros(prior_size(propagated[0].shape[1], num_classes))
    log = get_logger(role="consortium-prior")
    for round_number in range(first_round, first_round + rounds):
        contributions = {
            k: {WEIGHTS: prior_term(parameters, x, lik, mask, num_classes, normaliser, steps)}
            for k, (x, lik, mask) in enumerate(zip(propagated, likelihoods, known, strict=True))
        }
        total = summation(round_number, contributions, reference=parameters)[WEIGHTS]
        if total.to(torch.float64)[-1] <= 0:  # no bank has released a label yet: the prior stays uniform (plain RR)
            return parameters
        parameters = prior_average(total, parameters)
    labelled = int(sum(np.count_nonzero(mask) for mask in known))
    log.info("prior.fitted", rounds=rounds, banks=len(propagated), labelled=labelled)
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
            release.release(number, prior_probabilities(parameters, bank.propagated, num_classes))
    return [release.result() for release in releases]
