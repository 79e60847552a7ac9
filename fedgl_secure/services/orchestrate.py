"""``fedgl-secure consortium up``: every node of a consortium as its own process, for a local demo.

Nodes start in dependency order (key authority, aggregator, banks), each running
``fedgl-secure node start --config <consortium dir>/<node>.toml`` in its own process, forked from one server of
preloaded modules (``services/node_launcher.py``), and its JSON log in
``<state_root>/logs/<node>.log``. Progress comes from the aggregator's structured log; Ctrl-C
(or the end of the federation) stops every process: SIGTERM, then SIGKILL after a grace period.
A federation that stopped early because banks withdrew (privacy budget spent) is a normal end: its
``stopped_reason`` is printed and returned in the summary.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from fedgl_secure.consortium.config import (
    ConsortiumConfig,
    NodeEntry,
    NodeRole,
    PkiLayout,
    load_consortium,
    load_node_config,
)
from fedgl_secure.data.bank_synth import synthesize_banks, synthetic_bank_schema
from fedgl_secure.errors import ConfigError, FedGLError
from fedgl_secure.methods import apply_in_method_policy
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services.node_launcher import LaunchedNode, NodeLauncher, preloaded_modules
from fedgl_secure.services.pki import provision

if TYPE_CHECKING:
    from fedgl_secure.data.sources.bank_data import BankData

GRACE_SECONDS = 15.0


class NodeFailed(FedGLError):
    """A node process exited while the consortium was running."""


@dataclass
class NodeProcess:
    name: str
    role: NodeRole
    log_path: Path
    process: subprocess.Popen | LaunchedNode

    def alive(self) -> bool:
        return self.process.poll() is None


def node_command(config: Path) -> list[str]:
    """The command that starts one node (the same one an operator would type)."""
    return [sys.executable, "-m", "fedgl_secure", "node", "start", "--config", str(config)]


# Threads per node process when every node of a consortium shares one machine (the demo, tests): five
# processes with one OpenMP pool per core each oversubscribe a small host, and torch's spinning workers
# then make a 400-node GCN step ~100x slower (0.10 s against 0.001 s measured on 2 loaded cores).
# A user's own OMP_NUM_THREADS wins; nodes started on their own machines are not affected.
SHARED_HOST_THREADS = "1"


def start_node_process(
    config: Path, log_path: Path, env: dict[str, str] | None = None, launcher: NodeLauncher | None = None
) -> subprocess.Popen | LaunchedNode:
    """One node as its own process, logging to ``log_path``; on a host shared with the other nodes.

    With ``launcher``, forked from its server of preloaded modules (``services/node_launcher.py``), else a fresh
    interpreter."""
    environment = {"OMP_NUM_THREADS": SHARED_HOST_THREADS, **os.environ, **(env or {})}
    if launcher is not None:
        return launcher.start(config, log_path, environment)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            node_command(config),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # Ctrl-C reaches the orchestrator only; it stops the nodes itself
        )


def stop_processes(processes: list[NodeProcess], grace: float = GRACE_SECONDS, resume: bool = False) -> None:
    """SIGTERM every live process (in the order given: banks first), then SIGKILL whatever is left after
    ``grace``. With ``resume`` each gets SIGCONT first, so a process paused with SIGSTOP (fault tests)
    handles its SIGTERM instead of waiting out the grace period."""
    for node in processes:
        if node.alive():
            if resume:
                node.process.send_signal(signal.SIGCONT)
            node.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for node in processes:
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()


def ensure_demo_secrets(consortium: ConsortiumConfig, consortium_dir: Path) -> None:
    """Provision keys and the key authority's and banks' operator secrets if this demo has none yet.

    Never replaces anything that exists: provisioning keeps existing keys, and an existing
    operator secret file is left alone (it seals that node's share of the CKKS key).
    """
    if not PkiLayout(consortium.pki_dir).ca_cert.exists():
        provision(consortium)
    ka_config, _ = load_node_config(consortium_dir / f"{consortium.key_authority.name}.toml")
    sections = [ka_config.key_authority]
    for bank in consortium.banks:
        bank_file = consortium_dir / f"{bank.name}.toml"
        if bank_file.exists():
            sections.append(load_node_config(bank_file)[0].bank)
    for section in sections:  # each node's own secret: it seals that node's key share
        secret_file = section.operator_secret_file
        if secret_file is not None and not secret_file.exists() and not os.environ.get(section.operator_secret_env):
            secret_file.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(32) + "\n")


@dataclass
class AggregatorLog:
    """Follows the aggregator's JSON log for round events."""

    path: Path
    offset: int = 0
    events: list[dict] = field(default_factory=list)

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete, _, _rest = data.rpartition(b"\n")
        if not complete:
            return []
        self.offset += len(complete) + 1
        new = []
        for line in complete.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("event", "")).startswith(
                ("round.", "rounds.", "index.", "bank.withdrew", "prior.round_fitted")
            ):
                new.append(record)
        self.events.extend(new)
        return new


def check_node_configs_belong(consortium_path: Path, configs: dict[str, Path]) -> None:
    """Refuse node configs that name another consortium file than the one being started.

    ``consortium up`` finds each node's config next to the consortium file; a config copied from
    another consortium would otherwise start that consortium's nodes (its policy, keys and state).
    """
    expected = consortium_path.resolve()
    named = {path: load_node_config(path)[0].consortium for path in configs.values()}
    strangers = {path: other for path, other in named.items() if other.resolve() != expected}
    if strangers:
        listed = ", ".join(f"{path} names {other}" for path, other in strangers.items())
        raise ConfigError(
            f"node configs next to {consortium_path} belong to another consortium ({listed}); "
            "give every consortium its own directory with its own node configs"
        )


def node_config_paths(consortium_path: Path, nodes: Sequence[NodeEntry]) -> dict[str, Path]:
    """Each node's file, ``<name>.toml`` next to the consortium file, checked to exist and to name this consortium."""
    consortium_dir = Path(consortium_path).resolve().parent
    configs = {node.name: consortium_dir / f"{node.name}.toml" for node in nodes}
    missing = [str(path) for path in configs.values() if not path.is_file()]
    if missing:
        raise ConfigError(f"node configs missing next to {consortium_path}: {missing}")
    check_node_configs_belong(Path(consortium_path), configs)
    return configs


def consortium_bank_graphs(consortium_path: str | Path) -> tuple[ConsortiumConfig, list[BankData]]:
    """Every bank's graph, read as each bank node reads it (its own tables, or its benchmark slice), in
    the consortium's bank order: the in-process simulation of the same consortium
    (``fedgl-secure simulate --consortium``) and the consortium itself start from the same data."""
    from fedgl_secure.consortium.bank_data import bank_graph  # torch and the data readers: only when needed

    consortium = load_consortium(consortium_path)
    configs = node_config_paths(Path(consortium_path), consortium.banks)
    banks = []
    for node in consortium.banks:
        config, _ = load_node_config(configs[node.name])
        banks.append(bank_graph(config, consortium))
    return consortium, banks


def ensure_generated_bank_data(consortium: ConsortiumConfig, echo: Callable[[str], None] = print) -> None:
    """Demo consortia (``[generate]``): write the banks' synthetic tables on first use (Parquet and SQLite,
    same rows); an existing complete output of the same parameters is kept, anything else is refused."""
    spec = consortium.generate
    if spec is None:
        return
    if consortium.feature_schema != synthetic_bank_schema():
        raise ConfigError(
            f"{consortium.source}: [generate] writes the synthetic banks' tables, whose schema differs from this "
            "consortium's [schema]; copy the schema that `fedgl-secure data synth` writes (schema.toml)"
        )
    banks = len(consortium.banks)
    for out, fmt in ((spec.out, "parquet"), (spec.out / "sqlite", "sqlite")):
        summary = synthesize_banks(out, banks=banks, customers=spec.customers, seed=spec.seed, fmt=fmt)
        if not summary.already_there:
            echo(f"generated {banks} banks x {spec.customers} customers ({fmt}) in {out}")


def consortium_up(
    consortium_path: str | Path,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    timeout: float | None = None,
    run_dir: str | Path | None = None,
) -> dict:
    """Run the whole consortium until the federation finishes (or Ctrl-C); returns a summary.

    With ``run_dir``, a finished federation's run directory (for ``fedgl-secure audit``) is written
    there once every node has stopped.
    """
    consortium_path = Path(consortium_path)
    consortium = load_consortium(consortium_path)
    consortium_dir = consortium_path.resolve().parent
    order = [consortium.key_authority, consortium.aggregator, *consortium.banks]
    configs = node_config_paths(consortium_path, order)
    ensure_generated_bank_data(consortium, echo)
    ensure_demo_secrets(consortium, consortium_dir)
    logs = consortium.state_root / "logs"
    processes: list[NodeProcess] = []
    aggregator_log = AggregatorLog(logs / f"{consortium.aggregator.name}.log")
    if aggregator_log.path.exists():
        aggregator_log.offset = aggregator_log.path.stat().st_size  # only this run's events
    policy = load_policy(consortium.policy)
    # every node on this host: the nodes' code is imported once per host, not once per node
    launcher = NodeLauncher(preloaded_modules(policy))
    config = consortium.experiment_config()
    max_rounds = apply_in_method_policy(config, policy).federation.max_rounds
    bar = tqdm(total=max_rounds, desc=consortium.federation, unit="round", disable=not progress)
    started = time.monotonic()
    summary: dict = {"federation": consortium.federation, "logs": str(logs)}
    try:
        for node in order:
            process = start_node_process(configs[node.name], logs / f"{node.name}.log", launcher=launcher)
            processes.append(NodeProcess(node.name, node.role, logs / f"{node.name}.log", process))
        echo(f"started {len(processes)} nodes; logs in {logs}")
        applied = 0
        while True:
            for event in aggregator_log.poll():
                name = event.get("event")
                if name == "round.applied":
                    applied += 1
                    bar.update(1)
                    bar.set_postfix(round=event.get("round"), banks=len(event.get("contributors", [])))
                elif name == "prior.round_fitted":  # the label prior's rounds, before training round 1
                    summary["prior_rounds"] = summary.get("prior_rounds", 0) + 1
                    bar.set_postfix(label_prior=f"{event.get('step')}/{event.get('steps')}", round=event.get("round"))
                elif name in ("round.aborted", "round.timed_out_banks", "round.abandoned"):
                    bar.write(f"round {event.get('round')}: {name.split('.')[1]} {event.get('missing', '')}")
                elif name == "bank.withdrew":
                    bar.write(f"{event.get('bank')} withdrew at round {event.get('round')}: {event.get('reason')}")
                elif name == "rounds.finished":
                    summary["finished"] = True
                    if event.get("stopped_reason"):
                        summary["stopped_reason"] = event["stopped_reason"]
            dead = [node for node in processes if not node.alive() and node.role is not NodeRole.BANK]
            if dead:
                raise NodeFailed(
                    f"{dead[0].name} exited with code {dead[0].process.returncode}; see {dead[0].log_path}"
                )
            banks_done = all(not node.alive() for node in processes if node.role is NodeRole.BANK)
            if summary.get("finished") and banks_done:
                break
            if timeout is not None and time.monotonic() - started > timeout:
                raise NodeFailed(f"the federation did not finish within {timeout:.0f} s; see {logs}")
            time.sleep(0.2)
        summary["rounds_applied"] = applied
        summary["wall_seconds"] = round(time.monotonic() - started, 2)
        summary["round_seconds"] = [
            e.get("seconds") for e in aggregator_log.events if e.get("event") == "round.applied"
        ]
    except KeyboardInterrupt:
        bar.write("interrupted: stopping every node")
        summary["interrupted"] = True
    finally:
        bar.close()
        stop_processes(list(reversed(processes)))
        launcher.close()
    summary["exit_codes"] = {node.name: node.process.returncode for node in processes}
    if summary.get("stopped_reason"):
        echo(f"the federation stopped early: {summary['stopped_reason']}")
    if run_dir is not None and summary.get("finished"):
        from fedgl_secure.services.run_export import collect_consortium_run  # torch: only once the run is over

        summary["run_dir"] = str(collect_consortium_run(consortium, run_dir))
        echo(f"run directory written to {summary['run_dir']}")
    return summary
