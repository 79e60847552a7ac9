"""Provisioning: what files it creates, what the certificates say, and that it never replaces anything."""

from __future__ import annotations

import ipaddress
import shutil
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from fedgl_secure.cli import app
from fedgl_secure.consortium.config import ConsortiumConfig, NodeRole, PkiLayout, load_consortium, load_node_config
from fedgl_secure.errors import ConfigError, CryptoError
from fedgl_secure.services.pki import (
    load_pseudonym_key,
    load_signing_key,
    load_signing_public_keys,
    provision,
    read_identity,
)

FEDERATION = "test-federation"
# bank-b and the key authority sit at non-loopback addresses, so the SAN must name them too.
NODES = [
    ("key-authority", "key-authority", "ka.internal", 9701),
    ("aggregator", "aggregator", "127.0.0.1", 9702),
    ("bank-a", "bank", "127.0.0.1", 9711),
    ("bank-b", "bank", "10.1.2.3", 9712),
]
BANK_C = ("bank-c", "bank", "127.0.0.1", 9713)


def write_consortium(directory: Path, nodes=NODES, federation: str = FEDERATION) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f'federation = "{federation}"',
        'policy = "policy.toml"',
        'pki_dir = "pki"',
        'state_root = "state"',
        "[ca]",
        'common_name = "test CA"',
        "validity_days = 30",
    ]
    for name, role, host, port in nodes:
        lines += ["[[nodes]]", f'name = "{name}"', f'role = "{role}"', f'host = "{host}"', f"port = {port}"]
    banks = sum(role == "bank" for _, role, _, _ in nodes)
    lines += ["[experiment]", 'dataset = "synthetic"', "[experiment.federation]", f"proportions = {[0.5] * banks}"]
    path = directory / "consortium.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file and folder under ``root``: content, mtime and mode."""
    return {
        str(path.relative_to(root)): (
            path.read_bytes() if path.is_file() else b"",
            path.stat().st_mtime_ns,
            path.stat().st_mode,
        )
        for path in sorted(root.rglob("*"))
    }


def copy_of(source: ConsortiumConfig, directory: Path, nodes=NODES) -> tuple[ConsortiumConfig, PkiLayout]:
    """The provisioned PKI of ``source`` copied next to a new consortium file listing ``nodes``."""
    consortium = load_consortium(write_consortium(directory, nodes))
    shutil.copytree(source.pki_dir, consortium.pki_dir)
    return consortium, PkiLayout(consortium.pki_dir)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
    consortium = load_consortium(write_consortium(tmp_path_factory.mktemp("consortium")))
    report = provision(consortium)
    return consortium, PkiLayout(consortium.pki_dir), report


def _certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_is_created_with_owner_only_keys_and_folders(provisioned):
    consortium, layout, report = provisioned
    banks = [bank.name for bank in consortium.banks]
    signers = [*banks, consortium.aggregator.name]  # banks sign receipts, the aggregator its broadcasts
    private = [layout.ca_key] + [layout.tls_key(node.name) for node in consortium.nodes]
    private += [layout.signing_key(name) for name in signers] + [layout.pseudonym_key(bank) for bank in banks]
    public = [layout.ca_cert] + [layout.tls_cert(node.name) for node in consortium.nodes]
    public += [layout.signing_public_key(name) for name in signers]
    assert sorted(report.created) == sorted(private + public) and report.kept == ()
    assert report.root == consortium.pki_dir
    assert {_mode(path) for path in private} == {0o600}
    assert {_mode(path) for path in public} == {0o644}
    folders = [layout.root, *(path for path in layout.root.rglob("*") if path.is_dir())]
    assert {_mode(folder) for folder in folders} == {0o700}
    assert not layout.signing_key("key-authority").exists() and not layout.pseudonym_key("key-authority").exists()
    assert not layout.pseudonym_key("aggregator").exists()


def test_the_ca_may_sign_leaf_certificates_only(provisioned):
    _, layout, _ = provisioned
    ca = _certificate(layout.ca_cert)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert ca.subject == ca.issuer and isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "test CA"


@pytest.mark.parametrize(("name", "role", "host", "port"), NODES)
def test_node_certificates_name_node_role_and_host_and_chain_to_the_ca(provisioned, name, role, host, port):
    _, layout, _ = provisioned
    ca, cert = _certificate(layout.ca_cert), _certificate(layout.tls_cert(name))
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert cert.issuer == ca.subject
    subject = {attribute.oid: attribute.value for attribute in cert.subject}
    assert subject == {
        NameOID.COMMON_NAME: name,
        NameOID.ORGANIZATIONAL_UNIT_NAME: role,
        NameOID.ORGANIZATION_NAME: FEDERATION,
    }
    assert read_identity(cert).name == name and read_identity(cert).role is NodeRole(role)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    hosts = set(names.get_values_for_type(x509.DNSName)) | {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert hosts == {"localhost", "127.0.0.1", host}
    if host[0].isdigit():  # an address is certified as an IP address, a name as a DNS name
        assert ipaddress.ip_address(host) in names.get_values_for_type(x509.IPAddress)
    else:
        assert host in names.get_values_for_type(x509.DNSName)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    authority = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert authority.key_identifier == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    lifetime = cert.not_valid_after_utc - datetime.now(timezone.utc)
    assert timedelta(days=29) < lifetime <= timedelta(days=30)
    key = serialization.load_pem_private_key(layout.tls_key(name).read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_bank_signing_keys_sign_and_their_published_halves_verify(provisioned):
    consortium, layout, _ = provisioned
    public = load_signing_public_keys(layout, [bank.name for bank in consortium.banks])
    signature = load_signing_key(layout, "bank-a").sign(b"round 1")
    public["bank-a"].verify(signature, b"round 1")
    with pytest.raises(InvalidSignature):
        public["bank-b"].verify(signature, b"round 1")


def test_all_banks_share_one_random_pseudonym_key(provisioned, tmp_path):
    consortium, layout, _ = provisioned
    keys = {load_pseudonym_key(layout, bank.name) for bank in consortium.banks}
    assert len(keys) == 1 and len(next(iter(keys))) == 32
    other = load_consortium(write_consortium(tmp_path))
    provision(other)
    assert load_pseudonym_key(PkiLayout(other.pki_dir), "bank-a") not in keys


def test_provisioning_again_keeps_every_file_untouched(provisioned, tmp_path):
    consortium, layout = copy_of(provisioned[0], tmp_path)
    before = snapshot(layout.root)
    report = provision(consortium)
    first = provisioned[2]
    assert report.created == ()
    assert sorted(p.relative_to(report.root) for p in report.kept) == sorted(
        p.relative_to(first.root) for p in first.created
    )
    assert snapshot(layout.root) == before


def test_a_bank_added_later_gets_only_its_own_files_under_the_same_ca(provisioned, tmp_path):
    consortium, layout = copy_of(provisioned[0], tmp_path, nodes=[*NODES, BANK_C])
    before = snapshot(layout.root)
    report = provision(consortium)
    assert sorted(report.created) == sorted(
        [
            layout.tls_key("bank-c"),
            layout.tls_cert("bank-c"),
            layout.signing_key("bank-c"),
            layout.signing_public_key("bank-c"),
            layout.pseudonym_key("bank-c"),
        ]
    )
    after = snapshot(layout.root)
    assert {name: after[name] for name in before if name not in {"nodes", "public"}} == {
        name: value for name, value in before.items() if name not in {"nodes", "public"}
    }
    _certificate(layout.tls_cert("bank-c")).verify_directly_issued_by(_certificate(layout.ca_cert))
    assert load_pseudonym_key(layout, "bank-c") == load_pseudonym_key(layout, "bank-a")


def test_the_ca_key_may_stay_offline_unless_a_certificate_must_be_signed(provisioned, tmp_path):
    consortium, layout = copy_of(provisioned[0], tmp_path / "same")
    layout.ca_key.unlink()
    assert provision(consortium).created == ()
    grown, grown_layout = copy_of(provisioned[0], tmp_path / "grown", nodes=[*NODES, BANK_C])
    grown_layout.ca_key.unlink()
    before = snapshot(grown_layout.root)
    with pytest.raises(ConfigError, match=r"ca\.key: missing, and new certificates must be signed for bank-c"):
        provision(grown)
    assert snapshot(grown_layout.root) == before  # refused before writing anything


def _foreign_certificate(layout: PkiLayout, tmp_path: Path) -> None:
    """bank-a's TLS pair replaced by one from another consortium's CA."""
    stranger = load_consortium(write_consortium(tmp_path / "stranger"))
    provision(stranger)
    for source in (PkiLayout(stranger.pki_dir).tls_cert("bank-a"), PkiLayout(stranger.pki_dir).tls_key("bank-a")):
        target = layout.node_dir("bank-a") / source.name
        target.unlink()
        shutil.copy(source, target)


def _swap_pseudonym(layout: PkiLayout, tmp_path: Path) -> None:
    layout.pseudonym_key("bank-b").unlink()
    layout.pseudonym_key("bank-b").write_text("ab" * 32 + "\n")


REFUSALS = {
    "certificate from another CA": (_foreign_certificate, r"nodes/bank-a/tls\.crt: not signed by the consortium CA"),
    "key without certificate": (
        lambda layout, _: layout.tls_cert("bank-b").unlink(),
        r"nodes/bank-b/tls\.key: exists but tls\.crt",
    ),
    "CA lost, node certificates left": (
        lambda layout, _: (layout.ca_cert.unlink(), layout.ca_key.unlink()),
        r"ca/ca\.crt: missing, but certificates it issued exist",
    ),
    "published signing key without private key": (
        lambda layout, _: layout.signing_key("bank-a").unlink(),
        r"public/bank-a\.signing\.pub: published, but .*signing\.key is missing",
    ),
    "banks with different pseudonym keys": (_swap_pseudonym, r"different node-pseudonym keys"),
    "corrupt pseudonym key": (
        lambda layout, _: (layout.pseudonym_key("bank-a").unlink(), layout.pseudonym_key("bank-a").write_text("x")),
        r"nodes/bank-a/pseudonym\.key: not a 32-byte key in hex",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_inconsistent_files_are_refused_naming_the_file_and_nothing_is_written(provisioned, tmp_path, case):
    damage, message = REFUSALS[case]
    consortium, layout = copy_of(provisioned[0], tmp_path / "consortium")
    damage(layout, tmp_path)
    before = snapshot(layout.root)
    with pytest.raises(ConfigError, match=message):
        provision(consortium)
    assert snapshot(layout.root) == before


def test_a_role_change_is_refused_because_the_kept_certificate_names_the_old_role(provisioned, tmp_path):
    swapped = [("aggregator", "bank", *NODES[1][2:]), ("bank-a", "aggregator", *NODES[2][2:])]
    consortium, _ = copy_of(provisioned[0], tmp_path, nodes=[NODES[0], *swapped, NODES[3], BANK_C])
    with pytest.raises(ConfigError, match=r"tls\.crt: certifies 'aggregator' as 'aggregator', but .* as 'bank'"):
        provision(consortium)


def test_loaders_name_the_missing_or_corrupt_file_and_the_fix(tmp_path):
    layout = PkiLayout(tmp_path)
    with pytest.raises(
        ConfigError, match=r"signing\.key: bank-a's receipt-signing key is missing; run `fedgl-secure provision"
    ):
        load_signing_key(layout, "bank-a")
    layout.signing_public_key("bank-a").parent.mkdir(parents=True)
    layout.signing_public_key("bank-a").write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ConfigError, match=r"bank-a\.signing\.pub: .* is not a PEM public key .*fedgl-secure provision"):
        load_signing_public_keys(layout, ["bank-a"])


def _certificate_with_subject(attributes: list[x509.NameAttribute]) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    builder = x509.CertificateBuilder().subject_name(x509.Name(attributes)).issuer_name(x509.Name(attributes))
    builder = builder.public_key(key.public_key()).serial_number(1).not_valid_before(now)
    return builder.not_valid_after(now + timedelta(days=1)).sign(key, hashes.SHA256())


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ([x509.NameAttribute(NameOID.COMMON_NAME, "bank-a")], r"needs exactly one OU \(role\), found none"),
        (
            [
                x509.NameAttribute(NameOID.COMMON_NAME, "bank-a"),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "auditor"),
            ],
            r"unknown role OU='auditor'",
        ),
        ([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "bank")], r"needs exactly one CN"),
    ],
)
def test_read_identity_refuses_certificates_without_a_consortium_identity(attributes, message):
    with pytest.raises(CryptoError, match=message):
        read_identity(_certificate_with_subject(attributes))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("federation = [", "not valid TOML"),
        ('federation = "f"\npolicy = "p"\npki_dir = "k"\nstate_root = "s"\nnodes = []\n', "exactly one key-authority"),
    ],
)
def test_a_bad_consortium_file_is_a_clear_config_error(tmp_path, content, message):
    path = tmp_path / "consortium.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_consortium(path)


def test_node_file_paths_are_relative_to_the_node_file_and_state_dir_defaults_to_the_consortium(tmp_path):
    consortium_path = write_consortium(tmp_path / "consortium")
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "bank-a.toml").write_text(
        'name = "bank-a"\nrole = "bank"\nconsortium = "../consortium/consortium.toml"\n'
        '[bank]\ndata_root = "../../shared/datasets"\n'
    )
    (nodes / "bank-b.toml").write_text(
        'name = "bank-b"\nrole = "bank"\nconsortium = "../consortium/consortium.toml"\nstate_dir = "own-state"\n'
    )
    bank_a, consortium = load_node_config(nodes / "bank-a.toml")
    assert bank_a.consortium == consortium_path.resolve()
    assert bank_a.bank.data_root == (tmp_path.parent / "shared" / "datasets").resolve()
    assert bank_a.state_dir == (consortium_path.parent / "state" / "bank-a").resolve() == consortium.state_dir("bank-a")
    bank_b, _ = load_node_config(nodes / "bank-b.toml")
    assert bank_b.bank.data_root is None and bank_b.state_dir == (nodes / "own-state").resolve()


def test_cli_provision_reports_created_then_kept_files(tmp_path):
    path = write_consortium(tmp_path)
    out = tmp_path / "elsewhere"
    first = CliRunner().invoke(app, ["provision", str(path), "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert "created  ca/ca.crt" in first.output and f"18 files created, 0 kept, under {out}" in first.output
    assert (out / "ca" / "ca.key").exists()
    assert not (tmp_path / "pki").exists()  # --out wins over the file's pki_dir
    second = CliRunner().invoke(app, ["provision", str(path), "--out", str(out)])
    assert second.exit_code == 0 and "kept     nodes/bank-a/signing.key" in second.output
    assert "0 files created, 18 kept" in second.output


def test_cli_provision_errors_are_one_line_with_exit_code_2(tmp_path):
    missing = CliRunner().invoke(app, ["provision", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2
    assert missing.output.strip().count("\n") == 0 and "nope.toml: cannot read consortium file" in missing.output
    path = write_consortium(tmp_path)
    assert CliRunner().invoke(app, ["provision", str(path)]).exit_code == 0
    PkiLayout(tmp_path / "pki").tls_key("bank-a").unlink()
    refused = CliRunner().invoke(app, ["provision", str(path)])
    assert (
        refused.exit_code == 2
        and refused.output.startswith("error: ")
        and "tls.crt: exists but tls.key" in refused.output
    )


@pytest.mark.parametrize(
    "directory", ["services", "services/strict-dp", "services/strict-edge-dp", "services/label-dp"]
)
def test_every_shipped_example_consortium_has_its_own_node_configs(directory):
    from fedgl_secure.services.orchestrate import check_node_configs_belong

    root = Path(__file__).resolve().parents[1] / directory
    consortium = load_consortium(root / "consortium.toml")
    names = [consortium.key_authority.name, consortium.aggregator.name, *(bank.name for bank in consortium.banks)]
    check_node_configs_belong(root / "consortium.toml", {name: root / f"{name}.toml" for name in names})


def test_consortium_up_refuses_node_configs_of_another_consortium(tmp_path):
    from fedgl_secure.services.orchestrate import consortium_up

    services = Path(__file__).resolve().parents[1] / "services"
    for file in services.glob("*.toml"):
        shutil.copy(file, tmp_path / file.name)
    shutil.copy(services / "consortium.toml", tmp_path / "second.toml")  # its node configs name consortium.toml
    with pytest.raises(ConfigError, match=r"belong to another consortium \(.*bank-a\.toml names .*consortium\.toml"):
        consortium_up(tmp_path / "second.toml", progress=False)
    assert not load_consortium(tmp_path / "second.toml").pki_dir.exists()  # refused before provisioning anything
