"""Our copy of the scheduler-plugins PodGroup CRD is the published one, and the status Shoal
writes fits its schema (a field the schema lacks is pruned by the API server, with a warning)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from scheduler.gang.group_status import GroupStatus

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"
#: sha256 of config/crd/bases/scheduling.x-k8s.io_podgroups.yaml of
#: kubernetes-sigs/scheduler-plugins at commit 903da7df82cb8794dda8f2d510ba1156111662dd.
PUBLISHED = "e87980a29866bbf8a4df5452e03d876b6ae952c80b5443abdfaacee3b9adf60c"


def _published_part() -> bytes:
    """The copy without its leading comment lines (where it says where it comes from)."""
    lines = CRD.read_bytes().splitlines(keepends=True)
    while lines and lines[0].startswith(b"#"):
        lines.pop(0)
    return b"".join(lines)


def test_our_pod_group_crd_is_the_published_one_byte_for_byte() -> None:
    assert hashlib.sha256(_published_part()).hexdigest() == PUBLISHED


def _status_schema() -> dict[str, Any]:
    body = yaml.safe_load(_published_part())
    [version] = body["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_every_status_field_shoal_writes_is_in_the_schema_with_its_type() -> None:
    properties = _status_schema()["properties"]
    body = GroupStatus("Running", 1, 2, 3, schedule_start=0.0).body()
    assert set(body) <= set(properties)
    for key, value in body.items():
        expected = {"string": str, "integer": int}[properties[key]["type"]]
        assert isinstance(value, expected), key
