"""The one kubeconfig loader: the service account in a pod, kubectl's files and contexts, TLS and
token settings, and errors that name the field but never a value."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import kubeconfig
from common.kubeconfig import KubeconfigError, NotFound

TOKEN = "tKnZqWvXrPyLmHsJdGfBcNaQ"


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def config(
    current: str,
    contexts: dict[str, tuple[str, str, str]],
    clusters: dict[str, dict[str, Any]],
    users: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """``contexts``: name -> (cluster, user, namespace)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "contexts": [
            {"name": n, "context": {"cluster": c, "user": u, "namespace": ns}}
            for n, (c, u, ns) in contexts.items()
        ],
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
    }


def test_in_cluster_reads_the_service_environment_and_account_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "namespace").write_text("ml\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    found = kubeconfig.load(None, account=tmp_path, env=env)
    assert found.server == "https://[fd00::1]:6443"
    assert found.ca_file == str(tmp_path / "ca.crt")
    assert found.namespace == "ml"
    assert found.token.get() == "first"
    assert found.where == "in-cluster config"
    with pytest.raises(NotFound, match="KUBERNETES_SERVICE_HOST"):
        kubeconfig.load(None, account=tmp_path, env={})


def test_the_current_context_or_the_one_asked_for(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config",
        config(
            "dev",
            {"dev": ("a", "alice", "ml"), "prod": ("b", "bob", "")},
            {"a": {"server": "https://a:6443"}, "b": {"server": "http://b:8080"}},
            {"alice": {"token": TOKEN}, "bob": {"tokenFile": "bob-token"}},
        ),
    )
    (tmp_path / "bob-token").write_text("from-file\n")
    dev = kubeconfig.load(path)
    assert (dev.server, dev.namespace, dev.token.get(), dev.context) == (
        "https://a:6443",
        "ml",
        TOKEN,
        "dev",
    )
    prod = kubeconfig.load(path, context="prod")
    assert (prod.server, prod.namespace) == ("http://b:8080", "default")
    # A relative path is read from the kubeconfig's own folder.
    assert prod.token.path == str(tmp_path / "bob-token")
    assert prod.token.get() == "from-file"
    assert prod.ssl_context() is None  # plain HTTP
    with pytest.raises(KubeconfigError, match="no context named 'qa'"):
        kubeconfig.load(path, context="qa")


def test_kubeconfig_lists_are_merged_as_kubectl_merges_them(tmp_path: Path) -> None:
    first = write(
        tmp_path / "first",
        config(
            "one",
            {"one": ("c", "u", "research")},
            {"c": {"server": "https://first:6443"}},
            {"u": {"token": "t1"}},
        ),
    )
    second = write(
        tmp_path / "second",
        config(
            "two",
            {"two": ("c", "u", "other"), "one": ("x", "x", "ignored")},
            {"c": {"server": "https://second:6443"}},
            {"u": {"token": "t2"}},
        ),
    )
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), first, second])}
    found = kubeconfig.load(None, discover=True, env=env)
    # The first file to name the current context, a context, a cluster or a user wins.
    assert (found.context, found.namespace, found.server) == (
        "one",
        "research",
        "https://first:6443",
    )
    assert kubeconfig.load(None, context="two", discover=True, env=env).namespace == "other"
    assert kubeconfig.namespace(None, "two", env=env) == "other"
    assert kubeconfig.namespace(None, None, env={"KUBECONFIG": str(tmp_path / "none")}) == (
        "default"
    )


def test_tls_settings_reach_both_kinds_of_client(tmp_path: Path) -> None:
    from devcluster import pki

    keys = pki.generate(tmp_path / "pki")
    admin = keys.clients["admin"]
    path = write(
        tmp_path / "config",
        config(
            "x",
            {"x": ("c", "u", "")},
            {
                "c": {
                    "server": "https://127.0.0.1:6443",
                    "certificate-authority-data": base64.b64encode(
                        keys.ca_cert.read_bytes()
                    ).decode(),
                    "tls-server-name": "kubernetes",
                }
            },
            {
                "u": {
                    "client-certificate": str(admin.cert),
                    "client-key-data": base64.b64encode(admin.key.read_bytes()).decode(),
                    "token": TOKEN,
                }
            },
        ),
    )
    found = kubeconfig.load(path)
    context = found.ssl_context()  # the CA and the key pair load
    assert context is not None
    assert len(context.get_ca_certs()) == 1  # the cluster's CA only, not the system's too
    official = found.official()
    assert official["host"] == "https://127.0.0.1:6443"
    assert official["verify_ssl"] is True
    assert official["tls_server_name"] == "kubernetes"
    assert official["cert_file"] == str(admin.cert)
    # Data is handed over as a file that lives in memory, not on a filesystem.
    assert official["key_file"].startswith("/proc/self/fd/")
    assert Path(official["key_file"]).read_bytes() == admin.key.read_bytes()
    assert official["api_key"] == {"BearerToken": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("where", "entry", "field"),
    [
        ("cluster", {"certificate-authority-data": TOKEN + "!"}, "certificate-authority-data"),
        ("user", {"client-key-data": TOKEN + "!", "client-certificate": "c"}, "client-key-data"),
    ],
)
def test_bad_data_is_named_by_file_and_field_never_quoted(
    tmp_path: Path, where: str, entry: dict[str, Any], field: str
) -> None:
    cluster: dict[str, Any] = {"server": "https://127.0.0.1:6443"}
    user: dict[str, Any] = {"token": TOKEN}
    (cluster if where == "cluster" else user).update(entry)
    path = write(
        tmp_path / "config", config("x", {"x": ("c", "u", "")}, {"c": cluster}, {"u": user})
    )
    with pytest.raises(KubeconfigError) as refused:
        kubeconfig.load(path)
    assert f"kubeconfig {path}" in str(refused.value)
    assert f".{where}.{field} is not valid base64" in str(refused.value)
    assert TOKEN[:8] not in str(refused.value)


def test_a_yaml_error_says_where_without_quoting_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(f"users:\n- name: u\n  user:\n    token: {TOKEN}: more\n")
    with pytest.raises(KubeconfigError, match="not valid YAML at line 4") as refused:
        kubeconfig.load(str(path))
    assert TOKEN[:8] not in str(refused.value)


def test_a_plugin_user_is_left_to_the_official_client_with_its_files_and_context(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path / "config",
        config(
            "x",
            {"x": ("c", "u", "")},
            {"c": {"server": "https://127.0.0.1:6443"}},
            {"u": {"exec": {"command": "get-token", "apiVersion": "v1"}}},
        ),
    )
    found = kubeconfig.load(path)
    assert found.needs_client is not None
    assert "exec" in found.needs_client
    assert (found.files, found.context) == (path, "x")
