"""Nodes forked from the launcher's server of preloaded modules behave as nodes started as fresh interpreters:
their own process and session, the environment given, the command's exit codes, and the log file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from multiprocessing import forkserver

import pytest
from consortium_harness import NODE_SECRETS, write_consortium

from fedgl_secure.services.node_launcher import NodeLauncher


def test_a_node_with_a_bad_config_exits_2_naming_the_file_in_its_log(tmp_path):
    log = tmp_path / "logs" / "bank-z.log"
    node = NodeLauncher().start(tmp_path / "bank-z.toml", log, {"PATH": os.environ.get("PATH", "")})
    assert node.wait(timeout=120) == 2 and node.returncode == 2
    assert "error:" in log.read_text() and "bank-z.toml" in log.read_text()


def start_key_authority(consortium, environment: dict[str, str]):
    """The consortium's key authority forked with exactly ``environment``, once it serves."""
    node = consortium.launcher.start(
        consortium.config_path("key-authority"), consortium.log_path("key-authority"), environment
    )
    consortium.processes["key-authority"] = node
    try:
        consortium.wait_healthy("key-authority")
    except BaseException:
        node.kill()
        raise
    return node


def test_a_forked_key_authority_serves_in_its_own_session_and_stops_cleanly_on_sigterm(tmp_path):
    # the operator secret reaches the node through the environment given, or it refuses to start
    environment = {"PATH": os.environ.get("PATH", ""), **NODE_SECRETS, "OMP_NUM_THREADS": "1"}
    node = start_key_authority(write_consortium(tmp_path), environment)
    try:
        assert node.pid != os.getpid() and os.getsid(node.pid) == node.pid  # a session of its own
        assert node.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            node.wait(timeout=0.1)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0
    finally:
        node.kill()


def test_a_killed_node_reports_the_signal_as_popen_does(tmp_path):
    node = start_key_authority(write_consortium(tmp_path), {"PATH": os.environ.get("PATH", ""), **NODE_SECRETS})
    node.kill()
    assert node.wait(timeout=60) == -signal.SIGKILL
    node.kill()  # a second signal to an ended node is nothing, as Popen's


def test_closing_a_launcher_stops_only_the_server_it_started(tmp_path):
    """``consortium up`` closes its launcher at its end: a server another launcher of the process started (the tests'
    consortia) keeps serving, so that its next node does not wait for a new server to import everything again."""
    forkserver._forkserver._stop()  # whatever earlier tests of this process left: the first launcher below starts one
    environment = {"PATH": os.environ.get("PATH", "")}
    first = NodeLauncher()
    assert first.start(tmp_path / "bank-y.toml", tmp_path / "y.log", environment).wait(timeout=120) == 2
    server = forkserver._forkserver._forkserver_pid
    second = NodeLauncher()
    assert second.start(tmp_path / "bank-z.toml", tmp_path / "z.log", environment).wait(timeout=120) == 2
    second.close()
    assert forkserver._forkserver._forkserver_pid == server
    os.kill(server, 0)  # still running
    first.close()
    assert forkserver._forkserver._forkserver_pid is None
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(server, 0)
            time.sleep(0.1)
