"""Typed configuration of a consortium and of its nodes (``services/*.toml``), validated at the edge.

``consortium.toml`` is the document every party shares: the federation id, the policy, where the
provisioned keys live, every node's name, role and address, and the experiment all banks and the
aggregator must agree on (dataset, model, FedGL options, rounds). Each ``<node>.toml`` names one
node of it and carries what only that node needs (its state directory, the key authority's
operator secret, a bank's slice of the data). Relative paths are resolved against the file
they appear in, so a consortium directory can be moved as a whole.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedgl_secure.data.sources.declaration import DataSource
from fedgl_secure.data.sources.schema import FeatureSchema
from fedgl_secure.engine.config import ExperimentConfig, build_config
from fedgl_secure.errors import ConfigError
from fedgl_secure.tomlio import format_validation_error, read_toml

NODE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


class NodeRole(str, Enum):
    KEY_AUTHORITY = "key-authority"
    AGGREGATOR = "aggregator"
    BANK = "bank"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


BANK_SOURCES = "bank-sources"
BENCHMARK_SLICES = "benchmark-slices"
# What a bank-sources experiment is called in run records, and its defaults: the schema encodes
# (standardises, one-hot) the features, so Kipf's row normalisation of bag-of-words is off; labels are
# imbalanced, so the loss weighs classes as if balanced — chosen on validation PR-AUC: 0.278 against
# 0.154 unweighted (3 generated banks x 2,000 customers, 40 rounds, `simulate --consortium`).
BANK_SOURCES_EXPERIMENT = {
    "dataset": BANK_SOURCES,
    "training": {"normalize_features": False, "class_weighting": "balanced"},
}


class NodeEntry(_Model):
    """One node of the consortium as everybody sees it: name, role and address."""

    name: str = Field(pattern=NODE_NAME_PATTERN)
    role: NodeRole
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


class CertificateAuthority(_Model):
    common_name: str = "fedgl-secure consortium CA"
    validity_days: int = Field(365, ge=1, le=3650)


class GeneratedBankData(_Model):
    """Demo consortia only (``[generate]``): seeded synthetic bank tables that ``consortium up`` writes with
    ``fedgl-secure data synth`` when they are missing — Parquet under ``out``, the same banks as SQLite
    databases under ``out/sqlite`` (for banks whose ``[bank.data]`` is a database). A real consortium has
    no such table: every bank brings its own data."""

    out: Path
    customers: int = Field(2000, ge=10)
    seed: int = Field(0, ge=0)


class ConsortiumConfig(_Model):
    """The shared description of one consortium (``services/consortium.toml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True)

    federation: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    policy: Path
    pki_dir: Path
    state_root: Path
    ca: CertificateAuthority = CertificateAuthority()
    nodes: tuple[NodeEntry, ...]
    data: Literal["bank-sources", "benchmark-slices"] = Field(
        BENCHMARK_SLICES,
        description="bank-sources: every bank reads its own customers ([bank.data] of its node file) against "
        "[schema]; benchmark-slices (research): bank k holds client slice k of experiment.dataset",
    )
    feature_schema: FeatureSchema | None = Field(None, alias="schema")
    generate: GeneratedBankData | None = None
    experiment: dict[str, Any] = Field(default_factory=dict)
    source: Path | None = None

    @model_validator(mode="after")
    def _one_authority_one_aggregator_banks(self) -> ConsortiumConfig:
        names = [node.name for node in self.nodes]
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"node names used twice: {duplicates}")
        addresses = [(node.host, node.port) for node in self.nodes]
        if duplicates := sorted({f"{h}:{p}" for h, p in addresses if addresses.count((h, p)) > 1}):
            raise ValueError(f"addresses used by two nodes: {duplicates}")
        roles = [node.role for node in self.nodes]
        for role in (NodeRole.KEY_AUTHORITY, NodeRole.AGGREGATOR):
            if roles.count(role) != 1:
                raise ValueError(f"a consortium has exactly one {role.value}; found {roles.count(role)}")
        banks = roles.count(NodeRole.BANK)
        if banks < 2:
            raise ValueError(f"a consortium needs at least 2 banks (a sum over one bank is its data); found {banks}")
        if self.generate is not None and self.data != BANK_SOURCES:
            raise ValueError("[generate] writes banks' own tables; it needs data = 'bank-sources'")
        if self.data == BANK_SOURCES:
            if self.feature_schema is None:
                raise ValueError(
                    "data = 'bank-sources' needs a [schema] table: the feature schema every bank's customers must match"
                )
            for key in ("dataset", "data_root"):
                if key in self.experiment and self.experiment[key] != BANK_SOURCES_EXPERIMENT.get(key):
                    raise ValueError(
                        f"experiment.{key}: with data = 'bank-sources' every bank reads its own tables; "
                        f"remove experiment.{key} (it names a benchmark dataset)"
                    )
            if "proportions" in self.experiment.get("federation", {}):
                raise ValueError(
                    "experiment.federation.proportions: with data = 'bank-sources' every bank brings all of its "
                    "own customers; proportions only slice a benchmark dataset (data = 'benchmark-slices')"
                )
            self.experiment_config()  # fails here, naming the field
            return self
        if self.feature_schema is not None:
            raise ValueError(
                "[schema] applies only with data = 'bank-sources'; benchmark slices have their own features"
            )
        federation = build_config(self.experiment).federation  # fails here, naming the field
        if federation.partition == "louvain":
            if federation.num_clients != banks:
                raise ValueError(
                    f"experiment.federation.num_clients is {federation.num_clients} for {banks} banks; "
                    "bank k (in [[nodes]] order) holds Louvain client k"
                )
            return self
        proportions = federation.proportions
        if len(proportions) != banks:
            raise ValueError(
                f"experiment.federation.proportions has {len(proportions)} entries for {banks} banks; "
                "bank k (in [[nodes]] order) holds client slice k, so give one proportion per bank"
            )
        return self

    def node(self, name: str) -> NodeEntry:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(
            f"{self.source or 'consortium'}: no node named {name!r}; nodes are {[n.name for n in self.nodes]}"
        )

    @property
    def key_authority(self) -> NodeEntry:
        return next(node for node in self.nodes if node.role is NodeRole.KEY_AUTHORITY)

    @property
    def aggregator(self) -> NodeEntry:
        return next(node for node in self.nodes if node.role is NodeRole.AGGREGATOR)

    @property
    def banks(self) -> tuple[NodeEntry, ...]:
        return tuple(node for node in self.nodes if node.role is NodeRole.BANK)

    @property
    def bank_sources(self) -> bool:
        """True when every bank reads its own customers (not a slice of a benchmark dataset)."""
        return self.data == BANK_SOURCES

    def experiment_config(self) -> ExperimentConfig:
        """The experiment every party runs (bank-sources: one client per bank, schema-encoded features;
        benchmark slices: bank k of ``banks`` holds client slice k)."""
        if not self.bank_sources:
            return build_config(self.experiment)
        values = {
            key: dict(value) if isinstance(value, dict) else value for key, value in BANK_SOURCES_EXPERIMENT.items()
        }
        for key, value in self.experiment.items():
            if isinstance(value, dict):
                values.setdefault(key, {}).update(value)
            else:
                values[key] = value
        federation = dict(values.get("federation", {}))
        federation["proportions"] = [1.0] * len(self.banks)  # each bank holds all of its own customers
        values["federation"] = federation
        schema = self.feature_schema
        evaluation = values.setdefault("evaluation", {})
        if schema.positive_index is not None:
            evaluation.setdefault("positive_class", schema.positive_index)
        if schema.positive_index is not None or schema.num_classes == 2:
            # banks' labels are imbalanced: the final model is the best by validation PR-AUC, not accuracy
            evaluation.setdefault("selection", "pr_auc")
        config = build_config(values)
        config.evaluation.check_classes(schema.num_classes)
        return config

    def state_dir(self, name: str) -> Path:
        return self.state_root / name


class KeyAuthoritySection(_Model):
    """Where the key authority's operator secret comes from (file wins over environment); it seals the key
    authority's share of the federation's CKKS key."""

    operator_secret_file: Path | None = None
    operator_secret_env: str = "FEDGL_KA_SECRET"


class PredictSection(_Model):
    """Where ``fedgl-secure predict`` writes the bank's scores by default (``--output``/``--table`` override)."""

    output: Path | None = Field(None, description="a .parquet or .csv file")
    table: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,126}$", description="a table of [bank.data]'s database"
    )

    @model_validator(mode="after")
    def _one_target(self) -> PredictSection:
        if self.output is not None and self.table is not None:
            raise ValueError("give at most one of output and table")
        return self


class BankSection(_Model):
    """A bank's own data: its customer tables (``[bank.data]``), or for benchmark slices the data root."""

    data: DataSource | None = None
    predict: PredictSection = PredictSection()
    data_root: Path | None = Field(None, description="benchmark-slices only: the directory holding <dataset>/raw/")
    poll_seconds: float = Field(0.2, gt=0, le=60)
    # the operator secret that seals the bank's Shamir share of the federation's CKKS key (file wins over environment)
    operator_secret_file: Path | None = None
    operator_secret_env: str = "FEDGL_BANK_SECRET"


class AggregatorSection(_Model):
    """How long a bank may stay silent before it is left out of the next round."""

    liveness_seconds: float = Field(5.0, gt=0)


class NodeConfig(_Model):
    """One node's own file (``services/<node>.toml``).

    :func:`load_node_config` fills ``state_dir`` (default: the consortium's ``state_root/<name>``).
    """

    name: str = Field(pattern=NODE_NAME_PATTERN)
    role: NodeRole
    consortium: Path
    state_dir: Path | None = None
    log_level: str = "info"
    key_authority: KeyAuthoritySection = KeyAuthoritySection()
    bank: BankSection = BankSection()
    aggregator: AggregatorSection = AggregatorSection()
    source: Path | None = None


class PkiLayout:
    """Where provisioning puts every file under ``pki_dir`` (one convention for all parties).

    ``ca/``: the consortium CA (its key would live offline in a real deployment);
    ``nodes/<name>/``: a node's TLS key and certificate, and for banks the receipt-signing key
    and the node-pseudonym key; ``public/``: what every party may read (banks' signing keys).
    """

    def __init__(self, pki_dir: str | Path) -> None:
        self.root = Path(pki_dir)

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca" / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca" / "ca.key"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name

    def tls_cert(self, name: str) -> Path:
        return self.node_dir(name) / "tls.crt"

    def tls_key(self, name: str) -> Path:
        return self.node_dir(name) / "tls.key"

    def signing_key(self, bank: str) -> Path:
        return self.node_dir(bank) / "signing.key"

    def signing_public_key(self, bank: str) -> Path:
        return self.root / "public" / f"{bank}.signing.pub"

    def pseudonym_key(self, bank: str) -> Path:
        return self.node_dir(bank) / "pseudonym.key"


def _problems(path: Path, error: ValidationError) -> ConfigError:
    return ConfigError(format_validation_error(error, source=path, sep="\n"))


def _resolve(base: Path, value: Any) -> Any:
    return str((base / value).resolve()) if isinstance(value, str) else value


# Path fields of a node file (keys from the top of the file), relative to the file.
_NODE_PATHS = (
    ("consortium",),
    ("state_dir",),
    ("key_authority", "operator_secret_file"),
    ("bank", "operator_secret_file"),
    ("bank", "data_root"),
    ("bank", "data", "customers"),
    ("bank", "data", "transactions"),
    ("bank", "predict", "output"),
)
SQLITE_PREFIX = "sqlite:///"


def _resolve_sqlite_url(base: Path, url: Any) -> Any:
    """A relative SQLite path in a URL (``sqlite:///data/bank.sqlite``) is relative to the node file too."""
    if not isinstance(url, str) or not url.startswith(SQLITE_PREFIX):
        return url
    path = url[len(SQLITE_PREFIX) :]
    if not path or path.startswith("/") or path == ":memory:":
        return url
    return SQLITE_PREFIX + str((base / path).resolve())


def load_consortium(path: str | Path) -> ConsortiumConfig:
    """Read and validate ``consortium.toml``; paths inside are relative to the file."""
    path = Path(path)
    values = read_toml(path, "consortium file", ConfigError)
    base = path.resolve().parent
    for key in ("policy", "pki_dir", "state_root"):
        values[key] = _resolve(base, values.get(key))
    if isinstance(values.get("generate"), dict) and "out" in values["generate"]:
        values["generate"]["out"] = _resolve(base, values["generate"]["out"])
    values["source"] = str(path)
    try:
        return ConsortiumConfig.model_validate(values)
    except ValidationError as error:
        raise _problems(path, error) from None
    except ConfigError as error:  # the experiment section, validated by build_config
        raise ConfigError(f"{path}: [experiment]: {error}") from None


def load_node_config(path: str | Path) -> tuple[NodeConfig, ConsortiumConfig]:
    """Read a node's file and the consortium it names; the node must be in it with the same role.

    Relative paths are resolved against the node's file; a missing ``state_dir`` becomes the
    consortium's ``state_root/<name>``, so every caller reads ``node.state_dir``.
    """
    path = Path(path)
    values = read_toml(path, "node config", ConfigError)
    base = path.resolve().parent
    data = values.get("bank", {}).get("data") if isinstance(values.get("bank"), dict) else None
    sql_data = isinstance(data, dict) and data.get("kind") == "sql"  # its customers/transactions are table names
    for *sections, key in _NODE_PATHS:
        if sql_data and sections == ["bank", "data"]:
            continue
        table = values
        for section in sections:
            table = table.get(section) if isinstance(table, dict) else None
        if isinstance(table, dict) and key in table:
            table[key] = _resolve(base, table[key])
    if isinstance(data, dict) and "url" in data:
        data["url"] = _resolve_sqlite_url(base, data["url"])
    values["source"] = str(path)
    try:
        node = NodeConfig.model_validate(values)
    except ValidationError as error:
        raise _problems(path, error) from None
    consortium = load_consortium(node.consortium)
    entry = consortium.node(node.name)
    if entry.role is not node.role:
        raise ConfigError(
            f"{path}: role: {node.role.value!r}, but {node.consortium} lists {node.name!r} as {entry.role.value!r}"
        )
    if node.state_dir is None:
        node = node.model_copy(update={"state_dir": consortium.state_dir(node.name)})
    if node.role is NodeRole.BANK and consortium.bank_sources and node.bank.data is None:
        raise ConfigError(
            f"{path}: bank.data: {node.consortium} has data = 'bank-sources', so this bank must declare its own "
            "customers and transactions in [bank.data] (kind = 'files' or 'sql')"
        )
    return node, consortium
