"""HTTPS: a site serves TLS from simnet.toml's [tls] (or `serve --tls-cert/--tls-key`), its peers
verify it against the fleet's anchors, and its own CLI still reaches it. Real processes, real
certs."""

from __future__ import annotations

import datetime
import ipaddress
import ssl

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import knowledge
from federation import ConfigError, PeerError, SiteConfig, sync_with
from knowledge import Identity, SiteHome


def self_signed(directory, name: str = "site") -> tuple:
    """A certificate for 127.0.0.1 signed by its own key: (cert path, key path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def https_site(tmp_path, cli, serve_process):
    """Site b serving HTTPS from its simnet.toml, trusting robot a to push; (url, b's key, a,
    cert)."""
    home = tmp_path / "b"
    assert cli(home, "init", "--name", "b", "--listen", "127.0.0.1:0").code == 0
    cert, key = self_signed(home)
    with open(home / "simnet.toml", "a") as toml:
        toml.write(f'\n[tls]\ncert = "{cert.name}"\nkey = "{key.name}"\n')
    robot = Identity.generate()
    added = cli(
        home,
        "peer",
        "add",
        "a",
        "http://127.0.0.1:9",
        "--key",
        robot.public_key_hex,
        "--trust",
        "publish",
    )
    assert added.code == 0, added.out
    served = serve_process(home)
    return served.url, Identity.load(SiteHome(home).key).public_key, robot, cert, home


def test_a_peer_verifies_the_site_against_the_fleets_anchors(https_site):
    url, b_key, robot, cert, _ = https_site
    assert url.startswith("https://127.0.0.1:")
    with knowledge.open(":memory:", robot) as kb:
        kb.skills.publish("pick-mug", "pick")
        with pytest.raises(PeerError, match="CERTIFICATE_VERIFY_FAILED"):
            sync_with(kb, url, b_key)  # the system's anchors do not know this certificate
        report = sync_with(kb, url, b_key, verify=ssl.create_default_context(cafile=cert))
        assert report.pushed == 1


def test_nothing_is_served_in_clear(https_site):
    url = https_site[0]
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://") + "/v1/health", timeout=5)


def test_the_sites_own_cli_reaches_its_https_server(https_site, cli):
    url, *_, home = https_site
    status = cli(home, "status", "--json")
    assert status.code == 0, status.out
    assert status.json["server"] == url


def test_a_certificate_without_its_key_is_a_config_error(tmp_path):
    cert, _ = self_signed(tmp_path)
    SiteConfig(tmp_path).save()
    with open(tmp_path / "simnet.toml", "a") as toml:
        toml.write(f'\n[tls]\ncert = "{cert.name}"\n')
    with pytest.raises(ConfigError, match="both cert and key"):
        SiteConfig.load(tmp_path)


def test_a_missing_anchor_file_is_a_config_error(tmp_path):
    SiteConfig(tmp_path).save()
    with open(tmp_path / "simnet.toml", "a") as toml:
        toml.write('\n[tls]\nca = "fleet-ca.pem"\n')
    with pytest.raises(ConfigError, match="fleet-ca.pem is not a file"):
        SiteConfig.load(tmp_path)


def test_a_sites_tls_anchors_let_it_verify_a_peer(https_site, tmp_path):
    """[tls] ca in the calling site's simnet.toml is what its gossip and `simnet sync` verify
    with."""
    url, b_key, robot, cert, _ = https_site
    caller = tmp_path / "caller"
    caller.mkdir()
    (caller / "fleet-ca.pem").write_bytes(cert.read_bytes())
    SiteConfig(caller).save()
    with open(caller / "simnet.toml", "a") as toml:
        toml.write('\n[tls]\nca = "fleet-ca.pem"\n')
    anchors = SiteConfig.load(caller).tls.client_context()
    with knowledge.open(":memory:", robot) as kb:
        kb.skills.publish("pick-mug", "pick")
        assert sync_with(kb, url, b_key, verify=anchors).pushed == 1


def test_a_replaced_anchor_file_is_read_again(https_site, tmp_path):
    """The anchors are loaded once per file as it is on disk (gossip asks every round); a fleet CA
    file replaced while the site runs is read again."""
    url, b_key, robot, cert, _ = https_site
    caller = tmp_path / "caller"
    caller.mkdir()
    other, _ = self_signed(caller, "other")
    (caller / "fleet-ca.pem").write_bytes(other.read_bytes())
    SiteConfig(caller).save()
    with open(caller / "simnet.toml", "a") as toml:
        toml.write('\n[tls]\nca = "fleet-ca.pem"\n')
    tls = SiteConfig.load(caller).tls
    assert tls.client_context() is tls.client_context()
    with knowledge.open(":memory:", robot) as kb:
        kb.skills.publish("pick-mug", "pick")
        with pytest.raises(PeerError, match="CERTIFICATE_VERIFY_FAILED"):
            sync_with(kb, url, b_key, verify=tls.client_context())
        (caller / "fleet-ca.pem").write_bytes(other.read_bytes() + cert.read_bytes())
        assert sync_with(kb, url, b_key, verify=tls.client_context()).pushed == 1
