"""What a PodGroup kind is: where its objects live in the API, which pods a PodGroup of it
claims, how its object reads into a :class:`~scheduler.model.PodGroup`, the gang it defines,
and the status Shoal writes on it. Pure: raw API JSON (camelCase dicts) in, values out.

The adapters do the I/O from these values alone: the informers list and watch every kind in
:data:`scheduler.gang.kinds.KINDS` (in the newest of its versions the API server serves), the
reporter writes what :meth:`PodGroupKind.status` returns, and ``kubectl shoal`` lists them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import quote

from contracts.times import parse_time_or
from scheduler.gang.common import GangRef, group_gang, invalid_gang
from scheduler.model import (
    Gang,
    GangKey,
    InvalidGang,
    PodGroup,
    PodRequest,
    group_ref,
    split_group_ref,
)


@dataclass(frozen=True, slots=True)
class Api:
    """Where a kind's objects live: ``/apis/<group>/<version>/namespaces/<ns>/<plural>``."""

    group: str
    #: The versions Shoal reads, newest first: the informer reads the first one served.
    versions: tuple[str, ...]
    plural: str = "podgroups"
    kind: str = "PodGroup"

    @property
    def resource(self) -> str:
        """``plural.group``, as kubectl names a resource."""
        return f"{self.plural}.{self.group}"


@dataclass(frozen=True, slots=True)
class StatusPatch:
    """A JSON merge patch of ``status``: through the status subresource, or on the object for a
    kind whose CRD has none; with ``uid``, only on that very object (one deleted and created
    again under its name meanwhile is left alone: the write conflicts)."""

    status: Mapping[str, Any]
    subresource: bool = True
    uid: str = ""

    @property
    def what(self) -> str:
        return "status"


@dataclass(frozen=True, slots=True)
class ConditionPatch:
    """One condition in ``status.conditions`` (without its time), merged with what the object
    has; a ``sticky`` one, once ``True``, is never written back."""

    condition: Mapping[str, Any]
    sticky: bool = False

    @property
    def what(self) -> str:
        return str(self.condition["type"])

    def merged(self, raw: Mapping[str, Any], now: str) -> dict[str, Any] | None:
        """The condition as it is to be written on the object ``raw``: with the time it last
        changed status (``now``, or the time already there when the status is the same);
        ``None`` when nothing is to be written (it is sticky and ``True`` there)."""
        condition = dict(self.condition)
        for old in (raw.get("status") or {}).get("conditions") or []:
            if old.get("type") != condition["type"]:
                continue
            if self.sticky and old.get("status") == "True" and condition["status"] != "True":
                return None
            if old.get("status") == condition["status"] and old.get("lastTransitionTime"):
                return {**condition, "lastTransitionTime": old["lastTransitionTime"]}
        return {**condition, "lastTransitionTime": now}


GroupWrite = StatusPatch | ConditionPatch


@dataclass(frozen=True, slots=True)
class Claim:
    """What on a pod names a PodGroup of a kind: ``text`` says it in messages, ``read`` gives
    the name ("" when the pod names none)."""

    text: str
    read: Callable[[PodRequest], str]

    @staticmethod
    def label(key: str) -> Claim:
        return Claim(f"label {key}", lambda pod: pod.labels.get(key) or "")

    @staticmethod
    def annotation(key: str) -> Claim:
        return Claim(f"annotation {key}", lambda pod: pod.annotations.get(key) or "")


@dataclass(frozen=True, slots=True)
class InvalidGangText:
    """Why a gang cannot be scheduled as defined, and the reason its Event and condition give."""

    message: str
    reason: str = "InvalidGang"


class PodGroupKind(ABC):
    """One PodGroup kind, and the gang source of its PodGroups: a pod that names a PodGroup of
    this kind (:meth:`named`) is in the gang that PodGroup defines; its members wait, with a
    message, while the PodGroup does not exist."""

    #: The middle of the kind's group references (``namespace/<tag>/name``); "" for the one
    #: kind whose references are ``namespace/name`` (scheduler-plugins').
    tag: ClassVar[str]
    #: What ``kubectl shoal`` calls the kind in its source column.
    title: ClassVar[str]
    api: ClassVar[Api]
    #: What on a pod names a PodGroup of this kind.
    claim: ClassVar[Claim]
    #: The field :meth:`convert` reads the minimum from, in messages.
    minimum_field: ClassVar[str] = "spec.minMember"
    #: Asked after the ``shoal.dev/gang`` label (a controller sets the field on its own, where
    #: the pods' labels say what the user meant), and not counted as a second claim.
    after_label: ClassVar[bool] = False
    #: :meth:`convert` reads PriorityClass values: its objects are read again when they change.
    uses_priorities: ClassVar[bool] = False
    #: Its status is computed from the group and every pod that names it, finished ones
    #: included (:mod:`scheduler.gang.group_status`), not from the gang.
    status_from_members: ClassVar[bool] = False

    # -- what each kind says -----------------------------------------------------------------
    @abstractmethod
    def convert(self, raw: Mapping[str, Any], priorities: Mapping[str, int]) -> PodGroup:
        """The object ``raw`` as a PodGroup; ``priorities`` maps PriorityClass names to their
        values. Total: a bad field is kept as read, for the gang to report."""

    def where(self, namespace: str, name: str) -> str:
        """How messages name the PodGroup ``namespace/name``."""
        return f"PodGroup {namespace}/{name}"

    def missing(self, where: str) -> InvalidGangText:
        """Why the members of a PodGroup that does not exist wait, and the Event's reason."""
        message = f"{where} ({self.claim.text}) does not exist; its members wait for it"
        return InvalidGangText(message)

    def gang(
        self, key: GangKey, pods: Sequence[PodRequest], group: PodGroup, where: str
    ) -> Gang | InvalidGang:
        """The gang ``group`` defines with ``pods`` (live, oldest first, at least one): its
        minimum, then the maximum from its ``shoal.dev/max-member`` annotation."""
        minimum_field = f"{where} {self.minimum_field}"
        return group_gang(key, pods, group, minimum_field=minimum_field, where=where)

    def status(self, gang: Gang) -> GroupWrite | None:
        """What to write on the gang's PodGroup now (``None``: nothing, or it comes from
        :mod:`scheduler.gang.group_status`)."""
        return None

    def disrupted(self, scheduler_name: str, preemptor: Gang) -> GroupWrite | None:
        """What to write on a PodGroup of this kind whose members are asked to leave to make
        room for ``preemptor`` (``None``: nothing)."""
        return None

    # -- the gang source -----------------------------------------------------------------------
    def named(self, pod: PodRequest) -> str:
        """The name of the PodGroup ``pod`` names ("" when it names none of this kind)."""
        return self.claim.read(pod)

    def claims(self, pod: PodRequest) -> GangRef | None:
        name = self.named(pod)
        if not name:
            return None
        ref = group_ref(self.tag, pod.namespace, name)
        return GangRef(GangKey(ref), ref)

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        ref = str(key)  # a PodGroup kind keys a gang by its PodGroup's reference
        _, namespace, name = split_group_ref(ref)
        where = self.where(namespace, name)
        group = groups.get(ref)
        if group is None:
            text = self.missing(where)
            return replace(invalid_gang(key, pods, ref, text.message), reason=text.reason)
        return self.gang(key, pods, group, where)

    # -- where the objects are -----------------------------------------------------------------
    def involved(self, ref: str, uid: str, version: str) -> tuple[str, dict[str, str]]:
        """The namespace and ``involvedObject`` of an Event on the PodGroup ``ref``."""
        _, namespace, name = split_group_ref(ref)
        found = {
            "apiVersion": f"{self.api.group}/{version}",
            "kind": self.api.kind,
            "name": name,
        }
        if uid:
            found["uid"] = uid
        return namespace, found

    def path(self, ref: str, version: str) -> str:
        """The URL path of the PodGroup ``ref`` in ``version``."""
        _, namespace, name = split_group_ref(ref)
        return (
            f"/apis/{self.api.group}/{version}/namespaces/{quote(namespace, safe='')}/"
            f"{self.api.plural}/{quote(name, safe='')}"
        )


def read(raw: Mapping[str, Any], kind: PodGroupKind, min_member: object, **fields: Any) -> PodGroup:
    """A PodGroup of ``kind`` with what every object has (namespace, name, annotations,
    creation time, uid, the version it was read in) and the kind's own ``fields``."""
    meta = raw.get("metadata") or {}
    api_version = str(raw.get("apiVersion") or "")
    return PodGroup(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_member=min_member,
        annotations=dict(meta.get("annotations") or {}),
        created=timestamp(meta.get("creationTimestamp")),
        uid=str(meta.get("uid", "")),
        kind=kind.tag,
        version=api_version.rsplit("/", 1)[-1] if "/" in api_version else "",
        **fields,
    )


def timestamp(text: object) -> float:
    return parse_time_or(text, 0.0)
