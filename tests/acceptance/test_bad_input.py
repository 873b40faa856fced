"""Bad input on every RPC gets the right status, a message naming the field, and writes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import duration_pb2

from cyclone_server.convert import py_to_value, to_timestamp
from cyclone_worker._proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc

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
