"""Days of history (migration 0014, 65_history.sql): runs, steps and edges partitioned by the
day in their ids; a day whose runs may all go is dropped whole, the rest is purged run by run."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import psycopg
import pytest
from engine_helpers import fetch, fetch_one, finish, history_from, start, task, until, violations

from cyclone_server.records import Job
from cyclone_server.serve.background import HISTORY_DAYS_WARN, HISTORY_WARN_INTERVAL, Background
from cyclone_server.store import runs as runs_module
from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier

pytestmark = pytest.mark.statemachine

DAY_MS = 86_400_000

# uuid u with `ms` milliseconds taken off the time in its first 48 bits (the rest kept).
SHIFT = """
CREATE OR REPLACE FUNCTION pg_temp.shift(u uuid, ms bigint) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(substring(int8send(('x' || substr(replace(u::text, '-', ''), 1, 12))::bit(48)::bigint - ms) FROM 3)
                  || substring(uuid_send(u) FROM 7), 'hex')::uuid
$$"""


async def move_back(conn, run_ids: list[str], days: int, finished_days_ago: float | None = None) -> list[str]:
    """Move whole runs (steps, edges, signals and references to them) `days` days back in
    their ids, as if made then; returns their new ids. With `finished_days_ago`, they
    finished that long ago."""
    ms = days * DAY_MS
    await conn.execute(SHIFT)
    ids = list(run_ids)
    await conn.execute("UPDATE cyclone_steps SET id = pg_temp.shift(id, %s), run_id = pg_temp.shift(run_id, %s) "
                       "WHERE run_id = ANY (%s::uuid[])", (ms, ms, ids))
    await conn.execute("UPDATE cyclone_steps SET child_run_id = pg_temp.shift(child_run_id, %s) "
                       "WHERE child_run_id = ANY (%s::uuid[])", (ms, ids))
    await conn.execute("UPDATE cyclone_step_deps SET step_id = pg_temp.shift(step_id, %s), "
                       "dep_id = pg_temp.shift(dep_id, %s), run_id = pg_temp.shift(run_id, %s) "
                       "WHERE run_id = ANY (%s::uuid[])", (ms, ms, ms, ids))
    await conn.execute("UPDATE cyclone_signals SET run_id = pg_temp.shift(run_id, %s) WHERE run_id = ANY (%s::uuid[])",
                       (ms, ids))
    await conn.execute("UPDATE cyclone_runs SET parent_run_id = pg_temp.shift(parent_run_id, %s) "
                       "WHERE parent_run_id = ANY (%s::uuid[])", (ms, ids))
    rows = await fetch(conn, "UPDATE cyclone_runs SET id = pg_temp.shift(id, %s) WHERE id = ANY (%s::uuid[]) "
                             "RETURNING id", ms, ids)
    moved = [str(r["id"]) for r in rows]
    if finished_days_ago is not None:
        await conn.execute("UPDATE cyclone_runs SET finished_at = now() - make_interval(secs => %s) "
                           "WHERE id = ANY (%s::uuid[])", (finished_days_ago * 86400, moved))
    return moved


async def drop_to_runs(engine: Engine) -> int | None:
    """Drop days until one with runs went (the empty days before it go first): its runs."""
    while True:
        n = await engine.drop_history_day(86400.0)
        if n != 0:
            return n


async def days(conn) -> list[str]:
    return [r["suffix"] for r in await fetch(conn, "SELECT suffix FROM cyclone_history_days ORDER BY lo")]


async def count(conn, sql: str, *params) -> int:
    return (await fetch_one(conn, f"SELECT count(*) AS n FROM ({sql}) x", *params))["n"]


async def test_a_step_is_made_in_its_runs_day(engine: Engine, conn) -> None:
    await engine.enqueue("job")
    await engine.enqueue_many([Job("many"), Job("many")])
    await start(engine, [task("a"), task("b", "a"), task("c", "a")])
    rows = await fetch(conn, "SELECT s.id, s.run_id, s.tableoid::regclass::text AS part, "
                             "r.tableoid::regclass::text AS run_part FROM cyclone_steps s "
                             "JOIN cyclone_runs r ON r.id = s.run_id")
    assert len(rows) == 6
    for r in rows:
        assert r["id"].bytes[:8] == r["run_id"].bytes[:8]  # the run's time, to a fraction of a ms
        assert r["part"].removeprefix("cyclone_steps_") == r["run_part"].removeprefix("cyclone_runs_")


async def test_the_days_to_come_are_made_once_by_concurrent_servers(db_url: str, conn) -> None:
    before = await days(conn)

    async def ensure() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            return (await (await c.execute("SELECT cyclone_history_ensure(6)")).fetchone())[0]
    made = await asyncio.gather(*(ensure() for _ in range(4)))
    after = await days(conn)
    assert sum(made) == len(after) - len(before) == 4  # two days ahead by default, six now
    rows = await fetch(conn, "SELECT lo, hi FROM cyclone_history_days ORDER BY lo")
    assert all(a["hi"] == b["lo"] for a, b in zip(rows, rows[1:]))  # no gap, no overlap
    last = (await fetch_one(conn, "SELECT cyclone__uuid_day(hi) - (now() AT TIME ZONE 'UTC')::date AS d "
                                  "FROM cyclone_history_days ORDER BY hi DESC LIMIT 1"))["d"]
    assert last == 7  # the end of the sixth day after today
    # each day's tables take the day before's storage settings (autovacuum's, migration 0004)
    opts = await fetch(conn, "SELECT c.reloptions FROM pg_class c WHERE c.relname LIKE 'cyclone_steps_2%%' AND c.relkind = 'r'")
    assert opts and all("autovacuum_vacuum_threshold=20000" in (o["reloptions"] or []) for o in opts)


async def dropped_day_setup(engine: Engine, conn) -> dict[str, object]:
    """History from five days ago. On the day three days ago: two jobs, a DAG run, a run that
    took a signal, a parent whose child run was made the day after; all ended 3 days ago."""
    await history_from(conn, 5)
    await engine.register_workflow("leaf", [task("leafwork")])
    await engine.register_workflow("parent", [{"id": "c", "type": "child", "workflow": "leaf"}])
    jobs = []
    for _ in range(2):
        jobs.append((await engine.enqueue("job"))[0])
        await finish(engine, "job")
    dag = await start(engine, [task("a"), task("b", "a")], name="dag")
    await finish(engine, "a")
    await finish(engine, "b")
    signalled = await start(engine, [{"id": "s", "type": "signal", "signal": "go"}], name="sig")
    await engine.signal(signalled, "go")
    parent, _ = await engine.submit_run("parent")
    child = str((await fetch_one(conn, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", parent))["id"])
    await finish(engine, "leafwork")
    await engine.settle_children(limit=10)
    today, _, _ = await engine.enqueue("today")
    await finish(engine, "today")
    states = {str(r["id"]): r["state"] for r in await fetch(conn, "SELECT id, state FROM cyclone_runs")}
    assert set(states.values()) == {"completed"}, states
    [child] = await move_back(conn, [child], 2, finished_days_ago=3)
    old = await move_back(conn, [*jobs, dag, signalled, parent], 3, finished_days_ago=3)
    await conn.execute("UPDATE cyclone_runs SET finished_at = now() - interval '3 days' WHERE id = %s", (today,))
    return {"old": old, "child": child, "today": today}


def day_of(run_id: str) -> str:
    """The suffix of a run's day, as cyclone_history_days names it."""
    ms = int.from_bytes(uuid.UUID(str(run_id)).bytes[:6], "big")
    return time.strftime("%Y%m%d", time.gmtime(ms / 1000))


async def test_a_day_whose_runs_may_all_go_is_dropped_whole(engine: Engine, conn) -> None:
    made = await dropped_day_setup(engine, conn)
    old, child, today = made["old"], made["child"], made["today"]
    day = day_of(old[0])
    assert await count(conn, "SELECT 1 FROM cyclone_signals WHERE run_id = ANY (%s::uuid[])", old) == 1
    assert await count(conn, "SELECT 1 FROM cyclone_step_deps WHERE run_id = ANY (%s::uuid[])", old) == 1

    assert await drop_to_runs(engine) == 5  # the five runs of that day (the empty days before it first)
    assert day not in await days(conn)
    assert not await fetch(conn, "SELECT 1 FROM pg_class WHERE relname = ANY (%s)",
                           [f"{t}_{day}" for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps")])
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", old) == 0
    assert await count(conn, "SELECT 1 FROM cyclone_steps WHERE run_id = ANY (%s::uuid[])", old) == 0
    # What other tables hold of the day goes next: its signal, and the child run of the next day.
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = %s", child) == 1
    assert await engine.tidy_history(1000) == 2
    assert await count(conn, "SELECT 1 FROM cyclone_signals WHERE run_id = ANY (%s::uuid[])", old) == 0
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = %s", child) == 0
    assert await count(conn, "SELECT 1 FROM cyclone_steps WHERE run_id = %s", child) == 0
    assert await engine.tidy_history(1000) == 0
    assert await count(conn, "SELECT 1 FROM cyclone_history_dropped") == 0
    # Nothing else may go as a day (today's run is in today; the days between are empty), so
    # the sweep goes on run by run.
    assert await drop_to_runs(engine) is None
    assert await engine.purge(86400.0, sweep=True) == 1
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = %s", today) == 0


@pytest.mark.parametrize("keeps", ["running", "own retention", "parent of an earlier day running"])
async def test_a_day_with_a_run_that_must_stay_is_kept(engine: Engine, conn, keeps: str) -> None:
    made = await dropped_day_setup(engine, conn)
    old = made["old"]
    if keeps == "running":
        kept = (await move_back(conn, [(await engine.enqueue("late"))[0]], 3))[0]
    elif keeps == "own retention":  # retention of its own: 5 days after it ended
        await conn.execute("UPDATE cyclone_runs SET retention = interval '5 days' WHERE id = %s", (old[0],))
        kept = old[0]
    else:  # a child run of that day whose parent, made the day before, still runs
        parent = (await move_back(conn, [(await engine.enqueue("elder"))[0]], 4))[0]
        await conn.execute("UPDATE cyclone_runs SET parent_run_id = %s WHERE id = %s", (parent, old[0]))
        kept = old[0]
    assert await drop_to_runs(engine) is None  # the empty days before it went
    assert day_of(old[0]) in await days(conn)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", old) == len(old)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = %s", kept) == 1


async def test_a_drop_that_cannot_lock_at_once_gives_up_and_keeps_everything(engine: Engine, conn,
                                                                              db_url: str) -> None:
    made = await dropped_day_setup(engine, conn)
    for _ in range(3):  # the empty days before it
        assert await engine.drop_history_day(86400.0) == 0
    before = await days(conn)
    with psycopg.connect(db_url) as reader:  # a transaction reading the runs holds their lock
        reader.execute("SELECT count(*) FROM cyclone_runs").fetchone()
        began = time.monotonic()
        assert await engine.drop_history_day(86400.0) == -1
        waited = time.monotonic() - began
        reader.rollback()
    assert waited < 10  # it gave up (three calls of five tries, a second apart), it did not wait for the reader
    assert await days(conn) == before
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", made["old"]) == len(made["old"])
    assert await engine.drop_history_day(86400.0) == 5


async def test_an_idempotency_key_finds_its_run_on_an_earlier_day(engine: Engine, conn) -> None:
    await history_from(conn, 3)
    first, _, created = await engine.enqueue("job", idempotency_key="k1")
    assert created
    [moved] = await move_back(conn, [first], 2)
    again, _, created = await engine.enqueue("job", idempotency_key="k1")
    assert (again, created) == (moved, False)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE idempotency_key = 'k1'") == 1


async def record_reads(conn, then: str = "") -> None:
    """cyclone__history_day_read replaced by one that notes each call's day and first page in
    history_reads, reads its slice, then runs `then` (PL/pgSQL statements)."""
    await conn.execute("CREATE TABLE history_reads (n bigserial, lo uuid, page bigint)")
    await conn.execute("ALTER FUNCTION cyclone__history_day_read(uuid, interval, boolean, bigint, bigint) "
                       "RENAME TO history_day_read_slice")
    await conn.execute("""
        CREATE FUNCTION cyclone__history_day_read(p_lo uuid, p_age interval, p_sweep boolean, p_page bigint,
                                                  p_pages bigint, OUT runs bigint, OUT blocked boolean,
                                                  OUT next_page bigint)
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO history_reads (lo, page) VALUES (p_lo, p_page);
            SELECT * INTO runs, blocked, next_page FROM history_day_read_slice(p_lo, p_age, p_sweep, p_page, p_pages);
            %s
        END $$""" % then)


@pytest.mark.parametrize("change", ["ended again", "running again"])
async def test_a_run_retried_while_its_day_is_read_keeps_the_day(engine: Engine, conn, change: str) -> None:
    """The day is read without the tables' lock: a run retried meanwhile (running again, or
    ended again too recently), and the detach, checking again under the lock, leaves the day."""
    made = await dropped_day_setup(engine, conn)
    old = made["old"]
    # A slice of the day read, then (as if a RetryRun, and maybe its run's end, came in
    # between, in the pause after it) one of its runs changing.
    change_sql = {"ended again": "UPDATE cyclone_runs SET finished_at = clock_timestamp() WHERE id = '%s'",
                  "running again": "UPDATE cyclone_runs SET state = 'running', finished_at = NULL WHERE id = '%s'"}
    await record_reads(conn, """
        IF runs > 0 AND NOT blocked AND EXISTS (SELECT 1 FROM cyclone_history_days d
                                                 WHERE d.lo = p_lo AND '%s' >= d.lo AND '%s' < d.hi) THEN
            %s;
        END IF;""" % (old[0], old[0], change_sql[change] % old[0]))
    assert await drop_to_runs(engine) is None
    assert day_of(old[0]) in await days(conn)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", old) == len(old)


@pytest.mark.parametrize("last", ["due", "own retention"])
async def test_a_day_is_read_in_slices_of_its_pages(engine: Engine, conn, monkeypatch, last: str) -> None:
    """The sweep reads a day a slice of its pages at a time, each in its own transaction:
    every run is counted once, and a run that must stay, in the day's last page, keeps it."""
    monkeypatch.setattr(runs_module, "HISTORY_READ_PAGES", 1)
    await history_from(conn, 3)
    ids = [r[0] for r in await engine.enqueue_many([Job("old", input="x" * 400) for _ in range(60)])]
    leases = await engine.claim("w1", ["old"], limit=100, lease_ttl=30.0)
    assert len(leases) == 60
    for lease in leases:
        assert await engine.complete(lease["step_id"], lease["lease_generation"], None) == "applied"
    moved = await move_back(conn, ids, 2, finished_days_ago=2)
    part = f"cyclone_runs_{day_of(moved[0])}"
    if last == "own retention":  # the run in the last page ends 5 days after it ended
        await conn.execute(f"UPDATE {part} SET retention = interval '5 days' "
                           f"WHERE ctid = (SELECT max(ctid) FROM {part})")
    pages = (await fetch_one(conn, "SELECT pg_relation_size(%s) / 8192 AS n", part))["n"]
    assert pages >= 3  # (60 runs of 400 bytes of input)
    lo = (await fetch_one(conn, "SELECT lo FROM cyclone_history_days WHERE suffix = %s", day_of(moved[0])))["lo"]
    await record_reads(conn)
    n = await drop_to_runs(engine)
    reads = [r["page"] for r in await fetch(conn, "SELECT page FROM history_reads WHERE lo = %s ORDER BY n", lo)]
    if last == "due":
        assert reads == list(range(pages))  # one page at a time, to the last
        assert n == 60
        assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", moved) == 0
    else:
        # read to its last page once: the sweep then went on to the (empty) day after it,
        # and did not read it again at the next call
        assert n is None and reads == list(range(pages))
        assert day_of(moved[0]) in await days(conn)
        assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", moved) == 60


async def test_a_day_whose_steps_could_not_be_locked_goes_at_the_next_sweep(engine: Engine, conn, db_url: str,
                                                                         monkeypatch) -> None:
    """The sweep detaches a day's partitions one per transaction, then drops them: when the
    steps' lock is not had, the runs are gone already, and the next sweep takes the rest."""
    monkeypatch.setattr(runs_module, "HISTORY_DROP_TRIES", 1)
    made = await dropped_day_setup(engine, conn)
    old = made["old"]
    day = day_of(old[0])
    for _ in range(3):  # the empty days before it
        assert await engine.drop_history_day(86400.0) == 0
    with psycopg.connect(db_url) as reader:  # a transaction reading the steps holds their lock
        reader.execute("SELECT count(*) FROM cyclone_steps").fetchone()
        assert await engine.drop_history_day(86400.0) == 5  # its runs went
        reader.rollback()
    assert day in await days(conn)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", old) == 0
    assert await count(conn, "SELECT 1 FROM cyclone_steps WHERE run_id = ANY (%s::uuid[])", old) > 0
    assert await fetch(conn, "SELECT 1 FROM pg_class WHERE relname = %s", f"cyclone_steps_{day}")
    assert not await fetch(conn, "SELECT 1 FROM pg_class WHERE relname = %s", f"cyclone_runs_{day}")  # dropped
    assert await engine.drop_history_day(86400.0) == 0  # the rest of the day (no runs left)
    assert day not in await days(conn)
    assert await count(conn, "SELECT 1 FROM cyclone_steps WHERE run_id = ANY (%s::uuid[])", old) == 0
    assert not await fetch(conn, "SELECT 1 FROM pg_class WHERE relname = ANY (%s)",
                           [f"{t}_{day}" for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps")])


async def test_one_call_drops_a_day_for_an_operator(engine: Engine, conn, db_url: str) -> None:
    """cyclone_history_drop: the read and the three partitions in one call, all or nothing."""
    made = await dropped_day_setup(engine, conn)
    day = day_of(made["old"][0])
    dropped = []
    for _ in range(3):  # the first partition and two empty days
        dropped.append((await fetch_one(conn, "SELECT cyclone_history_drop(interval '1 day') AS n"))["n"])
    with psycopg.connect(db_url) as reader:  # a transaction reading the steps holds their lock
        reader.execute("SELECT count(*) FROM cyclone_steps").fetchone()
        assert (await fetch_one(conn, "SELECT cyclone_history_drop(interval '1 day', true, '10 ms') AS n"))["n"] == -1
        reader.rollback()
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", made["old"]) == 5  # none went
    while (n := (await fetch_one(conn, "SELECT cyclone_history_drop(interval '1 day') AS n"))["n"]) is not None:
        dropped.append(n)
    # the first partition, two empty days, that day, then yesterday (the next day holds the child
    # run, which waits for cyclone_history_tidy)
    assert dropped == [0, 0, 0, 5, 0]
    assert day not in await days(conn)
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", made["old"]) == 0


async def test_a_day_detached_and_not_dropped_goes_at_the_next_sweep(engine: Engine, conn) -> None:
    """A sweep that stopped after detaching a day's partitions (its server killed) left
    tables no query reaches: the next sweep drops them."""
    made = await dropped_day_setup(engine, conn)
    day = day_of(made["old"][0])
    lo = (await fetch_one(conn, "SELECT lo FROM cyclone_history_days WHERE suffix = %s", day))["lo"]
    for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps"):
        assert (await fetch_one(conn, "SELECT cyclone_history_detach_part(%s, %s, now()) AS done", lo, t))["done"]
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", made["old"]) == 0
    assert day in await days(conn)
    ns = []
    while (n := await engine.drop_history_day(86400.0)) is not None:
        ns.append(n)
    assert ns == [0, 0, 0, 0, 0]  # the first partition, two empty days, that day (no run left), yesterday
    assert day not in await days(conn)
    assert not await fetch(conn, "SELECT 1 FROM pg_class WHERE relname = ANY (%s)",
                           [f"{t}_{day}" for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps")])


async def test_servers_sweep_days_one_at_a_time(engine: Engine, conn, db_url: str) -> None:
    """One server sweeps days at a time: while another holds the sweep, a sweep is told so
    (-1) and reads nothing; two sweeps at once drop the day once, its runs counted once."""
    made = await dropped_day_setup(engine, conn)
    await record_reads(conn)
    with psycopg.connect(db_url, autocommit=True) as holder:  # another server's sweep under way
        holder.execute("SELECT pg_advisory_lock(hashtextextended('cyclone.history.sweep', 0))")
        assert await engine.drop_history_day(86400.0) == -1
        holder.execute("SELECT pg_advisory_unlock(hashtextextended('cyclone.history.sweep', 0))")
    assert await count(conn, "SELECT 1 FROM history_reads") == 0
    other = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        results: list[int | None] = []

        async def sweep(e: Engine) -> None:
            while (n := await e.drop_history_day(86400.0)) not in (None, -1):
                results.append(n)
            results.append(n)
        await asyncio.gather(sweep(engine), sweep(other))
    finally:
        await other.close()
    assert [n for n in results if n] in ([5, -1], [-1, 5], [5])  # the day's five runs, once
    assert await count(conn, "SELECT 1 FROM cyclone_runs WHERE id = ANY (%s::uuid[])", made["old"]) == 0


async def test_a_step_or_edge_outside_its_runs_day_is_a_violation(engine: Engine, conn) -> None:
    """The lookups of a run's steps and edges read from the run's day on (cyclone__run_result):
    the invariants the tests check (engine_helpers.violations) include that every step and
    edge is in its run's day. A run's own rows are; a step moved a day back is not."""
    await history_from(conn, 3)
    run_id = await start(engine, [task("a"), task("b", "a")])
    assert await violations(conn) == {}
    await conn.execute(SHIFT)
    [b] = await fetch(conn, "SELECT id FROM cyclone_steps WHERE run_id = %s AND node = 'b'", run_id)
    await conn.execute("UPDATE cyclone_step_deps SET step_id = pg_temp.shift(step_id, %s) WHERE step_id = %s",
                       (DAY_MS, b["id"]))
    await conn.execute("UPDATE cyclone_steps SET id = pg_temp.shift(id, %s) WHERE id = %s", (DAY_MS, b["id"]))
    assert set(await violations(conn)) == {"a step or edge outside its run's day of history"}


async def test_a_server_warns_of_too_many_days_at_start_and_then_once_a_day(engine: Engine, conn, db_url: str,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Every partition of history costs the claims and fills Postgres's lock table
    (docs/operations.md, "What the days cost"): past HISTORY_DAYS_WARN partitions a table, the
    server says so (and what to do) when it starts, and then once a day, not at every pass."""
    caplog.set_level(logging.WARNING, logger="cyclone_server.serve.background")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "partitions of runs, steps and edges" in r.getMessage()]

    assert await engine.history_days() < 10  # a new database: the first partition and the days ahead
    await history_from(conn, HISTORY_DAYS_WARN - 4)  # the first, the days back, today, two ahead
    assert await engine.history_days() == HISTORY_DAYS_WARN
    bg = Background(engine, Notifier(db_url), sweep_interval=60.0)
    await bg._ensure_history()
    assert warnings() == []  # at the bound, not past it

    await history_from(conn, HISTORY_DAYS_WARN - 3)
    await bg.start()  # its first pass checks at once
    try:
        await until(lambda: warnings(), "the warning of a server starting on too many days")
    finally:
        await bg.stop()
    [said] = warnings()
    assert f"history: {HISTORY_DAYS_WARN + 1} partitions" in said and "--retention-default-age" in said
    await bg._ensure_history()
    assert len(warnings()) == 1  # not again at the next pass
    assert bg._history_warned_at is not None
    bg._history_warned_at -= HISTORY_WARN_INTERVAL  # a day later
    await bg._ensure_history()
    assert len(warnings()) == 2
