"""The admission webhook, called by the devcluster's real kube-apiserver.

Each test registers its own MutatingWebhookConfiguration (its URL on loopback, its scheduler's
name in the CEL match condition, its namespace only) with an empty caBundle, as the manifests
ship it; the scheduler makes its certificate and puts its CA there itself.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from contracts import names
from devcluster.ports import free_port
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import SchedulerProcess
from tests.waiting import eventually

CONTAINER = {"name": "trainer", "image": "registry.example.com/train:1"}


class Webhook:
    """A scheduler with ``--webhook`` and the configuration that sends its pods to it."""

    def __init__(
        self, devcluster: Devcluster, namespace: str, scheduler: str, start: Callable[..., Any]
    ) -> None:
        self.devcluster = devcluster
        self.namespace = namespace
        self.scheduler = scheduler
        self.config = f"{scheduler}-webhook"
        self.port = free_port()
        self.admission = client.AdmissionregistrationV1Api(devcluster.api)
        self.admission.create_mutating_webhook_configuration(self.configuration())
        self.process: SchedulerProcess = start(
            "--webhook",
            "true",
            "--webhook-port",
            str(self.port),
            "--webhook-hosts",
            "127.0.0.1",
            "--webhook-configuration",
            self.config,
        )

    def configuration(self) -> dict[str, Any]:
        return {
            "metadata": {"name": self.config},
            "webhooks": [
                {
                    "name": "wiring.shoal.dev",
                    "clientConfig": {"url": f"https://127.0.0.1:{self.port}/mutate"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                    "matchConditions": [
                        {
                            "name": "shoal-pods",
                            "expression": f"object.spec.schedulerName == '{self.scheduler}'",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "timeoutSeconds": 3,
                    "reinvocationPolicy": "IfNeeded",
                    "admissionReviewVersions": ["v1"],
                }
            ],
        }

    def ca_bundle(self) -> str:
        config = self.admission.read_mutating_webhook_configuration(self.config)
        return str(config.webhooks[0].client_config.ca_bundle or "")

    def pod(self, name: str, *, scheduler: str | None = None, **extra: Any) -> dict[str, Any]:
        spec = {
            "schedulerName": scheduler or self.scheduler,
            "automountServiceAccountToken": False,
            "containers": [dict(CONTAINER)],
            **extra.pop("spec", {}),
        }
        return {"metadata": {"name": name, **extra}, "spec": spec}

    def create(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        core = self.devcluster.core()
        response = core.create_namespaced_pod(
            self.namespace, body, dry_run="All" if dry_run else None, _preload_content=False
        )
        return dict(json.loads(response.data))

    def close(self) -> None:
        self.admission.delete_mutating_webhook_configuration(self.config)


@pytest.fixture
def webhook(
    devcluster: Devcluster,
    namespace: str,
    scheduler_name: str,
    start_scheduler: Callable[..., SchedulerProcess],
) -> Iterator[Webhook]:
    with serving(Webhook(devcluster, namespace, scheduler_name, start_scheduler)) as hook:
        yield hook


@contextlib.contextmanager
def serving(hook: Webhook) -> Iterator[Webhook]:
    """``hook`` once the API server calls it; its configuration is removed at the end."""
    try:
        eventually(hook.ca_bundle, what="the scheduler to put its CA into the caBundle")
        # The API server reads configurations through an informer: wait until it calls us.
        eventually(
            lambda: is_wired(hook.create(hook.pod("probe"), dry_run=True)),
            what="the API server to call the webhook",
        )
        yield hook
    finally:
        hook.close()


def is_wired(pod: dict[str, Any]) -> bool:
    return "shoal-notice" in {v["name"] for v in pod["spec"].get("volumes", [])}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def test_a_bare_shoal_pod_is_created_wired(webhook: Webhook) -> None:
    pod = webhook.create(webhook.pod("bare"))
    [trainer] = pod["spec"]["containers"]
    assert env(trainer)[names.SOCKET_ENV] == "/run/shoal/agent.sock"
    assert env(trainer)[names.POD_UID_ENV] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}
    }
    assert env(trainer)[names.LEAVE_BY_FILE_ENV] == "/etc/shoal/leave-by"
    assert mounts(trainer) == {"shoal-notice": "/run/shoal", "shoal-leave-by": "/etc/shoal"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["shoal-notice"]["hostPath"]["path"] == "/run/shoal"


def test_a_checkpoint_claim_and_a_sized_volume_are_mounted(webhook: Webhook) -> None:
    claim = webhook.create(
        webhook.pod("claim", annotations={names.CHECKPOINT_CLAIM_ANNOTATION: "llama-ckpt"})
    )
    [trainer] = claim["spec"]["containers"]
    assert env(trainer)[names.CHECKPOINT_DIR_ENV] == "/checkpoints"
    assert mounts(trainer)["shoal-checkpoint"] == "/checkpoints"
    sized = webhook.create(
        webhook.pod(
            "sized",
            annotations={
                names.CHECKPOINT_SIZE_ANNOTATION: "10Gi",
                names.CHECKPOINT_PATH_ANNOTATION: "/ckpt",
            },
        )
    )
    volume = next(v for v in sized["spec"]["volumes"] if v["name"] == "shoal-checkpoint")
    template = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert template["resources"]["requests"]["storage"] == "10Gi"
    assert mounts(sized["spec"]["containers"][0])["shoal-checkpoint"] == "/ckpt"


def test_another_schedulers_pod_is_untouched(webhook: Webhook) -> None:
    pod = webhook.create(webhook.pod("other", scheduler="default-scheduler"))
    assert "volumes" not in pod["spec"]
    assert "env" not in pod["spec"]["containers"][0]


def test_a_pod_that_carries_the_wiring_is_left_as_it_is(webhook: Webhook) -> None:
    wired = webhook.create(webhook.pod("first"))
    again = webhook.pod("second")
    again["spec"]["containers"] = wired["spec"]["containers"]
    again["spec"]["volumes"] = wired["spec"]["volumes"]
    # A socket of its own choosing stays the pod's choice.
    env_list = again["spec"]["containers"][0]["env"]
    for item in env_list:
        if item["name"] == names.SOCKET_ENV:
            item["value"] = "/run/custom/agent.sock"
    created = webhook.create(again)
    assert created["spec"]["containers"][0]["env"] == env_list
    assert created["spec"]["volumes"] == wired["spec"]["volumes"]
    assert (
        created["spec"]["containers"][0]["volumeMounts"]
        == (wired["spec"]["containers"][0]["volumeMounts"])
    )


def test_pods_are_created_while_the_webhook_is_down(webhook: Webhook) -> None:
    assert webhook.process.stop() == 0
    assert webhook.ca_bundle()  # the configuration stays registered
    pod = webhook.create(webhook.pod("unwired"))
    assert not is_wired(pod)
    assert webhook.devcluster.core().read_namespaced_pod("unwired", webhook.namespace)


def test_a_malformed_checkpoint_request_is_told_and_the_pod_created(
    webhook: Webhook, bin_dir: Path
) -> None:
    body = webhook.pod("bad", annotations={names.CHECKPOINT_SIZE_ANNOTATION: "ten gigs"})
    body = {"apiVersion": "v1", "kind": "Pod", **body}
    created = subprocess.run(
        [
            str(bin_dir / "kubectl"),
            "--kubeconfig",
            webhook.devcluster.kubeconfig,
            "create",
            "-n",
            webhook.namespace,
            "-f",
            "-",
        ],
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    expected = "no checkpoint volume: shoal.dev/checkpoint-size 'ten gigs' is not a size"
    assert f"Warning: {expected}" in created.stderr
    pod = webhook.devcluster.core().read_namespaced_pod("bad", webhook.namespace)
    assert pod.metadata.annotations[names.WIRING_WARNING_ANNOTATION].startswith(expected)
    assert {v.name for v in pod.spec.volumes} == {"shoal-notice", "shoal-leave-by"}
    # A pod without a controller hears it too, on itself, once it exists.
    [event] = eventually(lambda: pod_events(webhook, pod), what="a Warning Event on the pod")
    assert event.type == "Warning"
    assert f"{expected} such as 10Gi" in event.message


def pod_events(webhook: Webhook, pod: Any) -> list[Any]:
    """The ``ShoalWiringIgnored`` Events about ``pod`` (by uid, as ``kubectl describe`` finds
    them)."""
    return [
        e
        for e in webhook.devcluster.core().list_namespaced_event(webhook.namespace).items
        if e.involved_object.uid == pod.metadata.uid and e.reason == "ShoalWiringIgnored"
    ]


def test_a_gang_members_bad_checkpoint_time_is_an_event_on_the_member(webhook: Webhook) -> None:
    body = webhook.pod(
        "",
        labels={names.GANG_LABEL: "llama"},
        annotations={names.MIN_MEMBER_ANNOTATION: "2", names.CHECKPOINT_SECONDS_ANNOTATION: "2m"},
    )
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "llama-"  # the webhook never sees the pod's name
    created = webhook.create(body)
    assert is_wired(created)
    assert names.CHECKPOINT_SECONDS_ENV not in env(created["spec"]["containers"][0])
    pod = webhook.devcluster.core().read_namespaced_pod(
        created["metadata"]["name"], webhook.namespace
    )
    [event] = eventually(lambda: pod_events(webhook, pod), what="a Warning Event on the member")
    assert event.type == "Warning"
    assert event.message == (
        "created without part of its wiring: no warning of short notices: "
        "shoal.dev/checkpoint-seconds '2m' is not a number of seconds such as 20 "
        "(above 0, at most 86400)"
    )


def test_a_declared_checkpoint_time_reaches_the_workers_environment(webhook: Webhook) -> None:
    pod = webhook.create(
        webhook.pod("timed", annotations={names.CHECKPOINT_SECONDS_ANNOTATION: "45"})
    )
    assert env(pod["spec"]["containers"][0])[names.CHECKPOINT_SECONDS_ENV] == "45"
    assert names.WIRING_WARNING_ANNOTATION not in pod["metadata"].get("annotations", {})


def test_a_jobs_malformed_request_is_an_event_on_the_job(webhook: Webhook) -> None:
    template = webhook.pod("", annotations={names.CHECKPOINT_CLAIM_ANNOTATION: "Not_A_Name"})
    del template["metadata"]["name"]
    template["spec"]["restartPolicy"] = "Never"
    job = client.BatchV1Api(webhook.devcluster.api).create_namespaced_job(
        webhook.namespace,
        {
            "metadata": {"name": "train"},
            "spec": {"parallelism": 2, "completions": 2, "template": template},
        },
    )
    core = webhook.devcluster.core()

    def job_events() -> list[Any]:
        return [
            e
            for e in core.list_namespaced_event(webhook.namespace).items
            if e.involved_object.uid == job.metadata.uid and e.reason == "ShoalWiringIgnored"
        ]

    [event] = eventually(job_events, what="a ShoalWiringIgnored Event on the Job")
    assert event.type == "Warning"
    assert "'Not_A_Name' is not a claim name" in event.message
    pods = eventually(
        lambda: [
            p
            for p in core.list_namespaced_pod(webhook.namespace).items
            if p.metadata.owner_references
        ],
        what="the Job's pods",
    )
    assert all(is_wired(core.api_client.sanitize_for_serialization(p)) for p in pods)
