"""Conversions between engine rows and cyclone.v1 messages round-trip (no database)."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from cyclone_server import convert

from cyclone_server import definitions
from cyclone_server.errors import InvalidArgument
from cyclone_proto import runs_pb2, types_pb2

T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


@pytest.mark.parametrize("payload", [
    None, True, False, 0, 1, -7, 2**53, 1.5, -0.25, "", "héllo", [], {},
    {"x": 1, "y": [1, 2.5, None, {"z": "s"}], "n": None, "b": False},
])
def test_json_round_trips_through_value(payload: object) -> None:
    back = convert.value_to_py(convert.py_to_value(payload))
    assert back == payload
    assert type(back) is type(payload)


def test_integral_numbers_come_back_as_int_within_2_pow_53() -> None:
    assert convert.value_to_py(struct_pb2.Value(number_value=3.0)) == 3
    assert isinstance(convert.value_to_py(struct_pb2.Value(number_value=3.0)), int)
    big = float(2**60)
    assert isinstance(convert.value_to_py(struct_pb2.Value(number_value=big)), float)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_invalid_argument_naming_the_field(bad: float) -> None:
    v = struct_pb2.Value()
    v.struct_value.fields["a"].number_value = bad
    with pytest.raises(InvalidArgument, match=r"^input\.a: "):  # the path of the value
        convert.value_to_py(v, "input")


def test_unset_value_field_reads_as_null() -> None:
    assert convert.optional_value(runs_pb2.SubmitRunRequest(workflow="w"), "input") is None
    req = runs_pb2.SubmitRunRequest(workflow="w", input=convert.py_to_value({"a": 1}))
    assert convert.optional_value(req, "input") == {"a": 1}


def test_durations_and_timestamps() -> None:
    req = runs_pb2.WaitRunRequest(timeout=duration_pb2.Duration(seconds=2, nanos=500_000_000))
    assert convert.duration_seconds(req, "timeout") == 2.5
    assert convert.duration_seconds(runs_pb2.WaitRunRequest(), "timeout") is None
    neg = runs_pb2.WaitRunRequest(timeout=duration_pb2.Duration(seconds=-1))
    with pytest.raises(InvalidArgument, match="^timeout: must be >= 0"):
        convert.duration_seconds(neg, "timeout")
    zero = runs_pb2.SubmitRunRequest(deadline_in=duration_pb2.Duration())
    with pytest.raises(InvalidArgument, match="^deadline_in: must be > 0"):
        convert.duration_seconds(zero, "deadline_in", positive=True)
    assert convert.to_duration(timedelta(minutes=2)).seconds == 120
    assert convert.to_duration(0.25).nanos == 250_000_000
    req2 = runs_pb2.SubmitRunRequest(deadline=convert.to_timestamp(T0))
    assert convert.timestamp_dt(req2, "deadline") == T0


@pytest.mark.parametrize(("seconds", "nanos", "words"), [
    (2**62, 0, "seconds out of range"), (-(2**62), 0, "seconds out of range"),
    (convert.DURATION_MAX_SECONDS + 1, 0, "seconds out of range"),
    (0, 10**9, "nanos out of range"), (0, -(10**9), "nanos out of range"), (3, -1, "seconds and nanos have different signs"),
])
def test_durations_outside_protobufs_range_are_invalid_argument_naming_the_field(
        seconds: int, nanos: int, words: str) -> None:
    req = runs_pb2.WaitRunRequest(timeout=duration_pb2.Duration(seconds=seconds, nanos=nanos))
    with pytest.raises(InvalidArgument, match=f"^jobs\\[0\\].timeout: {words}"):
        convert.duration_seconds(req, "timeout", field="jobs[0].timeout")


def test_duration_edges_and_maximum() -> None:
    top = runs_pb2.WaitRunRequest(timeout=duration_pb2.Duration(seconds=convert.DURATION_MAX_SECONDS))
    assert convert.duration_seconds(top, "timeout") == convert.DURATION_MAX_SECONDS
    with pytest.raises(InvalidArgument, match="^timeout: .* more than the limit of 60 s"):
        convert.duration_seconds(top, "timeout", maximum=60)


@pytest.mark.parametrize(("seconds", "nanos", "words"), [
    (2**62, 0, "seconds out of range"), (convert.TIMESTAMP_MIN_SECONDS - 1, 0, "seconds out of range"),
    (convert.TIMESTAMP_MAX_SECONDS + 1, 0, "seconds out of range"),
    (0, -1, "nanos out of range"), (0, 10**9, "nanos out of range"),
])
def test_timestamps_outside_years_1_to_9999_are_invalid_argument_naming_the_field(
        seconds: int, nanos: int, words: str) -> None:
    req = runs_pb2.ListRunsRequest(created_after=timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos))
    with pytest.raises(InvalidArgument, match=f"^created_after: {words}"):
        convert.timestamp_dt(req, "created_after")


def test_timestamp_edges() -> None:
    first = runs_pb2.ListRunsRequest(created_after=timestamp_pb2.Timestamp(seconds=convert.TIMESTAMP_MIN_SECONDS))
    assert convert.timestamp_dt(first, "created_after") == datetime(1, 1, 1, tzinfo=timezone.utc)
    last = runs_pb2.ListRunsRequest(created_after=timestamp_pb2.Timestamp(
        seconds=convert.TIMESTAMP_MAX_SECONDS, nanos=999_999_999))
    assert convert.timestamp_dt(last, "created_after") == datetime(9999, 12, 31, 23, 59, 59, 999999,
                                                                   tzinfo=timezone.utc)


@pytest.mark.parametrize("kind", ["list", "struct"])
def test_json_nesting_limit(kind: str) -> None:
    def nested(depth: int) -> struct_pb2.Value:
        root = v = struct_pb2.Value()
        for _ in range(depth):
            v = v.list_value.values.add() if kind == "list" else v.struct_value.fields["k"]
        v.string_value = "leaf"
        return root

    assert convert.value_to_py(nested(convert.MAX_JSON_DEPTH)) is not None
    with pytest.raises(InvalidArgument, match=rf"^input[.\[][\w.\[\]]*: nested deeper than {convert.MAX_JSON_DEPTH} levels"):
        convert.value_to_py(nested(convert.MAX_JSON_DEPTH + 1), "input")
    if kind == "struct":  # a Struct counts as the first level
        with pytest.raises(InvalidArgument, match=r"^input\.[\w.]*: nested deeper"):
            convert.struct_to_py(nested(convert.MAX_JSON_DEPTH + 1).struct_value, "input")


def test_run_state_names_map_to_enum_and_back() -> None:
    for name in ("running", "paused", "completed", "failed", "cancelled"):
        number = convert.RUN_STATES[name]
        assert types_pb2.RunState.Name(number) == "RUN_STATE_" + name.upper()
        assert convert.run_state_name(number) == name
    with pytest.raises(InvalidArgument, match="^states: "):
        convert.run_state_name(types_pb2.RUN_STATE_UNSPECIFIED)
    assert types_pb2.StepState.Name(convert.STEP_STATES["waiting_child"]) == "STEP_STATE_WAITING_CHILD"
    assert len(convert.STEP_STATES) == 10


def test_node_unset_options_are_absent_so_defaults_apply() -> None:
    d = convert.node_to_dict(types_pb2.Node(id="a"), 0)
    assert d == {"id": "a"}
    normalized = definitions.normalize_nodes([d])[0]
    assert normalized["type"] == "task" and normalized["on_dep_failure"] == "fail_run"
    assert normalized["max_attempts"] == 25


def test_node_round_trips_through_definitions() -> None:
    nodes = [
        types_pb2.Node(id="a", kind="extract", max_attempts=3, backoff_initial=convert.to_duration(0.5),
                       backoff_max=convert.to_duration(30), priority=-2, max_reclaims=0,
                       attempt_timeout=convert.to_duration(60), retention=convert.to_duration(3600)),
        types_pb2.Node(id="nap", type=types_pb2.NODE_TYPE_SLEEP, deps=["a"], sleep=convert.to_duration(5),
                       max_wait=convert.to_duration(10)),
        types_pb2.Node(id="go", type=types_pb2.NODE_TYPE_SIGNAL, deps=["a"], signal="approve",
                       on_dep_failure=types_pb2.ON_DEP_FAILURE_CANCEL_BRANCH),
        types_pb2.Node(id="sub", type=types_pb2.NODE_TYPE_CHILD, deps=["nap", "go"], workflow="other"),
    ]
    normalized = definitions.normalize_nodes([convert.node_to_dict(n, i) for i, n in enumerate(nodes)])
    back = [convert.dict_to_node(n) for n in normalized]
    again = definitions.normalize_nodes([convert.node_to_dict(n, i) for i, n in enumerate(back)])
    assert again == normalized
    assert back[0].kind == "extract" and back[0].max_attempts == 3 and back[0].priority == -2
    assert back[0].HasField("max_reclaims") and back[0].max_reclaims == 0
    assert back[1].type == types_pb2.NODE_TYPE_SLEEP and back[1].sleep.seconds == 5
    assert back[2].signal == "approve" and back[2].on_dep_failure == types_pb2.ON_DEP_FAILURE_CANCEL_BRANCH
    assert back[3].workflow == "other" and list(back[3].deps) == ["nap", "go"]
    assert not back[3].HasField("priority") and not back[3].HasField("retention")
    assert back[3].kind == "sub" and back[3].max_attempts == 25  # defaults spelled out


def test_negative_node_duration_names_node_and_field() -> None:
    node = types_pb2.Node(id="a", backoff_initial=duration_pb2.Duration(seconds=-1))
    with pytest.raises(InvalidArgument, match=r'^nodes\[2\] \(id "a"\): backoff_initial: '):
        convert.node_to_dict(node, 2)


def _step_row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = dict(
        id=uuid.uuid4(), run_id=uuid.uuid4(), node="a", kind="a", type="task", state="discarded",
        attempt=3, max_attempts=3, reclaims=1, max_reclaims=5, snoozes=2, priority=0, scheduled_at=T0,
        lease_owner="w1", lease_expiry=T0, lease_generation=4, output=None, error_kind="max_attempts",
        reason=None, errors=[{"attempt": 1, "error_kind": "error", "message": "boom", "at": T0.isoformat()},
                             {"attempt": 3, "error_kind": "max_attempts", "message": "boom", "reason": None,
                              "at": "2026-12-01T12:00:05.5+00:00"}],
        deps=["x"], child_run_id=None, cancel_cause=None, created_at=T0, started_at=T0, finished_at=T0,
        attempt_deadline=None,
    )
    row.update(kw)
    return row


def test_step_row_to_proto() -> None:
    row = _step_row()
    s = convert.step_to_proto(row)
    assert s.id == str(row["id"]) and s.state == types_pb2.STEP_STATE_DISCARDED
    assert (s.attempt, s.reclaims, s.snoozes, s.lease_generation) == (3, 1, 2, 4)
    assert s.error_kind == "max_attempts" and s.reason == "" and list(s.deps) == ["x"]
    assert not s.HasField("output") and not s.HasField("attempt_deadline")
    assert [e.message for e in s.errors] == ["boom", "boom"]
    assert s.errors[0].at.ToDatetime(tzinfo=timezone.utc) == T0
    assert s.errors[1].at.ToDatetime(tzinfo=timezone.utc) == datetime(2026, 12, 1, 12, 0, 5, 500000, tzinfo=timezone.utc)


def test_completed_step_output_set_even_when_null() -> None:
    s = convert.step_to_proto(_step_row(state="completed", output=None, error_kind=None, errors=[]))
    assert s.HasField("output") and convert.value_to_py(s.output) is None
    s = convert.step_to_proto(_step_row(state="completed", output={"n": 2}, error_kind=None, errors=[]))
    assert convert.value_to_py(s.output) == {"n": 2}


def test_run_row_to_proto() -> None:
    rid = uuid.uuid4()
    row = dict(id=rid, workflow_name=None, workflow_version=None, state="completed", input={"a": 1},
               result={"leaf": [1, 2]}, priority=5, idempotency_key=None, deadline_at=None,
               parent_run_id=None, parent_step_id=None, created_at=T0, updated_at=T0, finished_at=T0,
               steps=[_step_row(run_id=rid, state="completed", output=[1, 2], error_kind=None, errors=[])])
    r = convert.run_to_proto(row)
    assert r.id == str(rid) and r.workflow == "" and r.workflow_version == 0
    assert r.state == types_pb2.RUN_STATE_COMPLETED and r.priority == 5
    assert convert.value_to_py(r.input) == {"a": 1} and convert.value_to_py(r.result) == {"leaf": [1, 2]}
    assert not r.HasField("deadline") and len(r.steps) == 1
    running = convert.run_to_proto({**row, "state": "running", "result": None, "input": None, "steps": []})
    assert not running.HasField("result") and running.HasField("input")
    assert convert.value_to_py(running.input) is None


def test_kind_stats_to_proto() -> None:
    k = convert.kind_stats_to_proto({"kind": "email", "available": 3, "running": 1, "scheduled": 2,
                                     "oldest_available_age": timedelta(seconds=1.5)})
    assert (k.kind, k.available, k.running, k.scheduled) == ("email", 3, 1, 2)
    assert k.oldest_available_age.ToTimedelta() == timedelta(seconds=1.5)
