"""Certificates and keys for a loopback cluster: one CA, a serving cert, client certs, SA keys.

Everything is generated fresh for each ``up`` and lives in the run folder; nothing is reused
across clusters. ECDSA P-256 keeps generation fast; the service-account signing key is RSA so
every client library can verify its tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=30)
_PRIVATE = serialization.PrivateFormat.PKCS8
_PEM = serialization.Encoding.PEM
_NO_PASSWORD = serialization.NoEncryption()


@dataclass(frozen=True, slots=True)
class Client:
    """A client identity: certificate and key file paths."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_public: Path
    sa_private: Path
    clients: dict[str, Client]


#: client name -> (common name, organization)
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("devcluster-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
    # The API server's identity towards kubelets (logs, exec, port-forward).
    "kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def _name(common: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(_PEM, _PRIVATE, _NO_PASSWORD))
    path.chmod(0o600)


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
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
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path, *, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Write a fresh PKI into ``directory`` and return the paths; the API server's certificate
    also names ``extra_ips`` (the host bridge address of a cluster with real nodes)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("devcluster-ca")
    ca_cert = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write_key(directory / "ca.key", ca_key)
    (directory / "ca.crt").write_bytes(ca_cert.public_bytes(_PEM))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    sans += [
        x509.IPAddress(ipaddress.ip_address(a))
        for a in ("127.0.0.1", "::1", "10.96.0.1", *extra_ips)
    ]
    serving = _sign(
        _name("kube-apiserver"),
        serving_key,
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    _write_key(directory / "apiserver.key", serving_key)
    (directory / "apiserver.crt").write_bytes(serving.public_bytes(_PEM))

    clients: dict[str, Client] = {}
    for name, (common, org) in CLIENTS.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(
            _name(common, org), key, ca_name, ca_key, usages=[ExtendedKeyUsageOID.CLIENT_AUTH]
        )
        _write_key(directory / f"{name}.key", key)
        (directory / f"{name}.crt").write_bytes(cert.public_bytes(_PEM))
        clients[name] = Client(cert=directory / f"{name}.crt", key=directory / f"{name}.key")

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(_PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_public=directory / "sa.pub",
        sa_private=directory / "sa.key",
        clients=clients,
    )


def kubeconfig(server: str, ca: Path, client: Client, *, user: str = "admin") -> str:
    """A kubeconfig (YAML is a superset of JSON, so JSON is written) with file references."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(client.cert), "client-key": str(client.key)},
            }
        ],
        "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": user}}],
        "current-context": "devcluster",
    }
    return json.dumps(doc, indent=2) + "\n"


def _load_ca(keys: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(keys.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def issue_node(keys: Pki, directory: Path, node: str, ip: str) -> dict[str, Path]:
    """A real node's kubelet certificates, signed by the cluster's CA: a client certificate in
    the ``system:nodes`` group (the Node authorizer's form) and a serving certificate for its
    address."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load_ca(keys)
    paths: dict[str, Path] = {"ca": keys.ca_cert}
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _sign(
        _name(f"system:node:{node}", "system:nodes"),
        client_key,
        ca_cert.subject,
        ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _sign(
        _name(f"system:node:{node}"),
        serving_key,
        ca_cert.subject,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName(node), x509.IPAddress(ipaddress.ip_address(ip))],
    )
    for stem, cert, key in (("client", client, client_key), ("serving", serving, serving_key)):
        _write_key(directory / f"kubelet-{stem}.key", key)
        (directory / f"kubelet-{stem}.crt").write_bytes(cert.public_bytes(_PEM))
        paths[f"{stem}_cert"] = directory / f"kubelet-{stem}.crt"
        paths[f"{stem}_key"] = directory / f"kubelet-{stem}.key"
    return paths
