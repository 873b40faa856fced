"""Unit tests of the client's dataclasses built from wire messages, and of the handler Context."""

from __future__ import annotations

import asyncio
import threading

from google.protobuf import timestamp_pb2

from cyclone_worker import CancelFlag, Context, Run
from cyclone_worker._models import WorkflowInfo, enum_name
from cyclone_proto import types_pb2, workers_pb2
from cyclone_worker.values import to_struct, to_value


def test_state_names_are_the_documents_words() -> None:
    assert enum_name(types_pb2.StepState, types_pb2.STEP_STATE_WAITING_CHILD, "STEP_STATE_") == "waiting_child"
    assert enum_name(types_pb2.RunState, types_pb2.RUN_STATE_CANCELLED, "RUN_STATE_") == "cancelled"
    assert enum_name(types_pb2.StepState, 99, "STEP_STATE_") == "unknown_99"


def test_run_from_proto() -> None:
    ts = timestamp_pb2.Timestamp(seconds=1_800_000_000)
    msg = types_pb2.Run(
        id="r1", workflow="etl", workflow_version=2, state=types_pb2.RUN_STATE_COMPLETED,
        input=to_value({"day": 1}), result=to_value({"load": {"rows": 3}}), created_at=ts,
        steps=[types_pb2.Step(id="s1", run_id="r1", node="load", kind="load", type=types_pb2.NODE_TYPE_TASK,
                              state=types_pb2.STEP_STATE_COMPLETED, attempt=2, max_attempts=25,
                              lease_generation=3, output=to_value({"rows": 3}), deps=["extract"],
                              errors=[types_pb2.StepError(attempt=1, error_kind="error", message="E: x", at=ts)])])
    run = Run.from_proto(msg)
    assert run.state == "completed" and run.terminal
    assert run.input == {"day": 1} and run.result == {"load": {"rows": 3}}
    assert run.created_at is not None and run.created_at.year == 2027 and run.finished_at is None
    step = run.step("load")
    assert (step.state, step.type, step.attempt, step.output) == ("completed", "task", 2, {"rows": 3})
    assert step.errors[0].message == "E: x" and step.deps == ["extract"]
    assert step.started_at is None  # unset timestamps stay None


def test_workflow_info_nodes_read_as_dicts() -> None:
    node = types_pb2.Node(id="a", kind="a", type=types_pb2.NODE_TYPE_TASK, max_attempts=25,
                          on_dep_failure=types_pb2.ON_DEP_FAILURE_CANCEL_BRANCH)
    node.backoff_initial.FromSeconds(1)
    info = WorkflowInfo.from_proto(types_pb2.Workflow(name="w", version=1, nodes=[node]))
    d = info.nodes[0]
    assert d["type"] == "task" and d["on_dep_failure"] == "cancel_branch"
    assert d["max_attempts"] == 25 and d["backoff_initial"] == 1.0 and d["retention"] is None


async def test_context_exposes_the_lease_and_cancellation_from_any_thread() -> None:
    lease = workers_pb2.Lease(run_id="r", step_id="s", node="parse", kind="parse", attempt=2, max_attempts=2,
                              lease_generation=7, input=to_value({"url": "x"}),
                              parents=to_struct({"fetch": {"body": "hi"}}))
    ctx = Context(lease, loop=asyncio.get_running_loop(), worker_id="w1")
    assert (ctx.run_id, ctx.step_id, ctx.node, ctx.attempt, ctx.lease_generation) == ("r", "s", "parse", 2, 7)
    assert ctx.input == {"url": "x"} and ctx.parents == {"fetch": {"body": "hi"}}
    assert ctx.last_attempt and ctx.attempt_deadline is None
    assert not ctx.is_cancelled()

    waiter = asyncio.create_task(ctx.cancelled.wait())
    threading.Thread(target=ctx.cancelled.set, args=("cancelled",)).start()  # as from a thread
    assert await asyncio.wait_for(waiter, 5)
    assert ctx.is_cancelled() and ctx.cancelled.reason == "cancelled"
    assert ctx.cancelled.wait_blocking(0)


async def test_a_cancel_flag_wakes_every_kind_of_waiter_whichever_came_first() -> None:
    """A flag makes its events on first wait: set before, set after, and set from another
    thread while a thread blocks all wake the waiter, and the reason is the first set's."""
    loop = asyncio.get_running_loop()
    early = CancelFlag(loop)
    early.set("stop")
    early.set("again")  # ignored: the first reason stays
    assert await asyncio.wait_for(early.wait(), 5) and early.wait_blocking(0) and early.reason == "stop"

    late = CancelFlag(loop)
    waiter = asyncio.create_task(late.wait())
    await asyncio.sleep(0)  # the waiter made its event
    assert not late.is_set() and not late.wait_blocking(0)
    late.set("cancelled")  # from the loop
    assert await asyncio.wait_for(waiter, 5)

    threaded = CancelFlag(loop)
    blocked = loop.run_in_executor(None, threaded.wait_blocking, 5.0)
    asyncio_waiter = asyncio.create_task(threaded.wait())
    deadline = loop.time() + 5
    while threaded._flag is None:  # the thread is about to block on its event
        assert loop.time() < deadline
        await asyncio.sleep(0.01)
    threading.Thread(target=threaded.set, args=("from a thread",)).start()
    assert await asyncio.wait_for(blocked, 5) is True
    assert await asyncio.wait_for(asyncio_waiter, 5)
    assert threaded.is_set() and threaded.reason == "from a thread"
