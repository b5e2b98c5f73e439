"""API JSON to core values, and the command line's flags / environment / config file."""

from __future__ import annotations

import contextlib
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import gputopology, names
from scheduler.gang.kinds.scheduler_plugins import SchedulerPlugins
from scheduler.k8s import convert
from scheduler.model import PodPhase, Resources
from scheduler.settings import SettingsError, resolve


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1Gi", Decimal(2**30)),
        ("1.5Ki", Decimal(1536)),
        ("1e3", Decimal(1000)),
        ("3M", Decimal(3_000_000)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert convert.quantity(text) == value


@given(st.text(max_size=8))
def test_quantity_parser_accepts_or_refuses_but_never_crashes(text: str) -> None:
    with contextlib.suppress(convert.QuantityError):
        convert.quantity(text)


def test_pod_requests_sum_containers_take_init_max_and_default_requests_to_limits() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
            {"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
    }
    assert convert.pod_requests(spec) == Resources(4000, 2**30, 2, 1)


def test_pod_conversion_reads_what_the_scheduler_needs() -> None:
    raw = {
        "metadata": {
            "name": "w0",
            "namespace": "ml",
            "uid": "u1",
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "labels": {names.GANG_LABEL: "g"},
        },
        "spec": {
            "schedulerName": "shoal-scheduler",
            "priority": 7,
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "z", "operator": "In", "values": ["1"]}]}
                        ]
                    }
                }
            },
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": 4}}}],
        },
        "status": {"phase": "Running"},
    }
    pod = convert.pod(raw)
    assert pod.key == "ml/w0"
    assert pod.requests.gpu == 4
    assert pod.priority == 7
    assert pod.phase == PodPhase.RUNNING
    assert pod.created == 1767323045.0
    assert pod.node is None
    assert pod.affinity[0].matches({"z": "1"})
    assert pod.tolerations[0].operator == "Exists"


def test_pod_group_conversion_reads_the_stored_phase_and_start_time() -> None:
    raw = {
        "metadata": {"namespace": "ns", "name": "g", "uid": "u"},
        "spec": {"minMember": 2},
        "status": {"phase": "Running", "scheduleStartTime": "2026-11-30T10:00:00Z"},
    }
    group = SchedulerPlugins().convert(raw, {})
    assert (group.phase, group.schedule_start) == ("Running", 1796032800.0)
    bare = SchedulerPlugins().convert({"metadata": {"name": "g"}, "spec": {}}, {})
    assert (bare.phase, bare.schedule_start) == ("", None)


def test_node_with_a_broken_topology_annotation_is_read_count_only_and_reported() -> None:
    raw = {
        "metadata": {
            "name": "n",
            "labels": {"karpenter.sh/capacity-type": "spot"},
            "annotations": {names.GPU_TOPOLOGY_ANNOTATION: "{not json"},
        },
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "8"}},
    }
    problems: list[str] = []
    node = convert.node(raw, problems)
    assert node.gpu_topology is None
    assert node.spot
    assert node.unschedulable
    assert node.allocatable == Resources(8000, 16 * 2**30, 8, 0)
    assert problems
    assert problems[0].startswith(f"annotation {names.GPU_TOPOLOGY_ANNOTATION}: not JSON")
    good = gputopology.encode(gputopology.uniform(8, 4))
    raw["metadata"]["annotations"] = {names.GPU_TOPOLOGY_ANNOTATION: good}  # type: ignore[index]
    assert convert.node(raw).gpu_topology is not None


def test_settings_precedence_flag_env_file_default(tmp_path: Path) -> None:
    conf = tmp_path / "scheduler.yaml"
    conf.write_text("bind-workers: 32\nqps: 50\ntopology_keys: [a, b]\n")
    env = {"SHOAL_SCHEDULER_QPS": "75"}
    settings = resolve(["--config", str(conf), "--burst", "9"], env)
    assert settings.bind_workers == 32  # file
    assert settings.qps == 75.0  # env beats file
    assert settings.burst == 9  # flag
    assert settings.topology_keys == ("a", "b")
    assert settings.scheduler_name == names.SCHEDULER_NAME  # default


def test_wrong_settings_name_the_option_and_where_it_came_from(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="env SHOAL_SCHEDULER_BURST"):
        resolve([], {"SHOAL_SCHEDULER_BURST": "lots"})
    conf = tmp_path / "bad.yaml"
    conf.write_text("bind_wrokers: 3\n")
    with pytest.raises(SettingsError, match="unknown option 'bind_wrokers'"):
        resolve(["--config", str(conf)], {})


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("bind-workers: -3", "bind-workers"),  # used to crash the thread pool at start
        ("http-port: 70000", "http-port"),  # used to crash the HTTP server at start
        ("burst: 0", "burst"),
        ("qps: .inf", "qps"),
        ("max-backoff: .nan", "max-backoff"),  # NaN backoffs never expire
        ("reclaim-grace: -1", "reclaim-grace"),
    ],
)
def test_out_of_range_settings_are_refused_before_the_scheduler_starts(
    tmp_path: Path, line: str, option: str
) -> None:
    conf = tmp_path / "scheduler.yaml"
    conf.write_text(line + "\n")
    with pytest.raises(SettingsError, match=f"{conf}: {option}"):
        resolve(["--config", str(conf)], {})
