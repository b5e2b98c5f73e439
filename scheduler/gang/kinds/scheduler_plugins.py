"""scheduler-plugins' PodGroup (``scheduling.x-k8s.io/v1alpha1``; what the Kubeflow
training-operator writes in its scheduler-plugins gang mode): the label
``scheduling.x-k8s.io/pod-group`` names a PodGroup in the pod's namespace. Minimum
``spec.minMember``; maximum the PodGroup's ``shoal.dev/max-member`` annotation, else every member
pod. Its references are ``namespace/name``. Its status is the one that project's own controller
keeps, from the group and every pod that names it (:mod:`scheduler.gang.group_status`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contracts import names
from scheduler.gang.kinds.base import Api, Claim, InvalidGangText, PodGroupKind, read, timestamp
from scheduler.model import PodGroup


class SchedulerPlugins(PodGroupKind):
    tag = ""
    title = "scheduler-plugins"
    api = Api("scheduling.x-k8s.io", ("v1alpha1",))
    claim = Claim.label(names.POD_GROUP_LABEL)
    status_from_members = True

    def convert(self, raw: Mapping[str, Any], priorities: Mapping[str, int]) -> PodGroup:
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        started = timestamp(status.get("scheduleStartTime"))
        return read(
            raw,
            self,
            spec.get("minMember"),
            phase=str(status.get("phase") or ""),
            schedule_start=started or None,
        )

    def missing(self, where: str) -> InvalidGangText:
        return InvalidGangText(
            f"{where} ({self.claim.text}) does not exist yet; "
            "its members wait for it rather than run without their gang",
            "PodGroupNotFound",
        )
