"""The Python SDK against a real server: DAGs, priorities, retries, fail-fast and CancelBranch, graceful stop."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from cyclone_worker import (CancelBranch, Client, Context, Permanent, RetryAfter, RunFailed, Snooze, Worker,
                            Workflow)

from waits_helpers import DEADLINE, until


async def test_a_dag_of_eleven_nodes_completes_and_children_see_parent_outputs(server: Any, client: Client) -> None:
    fan = [f"f{i}" for i in range(6)]
    wf = Workflow("dag").task("start")
    for i, node in enumerate(fan):
        wf.task(node, kind="square", deps=["start"])
    wf.task("join", deps=fan).task("left", deps=["join"]).task("right", deps=["join"])
    wf.task("end", deps=["left", "right"])
    await client.register(wf)
    seen_parents: dict[str, set[str]] = {}
    worker = Worker(server.address, slots=4)

    @worker.handler("start")
    async def start(ctx: Context) -> dict[str, Any]:
        seen_parents[ctx.node] = set(ctx.parents)
        return {"base": ctx.input["base"]}

    @worker.handler("square")
    def square(ctx: Context) -> int:  # a plain function: runs in the thread pool
        seen_parents[ctx.node] = set(ctx.parents)
        return (ctx.parents["start"]["base"] + int(ctx.node[1:])) ** 2

    @worker.handler("join")
    async def join(ctx: Context) -> int:
        seen_parents[ctx.node] = set(ctx.parents)
        return sum(ctx.parents.values())

    @worker.handler("left")
    async def left(ctx: Context) -> int:
        seen_parents[ctx.node] = set(ctx.parents)
        return ctx.parents["join"] + 1

    @worker.handler("right")
    async def right(ctx: Context) -> int:
        seen_parents[ctx.node] = set(ctx.parents)
        return ctx.parents["join"] * 2

    @worker.handler("end")
    async def end(ctx: Context) -> dict[str, Any]:
        seen_parents[ctx.node] = set(ctx.parents)
        return {"total": ctx.parents["left"] + ctx.parents["right"], "run": ctx.run_id}

    async with worker:
        run_id = await client.submit("dag", {"base": 10})
        result = await client.result(run_id, timeout=DEADLINE)
    joined = sum((10 + i) ** 2 for i in range(6))
    assert result == {"end": {"total": joined + 1 + joined * 2, "run": run_id}}
    assert seen_parents["start"] == set()
    assert seen_parents["join"] == set(fan)
    assert seen_parents["end"] == {"left", "right"}
    assert all(seen_parents[n] == {"start"} for n in fan)
    run = await client.get(run_id)
    assert len(run.steps) == 11
    assert {s.state for s in run.steps} == {"completed"}
    assert run.step("join").output == joined


async def test_one_slot_takes_available_steps_in_priority_order(server: Any, client: Client) -> None:
    priorities = [3, -1, 7, 0, 2, 5]
    for p in priorities:
        await client.enqueue("prio", {"p": p}, priority=p)
    order: list[int] = []
    worker = Worker(server.address, slots=1)

    @worker.handler("prio")
    async def prio(ctx: Context) -> None:
        order.append(ctx.input["p"])

    async with worker:
        await until(lambda: len(order) == len(priorities), what="every job")
    assert order == sorted(priorities)


async def test_retryable_failures_retry_and_snoozes_keep_the_attempt(server: Any, client: Client) -> None:
    flaky = await client.enqueue("flaky", backoff_initial=0.1)
    later = await client.enqueue("later")
    paced = await client.enqueue("paced", backoff_initial=600)  # RetryAfter overrides the backoff
    doomed = await client.enqueue("doomed", max_attempts=2, backoff_initial=0.1)
    attempts: Counter[str] = Counter()
    worker = Worker(server.address, slots=4)

    @worker.handler("flaky")
    async def flaky_handler(ctx: Context) -> dict[str, int]:
        attempts["flaky"] += 1
        if ctx.attempt == 1:
            raise ValueError("connection reset")
        return {"attempt": ctx.attempt}

    @worker.handler("later")
    def later_handler(ctx: Context) -> str:
        attempts["later"] += 1
        if attempts["later"] == 1:
            raise Snooze(0.2)
        return "done"

    @worker.handler("paced")
    async def paced_handler(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise RetryAfter(0.2, "rate limited")
        return ctx.attempt

    @worker.handler("doomed")
    async def doomed_handler(ctx: Context) -> None:
        raise RuntimeError(f"attempt {ctx.attempt} failed")

    async with worker:
        assert await client.result(flaky, timeout=DEADLINE) == {"flaky": {"attempt": 2}}
        assert await client.result(later, timeout=DEADLINE) == {"later": "done"}
        assert await client.result(paced, timeout=DEADLINE) == {"paced": 2}
        with pytest.raises(RunFailed):
            await client.result(doomed, timeout=DEADLINE)

    step = (await client.get(flaky)).steps[0]
    assert (step.attempt, step.snoozes) == (2, 0)
    assert [(e.attempt, e.error_kind, e.message) for e in step.errors] == [(1, "error", "ValueError: connection reset")]
    step = (await client.get(later)).steps[0]
    assert (step.attempt, step.snoozes, step.errors) == (1, 1, [])
    step = (await client.get(paced)).steps[0]
    assert step.attempt == 2 and step.errors[0].message == "rate limited"
    step = (await client.get(doomed)).steps[0]
    assert (step.state, step.error_kind, step.attempt) == ("discarded", "max_attempts", 2)
    assert step.errors[-1].message == "RuntimeError: attempt 2 failed"


async def test_a_permanent_failure_fails_the_run_fast_and_cancels_the_rest(server: Any, client: Client) -> None:
    await client.register(Workflow("checkout").task("charge").task("pack").task("ship", deps=["charge", "pack"]))
    pack_started, pack_cancelled = asyncio.Event(), asyncio.Event()
    worker = Worker(server.address, slots=2)

    @worker.handler("charge")
    async def charge(ctx: Context) -> None:
        await pack_started.wait()  # "pack" runs when the run fails: it is cancelled, not left available
        raise Permanent("card declined")

    @worker.handler("pack")
    async def pack(ctx: Context) -> None:
        pack_started.set()
        try:
            await asyncio.sleep(DEADLINE)  # far longer than the test may take
        finally:
            if ctx.is_cancelled():
                pack_cancelled.set()

    @worker.handler("ship")
    async def ship(ctx: Context) -> None:
        raise AssertionError("ship must never run")

    async with worker:
        run_id = await client.submit("checkout")
        with pytest.raises(RunFailed, match="charge: permanent card declined") as failed:
            await client.result(run_id, timeout=DEADLINE)
        await asyncio.wait_for(pack_cancelled.wait(), DEADLINE)
    run = failed.value.run
    charge_step = run.step("charge")
    assert (charge_step.state, charge_step.error_kind, charge_step.attempt) == ("discarded", "permanent", 1)
    assert (run.step("pack").state, run.step("pack").cancel_cause) == ("cancelled", "fail_fast")
    assert run.step("ship").state == "cancelled"


async def test_a_discard_contained_by_cancel_branch_lets_the_run_complete(server: Any, client: Client) -> None:
    await client.register(Workflow("report").task("main").task("extra")
                          .task("publish_extra", deps=["extra"], on_dep_failure=CancelBranch))
    worker = Worker(server.address, slots=2)

    @worker.handler("main")
    async def main(ctx: Context) -> str:
        return "numbers"

    @worker.handler("extra")
    async def extra(ctx: Context) -> None:
        raise Permanent("optional source is down")

    @worker.handler("publish_extra")
    async def publish_extra(ctx: Context) -> None:
        raise AssertionError("a cancelled branch must not run")

    async with worker:
        run_id = await client.submit("report")
        result = await client.result(run_id, timeout=DEADLINE)
    # types.proto says a branch-cancelled leaf is absent from the result; the engine keeps it as
    # null (tests/integration/test_failfast.py). Either way it holds no output.
    assert result["main"] == "numbers" and result.get("publish_extra") is None
    run = await client.get(run_id)
    assert run.state == "completed"
    assert (run.step("extra").state, run.step("extra").error_kind) == ("discarded", "permanent")
    assert (run.step("publish_extra").state, run.step("publish_extra").cancel_cause) == ("cancelled", "branch")


async def test_graceful_stop_lets_running_handlers_finish_and_delivers_their_results(
        server: Any, client: Client) -> None:
    slow = await client.enqueue("slow")
    started = asyncio.Event()
    worker = Worker(server.address, slots=2, grace=30)

    @worker.handler("slow")
    async def slow_handler(ctx: Context) -> str:
        started.set()
        await asyncio.sleep(1.0)
        return "finished"

    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), DEADLINE)
    worker.stop()
    # Submitted after stop(): the stopping worker must not run it.
    late = await client.enqueue("slow")
    await asyncio.wait_for(task, DEADLINE)
    assert worker.counts["applied"] >= 1
    assert (await client.get(slow)).steps[0].output == "finished"
    step = (await client.get(late)).steps[0]
    assert step.state == "available" and step.attempt == 1 and step.output is None


async def test_a_handler_raising_cancelled_error_itself_fails_the_attempt_instead_of_holding_the_lease(
        server: Any, client: Client) -> None:
    # Not a stop from the server and not the worker shutting down: an ordinary, retryable
    # failure, so the lease is answered and the step does not hang in running.
    calls: list[int] = []
    worker = Worker(server.address, slots=1)

    @worker.handler("flaky")
    async def flaky(ctx: Context) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise asyncio.CancelledError("an inner timeout leaked out")
        return "ok"

    async with worker:
        run_id = await client.enqueue("flaky", backoff_initial=0.05, backoff_max=0.1)
        result = await client.result(run_id, timeout=DEADLINE)
    assert result == {"flaky": "ok"}
    assert calls == [1, 2]
    step = (await client.get(run_id)).step("flaky")
    assert (step.attempt, step.errors[0].message) == (2, "RuntimeError: handler raised CancelledError an inner timeout leaked out")
