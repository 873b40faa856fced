import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from cyclone_proto import limits_pb2 as _limits_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATE_UNSPECIFIED: _ClassVar[StepState]
    STEP_STATE_PENDING: _ClassVar[StepState]
    STEP_STATE_AVAILABLE: _ClassVar[StepState]
    STEP_STATE_RUNNING: _ClassVar[StepState]
    STEP_STATE_COMPLETED: _ClassVar[StepState]
    STEP_STATE_DISCARDED: _ClassVar[StepState]
    STEP_STATE_CANCELLED: _ClassVar[StepState]
    STEP_STATE_WAITING_SIGNAL: _ClassVar[StepState]
    STEP_STATE_WAITING_TIMER: _ClassVar[StepState]
    STEP_STATE_WAITING_CHILD: _ClassVar[StepState]
    STEP_STATE_PAUSED: _ClassVar[StepState]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_PAUSED: _ClassVar[RunState]
    RUN_STATE_COMPLETED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]

class NodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_TYPE_UNSPECIFIED: _ClassVar[NodeType]
    NODE_TYPE_TASK: _ClassVar[NodeType]
    NODE_TYPE_CHILD: _ClassVar[NodeType]
    NODE_TYPE_SLEEP: _ClassVar[NodeType]
    NODE_TYPE_SIGNAL: _ClassVar[NodeType]

class OnDepFailure(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_DEP_FAILURE_UNSPECIFIED: _ClassVar[OnDepFailure]
    ON_DEP_FAILURE_FAIL_RUN: _ClassVar[OnDepFailure]
    ON_DEP_FAILURE_CANCEL_BRANCH: _ClassVar[OnDepFailure]
STEP_STATE_UNSPECIFIED: StepState
STEP_STATE_PENDING: StepState
STEP_STATE_AVAILABLE: StepState
STEP_STATE_RUNNING: StepState
STEP_STATE_COMPLETED: StepState
STEP_STATE_DISCARDED: StepState
STEP_STATE_CANCELLED: StepState
STEP_STATE_WAITING_SIGNAL: StepState
STEP_STATE_WAITING_TIMER: StepState
STEP_STATE_WAITING_CHILD: StepState
STEP_STATE_PAUSED: StepState
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_PAUSED: RunState
RUN_STATE_COMPLETED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_CANCELLED: RunState
NODE_TYPE_UNSPECIFIED: NodeType
NODE_TYPE_TASK: NodeType
NODE_TYPE_CHILD: NodeType
NODE_TYPE_SLEEP: NodeType
NODE_TYPE_SIGNAL: NodeType
ON_DEP_FAILURE_UNSPECIFIED: OnDepFailure
ON_DEP_FAILURE_FAIL_RUN: OnDepFailure
ON_DEP_FAILURE_CANCEL_BRANCH: OnDepFailure

class Node(_message.Message):
    __slots__ = ("id", "kind", "deps", "type", "max_attempts", "backoff_initial", "backoff_max", "priority", "max_reclaims", "attempt_timeout", "on_dep_failure", "retention", "max_wait", "sleep", "signal", "workflow", "limits")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ON_DEP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    SLEEP_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    deps: _containers.RepeatedScalarFieldContainer[str]
    type: NodeType
    max_attempts: int
    backoff_initial: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    priority: int
    max_reclaims: int
    attempt_timeout: _duration_pb2.Duration
    on_dep_failure: OnDepFailure
    retention: _duration_pb2.Duration
    max_wait: _duration_pb2.Duration
    sleep: _duration_pb2.Duration
    signal: str
    workflow: str
    limits: _containers.RepeatedCompositeFieldContainer[_limits_pb2.LimitUse]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., deps: _Optional[_Iterable[str]] = ..., type: _Optional[_Union[NodeType, str]] = ..., max_attempts: _Optional[int] = ..., backoff_initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority: _Optional[int] = ..., max_reclaims: _Optional[int] = ..., attempt_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., on_dep_failure: _Optional[_Union[OnDepFailure, str]] = ..., retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., sleep: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., signal: _Optional[str] = ..., workflow: _Optional[str] = ..., limits: _Optional[_Iterable[_Union[_limits_pb2.LimitUse, _Mapping]]] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("name", "version", "nodes", "created_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StepError(_message.Message):
    __slots__ = ("attempt", "error_kind", "message", "at", "reason", "details")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    error_kind: str
    message: str
    at: _timestamp_pb2.Timestamp
    reason: str
    details: str
    def __init__(self, attempt: _Optional[int] = ..., error_kind: _Optional[str] = ..., message: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., details: _Optional[str] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("id", "run_id", "node", "kind", "type", "state", "attempt", "max_attempts", "reclaims", "max_reclaims", "snoozes", "priority", "scheduled_at", "lease_owner", "lease_expiry", "lease_generation", "output", "error_kind", "reason", "errors", "deps", "child_run_id", "cancel_cause", "created_at", "held_by", "limits", "started_at", "finished_at", "attempt_deadline")
    ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    SNOOZES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRY_FIELD_NUMBER: _ClassVar[int]
    LEASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_CAUSE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    id: str
    run_id: str
    node: str
    kind: str
    type: NodeType
    state: StepState
    attempt: int
    max_attempts: int
    reclaims: int
    max_reclaims: int
    snoozes: int
    priority: int
    scheduled_at: _timestamp_pb2.Timestamp
    lease_owner: str
    lease_expiry: _timestamp_pb2.Timestamp
    lease_generation: int
    output: _struct_pb2.Value
    error_kind: str
    reason: str
    errors: _containers.RepeatedCompositeFieldContainer[StepError]
    deps: _containers.RepeatedScalarFieldContainer[str]
    child_run_id: str
    cancel_cause: str
    created_at: _timestamp_pb2.Timestamp
    held_by: str
    limits: _containers.RepeatedScalarFieldContainer[str]
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    attempt_deadline: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., run_id: _Optional[str] = ..., node: _Optional[str] = ..., kind: _Optional[str] = ..., type: _Optional[_Union[NodeType, str]] = ..., state: _Optional[_Union[StepState, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., reclaims: _Optional[int] = ..., max_reclaims: _Optional[int] = ..., snoozes: _Optional[int] = ..., priority: _Optional[int] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_owner: _Optional[str] = ..., lease_expiry: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_generation: _Optional[int] = ..., output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., error_kind: _Optional[str] = ..., reason: _Optional[str] = ..., errors: _Optional[_Iterable[_Union[StepError, _Mapping]]] = ..., deps: _Optional[_Iterable[str]] = ..., child_run_id: _Optional[str] = ..., cancel_cause: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., held_by: _Optional[str] = ..., limits: _Optional[_Iterable[str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("id", "workflow", "workflow_version", "state", "input", "result", "priority", "idempotency_key", "deadline", "parent_run_id", "parent_step_id", "created_at", "updated_at", "finished_at", "steps", "schedule_name", "schedule_fire_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    workflow: str
    workflow_version: int
    state: RunState
    input: _struct_pb2.Value
    result: _struct_pb2.Value
    priority: int
    idempotency_key: str
    deadline: _timestamp_pb2.Timestamp
    parent_run_id: str
    parent_step_id: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    schedule_name: str
    schedule_fire_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., workflow: _Optional[str] = ..., workflow_version: _Optional[int] = ..., state: _Optional[_Union[RunState, str]] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., result: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., priority: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_run_id: _Optional[str] = ..., parent_step_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., schedule_name: _Optional[str] = ..., schedule_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
