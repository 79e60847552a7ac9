"""The Ray executor (simulation/ray_executor.py): the banks on Ray actors give the in-process run's record, field for
field (FedGL; GraphFL's two stages with self-training); the banks really are in other processes, spread round-robin;
``simulate --executor ray`` writes its record; what it cannot run as promised is refused.

One local Ray (2 CPUs, no dashboard) serves the module's tests and is shut down at its end; the executor joins the Ray
this process is connected to, so the runs here start none of their own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
import structlog
from benchmark_scripts import load_benchmark
from structlog.testing import capture_logs
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.data.graphfl_split import graphfl_clients
from fedgl_secure.data.registry import load_dataset
from fedgl_secure.engine.config import build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.simulation.executors import ExecutorSettings, check_executor, executor_settings
from fedgl_secure.simulation.experiment import Federation, resolve_device, run_experiment
from fedgl_secure.simulation.ray_executor import RayExecutor

REPO = Path(__file__).resolve().parents[1]
RAY = ExecutorSettings(kind="ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cora(data_root):
    return load_dataset("cora", str(data_root), seed=0)


def record_difference(in_process, on_ray) -> str | None:
    """The first field where the two runs' records differ, wall-clock fields aside (benchmarks/run_records.py)."""
    return load_benchmark("run_records").first_difference(in_process.to_dict(), on_ray.to_dict())


def test_fedgl_on_ray_gives_the_in_process_record(local_ray, cora):
    config = build_config(
        {
            "dataset": "cora",
            "method": "fedgl",
            "seed": 3,
            "device": "cpu",
            # pseudo labels from round 1 on (λ low), so round 2 trains on them and on the pseudo graph
            "self_supervision": {"threshold": 0.15, "neighbors": 10},
            "training": {"local_epochs": 3},
            "federation": {"max_rounds": 2, "proportions": [0.3, 0.4, 0.5]},
        }
    )
    in_process = run_experiment(config, cora, progress=False)
    # a CLI test on this worker may have configured logging at "warning", which drops the info event below before
    # capture_logs sees it; structlog's defaults pass every level
    structlog.reset_defaults()
    with capture_logs() as logs:
        on_ray = run_experiment(config, cora, progress=False, executor=RAY)
    assert record_difference(in_process, on_ray) is None
    assert on_ray.rounds_run == 2 and len(on_ray.local_test_accuracy) == 3
    assert on_ray.history[0].pseudo_labels > 0 and on_ray.history[0].pseudo_graph_edges > 0
    # the banks were on two actors (one per CPU of the 2-CPU Ray), round-robin, in processes other than this one
    (placement,) = [entry["placement"] for entry in logs if entry["event"] == "ray.actors_ready"]
    assert sorted(placement.values()) == [[0, 2], [1]]
    assert len(placement) == 2 and os.getpid() not in placement


def test_graphfl_with_self_training_on_ray_gives_the_in_process_record(local_ray, cora):
    """Two stages a round, half the banks a round, the banks' own graphs (``clients=``), self-training in the actors."""
    clients = graphfl_clients(cora, 5, 10, seed=0, test_size=200, val_size=100)
    config = build_config(
        {
            "method": "graphfl",
            "dataset": "cora",
            "seed": 1,
            "device": "cpu",
            "federation": {"participation": 0.6, "max_rounds": 2},
            "graphfl": {"inner_steps": 2},
            "self_training": {"per_class": 2, "epochs": 5},
        }
    )
    in_process = run_experiment(config, clients=clients, progress=False)
    on_ray = run_experiment(config, clients=clients, progress=False, executor=RAY)
    assert record_difference(in_process, on_ray) is None
    assert [len(r.participants) for r in on_ray.history] == [3, 3]


def test_too_many_actors_are_refused(local_ray, cora):
    config = build_config({"dataset": "cora", "method": "federated", "device": "cpu"})
    federation = Federation.build(cora, config, resolve_device("cpu"))
    positions = [graph.positions for graph in federation.client_graphs]
    with pytest.raises(ConfigError, match="3 actors of one CPU each, but the Ray cluster has 2 CPUs"):
        RayExecutor(
            config,
            federation.clients,
            positions,
            federation.index.size,
            federation.merged.num_classes,
            ExecutorSettings(kind="ray", actors=3),
        )


@pytest.mark.parametrize("secure", [False, True])
def test_simulate_cli_on_ray_writes_its_record(local_ray, tmp_path, secure):
    """With --secure (the baseline policy: HE, no DP) the banks encrypt in their actors and the summary reports the
    ciphertext bytes of every kind, as an in-process secure run does."""
    output = tmp_path / "run.json"
    args = ["simulate", "--method", "federated", "--rounds", "1", "--no-progress", "--device", "cpu"]
    args += ["--output", str(output), "--executor", "ray", *(["--secure"] if secure else [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["rounds_run"] == 1 and json.loads(output.read_text())["rounds_run"] == 1
    if secure:
        assert summary["secure"]["wire_bytes"]["weights"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--secure", "--policy", str(REPO / "policies" / "strict-dp.toml")], "--executor ray with a privacy policy"),
        (["--method", "centralized"], "the centralized and local baselines"),
        (["--ray-address", "localhost:6379"], "address and actors are Ray's"),
    ],
)
def test_simulate_refuses_what_ray_cannot_run(flags, message):
    executor = [] if "--ray-address" in flags else ["--executor", "ray"]
    result = CliRunner().invoke(app, ["simulate", "--no-progress", *executor, *flags])
    assert result.exit_code == 2 and message in result.output, result.output


def test_reproduce_on_ray_refuses_parallel_workers(data_root, tmp_path):
    args = ["reproduce", "table2", "--datasets", "cora", "--methods", "fedgl", "--seeds", "1", "--workers", "2"]
    args += ["--data-root", str(data_root), "--output-dir", str(tmp_path), "--executor", "ray"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--workers: with --executor ray" in result.output, result.output


def test_settings_and_checks():
    with pytest.raises(ConfigError, match="--executor: actors"):
        executor_settings("ray", None, 0)
    assert executor_settings("ray", "ray://head:10001").address == "ray://head:10001"
    check_executor(ExecutorSettings(), baseline=True, privacy=True)  # in-process runs everything
    check_executor(RAY, baseline=False, privacy=False)  # --secure included: its banks encrypt in their actors
    with pytest.raises(ConfigError, match="with a privacy policy"):
        check_executor(RAY, baseline=False, privacy=True)
    with pytest.raises(ConfigError, match="in clear"):
        check_executor(RAY, baseline=False, privacy=False, driver_encrypts=True)


def test_a_summation_that_encrypts_in_the_driver_is_refused_on_ray():
    """The quantised twin (like any summation but the plain and the streaming secure one) would take the banks' terms
    in clear in the driver: refused before any Ray starts."""
    from fedgl_secure.crypto.secure_summation import QuantisedSummation
    from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
    from fedgl_secure.policy.schema import load_policy

    config = build_config({"method": "fedgl", "federation": {"max_rounds": 1}, "device": "cpu"})
    summation = QuantisedSummation(load_policy(REPO / "policies" / "baseline.toml"))
    with pytest.raises(ConfigError, match="in clear"):
        run_experiment(config, synthetic_consortium(seed=0), progress=False, summation=summation, executor=RAY)


def test_a_secure_run_on_ray_encrypts_in_the_actors_and_gives_the_plaintext_model(local_ray, monkeypatch):
    """Under --secure each bank's terms are encrypted in its actor: this process never encrypts (its own encryption
    path is made to fail, its pool never starts), yet every upload is receipted, checked, summed and decrypted here,
    and the model is the in-process plaintext twin's (the baseline policy packs values: CKKS sums the same quantised
    integers, test_secure_simulation.py)."""
    from fedgl_secure.crypto import secure_summation as secure_module
    from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
    from fedgl_secure.policy.schema import load_policy

    dataset = synthetic_consortium(seed=0)
    config = build_config({"method": "fedgl", "federation": {"max_rounds": 2}, "device": "cpu"})
    policy = load_policy(REPO / "policies" / "baseline.toml")
    plain_weights, secure_weights = [], []
    plain = run_experiment(
        config,
        dataset,
        progress=False,
        summation=secure_module.QuantisedSummation(policy),
        observer=lambda broadcast: plain_weights.append(broadcast.weights),
    )

    def never_here(*args, **kwargs):
        raise AssertionError("a bank's terms were encrypted in the driver")

    monkeypatch.setattr(secure_module, "make_upload", never_here)
    summation = secure_module.SecureSummation(policy)
    try:
        on_ray = run_experiment(
            config,
            dataset,
            progress=False,
            summation=summation,
            observer=lambda broadcast: secure_weights.append(broadcast.weights),
            executor=RAY,
        )
        assert not summation.encryption.started
        kinds = {receipt.kind for receipt in summation.accepted_receipts}
        assert len(summation.accepted_receipts) == 2 * len(on_ray.local_test_accuracy) * len(kinds)
    finally:
        summation.close()
    assert [h.val_accuracy for h in on_ray.history] == [h.val_accuracy for h in plain.history]
    assert float((secure_weights[-1] - plain_weights[-1]).abs().max()) <= 1e-4
