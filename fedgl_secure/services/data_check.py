"""``fedgl-secure data check``: what a bank would contribute, checked locally before it joins a federation.

A bank's operator points the command at the bank's node file; it reads the consortium file the node
names, reads the bank's own tables exactly as the bank node will (same schema, same seed, same
validation) and prints counts only — customers, labelled customers per class, split sizes,
transactions kept, dropped and merged, degree summary, feature width. Nothing is contacted (no TLS,
no aggregator, no key authority) and nothing is written (a SQLite database is opened read-only).
"""

from __future__ import annotations

from pathlib import Path

from fedgl_secure.consortium.config import NodeRole, load_node_config
from fedgl_secure.data.sources.bank_data import BankData, SourceSummary
from fedgl_secure.data.sources.bank_graph import load_bank_data
from fedgl_secure.errors import ConfigError


def check_bank_data(config: str | Path) -> BankData:
    """Load the bank of node file ``config`` as its node would (raises ConfigError/DataSourceError)."""
    node, consortium = load_node_config(config)
    if node.role is not NodeRole.BANK:
        raise ConfigError(f"{config}: role {node.role.value!r}; only a bank has customer data to check")
    if not consortium.bank_sources or consortium.feature_schema is None:
        raise ConfigError(
            f"{node.consortium}: data = {consortium.data!r}; banks read their own tables only with "
            "data = 'bank-sources' (and a [schema]), so there is nothing of this bank's to check"
        )
    if node.bank.data is None:  # load_node_config refuses this already; kept for type checkers
        raise ConfigError(f"{config}: bank.data: declare the bank's customers and transactions in [bank.data]")
    # the seed the bank node splits with: the consortium's experiment seed (validated when the file was loaded)
    seed = consortium.experiment_config().seed
    return load_bank_data(node.bank.data, consortium.feature_schema, name=node.name, seed=seed)


def _counts(values: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in values.items())


def render_text(summary: SourceSummary) -> str:
    """The summary as aligned lines for a person."""
    degree = summary.degree
    lines = [
        f"{summary.bank}: the tables match the consortium's schema (nothing was sent or written)",
        f"customers      {summary.customers}  ({summary.customers_source})",
        f"features       {summary.feature_width} columns after encoding",
        f"labelled       {_counts(summary.labelled)}; unlabelled {summary.unlabelled}",
        f"split          {_counts(summary.split)}",
        f"transactions   {summary.transactions_read} read ({summary.transactions_source})",
        f"edges          {summary.edges_kept} kept (undirected); {summary.repeats_merged} repeated transfers merged; "
        f"{summary.dropped_unknown_customer} dropped (an end is not a customer of this bank)",
        f"degree         min {degree.min}, median {degree.median:g}, mean {degree.mean:g}, max {degree.max}; "
        f"{degree.isolated} customers without transactions",
    ]
    if summary.amount_range is not None:
        lines.append(f"amounts        {summary.amount_range[0]:g} .. {summary.amount_range[1]:g}")
    if summary.time_range is not None:
        lines.append(f"time           {summary.time_range[0]} .. {summary.time_range[1]}")
    lines.append(f"read in        {summary.seconds:.2f} s")
    return "\n".join(lines)
