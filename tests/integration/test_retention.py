"""Retention and purge: which terminal runs go, when, how many at a time, and what goes with them."""

from __future__ import annotations

import pytest
from engine_helpers import claim_one, fetch, fetch_one, finish, start, step, task

from cyclone_server.store.engine import Engine

pytestmark = pytest.mark.statemachine

DAY = 86400.0


async def age(conn, run_id: str, seconds: float) -> None:
    """Make the run look as if it ended (or, when active, was created) `seconds` ago."""
    await conn.execute("UPDATE cyclone_runs SET created_at = created_at - make_interval(secs => %s), "
                       "finished_at = finished_at - make_interval(secs => %s) WHERE id = %s",
                       (seconds, seconds, run_id))


async def run_ids(conn) -> set[str]:
    return {str(r["id"]) for r in await fetch(conn, "SELECT id FROM cyclone_runs")}


async def test_only_terminal_runs_past_the_age_are_deleted(engine: Engine, conn) -> None:
    completed, _, _ = await engine.enqueue("a")
    await finish(engine, "a")
    failed, _, _ = await engine.enqueue("b")
    lease = await claim_one(engine, "b")
    await engine.fail(lease["step_id"], 1, "x", permanent=True)
    cancelled, _, _ = await engine.enqueue("c")
    await engine.cancel_run(cancelled)
    running, _, _ = await engine.enqueue("d")
    paused, _, _ = await engine.enqueue("e")
    await engine.pause_run(paused)
    recent, _, _ = await engine.enqueue("f")
    await finish(engine, "f")
    for run_id in (completed, failed, cancelled, running, paused):
        await age(conn, run_id, 10 * DAY)
    assert await engine.purge_count(DAY) == 3  # the dry run counts what the purge then deletes
    assert await engine.purge(DAY) == 3
    assert await run_ids(conn) == {running, paused, recent}
    assert await engine.purge(None) == 0  # no default age: only runs with a retention of their own


async def test_the_largest_node_retention_wins_over_the_default_age(engine: Engine, conn) -> None:
    short = await start(engine, [task("s1", retention=60), task("s2")], name="short")
    long = await start(engine, [task("l1", retention=60), task("l2", retention=7200)], name="long")
    plain = await start(engine, [task("p")], name="plain")
    for n in ("s1", "s2", "l1", "l2", "p"):
        await finish(engine, n)
    for run_id in (short, long, plain):
        await age(conn, run_id, 3600)
    assert (await fetch_one(conn, "SELECT extract(epoch FROM retention) AS r FROM cyclone_runs WHERE id = %s",
                            long))["r"] == 7200
    assert await engine.purge(None) == 1  # short: 60 s after finishing
    assert await run_ids(conn) == {long, plain}
    assert await engine.purge_count(10) == 1
    assert await engine.purge(10) == 1  # plain: the default age; long keeps its own 2 h
    assert await run_ids(conn) == {long}
    await age(conn, long, 3601)
    assert await engine.purge(None) == 1


async def test_purge_is_bounded_by_its_limit_oldest_first(engine: Engine, conn) -> None:
    runs = []
    for i in range(5):
        run_id, _, _ = await engine.enqueue("k")
        await finish(engine, "k")
        await age(conn, run_id, DAY + i)
        runs.append(run_id)
    assert await engine.purge_count(60) == 5  # every batch together
    assert await engine.purge(60, limit=2) == 2
    assert await run_ids(conn) == set(runs[:3])
    assert [await engine.purge(60, limit=2) for _ in range(3)] == [2, 1, 0]


async def test_terminal_child_run_stays_while_its_parent_is_unfinished(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    parent = await start(engine, [task("kid", type="child", workflow="sub"), task("other")])
    child = str((await step(conn, parent, "kid"))["child_run_id"])
    await finish(engine, "ct")
    await engine.sweep()
    await age(conn, child, 10 * DAY)
    assert await engine.purge_count(60) == 0
    assert await engine.purge(60) == 0  # the parent still runs: a retry could reuse the result
    lease = await claim_one(engine, "other")
    await engine.fail(lease["step_id"], 1, "x", permanent=True)
    assert await engine.purge(60) == 0  # failed parent: Retry could still need the child's result
    await engine.retry(parent)
    await finish(engine, "other")
    assert await engine.purge_count(60) == 1
    assert await engine.purge(60) == 1  # the parent completed
    assert await run_ids(conn) == {parent}


async def test_deleting_a_run_deletes_its_steps_edges_signals_and_child_runs(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    parent = await start(engine, [task("a"), task("b", "a"), task("kid", type="child", workflow="sub"),
                                  task("sig", type="signal")])
    await engine.signal(parent, "sig", 1)
    await engine.signal(parent, "unused", 2)
    await engine.cancel_run(parent)
    await age(conn, parent, 10 * DAY)
    counts = "SELECT (SELECT count(*) FROM cyclone_runs) AS runs, (SELECT count(*) FROM cyclone_steps) AS steps, " \
             "(SELECT count(*) FROM cyclone_step_deps) AS deps, (SELECT count(*) FROM cyclone_signals) AS signals"
    assert await fetch_one(conn, counts) == {"runs": 2, "steps": 5, "deps": 1, "signals": 2}
    assert await engine.purge(DAY) == 1
    assert await fetch_one(conn, counts) == {"runs": 0, "steps": 0, "deps": 0, "signals": 0}
