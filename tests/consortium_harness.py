"""A real consortium on 127.0.0.1 for tests: provisioned keys, free ports, one process per node."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fedgl_secure.consortium.config import NodeRole, PkiLayout, load_consortium
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.log import get_logger
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services.bank_keys import ensure_key_share
from fedgl_secure.services.key_authority_service import KeyAuthorityClient
from fedgl_secure.services.loopback import write_loopback_consortium
from fedgl_secure.services.node_launcher import (
    PRELOADED_MODULES,
    PRIVACY_ACCOUNTING_MODULES,
    LaunchedNode,
    NodeLauncher,
)
from fedgl_secure.services.orchestrate import NodeProcess, consortium_up, start_node_process, stop_processes
from fedgl_secure.services.pki import load_signing_key, load_signing_public_keys
from fedgl_secure.services.tls import make_http_client

BANKS = ("bank-a", "bank-b", "bank-c")
NODES = ("key-authority", "aggregator", *BANKS)

# Small but 128-bit-secure CKKS parameters: N = 4096, 109 of 109 bits (two data primes: room for the noise flooding).
# Packed (the default), with room for the synthetic banks' weights over 40 rounds (ŵ_k·W reached -2.34, beyond
# the baseline's ±2.25 tuned on Cora): 2 weights per slot instead of 3.
SMALL_HE = HEParameters(
    poly_modulus_degree=4096,
    coeff_mod_bit_sizes=(36, 36, 37),
    global_scale_bits=62,
    max_decryptions=512,  # a short run's query budget: the decryption's flooding shrinks with it (45x below 2^20)
    precision={"weights": {"lower": -8.0, "upper": 8.0, "step_bits": 7}},
)

# One float per slot, for tests that compare a consortium with the plaintext simulation at 1e-4 (packed terms
# round to their steps).
UNPACKED_HE = SMALL_HE.model_copy(update={"packing": "none"})

KA_SECRET = "test-operator-secret-0123456789"
"""The key authority's operator secret (``FEDGL_KA_SECRET``) every process the harness starts gets."""
BANK_SECRET = "test-bank-operator-secret-98765"
"""The banks' operator secret (``FEDGL_BANK_SECRET``): it seals each bank's share of the CKKS key."""
NODE_SECRETS = {"FEDGL_KA_SECRET": KA_SECRET, "FEDGL_BANK_SECRET": BANK_SECRET}
STOP_GRACE_SECONDS = 20.0


@dataclass
class LocalConsortium:
    root: Path
    max_rounds: int
    processes: dict[str, subprocess.Popen | LaunchedNode] = field(default_factory=dict)
    # one fork server per test process, whatever the consortium: most consortia here account privacy, and one
    # declares a PyG model (test_pyg_consortium.py), which each of its five nodes would import (3.3 s of CPU) when
    # it validates the experiment
    launcher: NodeLauncher = field(
        default_factory=lambda: NodeLauncher(PRELOADED_MODULES + PRIVACY_ACCOUNTING_MODULES + ("torch_geometric",))
    )

    @property
    def consortium_path(self) -> Path:
        return self.root / "consortium.toml"

    @property
    def layout(self) -> PkiLayout:
        return PkiLayout(self.root / "pki")

    def config_path(self, name: str) -> Path:
        return self.root / f"{name}.toml"

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def url(self, name: str) -> str:
        return load_consortium(self.consortium_path).node(name).url

    def start(self, *names: str) -> None:
        for name in names:
            self.processes[name] = start_node_process(
                self.config_path(name), self.log_path(name), env=dict(NODE_SECRETS), launcher=self.launcher
            )

    def run_key_ceremony(self) -> None:
        """Every bank's side of the key ceremony against the running key authority, from this process, as each bank
        node would run it (its certificate, signing key and operator secret; its sealed share written to its state
        directory): for tests that start a few nodes only, since the aggregator waits for the collective context."""
        consortium = load_consortium(self.consortium_path)
        policy = load_policy(consortium.policy)
        banks = tuple(bank.name for bank in consortium.banks)
        roster = Roster(consortium.federation, banks, policy.he.threshold, policy.digest)
        verify_keys = load_signing_public_keys(self.layout, banks)

        def ceremony(bank: str) -> None:
            with make_http_client(
                self.layout, bank, consortium.key_authority.url, expect_role=NodeRole.KEY_AUTHORITY
            ) as http:
                ensure_key_share(
                    consortium.state_dir(bank),
                    roster,
                    bank,
                    policy.he,
                    BANK_SECRET.encode(),
                    KeyAuthorityClient(http),
                    load_signing_key(self.layout, bank),
                    verify_keys,
                    get_logger(node=bank, role="bank"),
                    timeout=60.0,
                )

        with ThreadPoolExecutor(len(banks)) as pool:
            list(pool.map(ceremony, banks))

    def signal(self, name: str, sig: int) -> None:
        self.processes[name].send_signal(sig)

    def kill(self, name: str) -> None:
        self.processes[name].kill()
        self.processes[name].wait(timeout=30)

    def stop_all(self) -> None:
        """Stop every node, banks first; a node paused with SIGSTOP is resumed so it can stop cleanly."""
        roles = {node.name: node.role for node in load_consortium(self.consortium_path).nodes}
        nodes = [
            NodeProcess(name, roles[name], self.log_path(name), process) for name, process in self.processes.items()
        ]
        stop_processes(list(reversed(nodes)), grace=STOP_GRACE_SECONDS, resume=True)

    def client(self, as_node: str, target: str, **kwargs) -> httpx.Client:
        return make_http_client(self.layout, as_node, self.url(target), **kwargs)

    def logs(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def events(self, name: str, event: str | None = None) -> list[dict]:
        """The node's structlog records (only those named ``event`` if given); uvicorn's own plain-text lines
        (e.g. its shutdown messages) are skipped."""
        records = [json.loads(line) for line in self.logs(name).splitlines() if line.startswith("{")]
        return [record for record in records if event is None or record.get("event") == event]

    def status(self) -> dict | None:
        try:
            with self.client("key-authority", "aggregator", timeout=5) as http:
                response = http.get("/v1/status")
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def wait_for(self, predicate, what: str, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if name in ("key-authority", "aggregator") and process.poll() is not None:
                    raise AssertionError(f"{name} exited ({process.returncode}):\n{self.logs(name)[-3000:]}")
            status = self.status()
            if status is not None and predicate(status):
                return status
            time.sleep(0.3)
        raise AssertionError(
            f"timed out waiting for {what}; last status {json.dumps(self.status())[:2000]}\n"
            f"aggregator log tail:\n{self.logs('aggregator')[-3000:]}"
        )

    def wait_healthy(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise AssertionError(f"{name} exited:\n{self.logs(name)[-3000:]}")
            try:
                with self.client("aggregator" if name != "aggregator" else "key-authority", name, timeout=2) as http:
                    if http.get("/v1/health").status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{name} not healthy in {timeout} s:\n{self.logs(name)[-3000:]}")


def write_consortium(
    root: Path,
    *,
    max_rounds: int = 3,
    upload_seconds: float = 60.0,
    liveness_seconds: float = 5.0,
    seed: int = 0,
    patience: int | None = None,
    method: str = "fedgl",
    policy_extra: dict | None = None,
    he: HEParameters = SMALL_HE,
    experiment_extra: dict | None = None,
    banks: tuple[str, ...] = BANKS,
) -> LocalConsortium:
    """Three synthetic banks with small (still 128-bit) CKKS parameters, keys provisioned.

    ``policy_extra`` adds to the policy (see ``write_loopback_consortium``), e.g. DP channels and a budget;
    ``he`` the HE parameters (packed by default, as the baseline policy); ``experiment_extra`` more sections
    of the experiment (e.g. ``{"graphfl": {"inner_steps": 3}}``); ``banks`` fewer banks (the first of
    :data:`BANKS`) for a faster test.
    """
    experiment = {
        "dataset": "synthetic",
        "method": method,
        "seed": seed,
        "device": "cpu",
        "federation": {
            "proportions": [0.5, 0.6, 0.7][: len(banks)],
            "max_rounds": max_rounds,
            "patience": patience or max_rounds + 10,
        },
        **(experiment_extra or {}),
    }
    write_loopback_consortium(
        root,
        banks=banks,
        experiment=experiment,
        he=he,
        upload_seconds=upload_seconds,
        liveness_seconds=liveness_seconds,
        federation="test-federation",
        policy_extra=policy_extra,
    )
    return LocalConsortium(root, max_rounds)


def run_consortium_to_the_end(consortium: LocalConsortium, rounds: int, timeout: float = 240) -> dict:
    """``consortium up`` with the test operator secret; asserts the federation finished after ``rounds`` rounds
    with no stop reason and every process exited 0, and returns the summary."""
    with pytest.MonkeyPatch.context() as patch:
        for variable, secret in NODE_SECRETS.items():
            patch.setenv(variable, secret)
        summary = consortium_up(consortium.consortium_path, progress=False, echo=lambda line: None, timeout=timeout)
    assert summary.get("finished") and summary["rounds_applied"] == rounds and not summary.get("stopped_reason")
    nodes = load_consortium(consortium.consortium_path).nodes
    assert summary["exit_codes"] == {node.name: 0 for node in nodes}
    return summary
