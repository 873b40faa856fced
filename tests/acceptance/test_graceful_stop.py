"""SIGTERM: health turns NOT_SERVING, new calls are UNAVAILABLE, calls in flight get their answer or UNAVAILABLE.

Never CANCELLED, which no client retries, and never cut short before --grace ends. A call
is kept in flight by a row lock the test holds on the run it acts on: the lock is released
(or not) when the test has seen what it checks.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc

from waits_helpers import secs, until

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
DEADLINE = 30.0


async def submit(channel: grpc.aio.Channel) -> str:
    wf = workflows_pb2_grpc.WorkflowsStub(channel)
    await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="w", nodes=[types_pb2.Node(id="a")]))
    return (await runs_pb2_grpc.RunsStub(channel).SubmitRun(runs_pb2.SubmitRunRequest(workflow="w"))).run_id


@asynccontextmanager
async def run_locked(db_url: str, run_id: str) -> AsyncIterator[None]:
    """Holds the run's row lock: actions on the run wait for it inside the server."""
    async with await psycopg.AsyncConnection.connect(db_url) as c, c.transaction():
        await c.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR UPDATE", (run_id,))
        yield


async def blocked(conn: psycopg.AsyncConnection) -> bool:
    """Some server statement is waiting for a lock (the call is in flight)."""
    row = await (await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )).fetchone()
    return bool(row and row[0])


async def status(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def drained(channel: grpc.aio.Channel, run_id: str) -> bool:
    """Health says NOT_SERVING and a new call is UNAVAILABLE (a call before that must succeed)."""
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    code = await status(runs_pb2_grpc.RunsStub(channel).GetRun(runs_pb2.GetRunRequest(run_id=run_id)))
    assert code in (grpc.StatusCode.OK, UNAVAILABLE), code
    if code == UNAVAILABLE:
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING, "refusing calls while SERVING"
        return True
    return False


async def exit_code(srv: Any) -> int:
    assert srv.proc is not None
    return await asyncio.to_thread(srv.proc.wait, DEADLINE)


async def test_calls_in_flight_finish_within_grace_while_new_ones_are_unavailable(
        start_server: Callable[..., Any], db_url: str, conn: psycopg.AsyncConnection) -> None:
    srv = start_server(db_url, extra_args=["--grace", "60"])
    async with grpc.aio.insecure_channel(srv.address) as channel:
        runs = runs_pb2_grpc.RunsStub(channel)
        run_id = await submit(channel)
        async with run_locked(db_url, run_id):
            # The WaitRuns first, then a call answered after them on the same connection, then
            # the CancelRun: grpc.aio starts each call's task in the order the calls arrive, so
            # once CancelRun waits for the lock, every WaitRun is in flight (past the gate),
            # not a new call that the SIGTERM would rightly refuse.
            waits = [asyncio.ensure_future(runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=secs(600))))
                     for _ in range(3)]
            await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
            cancel = asyncio.ensure_future(runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id)))
            await until(lambda: blocked(conn), "CancelRun waits for the run's lock", DEADLINE)
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            await until(lambda: drained(channel, run_id), "health NOT_SERVING and new calls UNAVAILABLE", DEADLINE)
            # WaitRun answers at once with the run as it stands, not after the grace period
            # (CancelRun is still waiting for the lock this test holds).
            for wait in waits:
                answer = await wait
                assert answer.timed_out and answer.run.state == types_pb2.RUN_STATE_RUNNING
            assert not cancel.done()
            # Held past the moment a bare server.stop(grace=1) would have cut the call: only
            # the server's --grace (60 s) bounds it. (A wait on purpose, not for a condition.)
            await asyncio.sleep(2.0)
            assert not cancel.done()
        answered = await cancel  # the lock is gone: the call in flight finishes, within grace
        assert answered.applied and answered.run.state == types_pb2.RUN_STATE_CANCELLED
    assert await exit_code(srv) == 0


async def test_calls_still_running_when_grace_ends_are_unavailable_not_cancelled(
        start_server: Callable[..., Any], db_url: str, conn: psycopg.AsyncConnection) -> None:
    srv = start_server(db_url, extra_args=["--grace", "0.5"])
    async with grpc.aio.insecure_channel(srv.address) as channel:
        runs = runs_pb2_grpc.RunsStub(channel)
        run_id = await submit(channel)
        async with run_locked(db_url, run_id):
            calls = [asyncio.ensure_future(status(runs.PauseRun(runs_pb2.PauseRunRequest(run_id=run_id))))
                     for _ in range(3)]
            await until(lambda: blocked(conn), "PauseRun waits for the run's lock", DEADLINE)
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGTERM)
            # The lock is held until every call has its answer: none can finish.
            assert await asyncio.gather(*calls) == [UNAVAILABLE] * 3
        assert await exit_code(srv) == 0


async def _hammer(address: str, stop: asyncio.Event, codes: dict[str, int], retries: int) -> None:
    """Calls one after another on a channel of its own; once the server refuses, `retries` more
    calls a few milliseconds apart (as a client's retries would), then it stops. Counts the codes."""
    async with grpc.aio.insecure_channel(address) as channel:
        stubs = runs_pb2_grpc.RunsStub(channel), workflows_pb2_grpc.WorkflowsStub(channel)
        refused = 0
        while refused <= retries:
            calls = (stubs[0].ListRuns(runs_pb2.ListRunsRequest(limit=1), timeout=DEADLINE),
                     stubs[1].ListWorkflows(workflows_pb2.ListWorkflowsRequest(), timeout=DEADLINE))
            for call in calls:
                code = await status(call)
                codes[code.name] = codes.get(code.name, 0) + 1
            if stop.is_set() and code != grpc.StatusCode.OK:
                refused += 1
                await asyncio.sleep(0.002 * refused)


async def test_calls_racing_the_signal_across_the_stop_window_are_never_cancelled(
        start_server: Callable[..., Any], db_url: str) -> None:
    # 32 callers call without pause while the server gets SIGTERM and stops, in several
    # rounds: a call that reaches a stopping server completes or is UNAVAILABLE, whenever
    # in the stop window it comes (before the gate closes, while it drains, as grpc stops).
    codes: dict[str, int] = {}
    for _ in range(6):
        srv = start_server(db_url, extra_args=["--grace", "0.5"])
        stop = asyncio.Event()
        callers = [asyncio.create_task(_hammer(srv.address, stop, codes, retries=i % 4)) for i in range(32)]
        await asyncio.sleep(0.3)  # calls in flight when the signal comes
        stop.set()
        srv.proc.send_signal(signal.SIGTERM)
        assert await exit_code(srv) == 0
        await asyncio.wait_for(asyncio.gather(*callers), DEADLINE)
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert codes.get("OK", 0) > 0 and codes.get("UNAVAILABLE", 0) >= 32 * 6, codes
