"""Start and stop a local control plane: etcd, kube-apiserver, kube-controller-manager, kwok.

State machine of a run folder: ``up`` writes ``state.json`` only after every component is ready,
and removes the processes it started on any failure on the way; ``down`` stops what
``state.json`` records (newest component first) and then deletes it. A folder without
``state.json`` has no cluster. Logs stay in ``<run>/logs/`` after ``down``.
"""

from __future__ import annotations

import functools
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster import pki, ports, process, realnode
from devcluster.errors import NotRunningError, StartError
from devcluster.process import Proc

STATE = "state.json"
ADMIN_KUBECONFIG = "admin.kubeconfig"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"

#: Controllers the tests, the demo and the agent rely on, and the ones they imply.
CONTROLLERS = (
    "job-controller",
    "cronjob-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "taint-eviction-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "disruption-controller",
    "ttl-after-finished-controller",
    "endpointslice-controller",
)

Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def default_run_dir() -> Path:
    return Path.home() / ".cache" / "shoal" / "run" / "default"


#: Kubernetes' workload scheduling APIs: ``scheduling.k8s.io`` PodGroups, kube-scheduler's own gang
#: scheduling and topology-aware placement, and Jobs that make their own PodGroups. The integration
#: tests and the benchmarks run with them on (``feature_gates=WORKLOAD_GATES,
#: runtime_config=WORKLOAD_RUNTIME_CONFIG``).
WORKLOAD_GATES = (
    "GenericWorkload=true",
    "TopologyAwareWorkloadScheduling=true",
    "WorkloadWithJob=true",
)
WORKLOAD_RUNTIME_CONFIG = ("scheduling.k8s.io/v1beta1=true",)


@dataclass(frozen=True, slots=True)
class Options:
    """How to start a cluster. Client QPS/burst apply to the built-in controllers."""

    kube_scheduler: bool = False
    die_with_parent: bool = False
    controller_qps: int = 200
    controller_burst: int = 400
    #: Client rate limits of the stock kube-scheduler (benchmarks set Shoal's to the same); a
    #: negative QPS lifts the limit (client-go then makes no rate limiter).
    scheduler_qps: int = 5000
    scheduler_burst: int = 5000
    ready_timeout: float = 120.0
    #: ``Name=true`` feature gates for every component that takes them (API server, controller
    #: manager, kube-scheduler).
    feature_gates: tuple[str, ...] = ()
    #: The API server's ``--runtime-config`` entries, such as ``scheduling.k8s.io/v1beta1=true``.
    runtime_config: tuple[str, ...] = ()
    #: The node-lifecycle controller's ``--node-monitor-grace-period`` (its default when
    #: ``None``): how long a node's lease may go unrenewed before it is marked unreachable and
    #: tainted. Benchmarks lengthen it: on a loaded 2-core machine kwok renews thousands of
    #: leases late, which real kubelets on their own machines would not.
    node_monitor_grace_period: str | None = None
    #: Real nodes (a kubelet, containerd and runc each, in a network namespace of their own)
    #: beside the kwok nodes: ``real-0``, ``real-1``... (devcluster/realnode.py). Needs root.
    real_nodes: int = 0
    #: OCI archives imported into every real node's containerd (the pause image always is).
    real_node_images: tuple[str, ...] = ()
    #: Extra labels of the real nodes, ``key=value``.
    real_node_labels: tuple[str, ...] = ()

    def gate_on(self, name: str) -> bool:
        return f"{name}=true" in {g.replace(" ", "") for g in self.feature_gates}

    def gate_flags(self) -> list[str]:
        return [f"--feature-gates={','.join(self.feature_gates)}"] if self.feature_gates else []


@dataclass(slots=True)
class Cluster:
    """A running devcluster, as recorded in its run folder."""

    run_dir: Path
    server: str
    ports: dict[str, int]
    procs: list[Proc]
    versions: dict[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    ready_seconds: float = 0.0
    #: :class:`devcluster.realnode.RealNodes` as JSON, when the cluster has real nodes.
    real_nodes: dict[str, Any] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / ADMIN_KUBECONFIG

    @property
    def ca_cert(self) -> Path:
        return self.run_dir / "pki" / "ca.crt"

    def save(self) -> None:
        doc = {
            "server": self.server,
            "ports": self.ports,
            "procs": [p.to_json() for p in self.procs],
            "versions": self.versions,
            "started_at": self.started_at,
            "ready_seconds": self.ready_seconds,
            "kubeconfig": str(self.kubeconfig),
            "real_nodes": self.real_nodes,
        }
        tmp = self.run_dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.run_dir / STATE)

    @staticmethod
    def load(run_dir: Path) -> Cluster:
        path = run_dir / STATE
        if not path.is_file():
            raise NotRunningError(f"no devcluster recorded in {run_dir} (run `up` first)")
        doc = json.loads(path.read_text())
        return Cluster(
            run_dir=run_dir,
            server=doc["server"],
            ports={k: int(v) for k, v in doc["ports"].items()},
            procs=[Proc.from_json(p) for p in doc["procs"]],
            versions=dict(doc.get("versions", {})),
            started_at=float(doc.get("started_at", 0)),
            ready_seconds=float(doc.get("ready_seconds", 0)),
            real_nodes=dict(doc.get("real_nodes") or {}),
        )

    def real_node_names(self) -> list[str]:
        return [n["name"] for n in self.real_nodes.get("nodes", [])]

    def real_node(self, name: str) -> dict[str, Any]:
        """A real node's record (``ip``, ``netns``, ``folder``, ``kubelet_root``...)."""
        return next(n for n in self.real_nodes.get("nodes", []) if n["name"] == name)

    def rss_bytes(self) -> dict[str, int]:
        return {p.name: process.rss_bytes(p) for p in self.procs}


def free_ports(names: list[str]) -> dict[str, int]:
    """Distinct free loopback ports, all held open until every one is chosen
    (:mod:`devcluster.ports`)."""
    return dict(zip(names, ports.free_ports(len(names)), strict=True))


def _tls_context(run_dir: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(run_dir / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(run_dir / "pki" / "admin.crt"), str(run_dir / "pki" / "admin.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _wait(what: str, check: Callable[[], bool], timeout: float, watched: list[Proc]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in watched:
            if not process.alive(proc):
                raise StartError(
                    f"{proc.name} exited while waiting for {what}; its log {proc.log} ends:\n"
                    f"{_tail(proc.log)}"
                )
        if check():
            return
        time.sleep(0.2)
    last = watched[-1]
    raise StartError(
        f"timed out after {timeout:.0f} s waiting for {what}; {last.name}'s log {last.log} "
        f"ends:\n{_tail(last.log)}"
    )


def up(run_dir: Path, bin_dir: Path, options: Options = Options(), *, say: Say = _say) -> Cluster:
    """Start a cluster in ``run_dir`` and return it once the API server and controllers serve."""
    run_dir = run_dir.resolve()
    if (run_dir / STATE).exists():
        existing = Cluster.load(run_dir)
        if any(process.alive(p) for p in existing.procs):
            raise StartError(
                f"a devcluster is already running from {run_dir} at {existing.server}; "
                "run `python -m devcluster down` first"
            )
        (run_dir / STATE).unlink()
    for stale in ("etcd-data", "pki", "logs"):
        shutil.rmtree(run_dir / stale, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    prepared = _prepare_real_nodes(run_dir, options, say) if options.real_nodes else None
    network = prepared[0] if prepared else None
    address = network.host_ip if network else "127.0.0.1"
    keys = pki.generate(run_dir / "pki", extra_ips=(address,) if network else ())
    ports = free_ports(
        ["etcd", "etcd_peer", "apiserver", "controller_manager", "kwok", "scheduler"]
    )
    server = f"https://{address}:{ports['apiserver']}"
    for name, client in keys.clients.items():
        filename = ADMIN_KUBECONFIG if name == "admin" else f"{name}.kubeconfig"
        (run_dir / filename).write_text(pki.kubeconfig(server, keys.ca_cert, client, user=name))

    procs: list[Proc] = []
    popens: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str]) -> Proc:
        say(f"devcluster: starting {name}")
        proc, popen = process.spawn(
            name, argv, run_dir / "logs" / f"{name}.log", die_with_parent=options.die_with_parent
        )
        procs.append(proc)
        popens.append(popen)
        return proc

    tls = _tls_context(run_dir)
    try:
        start("etcd", _etcd_argv(bin_dir, run_dir, ports))
        etcd_health = f"http://127.0.0.1:{ports['etcd']}/health"
        _wait("etcd /health", lambda: _get(etcd_health, None) == 200, 30, procs)

        start("kube-apiserver", _apiserver_argv(bin_dir, keys, ports, options, address))
        _wait(
            "kube-apiserver /readyz",
            lambda: _get(f"{server}/readyz", tls) == 200,
            options.ready_timeout,
            procs,
        )

        start(
            "kube-controller-manager",
            _controller_manager_argv(bin_dir, run_dir, keys, ports, options),
        )
        _write_kwok_stages(bin_dir, run_dir)
        start("kwok", _kwok_argv(bin_dir, run_dir, ports))
        if options.kube_scheduler:
            start("kube-scheduler", _scheduler_argv(bin_dir, run_dir, ports, options))
        default_sa = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
        _wait(
            "the controller manager to create the default ServiceAccount",
            lambda: _get(default_sa, tls) == 200,
            options.ready_timeout,
            procs,
        )
        kwok_health = f"http://127.0.0.1:{ports['kwok']}/healthz"
        _wait("kwok /healthz", lambda: _get(kwok_health, None) == 200, 30, procs)
        real_json = (
            _start_real_nodes(
                run_dir, options, prepared, keys=keys, server=server, procs=procs, say=say
            )
            if prepared
            else {}
        )
    except BaseException:
        for proc in reversed(procs):
            process.stop(proc, grace=3)
        if network is not None:
            realnode.abandon(network, run_dir)
        raise

    cluster = Cluster(
        run_dir=run_dir,
        server=server,
        ports=ports,
        procs=procs,
        versions=_versions(bin_dir),
        started_at=time.time(),
        ready_seconds=round(time.monotonic() - started, 2),
        real_nodes=real_json,
    )
    cluster.save()
    say(f"devcluster: ready at {server} in {cluster.ready_seconds:.1f} s")
    return cluster


def down(run_dir: Path, *, say: Say = _say) -> list[str]:
    """Stop every component recorded in ``run_dir``; returns the names that would not stop."""
    run_dir = run_dir.resolve()
    cluster = Cluster.load(run_dir)
    stubborn = []
    if cluster.real_nodes:
        stubborn += realnode.teardown(realnode.RealNodes.from_json(cluster.real_nodes), say=say)
        realnode.release_machine(run_dir)
    for proc in reversed(cluster.procs):
        if not process.stop(proc):
            stubborn.append(proc.name)
        else:
            say(f"devcluster: stopped {proc.name}")
    if not stubborn:
        (run_dir / STATE).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "etcd-data", ignore_errors=True)
    return stubborn


def restart(
    cluster: Cluster,
    name: str,
    *,
    say: Say = _say,
    timeout: float = 120,
    argv: Sequence[str] | None = None,
) -> Cluster:
    """Stop one component and start it again with the same command line and ports.

    For fault-injection tests (an API server or etcd restart under load). ``argv`` replaces the
    command line (e.g. the API server's with tiny in-flight limits; a later restart with the
    original one undoes it). Waits until the API server answers ``/readyz`` again; the run
    folder's state records the new process.
    """
    index = next((i for i, p in enumerate(cluster.procs) if p.name == name), None)
    if index is None:
        raise NotRunningError(f"{name} is not a component of the devcluster in {cluster.run_dir}")
    old = cluster.procs[index]
    if not old.argv:
        raise StartError(f"{name} was recorded without its command line; restart the cluster")
    process.stop(old)
    say(f"devcluster: restarting {name}")
    command = list(argv) if argv is not None else list(old.argv)
    new, _popen = process.spawn(name, command, Path(old.log), die_with_parent=old.die_with_parent)
    cluster.procs[index] = new
    cluster.save()
    tls = _tls_context(cluster.run_dir)
    _wait(
        "kube-apiserver /readyz after a restart",
        lambda: _get(f"{cluster.server}/readyz", tls) == 200,
        timeout,
        cluster.procs,
    )
    return cluster


Prepared = tuple[realnode.Network, realnode.Binaries, list[str]]


def _prepare_real_nodes(run_dir: Path, options: Options, say: Say) -> Prepared:
    """Before the API server starts: the binaries, and the host bridge whose address it binds;
    with the fixed host paths the nodes will create."""
    reason = realnode.unavailable()
    if reason:
        raise StartError(f"this machine cannot run {options.real_nodes} real nodes: {reason}")
    binaries = realnode.ensure(say=say)
    network = realnode.network_for(run_dir)
    realnode.claim_machine(run_dir, say=say)  # released by down, or below when up fails
    realnode.clear_node_state(say=say)
    before = realnode.existing_fixed_paths()
    realnode.delete_bridge(network)  # one a killed run left
    realnode.create_bridge(network)
    return network, binaries, [p for p in realnode.FIXED_HOST_PATHS if p not in before]


def _start_real_nodes(
    run_dir: Path,
    options: Options,
    prepared: Prepared,
    *,
    keys: pki.Pki,
    server: str,
    procs: list[Proc],
    say: Say,
) -> dict[str, Any]:
    """Start every real node and wait until each is Ready; on a failure, remove them all."""
    network, binaries, created_paths = prepared
    real = realnode.RealNodes(network=network, nodes=[], created_paths=created_paths)
    node_procs: list[Proc] = []
    tls = _tls_context(run_dir)
    try:
        for index in range(options.real_nodes):
            realnode.start_node(
                index=index,
                run_dir=run_dir,
                network=network,
                binaries=binaries,
                keys=keys,
                server=server,
                images=[Path(i) for i in options.real_node_images],
                labels=dict(i.split("=", 1) for i in options.real_node_labels),
                die_with_parent=options.die_with_parent,
                records=real.nodes,
                started=node_procs,
                say=say,
            )
        for record in real.nodes:
            url = f"{server}/api/v1/nodes/{record.name}"
            _wait(
                f"real node {record.name} Ready",
                functools.partial(_node_ready, url, tls),
                options.ready_timeout,
                [*procs, *node_procs],
            )
    except BaseException:
        realnode.teardown(real, say=say)
        raise
    return real.to_json()


def _node_ready(url: str, tls: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=tls, timeout=2) as resp:  # noqa: S310
            node = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _versions(bin_dir: Path) -> dict[str, str]:
    manifest = bin_dir / "manifest.json"
    if not manifest.is_file():
        return {}
    raw = json.loads(manifest.read_text())
    return {k: str(raw[k]) for k in ("kubernetes", "etcd", "kwok") if k in raw}


def _etcd_argv(bin_dir: Path, run_dir: Path, ports: dict[str, int]) -> list[str]:
    client = f"http://127.0.0.1:{ports['etcd']}"
    peer = f"http://127.0.0.1:{ports['etcd_peer']}"
    return [
        str(bin_dir / "etcd"),
        "--name=devcluster",
        f"--data-dir={run_dir / 'etcd-data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        "--initial-cluster-state=new",
        # A throwaway test cluster: durability across power loss is not worth the fsyncs.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def _apiserver_argv(
    bin_dir: Path,
    keys: pki.Pki,
    ports: dict[str, int],
    options: Options,
    address: str = "127.0.0.1",
) -> list[str]:
    runtime = (
        [f"--runtime-config={','.join(options.runtime_config)}"] if options.runtime_config else []
    )
    kubelets = (
        [
            # Real kubelets: reached at their own addresses, with a client certificate, their
            # serving certificates checked; webhooks reached at their pods (no kube-proxy here).
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={keys.clients['kubelet-client'].cert}",
            f"--kubelet-client-key={keys.clients['kubelet-client'].key}",
            f"--kubelet-certificate-authority={keys.ca_cert}",
            "--enable-aggregator-routing=true",
        ]
        if options.real_nodes
        else []
    )
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
        f"--bind-address={address}",
        f"--advertise-address={address}",
        f"--secure-port={ports['apiserver']}",
        f"--tls-cert-file={keys.serving_cert}",
        f"--tls-private-key-file={keys.serving_key}",
        f"--client-ca-file={keys.ca_cert}",
        # Front-proxy authentication is configured (so aggregated-API clients find its CA) but
        # trusts only a client name this PKI never issues.
        f"--requestheader-client-ca-file={keys.ca_cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={keys.sa_public}",
        f"--service-account-signing-key-file={keys.sa_private}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # No kubelets to reach and no real Service endpoints on loopback.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
        "--event-ttl=1h",
        *options.gate_flags(),
        *runtime,
        *kubelets,
        "--v=1",
    ]


def _controller_manager_argv(
    bin_dir: Path, run_dir: Path, keys: pki.Pki, ports: dict[str, int], options: Options
) -> list[str]:
    kubeconfig = run_dir / "controller-manager.kubeconfig"
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['controller_manager']}",
        "--leader-elect=false",
        "--controllers=" + ",".join(_controllers(options)),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={keys.sa_private}",
        f"--root-ca-file={keys.ca_cert}",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--kube-api-qps={options.controller_qps}",
        f"--kube-api-burst={options.controller_burst}",
        *options.gate_flags(),
        *(
            [f"--node-monitor-grace-period={options.node_monitor_grace_period}"]
            if options.node_monitor_grace_period
            else []
        ),
        "--profiling=false",
        "--v=1",
    ]


def _controllers(options: Options) -> list[str]:
    """:data:`CONTROLLERS`, and with workloads on the one that lets PodGroups go: the API server
    puts its ``scheduling.k8s.io/podgroup-protection`` finalizer on each, and without the
    controller neither they nor their namespaces ever finish deleting."""
    extra = ["podgroup-protection-controller"] if options.gate_on("GenericWorkload") else []
    if options.real_nodes:
        # Real pods mount a projected service-account token, which needs the root CA ConfigMap.
        extra.append("root-ca-certificate-publisher-controller")
    return [*CONTROLLERS, *extra]


def _kwok_argv(bin_dir: Path, run_dir: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={run_dir / 'kwok.kubeconfig'}",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        # Node leases keep the node-lifecycle controller from declaring fake nodes unreachable.
        "--node-lease-duration-seconds=40",
        f"--config={run_dir / 'kwok-stages.yaml'}",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        "--cidr=" + POD_CIDR,
        "--node-ip=127.0.0.1",
    ]


#: kwok's "pod-complete" stage marks every Running pod owned by a Job Succeeded at once; training
#: workers run until they are told to leave, so Job pods here run until deleted (a test that
#: wants a pod to finish sets its phase, as a kubelet would).
_SKIPPED_STAGES = frozenset({"pod-complete"})


def _write_kwok_stages(bin_dir: Path, run_dir: Path) -> None:
    """kwok's default stages (node init and lease heartbeat; pod ready and delete)."""
    result = subprocess.run(
        [str(bin_dir / "kwok-stages")], capture_output=True, text=True, check=False, timeout=30
    )
    if result.returncode != 0:
        raise StartError(f"kwok-stages failed: {result.stderr.strip()}")
    stages = [
        doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc.get("metadata", {}).get("name") not in _SKIPPED_STAGES
    ]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-delete":
            # Delete only once the pod has terminated (below), as a kubelet would.
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": ".status.phase", "operator": "NotIn", "values": ["Running", "Pending"]}
            )
    stages.append(_POD_TERMINATE)
    (run_dir / "kwok-stages.yaml").write_text(yaml.safe_dump_all(stages, sort_keys=False))


#: A pod being deleted first terminates (phase Failed), as its containers would under a kubelet.
#: Without this, a Job's pod keeps the Job controller's tracking finalizer forever: the
#: controller releases it only for terminal pods, so an evicted worker is never replaced.
_POD_TERMINATE = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1",
    "kind": "Stage",
    "metadata": {"name": "devcluster-pod-terminate"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {
            "matchExpressions": [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Running", "Pending"]},
            ]
        },
        "next": {"statusTemplate": "phase: Failed\n"},
    },
}


def _scheduler_argv(
    bin_dir: Path, run_dir: Path, ports: dict[str, int], options: Options
) -> list[str]:
    kubeconfig = run_dir / "scheduler.kubeconfig"
    configuration = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(kubeconfig),
            "qps": options.scheduler_qps,
            "burst": options.scheduler_burst,
        },
        "leaderElection": {"leaderElect": False},
    }
    config_path = run_dir / "kube-scheduler.yaml"
    config_path.write_text(json.dumps(configuration, indent=2) + "\n")
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={config_path}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['scheduler']}",
        *options.gate_flags(),
        "--v=1",
    ]
