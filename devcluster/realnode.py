"""Real nodes beside the kwok nodes: a kubelet, containerd and runc running real containers.

Each real node is a separate host as far as the cluster can tell: a network namespace of its own
(``ip netns``) joined to a host bridge by a veth pair, with its own address, where its containerd
and kubelet run. The host bridge carries the API server's address (the API server binds there,
not on loopback, when a cluster has real nodes), so nodes, pods and webhooks all reach it without
any traffic leaving the machine: no node namespace has a default route. Pods sit on a CNI bridge
inside their node's namespace, on a subnet the host routes to that node.

In-cluster configuration: pods dial the ``kubernetes`` Service (``10.96.0.1:443``). Instead of
kube-proxy, two iptables DNAT rules inside each node's namespace (PREROUTING for pods, OUTPUT for
host-network pods) send that address to the API server; the same is done for any address a test
asks for (the cloud metadata address ``169.254.169.254:80`` to a fake on the host). Nothing else
needs a Service's ClusterIP: the API server reaches webhooks through their endpoints
(``--enable-aggregator-routing``).

Binaries: the kubelet is built from ``devcluster/node/go`` (the control plane's Kubernetes
release and replace directives, plus the modules only the kubelet needs) into the cache beside
the control plane's; containerd, runc and the CNI plugins are Debian's packages, fetched with
``apt-get download`` and unpacked with ``dpkg-deb -x`` into the cache (no service is installed or
started). The sandbox image is a static ``pause`` built here with the C compiler and written as an
OCI archive by :func:`write_oci_archive`.

What this machine kind needed, each from the error that showed it (docs/devcluster.md lists
them): ``failCgroupV1: false``; the kubelet's ``cgroupRoot`` made in every v1 hierarchy with
cpuset copied from its parent; ``restrict_oom_score_adj`` and ``oomScoreAdj: 0`` (no
CAP_SYS_RESOURCE); containerd's v1 runtime plugin given a private root; a node IP that is not
loopback; a CNI configuration even for host-network pods.

:func:`teardown` leaves nothing behind: it stops the kubelet and containerd, kills whatever is
left in the node's cgroups and containerd's shims (found by their containerd address), unmounts
everything under the node's folders, deletes the network namespaces, the bridge and the cgroups,
and removes the fixed host paths the kubelet writes that did not exist before.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from devcluster import build, pki, process
from devcluster.errors import BuildError, StartError
from devcluster.process import Proc
from devcluster.versions import cache_root, pinned

Say = Callable[[str], None]

NODE_GO_DIR: Final = Path(__file__).resolve().parent / "node" / "go"
#: Debian packages a real node runs, unpacked into the cache.
PACKAGES: Final = ("containerd", "runc", "containernetworking-plugins")
#: The sandbox image every pod's network namespace is held by.
PAUSE_IMAGE: Final = "localhost/shoal-pause:1"
SERVICE_IP: Final = "10.96.0.1"
METADATA_IP: Final = "169.254.169.254"
#: The host folders the project's chart gives its agent (the notice socket, the pod file): the
#: disk of a node, which on this machine every real node shares. A node starts with none of them
#: (``clear_node_state`` at ``up``) and ``teardown`` removes them whether or not they existed
#: before, so no cluster's agent starts from another cluster's pod file or socket.
NODE_STATE_PATHS: Final = ("/run/shoal", "/var/lib/shoal-agent")
KUBELET_ROOT: Final = "/var/lib/kubelet"
#: Host paths a kubelet or containerd writes whatever its configuration says, and the node
#: state folders; ``teardown`` removes each that did not exist before (and the node state).
FIXED_HOST_PATHS: Final = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/var/lib/cni",
    *NODE_STATE_PATHS,
)
_MNT_DETACH = 2

_PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def _say(message: str) -> None:
    build._say(message)


# --------------------------------------------------------------------------------------------
# Binaries


def _digest(paths: Iterable[Path], extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def kubelet_dir() -> Path:
    """The cache folder of the kubelet built from ``devcluster/node/go``."""
    version = pinned().kubernetes
    return cache_root() / f"node-{version}-{_digest(sorted(NODE_GO_DIR.glob('go.*')))}"


def same_release() -> bool:
    """Whether the node module pins the control plane's Kubernetes release."""
    text = (NODE_GO_DIR / "go.mod").read_text()
    return f"k8s.io/kubernetes {pinned().kubernetes}" in text


def build_kubelet(*, say: Say = _say) -> Path:
    directory = kubelet_dir()
    binary = directory / "kubelet"
    if os.access(binary, os.X_OK):
        return binary
    if not same_release():
        raise BuildError("devcluster/node/go/go.mod pins another Kubernetes release")
    build.check_go(pinned().go)
    directory.mkdir(parents=True, exist_ok=True)
    version = pinned().kubernetes
    major, minor = version.lstrip("v").split(".")[:2]
    prefix = "k8s.io/component-base/version"
    ldflags = (
        f"-s -w -X {prefix}.gitVersion={version} -X {prefix}.gitMajor={major} "
        f"-X {prefix}.gitMinor={minor}"
    )
    partial = directory / ".kubelet.partial"
    say(f"devcluster: building the kubelet {version} into {directory}")
    started = time.monotonic()
    result = subprocess.run(
        ["go", "build", f"-ldflags={ldflags}", "-o", str(partial), "k8s.io/kubernetes/cmd/kubelet"],
        cwd=NODE_GO_DIR,
        env=build.go_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"building the kubelet failed:\n{result.stderr[-4000:]}")
    partial.replace(binary)
    say(f"devcluster: kubelet built in {time.monotonic() - started:.0f} s")
    return binary


def _candidate(package: str) -> str:
    out = subprocess.run(
        ["apt-cache", "policy", package], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    return ""


def packages_dir(*, say: Say = _say) -> Path:
    """Debian's containerd, runc and CNI plugins unpacked into the cache (``root/usr/...``)."""
    base = cache_root() / "node-packages"
    versions = [_candidate(p) for p in PACKAGES]
    if all(versions):
        key = "-".join(f"{p}_{v}" for p, v in zip(PACKAGES, versions, strict=True))
        directory = base / key.replace(":", "_").replace("~", "_").replace("+", "_")
    else:  # no apt here: whatever was unpacked before
        found = sorted(base.glob("*/root")) if base.is_dir() else []
        if not found:
            raise BuildError("apt-cache knows no containerd; real nodes need Debian's packages")
        return found[-1].parent
    if (directory / "root" / "usr" / "bin" / "containerd").is_file():
        return directory
    say(f"devcluster: fetching {', '.join(PACKAGES)} from Debian into {directory}")
    download = directory / ".debs"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    got = subprocess.run(
        ["apt-get", "download", *PACKAGES],
        cwd=download,
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        raise BuildError(f"apt-get download {' '.join(PACKAGES)} failed:\n{got.stderr[-2000:]}")
    root = directory / ".root.partial"
    shutil.rmtree(root, ignore_errors=True)
    for deb in sorted(download.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    root.replace(directory / "root")
    shutil.rmtree(download, ignore_errors=True)
    return directory


def write_oci_archive(
    target: Path,
    files: Sequence[tuple[str, bytes, int]],
    *,
    name: str,
    entrypoint: Sequence[str],
    user: str = "",
) -> None:
    """An OCI image archive of one layer holding ``files`` (path, bytes, mode), written with the
    standard library: fixed times and order, so the same input gives the same archive."""
    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for path, data, mode in sorted(files):
            parts = path.strip("/").split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in made:
                    made.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(layer_raw.getvalue()).hexdigest()
    layer = gzip.compress(layer_raw.getvalue(), mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), **({"User": user} if user else {})},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()

    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    config_digest, _ = blob(config_bytes)
    layer_digest, _ = blob(layer)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest, _ = blob(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {"org.opencontainers.image.ref.name": name},
            }
        ],
    }
    entries = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
        *(
            (f"blobs/sha256/{digest.split(':')[1]}", data)
            for digest, data in (
                (config_digest, config_bytes),
                (layer_digest, layer),
                (manifest_digest, manifest_bytes),
            )
        ),
    ]
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in entries:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    partial.replace(target)


def pause_archive(*, say: Say = _say) -> Path:
    """The sandbox image: a static ``pause`` (C compiler, glibc's static library) as an OCI
    archive in the cache."""
    directory = cache_root() / f"node-pause-{_digest([], _PAUSE_C)}"
    archive = directory / "pause.oci.tar"
    if archive.is_file():
        return archive
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("a C compiler is needed to build the pause image (apt-get install gcc)")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "pause.c"
    source.write_text(_PAUSE_C)
    binary = directory / "pause"
    done = subprocess.run(
        [compiler, "-static", "-Os", "-s", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"building pause failed (libc6-dev's static libc?):\n{done.stderr}")
    say("devcluster: built the pause image")
    write_oci_archive(
        archive, [("pause", binary.read_bytes(), 0o755)], name=PAUSE_IMAGE, entrypoint=["/pause"]
    )
    return archive


@dataclass(frozen=True, slots=True)
class Binaries:
    kubelet: Path
    #: Debian's files unpacked: ``usr/bin/containerd``, ``usr/sbin/runc``, ``usr/lib/cni/*``.
    root: Path
    pause: Path

    @property
    def containerd(self) -> Path:
        return self.root / "usr" / "bin" / "containerd"

    @property
    def ctr(self) -> Path:
        return self.root / "usr" / "bin" / "ctr"

    @property
    def runc(self) -> Path:
        return self.root / "usr" / "sbin" / "runc"

    @property
    def cni(self) -> Path:
        return self.root / "usr" / "lib" / "cni"


def ensure(*, say: Say = _say) -> Binaries:
    """Build or fetch what real nodes run; a complete cache makes this a few file checks."""
    return Binaries(
        kubelet=build_kubelet(say=say),
        root=packages_dir(say=say) / "root",
        pause=pause_archive(say=say),
    )


def unavailable() -> str | None:
    """Why this machine cannot run a kubelet, or None when it can."""
    if os.geteuid() != 0:
        return "real nodes need root (network namespaces, mounts, cgroups)"
    if not Path("/sys/fs/cgroup").is_dir() or not _cgroup_mounts():
        return "no cgroup hierarchy is mounted"
    for tool in ("ip", "iptables", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


# --------------------------------------------------------------------------------------------
# Layout


@dataclass(frozen=True, slots=True)
class Network:
    """The host side: a bridge and the /16 its nodes and pods take addresses from."""

    tag: str  # short, unique per run folder; names every interface, namespace and cgroup
    octet: int  # the /16 is 10.<octet>.0.0

    @property
    def bridge(self) -> str:
        return f"shb{self.tag}"

    @property
    def host_ip(self) -> str:
        return f"10.{self.octet}.0.1"

    def node_ip(self, index: int) -> str:
        return f"10.{self.octet}.0.{10 + index}"

    def pod_subnet(self, index: int) -> str:
        return f"10.{self.octet}.{1 + index}.0/24"


def network_for(run_dir: Path) -> Network:
    """The run folder's network: its tag from the folder's name, and the first /16 from the
    folder's place in 10.200-249 that no other interface of the host uses (a bridge a killed run
    left with the same /24 takes the host's route, and the node cannot reach the API server).
    The same folder gets the same network while its bridge stands."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()
    tag = digest[:6]
    taken = _octets_in_use(but=Network(tag=tag, octet=0).bridge)
    start = int(digest[6:10], 16) % 50
    for step in range(50):
        octet = 200 + (start + step) % 50
        if octet not in taken:
            return Network(tag=tag, octet=octet)
    raise StartError("every 10.200-249.0.0/16 is in use by an interface of this host")


def _octets_in_use(*, but: str) -> set[int]:
    """Second octets of the host's 10.200-249 addresses, on interfaces other than ``but``."""
    listed = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    taken = set()
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[1] == but or not fields[3].startswith("10."):
            continue
        second = fields[3].split(".")[1]
        if second.isdigit() and 200 <= int(second) < 250:
            taken.add(int(second))
    return taken


@dataclass(slots=True)
class NodeRecord:
    """One real node as ``state.json`` keeps it."""

    name: str
    index: int
    ip: str
    netns: str
    folder: str
    kubelet_root: str
    cgroup_root: str
    containerd_socket: str
    procs: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def from_json(raw: dict[str, Any]) -> NodeRecord:
        return NodeRecord(**raw)


@dataclass(slots=True)
class RealNodes:
    network: Network
    nodes: list[NodeRecord]
    #: Fixed host paths that did not exist before ``up``.
    created_paths: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "network": asdict(self.network),
            "nodes": [asdict(n) for n in self.nodes],
            "created_paths": self.created_paths,
        }

    @staticmethod
    def from_json(raw: dict[str, Any]) -> RealNodes:
        return RealNodes(
            network=Network(**raw["network"]),
            nodes=[NodeRecord.from_json(n) for n in raw["nodes"]],
            created_paths=list(raw["created_paths"]),
        )


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise StartError(f"$ {' '.join(argv)}\n{done.stderr.strip()}")
    return done


def _in_ns(netns: str, argv: Sequence[str], *, check: bool = True) -> None:
    _run(["ip", "netns", "exec", netns, *argv], check=check)


def create_bridge(network: Network) -> None:
    """The host bridge with the address the API server binds (before it starts)."""
    _run(["ip", "link", "add", network.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{network.host_ip}/24", "dev", network.bridge])
    _run(["ip", "link", "set", network.bridge, "up"])


def delete_bridge(network: Network) -> None:
    _run(["ip", "link", "del", network.bridge], check=False)


# --------------------------------------------------------------------------------------------
# One node


def _cgroup_mounts() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, named ones and the v2 one)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split()[0] in ("cgroup", "cgroup2"):
                found.append(Path(left.split()[4]))
    return found


def _make_cgroup_root(name: str) -> None:
    for hierarchy in _cgroup_mounts():
        folder = hierarchy / name.strip("/")
        folder.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / knob).is_file() and (folder / knob).is_file():
                (folder / knob).write_text((hierarchy / knob).read_text())


def _kubelet_config(record: NodeRecord, keys: dict[str, Path]) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": record.cgroup_root,
        "oomScoreAdj": 0,
        "address": record.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(keys["serving_cert"]),
        "tlsPrivateKeyFile": str(keys["serving_key"]),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(keys["ca"])},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{record.containerd_socket}",
        "volumePluginDir": str(Path(record.folder) / "volume-plugins"),
        "podLogsDir": str(Path(record.folder) / "pod-logs"),
        "resolvConf": "",
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": True,
    }


def _containerd_config(record: NodeRecord, binaries: Binaries) -> str:
    folder = Path(record.folder)
    config = f"""version = 2
root = "{folder / "containerd" / "root"}"
state = "{folder / "containerd" / "state"}"
oom_score = 0

[grpc]
  address = "{record.containerd_socket}"

[ttrpc]
  address = "{record.containerd_socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  # Pods' network namespaces under this node's folder, which teardown unmounts (not in
  # /run/netns, where a node stopped with pods running left one per pod): containerd 1.6 reads
  # the flag (its state folder's netns/), later versions the path.
  netns_mounts_under_state_dir = true
  netns_mounts_under = "{folder / "netns"}"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{binaries.runc}"
        Root = "{folder / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{binaries.cni}"
    conf_dir = "{folder / "cni"}"

[plugins."io.containerd.runtime.v1.linux"]
  runtime = "{binaries.runc}"
  runtime_root = "{folder / "runtime-v1"}"
  state = "{folder / "containerd" / "state-v1"}"
"""
    return config


def _cni_config(record: NodeRecord, network: Network) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": f"shoal-{network.tag}-{record.index}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(Path(record.folder) / "ipam"),
                    "ranges": [[{"subnet": network.pod_subnet(record.index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def _dnat(netns: str, address: str, port: int, target: str) -> None:
    """Inside ``netns``: ``address:port`` (TCP) goes to ``target`` (``ip:port``)."""
    for chain in ("PREROUTING", "OUTPUT"):
        _in_ns(
            netns,
            [
                "iptables", "-t", "nat", "-A", chain, "-d", f"{address}/32", "-p", "tcp",
                "--dport", str(port), "-j", "DNAT", "--to-destination", target,
            ],
        )  # fmt: skip


def route(record: NodeRecord | dict[str, Any], address: str, port: int, target: str) -> None:
    """Send a node's (and its pods') TCP traffic for ``address:port`` to ``target``, an
    address on the host bridge: how a test puts a fake cloud metadata server at
    ``169.254.169.254``."""
    netns = record["netns"] if isinstance(record, dict) else record.netns
    if address == METADATA_IP:
        _in_ns(netns, ["ip", "addr", "replace", f"{address}/32", "dev", "lo"], check=False)
    _dnat(netns, address, port, target)


def start_node(
    *,
    index: int,
    run_dir: Path,
    network: Network,
    binaries: Binaries,
    keys: pki.Pki,
    server: str,
    images: Sequence[Path],
    labels: dict[str, str],
    die_with_parent: bool,
    records: list[NodeRecord],
    started: list[Proc],
    say: Say,
) -> NodeRecord:
    """Start one node's containerd (with ``images`` imported) and kubelet; returns its record.

    The record joins ``records`` before anything is made and every process joins ``started``
    as soon as it runs, so a failure on the way still leaves all of it to :func:`teardown`.
    """
    name = f"real-{index}"
    folder = run_dir / "nodes" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    record = NodeRecord(
        name=name,
        index=index,
        ip=network.node_ip(index),
        netns=f"shn{network.tag}{index}",
        folder=str(folder),
        # The first node's kubelet lives where users' manifests expect it (the agent mounts
        # /var/lib/kubelet/pod-resources) unless another kubelet is there; the others in their
        # own folders.
        kubelet_root=(
            "/var/lib/kubelet"
            if index == 0 and not os.path.lexists("/var/lib/kubelet")
            else str(folder / "kubelet")
        ),
        cgroup_root=f"/shoal-{network.tag}-{index}",
        # A socket path has a 108-byte limit a deep run folder can pass.
        containerd_socket=f"/run/shn{network.tag}{index}/containerd.sock",
    )
    records.append(record)
    host_end, node_end = f"shv{network.tag}{index}", f"shp{network.tag}{index}"
    _run(["ip", "netns", "add", record.netns])
    _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end])
    _run(["ip", "link", "set", host_end, "master", network.bridge, "up"])
    _run(["ip", "link", "set", node_end, "netns", record.netns])
    _in_ns(record.netns, ["ip", "link", "set", node_end, "name", "eth0"])
    _in_ns(record.netns, ["ip", "addr", "add", f"{record.ip}/24", "dev", "eth0"])
    _in_ns(record.netns, ["ip", "link", "set", "eth0", "up"])
    _in_ns(record.netns, ["ip", "link", "set", "lo", "up"])
    _in_ns(record.netns, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    _run(["ip", "route", "replace", network.pod_subnet(index), "via", record.ip])
    api_port = server.rsplit(":", 1)[1]
    _dnat(record.netns, SERVICE_IP, 443, f"{network.host_ip}:{api_port}")

    Path(record.containerd_socket).parent.mkdir(mode=0o700, exist_ok=True)
    for sub in ("cni", "netns", "ipam", "runc", "runtime-v1", "containerd", "pki"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    Path(record.kubelet_root).mkdir(parents=True, exist_ok=True)
    (folder / "cni" / "10-shoal.conflist").write_text(
        json.dumps(_cni_config(record, network), indent=2)
    )
    (folder / "containerd.toml").write_text(_containerd_config(record, binaries))
    _make_cgroup_root(record.cgroup_root)

    ns_enter = ["nsenter", f"--net=/run/netns/{record.netns}", "--"]
    path = f"{binaries.root / 'usr' / 'bin'}:{binaries.root / 'usr' / 'sbin'}:{os.environ['PATH']}"
    logs = run_dir / "logs"

    def spawn(component: str, argv: list[str]) -> Proc:
        say(f"devcluster: starting {component} on {name}")
        proc, _ = process.spawn(
            f"{component}-{name}",
            [*ns_enter, "env", f"PATH={path}", *argv],
            logs / f"{component}-{name}.log",
            die_with_parent=die_with_parent,
        )
        started.append(proc)
        record.procs.append(proc.to_json())
        return proc

    containerd = spawn(
        "containerd", [str(binaries.containerd), "--config", str(folder / "containerd.toml")]
    )
    _wait_for(
        "containerd's socket", lambda: Path(record.containerd_socket).exists(), 30, containerd
    )
    for archive in [binaries.pause, *images]:
        done = _run(
            [
                str(binaries.ctr), "--address", record.containerd_socket, "-n", "k8s.io",
                "images", "import", str(archive),
            ],
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise StartError(f"importing {archive} into {name}'s containerd: {done.stderr}")

    node_keys = pki.issue_node(keys, Path(folder) / "pki", name, record.ip)
    kubeconfig = folder / "kubelet.kubeconfig"
    kubeconfig.write_text(
        pki.kubeconfig(
            f"https://{network.host_ip}:{api_port}",
            keys.ca_cert,
            pki.Client(cert=node_keys["client_cert"], key=node_keys["client_key"]),
            user=f"system:node:{name}",
        )
    )
    config = folder / "kubelet.yaml"
    config.write_text(json.dumps(_kubelet_config(record, node_keys), indent=2))
    node_labels = {"shoal.dev/real-node": "true", **labels}
    spawn(
        "kubelet",
        [
            str(binaries.kubelet),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={record.kubelet_root}",
            f"--cert-dir={folder / 'pki'}",
            f"--hostname-override={name}",
            f"--node-ip={record.ip}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels.items())),
            "--v=1",
        ],
    )
    return record


def _wait_for(what: str, check: Callable[[], bool], timeout: float, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not process.alive(proc):
            raise StartError(f"{proc.name} exited while waiting for {what}; see {proc.log}")
        time.sleep(0.1)
    raise StartError(f"timed out waiting for {what}; see {proc.log}")


def existing_fixed_paths() -> set[str]:
    return {p for p in FIXED_HOST_PATHS if os.path.lexists(p)}


#: One devcluster with real nodes runs on a machine at a time: they share the kubelet's fixed
#: host paths, containerd's, CNI's and the agent's folders. This file names the run folder of
#: the cluster that holds the machine (and the process that claimed it).
MACHINE_CLAIM: Final = Path("/run/shoal-devcluster-real-nodes.json")
#: How long a cluster waits for another's real nodes to leave the machine, in seconds.
MACHINE_WAIT: Final = 1800.0
_CLAIM_LOCK: Final = Path("/run/shoal-devcluster-real-nodes.lock")


def claim_machine(run_dir: Path, *, timeout: float = MACHINE_WAIT, say: Say = _say) -> None:
    """Wait until no other devcluster's real nodes run on this machine, then hold it for
    ``run_dir`` until :func:`release_machine`. A holder is gone once the process that claimed
    it and every process of its real nodes have exited (a run killed before ``down``)."""
    run_dir = run_dir.resolve()
    deadline = time.monotonic() + timeout
    waiting_for = None
    while True:
        with _CLAIM_LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            holder = _holder()
            if holder is None or holder["run_dir"] == str(run_dir) or not _holder_alive(holder):
                holder = _kubelet_running()  # a cluster started by code without this claim
            if holder is None or holder["run_dir"] == str(run_dir):
                MACHINE_CLAIM.write_text(json.dumps({"run_dir": str(run_dir), "pid": os.getpid()}))
                return
        if time.monotonic() > deadline:
            raise StartError(
                f"the real nodes of the devcluster in {holder['run_dir']} still run on this "
                f"machine after {timeout:.0f} s; one devcluster with real nodes runs at a time"
            )
        if waiting_for != holder["run_dir"]:
            waiting_for = holder["run_dir"]
            say(f"devcluster: waiting for the real nodes of {waiting_for} to go (one at a time)")
        time.sleep(2)


def release_machine(run_dir: Path) -> None:
    run_dir = run_dir.resolve()
    with _CLAIM_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        holder = _holder()
        if holder is not None and holder["run_dir"] == str(run_dir):
            MACHINE_CLAIM.unlink(missing_ok=True)


def abandon(network: Network, run_dir: Path) -> None:
    """An ``up`` that failed: the host bridge goes and the machine is free again."""
    delete_bridge(network)
    release_machine(run_dir)


def _kubelet_running() -> dict[str, Any] | None:
    """A kubelet of this project's build running on the machine, as a holder (its root)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/kubelet") and str(cache_root()).encode() in argv[0]:
            roots = [a.decode(errors="replace") for a in argv if a.startswith(b"--root-dir=")]
            return {"run_dir": f"the kubelet {entry.name} ({' '.join(roots)})"}
    return None


def _holder() -> dict[str, Any] | None:
    try:
        raw = json.loads(MACHINE_CLAIM.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return raw if isinstance(raw, dict) and "run_dir" in raw else None


def _holder_alive(holder: dict[str, Any]) -> bool:
    with contextlib.suppress(ProcessLookupError, PermissionError, TypeError, ValueError):
        os.kill(int(holder.get("pid", 0)) or -1, 0)
        return True
    try:
        state = json.loads((Path(holder["run_dir"]) / "state.json").read_text())
    except (OSError, ValueError):
        return False
    nodes = (state.get("real_nodes") or {}).get("nodes", [])
    return any(process.alive(Proc.from_json(p)) for node in nodes for p in node.get("procs", []))


def clear_node_state(*, say: Say = _say) -> None:
    """Remove the node state folders an earlier cluster left (one killed before ``down``), and
    its kubelet root at /var/lib/kubelet (mounts under it detached first): the machine is this
    cluster's (:func:`claim_machine`), and a first node that found it would run its kubelet
    elsewhere, where the chart's agent does not look for the pod-resources socket."""
    if os.path.lexists(KUBELET_ROOT):
        for point in sorted((p for p in _mounts() if _under(p, [KUBELET_ROOT])), key=len)[::-1]:
            _umount(point)
        shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
        say(f"devcluster: removed {KUBELET_ROOT}, left by an earlier real node")
    for path in NODE_STATE_PATHS:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            say(f"devcluster: removed {path}, left by an earlier real node")


# --------------------------------------------------------------------------------------------
# Teardown


def _mounts() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.append(line.split()[4].replace("\\040", " "))
    return points


def _umount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(point.encode(), _MNT_DETACH)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _kill_cgroup_tree(name: str) -> None:
    """SIGKILL every process in the cgroup ``name`` (every hierarchy), then remove it
    bottom-up."""
    for hierarchy in _cgroup_mounts():
        top = hierarchy / name.strip("/")
        if not top.is_dir():
            continue
        folders = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for folder in [*folders, top]:
            _empty(folder)
        for folder in [*folders, top]:
            _rmdir(folder)


def _empty(folder: Path) -> None:
    for _attempt in range(50):
        pids = _pids(folder)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _rmdir(folder: Path) -> None:
    for _attempt in range(50):
        try:
            folder.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
        else:
            return


def _pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (FileNotFoundError, OSError):
        return []


def _shims(socket: str) -> list[int]:
    """containerd's shims serving ``socket`` (they outlive containerd by design)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket.encode() in argv:
            found.append(int(entry.name))
    return found


def teardown(nodes: RealNodes, *, say: Say = _say) -> list[str]:
    """Stop every real node and remove what it made; returns what could not be removed."""
    left: list[str] = []
    for record in nodes.nodes:
        left += _teardown_node(record, nodes.network, say)
    for path in nodes.created_paths:
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):
            left.append(path)
    delete_bridge(nodes.network)
    return left


def _teardown_node(record: NodeRecord, network: Network, say: Say) -> list[str]:
    left = []
    for raw in reversed(record.procs):
        proc = Proc.from_json(raw)
        if process.stop(proc, grace=3):
            say(f"devcluster: stopped {proc.name}")
        else:
            left.append(proc.name)
    for pid in _shims(record.containerd_socket):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _kill_cgroup_tree(record.cgroup_root)
    roots = [record.folder, record.kubelet_root]
    for _attempt in range(3):
        for point in sorted((p for p in _mounts() if _under(p, roots)), key=len, reverse=True):
            _umount(point)
    if any(_under(p, roots) for p in _mounts()):
        left.append(f"mounts under {record.folder}")
    _run(["ip", "netns", "del", record.netns], check=False)
    for cached in Path("/var/lib/cni/results").glob(f"shoal-{network.tag}-*"):
        cached.unlink(missing_ok=True)
    _run(["ip", "route", "del", network.pod_subnet(record.index)], check=False)
    shutil.rmtree(record.folder, ignore_errors=True)
    shutil.rmtree(Path(record.containerd_socket).parent, ignore_errors=True)
    if record.kubelet_root != "/var/lib/kubelet":
        shutil.rmtree(record.kubelet_root, ignore_errors=True)
    return left
