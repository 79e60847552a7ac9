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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedgl_secure.errors import ConfigError
from fedgl_secure.fedgl.config import ExperimentConfig, build_config
from fedgl_secure.tomlio import format_validation_error, read_toml

NODE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


class NodeRole(str, Enum):
    KEY_AUTHORITY = "key-authority"
    AGGREGATOR = "aggregator"
    BANK = "bank"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class ConsortiumConfig(_Model):
    """The shared description of one consortium (``services/consortium.toml``)."""

    federation: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    policy: Path
    pki_dir: Path
    state_root: Path
    ca: CertificateAuthority = CertificateAuthority()
    nodes: tuple[NodeEntry, ...]
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
        proportions = build_config(self.experiment).federation.proportions  # fails here, naming the field
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

    def experiment_config(self) -> ExperimentConfig:
        """The experiment every party runs; bank k of ``banks`` holds client slice k."""
        return build_config(self.experiment)

    def state_dir(self, name: str) -> Path:
        return self.state_root / name


class KeyAuthoritySection(_Model):
    """Where the key authority's operator secret comes from (file wins over environment)."""

    operator_secret_file: Path | None = None
    operator_secret_env: str = "FEDGL_KA_SECRET"


class BankSection(_Model):
    """A bank's own data: which slice of the experiment's dataset it holds, and where files are."""

    data_root: Path | None = None
    poll_seconds: float = Field(0.2, gt=0, le=60)


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


# Path fields of a node file ((section, key); section None for top-level keys), relative to the file.
_NODE_PATHS = (
    (None, "consortium"),
    (None, "state_dir"),
    ("key_authority", "operator_secret_file"),
    ("bank", "data_root"),
)


def load_consortium(path: str | Path) -> ConsortiumConfig:
    """Read and validate ``consortium.toml``; paths inside are relative to the file."""
    path = Path(path)
    values = read_toml(path, "consortium file", ConfigError)
    base = path.resolve().parent
    for key in ("policy", "pki_dir", "state_root"):
        values[key] = _resolve(base, values.get(key))
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
    for section, key in _NODE_PATHS:
        table = values if section is None else values.get(section)
        if isinstance(table, dict) and key in table:
            table[key] = _resolve(base, table[key])
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
    return node, consortium
