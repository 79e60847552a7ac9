"""The without-DP reference of the audit's membership inference (DESIGN §6: "AUC, with and without DP").

A membership AUC near 0.5 on a DP run says little alone: the attack may be weak on this model and
data whatever the noise. The same attack on the same experiment trained *without* DP measures the
attack's power there, and the difference is what DP bought. The reference comes from, in order:

1. ``--reference RUN_DIR`` — another run directory, accepted only if it has no DP and is the same
   experiment (:data:`MATCH_FIELDS`): otherwise its member and non-member nodes, or its model
   family, differ and the two AUCs are not comparable (:class:`ReferenceRunError`);
2. otherwise a retraining in-process from the audited run's recorded configuration (``run.json``,
   written alike by ``simulate --run-dir`` and by a consortium's run export): same dataset, method,
   seed and split, as many rounds as the run completed, no DP and plaintext summation — CKKS only
   adds rounding noise to the sums, so the plaintext sum is the same experiment, faster;
3. ``--no-reference`` skips it (the report says so, as information, never as a pass).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedgl_secure.audit.run_files import read_run_dir
from fedgl_secure.log import get_logger
from fedgl_secure.wire.run_record import RUN_FILE, RunDirectoryError

if TYPE_CHECKING:
    from fedgl_secure.data.graph import GraphDataset
    from fedgl_secure.engine.config import ExperimentConfig

# The recorded configuration fields that make two runs the same experiment for the membership
# attack: they fix the data, the split into banks (hence the member / non-member nodes) and the method.
MATCH_FIELDS: tuple[tuple[str, ...], ...] = (
    ("dataset",),
    ("method",),
    ("seed",),
    ("federation", "proportions"),
    ("federation", "overlap"),
    ("training", "normalize_features"),
)


class ReferenceRunError(RunDirectoryError):
    """``--reference`` names a run that cannot serve as the reference: it has DP, or is another experiment."""


@dataclass(frozen=True)
class ReferenceModel:
    """A final global model of the audited experiment trained without DP, and where it came from."""

    source: str  # a phrase for the report: "run directory …" or "retrained in-process …"
    weights: np.ndarray
    hidden: int | None
    rounds: int | None


@dataclass(frozen=True)
class ReferencePlan:
    """What the audit does for the without-DP side: use ``model`` (``--reference``), else retrain or skip."""

    model: ReferenceModel | None = None
    retrain: bool = True
    progress: bool = False  # retraining: a progress bar over rounds (on a terminal)

    @property
    def skipped(self) -> bool:
        return self.model is None and not self.retrain


def _field(config: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return [float(v) for v in value] if isinstance(value, list) else value


def experiment_mismatches(run_config: dict[str, Any], reference_config: dict[str, Any]) -> list[str]:
    """``"field: run X, reference Y"`` for every :data:`MATCH_FIELDS` entry that differs (empty: same experiment)."""
    problems = []
    for path in MATCH_FIELDS:
        ours, theirs = _field(run_config, path), _field(reference_config, path)
        if ours != theirs:
            problems.append(f"{'.'.join(path)}: run {ours!r}, reference {theirs!r}")
    return problems


def load_reference(reference_dir: str | Path, run: dict[str, Any]) -> ReferenceModel:
    """The model of ``reference_dir``, checked to be a non-DP run of the experiment recorded in ``run``.

    Raises :class:`RunDirectoryError` for a missing or corrupt file and :class:`ReferenceRunError` naming the
    problem: DP in the reference, a configuration missing, or each mismatched field.
    """
    reference = read_run_dir(reference_dir)
    if reference.policy.has_dp:
        raise ReferenceRunError(
            f"--reference {reference_dir}: the run has DP (policy {reference.policy_source}); "
            "the reference must be the same experiment trained without DP"
        )
    run_config, reference_config = run.get("config"), reference.run.get("config")
    if not run_config:
        raise ReferenceRunError(f"--reference: the audited run's {RUN_FILE} has no 'config' to compare with")
    if not reference_config:
        raise ReferenceRunError(f"--reference {reference_dir}: {RUN_FILE} has no 'config' to compare with")
    mismatches = experiment_mismatches(run_config, reference_config)
    if mismatches:
        raise ReferenceRunError(
            f"--reference {reference_dir} is not the audited run's experiment: " + "; ".join(mismatches)
        )
    rounds = reference.run.get("rounds_run")
    return ReferenceModel(
        source=f"run directory {reference_dir} ({rounds} rounds)",
        weights=reference.directory.model["weights"],
        hidden=(reference_config.get("training") or {}).get("hidden"),
        rounds=rounds,
    )


def completed_rounds(run: dict[str, Any]) -> int:
    """The rounds the audited run completed: the reference trains as long, so only DP differs."""
    rounds = run.get("rounds_run")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"{RUN_FILE} records no completed round (rounds_run = {rounds!r}): nothing to retrain")
    return rounds


def reference_config(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` without the DP a method carries in its own section (GAP's, the class sums'): the run's config holds
    the policy's ε there, and a reference trained with it would not be the without-DP model."""
    return config.model_copy(
        update={
            "gap": config.gap.model_copy(update={"epsilon": math.inf}),
            "centroids": config.centroids.model_copy(update={"epsilon": math.inf, "noise": "local"}),
        }
    )


def retrain_reference(
    config: ExperimentConfig, dataset: GraphDataset, rounds: int, *, progress: bool = False
) -> ReferenceModel:
    """Train ``config``'s experiment for ``rounds`` rounds without DP, summing in plaintext; its final W̄.

    ``config`` is the audited run's (as rebuilt by the audit, on the CPU); early stopping stays as
    configured, as it was for the run. Logs a line before and after (it can take minutes on a real
    dataset) besides the optional progress bar.
    """
    from fedgl_secure.simulation.experiment import run_experiment

    config = reference_config(config)
    config = config.model_copy(update={"federation": config.federation.model_copy(update={"max_rounds": rounds})})
    log = get_logger(dataset=config.dataset, method=config.method, seed=config.seed)
    log.info("audit.reference.retraining", rounds=rounds, dp=False, summation="plaintext")
    started = time.perf_counter()
    final: list = [None]  # only the last broadcast is kept
    result = run_experiment(
        config, dataset, progress=progress, observer=lambda broadcast: final.__setitem__(0, broadcast)
    )
    if final[0] is None:
        raise ValueError(f"method {config.method!r} broadcast no global model: nothing to attack")
    seconds = time.perf_counter() - started
    log.info("audit.reference.retrained", rounds=result.rounds_run, seconds=round(seconds, 2))
    return ReferenceModel(
        source=f"retrained in-process ({result.rounds_run} rounds, seed {config.seed}, plaintext sums)",
        weights=final[0].weights.detach().cpu().numpy(),
        hidden=config.training.hidden,
        rounds=result.rounds_run,
    )
