"""The webhook's patch builder: what a Shoal pod gets, what it never gets twice, and what a bad
checkpoint request says."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contracts import names
from scheduler.webhook import wiring
from scheduler.webhook.wiring import Checkpoint, Layout, Malformed, Wiring, checkpoint_request, wire

LAYOUT = Layout()
SCHEDULER = "shoal-scheduler"


def apply(pod: dict[str, Any], result: Wiring) -> dict[str, Any]:
    """Apply the ``add`` operations as the API server does (RFC 6902)."""
    out = copy.deepcopy(pod)
    for op in result.ops:
        assert op.op == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op.path.split("/")[1:]]
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            assert last == "-"
            target.append(copy.deepcopy(op.value))
        else:
            target[last] = copy.deepcopy(op.value)
    return out


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {"schedulerName": SCHEDULER, "containers": list(containers)},
    }
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    return body


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def mounts_of(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


def test_a_bare_pod_gets_the_socket_its_identity_and_the_leave_by_file() -> None:
    wired = apply(
        pod({"name": "trainer", "image": "x"}), wire(pod({"name": "trainer"}), SCHEDULER, LAYOUT)
    )
    [trainer] = wired["spec"]["containers"]
    env = env_of(trainer)
    assert env[names.SOCKET_ENV] == "/run/shoal/agent.sock"
    assert env[names.LEAVE_BY_FILE_ENV] == "/etc/shoal/leave-by"
    assert env[names.POD_UID_ENV] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env[names.POD_NAME_ENV] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[names.POD_NAMESPACE_ENV] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert names.CHECKPOINT_DIR_ENV not in env
    assert mounts_of(trainer) == {"shoal-notice": "/run/shoal", "shoal-leave-by": "/etc/shoal"}
    volumes = {v["name"]: v for v in wired["spec"]["volumes"]}
    assert volumes["shoal-notice"]["hostPath"] == {
        "path": "/run/shoal",
        "type": "DirectoryOrCreate",
    }
    [item] = volumes["shoal-leave-by"]["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations['shoal.dev/leave-by']"


def test_another_schedulers_pod_is_left_alone() -> None:
    other = pod({"name": "c"})
    other["spec"]["schedulerName"] = "default-scheduler"
    assert wire(other, SCHEDULER, LAYOUT) == Wiring()
    del other["spec"]["schedulerName"]
    assert wire(other, SCHEDULER, LAYOUT) == Wiring()


def test_sidecars_are_wired_and_plain_init_containers_are_not() -> None:
    body = pod({"name": "c"})
    body["spec"]["initContainers"] = [
        {"name": "fetch"},
        {"name": "listener", "restartPolicy": "Always"},
    ]
    wired = apply(body, wire(body, SCHEDULER, LAYOUT))
    fetch, listener = wired["spec"]["initContainers"]
    assert "env" not in fetch
    assert names.SOCKET_ENV in env_of(listener)


def test_what_the_pod_already_sets_is_kept() -> None:
    body = pod(
        {
            "name": "c",
            "env": [{"name": names.SOCKET_ENV, "value": "/custom/agent.sock"}],
            "volumeMounts": [{"name": "mine", "mountPath": "/etc/shoal"}],
        }
    )
    body["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    wired = apply(body, wire(body, SCHEDULER, LAYOUT))
    [c] = wired["spec"]["containers"]
    assert env_of(c)[names.SOCKET_ENV] == "/custom/agent.sock"
    assert mounts_of(c) == {"mine": "/etc/shoal", "shoal-notice": "/run/shoal"}
    assert wired["spec"]["volumes"][0]["name"] == "mine"


def test_an_existing_claim_is_mounted_at_the_asked_path() -> None:
    body = pod(
        {"name": "c"},
        annotations={
            names.CHECKPOINT_CLAIM_ANNOTATION: "llama-ckpt",
            names.CHECKPOINT_PATH_ANNOTATION: "/ckpt/",
        },
    )
    result = wire(body, SCHEDULER, LAYOUT)
    assert result.warnings == ()
    wired = apply(body, result)
    [c] = wired["spec"]["containers"]
    assert env_of(c)[names.CHECKPOINT_DIR_ENV] == "/ckpt"
    assert mounts_of(c)["shoal-checkpoint"] == "/ckpt"
    volumes = {v["name"]: v for v in wired["spec"]["volumes"]}
    assert volumes["shoal-checkpoint"]["persistentVolumeClaim"] == {"claimName": "llama-ckpt"}


def test_a_size_is_a_volume_of_the_pods_own_of_that_storage_class() -> None:
    body = pod(
        {"name": "c"},
        annotations={
            names.CHECKPOINT_SIZE_ANNOTATION: "10Gi",
            names.CHECKPOINT_STORAGE_CLASS_ANNOTATION: "fast-nvme",
        },
    )
    wired = apply(body, wire(body, SCHEDULER, LAYOUT))
    volumes = {v["name"]: v for v in wired["spec"]["volumes"]}
    spec = volumes["shoal-checkpoint"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert spec == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
        "storageClassName": "fast-nvme",
    }
    assert mounts_of(wired["spec"]["containers"][0])["shoal-checkpoint"] == "/checkpoints"


def test_a_malformed_request_is_a_warning_and_an_annotation_and_no_volume() -> None:
    body = pod({"name": "c"}, annotations={names.CHECKPOINT_SIZE_ANNOTATION: "ten gigs"})
    result = wire(body, SCHEDULER, LAYOUT)
    [warning] = result.warnings
    assert "'ten gigs' is not a size" in warning
    wired = apply(body, result)
    assert wired["metadata"]["annotations"][names.WIRING_WARNING_ANNOTATION] == warning
    assert "shoal-checkpoint" not in {v["name"] for v in wired["spec"]["volumes"]}
    assert "shoal-notice" in {v["name"] for v in wired["spec"]["volumes"]}


def test_each_kind_of_bad_request_says_what_is_wrong() -> None:
    cases = {
        (("checkpoint-claim", "a"), ("checkpoint-size", "1Gi")): "not both",
        (("checkpoint-claim", "Bad_Name"),): "not a claim name",
        (("checkpoint-size", "0"),): "not a size",
        (("checkpoint-size", "-1Gi"),): "not a size",
        (("checkpoint-size", "1Gi"), ("checkpoint-storage-class", "UPPER")): "is not a name",
        (("checkpoint-claim", "a"), ("checkpoint-storage-class", "x")): "only with a size",
        (("checkpoint-size", "1Gi"), ("checkpoint-path", "relative")): "not an absolute path",
        (("checkpoint-size", "1Gi"), ("checkpoint-path", "/a/../b")): "not an absolute path",
        (("checkpoint-size", "1Gi"), ("checkpoint-path", "/")): "not an absolute path",
        (("checkpoint-size", "1Gi"), ("checkpoint-path", "/run/shoal")): "where Shoal's files",
        (("checkpoint-path", "/ckpt"),): "need shoal.dev/checkpoint-claim",
    }
    for pairs, expected in cases.items():
        result = checkpoint_request({f"shoal.dev/{k}": v for k, v in pairs}, LAYOUT)
        assert isinstance(result, Malformed), pairs
        assert expected in result.reason, (pairs, result.reason)
    assert checkpoint_request({}, LAYOUT) is None
    for size in ("10Gi", "500M", "1.5Ti", "1e9", "+2Ki"):
        request = checkpoint_request({names.CHECKPOINT_SIZE_ANNOTATION: size}, LAYOUT)
        assert request == Checkpoint(path="/checkpoints", size=size)


def test_a_declared_checkpoint_time_reaches_the_worker_and_a_bad_one_is_told() -> None:
    body = pod({"name": "c"}, annotations={names.CHECKPOINT_SECONDS_ANNOTATION: " 20.5"})
    result = wire(body, SCHEDULER, LAYOUT)
    assert result.warnings == ()
    [trainer] = apply(body, result)["spec"]["containers"]
    assert env_of(trainer)[names.CHECKPOINT_SECONDS_ENV] == "20.5"
    for bad in ("20s", "0", "-1", "1e3", "86401", ""):
        body = pod(
            {"name": "c"},
            annotations={
                names.CHECKPOINT_SECONDS_ANNOTATION: bad,
                names.CHECKPOINT_SIZE_ANNOTATION: "ten gigs",
            },
        )
        result = wire(body, SCHEDULER, LAYOUT)
        volume, seconds = result.warnings
        assert volume.startswith("no checkpoint volume: "), bad
        assert seconds == (
            f"no warning of short notices: shoal.dev/checkpoint-seconds {bad!r} is not a "
            "number of seconds such as 20 (above 0, at most 86400)"
        )
        wired = apply(body, result)
        assert wired["metadata"]["annotations"][names.WIRING_WARNING_ANNOTATION] == (
            f"{volume}; {seconds}"
        )
        assert names.CHECKPOINT_SECONDS_ENV not in env_of(wired["spec"]["containers"][0])
        # Admitted again with its warning, it gets nothing more.
        assert wire(wired, SCHEDULER, LAYOUT).ops == ()


_ours = st.sampled_from(
    [
        names.SOCKET_ENV,
        names.POD_UID_ENV,
        names.LEAVE_BY_FILE_ENV,
        names.CHECKPOINT_DIR_ENV,
        names.CHECKPOINT_SECONDS_ENV,
        "OTHER",
    ]
)
_volume_names = st.sampled_from(
    [wiring.NOTICE_VOLUME, wiring.LEAVE_BY_VOLUME, wiring.CHECKPOINT_VOLUME, "data"]
)
_paths = st.sampled_from(["/run/shoal", "/etc/shoal", "/checkpoints", "/ckpt", "/data"])
_containers = st.builds(
    lambda i, env, mounts, sidecar, with_lists: {
        "name": f"c{i}",
        **({"restartPolicy": "Always"} if sidecar else {}),
        **(
            {
                "env": [{"name": n, "value": "x"} for n in sorted(env)],
                "volumeMounts": [{"name": v, "mountPath": p} for p, v in mounts.items()],
            }
            if with_lists
            else {}
        ),
    },
    st.integers(0, 99),
    st.sets(_ours, max_size=3),
    st.dictionaries(_paths, _volume_names, max_size=2),  # one mount per path, as the API demands
    st.booleans(),
    st.booleans(),
)
_annotations = st.dictionaries(
    st.sampled_from(
        [
            names.CHECKPOINT_CLAIM_ANNOTATION,
            names.CHECKPOINT_SIZE_ANNOTATION,
            names.CHECKPOINT_STORAGE_CLASS_ANNOTATION,
            names.CHECKPOINT_PATH_ANNOTATION,
            names.CHECKPOINT_SECONDS_ANNOTATION,
        ]
    ),
    st.sampled_from(["ckpt", "10Gi", "/ckpt", "bad value", "fast", "/etc/shoal", "20"]),
)


@given(
    st.lists(_containers, min_size=1, max_size=3),
    st.lists(_containers, max_size=2),
    st.sets(_volume_names),
    _annotations,
)
def test_wiring_a_wired_pod_changes_nothing(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]],
    volumes: set[str],
    annotations: dict[str, str],
) -> None:
    body = pod(*containers, annotations=annotations)
    if init:
        body["spec"]["initContainers"] = init
    if volumes:
        body["spec"]["volumes"] = [{"name": v, "emptyDir": {}} for v in sorted(volumes)]
    once = apply(body, wire(body, SCHEDULER, LAYOUT))
    assert wire(once, SCHEDULER, LAYOUT).ops == ()
    for container in once["spec"]["containers"]:
        paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
        assert len(paths) == len(set(paths)), "two mounts at one path make the pod invalid"
        env = [e["name"] for e in container.get("env", [])]
        assert len(env) == len(set(env))
        assert names.SOCKET_ENV in env
    volume_names = [v["name"] for v in once["spec"]["volumes"]]
    assert len(volume_names) == len(set(volume_names))


def test_workers_join_the_socket_folders_group_whatever_user_they_run_as() -> None:
    bare = apply(pod({"name": "trainer"}), wire(pod({"name": "trainer"}), SCHEDULER, LAYOUT))
    assert bare["spec"]["securityContext"] == {"supplementalGroups": [names.SOCKET_GROUP]}
    own = pod({"name": "trainer"})
    own["spec"]["securityContext"] = {"runAsUser": 1000, "supplementalGroups": [10]}
    wired = apply(own, wire(own, SCHEDULER, LAYOUT))
    assert wired["spec"]["securityContext"] == {
        "runAsUser": 1000,
        "supplementalGroups": [10, names.SOCKET_GROUP],
    }
    assert wire(wired, SCHEDULER, LAYOUT).ops == ()
