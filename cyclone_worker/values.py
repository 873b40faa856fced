"""The one JSON <-> google.protobuf.Value converter (SDK, server and CLI), and durations and times.

google.protobuf.Value carries every number as a double: an integral number within 2**53
comes back as an int (41, not 41.0), and an int beyond it is refused on the way in. Every
error names the path of the offending value (``input.rows[2]``). The server reads requests
with `strict=True`: also no NaN or infinity, no U+0000 (Postgres cannot store it), and no
nesting deeper than MAX_JSON_DEPTH.

    to_value({"n": 41})                  # Value(struct_value={"n": 41.0})
    from_value(to_value({"n": 41}))      # {"n": 41}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

__all__ = ["Seconds", "MAX_JSON_DEPTH", "to_value", "fill_stored", "from_value", "to_struct", "from_struct", "ints_back",
           "seconds_of", "to_duration", "from_duration", "to_timestamp", "from_timestamp"]

# A duration as the SDK accepts it: seconds (int or float) or a timedelta.
Seconds = float | int | timedelta

# Value carries numbers as doubles: integers beyond this lose digits on the wire, so they
# are refused rather than silently rounded.
_MAX_SAFE_INT = 2**53
# Arrays and objects a JSON payload may nest. Protobuf decoders stop at 100 message levels
# (upb, C++, Java): about 33 levels of JSON objects, since each is three messages (Value,
# Struct, map entry). A payload travels inside other messages, and a run's result wraps
# outputs in one more object per workflow level (child runs), so the limit leaves room for
# that: whatever is accepted can be read back by every client and worker.
MAX_JSON_DEPTH = 24


def to_value(obj: Any, path: str = "value", *, exact: bool = True,
             into: struct_pb2.Value | None = None) -> struct_pb2.Value:
    """`obj` (None, bool, int, float, str, list/tuple, dict with str keys) as a Value
    (filled into `into`, an empty Value field of a message being built, when given: no copy).

    Anything else raises TypeError, and a number JSON cannot hold (NaN, infinity, an int
    beyond 2**53) raises ValueError; both name the offending path, e.g. ``output.rows[2]``.
    `exact=False` sends an int beyond 2**53 as the nearest double instead (the server, for
    payloads it already stored).
    """
    v = struct_pb2.Value() if into is None else into
    _fill(v, obj, path, exact)
    return v


def fill_stored(v: struct_pb2.Value, obj: Any) -> None:
    """A payload as Postgres returns it (JSON already: no checks, no paths) into the Value
    `v`, the same message as to_value(obj, exact=False) makes; type checks exact and in
    the order of how often they come, for the server's hot path (every Lease's input)."""
    t = type(obj)
    if t is str:
        v.string_value = obj
    elif t is dict:
        s = v.struct_value
        if not obj:
            s.SetInParent()
        fields = s.fields
        for key, item in obj.items():
            fill_stored(fields[key if type(key) is str else str(key)], item)
    elif t is int or t is float:
        v.number_value = obj
    elif obj is None:
        v.null_value = struct_pb2.NULL_VALUE
    elif t is bool:
        v.bool_value = obj
    elif t is list:
        lv = v.list_value
        if not obj:
            lv.SetInParent()
        values = lv.values
        for item in obj:
            fill_stored(values.add(), item)
    else:  # subclasses and anything else: the general conversion (which refuses non-JSON)
        v.CopyFrom(to_value(obj, "payload", exact=False))


def _fill(v: struct_pb2.Value, obj: Any, path: str, exact: bool = True) -> None:
    if obj is None:
        v.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):  # before int: bool is an int subclass
        v.bool_value = obj
    elif isinstance(obj, int):
        if abs(obj) > _MAX_SAFE_INT and exact:
            raise ValueError(f"{path}: integer {obj} is too large for JSON numbers (limit 2**53); send it as a string")
        v.number_value = obj
    elif isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{path}: {obj} is not a JSON number")
        v.number_value = obj
    elif isinstance(obj, str):
        v.string_value = obj
    elif isinstance(obj, Mapping):
        v.struct_value.SetInParent()  # an empty dict must stay an object, not become null
        _fill_struct(v.struct_value, obj, path, exact)
    elif isinstance(obj, (list, tuple)):
        v.list_value.SetInParent()
        for i, item in enumerate(obj):
            _fill(v.list_value.values.add(), item, f"{path}[{i}]", exact)
    else:
        raise TypeError(f"{path}: {type(obj).__name__} is not JSON (use dict, list, str, int, float, bool or None)")


def _fill_struct(s: struct_pb2.Struct, obj: Mapping[Any, Any], path: str, exact: bool = True) -> None:
    for key, item in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"{path}: key {key!r} is not a string (JSON object keys are strings)")
        _fill(s.fields[key], item, f"{path}.{key}", exact)


def from_value(v: struct_pb2.Value | None, path: str = "value", *, strict: bool = False) -> Any:
    """A Value as plain Python; integral numbers come back as int. None or unset is None.

    `strict` (what the server accepts): NaN, infinity, U+0000 in a string or key, and nesting
    deeper than MAX_JSON_DEPTH raise ValueError naming `path`.
    """
    if v is None:
        return None
    try:
        return _read_fast(v, 0, strict)
    except ValueError:
        return _read(v, path, 0, strict)  # again, naming the path of what was refused


def _read_fast(v: struct_pb2.Value, depth: int, strict: bool) -> Any:
    """`_read` without building the paths it would name in an error (most reads have none)."""
    which = v.WhichOneof("kind")
    if which == "string_value":
        text = v.string_value
        if strict and "\x00" in text:
            raise ValueError
        return text
    if which == "number_value":
        n = v.number_value
        if strict and not math.isfinite(n):
            raise ValueError
        return int(n) if n.is_integer() and abs(n) <= _MAX_SAFE_INT else n
    if which is None or which == "null_value":
        return None
    if which == "bool_value":
        return v.bool_value
    if strict and depth >= MAX_JSON_DEPTH:
        raise ValueError
    if which == "struct_value":
        return _read_fast_struct(v.struct_value, depth + 1, strict)
    return [_read_fast(item, depth + 1, strict) for item in v.list_value.values]


def _read_fast_struct(s: struct_pb2.Struct, depth: int, strict: bool) -> dict[str, Any]:
    out = {}
    for key, item in s.fields.items():
        if strict and "\x00" in key:
            raise ValueError
        out[key] = _read_fast(item, depth, strict)
    return out


def _read(v: struct_pb2.Value, path: str, depth: int, strict: bool) -> Any:
    which = v.WhichOneof("kind")
    if which is None or which == "null_value":
        return None
    if which == "bool_value":
        return v.bool_value
    if which == "number_value":
        n = v.number_value
        if strict and not math.isfinite(n):
            raise ValueError(f"{path}: {n} is not a JSON number")
        return int(n) if n.is_integer() and abs(n) <= _MAX_SAFE_INT else n
    if which == "string_value":
        return _storable(v.string_value, path) if strict else v.string_value
    if strict and depth >= MAX_JSON_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects, "
                         "the limit of a JSON payload")
    if which == "struct_value":
        return _read_struct(v.struct_value, path, depth + 1, strict)
    return [_read(item, f"{path}[{i}]", depth + 1, strict) for i, item in enumerate(v.list_value.values)]


def _read_struct(s: struct_pb2.Struct, path: str, depth: int, strict: bool) -> dict[str, Any]:
    return {(_storable(key, path) if strict else key): _read(item, f"{path}.{key}", depth, strict)
            for key, item in s.fields.items()}


def _storable(text: str, path: str) -> str:
    # JSONB (and Postgres text) cannot hold U+0000: refuse it, naming the path.
    if "\x00" in text:
        raise ValueError(f"{path}: contains the character U+0000, which cannot be stored")
    return text


def ints_back(obj: Any) -> Any:
    """`obj` with every integral float within 2**53 made an int again, recursively: for JSON
    that went through Value elsewhere (json_format.MessageToDict gives 41.0 for 41)."""
    if isinstance(obj, float):
        return int(obj) if obj.is_integer() and abs(obj) <= _MAX_SAFE_INT else obj
    if isinstance(obj, dict):
        return {key: ints_back(item) for key, item in obj.items()}
    if isinstance(obj, list):
        return [ints_back(item) for item in obj]
    return obj


def to_struct(obj: Mapping[str, Any] | None, path: str = "value") -> struct_pb2.Struct:
    """A dict with str keys as a Struct (None gives an empty Struct)."""
    s = struct_pb2.Struct()
    if obj is not None:
        if not isinstance(obj, Mapping):
            raise TypeError(f"{path}: {type(obj).__name__} is not a JSON object")
        _fill_struct(s, obj, path)
    return s


def from_struct(s: struct_pb2.Struct | None, path: str = "value", *, strict: bool = False) -> dict[str, Any]:
    """A Struct as a plain dict (`strict` as for from_value)."""
    if s is None:
        return {}
    try:
        return _read_fast_struct(s, 1, strict)
    except ValueError:
        return _read_struct(s, path, 1, strict)  # again, naming the path of what was refused


def seconds_of(d: Seconds, field: str = "duration") -> float:
    """Seconds (int, float or timedelta) as a float; negative values raise ValueError."""
    if isinstance(d, timedelta):
        secs = d.total_seconds()
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        secs = float(d)
    else:
        raise TypeError(f"{field}: expected seconds (a number) or a timedelta, got {type(d).__name__}")
    if not math.isfinite(secs) or secs < 0:
        raise ValueError(f"{field}: {secs} is not a non-negative duration")
    return secs


def to_duration(d: Seconds, field: str = "duration") -> duration_pb2.Duration:
    """Seconds or a timedelta as a Duration."""
    out = duration_pb2.Duration()
    out.FromTimedelta(timedelta(seconds=seconds_of(d, field)))
    return out


def from_duration(d: duration_pb2.Duration) -> float:
    """A Duration as float seconds."""
    return d.seconds + d.nanos / 1e9


def to_timestamp(t: datetime, field: str = "time") -> timestamp_pb2.Timestamp:
    """An aware datetime as a Timestamp (a naive one is refused: its zone would be a guess)."""
    if not isinstance(t, datetime):
        raise TypeError(f"{field}: expected a datetime, got {type(t).__name__}")
    if t.tzinfo is None:
        raise ValueError(f"{field}: datetime must be timezone-aware (e.g. datetime.now(timezone.utc))")
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(t.astimezone(timezone.utc))
    return out


def from_timestamp(t: timestamp_pb2.Timestamp) -> datetime:
    """A Timestamp as an aware UTC datetime."""
    return t.ToDatetime(tzinfo=timezone.utc)
