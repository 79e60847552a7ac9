"""Nodes of one host started from a fork server that imported their code once.

Every node process imports torch, TenSEAL, FastAPI and the package before it serves: 5.3 s of CPU for a bank on
an idle 2-core host (``python -c "import fedgl_secure.services.bank"``), ~20 s for the five nodes of a consortium,
as long as three rounds of a small one. When all nodes run on one machine (``consortium up``: the demo, tests),
they are forked from one server process (``multiprocessing``'s ``forkserver``) that imported those modules and
nothing else: each node is still its own process, in its own session, with its own log and environment, running
the same ``fedgl-secure node start --config <file>`` command as an operator would type, and it pays for its
imports once per host instead of once per node.

What a fork shares with its siblings is only what the server holds after its imports: no key, secret or
configuration is read before the fork. Generators seeded at import are reseeded in each node (Python's
``random`` does so itself; numpy's legacy global generator here) so that no two nodes draw the same stream,
although no code of the package draws from either.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing import forkserver
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedgl_secure.policy.schema import Policy

# What ``fedgl-secure node start`` imports for its role (services/node.py) and the command itself: the server imports
# them once; a node of any role then starts with them loaded.
PRELOADED_MODULES = (
    "fedgl_secure.services.commands",
    "fedgl_secure.services.key_authority_service",
    "fedgl_secure.services.aggregator_service",
    "fedgl_secure.services.bank",
    "httpcore",  # httpx imports it at a client's first transport: every node is a client of another
)
# Opacus' accountants: 3.2 s of CPU to import, which a node pays at its first privacy account (a bank's budget, GAP's
# or the class sums' calibration) — only under a policy that spends a budget, so preloaded only then.
PRIVACY_ACCOUNTING_MODULES = ("opacus.accountants", "opacus.accountants.analysis.rdp")


def preloaded_modules(policy: Policy) -> tuple[str, ...]:
    """What the nodes of a consortium under ``policy`` will import: the server imports it once for all of them."""
    accounts = policy.budget is not None or policy.has_dp
    return PRELOADED_MODULES + (PRIVACY_ACCOUNTING_MODULES if accounts else ())


def run_node_in_child(config: str, log_path: str, environment: Mapping[str, str]) -> None:
    """A forked node's life: its own session, its log on stdout and stderr, its environment, then the node command.

    Runs in the child only (the target of :meth:`NodeLauncher.start`)."""
    os.setsid()  # as ``start_new_session``: Ctrl-C at the orchestrator's terminal reaches the orchestrator only
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, sys.stdout.fileno())
    os.dup2(log, sys.stderr.fileno())
    os.close(log)
    os.environ.clear()
    os.environ.update(environment)
    threads = environment.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # the pool size was read at the server's import
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # from the OS's entropy, as a fresh interpreter's
    import typer

    from fedgl_secure.services.commands import node_start

    try:
        node_start(Path(config))  # the command ``fedgl-secure node start --config <config>`` runs
    except typer.Exit as stop:  # a bad config: the command's one ``error:`` line is on stderr already
        sys.exit(stop.exit_code)


class LaunchedNode:
    """A forked node behind the part of :class:`subprocess.Popen`'s interface that the orchestrator uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._process = process
        self.args = args

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status; ``-N`` after signal ``N`` (as Popen's)."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            try:
                os.kill(self._process.pid, sig)
            except ProcessLookupError:  # exited since: as Popen, nothing to signal
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class NodeLauncher:
    """Starts the nodes of one host from a fork server (started by the first :meth:`start`)."""

    def __init__(self, preload: tuple[str, ...] = PRELOADED_MODULES) -> None:
        self._context = multiprocessing.get_context("forkserver")
        # the server is one per process: the first preload set wins; a server already running without it still
        # starts correct nodes, which then import their modules themselves
        self._context.set_forkserver_preload(list(preload))
        # a server running already belongs to whoever started it (another launcher of this process): closing this
        # launcher leaves it to them, so that it need not import its modules again for their next node
        self._owns_server = getattr(forkserver._forkserver, "_forkserver_pid", None) is None

    def close(self) -> None:
        """Stop the fork server this launcher started, once its nodes have exited, so that it is reaped (with the
        CPU its children used, in the caller's accounting) rather than left to exit when its parent does. A process
        that starts nodes again later starts a new server."""
        stop = getattr(forkserver._forkserver, "_stop", None)  # CPython's own way to stop it (3.8+); else it ends
        if stop is not None and self._owns_server:  # with this process, as it would anyway
            stop()

    def start(self, config: Path, log_path: Path, environment: Mapping[str, str]) -> LaunchedNode:
        """Node ``config`` in a new process, logging to ``log_path``, with exactly ``environment``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process = self._context.Process(
            target=run_node_in_child,
            args=(str(config), str(log_path), dict(environment)),
            name=f"fedgl-node:{config.stem}",
        )
        process.start()
        return LaunchedNode(process, ["fedgl-secure", "node", "start", "--config", str(config)])
