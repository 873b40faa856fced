import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("kinds",)
    KINDS_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedCompositeFieldContainer[KindStats]
    def __init__(self, kinds: _Optional[_Iterable[_Union[KindStats, _Mapping]]] = ...) -> None: ...

class KindStats(_message.Message):
    __slots__ = ("kind", "available", "running", "oldest_available_age", "scheduled")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AVAILABLE_AGE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    available: int
    running: int
    oldest_available_age: _duration_pb2.Duration
    scheduled: int
    def __init__(self, kind: _Optional[str] = ..., available: _Optional[int] = ..., running: _Optional[int] = ..., oldest_available_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., scheduled: _Optional[int] = ...) -> None: ...
