"""Real nodes' pure parts: the kubelet's module pins the control plane's release, the layout is
unique per run folder, and the pause image is a valid OCI archive."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from pathlib import Path

import pytest

from devcluster import realnode
from devcluster.errors import StartError
from devcluster.versions import GO_DIR


def _replaces(path: Path) -> set[str]:
    return set(re.findall(r"^\s*(\S+ => \S+ \S+)", path.read_text(), re.MULTILINE))


def test_the_kubelet_is_built_from_the_control_planes_release_and_replacements() -> None:
    assert realnode.same_release()
    control_plane = _replaces(GO_DIR / "kubernetes" / "go.mod")
    node = _replaces(realnode.NODE_GO_DIR / "go.mod")
    assert control_plane <= node


def test_each_run_folder_gets_its_own_names_and_addresses(tmp_path: Path) -> None:
    a = realnode.network_for(tmp_path / "a")
    b = realnode.network_for(tmp_path / "b")
    assert a.tag != b.tag
    assert len(f"shv{a.tag}9") <= 15  # an interface name's limit
    assert a.node_ip(0) != a.host_ip
    assert a.pod_subnet(0) != a.pod_subnet(1)


def test_an_oci_archive_written_from_files_names_its_blobs_by_digest(tmp_path: Path) -> None:
    target = tmp_path / "x.oci.tar"
    realnode.write_oci_archive(
        target, [("bin/x", b"#!/bin/sh\n", 0o755)], name="localhost/x:1", entrypoint=["/bin/x"]
    )
    first = target.read_bytes()
    realnode.write_oci_archive(
        target, [("bin/x", b"#!/bin/sh\n", 0o755)], name="localhost/x:1", entrypoint=["/bin/x"]
    )
    assert target.read_bytes() == first
    with tarfile.open(target) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        ref = index["manifests"][0]
        assert ref["annotations"]["org.opencontainers.image.ref.name"] == "localhost/x:1"
        for member in tar.getmembers():
            if member.name.startswith("blobs/sha256/"):
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == member.name.rsplit("/", 1)[1]


@pytest.mark.reliability
def test_one_devcluster_with_real_nodes_holds_the_machine_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs with real nodes at once shared /var/lib/kubelet and the agent's folders: one
    started its kubelet elsewhere (its agent found no pod-resources folder) and one wiped the
    other's agent state. A second claim waits for the first to go; a holder whose processes
    have all exited (killed before ``down``) frees the machine."""
    monkeypatch.setattr(realnode, "MACHINE_CLAIM", tmp_path / "claim.json")
    monkeypatch.setattr(realnode, "_CLAIM_LOCK", tmp_path / "claim.lock")
    monkeypatch.setattr(realnode, "_kubelet_running", lambda: None)  # the machine's own
    first, second = tmp_path / "first", tmp_path / "second"
    realnode.claim_machine(first)
    with pytest.raises(StartError, match="one devcluster with real nodes runs at a time"):
        realnode.claim_machine(second, timeout=0)
    realnode.release_machine(first)
    realnode.claim_machine(second, timeout=0)

    # A holder killed before down: no process of it is left (no such pid, no state file).
    (tmp_path / "claim.json").write_text(json.dumps({"run_dir": str(first), "pid": 2**22 + 7}))
    realnode.claim_machine(second, timeout=0)
    assert json.loads((tmp_path / "claim.json").read_text())["run_dir"] == str(second.resolve())
