"""Wait nodes: child runs, durable timers, signals, max_wait and the run deadline."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from engine_helpers import (claim_one, db_now, discard, fetch, finish, run_row, start, states, step, steps,
                            sweep_until_run, task, violations)

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition

pytestmark = pytest.mark.statemachine

CB = {"on_dep_failure": "cancel_branch"}


async def discard_all(engine: Engine, kind: str, count: int) -> None:
    leases = await engine.claim("w", [kind], 100, 30)
    assert len(leases) == count
    for lease in leases:
        await engine.fail(str(lease["step_id"]), lease["lease_generation"], "no", permanent=True)


async def child_of(conn, run_id: str, node: str) -> str:
    return str((await step(conn, run_id, node))["child_run_id"])


async def test_child_node_starts_its_child_run_in_the_same_transaction(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("a"), task("kid", "a", type="child", workflow="sub")], input={"day": 1})
    assert (await step(conn, run_id, "kid"))["child_run_id"] is None
    await finish(engine, "a", {"rows": 2})
    s = await steps(conn, run_id)
    assert s["kid"]["state"] == "waiting_child"
    child = await run_row(conn, str(s["kid"]["child_run_id"]))
    assert (child["state"], child["workflow_name"], child["depth"]) == ("running", "sub", 1)
    assert (str(child["parent_run_id"]), child["parent_step_id"]) == (run_id, s["kid"]["id"])
    assert child["input"] == {"input": {"day": 1}, "parents": {"a": {"rows": 2}}}
    assert child["created_at"] == s["a"]["finished_at"]  # one transaction
    lease = await claim_one(engine, "ct")
    assert lease["input"] == {"input": {"day": 1}, "parents": {"a": {"rows": 2}}}


async def test_child_completion_ends_the_node_in_a_later_transaction(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub"), task("after", "kid")])
    child = await child_of(conn, run_id, "kid")
    await finish(engine, "ct", {"n": 7})
    assert (await run_row(conn, child))["state"] == "completed"
    # As after a crash between the two commits: nothing ended the node yet. The scanner does.
    assert (await step(conn, run_id, "kid"))["state"] == "waiting_child"
    assert await engine.settle_children() == 1
    s = await steps(conn, run_id)
    assert (s["kid"]["state"], s["kid"]["output"]) == ("completed", {"ct": {"n": 7}})
    assert s["after"]["state"] == "available"
    await finish(engine, "after", "done")
    assert (await run_row(conn, run_id))["result"] == {"after": "done"}


@pytest.mark.parametrize("how", ["failed", "cancelled"])
async def test_child_failed_or_cancelled_discards_the_node_then_on_dep_failure(engine: Engine, conn, how: str) -> None:
    await engine.register_workflow("sub", [task("ct")])
    failing = await start(engine, [task("kid", type="child", workflow="sub"), task("n", "kid"), task("o")])
    contained = await start(engine, [task("kid", type="child", workflow="sub"), task("n", "kid", **CB)],
                            name="wf2")
    if how == "failed":
        await discard_all(engine, "ct", 2)
    else:
        for run_id in (failing, contained):
            await engine.cancel_run(await child_of(conn, run_id, "kid"))
    await engine.sweep()
    for run_id in (failing, contained):
        kid = await step(conn, run_id, "kid")
        assert (kid["state"], kid["error_kind"], kid["reason"]) == ("discarded", "permanent", f"child_{how}")
    assert await states(conn, failing) == {"kid": "discarded", "n": "cancelled", "o": "cancelled"}
    assert (await run_row(conn, failing))["state"] == "failed"
    assert (await run_row(conn, contained))["state"] == "completed"


async def test_max_wait_discards_the_child_node_and_cancels_its_child_run(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub", max_wait=30)])
    kid = await step(conn, run_id, "kid")
    assert kid["max_wait_at"] - kid["wait_started_at"] == pytest.approx(timedelta(seconds=30), abs=timedelta(seconds=1))
    await engine.sweep()
    assert (await step(conn, run_id, "kid"))["state"] == "waiting_child"  # not due yet
    await conn.execute("UPDATE cyclone_steps SET max_wait_at = now() - interval '1s' WHERE id = %s", (kid["id"],))
    await engine.sweep()
    kid = await step(conn, run_id, "kid")
    assert (kid["state"], kid["error_kind"], kid["reason"]) == ("discarded", "permanent", "max_wait")
    assert (await run_row(conn, str(kid["child_run_id"])))["state"] == "cancelled"
    assert (await run_row(conn, run_id))["state"] == "failed"


async def test_retry_of_a_child_node_reuses_its_child_run(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub", max_wait=60), task("b")])
    child = await child_of(conn, run_id, "kid")
    # Failed child run: the retried node reopens it and waits again.
    await discard(engine, "ct")
    await engine.sweep()
    assert (await run_row(conn, run_id))["state"] == "failed"
    await engine.retry(run_id, "kid")
    # Retry: discarded -> pending (the table's row) and, in the same transaction, the node
    # starts waiting on its child run again, which is reopened (docs/lifecycle.md, "Reopened child runs"): no scanner pass.
    assert await states(conn, run_id) == {"kid": "waiting_child", "b": "available"}
    assert (await run_row(conn, run_id))["state"] == "running"
    assert (await child_of(conn, run_id, "kid"), (await run_row(conn, child))["state"]) == (child, "running")
    assert (await step(conn, child, "ct"))["state"] == "available"
    # Cancelled child run (max_wait): a new child run, at once.
    await conn.execute("UPDATE cyclone_steps SET max_wait_at = now() WHERE node = 'kid'")
    await engine.sweep()
    assert (await run_row(conn, child))["state"] == "cancelled"
    await engine.retry(run_id, "kid")
    second = await child_of(conn, run_id, "kid")
    assert second != child and (await run_row(conn, second))["state"] == "running"
    # Completed child run whose node was cancelled before it settled: the node takes its result.
    await finish(engine, "ct", "from-second")
    await discard(engine, "b")  # fail-fast cancels kid before the scanner saw its child run end
    assert await states(conn, run_id) == {"kid": "cancelled", "b": "discarded"}
    await engine.retry(run_id, "b")
    # Reopened, it takes its completed child run's result in the Retry's transaction.
    kid = await step(conn, run_id, "kid")
    assert (kid["state"], kid["output"], str(kid["child_run_id"])) == ("completed", {"ct": "from-second"}, second)


async def test_three_nested_levels_complete_and_a_bottom_failure_fails_the_top(engine: Engine, conn) -> None:
    await engine.register_workflow("leaf", [task("lt")])
    await engine.register_workflow("mid", [task("mk", type="child", workflow="leaf")])
    ok = await start(engine, [task("tk", type="child", workflow="mid")], name="top")
    await finish(engine, "lt", 1)
    run = await sweep_until_run(engine, conn, ok, "completed")
    assert run["result"] == {"tk": {"mk": {"lt": 1}}}
    bad = await start(engine, [task("tk", type="child", workflow="mid"), task("x")], name="top")
    held = await start(engine, [task("tk", type="child", workflow="mid"), task("x2"), task("n", "tk", **CB)],
                       name="top2")
    await discard_all(engine, "lt", 2)
    await sweep_until_run(engine, conn, bad, "failed")
    assert await states(conn, bad) == {"tk": "discarded", "x": "cancelled"}
    await finish(engine, "x2", 2)
    run = await sweep_until_run(engine, conn, held, "completed")
    assert run["result"] == {"x2": 2, "n": None}
    assert await violations(conn) == {}


async def test_sleep_node_completes_with_fired_at_when_due(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("nap", "a", type="sleep", sleep=300)])
    await finish(engine, "a")
    nap = await step(conn, run_id, "nap")
    assert nap["state"] == "waiting_timer"
    assert nap["timer_at"] - nap["wait_started_at"] == pytest.approx(timedelta(seconds=300), abs=timedelta(seconds=1))
    await engine.sweep()
    assert (await step(conn, run_id, "nap"))["state"] == "waiting_timer"
    await conn.execute("UPDATE cyclone_steps SET timer_at = now() - interval '1s' WHERE id = %s", (nap["id"],))
    t0 = await db_now(conn)
    assert (await engine.sweep())["timers_fire"] == 1
    nap = await step(conn, run_id, "nap")
    assert nap["state"] == "completed"
    assert t0 <= datetime.fromisoformat(nap["output"]["fired_at"]) <= await db_now(conn)
    assert (await run_row(conn, run_id))["state"] == "completed"


async def test_max_wait_discards_timer_and_signal_waits(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("nap", type="sleep", sleep=600, max_wait=60),
                                  task("go", type="signal", max_wait=60), task("n", "nap", "go", **CB)])
    await conn.execute("UPDATE cyclone_steps SET max_wait_at = now() - interval '1s' WHERE run_id = %s", (run_id,))
    assert (await engine.sweep())["waits_expire"] == 2
    s = await steps(conn, run_id)
    for n in ("nap", "go"):
        assert (s[n]["state"], s[n]["error_kind"], s[n]["reason"]) == ("discarded", "permanent", "max_wait")
    assert (s["n"]["state"], s["n"]["cancel_cause"]) == ("cancelled", "branch")
    assert (await run_row(conn, run_id))["state"] == "completed"  # both discards were contained


async def test_signal_stored_before_the_node_waits_is_consumed_when_it_starts_waiting(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("go", "a", type="signal")])
    first, consumer = await engine.signal(run_id, "go", {"n": 1})
    assert consumer is None
    await engine.signal(run_id, "go", {"n": 2})
    await finish(engine, "a")
    go = await step(conn, run_id, "go")
    assert (go["state"], go["output"]) == ("completed", {"n": 1})  # the oldest signal
    rows = await fetch(conn, "SELECT id, consumed_by FROM cyclone_signals ORDER BY created_at")
    assert [(str(r["id"]), r["consumed_by"]) for r in rows] == [(first, go["id"]), (str(rows[1]["id"]), None)]
    assert (await run_row(conn, run_id))["state"] == "completed"
    with pytest.raises(FailedPrecondition, match="is completed"):
        await engine.signal(run_id, "go", 3)


async def test_signal_goes_to_the_node_that_started_waiting_first_and_once(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("s_a", "x", type="signal", signal="go"),
                                  task("s_b", type="signal", signal="go")])
    await finish(engine, "x")  # s_a starts waiting after s_b, though its id sorts first
    _, consumer = await engine.signal(run_id, "go", "one")
    assert consumer == str((await step(conn, run_id, "s_b"))["id"])
    assert await states(conn, run_id) == {"x": "completed", "s_a": "waiting_signal", "s_b": "completed"}
    await engine.signal(run_id, "other", "ignored")
    assert (await step(conn, run_id, "s_a"))["state"] == "waiting_signal"
    await engine.signal(run_id, "go", "two")
    assert (await step(conn, run_id, "s_a"))["output"] == "two"


async def test_deadline_fails_the_run_whatever_cancel_branch_says(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("t"), task("p", "t", **CB), task("sig", type="signal"),
                                  task("kid", type="child", workflow="sub"), task("n", "sig", **CB)],
                         deadline=await db_now(conn) + timedelta(hours=1))
    lease = await claim_one(engine, "t")
    await engine.sweep()
    assert (await run_row(conn, run_id))["state"] == "running"
    await conn.execute("UPDATE cyclone_runs SET deadline_at = now() - interval '1s' WHERE id = %s", (run_id,))
    assert (await engine.sweep())["deadlines_expire"] == 1
    run = await run_row(conn, run_id)
    assert (run["state"], run["failed_by_deadline"]) == ("failed", True)
    s = await steps(conn, run_id)
    for n in ("sig", "kid"):
        assert (s[n]["state"], s[n]["error_kind"], s[n]["reason"]) == ("discarded", "permanent", "deadline")
    for n in ("t", "p", "n"):
        assert (s[n]["state"], s[n]["cancel_cause"]) == ("cancelled", "deadline")
    assert (await run_row(conn, str(s["kid"]["child_run_id"])))["state"] == "cancelled"
    assert await engine.complete(lease["step_id"], lease["lease_generation"], 1) == "ended"
