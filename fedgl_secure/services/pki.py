"""Provisioning of the consortium's keys and certificates (DESIGN §5.2), and the loaders services use.

``provision`` creates, under :class:`~fedgl_secure.consortium.config.PkiLayout`:

* the consortium CA (EC P-256, self-signed, may sign leaf certificates only);
* per node, an EC P-256 TLS key and a certificate with ``CN=<node>``, ``OU=<role>``,
  ``O=<federation>``, valid for client *and* server authentication — every node is both;
* per bank, an Ed25519 receipt-signing key, its public half under ``public/`` (the aggregator gets one
  too: it signs every broadcast it serves), and the one
  node-pseudonym key all banks share (HMAC key of §5.4; it must be equal everywhere, or the
  same customer gets different pseudonyms at different banks).

Existing files are never replaced. Provisioning again keeps every file that exists and creates only
what is missing, so a bank can be added to ``consortium.toml`` later and provisioned alone. Before
anything is written, every kept file is checked against the consortium: certificates must chain to
the (kept) CA and still name the node, role and address; key pairs must match; all banks must hold
the same pseudonym key. A new certificate needs the CA key; if it is missing (kept offline, say),
provisioning refuses rather than start a second CA. Any refusal is a :class:`ConfigError` naming
the file, raised before a single file is written.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedgl_secure.consortium.config import NODE_NAME_PATTERN, ConsortiumConfig, NodeEntry, NodeRole, PkiLayout
from fedgl_secure.consortium.pseudonyms import PSEUDONYM_KEY_BYTES
from fedgl_secure.errors import ConfigError, CryptoError
from fedgl_secure.fileio import PRIVATE_FILE_MODE
from fedgl_secure.log import get_logger

PUBLIC_FILE_MODE = 0o644
DIRECTORY_MODE = 0o700
# Certificates start a little in the past so a peer whose clock lags slightly still accepts them.
CLOCK_SKEW = timedelta(minutes=5)
HINT = "run `fedgl-secure provision <consortium.toml>`"
_Key = TypeVar("_Key", ec.EllipticCurvePrivateKey, Ed25519PrivateKey)


@dataclass(frozen=True)
class NodeIdentity:
    """Who a certificate says its holder is: the node name (CN) and its role (OU)."""

    name: str
    role: NodeRole


@dataclass(frozen=True)
class ProvisionReport:
    """What :func:`provision` wrote (``created``) and left as it was (``kept``), in absolute paths."""

    root: Path
    created: tuple[Path, ...]
    kept: tuple[Path, ...]

    def summary(self) -> str:
        """One line per file (``created``/``kept`` and its path under ``root``), then totals."""
        lines = [f"created  {path.relative_to(self.root)}" for path in self.created]
        lines += [f"kept     {path.relative_to(self.root)}" for path in self.kept]
        lines.append(f"{len(self.created)} files created, {len(self.kept)} kept, under {self.root}")
        return "\n".join(lines)


@dataclass
class _Plan:
    """Everything provisioning will write, decided (and checked) before the first write."""

    writes: dict[Path, tuple[bytes, int]] = field(default_factory=dict)
    kept: list[Path] = field(default_factory=list)

    def create(self, path: Path, content: bytes, mode: int) -> None:
        self.writes[path] = (content, mode)

    def keep(self, *paths: Path) -> None:
        self.kept.extend(paths)


@dataclass(frozen=True)
class _Issuer:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey | None  # None: the CA key is offline and no new certificate is needed


# ----------------------------------------------------------------------------------------- provision


def provision(consortium: ConsortiumConfig, out: Path | None = None) -> ProvisionReport:
    """Create whatever keys and certificates of ``consortium`` are missing under ``out`` (default: its pki_dir)."""
    layout = PkiLayout(Path(out if out is not None else consortium.pki_dir).absolute())
    plan = _Plan()
    _plan_tls(consortium, layout, plan, datetime.now(timezone.utc))
    banks = [bank.name for bank in consortium.banks]
    for name in (*banks, consortium.aggregator.name):  # banks sign receipts, the aggregator broadcasts
        _plan_signing_key(layout, name, plan)
    _plan_pseudonym_keys(layout, banks, plan)
    _write_all(layout.root, plan)
    report = ProvisionReport(layout.root, tuple(plan.writes), tuple(plan.kept))
    get_logger(component="pki").info(
        "provisioned", root=str(report.root), created=len(report.created), kept=len(report.kept)
    )
    return report


def _plan_tls(consortium: ConsortiumConfig, layout: PkiLayout, plan: _Plan, now: datetime) -> None:
    """The CA, then a certificate for every node that has none; existing ones are checked and kept."""
    to_issue = [
        node for node in consortium.nodes if not _pair_exists(layout.tls_cert(node.name), layout.tls_key(node.name))
    ]
    issued = [node for node in consortium.nodes if node not in to_issue]
    issuer = _plan_ca(consortium, layout, plan, now, to_issue=to_issue, issued=issued)
    for node in issued:
        _check_node_certificate(consortium, node, layout, issuer.cert, now)
        plan.keep(layout.tls_cert(node.name), layout.tls_key(node.name))
    for node in to_issue:
        cert, key = _issue_node_certificate(consortium, node, issuer, now)
        plan.create(layout.tls_key(node.name), _private_pem(key), PRIVATE_FILE_MODE)
        plan.create(layout.tls_cert(node.name), _certificate_pem(cert), PUBLIC_FILE_MODE)


def _pair_exists(cert_path: Path, key_path: Path) -> bool:
    """Whether a certificate and its key both exist; half a pair is refused, never completed."""
    cert_exists, key_exists = cert_path.exists(), key_path.exists()
    if cert_exists != key_exists:
        present, absent = (cert_path, key_path) if cert_exists else (key_path, cert_path)
        raise ConfigError(
            f"{present}: exists but {absent.name} next to it does not; restore the missing file, "
            f"or delete {present} too so provisioning issues a fresh pair"
        )
    return cert_exists


def _plan_ca(
    consortium: ConsortiumConfig,
    layout: PkiLayout,
    plan: _Plan,
    now: datetime,
    *,
    to_issue: Sequence[NodeEntry],
    issued: Sequence[NodeEntry],
) -> _Issuer:
    """The CA to sign with: the existing one (checked), or a new one when there is no trace of any."""
    cert_exists, key_exists = layout.ca_cert.exists(), layout.ca_key.exists()
    if not cert_exists:
        if key_exists:
            raise ConfigError(f"{layout.ca_cert}: missing while {layout.ca_key} exists; restore the CA certificate")
        if issued:
            raise ConfigError(
                f"{layout.ca_cert}: missing, but certificates it issued exist "
                f"({', '.join(node.name for node in issued)}); restore ca/, or move {layout.root} away "
                "and provision the whole consortium afresh"
            )
        cert, key = _issue_ca(consortium, now)
        plan.create(layout.ca_key, _private_pem(key), PRIVATE_FILE_MODE)
        plan.create(layout.ca_cert, _certificate_pem(cert), PUBLIC_FILE_MODE)
        return _Issuer(cert, key)
    cert = _load_certificate(layout.ca_cert, "consortium CA certificate")
    _check_ca_certificate(layout.ca_cert, cert, now)
    plan.keep(layout.ca_cert)
    if not key_exists:
        if to_issue:
            raise ConfigError(
                f"{layout.ca_key}: missing, and new certificates must be signed for "
                f"{', '.join(node.name for node in to_issue)}; bring the CA key back (from offline storage) "
                "and provision again"
            )
        return _Issuer(cert, None)
    key = _load_private_key(layout.ca_key, "consortium CA key", ec.EllipticCurvePrivateKey)
    if key.public_key() != cert.public_key():
        raise ConfigError(f"{layout.ca_key}: does not belong to {layout.ca_cert}; restore the matching pair")
    plan.keep(layout.ca_key)
    return _Issuer(cert, key)


def _check_ca_certificate(path: Path, cert: x509.Certificate, now: datetime) -> None:
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ConfigError(f"{path}: not a CA certificate (BasicConstraints CA=True missing)")
    if cert.not_valid_after_utc <= now:
        raise ConfigError(
            f"{path}: the consortium CA expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
            "every certificate must be re-issued — move the PKI directory away and provision afresh"
        )


def _check_node_certificate(
    consortium: ConsortiumConfig, node: NodeEntry, layout: PkiLayout, ca_cert: x509.Certificate, now: datetime
) -> None:
    """A kept node certificate must chain to the CA, match its key, and still describe ``node``."""
    path = layout.tls_cert(node.name)
    reissue = f"delete {path} and {layout.tls_key(node.name)} and provision again to re-issue it"
    cert = _load_certificate(path, "TLS certificate")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        raise ConfigError(f"{path}: not signed by the consortium CA {layout.ca_cert}; {reissue}") from None
    key = _load_private_key(layout.tls_key(node.name), "TLS key", ec.EllipticCurvePrivateKey)
    if key.public_key() != cert.public_key():
        raise ConfigError(f"{layout.tls_key(node.name)}: does not belong to {path}; {reissue}")
    try:
        identity = read_identity(cert)
    except CryptoError as error:
        raise ConfigError(f"{path}: {error}; {reissue}") from None
    if identity != NodeIdentity(node.name, node.role):
        raise ConfigError(
            f"{path}: certifies {identity.name!r} as {identity.role.value!r}, but the consortium lists "
            f"{node.name!r} as {node.role.value!r}; {reissue}"
        )
    if cert.not_valid_after_utc <= now:
        raise ConfigError(f"{path}: expired on {cert.not_valid_after_utc:%Y-%m-%d}; {reissue}")
    if node.host not in _certified_hosts(cert):
        raise ConfigError(f"{path}: does not certify the host {node.host!r} the consortium lists; {reissue}")


def _certified_hosts(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(names.get_values_for_type(x509.DNSName)) | {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def _plan_signing_key(layout: PkiLayout, bank: str, plan: _Plan) -> None:
    """A bank's receipt-signing key pair; the public half is re-derived if only it is missing."""
    private_path, public_path = layout.signing_key(bank), layout.signing_public_key(bank)
    if not private_path.exists():
        if public_path.exists():
            raise ConfigError(
                f"{public_path}: published, but {private_path} is missing; a new key would not match what "
                f"the other parties registered — restore the key, or delete {public_path} to issue a new pair"
            )
        key = Ed25519PrivateKey.generate()
        plan.create(private_path, _private_pem(key), PRIVATE_FILE_MODE)
        plan.create(public_path, _public_pem(key.public_key()), PUBLIC_FILE_MODE)
        return
    key = load_signing_key(layout, bank)
    plan.keep(private_path)
    if not public_path.exists():
        plan.create(public_path, _public_pem(key.public_key()), PUBLIC_FILE_MODE)
        return
    if key.public_key() != _load_public_key(public_path, "bank signing public key"):
        raise ConfigError(f"{public_path}: is not the public half of {private_path}; restore the matching pair")
    plan.keep(public_path)


def _plan_pseudonym_keys(layout: PkiLayout, banks: Sequence[str], plan: _Plan) -> None:
    """Give every bank the one shared pseudonym key: the existing one, or a fresh one if none exists."""
    existing = {bank: load_pseudonym_key(layout, bank) for bank in banks if layout.pseudonym_key(bank).exists()}
    if len(set(existing.values())) > 1:
        groups: dict[bytes, list[str]] = {}
        for bank, key in existing.items():
            groups.setdefault(key, []).append(str(layout.pseudonym_key(bank)))
        listing = " | ".join(", ".join(paths) for paths in groups.values())
        raise ConfigError(
            f"banks hold different node-pseudonym keys ({listing}); they must share one — copy one bank's "
            "pseudonym.key over the others by hand (their pseudonyms change)"
        )
    shared = next(iter(existing.values())) if existing else secrets.token_bytes(PSEUDONYM_KEY_BYTES)
    for bank in banks:
        path = layout.pseudonym_key(bank)
        if bank in existing:
            plan.keep(path)
        else:
            plan.create(path, (shared.hex() + "\n").encode("ascii"), PRIVATE_FILE_MODE)


# -------------------------------------------------------------------------------------- certificates


def _issue_ca(consortium: ConsortiumConfig, now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, consortium.ca.common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, consortium.federation),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + timedelta(days=consortium.ca.validity_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs only; a leaf signs TLS handshakes (ECDHE) only."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _issue_node_certificate(
    consortium: ConsortiumConfig, node: NodeEntry, issuer: _Issuer, now: datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate naming the node (CN) and its role (OU), for TLS servers and clients alike."""
    assert issuer.key is not None, "provision() checks the CA key is present before issuing"
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, node.name),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, node.role.value),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, consortium.federation),
        ]
    )
    ca_key_id = issuer.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    # A leaf must not outlive its CA: peers would reject the chain once the CA expires anyway.
    not_after = min(now + timedelta(days=consortium.ca.validity_days), issuer.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(node.host)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(issuer.key, hashes.SHA256())
    )
    return cert, key


def _subject_alt_names(host: str) -> list[x509.GeneralName]:
    """localhost and 127.0.0.1 (so loopback deployments work) plus the host the consortium lists."""
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        extra: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        extra = x509.DNSName(host)
    if extra not in names:
        names.append(extra)
    return names


def read_identity(cert: x509.Certificate) -> NodeIdentity:
    """The node name (CN) and role (OU) a consortium certificate binds; :class:`CryptoError` if unusable."""
    subject = cert.subject.rfc4514_string()
    name = _single_attribute(cert, NameOID.COMMON_NAME, "CN (node name)")
    role_value = _single_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU (role)")
    if not re.fullmatch(NODE_NAME_PATTERN, name):
        raise CryptoError(f"certificate {subject!r}: CN {name!r} is not a node name")
    try:
        role = NodeRole(role_value)
    except ValueError:
        roles = ", ".join(role.value for role in NodeRole)
        raise CryptoError(f"certificate {subject!r}: unknown role OU={role_value!r}; roles are {roles}") from None
    return NodeIdentity(name, role)


def _single_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = [attribute.value for attribute in cert.subject.get_attributes_for_oid(oid)]
    if len(values) != 1 or not isinstance(values[0], str):
        found = "none" if not values else f"{len(values)}"
        raise CryptoError(f"certificate {cert.subject.rfc4514_string()!r}: needs exactly one {what}, found {found}")
    return values[0]


# ------------------------------------------------------------------------------------------- loaders


def load_signing_key(layout: PkiLayout, bank: str) -> Ed25519PrivateKey:
    """The bank's Ed25519 receipt-signing key (``nodes/<bank>/signing.key``)."""
    return _load_private_key(layout.signing_key(bank), f"{bank}'s receipt-signing key", Ed25519PrivateKey)


def load_signing_public_keys(layout: PkiLayout, bank_names: Iterable[str]) -> dict[str, Ed25519PublicKey]:
    """Every named bank's receipt-verification key (``public/<bank>.signing.pub``), by bank."""
    return {
        bank: _load_public_key(layout.signing_public_key(bank), f"{bank}'s signing public key") for bank in bank_names
    }


def load_pseudonym_key(layout: PkiLayout, bank: str) -> bytes:
    """The consortium's node-pseudonym key as a bank holds it (``nodes/<bank>/pseudonym.key``, hex)."""
    path = layout.pseudonym_key(bank)
    text = _read(path, f"{bank}'s node-pseudonym key").decode("ascii", errors="replace").strip()
    if not re.fullmatch(rf"[0-9a-f]{{{2 * PSEUDONYM_KEY_BYTES}}}", text):
        raise ConfigError(f"{path}: not a {PSEUDONYM_KEY_BYTES}-byte key in hex (corrupt?); {HINT}")
    return bytes.fromhex(text)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} is missing; {HINT}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read {what} ({error.strerror or error})") from None


def _load_private_key(path: Path, what: str, kind: type[_Key]) -> _Key:
    try:
        key = serialization.load_pem_private_key(_read(path, what), password=None)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{path}: {what} is not an unencrypted PEM private key ({error}); {HINT}") from None
    if not isinstance(key, kind):
        raise ConfigError(f"{path}: {what} is a {type(key).__name__}, expected {kind.__name__}; {HINT}")
    return key


def _load_public_key(path: Path, what: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read(path, what))
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{path}: {what} is not a PEM public key ({error}); {HINT}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{path}: {what} is a {type(key).__name__}, expected an Ed25519 public key; {HINT}")
    return key


def _load_certificate(path: Path, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_read(path, what))
    except ValueError as error:
        raise ConfigError(f"{path}: {what} is not a PEM certificate ({error}); {HINT}") from None


# ------------------------------------------------------------------------------------------- writing


def _private_pem(key: ec.EllipticCurvePrivateKey | Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _certificate_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_all(root: Path, plan: _Plan) -> None:
    for path, (content, mode) in plan.writes.items():
        _make_private_dirs(root, path.parent)
        _write_new(path, content, mode)


def _make_private_dirs(root: Path, directory: Path) -> None:
    """Create ``directory`` and the folders between it and ``root``, owner-only; existing ones stay as they are."""
    root.parent.mkdir(parents=True, exist_ok=True)
    relative = directory.relative_to(root)
    for depth in range(len(relative.parts) + 1):
        folder = root.joinpath(*relative.parts[:depth])
        try:
            os.mkdir(folder, DIRECTORY_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask


def _write_new(path: Path, content: bytes, mode: int) -> None:
    """Write a file that must not exist yet; O_EXCL also refuses one that appeared since planning."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ConfigError(
            f"{path}: appeared while provisioning (is another provision running?); run it again"
        ) from None
    with os.fdopen(descriptor, "wb") as handle:
        try:
            os.fchmod(handle.fileno(), mode)  # exactly ``mode``, whatever the umask
            handle.write(content)
        except BaseException:
            path.unlink(missing_ok=True)  # ours, half-written: a truncated key must not be kept next time
            raise
