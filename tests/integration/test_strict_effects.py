"""Strict edges of the engine (DECISIONS 3b): the backoff's first delay, one status per result,
the effects of an action visible when its call returns, messages never refused for their text,
and the dispatcher's wake-up at the next due time."""

from __future__ import annotations

import collections
from datetime import datetime, timedelta, timezone

import pytest
from engine_helpers import claim_one, run_row, start, states, step, task

from cyclone_server.dispatch import Dispatcher, WorkerConn
from cyclone_server.engine import Engine, Result

pytestmark = pytest.mark.statemachine


async def test_the_first_retry_waits_backoff_initial_and_jitter_never_exceeds_backoff_max(conn) -> None:
    cur = await conn.execute(
        "SELECT n, extract(epoch FROM cyclone__backoff(interval '10 s', interval '25 s', n))::float8 AS s"
        "  FROM generate_series(1, 3) n, generate_series(1, 300)")
    delays: dict[int, list[float]] = {}
    for n, seconds in await cur.fetchall():
        delays.setdefault(n, []).append(seconds)
    assert 9.0 <= min(delays[1]) and max(delays[1]) <= 11.0  # after the 1st failure: initial, +-10%
    assert 18.0 <= min(delays[2]) and max(delays[2]) <= 22.0  # after the 2nd: 2 x initial
    assert 22.5 <= min(delays[3]) and max(delays[3]) <= 25.0  # 40 s capped: jitter stays under max
    assert max(delays[3]) == 25.0  # the cap itself is reached (jitter above it is cut, not dropped)


async def test_two_answers_to_one_lease_in_one_batch_get_applied_then_ended(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    sid, gen = str(lease["step_id"]), lease["lease_generation"]
    statuses = await engine.apply_results([Result(sid, gen, "completed", output=1),
                                           Result(sid, gen, "failed", message="late"),
                                           Result(sid, gen, "completed", output=2)])
    assert [s for _, _, s in statuses] == ["applied", "ended", "ended"]
    a = await step(conn, run_id, "a")
    assert (a["state"], a["output"], a["errors"]) == ("completed", 1, [])


async def test_a_failure_message_with_nul_is_stored_with_u_fffd(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=3), task("b", max_attempts=3)])
    la, lb = await claim_one(engine, "a"), await claim_one(engine, "b")
    assert await engine.fail(str(la["step_id"]), la["lease_generation"], "x\x00y") == "retried"
    statuses = await engine.apply_results([Result(str(lb["step_id"]), lb["lease_generation"], "failed",
                                                  message="\x00" + "m" * 70_000)])
    assert statuses[0][2] == "retried"
    assert (await step(conn, run_id, "a"))["errors"][-1]["message"] == "x\ufffdy"
    message = (await step(conn, run_id, "b"))["errors"][-1]["message"]
    assert message.startswith("\ufffdmmm") and message.endswith("[cut at 65536 of 70003 bytes]")  # U+FFFD: 3 bytes


async def test_cancelling_a_child_run_discards_its_parent_node_before_the_call_returns(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub")])
    child = str((await step(conn, run_id, "kid"))["child_run_id"])
    assert await engine.cancel_run(child)
    kid = await step(conn, run_id, "kid")
    assert (kid["state"], kid["reason"]) == ("discarded", "child_cancelled")
    assert (await run_row(conn, run_id))["state"] == "failed"


async def test_a_result_that_ends_a_child_run_settles_its_parent_nodes_up_the_tree_before_it_returns(
        engine: Engine, conn) -> None:
    await engine.register_workflow("leaf", [task("lt")])
    await engine.register_workflow("mid", [task("mk", type="child", workflow="leaf")])
    top = await start(engine, [task("tk", type="child", workflow="mid"), task("after", "tk")], name="top")
    lease = await claim_one(engine, "lt")
    [(_, _, status)] = await engine.apply_results([Result(str(lease["step_id"]), lease["lease_generation"],
                                                          "completed", output={"v": 1})])
    assert status == "applied"
    # No scanner ran: the leaf run's completion settled mid's node, which completed mid,
    # which settled top's node, whose dependent is now claimable.
    assert await states(conn, top) == {"tk": "completed", "after": "available"}
    assert (await step(conn, top, "tk"))["output"] == {"mk": {"lt": {"v": 1}}}


async def test_a_signal_that_completes_a_child_run_settles_its_parent_node(engine: Engine, conn) -> None:
    await engine.register_workflow("gate", [task("go", type="signal", signal="open")])
    top = await start(engine, [task("kid", type="child", workflow="gate")], name="top")
    child = str((await step(conn, top, "kid"))["child_run_id"])
    await engine.signal(child, "open", {"by": "ada"})
    assert (await run_row(conn, top))["state"] == "completed"


async def test_the_dispatcher_sleeps_until_the_next_due_step_and_not_at_all_when_none_is(engine: Engine) -> None:
    conn = WorkerConn(worker_id="w1", kinds=["later", "other"], slots=4)
    stats = {"claims": collections.Counter()}
    dispatcher = Dispatcher(engine, lambda: [conn], lease_ttl=30, stats=stats)
    assert await dispatcher._pass() is None  # nothing available, nothing due: no timer at all
    await engine.enqueue("later", scheduled_at=datetime.now(timezone.utc) + timedelta(seconds=5))
    await engine.enqueue("other", scheduled_at=datetime.now(timezone.utc) + timedelta(seconds=2))
    due = await dispatcher._pass()
    assert due is not None and 1.0 < due <= 2.0  # the sooner of the two kinds
    assert not conn.held
    await engine.enqueue("other")
    assert await dispatcher._pass() == pytest.approx(due, abs=1.0) and len(conn.held) == 1
    # A worker without free slots asks for nothing.
    conn.slots = 1
    assert await dispatcher._pass() is None
