"""``fedgl-secure node start <node>.toml``: load a node's config and run the service its role names."""

from __future__ import annotations

from pathlib import Path

from fedgl_secure.consortium.config import NodeRole, load_node_config
from fedgl_secure.errors import FedGLError


def start_node(config_path: str | Path) -> None:
    """Run the node described by ``config_path`` until it is stopped (SIGINT/SIGTERM); blocking."""
    node, consortium = load_node_config(config_path)
    if node.role is NodeRole.KEY_AUTHORITY:
        # each role loads its own service only: the key authority never imports torch
        from fedgl_secure.services.key_authority_service import run_key_authority

        run_key_authority(node, consortium)
    elif node.role is NodeRole.AGGREGATOR:
        from fedgl_secure.services.aggregator_service import run_aggregator  # torch, for the server step

        run_aggregator(node, consortium)
    elif node.role is NodeRole.BANK:
        from fedgl_secure.services.bank import run_bank  # torch, for training

        run_bank(node, consortium)
    else:  # pragma: no cover - NodeRole is closed
        raise FedGLError(f"{config_path}: no service for role {node.role!r}")
