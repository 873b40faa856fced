"""Retry and RetryAll (docs/lifecycle.md, "Retry and RetryAll"): what reopens, with which counters, and when it is refused."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg
import pytest
from engine_helpers import (claim_one, db_now, discard, expire_lease, fetch, finish, make_due, run_row, snapshot,
                            start, states, step, steps, task, violations)

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition

pytestmark = pytest.mark.statemachine

CB = {"on_dep_failure": "cancel_branch"}


async def test_retry_of_a_failed_run_reopens_the_discard_and_what_it_cancelled(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=2), task("b", "a"), task("c", max_attempts=5)])
    # c: one failed attempt and one reclaim, then running when the run fails.
    lease = await claim_one(engine, "c")
    await engine.fail(lease["step_id"], 1, "c1")
    await make_due(conn, run_id)
    lease = await claim_one(engine, "c")
    await expire_lease(conn, lease["step_id"])
    await engine.sweep()
    late = await claim_one(engine, "c")
    # a: discarded on its last attempt.
    for msg in ("a1", "a2"):
        lease = await claim_one(engine, "a")
        await engine.fail(lease["step_id"], lease["lease_generation"], msg)
        await make_due(conn, run_id)
    assert await states(conn, run_id) == {"a": "discarded", "b": "cancelled", "c": "cancelled"}
    assert (await run_row(conn, run_id))["state"] == "failed"

    assert await engine.retry(run_id, "a") is True
    s = await steps(conn, run_id)
    a, b, c = s["a"], s["b"], s["c"]
    assert (a["state"], a["attempt"], a["reclaims"], a["error_kind"], a["finished_at"]) == ("available", 1, 0, None,
                                                                                           None)
    assert [e["message"] for e in a["errors"]] == ["a1", "a2"]  # the error history stays
    assert (b["state"], b["cancel_cause"], b["cancelled_by"]) == ("pending", None, None)
    assert (c["state"], c["attempt"], c["reclaims"]) == ("available", 2, 1)  # kept
    run = await run_row(conn, run_id)
    assert (run["state"], run["finished_at"], run["failed_by_step"], run["result"]) == ("running", None, None, None)
    assert await engine.complete(late["step_id"], late["lease_generation"], "late") == "ended"

    for n in "acb":
        await finish(engine, n, n)
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"]) == ("completed", {"b": "b", "c": "c"})
    assert await violations(conn) == {}


async def test_retry_all_reopens_every_discard_of_a_running_run(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("y", "x", **CB), task("p"), task("q", "p", **CB), task("z")])
    await discard(engine, "x")
    await discard(engine, "p")
    assert await states(conn, run_id) == {"x": "discarded", "y": "cancelled", "p": "discarded", "q": "cancelled",
                                         "z": "available"}
    assert await engine.retry(run_id) is True
    assert await states(conn, run_id) == {"x": "available", "y": "pending", "p": "available", "q": "pending",
                                         "z": "available"}
    for n in "xpyqz":
        await finish(engine, n, n)
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"]) == ("completed", {"y": "y", "q": "q", "z": "z"})


async def test_retry_of_one_node_reopens_only_what_that_discard_cancelled(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("y", "x", **CB), task("p"), task("q", "p", **CB), task("z")])
    await discard(engine, "x")
    await discard(engine, "p")
    await engine.retry(run_id, "x")
    assert await states(conn, run_id) == {"x": "available", "y": "pending", "p": "discarded", "q": "cancelled",
                                         "z": "available"}


async def test_retry_refused_on_completed_and_cancelled_runs(engine: Engine, conn) -> None:
    done = await start(engine, [task("x"), task("y", "x", **CB), task("z")])
    await discard(engine, "x")
    await finish(engine, "z")
    assert (await run_row(conn, done))["state"] == "completed"
    gone = await start(engine, [task("x2"), task("y2", "x2", **CB), task("z2")], name="wf2")
    await discard(engine, "x2")
    await engine.cancel_run(gone)  # z2 cancelled by the operator: it never reopens
    before = await snapshot(conn)
    for run_id, state in ((done, "completed"), (gone, "cancelled")):
        for node in ("x", "x2", None):
            with pytest.raises(FailedPrecondition, match=f"is {state}"):
                await engine.retry(run_id, node)
    assert await snapshot(conn) == before


async def test_retry_of_another_discard_than_the_one_that_failed_the_run_is_refused(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("y", "x", **CB), task("f")])
    await discard(engine, "x")
    await discard(engine, "f")
    with pytest.raises(FailedPrecondition, match='node "f" was discarded'):
        await engine.retry(run_id, "x")
    await engine.retry(run_id)
    assert await states(conn, run_id) == {"x": "available", "y": "pending", "f": "available"}


async def test_retry_in_a_paused_run_reopens_to_paused(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("y", "x", **CB), task("z")])
    await discard(engine, "x")
    lz = await claim_one(engine, "z")
    await engine.pause_run(run_id)
    assert await engine.retry(run_id, "x") is True
    assert await states(conn, run_id) == {"x": "paused", "y": "pending", "z": "running"}
    assert (await run_row(conn, run_id))["state"] == "paused"
    assert await engine.claim("w", ["x"], 10, 30) == []
    await engine.complete(lz["step_id"], lz["lease_generation"], "z")
    assert (await run_row(conn, run_id))["state"] == "paused"  # x and y remain
    await engine.resume_run(run_id)
    assert await states(conn, run_id) == {"x": "available", "y": "pending", "z": "completed"}
    await finish(engine, "x")
    await finish(engine, "y", "y")
    assert (await run_row(conn, run_id))["result"] == {"y": "y", "z": "z"}


async def test_retried_wait_node_waits_again_with_a_fresh_max_wait(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("w", type="signal", max_wait=60), task("n", "w", **CB), task("z")])
    await conn.execute("UPDATE cyclone_steps SET max_wait_at = now() - interval '1s' WHERE node = 'w'")
    await engine.sweep()
    w = await step(conn, run_id, "w")
    assert (w["state"], w["error_kind"], w["reason"]) == ("discarded", "permanent", "max_wait")
    t0 = await db_now(conn)
    await engine.retry(run_id, "w")
    w = await step(conn, run_id, "w")
    assert w["state"] == "waiting_signal"
    assert t0 + timedelta(seconds=59) <= w["max_wait_at"] <= await db_now(conn) + timedelta(seconds=60)
    _, consumer = await engine.signal(run_id, "w", {"ok": 1})
    assert consumer == str(w["id"])
    assert await states(conn, run_id) == {"w": "completed", "n": "available", "z": "available"}


async def test_run_failed_by_its_deadline_retries_only_with_a_new_deadline(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a"), task("w", type="signal"), task("t")],
                         deadline=await db_now(conn) + timedelta(hours=1))
    await finish(engine, "a", 1)
    await claim_one(engine, "t")
    await conn.execute("UPDATE cyclone_runs SET deadline_at = now() - interval '1s' WHERE id = %s", (run_id,))
    await engine.sweep()
    run = await run_row(conn, run_id)
    assert (run["state"], run["failed_by_deadline"]) == ("failed", True)
    before = await snapshot(conn)
    with pytest.raises(FailedPrecondition, match="new deadline"):
        await engine.retry(run_id)
    assert await snapshot(conn) == before
    new_deadline = await db_now(conn) + timedelta(hours=2)
    assert await engine.retry(run_id, deadline=new_deadline) is True
    run = await run_row(conn, run_id)
    assert (run["state"], run["deadline_at"], run["failed_by_deadline"]) == ("running", new_deadline, False)
    s = await steps(conn, run_id)
    assert {n: r["state"] for n, r in s.items()} == {"a": "completed", "b": "available", "w": "waiting_signal",
                                                    "t": "available"}
    assert s["w"]["attempt"] == 1 and s["w"]["errors"][-1]["reason"] == "deadline"


async def test_an_actions_answer_shows_the_run_as_the_action_left_it_not_as_a_later_transaction_did(
        engine: Engine, conn, db_url: str) -> None:
    """RunActionResponse.run is read in the action's transaction. Read after its commit, a
    Retry's answer could show a run that a fast worker had already completed (seen in CI).
    Here the pause of another session Y waits for the run behind the retry: it pauses the
    run as soon as the retry commits (Y does not wait for its own commit to be flushed),
    most often before a read made after the retry's commit would see the run; six rounds
    make that all but certain. Read in the retry's transaction, the answer is always right."""
    async def waiting(query: str) -> None:
        deadline = time.monotonic() + 30
        while not await fetch(conn, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND query LIKE %s", f"%{query}%"):
            assert time.monotonic() < deadline, f"{query} never waited for the run's lock"
            await asyncio.sleep(0.02)

    async with await psycopg.AsyncConnection.connect(db_url) as x, \
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as y:
        await y.execute("SET synchronous_commit = off")
        for _ in range(6):
            run_id = await start(engine, [task("a")])
            await discard(engine, "a")
            assert (await run_row(conn, run_id))["state"] == "failed"
            await x.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR NO KEY UPDATE", (run_id,))
            retry = asyncio.create_task(engine.act("retry", run_id, node="a"))
            await waiting("cyclone_run_retry")
            pause = asyncio.create_task(y.execute("SELECT cyclone_run_pause(%s)", (run_id,)))
            await waiting("cyclone_run_pause")
            await x.commit()
            await asyncio.wait_for(pause, 30)
            applied, run = await asyncio.wait_for(retry, 30)
            assert applied
            assert (run["state"], [(s["node"], s["state"]) for s in run["steps"]]) == (
                "running", [("a", "available")])
            assert await states(conn, run_id) == {"a": "paused"}
