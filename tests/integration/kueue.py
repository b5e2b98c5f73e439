"""Kueue, built from its pinned Go module (``devcluster/tools/kueue``), run as a local process
against a devcluster the way its Deployment runs it in a cluster, with its webhooks reached by the
API server.

What the release installs, this harness installs, unedited: its namespace, the CRDs, the webhook
configurations, the webhook Service and the empty certificate Secret, as ``kustomize build
config/default`` of the module builds them (the build Kueue's release manifests come from), with
the devcluster's own ``kubectl kustomize``. Its RBAC, Deployment and visibility APIService are
not applied: the process runs with the admin kubeconfig, and the visibility server is off.

What the Deployment's pod would have, this harness provides:

* the Secret volume: Kueue's certificate rotator fills the Secret and patches the caBundle of the
  webhook configurations and of the CRDs' conversion webhooks itself; :class:`SecretMount` does
  what the kubelet does with the Secret volume, writing ``tls.crt`` and ``tls.key`` into the
  process's certificate folder, again whenever they change;
* the Service's address: the API server runs on the host with no kube-proxy, and calls a webhook
  Service at its ClusterIP (the resolver it uses without ``--enable-aggregator-routing``).
  :class:`WebhookNetwork` is a network namespace of the harness's own, joined to the host by a
  veth pair: the ClusterIP is an address inside it, the host routes that one address (a /32) to
  it, and inside it the Service's port is forwarded (DNAT, then masquerade) to the webhook
  server, which listens on the host's end of the pair. Nothing is routed anywhere else, and the
  route lives on the veth, so it goes with the namespace.

Leader election is off, health and metrics listen on free loopback ports, and Kueue manages the
namespaces labelled :data:`MANAGED_LABEL` (the tests' own), with the integrations of
:data:`FRAMEWORKS` and ``waitForPodsReady`` off.

Below the harness, what the test modules with the real Kueue share: their control plane with
Kueue as module fixtures, a namespace it manages, :class:`Queues` (a ResourceFlavor, ClusterQueues
in a cohort or not, their LocalQueues), the Workloads' history, Jobs that Shoal schedules as
gangs, and :func:`partly_bound`, the check that no gang was ever left partly bound."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import shutil
import ssl
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from base64 import b64decode
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import yaml
from aiohttp import web
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from contracts import names
from devcluster import cluster, process, tools
from devcluster.ports import free_port
from tests.integration.conftest import Devcluster
from tests.integration.history import History, State
from tests.integration.reliability.owncluster import own_devcluster
from tests.integration.scheduler import training_operator
from tests.integration.scheduler.conftest import KWOK_TOLERATION, TEST_LABEL, Pods, Pool
from tests.waiting import STARTS_WITHIN, eventually, poll

NAME: Final = "kueue"
#: Where the release installs Kueue (its kustomization's ``namespace``).
NAMESPACE: Final = "kueue-system"
SERVICE: Final = "kueue-webhook-service"
SECRET: Final = "kueue-webhook-server-cert"
WEBHOOK_CONFIGURATIONS: Final = (
    "kueue-mutating-webhook-configuration",
    "kueue-validating-webhook-configuration",
)
FRAMEWORKS: Final = ("batch/job", "kubeflow.org/pytorchjob", "pod")
#: Namespaces carrying this label (value ``true``) are the ones Kueue manages.
MANAGED_LABEL: Final = "shoal.dev/kueue-managed"

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
POD_GROUP_LABEL: Final = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_ANNOTATION: Final = "kueue.x-k8s.io/pod-group-total-count"
#: The scheduling gate Kueue's pod webhook puts on every pod it manages until admission.
ADMISSION_GATE: Final = "kueue.x-k8s.io/admission"


def binary() -> Path:
    return tools.ensure(NAME)


def unavailable() -> str | None:
    """Why the harness cannot run here, or None."""
    if os.geteuid() != 0:
        return (
            "Kueue's webhooks are reached through a network namespace of the test's own "
            "(ip netns, a veth pair, iptables), which needs root"
        )
    missing = [command for command in ("ip", "iptables") if shutil.which(command) is None]
    if missing:
        return f"Kueue's webhooks are reached through a network namespace; {missing} not found"
    return None


def published(kubectl: Path) -> list[dict[str, Any]]:
    """Every object of Kueue's release build, from the module as published."""
    folder = tools.module_dir(NAME) / "config" / "default"
    result = subprocess.run(
        [str(kubectl), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder} failed:\n{result.stderr[-3000:]}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return result


@dataclass
class WebhookNetwork:
    """A network namespace joined to the host by a veth pair on a /30 of 10.251.0.0/16 that no
    host interface uses: :meth:`route` makes an address inside it answer on the host."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    host_ip: str = ""
    ns_ip: str = ""

    @property
    def netns(self) -> str:
        return f"kq{self.tag}"

    @property
    def host_end(self) -> str:
        return f"kq{self.tag}h"

    @property
    def ns_end(self) -> str:
        return f"kq{self.tag}n"

    def _in_ns(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(["ip", "netns", "exec", self.netns, *argv], check=check)

    def create(self) -> WebhookNetwork:
        used = [
            ipaddress.ip_interface(line.split()[3])
            for line in _run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines()
        ]
        while True:
            subnet = ipaddress.ip_network(
                f"10.251.{random.randrange(256)}.{4 * random.randrange(64)}/30"
            )
            if not any(address.ip in subnet for address in used):
                break
        host, ns = list(subnet.hosts())
        self.host_ip, self.ns_ip = str(host), str(ns)
        _run(["ip", "netns", "add", self.netns])
        try:
            _run(["ip", "link", "add", self.host_end, "type", "veth", "peer", "name", self.ns_end])
            _run(["ip", "link", "set", self.ns_end, "netns", self.netns])
            _run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_end])
            _run(["ip", "link", "set", self.host_end, "up"])
            self._in_ns(["ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_end])
            self._in_ns(["ip", "link", "set", self.ns_end, "up"])
            self._in_ns(["ip", "link", "set", "lo", "up"])
            self._in_ns(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
            self._in_ns(["sysctl", "-qw", "net.ipv4.conf.all.send_redirects=0"])
        except BaseException:
            self.delete()
            raise
        return self

    def route(self, address: str, port: int, target_port: int) -> bool:
        """Make ``address:port`` (TCP) reach ``host_ip:target_port``: the address is put inside
        the namespace, which forwards that port to the host's end; the host routes the address
        (a /32) into the namespace. False when the host already routes that address."""
        added = _run(
            ["ip", "route", "add", f"{address}/32", "via", self.ns_ip, "dev", self.host_end],
            check=False,
        )
        if added.returncode != 0:
            return False
        target = f"{self.host_ip}:{target_port}"
        self._in_ns(["ip", "addr", "add", f"{address}/32", "dev", "lo"])
        self._in_ns(
            [
                "iptables", "-t", "nat", "-A", "PREROUTING", "-d", f"{address}/32", "-p", "tcp",
                "--dport", str(port), "-j", "DNAT", "--to-destination", target,
            ]
        )  # fmt: skip
        # The answer must come back through the namespace to be translated back, so the
        # forwarded connection leaves from the namespace's address.
        self._in_ns(
            [
                "iptables", "-t", "nat", "-A", "POSTROUTING", "-d", f"{self.host_ip}/32", "-p",
                "tcp", "--dport", str(target_port), "-j", "MASQUERADE",
            ]
        )  # fmt: skip
        return True

    def delete(self) -> None:
        """The namespace and the pair (the routes on the host's end go with it)."""
        _run(["ip", "link", "del", self.host_end], check=False)
        _run(["ip", "netns", "del", self.netns], check=False)


class SecretMount:
    """What the kubelet does with a Secret volume: the Secret's ``tls.crt`` and ``tls.key``
    written into ``folder`` (the key first, each renamed into place), again whenever they
    change, from a thread that reads the Secret every half second."""

    def __init__(self, kubeconfig: str, namespace: str, name: str, folder: Path) -> None:
        self._api = config.new_client_from_config(config_file=kubeconfig)
        self._namespace, self._name, self._folder = namespace, name, folder
        self._stop = threading.Event()
        self._written: dict[str, bytes] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="secret-mount", daemon=True)

    def start(self) -> SecretMount:
        self._folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
                self.error = None
            except Exception as exc:  # the API server may be busy; the next read retries
                self.error = exc
            self._stop.wait(0.5)

    def sync(self) -> None:
        secret = client.CoreV1Api(self._api).read_namespaced_secret(self._name, self._namespace)
        data = secret.data or {}
        if not data.get("tls.crt") or not data.get("tls.key"):
            return
        for key in ("tls.key", "tls.crt"):
            content = b64decode(data[key])
            if self._written.get(key) == content:
                continue
            handle, staging = tempfile.mkstemp(dir=self._folder, prefix=f".{key}.")
            with os.fdopen(handle, "wb") as out:
                out.write(content)
            os.replace(staging, self._folder / key)
            self._written[key] = content

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._api.close()


class VersionProxy:
    """A plain-HTTP reverse proxy on loopback in front of the API server (with the admin's
    client certificate), which answers ``GET /version`` itself with the Kubernetes release the
    control plane is built from. The devcluster's binaries carry no version stamp, so the API
    server says ``v0.0.0-master+$Format:%H$``, which Kueue v0.17 cannot parse and exits on
    (``kubeversion.FetchServerVersion``). Everything else, watches included, streams through."""

    def __init__(self, devcluster: Devcluster) -> None:
        self._handle = devcluster.handle
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> VersionProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        pki = self._handle.run_dir / "pki"
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls, limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/version":
            release = self._handle.versions.get("kubernetes", "v1.37.0")
            major, minor = release.lstrip("v").split(".")[:2]
            return web.json_response(
                {"major": major, "minor": minor, "gitVersion": release, "platform": "linux/amd64"}
            )
        assert self._session is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "connection", "transfer-encoding", "keep-alive")
        }
        body = await request.read()
        url = self._handle.server + request.rel_url.raw_path_qs
        async with self._session.request(
            request.method, url, headers=headers, data=body or None
        ) as upstream:
            answer = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    answer.headers.add(key, value)
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}
                    ],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "c",
                }
            )
        )
        return path

    def stop(self) -> None:
        async def close() -> None:
            # The upstream connections first: the watches still open end with them.
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def _create(api: Any, obj: dict[str, Any]) -> None:
    """Create one published object (or leave the one there)."""
    kind = obj["kind"]
    try:
        if kind == "Namespace":
            client.CoreV1Api(api).create_namespace(obj)
        elif kind == "CustomResourceDefinition":
            client.ApiextensionsV1Api(api).create_custom_resource_definition(obj)
        elif kind == "MutatingWebhookConfiguration":
            client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(obj)
        elif kind == "ValidatingWebhookConfiguration":
            client.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(obj)
        elif kind == "Service":
            client.CoreV1Api(api).create_namespaced_service(obj["metadata"]["namespace"], obj)
        elif kind == "Secret":
            client.CoreV1Api(api).create_namespaced_secret(obj["metadata"]["namespace"], obj)
        else:
            raise ValueError(f"the harness does not apply a {kind}")
    except ApiException as exc:
        if exc.status != 409:
            raise


@dataclass
class Kueue:
    """One Kueue process for a devcluster; its log is ``log_dir/kueue.log``."""

    devcluster: Devcluster
    network: WebhookNetwork
    kubectl: Path
    log_dir: Path
    proc: process.Proc | None = None
    popen: subprocess.Popen[bytes] | None = None
    mount: SecretMount | None = None
    proxy: VersionProxy | None = None
    probe_port: int = 0
    webhook_port: int = 0
    #: The API server's answer to the last webhook probe that failed.
    last_webhook_error: str = ""
    log: Path = field(default_factory=Path)

    def install(self) -> None:
        """The published CRDs, certificate Secret and webhook Service; the Service's ClusterIP
        routed to the webhook port; then the webhook configurations."""
        objects = published(self.kubectl)
        [namespace] = [o for o in objects if o["kind"] == "Namespace"]
        _create(self.devcluster.api, namespace)
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            _create(self.devcluster.api, crd)
        [secret] = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == SECRET]
        _create(self.devcluster.api, secret)
        [service] = [
            o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == SERVICE
        ]
        self._route_service(service)
        for obj in objects:
            if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                _create(self.devcluster.api, obj)
        ext = client.ApiextensionsV1Api(self.devcluster.api)

        def established() -> bool:
            return all(
                any(
                    c.type == "Established" and c.status == "True"
                    for c in ext.read_custom_resource_definition(
                        crd["metadata"]["name"]
                    ).status.conditions
                    or []
                )
                for crd in crds
            )

        eventually(established, what="Kueue's CRDs to be established")

    def _route_service(self, service: dict[str, Any]) -> None:
        """Create the Service and route its ClusterIP; a ClusterIP another run routes already
        (a collision in the service range) is given back for another."""
        core = self.devcluster.core()
        [port] = service["spec"]["ports"]
        self.webhook_port = free_port(self.network.host_ip)
        for _ in range(5):
            _create(self.devcluster.api, service)
            ip = core.read_namespaced_service(SERVICE, NAMESPACE).spec.cluster_ip
            if self.network.route(ip, int(port["port"]), self.webhook_port):
                return
            core.delete_namespaced_service(SERVICE, NAMESPACE)
        raise RuntimeError("no ClusterIP of the webhook Service could be routed")

    def configuration(self, cert_dir: Path) -> dict[str, Any]:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
            "webhook": {
                "host": self.network.host_ip,
                "port": self.webhook_port,
                "certDir": str(cert_dir),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": SERVICE,
                "webhookSecretName": SECRET,
            },
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
            "integrations": {"frameworks": list(FRAMEWORKS)},
            # The visibility API would need its own APIService and port; nothing here uses it.
            "featureGates": {"VisibilityOnDemand": False},
        }

    def start(self) -> Kueue:
        """Install, start, and return once Kueue is ready and the API server has had an answer
        from its webhooks."""
        self.install()
        cert_dir = self.log_dir / "serving-certs"
        self.mount = SecretMount(self.devcluster.kubeconfig, NAMESPACE, SECRET, cert_dir).start()
        self.probe_port = free_port()
        config_file = self.log_dir / "kueue-config.yaml"
        config_file.write_text(yaml.safe_dump(self.configuration(cert_dir)))
        self.log = self.log_dir / f"{NAME}.log"
        self.proxy = VersionProxy(self.devcluster).start()
        kubeconfig = self.proxy.kubeconfig(self.log_dir / "kueue.kubeconfig")
        self.proc, self.popen = process.spawn(
            NAME,
            [
                "env",
                f"KUBECONFIG={kubeconfig}",
                str(binary()),
                f"--config={config_file}",
                "--zap-log-level=2",
            ],
            self.log,
            die_with_parent=True,
        )
        eventually(self._ready, timeout=STARTS_WITHIN, what=f"{NAME} /readyz (log: {self.log})")
        if not poll(self._webhooks_answer, timeout=90):
            pytest.fail(
                f"the API server never reached Kueue's webhooks; it last said "
                f"{self.last_webhook_error} (log: {self.log})"
            )
        return self

    def _alive(self) -> None:
        assert self.proc is not None
        if not process.alive(self.proc):
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{NAME} exited:\n{tail}")

    def _ready(self) -> bool:
        self._alive()
        url = f"http://127.0.0.1:{self.probe_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return int(answer.status) == 200
        except urllib.error.HTTPError as exc:  # not ready yet: 500 until its certificates are
            exc.close()
            return False
        except (urllib.error.URLError, OSError):
            return False

    def _webhooks_answer(self) -> bool:
        """A dry-run ResourceFlavor passes Kueue's mutating and validating webhooks (both fail
        closed: an unreachable webhook is an error)."""
        self._alive()
        flavor = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"},
        }
        try:
            client.CustomObjectsApi(self.devcluster.api).create_cluster_custom_object(
                GROUP, VERSION, "resourceflavors", flavor, dry_run="All"
            )
        except ApiException as exc:
            self.last_webhook_error = str(exc.body)[:500]
            return False
        return True

    def stop(self) -> None:
        """Stop the process and remove its webhook configurations (they fail closed, and the
        Service they name is no longer served)."""
        if self.proc is not None and self.popen is not None:
            process.stop(self.proc, grace=15)
            self.popen.wait(timeout=10)
        if self.mount is not None:
            self.mount.stop()
        if self.proxy is not None:
            self.proxy.stop()
        admission = client.AdmissionregistrationV1Api(self.devcluster.api)
        for name, delete in zip(
            WEBHOOK_CONFIGURATIONS,
            (
                admission.delete_mutating_webhook_configuration,
                admission.delete_validating_webhook_configuration,
            ),
            strict=True,
        ):
            try:
                delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


# -- What the test modules with the real Kueue share --------------------------------------------
#
# Each module runs on a control plane of its own: Kueue's webhooks fail closed and gate the pods
# of every namespace it manages, so no other test's cluster has them. A module takes the
# fixtures below by importing them (``kueue_devcluster`` and the others, unused to the linter);
# each keeps its pytest name (``devcluster``, ``namespace``, ...), so the scheduler's fixtures
# (``pool``, ``pods``, ``start_scheduler``) run against that cluster.


@pytest.fixture(scope="module", name="webhook_network")
def kueue_webhook_network() -> Iterator[WebhookNetwork]:
    network = WebhookNetwork().create()
    try:
        yield network
    finally:
        network.delete()


@pytest.fixture(scope="module", name="devcluster")
def kueue_devcluster(
    webhook_network: WebhookNetwork, tmp_path_factory: pytest.TempPathFactory, bin_dir: Path
) -> Iterator[Devcluster]:
    """The module's own control plane (it stops before the webhook network goes)."""
    run_dir = tmp_path_factory.mktemp("kueue-devcluster")
    yield from own_devcluster(run_dir, bin_dir, cluster.Options(die_with_parent=True))


@pytest.fixture(scope="module", name="kueue_process")
def kueue_running(
    devcluster: Devcluster,
    webhook_network: WebhookNetwork,
    bin_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Kueue]:
    # The PyTorchJob CRD first, so that Kueue's kubeflow.org/pytorchjob integration starts.
    training_operator.apply_crds(devcluster)
    running = Kueue(devcluster, webhook_network, bin_dir / "kubectl", tmp_path_factory.mktemp("kq"))
    try:
        yield running.start()
    finally:
        running.stop()


@pytest.fixture(name="namespace")
def kueue_namespace(devcluster: Devcluster, kueue_process: Kueue) -> Iterator[str]:
    """A fresh namespace that Kueue manages, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = devcluster.core()
    core.create_namespace({"metadata": {"name": name, "labels": {MANAGED_LABEL: "true"}}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


def custom(devcluster: Devcluster) -> Any:
    return client.CustomObjectsApi(devcluster.api)


@dataclass
class Queues:
    """The test's ResourceFlavor (its nodes), ClusterQueues and their LocalQueues (one each, in
    the test's namespace). Every ClusterQueue covers the flavor's CPU and GPUs."""

    devcluster: Devcluster
    namespace: str
    pool: Pool
    created: list[tuple[str, str]] = field(default_factory=list)
    #: Each LocalQueue made, and its ClusterQueue.
    cluster_queues: dict[str, str] = field(default_factory=dict)

    @property
    def flavor(self) -> str:
        return f"rf-{self.namespace}"

    def make(
        self,
        gpus: int,
        *,
        local: str = "team",
        cohort: str | None = None,
        borrowing_limit: int | None = None,
        preemption: dict[str, Any] | None = None,
    ) -> str:
        """A ClusterQueue with ``gpus`` GPUs of nominal quota (in ``cohort``, borrowing at most
        ``borrowing_limit`` GPUs from it; ``preemption`` its policies) and its LocalQueue
        ``local``; returns the LocalQueue's name."""
        if not any(plural == "resourceflavors" for plural, _ in self.created):
            self._cluster_object(
                "resourceflavors",
                {
                    "metadata": {"name": self.flavor},
                    "spec": {"nodeLabels": {TEST_LABEL: self.pool.pool}},
                },
            )
        gpu: dict[str, Any] = {"name": names.GPU_RESOURCE, "nominalQuota": str(gpus)}
        if borrowing_limit is not None:
            gpu["borrowingLimit"] = str(borrowing_limit)
        resources = [{"name": "cpu", "nominalQuota": "1000"}, gpu]
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", names.GPU_RESOURCE],
                    "flavors": [{"name": self.flavor, "resources": resources}],
                }
            ],
        }
        if cohort is not None:
            spec["cohortName"] = cohort
        if preemption is not None:
            spec["preemption"] = preemption
        name = f"cq-{self.namespace}-{local}"
        self._cluster_object("clusterqueues", {"metadata": {"name": name}, "spec": spec})
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": local},
            "spec": {"clusterQueue": name},
        }
        custom(self.devcluster).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "localqueues", body
        )
        self.cluster_queues[local] = name
        return local

    def _cluster_object(self, plural: str, body: dict[str, Any]) -> None:
        kinds = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue"}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kinds[plural], **body}
        custom(self.devcluster).create_cluster_custom_object(GROUP, VERSION, plural, body)
        self.created.append((plural, body["metadata"]["name"]))

    def gpu_quota(self, local: str = "team") -> tuple[int, int | None]:
        """The nominal GPU quota of ``local``'s ClusterQueue and its borrowing limit (None: no
        limit), as the API server has them."""
        found = custom(self.devcluster).get_cluster_custom_object(
            GROUP, VERSION, "clusterqueues", self.cluster_queues[local]
        )
        [gpu] = [
            resource
            for group in found["spec"]["resourceGroups"]
            for flavor in group["flavors"]
            for resource in flavor["resources"]
            if resource["name"] == names.GPU_RESOURCE
        ]
        limit = gpu.get("borrowingLimit")
        return int(gpu["nominalQuota"]), None if limit is None else int(limit)

    def delete(self) -> None:
        for plural, name in reversed(self.created):
            try:
                custom(self.devcluster).delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture(name="queues")
def kueue_queues(devcluster: Devcluster, namespace: str, pool: Pool) -> Iterator[Queues]:
    made = Queues(devcluster, namespace, pool)
    yield made
    made.delete()


@pytest.fixture(name="workload_history")
def kueue_workload_history(devcluster: Devcluster, namespace: str) -> Iterator[History]:
    """Every version of the namespace's Workloads from the start of the test."""
    history = History(
        custom(devcluster).list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads"
    )
    yield history
    history.close()


#: Set by the Job controller on each pod of a Job.
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
FINISHED: Final = ("Succeeded", "Failed")


def worker(pods: Pods, gpus: int) -> dict[str, Any]:
    """The pod spec of one worker with ``gpus`` GPUs, on the test's nodes and scheduler."""
    amount = {names.GPU_RESOURCE: str(gpus), "cpu": "1"}
    return {
        "schedulerName": pods.scheduler,
        "tolerations": [KWOK_TOLERATION],
        "nodeSelector": {TEST_LABEL: pods.pool},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "worker",
                "image": "registry.example/trainer:1",
                "resources": {"requests": amount, "limits": amount},
            }
        ],
    }


def job(
    pods: Pods,
    queue: str,
    name: str,
    *,
    size: int,
    gpus: int,
    spec: dict[str, Any] | None = None,
    backoff_limit: int = 0,
) -> dict[str, Any]:
    """A Job of ``size`` workers in the LocalQueue ``queue`` that Shoal schedules as one gang
    (all or nothing); ``spec`` replaces the worker's pod spec."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": size,
            "completions": size,
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {
                    "labels": {names.GANG_LABEL: name},
                    "annotations": {names.MIN_MEMBER_ANNOTATION: str(size)},
                },
                "spec": spec if spec is not None else worker(pods, gpus),
            },
        },
    }


def submit(pods: Pods, queue: str, name: str, *, size: int, gpus: int) -> Any:
    return pods.devcluster.batch().create_namespaced_job(
        pods.namespace, job(pods, queue, name, size=size, gpus=gpus)
    )


def group_pod(pods: Pods, queue: str, group: str, index: int, *, total: int, gpus: int) -> Any:
    """A plain pod of a Kueue pod group (``total`` pods admitted together)."""
    body = {
        "metadata": {
            "name": f"{group}-{index}",
            "labels": {QUEUE_LABEL: queue, POD_GROUP_LABEL: group},
            "annotations": {POD_GROUP_TOTAL_ANNOTATION: str(total)},
        },
        "spec": worker(pods, gpus),
    }
    return pods.devcluster.core().create_namespaced_pod(pods.namespace, body)


def workloads(devcluster: Devcluster, namespace: str) -> list[dict[str, Any]]:
    found = custom(devcluster).list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")
    return list(found["items"])


def condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for item in (workload.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    return None


def borrowed_gpus(queue: dict[str, Any]) -> int:
    """The GPUs a ClusterQueue's status says it borrows from its cohort."""
    return sum(
        int(resource.get("borrowed") or 0)
        for flavor in (queue.get("status") or {}).get("flavorsReservation") or []
        for resource in flavor["resources"]
        if resource["name"] == names.GPU_RESOURCE
    )


def admitted(workload: dict[str, Any]) -> bool:
    found = condition(workload, "Admitted")
    return found is not None and found["status"] == "True"


def owners(obj: dict[str, Any]) -> set[str]:
    return {owner["uid"] for owner in obj["metadata"].get("ownerReferences") or []}


def workload_of(devcluster: Devcluster, namespace: str, uid: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the object ``uid`` (a Job or a pod of a group)."""
    return next((w for w in workloads(devcluster, namespace) if uid in owners(w)), None)


def pending_message(devcluster: Devcluster, namespace: str, uid: str) -> str | None:
    """Why Kueue has not reserved quota for the object's Workload (it says so while it waits)."""
    workload = workload_of(devcluster, namespace, uid)
    found = condition(workload, "QuotaReserved") if workload else None
    if found is None or found["status"] != "False":
        return None
    return str(found.get("message") or "")


def deactivate(devcluster: Devcluster, namespace: str, uid: str) -> None:
    """What a user does to stop an admitted job: ``spec.active: false`` on its Workload."""
    workload = workload_of(devcluster, namespace, uid)
    assert workload is not None
    custom(devcluster).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "workloads",
        workload["metadata"]["name"],
        {"spec": {"active": False}},
    )


def job_pods(pods: Pods, name: str) -> list[Any]:
    return [p for p in pods.all() if (p.metadata.labels or {}).get(JOB_NAME_LABEL) == name]


def bound_of_job(pods: Pods, name: str) -> list[str]:
    """The Job's pods bound and not being deleted."""
    return [
        p.metadata.name
        for p in job_pods(pods, name)
        if p.spec.node_name and p.metadata.deletion_timestamp is None
    ]


def gpus_of(pod: Any) -> int:
    limits = pod.spec.containers[0].resources.limits or {}
    return int(limits.get(names.GPU_RESOURCE, "0"))


def holds(pod: Any) -> bool:
    """Whether ``pod`` holds its GPUs as Kueue counts them: bound, not finished and not being
    deleted (Kueue releases an evicted workload's quota once its Job has no active pods; pods
    already being deleted are on their way out, as they are for Kueue)."""
    return bool(
        pod.spec.node_name
        and pod.status.phase not in FINISHED
        and pod.metadata.deletion_timestamp is None
    )


def ever_bound(history: History) -> dict[str, Any]:
    """Each pod ever bound, at the first version of it that was."""
    found: dict[str, Any] = {}
    for state in history.states():
        for name, pod in state.items():
            if pod.spec.node_name and name not in found:
                found[name] = pod
    return found


def partly_bound(states: Sequence[State], sizes: Mapping[str, int]) -> list[str]:
    """Where a Job's gang was left partly bound in ``states`` (the pods at each moment a watch
    recorded, in order): between none and its minimum (``sizes``, by Job) of its pods holding
    GPUs (:func:`holds`), other than on the way straight up from none to the minimum (its
    binds landing, one API call each) or straight down from the minimum to none (its pods being
    deleted: Kueue stopped the Job). Empty: at every state each gang held all its minimum or
    nothing, its binds and its deletions under way aside."""
    found: list[str] = []
    for name, size in sizes.items():
        counts = [
            sum(
                1
                for pod in state.values()
                if (pod.metadata.labels or {}).get(JOB_NAME_LABEL) == name and holds(pod)
            )
            for state in states
        ]
        start = 0
        while start < len(counts):
            if not 0 < counts[start] < size:
                start += 1
                continue
            end = start
            while end < len(counts) and 0 < counts[end] < size:
                end += 1
            before = counts[start - 1] if start > 0 else 0
            after = counts[end] if end < len(counts) else None
            run = counts[start:end]
            rising = before == 0 and after == size and run == sorted(run)
            falling = before == size and after == 0 and run == sorted(run, reverse=True)
            if not (rising or falling):
                found.append(f"{name}: {before} -> {run} -> {after} of its {size} bound")
            start = end
    return found
