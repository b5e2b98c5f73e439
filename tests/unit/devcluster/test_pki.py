"""The generated PKI gives the API server a cert clients can verify and the admin group rights."""

from __future__ import annotations

import json
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from devcluster import pki


def test_admin_is_in_system_masters_and_serving_cert_covers_loopback(tmp_path: Path) -> None:
    keys = pki.generate(tmp_path)
    admin = x509.load_pem_x509_certificate(keys.clients["admin"].cert.read_bytes())
    orgs = [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    serving = x509.load_pem_x509_certificate(keys.serving_cert.read_bytes())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert any(str(ip) == "127.0.0.1" for ip in sans.get_values_for_type(x509.IPAddress))
    ca = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
    serving.verify_directly_issued_by(ca)
    admin.verify_directly_issued_by(ca)
    assert oct(keys.sa_private.stat().st_mode & 0o777) == "0o600"


def test_kubeconfig_points_at_the_server_with_the_client_identity(tmp_path: Path) -> None:
    keys = pki.generate(tmp_path)
    doc = json.loads(pki.kubeconfig("https://127.0.0.1:6443", keys.ca_cert, keys.clients["kwok"]))
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert doc["users"][0]["user"]["client-certificate"].endswith("kwok.crt")
