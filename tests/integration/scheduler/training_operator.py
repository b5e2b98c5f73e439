"""The Kubeflow training-operator, built from its pinned Go module
(``devcluster/tools/training-operator``), run as a local process against the devcluster the way
its Deployment runs it in a cluster, with gang scheduling through scheduler-plugins PodGroups
pointed at a Shoal scheduler.

What its Deployment would provide, this harness provides:

* its CRDs, applied from the module as published (``manifests/base/crds/``);
* the Secret its certificate rotator fills (``--webhook-secret-name``, in ``MY_POD_NAMESPACE``);
* the serving certificate files the kubelet would mount from that Secret: the rotator waits
  for ``/tmp/k8s-webhook-server/serving-certs/tls.crt`` (a path fixed in its source) and the
  webhook server loads the pair from ``$TMPDIR/k8s-webhook-server/serving-certs``. A pair made
  here is put there once (never overwritten, so operators started side by side agree); no
  webhook configuration points at the server, so the API server never calls it.

Leader election stays off (its default), metrics and probes listen on free loopback ports, and
the operator watches only the test's namespace (``--namespace``)."""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from devcluster import tools
from devcluster.ports import free_port
from scheduler.webhook import certs
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import apply_crd
from tests.waiting import eventually

NAME = "training-operator"
SECRET = "training-operator-webhook-cert"
#: Where the operator's certificate rotator looks for the mounted certificate (fixed in its
#: source, pkg/cert), and where its webhook server reads the pair from with TMPDIR=/tmp.
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
CRDS = ("kubeflow.org_pytorchjobs.yaml", "kubeflow.org_mpijobs.yaml")
SCHEMES = ("pytorchjob", "mpijob")


def binary() -> Path:
    return tools.ensure(NAME)


def apply_crds(devcluster: Devcluster) -> None:
    """The operator's PyTorchJob and MPIJob CRDs, from its module as published."""
    folder = tools.module_dir(NAME) / "manifests" / "base" / "crds"
    for name in CRDS:
        apply_crd(devcluster, folder / name)


def _serving_pair() -> None:
    """Put a serving certificate and key in CERT_DIR unless a pair is there already: both
    written into a fresh folder that is renamed into place, so a reader sees both or none."""
    if (CERT_DIR / "tls.crt").is_file() and (CERT_DIR / "tls.key").is_file():
        return
    CERT_DIR.parent.mkdir(parents=True, exist_ok=True)
    made = certs.make(["training-operator.svc", "127.0.0.1"], datetime.datetime.now(datetime.UTC))
    staging = Path(tempfile.mkdtemp(prefix="serving-certs.", dir=CERT_DIR.parent))
    (staging / "tls.crt").write_bytes(made.cert_pem)
    (staging / "tls.key").write_bytes(made.key_pem)
    try:
        staging.rename(CERT_DIR)
    except OSError:  # another operator's harness put its pair there first
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class TrainingOperator:
    """One operator process; its log is ``log_dir/training-operator.log``."""

    devcluster: Devcluster
    namespace: str
    gang_scheduler: str
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    probe_port: int = 0
    log: Path = field(default_factory=Path)

    def start(self) -> TrainingOperator:
        """Start it and return once its readiness probe passes (certificates in place, webhook
        server up); its controllers are registered right after."""
        try:
            self.devcluster.core().create_namespaced_secret(
                self.namespace, {"metadata": {"name": SECRET}}
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        _serving_pair()
        self.probe_port = free_port()
        self.log = self.log_dir / f"{NAME}.log"
        command = [
            str(binary()),
            "--kubeconfig",
            self.devcluster.kubeconfig,
            "--gang-scheduler-name",
            self.gang_scheduler,
            "--namespace",
            self.namespace,
            *(f"--enable-scheme={scheme}" for scheme in SCHEMES),
            "--metrics-bind-address",
            f"127.0.0.1:{free_port()}",
            "--health-probe-bind-address",
            f"127.0.0.1:{self.probe_port}",
            "--webhook-server-port",
            str(free_port()),
            "--webhook-secret-name",
            SECRET,
            "--zap-devel=false",
        ]
        env = {**os.environ, "MY_POD_NAMESPACE": self.namespace, "TMPDIR": "/tmp"}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        eventually(self._ready, what=f"{NAME} /readyz (log: {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{NAME} exited with {self.proc.returncode}:\n{tail}")
        url = f"http://127.0.0.1:{self.probe_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return int(answer.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
