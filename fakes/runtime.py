"""A stand-in for the container runtime of kwok nodes: each pod's containers as real local
processes, so that workers on the devcluster run for real.

kwok plays the kubelet's part in the API (a bound pod becomes Running, a pod being deleted
terminates and goes) but runs nothing. :class:`Runtime` watches the pods of one namespace
(optionally only those matching a label selector) on the real API server, and for each pod bound
to one of its nodes that reaches ``Running`` it starts every container's ``command`` + ``args``
as a process on this machine, in a new session:

- **Environment.** ``PATH`` and ``HOME`` of this machine, ``HOSTNAME`` (the pod's name), then
  the container's ``env``: a ``value`` as is, a ``valueFrom.fieldRef`` resolved from the pod
  object as the Downward API does (``metadata.name``, ``.namespace``, ``.uid``,
  ``.labels['k']``, ``.annotations['k']``, ``spec.nodeName``, ``spec.serviceAccountName``,
  ``status.podIP``, ``status.hostIP``). Other sources are left out, with a log line.
- **Volumes.** There is no mount namespace, so a volume is a folder on this machine and a path
  under a container's ``mountPath`` is rewritten to that folder wherever it appears whole in
  ``command``, ``args``, ``env`` values and ``workingDir`` (also after the first ``=`` of an
  argument such as ``--ckpt=/ckpt``). A ``hostPath`` volume of ``P`` on node ``N`` is
  ``ROOT/N/P``: with ``ROOT/N/run/shoal`` as the folder of node ``N``'s agent socket
  (``--socket ROOT/N/run/shoal/agent.sock``), a pod on ``N`` whose ``SHOAL_SOCKET`` is
  ``/run/shoal/agent.sock`` under a hostPath mount of ``/run/shoal`` talks to that node's agent.
  An ``emptyDir`` and a ``downwardAPI`` volume are folders of the pod
  (``ROOT/N/pods/<uid>/<volume>``); the Downward API files (``fieldRef`` items) are written
  when the container starts and rewritten whenever the pod changes, as the kubelet refreshes
  them. Any other path is this machine's own: a folder every node should share (a
  ReadWriteMany claim) is given as a plain path.
- **Output.** ``ROOT/N/pods/<uid>/<container>.log``, stdout and stderr together.
- **Stopping.** When the pod gets a deletion timestamp (deleted or evicted) or is gone, the
  first process of each container gets SIGTERM, and its whole session SIGKILL after the pod's
  grace period (``deletionGracePeriodSeconds``, else ``terminationGracePeriodSeconds``); a
  container whose first process exits loses the rest of its session at once, as a container's
  cgroup would.

It speaks only to the API server, and only to read (list and watch): it writes no status, so a
pod stays Running after its processes exit (:meth:`Runtime.exit_codes` tells how they ended),
and it never restarts a container. It stands in for the container runtime, nothing more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

_KEYED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_PLAIN = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata.uid": ("metadata", "uid"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.podIP": ("status", "podIP"),
    "status.hostIP": ("status", "hostIP"),
}


def field_value(pod: Mapping[str, Any], path: str) -> str | None:
    """What the Downward API gives for ``fieldPath`` of ``pod``, or None if unsupported."""
    keyed = _KEYED.match(path)
    if keyed is not None:
        return str(pod.get("metadata", {}).get(keyed.group(1), {}).get(keyed.group(2), ""))
    if path in _PLAIN:
        part, key = _PLAIN[path]
        return str(pod.get(part, {}).get(key) or "")
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a pod's volumes are on this machine."""

    root: Path

    def host_path(self, node: str, path: str) -> Path:
        return self.root / node / path.lstrip("/")

    def pod_dir(self, pod: Mapping[str, Any]) -> Path:
        return self.root / str(pod["spec"]["nodeName"]) / "pods" / str(pod["metadata"]["uid"])

    def volumes(self, pod: Mapping[str, Any]) -> dict[str, Path]:
        """Each volume this runtime can provide, by name, and its folder."""
        found: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            if "hostPath" in volume:
                found[volume["name"]] = self.host_path(
                    pod["spec"]["nodeName"], volume["hostPath"]["path"]
                )
            elif "emptyDir" in volume or "downwardAPI" in volume:
                found[volume["name"]] = self.pod_dir(pod) / volume["name"]
            else:
                log.warning("volume %s of %s is not provided", volume["name"], _key(pod))
        return found


@dataclass(frozen=True, slots=True)
class Command:
    """One container as a process: what to run, with what, where."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


def command(pod: Mapping[str, Any], container: Mapping[str, Any], layout: Layout) -> Command:
    """The process for ``container`` of ``pod`` (see the module's description)."""
    volumes = layout.volumes(pod)
    mounts = {
        m["mountPath"].rstrip("/") or "/": volumes[m["name"]] / m.get("subPath", "")
        for m in container.get("volumeMounts") or []
        if m["name"] in volumes
    }

    def local(text: str) -> str:
        return _rewrite(text, mounts)

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "HOSTNAME": pod["metadata"]["name"],
    }
    for var in container.get("env") or []:
        value = _env_value(pod, var)
        if value is None:
            log.warning("env %s of %s is not provided", var["name"], _key(pod))
        else:
            env[var["name"]] = local(value)
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    workdir = container.get("workingDir")
    cwd = Path(local(workdir)) if workdir else layout.pod_dir(pod)
    return Command(tuple(local(a) for a in argv), env, cwd)


def _env_value(pod: Mapping[str, Any], var: Mapping[str, Any]) -> str | None:
    if "valueFrom" not in var:
        return str(var.get("value", ""))
    ref = var["valueFrom"].get("fieldRef")
    return None if ref is None else field_value(pod, ref["fieldPath"])


def _rewrite(text: str, mounts: Mapping[str, Path]) -> str:
    """``text`` with a leading mount path (or one after its first ``=``) made local."""
    head, sep, tail = text.partition("=")
    if sep and not head.startswith("/"):
        return head + sep + _rewrite_path(tail, mounts)
    return _rewrite_path(text, mounts)


def _rewrite_path(text: str, mounts: Mapping[str, Path]) -> str:
    for mount in sorted(mounts, key=len, reverse=True):
        if text == mount or text.startswith(mount.rstrip("/") + "/"):
            rest = text[len(mount) :].lstrip("/")
            return str(mounts[mount] / rest) if rest else str(mounts[mount])
    return text


def downward_files(pod: Mapping[str, Any], layout: Layout) -> dict[Path, str]:
    """The files of the pod's ``downwardAPI`` volumes, and their content."""
    files: dict[Path, str] = {}
    for volume in pod["spec"].get("volumes") or []:
        for item in (volume.get("downwardAPI") or {}).get("items") or []:
            ref = item.get("fieldRef")
            value = None if ref is None else field_value(pod, ref["fieldPath"])
            if value is not None:
                files[layout.pod_dir(pod) / volume["name"] / item["path"]] = value
    return files


def _key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"


@dataclass
class _Pod:
    key: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stopping: bool = False


class Runtime:
    """Runs the containers of ``namespace``'s pods (those matching ``selector``) bound to
    ``nodes``; volumes under ``root`` (see the module's description)."""

    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        nodes: Iterable[str],
        root: Path,
        *,
        selector: str = "",
    ) -> None:
        self.layout = Layout(root)
        self.namespace = namespace
        self.nodes = frozenset(nodes)
        self.selector = selector
        self._api = config.new_client_from_config(config_file=kubeconfig)
        self._core = client.CoreV1Api(self._api)
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runtime-watch", daemon=True)

    def start(self) -> Runtime:
        self._thread.start()
        return self

    def exit_codes(self) -> dict[str, dict[str, int | None]]:
        """Each started pod (``namespace/name``): its containers' exit codes (None: running)."""
        with self._lock:
            return {
                p.key: {name: proc.poll() for name, proc in p.processes.items()}
                for p in self._pods.values()
            }

    def close(self) -> None:
        """Stop watching and stop every process (SIGTERM, then SIGKILL after 10 s)."""
        self._closing.set()
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._stop(pod, 10.0)
        for pod in pods:
            for proc in pod.processes.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self._api.close()

    def _run(self) -> None:
        version = ""
        while not self._closing.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except ApiException as exc:
                if exc.status == 410:
                    version = ""
                else:
                    log.warning("pod watch failed: %s", exc)
                    self._closing.wait(1.0)
            except Exception:  # the watch goes on whatever one answer held
                log.exception("pod watch failed")
                self._closing.wait(1.0)

    def _list(self) -> str:
        response = self._core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False
        )
        body = json.loads(response.data)
        for pod in body["items"]:
            self.observe(pod, deleted=False)
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        stream = watch.Watch().stream(
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=self.selector,
            resource_version=version,
            timeout_seconds=5,
            _request_timeout=30,
        )
        for event in stream:
            pod = event["raw_object"]
            if event["type"] == "ERROR":
                raise ApiException(status=int(pod.get("code", 500)), reason=pod.get("message"))
            version = str(pod["metadata"].get("resourceVersion") or version)
            self.observe(pod, deleted=event["type"] == "DELETED")
            if self._closing.is_set():
                break
        return version

    def observe(self, pod: dict[str, Any], *, deleted: bool = False) -> None:
        """Act on ``pod`` as the watch delivers it: start its containers once it runs here,
        stop them once it is being deleted or gone, refresh its Downward API files."""
        if pod["spec"].get("nodeName") not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            known = self._pods.get(uid)
        if deleted or pod["metadata"].get("deletionTimestamp"):
            if known is not None:
                self._stop(known, _grace(pod))
            return
        if (pod.get("status") or {}).get("phase") != "Running" or self._closing.is_set():
            return
        self._write_downward(pod)
        if known is None:
            self._start(pod)

    def _write_downward(self, pod: Mapping[str, Any]) -> None:
        for path, content in downward_files(pod, self.layout).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.read_text() == content:
                continue
            partial = path.with_name(f".{path.name}.new")
            partial.write_text(content)
            partial.replace(path)

    def _start(self, pod: Mapping[str, Any]) -> None:
        started = _Pod(_key(pod))
        pod_dir = self.layout.pod_dir(pod)
        pod_dir.mkdir(parents=True, exist_ok=True)
        for folder in self.layout.volumes(pod).values():
            folder.mkdir(parents=True, exist_ok=True)
        for container in pod["spec"]["containers"]:
            process = command(pod, container, self.layout)
            if not process.argv:
                log.warning("container %s of %s has no command", container["name"], started.key)
                continue
            try:
                proc = _spawn(process, pod_dir / f"{container['name']}.log")
            except OSError as exc:  # what a runtime reports as a container that cannot run
                log.warning("%s/%s cannot run: %s", started.key, container["name"], exc)
                continue
            started.processes[container["name"]] = proc
            threading.Thread(target=_reap, args=(proc,), daemon=True).start()
            log.info("started %s/%s as %d", started.key, container["name"], proc.pid)
        with self._lock:
            self._pods[pod["metadata"]["uid"]] = started

    def _stop(self, pod: _Pod, grace: float) -> None:
        with self._lock:
            if pod.stopping:
                return
            pod.stopping = True
        for proc in pod.processes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            timer = threading.Timer(grace, _kill_session, args=(proc,))
            timer.daemon = True
            timer.start()


def _spawn(process: Command, output: Path) -> subprocess.Popen[bytes]:
    with output.open("ab") as out:
        return subprocess.Popen(
            process.argv,
            env=dict(process.env),
            cwd=process.cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _grace(pod: Mapping[str, Any]) -> float:
    given = pod["metadata"].get("deletionGracePeriodSeconds")
    if given is None:
        given = pod["spec"].get("terminationGracePeriodSeconds", 30)
    return float(given)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Once the first process exits, the rest of its session goes too."""
    proc.wait()
    _kill_session(proc)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
