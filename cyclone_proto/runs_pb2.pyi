import datetime

from cyclone_proto import limits_pb2 as _limits_pb2
from cyclone_proto import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRunRequest(_message.Message):
    __slots__ = ("workflow", "version", "input", "priority", "idempotency_key", "deadline", "deadline_in")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    version: int
    input: _struct_pb2.Value
    priority: int
    idempotency_key: str
    deadline: _timestamp_pb2.Timestamp
    deadline_in: _duration_pb2.Duration
    def __init__(self, workflow: _Optional[str] = ..., version: _Optional[int] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., priority: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SubmitRunResponse(_message.Message):
    __slots__ = ("run_id", "created")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created: bool
    def __init__(self, run_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("kind", "input", "priority", "idempotency_key", "deadline", "deadline_in", "max_attempts", "backoff_initial", "backoff_max", "max_reclaims", "attempt_timeout", "retention", "scheduled_at", "limits")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    MAX_RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    input: _struct_pb2.Value
    priority: int
    idempotency_key: str
    deadline: _timestamp_pb2.Timestamp
    deadline_in: _duration_pb2.Duration
    max_attempts: int
    backoff_initial: _duration_pb2.Duration
    backoff_max: _duration_pb2.Duration
    max_reclaims: int
    attempt_timeout: _duration_pb2.Duration
    retention: _duration_pb2.Duration
    scheduled_at: _timestamp_pb2.Timestamp
    limits: _containers.RepeatedCompositeFieldContainer[_limits_pb2.LimitUse]
    def __init__(self, kind: _Optional[str] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., priority: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., backoff_initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_reclaims: _Optional[int] = ..., attempt_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limits: _Optional[_Iterable[_Union[_limits_pb2.LimitUse, _Mapping]]] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("run_id", "step_id", "created")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    created: bool
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class EnqueueManyRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, jobs: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class EnqueueManyResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[EnqueueResponse]
    def __init__(self, jobs: _Optional[_Iterable[_Union[EnqueueResponse, _Mapping]]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("states", "workflow", "created_after", "created_before", "limit", "page_token", "include_steps", "schedule", "schedule_fire_at")
    STATES_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STEPS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.RunState]
    workflow: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    limit: int
    page_token: str
    include_steps: bool
    schedule: str
    schedule_fire_at: _timestamp_pb2.Timestamp
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.RunState, str]]] = ..., workflow: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., include_steps: _Optional[bool] = ..., schedule: _Optional[str] = ..., schedule_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_types_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WaitRunRequest(_message.Message):
    __slots__ = ("run_id", "timeout")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    timeout: _duration_pb2.Duration
    def __init__(self, run_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitRunResponse(_message.Message):
    __slots__ = ("run", "timed_out")
    RUN_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    timed_out: bool
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ..., timed_out: _Optional[bool] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class PauseRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RetryStepRequest(_message.Message):
    __slots__ = ("run_id", "node", "deadline", "deadline_in")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node: str
    deadline: _timestamp_pb2.Timestamp
    deadline_in: _duration_pb2.Duration
    def __init__(self, run_id: _Optional[str] = ..., node: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RetryAllRequest(_message.Message):
    __slots__ = ("run_id", "deadline", "deadline_in")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    deadline: _timestamp_pb2.Timestamp
    deadline_in: _duration_pb2.Duration
    def __init__(self, run_id: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RunActionResponse(_message.Message):
    __slots__ = ("run", "applied")
    RUN_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    applied: bool
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ..., applied: _Optional[bool] = ...) -> None: ...

class SignalRequest(_message.Message):
    __slots__ = ("run_id", "name", "payload")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    payload: _struct_pb2.Value
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class SignalResponse(_message.Message):
    __slots__ = ("signal_id", "consumed_by_step_id")
    SIGNAL_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_BY_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    signal_id: str
    consumed_by_step_id: str
    def __init__(self, signal_id: _Optional[str] = ..., consumed_by_step_id: _Optional[str] = ...) -> None: ...

class PurgeTerminalRunsRequest(_message.Message):
    __slots__ = ("older_than", "limit", "dry_run")
    OLDER_THAN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    older_than: _duration_pb2.Duration
    limit: int
    dry_run: bool
    def __init__(self, older_than: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., limit: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PurgeTerminalRunsResponse(_message.Message):
    __slots__ = ("deleted", "eligible")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    eligible: int
    def __init__(self, deleted: _Optional[int] = ..., eligible: _Optional[int] = ...) -> None: ...
