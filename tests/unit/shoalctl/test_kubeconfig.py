"""Which kubeconfig and namespace ``kubectl shoal`` uses: kubectl's order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shoalctl import api


def kubeconfig(path: Path, *, current: str, namespaces: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": name, "context": {"cluster": "c", "user": "u", "namespace": ns}}
            for name, ns in namespaces.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_namespace_is_the_contexts_from_kubeconfig_env_or_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(tmp_path / "a", current="one", namespaces={"one": "ml", "two": "research"})
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{first}")
    assert api.default_namespace(None, None) == "ml"
    assert api.default_namespace(None, "two") == "research"
    other = kubeconfig(tmp_path / "b", current="x", namespaces={"x": "flagged"})
    assert api.default_namespace(str(other), None) == "flagged"
    assert api.connect(None, "two").configuration.host == "https://127.0.0.1:1"


def test_no_kubeconfig_anywhere_says_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(api.ReadError, match="pass --kubeconfig or set KUBECONFIG"):
        api.connect(None, None)
    assert api.default_namespace(None, None) == "default"


def test_a_broken_kubeconfig_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(api.ReadError, match=f"cannot use kubeconfig {broken}"):
        api.connect(str(broken), None)
