"""Development PKI and TLS contexts for the gateway session, so tests and demos need no openssl.

``make_dev_pki(out_dir, hosts=..., nodes=...)`` writes:

    ca.pem, ca.key                 a self-signed CA (ECDSA P-256) for both sides
    gateway.pem, gateway.key       the gateway's server certificate (SAN: the given hosts/IPs)
    client-<node>.pem/.key         one client certificate per node (CN = node id)
    signing.key, signing.pub       an Ed25519 control-plane key (agent trusts signing.pub)

Keys are written 0600. These are for development, tests and a recovery demo; a real site
brings its own PKI and keys.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.deps import need
from agent.link.session import TLS_MIN


@dataclass(frozen=True)
class DevPki:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def gateway_cert(self) -> Path:
        return self.dir / "gateway.pem"

    @property
    def gateway_key(self) -> Path:
        return self.dir / "gateway.key"

    @property
    def signing_key(self) -> Path:
        return self.dir / "signing.key"

    @property
    def signing_pub(self) -> Path:
        return self.dir / "signing.pub"

    def client_cert(self, node: str) -> Path:
        return self.dir / f"client-{node}.pem"

    def client_key(self, node: str) -> Path:
        return self.dir / f"client-{node}.key"


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode)
    path.chmod(mode)
    path.write_bytes(data)


def _key_pem(key: Any) -> bytes:
    ser = need("cryptography.hazmat.primitives.serialization")
    pem: bytes = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    return pem


def _cert(
    subject_cn: str,
    key: Any,
    issuer: tuple[Any, Any] | None,
    *,
    ca: bool = False,
    sans: list[str] | None = None,
    client: bool = False,
) -> Any:
    x509 = need("cryptography.x509")
    hashes = need("cryptography.hazmat.primitives.hashes")
    oid = need("cryptography.x509.oid")
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(oid.NameOID.COMMON_NAME, subject_cn)])
    issuer_name, issuer_key = (name, key) if issuer is None else (issuer[0].subject, issuer[1])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        usage = oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else oid.ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if issuer is not None:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), False
            )
    if sans:
        entries = []
        for s in sans:
            try:
                entries.append(x509.IPAddress(ipaddress.ip_address(s)))
            except ValueError:
                entries.append(x509.DNSName(s))
        builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_dev_pki(
    out_dir: Path,
    *,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1"),
    nodes: tuple[str, ...] = (),
) -> DevPki:
    """Create (or add to) a development PKI in ``out_dir``; existing CA and keys are kept."""
    ec = need("cryptography.hazmat.primitives.asymmetric.ec")
    ser = need("cryptography.hazmat.primitives.serialization")
    x509 = need("cryptography.x509")
    from agent.security.trust import SigningKey

    pki = DevPki(Path(out_dir))
    pki.dir.mkdir(parents=True, exist_ok=True)
    ca_key_path = pki.dir / "ca.key"
    if pki.ca.exists() and ca_key_path.exists():
        ca_key = ser.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _cert("bettercompute dev CA", ca_key, None, ca=True)
        _write(ca_key_path, _key_pem(ca_key), 0o600)
        _write(pki.ca, ca_cert.public_bytes(ser.Encoding.PEM), 0o644)
    if not pki.gateway_cert.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert("bettercompute gateway", key, (ca_cert, ca_key), sans=list(hosts))
        _write(pki.gateway_key, _key_pem(key), 0o600)
        _write(pki.gateway_cert, cert.public_bytes(ser.Encoding.PEM), 0o644)
    for node in nodes:
        if pki.client_cert(node).exists():
            continue
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(node, key, (ca_cert, ca_key), client=True)
        _write(pki.client_key(node), _key_pem(key), 0o600)
        _write(pki.client_cert(node), cert.public_bytes(ser.Encoding.PEM), 0o644)
    if not pki.signing_key.exists():
        signing = SigningKey.generate()
        signing.save(pki.signing_key)
        signing.save_public(pki.signing_pub)
    return pki


def server_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """TLS 1.3 only; asks for a client certificate (optional: enrollment tokens also work)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_MIN
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_common_name(sock: ssl.SSLSocket) -> str | None:
    """The CN of the verified client certificate, or None when the peer sent none."""
    cert = sock.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for pair in rdn:
            if pair[0] == "commonName":
                return str(pair[1])
    return None
