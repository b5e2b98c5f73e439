"""Real nodes' pure parts: the kubelet's module pins the control plane's release, the layout is
unique per run folder, and the pause image is a valid OCI archive."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from pathlib import Path

from devcluster import realnode
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
