import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LimitStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIMIT_STRATEGY_UNSPECIFIED: _ClassVar[LimitStrategy]
    LIMIT_STRATEGY_QUEUE: _ClassVar[LimitStrategy]
    LIMIT_STRATEGY_CANCEL_NEWEST: _ClassVar[LimitStrategy]
    LIMIT_STRATEGY_CANCEL_OLDEST: _ClassVar[LimitStrategy]
    LIMIT_STRATEGY_KEEP_NEWEST: _ClassVar[LimitStrategy]

class LimitScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIMIT_SCOPE_UNSPECIFIED: _ClassVar[LimitScope]
    LIMIT_SCOPE_STEPS: _ClassVar[LimitScope]
    LIMIT_SCOPE_RUNS: _ClassVar[LimitScope]
LIMIT_STRATEGY_UNSPECIFIED: LimitStrategy
LIMIT_STRATEGY_QUEUE: LimitStrategy
LIMIT_STRATEGY_CANCEL_NEWEST: LimitStrategy
LIMIT_STRATEGY_CANCEL_OLDEST: LimitStrategy
LIMIT_STRATEGY_KEEP_NEWEST: LimitStrategy
LIMIT_SCOPE_UNSPECIFIED: LimitScope
LIMIT_SCOPE_STEPS: LimitScope
LIMIT_SCOPE_RUNS: LimitScope

class LimitUse(_message.Message):
    __slots__ = ("limit", "key", "key_path")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_PATH_FIELD_NUMBER: _ClassVar[int]
    limit: str
    key: str
    key_path: str
    def __init__(self, limit: _Optional[str] = ..., key: _Optional[str] = ..., key_path: _Optional[str] = ...) -> None: ...

class SetLimitRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: Limit
    def __init__(self, limit: _Optional[_Union[Limit, _Mapping]] = ...) -> None: ...

class GetLimitRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[Limit]
    def __init__(self, limits: _Optional[_Iterable[_Union[Limit, _Mapping]]] = ...) -> None: ...

class DeleteLimitRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteLimitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limit(_message.Message):
    __slots__ = ("name", "max_running", "rate", "period", "strategy", "scope", "kinds", "workflows", "key", "key_path", "weights", "keys", "created_at", "updated_at")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_PATH_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    max_running: int
    rate: int
    period: _duration_pb2.Duration
    strategy: LimitStrategy
    scope: LimitScope
    kinds: _containers.RepeatedScalarFieldContainer[str]
    workflows: _containers.RepeatedScalarFieldContainer[str]
    key: str
    key_path: str
    weights: _containers.ScalarMap[str, int]
    keys: _containers.RepeatedCompositeFieldContainer[LimitKeyStats]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., max_running: _Optional[int] = ..., rate: _Optional[int] = ..., period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., strategy: _Optional[_Union[LimitStrategy, str]] = ..., scope: _Optional[_Union[LimitScope, str]] = ..., kinds: _Optional[_Iterable[str]] = ..., workflows: _Optional[_Iterable[str]] = ..., key: _Optional[str] = ..., key_path: _Optional[str] = ..., weights: _Optional[_Mapping[str, int]] = ..., keys: _Optional[_Iterable[_Union[LimitKeyStats, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LimitKeyStats(_message.Message):
    __slots__ = ("key", "running", "waiting", "oldest_waiting_age", "starts_in_window")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAITING_AGE_FIELD_NUMBER: _ClassVar[int]
    STARTS_IN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    key: str
    running: int
    waiting: int
    oldest_waiting_age: _duration_pb2.Duration
    starts_in_window: int
    def __init__(self, key: _Optional[str] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., oldest_waiting_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., starts_in_window: _Optional[int] = ...) -> None: ...
