"""Pause and Resume: one test per sentence of "Paused" and "Paused run"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from engine_helpers import (claim_one, close_to, db_now, expire_lease, finish, run_row, snapshot, start, states,
                            step, steps, task, violations)

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition

pytestmark = pytest.mark.statemachine

WAITS = [task("avail"), task("sig", type="signal", max_wait=900), task("nap", type="sleep", sleep=600),
         task("kid", type="child", workflow="sub", max_wait=900)]


async def test_pause_moves_available_and_waiting_steps_only(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, WAITS + [task("done"), task("run"), task("pend", "run")])
    await finish(engine, "done")
    await claim_one(engine, "run")
    assert await engine.pause_run(run_id) is True
    assert await states(conn, run_id) == {"avail": "paused", "sig": "paused", "nap": "paused", "kid": "paused",
                                         "done": "completed", "run": "running", "pend": "pending"}
    run = await run_row(conn, run_id)
    assert run["state"] == "paused" and run["paused_at"] is not None
    assert await engine.claim("w", ["avail", "pend"], 10, 30) == []  # the claim never reads paused


async def test_resume_moves_each_paused_step_back_to_the_state_of_its_kind(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, WAITS)
    before = await states(conn, run_id)
    await engine.pause_run(run_id)
    assert await engine.resume_run(run_id) is True
    assert await states(conn, run_id) == before == {"avail": "available", "sig": "waiting_signal",
                                                    "nap": "waiting_timer", "kid": "waiting_child"}
    run = await run_row(conn, run_id)
    assert (run["state"], run["paused_at"]) == ("running", None)


async def test_timers_max_wait_and_deadline_stop_and_keep_the_time_left(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, WAITS, deadline=await db_now(conn) + timedelta(seconds=3600))
    await engine.pause_run(run_id)
    # Two hours pass while paused: every timer would be long overdue if it had kept running.
    await conn.execute("UPDATE cyclone_steps SET timer_at = timer_at - interval '2h', "
                       "max_wait_at = max_wait_at - interval '2h' WHERE run_id = %s", (run_id,))
    await conn.execute("UPDATE cyclone_runs SET deadline_at = deadline_at - interval '2h' WHERE id = %s", (run_id,))
    await engine.sweep()
    assert set((await states(conn, run_id)).values()) == {"paused"}  # no wait completes
    assert (await run_row(conn, run_id))["state"] == "paused"
    await engine.resume_run(run_id)
    now = await db_now(conn)
    s = await steps(conn, run_id)
    assert close_to(s["nap"]["timer_at"], now + timedelta(seconds=600), 5)
    assert close_to(s["kid"]["max_wait_at"], now + timedelta(seconds=900), 5)
    assert close_to(s["sig"]["max_wait_at"], now + timedelta(seconds=900), 5)
    assert close_to((await run_row(conn, run_id))["deadline_at"], now + timedelta(seconds=3600), 5)
    await engine.sweep()
    assert await states(conn, run_id) == {"avail": "available", "sig": "waiting_signal", "nap": "waiting_timer",
                                         "kid": "waiting_child"}


async def test_pause_and_resume_give_no_deadline_to_a_run_without_one(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    await engine.pause_run(run_id)
    assert (await run_row(conn, run_id))["deadline_left"] is None
    await engine.resume_run(run_id)
    await engine.sweep()
    run = await run_row(conn, run_id)
    assert (run["state"], run["deadline_at"], run["failed_by_deadline"]) == ("running", None, False)


async def test_no_pending_step_becomes_claimable_and_resume_promotes_it(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a"), task("c")])
    lease = await claim_one(engine, "a")
    await engine.pause_run(run_id)
    await engine.complete(lease["step_id"], lease["lease_generation"], 1)
    assert await states(conn, run_id) == {"a": "completed", "b": "pending", "c": "paused"}
    assert await engine.claim("w", ["b", "c"], 10, 30) == []
    await engine.resume_run(run_id)
    assert await states(conn, run_id) == {"a": "completed", "b": "available", "c": "available"}


async def test_running_step_keeps_its_lease_and_attempt_timeout(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=3), task("b")])
    lease = await claim_one(engine, "a", ttl=30)
    before = await step(conn, run_id, "a")
    await engine.pause_run(run_id)
    assert await step(conn, run_id, "a") == before
    assert await engine.renew("w1", [(str(lease["step_id"]), 1)], 60) == []
    await conn.execute("UPDATE cyclone_steps SET attempt_deadline = now() - interval '1s' WHERE node = 'a'")
    assert (await engine.sweep())["attempts_timeout"] == 1
    a = await step(conn, run_id, "a")
    assert (a["state"], a["attempt"], a["errors"][-1]["error_kind"]) == ("paused", 2, "timeout")


async def test_failure_snooze_and_reclaim_during_the_pause_go_to_paused(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("f", max_attempts=3), task("s"), task("r")])
    lf = await claim_one(engine, "f")
    ls = await claim_one(engine, "s")
    lr = await claim_one(engine, "r")
    await engine.pause_run(run_id)
    assert await engine.fail(lf["step_id"], 1, "boom") == "retried"
    assert await engine.snooze(ls["step_id"], 1, 0) == "snoozed"
    await expire_lease(conn, lr["step_id"])
    assert (await engine.sweep())["leases_sweep"] == 1
    s = await steps(conn, run_id)
    assert {n: (r["state"], r["attempt"], r["snoozes"], r["reclaims"]) for n, r in s.items()} == {
        "f": ("paused", 2, 0, 0), "s": ("paused", 1, 1, 0), "r": ("paused", 1, 0, 1)}
    assert await engine.claim("w", ["s", "r"], 10, 30) == []
    await engine.resume_run(run_id)
    assert await states(conn, run_id) == {"f": "available", "s": "available", "r": "available"}


async def test_step_running_at_the_pause_completes_the_run(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    await engine.pause_run(run_id)
    await engine.complete(lease["step_id"], lease["lease_generation"], "out")
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"], run["paused_at"]) == ("completed", {"a": "out"}, None)


async def test_step_running_at_the_pause_fails_the_run_and_cancels_paused_and_pending(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a"), task("c"), task("w", type="signal")])
    lease = await claim_one(engine, "a")
    await engine.pause_run(run_id)
    await engine.fail(lease["step_id"], lease["lease_generation"], "bad", permanent=True)
    s = await steps(conn, run_id)
    assert {n: r["state"] for n, r in s.items()} == {"a": "discarded", "b": "cancelled", "c": "cancelled",
                                                    "w": "cancelled"}
    assert {s[n]["cancel_cause"] for n in "bcw"} == {"fail_fast"}
    run = await run_row(conn, run_id)
    assert (run["state"], run["paused_at"]) == ("failed", None)


async def test_signal_during_the_pause_is_delivered_only_after_resume(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("go", type="signal")])
    await engine.pause_run(run_id)
    _, consumer = await engine.signal(run_id, "go", {"ok": True})
    assert consumer is None and (await step(conn, run_id, "go"))["state"] == "paused"
    await engine.resume_run(run_id)
    go = await step(conn, run_id, "go")
    assert (go["state"], go["output"]) == ("completed", {"ok": True})
    assert (await run_row(conn, run_id))["state"] == "completed"


async def test_pause_does_not_pause_child_runs_and_the_node_moves_only_at_resume(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub")])
    child = str((await step(conn, run_id, "kid"))["child_run_id"])
    await engine.pause_run(run_id)
    assert (await run_row(conn, child))["state"] == "running"
    await finish(engine, "ct", 5)  # the child run works on
    assert (await run_row(conn, child))["state"] == "completed"
    await engine.sweep()
    assert (await step(conn, run_id, "kid"))["state"] == "paused"
    await engine.resume_run(run_id)
    kid = await step(conn, run_id, "kid")
    assert (kid["state"], kid["output"]) == ("completed", {"ct": 5})
    assert (await run_row(conn, run_id))["state"] == "completed"
    assert await violations(conn) == {}


async def test_pause_and_resume_idempotence_and_refusals(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b")])
    with pytest.raises(FailedPrecondition, match="only a paused run can be resumed"):
        await engine.resume_run(run_id)
    await engine.pause_run(run_id)
    before = await snapshot(conn)
    assert await engine.pause_run(run_id) is False
    assert await snapshot(conn) == before
    await engine.cancel_run(run_id)
    for action in (engine.pause_run, engine.resume_run):
        with pytest.raises(FailedPrecondition, match="is cancelled"):
            await action(run_id)
