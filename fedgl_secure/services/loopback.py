"""A throw-away consortium on 127.0.0.1 (free ports, fresh keys) for tests and benchmarks.

Writes ``policy.toml``, ``consortium.toml`` and one ``<node>.toml`` per node under a directory
and provisions the keys, so ``consortium up`` or individual ``node start`` commands can run it.
"""

from __future__ import annotations

import random
import socket
from itertools import islice
from pathlib import Path

import tomli_w

from fedgl_secure.consortium.config import load_consortium
from fedgl_secure.policy.he import HEParameters
from fedgl_secure.services.pki import provision

KEY_AUTHORITY, AGGREGATOR = "key-authority", "aggregator"


# Below the ephemeral range: outgoing connections take their local ports from that range, so a port picked there
# (as binding to port 0 does) can be taken by any client's connection before the node binds it, seconds later.
PORT_SPAN = 12_000
DEFAULT_EPHEMERAL_LOW = 32_768  # Linux's default; macOS and Windows start higher


def ephemeral_port_low(range_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the OS hands to outgoing connections (Linux's setting, else its default)."""
    try:
        return int(range_file.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def free_ports(count: int, low: int | None = None, span: int = PORT_SPAN) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now, drawn at random from the ``span`` ports below the
    ephemeral range (``low``: its lowest port; the OS's by default), where no outgoing connection takes them in
    the meantime. Raises OSError when that many free ports are not found there."""
    top = ephemeral_port_low() if low is None else low
    bottom = max(1024, top - span)
    if top - bottom < count:
        raise ValueError(f"only {top - bottom} ports below the ephemeral range starting at {top}")
    candidates = list(range(bottom, top))
    random.SystemRandom().shuffle(candidates)  # parallel test workers rarely draw the same ones
    chosen = list(islice((port for port in candidates if port_binds(port)), count))  # binds until count are found
    if len(chosen) < count:
        raise OSError(f"found {len(chosen)} of {count} free ports in {bottom}–{top - 1} on 127.0.0.1")
    return chosen


def port_binds(port: int) -> bool:
    """Whether a socket can bind ``port`` on 127.0.0.1 now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def write_loopback_consortium(
    root: Path,
    *,
    banks: tuple[str, ...] = ("bank-a", "bank-b", "bank-c"),
    experiment: dict | None = None,
    he: HEParameters | None = None,
    upload_seconds: float = 60.0,
    liveness_seconds: float = 5.0,
    data_root: str | None = None,
    federation: str = "loopback",
    policy_extra: dict | None = None,
    schema: dict | None = None,
    bank_data: dict[str, dict] | None = None,
) -> Path:
    """Write and provision a consortium under ``root``; returns the path of ``consortium.toml``.

    ``experiment`` is the ``[experiment]`` table (dataset, method, seed, federation options...);
    the default is three synthetic banks (benchmark slices). With ``schema`` (the ``[schema]`` table)
    and ``bank_data`` (each bank's ``[bank.data]`` table), the banks read their own tables instead
    (``data = "bank-sources"``). ``he`` defaults to the baseline policy's parameters.
    ``policy_extra`` adds to the policy, as the parsed TOML would read: top-level keys such as
    ``{"allowed_kinds": [...]}`` and tables such as ``{"dp": {"weights": {...}}, "budget": {...}}``
    (a table merges into the default one of the same name, key by key).
    """
    root.mkdir(parents=True, exist_ok=True)
    he = he or HEParameters()
    policy = {
        "description": "loopback consortium",
        "quorum": 3,
        "he": he.model_dump(mode="json"),  # every field, packing and precision included
        "timeouts": {"round_seconds": max(upload_seconds, 60.0), "upload_seconds": upload_seconds},
    }
    (root / "policy.toml").write_text(tomli_w.dumps(_merged(policy, policy_extra or {})))
    roles = {KEY_AUTHORITY: KEY_AUTHORITY, AGGREGATOR: AGGREGATOR, **{bank: "bank" for bank in banks}}
    ports = free_ports(len(roles))
    consortium: dict = {
        "federation": federation,
        "policy": "policy.toml",
        "pki_dir": "pki",
        "state_root": "state",
        "nodes": [
            {"name": name, "role": role, "port": port} for (name, role), port in zip(roles.items(), ports, strict=True)
        ],
    }
    if schema is None:
        consortium["experiment"] = experiment or {
            "dataset": "synthetic",
            "federation": {"proportions": [0.5, 0.6, 0.7][: len(banks)]},
        }
    else:
        consortium.update(data="bank-sources", experiment=experiment or {}, schema=schema)
    (root / "consortium.toml").write_text(tomli_w.dumps(consortium))
    for name, role in roles.items():
        node: dict = {"name": name, "role": role, "consortium": "consortium.toml", "log_level": "info"}
        if role == AGGREGATOR:
            node["aggregator"] = {"liveness_seconds": liveness_seconds}
        if role == "bank":
            node["bank"] = {"poll_seconds": 0.1}
            if data_root:
                node["bank"]["data_root"] = data_root
            if bank_data is not None:
                node["bank"]["data"] = bank_data[name]
        (root / f"{name}.toml").write_text(tomli_w.dumps(node))
    path = root / "consortium.toml"
    provision(load_consortium(path))
    return path


def _merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` laid over it, tables merged recursively."""
    merged = dict(base)
    for key, value in extra.items():
        both_tables = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merged(merged[key], value) if both_tables else value
    return merged
