"""Unit tests of the SDK's JSON <-> google.protobuf.Value conversion and duration helpers."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from google.protobuf import json_format

from cyclone_worker.values import (from_duration, from_struct, from_timestamp, from_value, seconds_of,
                                    to_duration, to_struct, to_timestamp, to_value)

SAMPLES = [
    None, True, False, 0, 1, -7, 2**53, 1.5, -0.25, "", "héllo ✓", [], {}, [1, "a", None],
    {"a": {"b": [1, {"c": None}]}, "empty": {}, "list": []},
]


@pytest.mark.parametrize("obj", SAMPLES, ids=repr)
def test_round_trip_keeps_json_values(obj: object) -> None:
    back = from_value(to_value(obj))
    assert back == obj
    assert type(back) is type(obj)


def test_integral_numbers_come_back_as_int_and_tuples_as_lists() -> None:
    assert from_value(to_value(3.0)) == 3 and isinstance(from_value(to_value(3.0)), int)
    assert from_value(to_value((1, 2))) == [1, 2]


def test_empty_containers_stay_containers_on_the_wire() -> None:
    # An unset Value would read as null on the server; {} and [] must stay what they are.
    assert json_format.MessageToDict(to_value({})) == {}
    assert json_format.MessageToDict(to_value([])) == []
    assert to_value({}).WhichOneof("kind") == "struct_value"


def test_unset_value_reads_as_none() -> None:
    assert from_value(None) is None
    assert from_value(to_value(None)) is None
    from google.protobuf import struct_pb2
    assert from_value(struct_pb2.Value()) is None


@pytest.mark.parametrize("bad, kind, where", [
    (float("nan"), ValueError, "output"),
    ({"x": [1, math.inf]}, ValueError, "output.x[1]"),
    (2**60, ValueError, "output"),
    ({"when": datetime.now(timezone.utc)}, TypeError, "output.when"),
    ({1: "a"}, TypeError, "output: key 1"),
    ({"s": {1, 2}}, TypeError, "output.s"),
    (b"bytes", TypeError, "output"),
])
def test_non_json_values_are_refused_naming_the_path(bad: object, kind: type, where: str) -> None:
    with pytest.raises(kind, match=r"^" + where.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        to_value(bad, "output")


def test_struct_round_trip() -> None:
    d = {"fetch": {"rows": [1, 2]}, "parse": None}
    assert from_struct(to_struct(d)) == d
    assert from_struct(to_struct(None)) == {}
    with pytest.raises(TypeError, match="parents"):
        to_struct([1], "parents")  # type: ignore[arg-type]


def test_durations_accept_seconds_and_timedeltas() -> None:
    assert seconds_of(2) == 2.0
    assert seconds_of(timedelta(minutes=1, milliseconds=500)) == 60.5
    assert from_duration(to_duration(1.25)) == 1.25
    assert from_duration(to_duration(timedelta(hours=1))) == 3600.0
    with pytest.raises(ValueError, match="backoff_initial"):
        seconds_of(-1, "backoff_initial")
    with pytest.raises(TypeError, match="sleep"):
        seconds_of("5", "sleep")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        seconds_of(True)


def test_timestamps_need_a_time_zone() -> None:
    t = datetime(2026, 12, 1, 12, 30, 15, 250000, tzinfo=timezone.utc)
    assert from_timestamp(to_timestamp(t)) == t
    plus_two = timezone(timedelta(hours=2))
    assert from_timestamp(to_timestamp(t.astimezone(plus_two))) == t
    with pytest.raises(ValueError, match="deadline: datetime must be timezone-aware"):
        to_timestamp(datetime(2026, 12, 1), "deadline")


def test_a_job_that_cannot_be_sent_is_named_by_field_and_index() -> None:
    from cyclone_worker import Job

    with pytest.raises(ValueError, match=r"^input: nan"):
        Job("x", float("nan")).to_proto()
    with pytest.raises(ValueError, match=r"^jobs\[1\]\.input: nan"):
        Job("x", float("nan")).to_proto("jobs[1]")
    with pytest.raises(TypeError, match=r"^jobs\[0\]\.input: object is not JSON"):
        Job("x", object()).to_proto("jobs[0]")
    # An error whose text names no field keeps its own type alone, and reads after ": " in a call.
    with pytest.raises(UnicodeEncodeError):
        Job("x", "\ud800").to_proto()
    with pytest.raises(ValueError, match=r"^jobs\[2\]: 'utf-8' codec"):
        Job("x", "\ud800").to_proto("jobs[2]")
