from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PodIdentity(_message.Message):
    __slots__ = ("namespace", "name", "uid", "slurm")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    SLURM_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    slurm: SlurmStep
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., slurm: _Optional[_Union[SlurmStep, _Mapping]] = ...) -> None: ...

class SlurmStep(_message.Message):
    __slots__ = ("job_id", "step_id", "node")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step_id: str
    node: str
    def __init__(self, job_id: _Optional[str] = ..., step_id: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodIdentity
    def __init__(self, pod: _Optional[_Union[PodIdentity, _Mapping]] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("state", "event_id", "kind", "source", "reason", "leave_by", "leave_by_unix_ms")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Notice.State]
        NONE: _ClassVar[Notice.State]
        LEAVE: _ClassVar[Notice.State]
        WITHDRAWN: _ClassVar[Notice.State]
    STATE_UNSPECIFIED: Notice.State
    NONE: Notice.State
    LEAVE: Notice.State
    WITHDRAWN: Notice.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEAVE_BY_FIELD_NUMBER: _ClassVar[int]
    LEAVE_BY_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    state: Notice.State
    event_id: str
    kind: str
    source: str
    reason: str
    leave_by: str
    leave_by_unix_ms: int
    def __init__(self, state: _Optional[_Union[Notice.State, str]] = ..., event_id: _Optional[str] = ..., kind: _Optional[str] = ..., source: _Optional[str] = ..., reason: _Optional[str] = ..., leave_by: _Optional[str] = ..., leave_by_unix_ms: _Optional[int] = ...) -> None: ...

class AcknowledgeRequest(_message.Message):
    __slots__ = ("pod", "step")
    POD_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    pod: PodIdentity
    step: int
    def __init__(self, pod: _Optional[_Union[PodIdentity, _Mapping]] = ..., step: _Optional[int] = ...) -> None: ...

class AcknowledgeReply(_message.Message):
    __slots__ = ("accepted", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("pod", "step", "step_seconds", "checkpoint_step", "checkpoint_unix_ms", "checkpoint_seconds")
    POD_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pod: PodIdentity
    step: int
    step_seconds: float
    checkpoint_step: int
    checkpoint_unix_ms: int
    checkpoint_seconds: float
    def __init__(self, pod: _Optional[_Union[PodIdentity, _Mapping]] = ..., step: _Optional[int] = ..., step_seconds: _Optional[float] = ..., checkpoint_step: _Optional[int] = ..., checkpoint_unix_ms: _Optional[int] = ..., checkpoint_seconds: _Optional[float] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ("accepted", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...
