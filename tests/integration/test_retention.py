"""Retention and purge: which terminal runs go, when, how many at a time, and what goes with them."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import (claim_one, eventually, fetch, fetch_one, finish, lock_waits_are, start, step, task,
                            violations)

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


async def nested(engine: Engine, conn) -> tuple[str, set[str]]:
    """A cancelled run with a child run that has a child run of its own, each with an edge and a
    signal: the run and its tree's ids."""
    top = await start(engine, [task("a"), task("b", "a"), task("kid", type="child", workflow="mid"),
                               task("sig", type="signal")])
    mid = str((await step(conn, top, "kid"))["child_run_id"])
    leaf = str((await step(conn, mid, "kid2"))["child_run_id"])
    for run in (top, mid, leaf):
        await engine.signal(run, "unused", 1)
    await engine.cancel_run(top)
    return top, {top, mid, leaf}


async def register_tree(engine: Engine) -> None:
    await engine.register_workflow("leaf", [task("x"), task("y", "x"), task("w", type="signal")])
    await engine.register_workflow("mid", [task("m"), task("n", "m"), task("kid2", type="child", workflow="leaf"),
                                           task("w", type="signal")])


async def test_a_purged_run_takes_its_whole_tree_and_nothing_else(engine: Engine, conn) -> None:
    """Child runs to any depth go with their run, with their steps, edges and signals (set by set,
    no foreign key cascades them); another run's rows stay."""
    await register_tree(engine)
    top, tree = await nested(engine, conn)
    keep, kept = await nested(engine, conn)
    await age(conn, top, 10 * DAY)
    rows = "SELECT (SELECT count(*) FROM cyclone_steps WHERE run_id = ANY (%s::uuid[])) AS steps, " \
           "(SELECT count(*) FROM cyclone_step_deps WHERE run_id = ANY (%s::uuid[])) AS deps, " \
           "(SELECT count(*) FROM cyclone_signals WHERE run_id = ANY (%s::uuid[])) AS signals"
    before = await fetch_one(conn, rows, *[list(kept)] * 3)
    assert before == {"steps": 11, "deps": 3, "signals": 3}
    assert await fetch_one(conn, rows, *[list(tree)] * 3) == before
    assert await engine.purge(DAY) == 1  # the run; its child runs are not counted
    assert await run_ids(conn) == kept
    assert await fetch_one(conn, rows, *[list(tree)] * 3) == {"steps": 0, "deps": 0, "signals": 0}
    assert await fetch_one(conn, rows, *[list(kept)] * 3) == before
    assert await violations(conn) == {}


async def completed_tree(engine: Engine, conn) -> tuple[str, set[str]]:
    """A completed run whose child run completed, and that one's child run too, all finished
    ten days ago: the top run and the tree's ids."""
    top = await start(engine, [task("a"), task("kid", "a", type="child", workflow="cmid")], name="ctop")

    async def done() -> bool:
        for lease in await engine.claim("w", ["a", "m", "x", "y"], 10, 30):
            await engine.complete(lease["step_id"], lease["lease_generation"], None)
        await engine.sweep()
        return (await engine.get_run(top))["state"] == "completed"
    await eventually(done)
    tree = {top}
    while more := {str(r["id"]) for r in await fetch(conn, "SELECT id FROM cyclone_runs WHERE parent_run_id = ANY (%s::uuid[])",
                                                     list(tree))} - tree:
        tree |= more
    for run in tree:
        await age(conn, run, 10 * DAY)
    return top, tree


async def register_completing_tree(engine: Engine) -> None:
    await engine.register_workflow("cleaf", [task("x"), task("y", "x")])
    await engine.register_workflow("cmid", [task("m"), task("kid2", "m", type="child", workflow="cleaf")])


async def test_a_tree_of_eligible_runs_is_picked_at_its_top_only(engine: Engine, conn) -> None:
    """A completed run, its child run and their child run are all eligible; the purge picks the
    top one only and the others go with it, so that two purges never hold runs of one tree
    (one would lock the top and wait for the child the other holds, which waits for the
    grandchild: a deadlock). The dry run counts what the calls pick."""
    await register_completing_tree(engine)
    top, tree = await completed_tree(engine, conn)
    assert len(tree) == 3
    assert await engine.purge_count(DAY) == 1
    assert await engine.purge(DAY, limit=10) == 1
    assert await run_ids(conn) == set()
    assert await violations(conn) == {}


async def test_deleting_runs_by_hand_deletes_their_rows_and_child_runs_too(engine: Engine, conn) -> None:
    """No foreign key cascades a run's rows (migration 0012): a trigger does, once per
    statement, whatever deletes runs (an operator's DELETE, a server of an earlier release
    that purges through the cascade)."""
    await register_tree(engine)
    top, tree = await nested(engine, conn)
    keep, kept = await nested(engine, conn)
    await conn.execute("DELETE FROM cyclone_runs WHERE id = %s", (top,))
    assert await run_ids(conn) == kept
    assert await violations(conn) == {}
    await conn.execute("DELETE FROM cyclone_runs WHERE state = 'running'")  # no row: nothing
    assert await run_ids(conn) == kept


async def test_racing_purges_delete_each_tree_once_and_leave_no_rows_behind(engine: Engine, conn) -> None:
    """Eight purges at once over twenty trees of eligible runs (completed three deep) and
    twenty cancelled ones: every tree goes, each counted once at its top, no purge fails on a
    deadlock, and no step, edge, signal or child run is left without its run."""
    await register_tree(engine)
    await register_completing_tree(engine)
    for _ in range(20):
        await completed_tree(engine, conn)
    for _ in range(20):
        top, _ = await nested(engine, conn)
        await age(conn, top, 10 * DAY)
    counts = await asyncio.gather(*(engine.purge(DAY, limit=3) for _ in range(8)))
    while (n := await engine.purge(DAY, limit=3)) > 0:
        counts.append(n)
    assert sum(counts) == 40
    assert await run_ids(conn) == set()
    assert await fetch_one(conn, "SELECT (SELECT count(*) FROM cyclone_steps) + (SELECT count(*) FROM cyclone_step_deps)"
                                 " + (SELECT count(*) FROM cyclone_signals) AS n") == {"n": 0}


async def test_purges_take_turns(engine: Engine, conn, db_url: str) -> None:
    """A purge waits for another one's transaction to end: two at once could reach one tree from
    two of its runs (a child run whose parent waits longer sits between) and deadlock."""
    import psycopg
    top = await start(engine, [task("a")])
    await engine.cancel_run(top)
    await age(conn, top, 10 * DAY)
    async with await psycopg.AsyncConnection.connect(db_url) as other:
        await other.execute("SELECT cyclone_runs_purge(interval '30 days', 10)")  # holds its turn
        waiting = asyncio.create_task(engine.purge(DAY))
        await eventually(lambda: lock_waits_are(conn, 1))
        assert not waiting.done()
        await other.commit()
    assert await waiting == 1
    assert await run_ids(conn) == set()


async def test_racing_purges_reach_trees_with_a_younger_run_between(engine: Engine, conn) -> None:
    """Trees of a completed run, its child run kept a year (its nodes' retention) and that one's
    child run: the top and the grandchild are eligible, the middle is not. Eight purges race;
    each tree goes with its top (the grandchild with it or before it), none fails on a
    deadlock, and nothing is left without its run."""
    await engine.register_workflow("cleaf", [task("x"), task("y", "x")])
    await engine.register_workflow("cmid", [task("m", retention=365 * DAY),
                                            task("kid2", "m", type="child", workflow="cleaf")])
    trees = [await completed_tree(engine, conn) for _ in range(12)]
    counts = await asyncio.gather(*(engine.purge(DAY, limit=2) for _ in range(8)))
    while (n := await engine.purge(DAY, limit=2)) > 0:
        counts.append(n)
    assert 12 <= sum(counts) <= 24  # every top; a grandchild when picked before its top
    assert await run_ids(conn) == set()
    assert await violations(conn) == {}
    assert len(trees) == 12
