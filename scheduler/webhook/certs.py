"""The webhook's serving certificate: from files (cert-manager) or made at start-up.

A made certificate is signed by a CA made with it; the CA's certificate is what the
MutatingWebhookConfiguration's ``caBundle`` must hold, and its key is thrown away once the
serving certificate is signed (nothing can sign with it again). Each start makes a new pair,
so the program keeps its CA in the bundle itself (``scheduler/k8s/webhook_config.py``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Long enough that a running scheduler never outlives it; every start makes a new one.
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True, slots=True)
class Made:
    """A serving certificate and key (PEM) and the CA certificate that signed it."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes


def make(hosts: Sequence[str], now: datetime.datetime) -> Made:
    """A CA and a serving certificate for ``hosts`` (DNS names or IP addresses)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal-scheduler webhook CA")])
    start = now - datetime.timedelta(minutes=5)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return Made(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def server_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def load_made(context: ssl.SSLContext, made: Made) -> None:
    """Load a made pair into ``context``; the key touches disk only for the call (a private
    temporary folder, removed at once), since ``ssl`` reads keys only from files."""
    with tempfile.TemporaryDirectory(prefix="shoal-webhook-") as folder:
        cert, key = Path(folder, "tls.crt"), Path(folder, "tls.key")
        cert.write_bytes(made.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(made.key_pem)
        context.load_cert_chain(cert, key)


@dataclass
class FilePair:
    """A certificate and key given as files, loaded again when either changes (rotation)."""

    cert: Path
    key: Path
    _seen: tuple[float, float] = (0.0, 0.0)

    def load_if_changed(self, context: ssl.SSLContext) -> bool:
        """Load the pair when the files changed since the last load; True when it did."""
        seen = (self.cert.stat().st_mtime, self.key.stat().st_mtime)
        if seen == self._seen:
            return False
        context.load_cert_chain(self.cert, self.key)
        self._seen = seen
        return True
