"""Settled days of history (migration 0015, 65_history.sql): a day that ended with every run
in it terminal is settled, and the claim and the sweeps read no settled day; Retry, the one
way out of a terminal state, unsettles its run's day first."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from engine_helpers import (claim_one, db_now, discard, expire_lease, fetch, fetch_one, finish, history_from, nested_plans,
                            plan_nodes, start, task)
from test_history import day_of, move_back

from cyclone_server.records import Job
from cyclone_server.serve.background import Background
from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier

pytestmark = pytest.mark.statemachine


async def settled(conn) -> dict[str, bool]:
    return {r["suffix"]: r["settled"]
            for r in await fetch(conn, "SELECT suffix, settled FROM cyclone_history_days ORDER BY lo")}


async def floor_day(conn) -> str:
    """The suffix of the first day not settled (cyclone__live_floor)."""
    return (await fetch_one(conn, "SELECT d.suffix FROM cyclone_history_days d "
                                  "WHERE d.lo = cyclone__live_floor()"))["suffix"]


async def a_day(conn, days_ago: int) -> str:
    return (await fetch_one(conn, "SELECT to_char((now() AT TIME ZONE 'UTC')::date - %s, 'YYYYMMDD') AS d",
                            days_ago))["d"]


async def failed_run(engine: Engine, conn, days_ago: int, kind: str = "f") -> str:
    """A one-node run whose node was discarded (so the run failed), moved `days_ago` days back."""
    run = await start(engine, [task(kind)], name=kind)
    await discard(engine, kind)
    assert (await fetch_one(conn, "SELECT state FROM cyclone_runs WHERE id = %s", run))["state"] == "failed"
    return (await move_back(conn, [run], days_ago, finished_days_ago=days_ago))[0]


async def day_settle(db_url: str, suffix: str, wait: str = "100 ms") -> bool | None:
    """cyclone__history_day_settle of the day, in a transaction of its own."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        row = await (await c.execute("SELECT cyclone__history_day_settle(lo, %s::interval) FROM cyclone_history_days "
                                     "WHERE suffix = %s", (wait, suffix))).fetchone()
        return row[0]


async def test_a_day_settles_once_it_ended_with_every_run_terminal(engine: Engine, conn, db_url: str) -> None:
    await history_from(conn, 5)  # the first partition, five days back, today and two ahead
    running = (await move_back(conn, [(await engine.enqueue("a"))[0]], 2))[0]
    paused = await start(engine, [task("p")], name="p")
    await engine.pause_run(paused)
    paused = (await move_back(conn, [paused], 3))[0]
    await engine.enqueue("b")
    completed = (await move_back(conn, [(await finish(engine, "b"))["run_id"]], 4, finished_days_ago=4))[0]
    failed = await failed_run(engine, conn, 1)
    await engine.enqueue("today")

    bg = Background(engine, Notifier(db_url), sweep_interval=60.0)
    await bg._ensure_history()  # the pass that makes the days ahead settles those that may be
    days = await settled(conn)
    assert days[day_of(running)] is False and days[day_of(paused)] is False  # a live run each
    assert days[day_of(completed)] is True and days[day_of(failed)] is True
    assert days[await a_day(conn, 5)] is True and days["first"] is True  # empty
    assert [d for d, s in days.items() if not s] == sorted([day_of(paused), day_of(running), await a_day(conn, 0),
                                                            await a_day(conn, -1), await a_day(conn, -2)])
    assert await floor_day(conn) == day_of(paused)  # the oldest day with a live run

    await finish(engine, "a")  # the claim still finds a step of a day after the floor
    assert await engine.settle_history() == 1
    assert (await settled(conn))[day_of(running)] is True
    await engine.resume_run(paused)
    await finish(engine, "p")
    assert await engine.settle_history() == 1
    assert await floor_day(conn) == await a_day(conn, 0)  # today: every day before it settled
    assert await engine.settle_history() == 0


async def test_a_retry_unsettles_its_runs_day_and_the_claim_finds_its_steps(engine: Engine, conn) -> None:
    await history_from(conn, 4)
    run = await failed_run(engine, conn, 3)
    assert await engine.settle_history() == 5  # four days back and the first
    assert (await settled(conn))[day_of(run)] is True
    assert await floor_day(conn) == await a_day(conn, 0)

    assert await engine.retry(run)
    assert (await settled(conn))[day_of(run)] is False
    assert await floor_day(conn) == day_of(run)
    lease = await claim_one(engine, "f")
    assert str(lease["run_id"]) == run
    assert await engine.complete(lease["step_id"], lease["lease_generation"], None) == "applied"
    assert (await fetch_one(conn, "SELECT state FROM cyclone_runs WHERE id = %s", run))["state"] == "completed"
    assert await engine.settle_history() == 1  # ended again: settled again


async def test_a_retry_that_reopens_a_failed_child_run_unsettles_the_childs_day(engine: Engine, conn) -> None:
    await history_from(conn, 5)
    await engine.register_workflow("leaf", [task("lw")])
    parent = await start(engine, [{"id": "c", "type": "child", "workflow": "leaf"}], name="parent")
    child = str((await fetch_one(conn, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", parent))["id"])
    await discard(engine, "lw")
    await engine.settle_children(limit=10)
    states = {str(r["id"]): r["state"] for r in await fetch(conn, "SELECT id, state FROM cyclone_runs")}
    assert states == {parent: "failed", child: "failed"}
    [child] = await move_back(conn, [child], 2, finished_days_ago=2)
    [parent] = await move_back(conn, [parent], 3, finished_days_ago=2)
    await engine.settle_history()
    days = await settled(conn)
    assert days[day_of(parent)] is True and days[day_of(child)] is True

    assert await engine.retry(parent)  # the child node reopens its failed child run
    assert (await fetch_one(conn, "SELECT state FROM cyclone_runs WHERE id = %s", child))["state"] == "running"
    days = await settled(conn)
    assert days[day_of(parent)] is False and days[day_of(child)] is False
    lease = await claim_one(engine, "lw")
    assert str(lease["run_id"]) == child


async def test_a_settle_that_cannot_lock_the_days_runs_at_once_gives_up(engine: Engine, conn, db_url: str) -> None:
    await history_from(conn, 3)
    await engine.enqueue("b")
    run = (await move_back(conn, [(await finish(engine, "b"))["run_id"]], 2, finished_days_ago=2))[0]
    day = day_of(run)
    async with await psycopg.AsyncConnection.connect(db_url) as writer:  # a transaction writing that day's runs
        await writer.execute(f"LOCK TABLE cyclone_runs_{day} IN ROW EXCLUSIVE MODE")
        assert await asyncio.wait_for(day_settle(db_url, day, "50 ms"), 10) is None
        assert (await settled(conn))[day] is False
        await writer.rollback()
    assert await day_settle(db_url, day) is True
    assert await day_settle(db_url, await a_day(conn, 0)) is False  # today has not ended


async def test_settles_racing_retries_never_hide_a_reopened_run(engine: Engine, conn, db_url: str) -> None:
    """Round after round: the day of a failed run settled, then a Retry of the run beside
    settles of its day from other connections. Whoever wins, a day with a running run is
    never left settled, and the retried step is claimed."""
    await history_from(conn, 3)
    run = await failed_run(engine, conn, 2)
    day = day_of(run)
    settle = "SELECT cyclone__history_day_settle(lo, '1 s') FROM cyclone_history_days WHERE suffix = %s"
    settlers = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(4)]
    try:
        for _ in range(20):
            assert await day_settle(db_url, day, "1 s") is True

            async def settle_often(c: psycopg.AsyncConnection) -> list[bool | None]:
                return [(await (await c.execute(settle, (day,))).fetchone())[0] for _ in range(5)]
            retried, *_ = await asyncio.gather(engine.retry(run), *(settle_often(c) for c in settlers))
            assert retried is True
            assert (await settled(conn))[day] is False
            assert await day_settle(db_url, day, "1 s") is False  # its run is running
            assert str((await discard(engine, "f"))["run_id"]) == run  # failed again
            assert (await fetch_one(conn, "SELECT state FROM cyclone_runs WHERE id = %s", run))["state"] == "failed"
    finally:
        for c in settlers:
            await c.close()


async def test_the_claim_reads_no_settled_day(engine: Engine, conn) -> None:
    await history_from(conn, 6)
    await engine.enqueue("k")
    claim = "SELECT * FROM cyclone_leases_claim_rated('w', ARRAY['k'], 8, '30 s')"

    def days_read(plans) -> set[str]:
        names = {n.get("Index Name") or n.get("Relation Name") or "" for _, p in plans for n in plan_nodes(p)}
        return {d for d in past for name in names if d in name}

    past = [await a_day(conn, n) for n in range(1, 7)]
    assert days_read(await nested_plans(conn, claim, analyze=True)) == set(past)  # every day's index, before
    await conn.rollback()
    assert await engine.settle_history() == 7
    assert days_read(await nested_plans(conn, claim, analyze=True)) == set()
    await conn.rollback()


async def test_a_settle_while_a_retry_reopens_its_run_leaves_the_day_alone(engine: Engine, conn, db_url: str) -> None:
    """The Retry holds its day's advisory lock (shared) from before it reopens anything: a settle that comes while
    it reopens the steps, before it changes the run (which still looks failed), skips the day.
    The day is not settled yet when the Retry begins, so the Retry has nothing to change in it."""
    await history_from(conn, 3)
    run = await failed_run(engine, conn, 2)
    day = day_of(run)
    # The reopen of the run's step pauses inside the Retry's transaction, after its first
    # change and before the run's.
    await conn.execute("CREATE FUNCTION slow_reopen() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$")
    await conn.execute(f"CREATE TRIGGER slow_reopen BEFORE UPDATE ON cyclone_steps_{day} FOR EACH ROW "
                       "WHEN (OLD.state = 'discarded' AND NEW.state = 'pending') EXECUTE FUNCTION slow_reopen()")
    await conn.commit()
    retry = asyncio.create_task(engine.retry(run))
    deadline = asyncio.get_running_loop().time() + 20
    while not (await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                                     "AND datname = current_database()"))["n"]:
        assert asyncio.get_running_loop().time() < deadline, "the retry never reached its reopen"
        await asyncio.sleep(0.01)
    assert await day_settle(db_url, day) is None  # the day's lock is the Retry's until it commits
    assert await retry is True
    assert (await settled(conn))[day] is False
    assert str((await claim_one(engine, "f"))["run_id"]) == run


async def test_the_scanners_find_live_work_beside_settled_days(engine: Engine, conn) -> None:
    """The recovery sweep and the deadline scanner, bounded by the first day not settled,
    still find what is due in the live days."""
    await history_from(conn, 4)
    assert await engine.settle_history() == 5  # every day before today
    await engine.enqueue("k")
    lease = await claim_one(engine, "k")
    await expire_lease(conn, lease["step_id"])
    late = await start(engine, [task("d")], name="d", deadline=await db_now(conn) + timedelta(seconds=30))
    await conn.execute("UPDATE cyclone_runs SET deadline_at = now() - interval '1 s' WHERE id = %s", (late,))
    counts = await engine.sweep()
    assert counts["leases_sweep"] == 1 and counts["deadlines_expire"] == 1
    assert (await fetch_one(conn, "SELECT state FROM cyclone_steps WHERE id = %s", lease["step_id"]))["state"] == "available"
    assert (await fetch_one(conn, "SELECT state FROM cyclone_runs WHERE id = %s", late))["state"] == "failed"


@pytest.mark.parametrize("how", ["submit", "enqueue", "enqueue many"])
async def test_a_run_made_in_a_day_settled_meanwhile_unsettles_it(engine: Engine, conn, how: str) -> None:
    """A run's id is made before its row reaches its day's table: a transaction that made its
    ids just before midnight may insert after a settle of that day found it all ended. The
    insert then finds the day settled, and unsettles it (here: today, as if so settled)."""
    await history_from(conn, 2)
    await conn.execute("UPDATE cyclone_history_days SET settled = true WHERE hi <= cyclone__day_uuid(now() + interval '1 day')")
    await conn.commit()
    if how == "submit":
        run = await start(engine, [task("n")], name="n")
    elif how == "enqueue":
        run = (await engine.enqueue("n"))[0]
    else:
        run = (await engine.enqueue_many([Job("n"), Job("other")]))[0][0]
    assert (await settled(conn))[await a_day(conn, 0)] is False
    assert str((await claim_one(engine, "n"))["run_id"]) == run
