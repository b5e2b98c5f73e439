"""What a Shoal pod needs to hear notices, as a JSON Patch: the pure core of the webhook.

``wire(pod, scheduler_name, layout)`` reads a pod as the API server sends it for admission and
returns the ``add`` operations that give every container (and every sidecar, an init container
with ``restartPolicy: Always``) of a pod for this scheduler:

- the agent's notice socket: a hostPath volume ``shoal-notice`` of the socket's folder, mounted
  read-only, and ``SHOAL_SOCKET``;
- its identity from the Downward API: ``POD_NAMESPACE``, ``POD_NAME``, ``POD_UID``;
- the ``shoal.dev/leave-by`` annotation as a file that updates in place (a Downward API volume
  ``shoal-leave-by``) and ``SHOAL_LEAVE_BY_FILE``;
- when its annotations ask for one, a checkpoint volume ``shoal-checkpoint`` (an existing claim,
  or a generic ephemeral volume of a size) and ``SHOAL_CHECKPOINT_DIR``;
- when it declares how long its checkpoint takes (``shoal.dev/checkpoint-seconds``),
  ``SHOAL_CHECKPOINT_SECONDS`` for the worker library.

Idempotent by construction: a volume whose name the pod already has, a variable it already sets
and a mount at a path it already uses are left alone, so a pod that carries the wiring gets no
operation and applying the result to the pod, then wiring it again, gives nothing more. A
checkpoint request that cannot be followed, or a checkpoint time that is not a number of
seconds, is a warning (and the ``shoal.dev/wiring-warning`` annotation on the pod), never a
refusal: the pod is created without the checkpoint volume (or the variable).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts import names

NOTICE_VOLUME = "shoal-notice"
LEAVE_BY_VOLUME = "shoal-leave-by"
CHECKPOINT_VOLUME = "shoal-checkpoint"
DEFAULT_CHECKPOINT_PATH = "/checkpoints"

# A Kubernetes quantity (resource.Quantity's grammar): a decimal number with a binary or decimal
# suffix, or an exponent.
_QUANTITY = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the wiring puts things; the socket must be the agent's ``--socket``."""

    notice_socket: str = "/run/shoal/agent.sock"
    leave_by_dir: str = "/etc/shoal"
    #: The socket folder's group (mode 2770 on the host): added to the pod's supplemental
    #: groups so that workers running as any user can connect.
    socket_group: int = names.SOCKET_GROUP

    @property
    def leave_by_file(self) -> str:
        return posixpath.join(self.leave_by_dir, "leave-by")

    @property
    def socket_dir(self) -> str:
        return posixpath.dirname(self.notice_socket) or "/"

    def folders(self) -> frozenset[str]:
        """The folders the wiring mounts (a checkpoint cannot go there)."""
        return frozenset(posixpath.normpath(p) for p in (self.socket_dir, self.leave_by_dir))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint volume a pod asked for: ``claim`` or ``size`` (exactly one), and where."""

    path: str
    claim: str | None = None
    size: str | None = None
    storage_class: str | None = None

    def volume(self) -> dict[str, Any]:
        if self.claim is not None:
            return {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": self.claim}}
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": self.size}},
        }
        if self.storage_class is not None:
            spec["storageClassName"] = self.storage_class
        return {"name": CHECKPOINT_VOLUME, "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


@dataclass(frozen=True, slots=True)
class Malformed:
    """A checkpoint request that cannot be followed, and why (said to the user as is)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Op:
    """One JSON Patch operation (RFC 6902); ``add`` on an existing member replaces it."""

    op: str
    path: str
    value: Any

    def as_json(self) -> dict[str, Any]:
        return {"op": self.op, "path": self.path, "value": self.value}


@dataclass(frozen=True, slots=True)
class Wiring:
    """The operations for one pod (none: admit it as it is) and the warnings for its creator."""

    ops: tuple[Op, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Mount:
    volume: str
    path: str
    read_only: bool

    def as_json(self) -> dict[str, Any]:
        mount: dict[str, Any] = {"name": self.volume, "mountPath": self.path}
        if self.read_only:
            mount["readOnly"] = True
        return mount


@dataclass(frozen=True, slots=True)
class _Wanted:
    volumes: tuple[dict[str, Any], ...]
    mounts: tuple[_Mount, ...]
    env: tuple[dict[str, Any], ...]


def checkpoint_request(
    annotations: Mapping[str, str], layout: Layout
) -> Checkpoint | Malformed | None:
    """The checkpoint volume the annotations ask for, why they cannot be followed, or None."""
    claim = annotations.get(names.CHECKPOINT_CLAIM_ANNOTATION)
    size = annotations.get(names.CHECKPOINT_SIZE_ANNOTATION)
    storage_class = annotations.get(names.CHECKPOINT_STORAGE_CLASS_ANNOTATION)
    path = annotations.get(names.CHECKPOINT_PATH_ANNOTATION)
    if claim is None and size is None:
        if storage_class is None and path is None:
            return None
        return Malformed(
            f"{names.CHECKPOINT_STORAGE_CLASS_ANNOTATION} and {names.CHECKPOINT_PATH_ANNOTATION} "
            f"need {names.CHECKPOINT_CLAIM_ANNOTATION} or {names.CHECKPOINT_SIZE_ANNOTATION}"
        )
    problem = _problem(claim, size, storage_class, path)
    if problem is not None:
        return Malformed(problem)
    where = posixpath.normpath(path) if path is not None else DEFAULT_CHECKPOINT_PATH
    if where in layout.folders():
        return Malformed(f"{names.CHECKPOINT_PATH_ANNOTATION} {where!r} is where Shoal's files go")
    return Checkpoint(
        path=where,
        claim=claim,
        size=size,
        storage_class=storage_class,
    )


def _problem(
    claim: str | None, size: str | None, storage_class: str | None, path: str | None
) -> str | None:
    """The first thing wrong with a request that names a claim or a size, or None."""
    checks = (
        (
            claim is not None and size is not None,
            f"give {names.CHECKPOINT_CLAIM_ANNOTATION} (an existing claim) or "
            f"{names.CHECKPOINT_SIZE_ANNOTATION} (a volume for the pod), not both",
        ),
        (
            claim is not None and not _is_subdomain(claim),
            f"{names.CHECKPOINT_CLAIM_ANNOTATION} {claim!r} is not a claim name "
            "(lowercase letters, digits, '-' and '.', such as llama-ckpt)",
        ),
        (
            claim is not None and storage_class is not None,
            f"{names.CHECKPOINT_STORAGE_CLASS_ANNOTATION} applies only with a size",
        ),
        (
            size is not None and not _is_positive_quantity(size),
            f"{names.CHECKPOINT_SIZE_ANNOTATION} {size!r} is not a size such as 10Gi",
        ),
        (
            storage_class is not None and not _is_subdomain(storage_class),
            f"{names.CHECKPOINT_STORAGE_CLASS_ANNOTATION} {storage_class!r} is not a name "
            "(lowercase letters, digits, '-' and '.', such as fast-ssd)",
        ),
        (
            path is not None and not _is_mount_path(path),
            f"{names.CHECKPOINT_PATH_ANNOTATION} {path!r} is not an absolute path "
            "(no ':', no '..', not '/')",
        ),
    )
    return next((message for wrong, message in checks if wrong), None)


def _is_subdomain(text: str) -> bool:
    return len(text) <= 253 and _SUBDOMAIN.fullmatch(text) is not None


def _is_positive_quantity(text: str) -> bool:
    match = _QUANTITY.fullmatch(text)
    return match is not None and float(match.group(1)) > 0


def _is_mount_path(text: str) -> bool:
    parts = text.split("/")
    return text.startswith("/") and ":" not in text and ".." not in parts and text.strip("/") != ""


def wire(pod: Mapping[str, Any], scheduler_name: str, layout: Layout) -> Wiring:
    """The operations that give ``pod`` Shoal's wiring; none for another scheduler's pod."""
    spec = _mapping(pod.get("spec"))
    if spec.get("schedulerName") != scheduler_name:
        return Wiring()
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    texts = {str(k): str(v) for k, v in annotations.items()}
    request = checkpoint_request(texts, layout)
    seconds = checkpoint_seconds(texts)
    wanted = _wanted(
        layout,
        request if isinstance(request, Checkpoint) else None,
        seconds if isinstance(seconds, str) else None,
    )
    ops = [*_volume_ops(spec, wanted.volumes), *_group_ops(spec, layout.socket_group)]
    for path, container in _wired_containers(spec):
        ops.extend(_container_ops(path, container, wanted))
    warnings: list[str] = []
    if isinstance(request, Malformed):
        warnings.append(f"no checkpoint volume: {request.reason}")
    if isinstance(seconds, Malformed):
        warnings.append(f"no warning of short notices: {seconds.reason}")
    if warnings:
        ops.extend(_warning_ops(annotations, "; ".join(warnings)))
    return Wiring(tuple(ops), tuple(warnings))


def checkpoint_seconds(annotations: Mapping[str, str]) -> str | Malformed | None:
    """The checkpoint time the pod declares (its ``shoal.dev/checkpoint-seconds``, as written),
    why it cannot be used, or None when it declares none."""
    text = annotations.get(names.CHECKPOINT_SECONDS_ANNOTATION)
    if text is None:
        return None
    try:
        names.parse_checkpoint_seconds(text)
    except ValueError:
        return Malformed(
            f"{names.CHECKPOINT_SECONDS_ANNOTATION} {text!r} is not a number of seconds "
            f"such as 20 (above 0, at most {names.MAX_CHECKPOINT_SECONDS:g})"
        )
    return text.strip()


def _wanted(layout: Layout, checkpoint: Checkpoint | None, seconds: str | None) -> _Wanted:
    socket_dir = layout.socket_dir
    volumes: list[dict[str, Any]] = [
        {"name": NOTICE_VOLUME, "hostPath": {"path": socket_dir, "type": "DirectoryOrCreate"}},
        {
            "name": LEAVE_BY_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": posixpath.basename(layout.leave_by_file),
                        "fieldRef": {
                            "fieldPath": f"metadata.annotations['{names.LEAVE_BY_ANNOTATION}']"
                        },
                    }
                ]
            },
        },
    ]
    mounts = [
        _Mount(NOTICE_VOLUME, socket_dir, read_only=True),
        _Mount(LEAVE_BY_VOLUME, layout.leave_by_dir, read_only=True),
    ]
    env = [
        _field_env(names.POD_NAMESPACE_ENV, "metadata.namespace"),
        _field_env(names.POD_NAME_ENV, "metadata.name"),
        _field_env(names.POD_UID_ENV, "metadata.uid"),
        {"name": names.SOCKET_ENV, "value": layout.notice_socket},
        {"name": names.LEAVE_BY_FILE_ENV, "value": layout.leave_by_file},
    ]
    if checkpoint is not None:
        volumes.append(checkpoint.volume())
        mounts.append(_Mount(CHECKPOINT_VOLUME, checkpoint.path, read_only=False))
        env.append({"name": names.CHECKPOINT_DIR_ENV, "value": checkpoint.path})
    if seconds is not None:
        env.append({"name": names.CHECKPOINT_SECONDS_ENV, "value": seconds})
    return _Wanted(tuple(volumes), tuple(mounts), tuple(env))


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _wired_containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container, and the init containers that run beside them (sidecars)."""
    for index, container in enumerate(_list(spec.get("containers"))):
        yield f"/spec/containers/{index}", _mapping(container)
    for index, container in enumerate(_list(spec.get("initContainers"))):
        if _mapping(container).get("restartPolicy") == "Always":
            yield f"/spec/initContainers/{index}", _mapping(container)


def _volume_ops(spec: Mapping[str, Any], volumes: Sequence[dict[str, Any]]) -> Iterator[Op]:
    have = {_mapping(v).get("name") for v in _list(spec.get("volumes"))}
    missing = [v for v in volumes if v["name"] not in have]
    yield from _append("/spec/volumes", _is_list(spec, "volumes"), missing)


def _group_ops(spec: Mapping[str, Any], group: int) -> Iterator[Op]:
    """The socket's group among the pod's supplemental groups."""
    context = spec.get("securityContext")
    if not isinstance(context, Mapping):
        yield Op("add", "/spec/securityContext", {"supplementalGroups": [group]})
        return
    groups = _list(context.get("supplementalGroups"))
    if group not in groups:
        exists = _is_list(context, "supplementalGroups")
        yield from _append("/spec/securityContext/supplementalGroups", exists, [group])


def _container_ops(path: str, container: Mapping[str, Any], wanted: _Wanted) -> Iterator[Op]:
    env_names = {_mapping(e).get("name") for e in _list(container.get("env"))}
    env = [e for e in wanted.env if e["name"] not in env_names]
    yield from _append(f"{path}/env", _is_list(container, "env"), env)
    mounted = _list(container.get("volumeMounts"))
    used_volumes = {_mapping(m).get("name") for m in mounted}
    used_paths = {posixpath.normpath(str(_mapping(m).get("mountPath"))) for m in mounted}
    mounts = []
    for mount in wanted.mounts:
        if mount.volume not in used_volumes and posixpath.normpath(mount.path) not in used_paths:
            mounts.append(mount.as_json())
            used_paths.add(posixpath.normpath(mount.path))
    yield from _append(f"{path}/volumeMounts", _is_list(container, "volumeMounts"), mounts)


def _append(path: str, exists: bool, items: Sequence[Any]) -> Iterator[Op]:
    """Add ``items`` to the list at ``path``: one by one when it exists, as a new list if not."""
    if not items:
        return
    if not exists:
        yield Op("add", path, list(items))
        return
    for item in items:
        yield Op("add", f"{path}/-", item)


def _warning_ops(annotations: Mapping[str, Any], warning: str) -> Iterator[Op]:
    if annotations.get(names.WIRING_WARNING_ANNOTATION) == warning:
        return
    key = names.WIRING_WARNING_ANNOTATION.replace("~", "~0").replace("/", "~1")
    yield Op("add", f"/metadata/annotations/{key}", warning)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_list(parent: Mapping[str, Any], key: str) -> bool:
    return isinstance(parent.get(key), list)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
