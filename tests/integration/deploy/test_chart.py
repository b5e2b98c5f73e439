"""The Helm chart (`charts/shoal/`), with helm built from its Go module: it lints, renders the
very objects `kubectl kustomize manifests/` applies (so the two never drift), renders its
options, and `helm install` / `helm uninstall` on the devcluster give a scheduler that binds a
gang and leave nothing behind but the CRD (Helm never deletes CRDs)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException

from contracts import names
from devcluster import nodes, tools
from tests.integration.conftest import Devcluster
from tests.integration.deploy.test_manifests import NAMESPACE, token_kubeconfig
from tests.integration.nodeagent.harness import AgentProcess
from tests.integration.scheduler.conftest import SchedulerProcess
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "shoal"
MANIFESTS = ROOT / "manifests"

Key = tuple[str, str, str, str]


@pytest.fixture(scope="session")
def helm() -> Path:
    return tools.ensure("helm")


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(helm: Path, *settings: str) -> list[dict[str, Any]]:
    args = [str(helm), "template", "shoal", str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for setting in settings:
        args += ["--set", setting]
    done = run(args)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


def by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by (apiVersion, kind, namespace, name), compared as data: the scheduler's settings
    parsed, the chart's config digest (it rolls the scheduler on a change) left out."""
    keyed = {}
    for original in objects:
        obj = original
        meta = obj["metadata"]
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            obj = {
                **obj,
                "data": {**obj["data"], "config.yaml": yaml.safe_load(obj["data"]["config.yaml"])},
            }
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        notes = template.get("annotations", {})
        for note in [n for n in notes if n.startswith("checksum/")]:
            del notes[note]
        if not notes:
            template.pop("annotations", None)
        keyed[(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return keyed


def test_the_chart_lints(helm: Path) -> None:
    done = run([str(helm), "lint", "--strict", str(CHART)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_chart_renders_what_kustomize_applies(helm: Path, bin_dir: Path) -> None:
    kustomized = run([str(bin_dir / "kubectl"), "kustomize", str(MANIFESTS)])
    assert kustomized.returncode == 0, kustomized.stderr
    # The chart leaves the namespace to `helm install --create-namespace`.
    expected = by_key([o for o in documents(kustomized.stdout) if o["kind"] != "Namespace"])
    chart = by_key(render(helm))
    assert sorted(chart) == sorted(expected)
    differing = [key for key in expected if chart[key] != expected[key]]
    assert differing == [], {k: (chart[k], expected[k]) for k in differing[:1]}


def test_the_charts_options_render(helm: Path) -> None:
    objects = by_key(
        render(
            helm,
            "metrics.serviceMonitor.enabled=true",
            "dashboards.enabled=true",
            "agent.runtimeClassName=nvidia",
            "agent.logFormat=console",
            "images.agent.tag=9.9.9",
            "scheduler.replicas=3",
            "scheduler.webView=127.0.0.1:10261",
        )
    )
    monitors = sorted(k[3] for k in objects if k[1] == "ServiceMonitor")
    assert monitors == ["shoal-agent", "shoal-scheduler"]
    dashboard = objects[("v1", "ConfigMap", NAMESPACE, "shoal-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["shoal.json"])["uid"] == "shoal"
    agent = objects[("apps/v1", "DaemonSet", NAMESPACE, "shoal-agent")]["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia"
    (container,) = agent["containers"]
    assert container["image"].endswith(":9.9.9")
    assert container["args"][-2:] == ["--log-format", "console"]
    scheduler = objects[("apps/v1", "Deployment", NAMESPACE, "shoal-scheduler")]
    assert scheduler["spec"]["replicas"] == 3
    args = scheduler["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--web-view") + 1] == "127.0.0.1:10261"


def _gone(devcluster: Devcluster, obj: dict[str, Any]) -> bool:
    """True when the API server no longer has ``obj``."""
    api = dynamic.DynamicClient(devcluster.api).resources.get(
        api_version=obj["apiVersion"], kind=obj["kind"]
    )
    try:
        api.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def _clear_kustomize_install(helm: Path, bin_dir: Path, devcluster: Devcluster) -> None:
    """Objects an earlier `kubectl apply -k manifests/` left (Helm does not adopt them)."""
    chart = [o for o in render(helm) if o["kind"] != "CustomResourceDefinition"]
    text = yaml.safe_dump_all(chart)
    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", devcluster.kubeconfig]
    done = run([*kubectl, "delete", "--ignore-not-found", "--wait=true", "-f", "-"], input=text)
    assert done.returncode == 0, done.stderr


def test_install_gives_a_working_scheduler_and_uninstall_leaves_nothing(
    helm: Path, bin_dir: Path, devcluster: Devcluster, namespace: str, tmp_path: Path
) -> None:
    _clear_kustomize_install(helm, bin_dir, devcluster)
    base = [str(helm), "--kubeconfig", devcluster.kubeconfig, "--namespace", NAMESPACE]
    installed = run([*base, "install", "shoal", str(CHART), "--create-namespace"])
    assert installed.returncode == 0, installed.stderr
    core = devcluster.core()
    tag = uuid.uuid4().hex[:6]
    pool = nodes.create(
        devcluster.kubeconfig,
        nodes.NodeSpec(count=2, prefix=f"helm-{tag}", extra_labels={"shoal.dev/test-pool": tag}),
    )
    try:
        # The chart's own ServiceAccount and settings, with a name of this test's own.
        settings = core.read_namespaced_config_map("shoal-scheduler", NAMESPACE).data["config.yaml"]
        config = tmp_path / "config.yaml"
        config.write_text(settings)
        name = f"shoal-helm-{tag}"
        kubeconfig = token_kubeconfig(devcluster, "shoal-scheduler", tmp_path / "sa.kubeconfig")
        scheduler = SchedulerProcess(kubeconfig, name, tmp_path, extra=["--config", str(config)])
        scheduler.start()
        try:
            for i in range(2):
                core.create_namespaced_pod(namespace, _member(f"w-{i}", name, tag))
            placed = eventually(
                lambda: (
                    {core.read_namespaced_pod(f"w-{i}", namespace).spec.node_name for i in range(2)}
                    if all(
                        core.read_namespaced_pod(f"w-{i}", namespace).spec.node_name
                        for i in range(2)
                    )
                    else None
                ),
                what="the gang bound by the chart's scheduler account",
            )
            assert placed == set(pool)
        finally:
            assert scheduler.stop() == 0
    finally:
        for node in pool:
            core.delete_node(node)
    uninstalled = run([*base, "uninstall", "shoal", "--wait"])
    assert uninstalled.returncode == 0, uninstalled.stderr
    left = [
        (o["kind"], o["metadata"]["name"])
        for o in render(helm)
        if o["kind"] != "CustomResourceDefinition" and not _gone(devcluster, o)
    ]
    assert left == []


def _member(pod: str, scheduler: str, pool: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": pod,
            "labels": {names.GANG_LABEL: "job"},
            "annotations": {names.MIN_MEMBER_ANNOTATION: "2"},
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"shoal.dev/test-pool": pool},
            "tolerations": [{"key": names.KWOK_TAINT, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "w",
                    "image": "trainer",
                    "resources": {"limits": {names.GPU_RESOURCE: "8"}},
                }
            ],
        },
    }


DASHBOARD = CHART / "files" / "shoal-dashboard.json"
_SERIES = ("_bucket", "_sum", "_count")


def queried_metrics() -> set[str]:
    """Every Shoal metric name in the dashboard's queries."""
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    return {m for expr in exprs for m in re.findall(r"\bshoal_[a-z_]+", expr)}


def families(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


def test_every_metric_the_dashboard_queries_is_served(
    devcluster: Devcluster, tmp_path: Path
) -> None:
    (node,) = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=1, prefix=f"dash-{uuid.uuid4().hex[:6]}")
    )
    scheduler = SchedulerProcess(devcluster.kubeconfig, f"shoal-dash-{node[-6:]}", tmp_path)
    agent = AgentProcess(
        kubeconfig=devcluster.kubeconfig,
        node=node,
        provider="none",
        metadata_url="http://127.0.0.1:9",
        workdir=tmp_path,
    )
    scheduler.start()
    agent.start()
    try:
        status, text = scheduler.get("/metrics")
        assert status == 200
        served = families(text) | families(agent.metrics())
    finally:
        assert scheduler.stop() == 0
        agent.stop()
        devcluster.core().delete_node(node)
    wanted = queried_metrics()
    assert {m for m in wanted if m.startswith("shoal_scheduler_")}, "no scheduler panel"
    assert {m for m in wanted if m.startswith("shoal_agent_")}, "no agent panel"
    missing = sorted(
        m
        for m in wanted
        if m not in served and not any(m.removesuffix(s) in served for s in _SERIES)
    )
    assert missing == []
