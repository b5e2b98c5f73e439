"""Which kubeconfigs the agent's light transport serves itself, and which go to the official
client."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from nodeagent.adapters.k8s.transport import (
    ClientTransport,
    DirectTransport,
    KubeconfigError,
    Unsupported,
    connect,
    from_kubeconfig,
    in_cluster,
)


def kubeconfig(tmp_path: Path, user: dict[str, object], server: str = "http://127.0.0.1:1") -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_token_and_token_file(tmp_path: Path) -> None:
    direct = from_kubeconfig(kubeconfig(tmp_path, {"token": "abc"}))
    assert direct.token.get() == "abc"
    (tmp_path / "token").write_text("from-file\n")
    rotating = from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "token"}))
    assert rotating.token.get() == "from-file"


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}},
        {"auth-provider": {"name": "oidc"}},
        {"username": "admin", "password": "secret"},
    ],
)
def test_plugins_and_basic_auth_go_to_the_official_client(
    tmp_path: Path, user: dict[str, object]
) -> None:
    path = kubeconfig(tmp_path, user)
    with pytest.raises(Unsupported):
        from_kubeconfig(path)
    reasons: list[str] = []
    transport = connect(path, on_fallback=reasons.append)
    assert isinstance(transport, ClientTransport)
    assert reasons
    transport.close()


def test_the_usual_kubeconfig_stays_light(tmp_path: Path) -> None:
    transport = connect(kubeconfig(tmp_path, {"token": "t"}), on_fallback=pytest.fail)
    assert isinstance(transport, DirectTransport)


def test_bad_certificate_data_is_refused(tmp_path: Path) -> None:
    user: dict[str, object] = {
        "client-certificate-data": base64.b64encode(b"not a certificate").decode(),
        "client-key-data": base64.b64encode(b"not a key").decode(),
    }
    # Named by file and field, never quoted.
    with pytest.raises(KubeconfigError, match=r"users\['u'\]\.user\.client-certificate") as refused:
        from_kubeconfig(kubeconfig(tmp_path, user, server="https://127.0.0.1:1"))
    assert "not a" not in str(refused.value)


def test_in_cluster_needs_the_service_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster(tmp_path)
    # Said as a kubeconfig error (the agent exits 2 with it), not left to the official client.
    with pytest.raises(KubeconfigError, match="not in a cluster"):
        connect(None, on_fallback=pytest.fail)


def test_a_proxy_goes_to_the_official_client_with_its_settings(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    doc = yaml.safe_load(Path(path).read_text())
    doc["clusters"][0]["cluster"]["proxy-url"] = "http://127.0.0.1:3128"
    Path(path).write_text(yaml.safe_dump(doc))
    reasons: list[str] = []
    transport = connect(path, on_fallback=reasons.append)
    assert isinstance(transport, ClientTransport)
    assert transport.api.configuration.proxy == "http://127.0.0.1:3128"
    assert transport.api.configuration.api_key["BearerToken"] == "Bearer t"
    assert reasons == [
        f"kubeconfig {path}: clusters['c'].cluster.proxy-url needs the official client"
    ]
    transport.close()
