"""Bad input on every RPC gets the right status, a message naming the field, and writes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import duration_pb2

from cyclone_server.convert import MAX_JSON_DEPTH, py_to_value, to_timestamp
from cyclone_proto import (runs_pb2, runs_pb2_grpc, types_pb2, workers_pb2, workers_pb2_grpc, workflows_pb2,
                                   workflows_pb2_grpc)
from cyclone_proto import limits_pb2, schedules_pb2

from rpc_descriptors import DURATION, TIMESTAMP, field_at, time_fields, unary_rpcs
from waits_helpers import secs

INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
UNKNOWN_ID = "01900000-0000-7000-8000-000000000000"
N = types_pb2.Node


async def expect(call: Awaitable[Any], code: grpc.StatusCode, *words: str) -> str:
    """The call fails with `code` and a message containing every one of `words`."""
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, e.value.details()
    for word in words:
        assert word in (e.value.details() or ""), e.value.details()
    return e.value.details() or ""


async def count(conn: psycopg.AsyncConnection, table: str) -> int:
    row = await (await conn.execute(f"SELECT count(*) FROM {table}")).fetchone()
    assert row is not None
    return int(row[0])


def register(wf: workflows_pb2_grpc.WorkflowsStub, name: str, *nodes: types_pb2.Node) -> Any:
    return wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name=name, nodes=nodes))


BAD_DEFINITIONS: list[tuple[str, list[types_pb2.Node], tuple[str, ...]]] = [
    ("no nodes", [], ("nodes",)),
    ("bad node id", [N(id="a b")], ("nodes[0]", "id")),
    ("empty node id", [N(id="")], ("nodes[0]", "id")),
    ("duplicate id", [N(id="a"), N(id="a")], ('nodes[1] (id "a")', "duplicate")),
    ("unknown dep", [N(id="a", deps=["ghost"])], ('nodes[0] (id "a")', "deps", "ghost")),
    ("self dep", [N(id="a", deps=["a"])], ('(id "a")', "deps")),
    ("cycle", [N(id="a", deps=["c"]), N(id="b", deps=["a"]), N(id="c", deps=["b"])], ("deps", "cycle")),
    ("unknown child workflow", [N(id="sub", type=types_pb2.NODE_TYPE_CHILD, workflow="nope")], ("sub", "nope")),
    ("child without workflow", [N(id="sub", type=types_pb2.NODE_TYPE_CHILD)], ('(id "sub")', "workflow")),
    ("sleep on a task", [N(id="a", sleep=secs(1))], ('(id "a")', "sleep")),
    ("sleep node without sleep", [N(id="nap", type=types_pb2.NODE_TYPE_SLEEP)], ('(id "nap")', "sleep")),
    ("max_wait on a task", [N(id="a", max_wait=secs(1))], ('(id "a")', "max_wait")),
    ("zero max_attempts", [N(id="a", max_attempts=0)], ('(id "a")', "max_attempts")),
    ("negative backoff", [N(id="a", backoff_initial=secs(-1))], ('(id "a")', "backoff_initial")),
    ("zero attempt timeout", [N(id="a", attempt_timeout=secs(0))], ('(id "a")', "attempt_timeout")),
    ("unknown node type", [N(id="a", type=99)], ('(id "a")', "type")),
]


async def test_register_workflow_rejects_bad_definitions(wf: workflows_pb2_grpc.WorkflowsStub,
                                                         conn: psycopg.AsyncConnection) -> None:
    for case, nodes, words in BAD_DEFINITIONS:
        try:
            await expect(register(wf, "wf", *nodes), INVALID, *words)
        except AssertionError as e:
            raise AssertionError(f"{case}: {e}") from None
    assert await count(conn, "cyclone_workflows") == 0


async def test_workflow_names_and_reads(wf: workflows_pb2_grpc.WorkflowsStub, conn: psycopg.AsyncConnection) -> None:
    await expect(register(wf, "", N(id="a")), INVALID, "name: required")
    await expect(register(wf, "bad name", N(id="a")), INVALID, "name")
    assert await count(conn, "cyclone_workflows") == 0
    await expect(wf.GetWorkflow(workflows_pb2.GetWorkflowRequest()), INVALID, "name: required")
    await expect(wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="w", version=-1)), INVALID, "version")
    await expect(wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="w\x00")), INVALID, "name")
    await expect(wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="w")), NOT_FOUND, "w")
    await register(wf, "w", N(id="a"))
    await expect(wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="w", version=2)), NOT_FOUND, "version 2")
    await expect(wf.ListWorkflows(workflows_pb2.ListWorkflowsRequest(name_prefix="\x00")), INVALID, "name_prefix")
    # LIKE wildcards in a prefix are literal characters.
    for prefix in ("%", "_"):
        listed = await wf.ListWorkflows(workflows_pb2.ListWorkflowsRequest(name_prefix=prefix))
        assert list(listed.workflows) == []


async def test_submit_run_bad_input(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub,
                                    conn: psycopg.AsyncConnection) -> None:
    await register(wf, "w", N(id="a"))
    past = to_timestamp(datetime.now(timezone.utc) - timedelta(minutes=1))
    future = to_timestamp(datetime.now(timezone.utc) + timedelta(minutes=1))
    nan = py_to_value({"x": 0.0})
    nan.struct_value.fields["x"].number_value = float("nan")
    S = runs_pb2.SubmitRunRequest
    cases: list[tuple[runs_pb2.SubmitRunRequest, grpc.StatusCode, tuple[str, ...]]] = [
        (S(), INVALID, ("workflow: required",)),
        (S(workflow="bad name"), INVALID, ("workflow",)),
        (S(workflow="ghost"), NOT_FOUND, ("ghost",)),
        (S(workflow="w", version=-1), INVALID, ("version",)),
        (S(workflow="w", version=7), NOT_FOUND, ("version 7",)),
        (S(workflow="w", deadline=future, deadline_in=secs(60)), INVALID, ("deadline", "deadline_in")),
        (S(workflow="w", deadline=past), INVALID, ("deadline", "future")),
        (S(workflow="w", deadline_in=secs(-5)), INVALID, ("deadline_in",)),
        (S(workflow="w", deadline_in=secs(0)), INVALID, ("deadline_in",)),
        (S(workflow="w", deadline_in=duration_pb2.Duration(seconds=10**11)), INVALID, ("deadline_in", "limit")),
        (S(workflow="w", input=nan), INVALID, ("input",)),
        (S(workflow="w", input=py_to_value({"k": "nul\x00"})), INVALID, ("input", "U+0000")),
        (S(workflow="w", input=py_to_value({"nul\x00": 1})), INVALID, ("input", "U+0000")),
        (S(workflow="w", idempotency_key="k" * 257), INVALID, ("idempotency_key", "limit")),
        (S(workflow="w", idempotency_key="k\x00"), INVALID, ("idempotency_key", "U+0000")),
        (S(workflow="w", input=py_to_value("x" * (1 << 20))), INVALID, ("input", "limit")),
    ]
    for request, code, words in cases:
        await expect(runs.SubmitRun(request), code, *words)
    assert await count(conn, "cyclone_runs") == 0


E = runs_pb2.EnqueueRequest


def bad_jobs() -> list[tuple[runs_pb2.EnqueueRequest, tuple[str, ...]]]:
    """Enqueue requests that must be refused, and the words of each refusal."""
    return [
        (E(), ("kind: required",)),
        (E(kind="no spaces"), ("kind",)),
        (E(kind="k", max_attempts=0), ("max_attempts",)),
        (E(kind="k", max_reclaims=-1), ("max_reclaims",)),
        (E(kind="k", backoff_initial=secs(-1)), ("backoff_initial",)),
        (E(kind="k", attempt_timeout=secs(0)), ("attempt_timeout",)),
        (E(kind="k", retention=secs(-1)), ("retention",)),
        (E(kind="k", deadline_in=secs(1), deadline=to_timestamp(datetime.now(timezone.utc) + timedelta(1))),
         ("deadline_in",)),
        (E(kind="k", input=py_to_value(["y" * 1000] * 1100)), ("input", "limit")),
        (E(kind="k", input=py_to_value(["\x00"])), ("input", "U+0000")),
        (E(kind="k", idempotency_key="\x00"), ("idempotency_key", "U+0000")),
    ]


async def test_enqueue_bad_input(runs: runs_pb2_grpc.RunsStub, conn: psycopg.AsyncConnection) -> None:
    for request, words in bad_jobs():
        message = await expect(runs.Enqueue(request), INVALID, *words)
        assert "nodes[0]" not in message
    assert await count(conn, "cyclone_runs") == 0


async def test_enqueue_many_bad_input_names_the_job_and_writes_nothing(runs: runs_pb2_grpc.RunsStub,
                                                                       conn: psycopg.AsyncConnection) -> None:
    M = runs_pb2.EnqueueManyRequest
    good = E(kind="ok", input=py_to_value({"n": 1}))
    for request, words in bad_jobs():
        message = await expect(runs.EnqueueMany(M(jobs=[good, good, request, good])), INVALID, *words)
        assert message.startswith("jobs[2].") and "nodes[0]" not in message
    await expect(runs.EnqueueMany(M()), INVALID, "jobs", "at least one")
    await expect(runs.EnqueueMany(M(jobs=[good] * 1001)), INVALID, "jobs", "1001", "1000")
    assert await count(conn, "cyclone_runs") == 0

    # Refused by the database after earlier jobs of the call were inserted: still nothing.
    await runs.Enqueue(E(kind="mail", idempotency_key="taken"))
    conflict = E(kind="mail", input=py_to_value(2), idempotency_key="taken")
    await expect(runs.EnqueueMany(M(jobs=[good, good, conflict])), grpc.StatusCode.ALREADY_EXISTS,
                 "jobs[2]", "idempotency_key", "taken")
    twice = [E(kind="a", idempotency_key="k"), E(kind="a", input=py_to_value(1), idempotency_key="k")]
    await expect(runs.EnqueueMany(M(jobs=twice)), grpc.StatusCode.ALREADY_EXISTS, "jobs[1]", "idempotency_key")
    assert await count(conn, "cyclone_runs") == 1 and await count(conn, "cyclone_steps") == 1


async def test_run_id_checks_on_every_run_rpc(runs: runs_pb2_grpc.RunsStub) -> None:
    calls: list[tuple[str, Callable[[str], Awaitable[Any]]]] = [
        ("GetRun", lambda r: runs.GetRun(runs_pb2.GetRunRequest(run_id=r))),
        ("WaitRun", lambda r: runs.WaitRun(runs_pb2.WaitRunRequest(run_id=r, timeout=secs(0)))),
        ("CancelRun", lambda r: runs.CancelRun(runs_pb2.CancelRunRequest(run_id=r))),
        ("PauseRun", lambda r: runs.PauseRun(runs_pb2.PauseRunRequest(run_id=r))),
        ("ResumeRun", lambda r: runs.ResumeRun(runs_pb2.ResumeRunRequest(run_id=r))),
        ("RetryStep", lambda r: runs.RetryStep(runs_pb2.RetryStepRequest(run_id=r, node="a"))),
        ("RetryAll", lambda r: runs.RetryAll(runs_pb2.RetryAllRequest(run_id=r))),
        ("Signal", lambda r: runs.Signal(runs_pb2.SignalRequest(run_id=r, name="go"))),
    ]
    for name, call in calls:
        await expect(call(""), INVALID, "run_id: required")
        await expect(call("not-a-uuid"), INVALID, "run_id", "not-a-uuid")
        await expect(call(UNKNOWN_ID), NOT_FOUND, UNKNOWN_ID)


async def test_list_wait_purge_bad_arguments(runs: runs_pb2_grpc.RunsStub) -> None:
    await expect(runs.ListRuns(runs_pb2.ListRunsRequest(limit=-1)), INVALID, "limit")
    await expect(runs.ListRuns(runs_pb2.ListRunsRequest(page_token="garbage")), INVALID, "page_token")
    await expect(runs.ListRuns(runs_pb2.ListRunsRequest(states=[types_pb2.RUN_STATE_UNSPECIFIED])), INVALID, "states")
    await expect(runs.ListRuns(runs_pb2.ListRunsRequest(workflow="w\x00")), INVALID, "workflow")
    await expect(runs.WaitRun(runs_pb2.WaitRunRequest(run_id=UNKNOWN_ID, timeout=secs(-1))), INVALID, "timeout")
    P = runs_pb2.PurgeTerminalRunsRequest
    await expect(runs.PurgeTerminalRuns(P()), INVALID, "older_than: required")
    await expect(runs.PurgeTerminalRuns(P(older_than=secs(-1))), INVALID, "older_than")
    await expect(runs.PurgeTerminalRuns(P(older_than=secs(1), limit=-1)), INVALID, "limit")
    await expect(runs.PurgeTerminalRuns(P(older_than=secs(1), limit=-1, dry_run=True)), INVALID, "limit")
    # Within Duration's range, but before any run (and before what Postgres can compute).
    await expect(runs.PurgeTerminalRuns(P(older_than=duration_pb2.Duration(seconds=315_576_000_000))),
                 INVALID, "older_than", "limit")


async def test_actions_forbidden_by_state_change_nothing(wf: workflows_pb2_grpc.WorkflowsStub,
                                                         runs: runs_pb2_grpc.RunsStub,
                                                         conn: psycopg.AsyncConnection) -> None:
    await register(wf, "w", N(id="a"), N(id="go", type=types_pb2.NODE_TYPE_SIGNAL, deps=["a"]))
    run_id = (await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="w"))).run_id
    before = await (await conn.execute("SELECT state, updated_at FROM cyclone_runs")).fetchall()
    R = runs_pb2.RetryStepRequest
    await expect(runs.ResumeRun(runs_pb2.ResumeRunRequest(run_id=run_id)), PRECONDITION)
    await expect(runs.RetryStep(R(run_id=run_id, node="a")), PRECONDITION, "a")
    await expect(runs.RetryAll(runs_pb2.RetryAllRequest(run_id=run_id)), PRECONDITION)
    await expect(runs.RetryStep(R(run_id=run_id)), INVALID, "node: required")
    await expect(runs.RetryStep(R(run_id=run_id, node="bad node")), INVALID, "node")
    await expect(runs.RetryStep(R(run_id=run_id, node="ghost")), NOT_FOUND, "ghost")
    await expect(runs.RetryStep(R(run_id=run_id, node="a", deadline_in=secs(1),
                                  deadline=to_timestamp(datetime.now(timezone.utc) + timedelta(1)))), INVALID, "deadline")
    await expect(runs.RetryAll(runs_pb2.RetryAllRequest(
        run_id=run_id, deadline=to_timestamp(datetime.now(timezone.utc) - timedelta(1)))), INVALID, "deadline")
    Sig = runs_pb2.SignalRequest
    await expect(runs.Signal(Sig(run_id=run_id)), INVALID, "name: required")
    await expect(runs.Signal(Sig(run_id=run_id, name="bad name")), INVALID, "name")
    await expect(runs.Signal(Sig(run_id=run_id, name="go", payload=py_to_value("z" * (1 << 20)))),
                 INVALID, "payload", "limit")
    await expect(runs.Signal(Sig(run_id=run_id, name="go", payload=py_to_value("\x00"))), INVALID, "payload")
    assert await count(conn, "cyclone_signals") == 0
    assert await (await conn.execute("SELECT state, updated_at FROM cyclone_runs")).fetchall() == before

    await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id))
    await expect(runs.PauseRun(runs_pb2.PauseRunRequest(run_id=run_id)), PRECONDITION)
    await expect(runs.Signal(Sig(run_id=run_id, name="go")), PRECONDITION)
    assert await count(conn, "cyclone_signals") == 0


async def test_payload_limit_follows_the_flag(start_server: Callable[..., Any], db_url: str,
                                              conn: psycopg.AsyncConnection) -> None:
    srv = start_server(db_url, extra_args=["--max-payload-bytes", "100"])
    async with grpc.aio.insecure_channel(srv.address) as ch:
        stub = runs_pb2_grpc.RunsStub(ch)
        await expect(stub.Enqueue(runs_pb2.EnqueueRequest(kind="k", input=py_to_value("q" * 200))),
                     INVALID, "input", "100 bytes")
        ok = await stub.Enqueue(runs_pb2.EnqueueRequest(kind="k", input=py_to_value("q" * 50)))
        assert ok.created
    assert await count(conn, "cyclone_runs") == 1


def valid_requests(run_id: str) -> dict[str, dict[str, Any]]:
    """Fields of a request that each unary RPC takes (up to the database), by RPC name."""
    return {
        "RegisterWorkflow": {"name": "w", "nodes": [N(id="a")]},
        "GetWorkflow": {"name": "w"},
        "ListWorkflows": {},
        "SubmitRun": {"workflow": "w"},
        "Enqueue": {"kind": "k"},
        "EnqueueMany": {"jobs": [E(kind="k")]},
        "GetRun": {"run_id": run_id},
        "ListRuns": {},
        "WaitRun": {"run_id": run_id, "timeout": secs(0)},
        "CancelRun": {"run_id": run_id},
        "PauseRun": {"run_id": run_id},
        "ResumeRun": {"run_id": run_id},
        "RetryStep": {"run_id": run_id, "node": "a"},
        "RetryAll": {"run_id": run_id},
        "Signal": {"run_id": run_id, "name": "go"},
        "PurgeTerminalRuns": {"older_than": secs(1)},
        "GetStats": {},
        **schedule_requests(),
        "ListWorkers": {},
        "SetLimit": {"limit": limits_pb2.Limit(name="l", max_running=1, rate=1, period=secs(1))},
        "GetLimit": {"name": "l"},
        "ListLimits": {},
        "DeleteLimit": {"name": "l"},
    }


def schedule_requests() -> dict[str, dict[str, Any]]:
    settings = schedules_pb2.ScheduleSettings(job=E(kind="k"), interval=schedules_pb2.IntervalSpec(every=secs(60)))
    return {"CreateSchedule": {"name": "s", "settings": settings}, "UpdateSchedule": {"name": "s", "settings": settings},
            **{rpc: {"name": "s"} for rpc in ("GetSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule",
                                              "TriggerSchedule")},
            "ListSchedules": {}}


# (seconds, nanos) outside the ranges of google/protobuf/duration.proto and timestamp.proto.
OUT_OF_RANGE = {
    DURATION: [(2**62, 0), (-(2**62), 0), (315_576_000_001, 0), (0, 10**9), (0, -(10**9)), (5, -1)],
    TIMESTAMP: [(2**62, 0), (-62_135_596_801, 0), (253_402_300_800, 0), (0, -1), (0, 10**9)],
}


async def test_out_of_range_durations_and_timestamps_anywhere_are_invalid_argument_naming_the_field(
        channel: grpc.aio.Channel, wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub,
        conn: psycopg.AsyncConnection) -> None:
    # Every Duration and Timestamp of every unary request, found in the descriptors: a new
    # field is covered without editing this test (a new RPC needs a line in valid_requests).
    await register(wf, "w", N(id="a"))
    run_id = (await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="w"))).run_id
    valid = valid_requests(run_id)
    rpcs = unary_rpcs()
    assert {r.name for r in rpcs} == set(valid)
    fields = 0
    for rpc in rpcs:
        call = rpc.callable(channel)
        for path, type_name in time_fields(rpc.request.DESCRIPTOR):
            fields += 1
            for seconds, nanos in OUT_OF_RANGE[type_name]:
                request = rpc.request(**valid[rpc.name])
                bad = field_at(request, path)
                bad.seconds, bad.nanos = seconds, nanos
                try:
                    message = await expect(call(request), INVALID, path[-1])
                    assert "out of range" in message or "different signs" in message, message
                except AssertionError as e:
                    raise AssertionError(f"{rpc.name} {'.'.join(path)} = ({seconds}, {nanos}): {e}") from None
    assert fields >= 20
    assert await count(conn, "cyclone_runs") == 1 and await count(conn, "cyclone_workflows") == 1


def nested(depth: int, kind: str) -> Any:
    """A Value nested `depth` levels deep in arrays or objects, built in place (copying it would parse it)."""
    request = runs_pb2.SubmitRunRequest(workflow="w")
    v = request.input
    for _ in range(depth):
        v = v.list_value.values.add() if kind == "list" else v.struct_value.fields["k"]
    v.number_value = 1
    return request


async def test_requests_that_do_not_parse_are_invalid_argument(channel: grpc.aio.Channel) -> None:
    # Not grpcio's UNKNOWN: a truncated varint, a tag without its value, strings that are
    # not UTF-8 (a stray byte; a UTF-16 surrogate, U+D800, encoded as UTF-8) in field 1 of
    # every request whose field 1 is a string.
    for rpc in unary_rpcs():
        call = rpc.callable(channel, raw=True)
        bodies = [b"\xff\xff\xff\xff", b"\x08"]
        if rpc.request.DESCRIPTOR.fields and rpc.request.DESCRIPTOR.fields[0].type == 9:  # TYPE_STRING
            bodies += [b"\x0a\x01\xff", b"\x0a\x03\xed\xa0\x80"]
        for body in bodies:
            try:
                await expect(call(body), INVALID, "request: not a valid protobuf message")
            except AssertionError as e:
                raise AssertionError(f"{rpc.name} {body!r}: {e}") from None
    health = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None)
    await expect(health(b"\x08"), INVALID, "request: not a valid protobuf message")


async def test_json_nesting_limit(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub,
                                  conn: psycopg.AsyncConnection) -> None:
    await register(wf, "w", N(id="a"))
    # Deeper than protobuf decodes (about 33 objects): refused while parsing.
    await expect(runs.SubmitRun(nested(40, "struct")), INVALID, "not a valid protobuf message",
                 f"at most {MAX_JSON_DEPTH} levels")
    # Decodable, but deeper than the limit, which leaves room for the messages a payload travels in.
    for kind in ("struct", "list"):
        await expect(runs.SubmitRun(nested(MAX_JSON_DEPTH + 1, kind)), INVALID,
                     "input", f"nested deeper than {MAX_JSON_DEPTH} levels")
    assert await count(conn, "cyclone_runs") == 0
    # At the limit: accepted, and read back (a step output nests the same levels plus one).
    run_id = (await runs.SubmitRun(nested(MAX_JSON_DEPTH, "struct"))).run_id
    run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    assert run.input == nested(MAX_JSON_DEPTH, "struct").input


async def test_worker_messages_that_do_not_parse_end_the_stream_with_invalid_argument(
        channel: grpc.aio.Channel) -> None:
    connect = channel.stream_stream("/cyclone.v1.Workers/Connect", request_serializer=None,
                                    response_deserializer=workers_pb2.ServerMessage.FromString)
    hello = workers_pb2.WorkerMessage(hello=workers_pb2.Hello(worker_id="w1", kinds=["k"], slots=1))
    for first, then in ((b"\x08", None), (hello.SerializeToString(), b"\xff\xff\xff\xff")):
        call = connect()
        await call.write(first)
        if then is not None:
            assert (await call.read()).HasField("welcome")
            await call.write(then)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            while True:
                msg = await call.read()
                assert msg is not grpc.aio.EOF, "the stream ended OK"
        assert e.value.code() == INVALID, e.value.details()
        assert "not a valid protobuf message" in (e.value.details() or "")


async def test_errors_quoting_huge_input_stay_readable(wf: workflows_pb2_grpc.WorkflowsStub,
                                                       runs: runs_pb2_grpc.RunsStub) -> None:
    # Status details travel in a header that clients refuse beyond 16 KiB: an error quoting
    # a 300 kB value would reach the client as RESOURCE_EXHAUSTED instead of the error.
    await register(wf, "w", N(id="a"))
    run_id = (await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="w"))).run_id
    huge = "y" * 300_000
    for call in (runs.RetryStep(runs_pb2.RetryStepRequest(run_id=run_id, node=huge)),
                 runs.Enqueue(runs_pb2.EnqueueRequest(kind=huge)),
                 runs.GetRun(runs_pb2.GetRunRequest(run_id=huge))):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call
        assert e.value.code() in (INVALID, NOT_FOUND), e.value.details()
        assert len(e.value.details() or "") < 1100 and "characters)" in (e.value.details() or "")


async def test_worker_stream_errors_quoting_huge_input_stay_readable(channel: grpc.aio.Channel) -> None:
    stream = workers_pb2_grpc.WorkersStub(channel).Connect()
    await stream.write(workers_pb2.WorkerMessage(hello=workers_pb2.Hello(worker_id="w", kinds=["k" * 300_000], slots=1)))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stream.read()
    assert e.value.code() == INVALID, e.value.details()
    assert "hello.kinds" in (e.value.details() or "") and len(e.value.details() or "") < 1100
