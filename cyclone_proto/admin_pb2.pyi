import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListWorkersRequest(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: str
    def __init__(self, kind: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "sdk", "kinds", "slots", "leases_held", "server_id", "connected_since", "last_heartbeat")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SDK_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_HELD_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    sdk: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    leases_held: int
    server_id: str
    connected_since: _timestamp_pb2.Timestamp
    last_heartbeat: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., sdk: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., leases_held: _Optional[int] = ..., server_id: _Optional[str] = ..., connected_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedCompositeFieldContainer[KindStats]
    def __init__(self, kinds: _Optional[_Iterable[_Union[KindStats, _Mapping]]] = ...) -> None: ...

class KindStats(_message.Message):
    __slots__ = ("kind", "available", "running", "oldest_available_age", "scheduled", "workers", "free_slots", "no_workers")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AVAILABLE_AGE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NO_WORKERS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    available: int
    running: int
    oldest_available_age: _duration_pb2.Duration
    scheduled: int
    workers: int
    free_slots: int
    no_workers: bool
    def __init__(self, kind: _Optional[str] = ..., available: _Optional[int] = ..., running: _Optional[int] = ..., oldest_available_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., scheduled: _Optional[int] = ..., workers: _Optional[int] = ..., free_slots: _Optional[int] = ..., no_workers: _Optional[bool] = ...) -> None: ...
