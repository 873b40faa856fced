import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_STATUS_APPLIED: _ClassVar[AckStatus]
    ACK_STATUS_STALE: _ClassVar[AckStatus]
    ACK_STATUS_ENDED: _ClassVar[AckStatus]
    ACK_STATUS_UNKNOWN: _ClassVar[AckStatus]
    ACK_STATUS_INVALID: _ClassVar[AckStatus]
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_STATUS_APPLIED: AckStatus
ACK_STATUS_STALE: AckStatus
ACK_STATUS_ENDED: AckStatus
ACK_STATUS_UNKNOWN: AckStatus
ACK_STATUS_INVALID: AckStatus

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "results", "pong")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    results: Results
    pong: Pong
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., results: _Optional[_Union[Results, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "kinds", "slots", "held", "sdk")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SDK_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    held: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    sdk: str
    def __init__(self, worker_id: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., held: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., sdk: _Optional[str] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("step_id", "lease_generation")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    lease_generation: int
    def __init__(self, step_id: _Optional[str] = ..., lease_generation: _Optional[int] = ...) -> None: ...

class Results(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StepResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "lease_generation", "completed", "failed", "snoozed")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SNOOZED_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    lease_generation: int
    completed: Completed
    failed: Failed
    snoozed: Snoozed
    def __init__(self, step_id: _Optional[str] = ..., lease_generation: _Optional[int] = ..., completed: _Optional[_Union[Completed, _Mapping]] = ..., failed: _Optional[_Union[Failed, _Mapping]] = ..., snoozed: _Optional[_Union[Snoozed, _Mapping]] = ...) -> None: ...

class Completed(_message.Message):
    __slots__ = ("output", "oversized_output_bytes")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    OVERSIZED_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    output: _struct_pb2.Value
    oversized_output_bytes: int
    def __init__(self, output: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., oversized_output_bytes: _Optional[int] = ...) -> None: ...

class Failed(_message.Message):
    __slots__ = ("message", "permanent", "retry_delay", "details")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    message: str
    permanent: bool
    retry_delay: _duration_pb2.Duration
    details: str
    def __init__(self, message: _Optional[str] = ..., permanent: _Optional[bool] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., details: _Optional[str] = ...) -> None: ...

class Snoozed(_message.Message):
    __slots__ = ("delay",)
    DELAY_FIELD_NUMBER: _ClassVar[int]
    delay: _duration_pb2.Duration
    def __init__(self, delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "leases", "acks", "stop", "ping")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    leases: Leases
    acks: ResultAcks
    stop: Stop
    ping: Ping
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., leases: _Optional[_Union[Leases, _Mapping]] = ..., acks: _Optional[_Union[ResultAcks, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("server_id", "lease_ttl", "heartbeat_interval", "lost", "max_payload_bytes")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    lease_ttl: _duration_pb2.Duration
    heartbeat_interval: _duration_pb2.Duration
    lost: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    max_payload_bytes: int
    def __init__(self, server_id: _Optional[str] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lost: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., max_payload_bytes: _Optional[int] = ...) -> None: ...

class Leases(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("run_id", "step_id", "node", "kind", "attempt", "max_attempts", "reclaims", "lease_generation", "input", "parents", "attempt_deadline", "lease_expiry", "snoozes", "trace_context")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RECLAIMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRY_FIELD_NUMBER: _ClassVar[int]
    SNOOZES_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_id: str
    node: str
    kind: str
    attempt: int
    max_attempts: int
    reclaims: int
    lease_generation: int
    input: _struct_pb2.Value
    parents: _struct_pb2.Struct
    attempt_deadline: _timestamp_pb2.Timestamp
    lease_expiry: _timestamp_pb2.Timestamp
    snoozes: int
    trace_context: TraceContext
    def __init__(self, run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., node: _Optional[str] = ..., kind: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., reclaims: _Optional[int] = ..., lease_generation: _Optional[int] = ..., input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., parents: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., attempt_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expiry: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., snoozes: _Optional[int] = ..., trace_context: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class ResultAcks(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[ResultAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[ResultAck, _Mapping]]] = ...) -> None: ...

class ResultAck(_message.Message):
    __slots__ = ("step_id", "lease_generation", "status", "detail")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    lease_generation: int
    status: AckStatus
    detail: str
    def __init__(self, step_id: _Optional[str] = ..., lease_generation: _Optional[int] = ..., status: _Optional[_Union[AckStatus, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("leases", "reason")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[LeaseRef]
    reason: str
    def __init__(self, leases: _Optional[_Iterable[_Union[LeaseRef, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("nonce", "at")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    at: _timestamp_pb2.Timestamp
    def __init__(self, nonce: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
