"""Throw-away certificates for TLS tests: a CA, server certificates and client certificates as PEM files.

Keys are ECDSA P-256 (fast to make, accepted by Go's crypto/tls and by gRPC's
BoringSSL). Certificates are valid from one hour ago for ``days`` days, so
small clock differences never matter. Every function writes ``<name>-cert.pem``
and ``<name>-key.pem`` into ``folder`` and returns what it wrote.

    ca = write_ca(folder)
    server = write_server_cert(folder, ca)                  # SAN IP:127.0.0.1, DNS:localhost
    client = write_client_cert(folder, ca, "client1")       # subject CN=client1
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 7


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, in memory and as PEM files."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: Path
    key_path: Path

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)


def write_ca(
    folder: Path, name: str = "ca", common_name: str = "liftbridge-test-ca", days: int = DEFAULT_DAYS
) -> Issued:
    """A self-signed certificate authority that may sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(common_name)
    builder = (
        _base_builder(subject, subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _write(folder, name, builder.sign(key, hashes.SHA256()), key)


def write_server_cert(
    folder: Path,
    ca: Issued,
    name: str = "server",
    *,
    common_name: str = "localhost",
    ips: Sequence[str] = ("127.0.0.1",),
    dns_names: Sequence[str] = ("localhost",),
    days: int = DEFAULT_DAYS,
) -> Issued:
    """A server certificate signed by ``ca`` for the given IP addresses and DNS names (serverAuth)."""
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return _write_leaf(
        folder,
        ca,
        name=name,
        common_name=common_name,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        alt_names=alt_names,
        days=days,
    )


def write_client_cert(
    folder: Path, ca: Issued, common_name: str, name: str | None = None, *, days: int = DEFAULT_DAYS
) -> Issued:
    """A client certificate signed by ``ca`` whose subject CommonName is ``common_name`` (clientAuth).

    Files are named after ``name``, by default the common name.
    """
    return _write_leaf(
        folder,
        ca,
        name=name or common_name,
        common_name=common_name,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        alt_names=[],
        days=days,
    )


def _write_leaf(
    folder: Path,
    ca: Issued,
    *,
    name: str,
    common_name: str,
    usage: x509.ObjectIdentifier,
    alt_names: list[x509.GeneralName],
    days: int,
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _base_builder(_name(common_name), ca.certificate.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return _write(folder, name, builder.sign(ca.key, hashes.SHA256()), key)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "liftbridge-provider tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _base_builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(folder: Path, name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    folder.mkdir(parents=True, exist_ok=True)
    cert_path = folder / f"{name}-cert.pem"
    key_path = folder / f"{name}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
    return Issued(certificate, key, cert_path, key_path)
