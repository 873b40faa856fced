"""The Notifier: LISTEN wake-ups from other connections' transactions, timeouts, coalescing."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from engine_helpers import claim_one, start, task, until

from cyclone_server.records import Result

from cyclone_server.store.core import ANNOUNCE_GAP

from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier


@pytest.fixture
async def notifier(db_url: str) -> AsyncIterator[Notifier]:
    n = Notifier(db_url)
    await n.start()
    try:
        yield n
    finally:
        await n.stop()


async def test_wait_returns_true_on_a_notification_from_another_transaction(
        notifier: Notifier, engine: Engine) -> None:
    waiting = asyncio.create_task(notifier.wait("cyclone_available", timeout=30))
    await asyncio.sleep(0)  # let the waiter register before the enqueue commits
    await engine.enqueue("thumbnail", input={"n": 1})
    assert await waiting is True


async def test_wait_returns_false_on_timeout(notifier: Notifier) -> None:
    assert await notifier.wait("cyclone_run_ended", timeout=0.2) is False


async def test_wait_rejects_an_unknown_channel(notifier: Notifier) -> None:
    with pytest.raises(ValueError, match="channel"):
        await notifier.wait("nope", timeout=0.1)


async def test_notifications_of_one_transaction_are_coalesced(
        notifier: Notifier, conn: psycopg.AsyncConnection) -> None:
    available: list[None] = []
    ended: list[None] = []
    notifier.subscribe("cyclone_available", lambda: available.append(None))
    notifier.subscribe("cyclone_run_ended", lambda: ended.append(None))
    async with conn.transaction():
        for _ in range(3):
            await conn.execute("SELECT pg_notify('cyclone_available', '')")
    # A later transaction's notification arrives after the first one's: a marker.
    await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")
    await until(lambda: ended)
    assert len(available) == 1


async def test_a_lost_connection_is_re_established_and_wakes_waiters(
        notifier: Notifier, conn: psycopg.AsyncConnection) -> None:
    notifier.reconnect_initial = 0.05
    waiting = asyncio.create_task(notifier.wait("cyclone_available", timeout=30))
    await asyncio.sleep(0)
    await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid() AND datname = current_database()")
    assert await waiting is True  # woken by the reconnect: callers re-check state
    await until(lambda: notifier.reconnects >= 1)
    # And it listens again.
    waiting = asyncio.create_task(notifier.wait("cyclone_run_ended", timeout=30))
    await asyncio.sleep(0)
    await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")
    assert await waiting is True


async def test_a_server_engine_announces_new_work_on_the_side_coalesced(
        notifier: Notifier, db_url: str, conn: psycopg.AsyncConnection) -> None:
    server_engine = await Engine.open(db_url, announces=True)
    woken: list[None] = []
    server_engine.available_listeners.append(lambda: woken.append(None))
    available: list[None] = []
    notifier.subscribe("cyclone_available", lambda: available.append(None))
    try:
        # Its sessions do not NOTIFY inside their transactions...
        async with server_engine.pool.connection() as c:
            row = await (await c.execute("SELECT current_setting('cyclone.announce', true) AS a")).fetchone()
        assert row["a"] == "server"
        # ... yet ten enqueues in a row reach the other servers' listeners, in fewer notifications.
        await asyncio.gather(*(server_engine.enqueue("thumbnail", input={"n": i}) for i in range(10)))
        assert len(woken) == 10  # its own dispatcher: at once, every time
        await until(lambda: available)
        await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")  # a marker after the announcements
        ended = asyncio.create_task(notifier.wait("cyclone_run_ended", timeout=30))
        await asyncio.sleep(0)
        await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")
        assert await ended is True
        assert 1 <= len(available) < 10
    finally:
        await server_engine.close()


async def test_a_stream_of_new_work_is_announced_once_per_gap_and_lone_work_after_it_at_once(
        notifier: Notifier, db_url: str) -> None:
    """Under a stream of new work a server announces once per ANNOUNCE_GAP, not once per
    ANNOUNCE_WINDOW; what comes last is announced too, and so is lone work after a quiet."""
    server_engine = await Engine.open(db_url, announces=True)
    available: list[float] = []
    notifier.subscribe("cyclone_available", lambda: available.append(time.monotonic()))
    try:
        began, calls = time.monotonic(), 0
        while True:  # new work every 2 ms or so, for half a second
            server_engine.announce(jobs_only=True)
            last = time.monotonic()  # no notification can be read between the call and this
            calls += 1
            if last - began >= 0.5:
                break
            await asyncio.sleep(0.002)
        assert calls >= 50
        await until(lambda: available and available[-1] > last)  # the stream's last work was announced
        await asyncio.sleep(0.2)
        assert len(available) <= 0.5 / ANNOUNCE_GAP + 3, (len(available), calls)
        quiet = len(available)
        server_engine.announce(jobs_only=True)
        await until(lambda: len(available) == quiet + 1)
    finally:
        await server_engine.close()


async def test_close_sends_an_announcement_past_its_window_and_drops_one_still_waiting(
        notifier: Notifier, db_url: str, conn: psycopg.AsyncConnection) -> None:
    """Engine.close lets an announcement that is past its window go out (the work it
    announces committed, and another server may be waiting for it), and cancels one
    still waiting out its window, which has nothing to be sent for any more."""
    server_engine = await Engine.open(db_url, announces=True, min_size=1, max_size=1)
    available: list[None] = []
    notifier.subscribe("cyclone_available", lambda: available.append(None))
    held: psycopg.AsyncConnection | None = await server_engine.pool.getconn()  # the announcement waits for it
    closing: asyncio.Task[None] | None = None
    try:
        server_engine.announce(jobs_only=True)
        sending = next(iter(server_engine._announcements))
        await until(lambda: server_engine._announcing is None)  # past its window, waiting for the connection
        closing = asyncio.create_task(server_engine.close())
        for _ in range(20):  # close may not go past the announcement in flight
            await asyncio.sleep(0.01)
            assert not closing.done() and not sending.done()
        await server_engine.pool.putconn(held)
        held = None
        await asyncio.wait_for(asyncio.shield(closing), 30)
        assert sending.done() and not sending.cancelled()
        await until(lambda: available)  # it went out
    finally:
        if held is not None:
            await server_engine.pool.putconn(held)
        if closing is None:
            await server_engine.close()
        else:
            await closing

    # An announcement still in its window when the engine closes is never sent.
    sent = len(available)
    server_engine = await Engine.open(db_url, announces=True, min_size=1, max_size=1)
    try:
        server_engine.announce(jobs_only=True)
        waiting = server_engine._announcing
        assert waiting is not None
        await asyncio.sleep(0)  # it starts, and sleeps out its window
        assert not waiting.done()
    finally:
        await server_engine.close()
    assert waiting.cancelled()
    marker: list[None] = []
    notifier.subscribe("cyclone_run_ended", lambda: marker.append(None))
    await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")  # committed after anything it sent
    await until(lambda: marker)
    assert len(available) == sent


async def test_a_server_hears_the_other_servers_announcements_but_not_its_own(
        notifier: Notifier, db_url: str, conn: psycopg.AsyncConnection) -> None:
    """Engine.announce wakes the server's own dispatcher at once; the echo of its NOTIFY
    would only cost that dispatcher a pass finding nothing new. Another server's
    announcements, and the SQL functions' (an empty payload), still arrive."""
    ours = await Engine.open(db_url, announces=True)
    theirs = await Engine.open(db_url, announces=True)
    mine = Notifier(db_url)
    await mine.start()
    heard: list[None] = []
    mine.subscribe("cyclone_available", lambda: heard.append(None), skip={ours.announce_token})  # as WorkerHub does
    marker: list[None] = []
    mine.subscribe("cyclone_run_ended", lambda: marker.append(None))
    elsewhere: list[None] = []
    notifier.subscribe("cyclone_available", lambda: elsewhere.append(None))
    try:
        assert ours.announce_token and ours.announce_token != theirs.announce_token
        await ours.enqueue("thumbnail", input={"n": 1})
        await until(lambda: elsewhere)  # our announcement went out...
        # ... and a notification committed after it reaches our listener, which did not
        # hear ours (one connection gets its notifications in commit order).
        await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")
        await until(lambda: marker)
        assert heard == []
        await conn.execute("SELECT pg_notify('cyclone_available', '')")  # a SQL function's
        await until(lambda: heard)
        await theirs.enqueue("thumbnail", input={"n": 2})
        await until(lambda: len(heard) == 2)  # another server's announcement
    finally:
        await mine.stop()
        await ours.close()
        await theirs.close()


async def test_an_announce_token_is_never_the_sql_functions_empty_payload(db_url: str, notifier: Notifier) -> None:
    """Skipping a token must never skip the SQL functions' notifications (payload '')."""
    engines = [await Engine.open(db_url, announces=a, min_size=1, max_size=1) for a in (True, False)]
    try:
        tokens = [e.announce_token for e in engines]
        assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in tokens) and tokens[0] != tokens[1]
    finally:
        for e in engines:
            await e.close()
    with pytest.raises(ValueError, match="channel"):
        notifier.subscribe("nope", lambda: None, skip={"abc"})


async def test_run_end_watch_wakes_each_waiter_with_one_query_per_check(notifier: Notifier, engine: Engine) -> None:
    from cyclone_server.api.run_waits import RunEndWatch

    watch = RunEndWatch(engine, notifier, recheck=30)  # only notifications (and arrivals) trigger checks
    run_ids = [(await engine.enqueue("k", input=i))[0] for i in range(60)]
    waiters = {r: asyncio.create_task(watch.ended(r, timeout=60)) for r in run_ids}
    await until(lambda: watch.checks >= 1)
    for run_id in run_ids[:50]:  # each in its own transaction: 50 notifications
        assert await engine.cancel_run(run_id)
    for run_id in run_ids[:50]:
        assert await asyncio.wait_for(waiters[run_id], 30) is True
    assert not any(waiters[r].done() for r in run_ids[50:])
    # One state query for all 60 waiters per notification, not one per waiter (60 x 50).
    assert watch.checks <= 60

    # An ended run answers at once, and so does one purged since; a live one only at its timeout.
    assert await asyncio.wait_for(watch.ended(run_ids[0], timeout=60), 30) is True
    assert await engine.purge(0) == 50
    assert await asyncio.wait_for(watch.ended(run_ids[1], timeout=60), 30) is True
    assert await watch.ended(run_ids[59], timeout=0.2) is False
    for waiter in waiters.values():
        waiter.cancel()
    await watch.close()


async def test_result_batches_announce_new_work_only_when_they_may_have_made_some(engine: Engine) -> None:
    """A batch of jobs' completions makes nothing claimable: no announcement (in a drain,
    that was a NOTIFY transaction every 5 ms for the other servers, for nothing). A
    completion that promotes a DAG's next node, and a failure that schedules a retry, do
    announce."""
    announced: list[None] = []
    engine.available_listeners.append(lambda: announced.append(None))

    async def apply(lease, outcome: str = "completed", **kw) -> str:
        announced.clear()
        ((_, _, status),) = await engine.apply_results([Result(str(lease["step_id"]), lease["lease_generation"],
                                                               outcome, **kw)])
        return status

    for _ in range(3):
        await engine.enqueue("job")
    jobs = await engine.claim("w1", ["job"], limit=10, lease_ttl=30)
    announced.clear()
    statuses = await engine.apply_results([Result(str(j["step_id"]), j["lease_generation"], "completed", output=1)
                                           for j in jobs])
    assert [s for _, _, s in statuses] == ["applied"] * 3
    assert announced == []

    await engine.register_workflow("pair", [task("a"), task("b", "a")])
    await engine.submit_run("pair")
    assert await apply(await claim_one(engine, "a"), output=1) == "applied"
    assert len(announced) == 1  # b became claimable
    assert await apply(await claim_one(engine, "b"), output=2) == "applied"
    assert announced == []  # the run ended: nothing new

    await engine.enqueue("flaky")
    assert await apply(await claim_one(engine, "flaky"), "failed", message="boom", retry_delay=0) == "retried"
    assert len(announced) == 1


async def test_run_ended_says_top_when_only_top_level_runs_ended(engine: Engine, db_url: str) -> None:
    """'cyclone_run_ended' carries 'top' when the runs that ended have no parent (a job's
    completion, a DAG run's, a cancel), and '' when a child run ended, whose parent node
    the child-run settler may have to settle. Each action's notifications are read up to a
    marker sent after it."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listen, \
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
        await listen.execute("LISTEN cyclone_run_ended")

        async def payloads() -> list[str]:
            await other.execute("SELECT pg_notify('cyclone_run_ended', 'marker')")
            got = []
            async for n in listen.notifies(timeout=20):
                if n.payload == "marker":
                    return got
                got.append(n.payload)
            raise AssertionError(f"no marker; got {got}")

        async def complete(kind: str) -> None:
            lease = await claim_one(engine, kind)
            ((_, _, status),) = await engine.apply_results([Result(str(lease["step_id"]), lease["lease_generation"],
                                                                   "completed", output=1)])
            assert status == "applied"

        await engine.enqueue("job")
        await complete("job")  # the results batch's path for jobs
        assert await payloads() == ["top"]

        await start(engine, [task("a"), task("b", "a")], name="pair")
        await complete("a")
        await complete("b")  # the path for DAG steps
        assert await payloads() == ["top"]

        run_id = await start(engine, [task("c")], name="one")
        assert await engine.cancel_run(run_id)
        assert await payloads() == ["top"]

        await engine.register_workflow("leaf", [task("l")])
        await start(engine, [task("kid", type="child", workflow="leaf")], name="parent")
        await complete("l")  # the child run ends; settling its parent node ends the parent run
        assert "" in await payloads()


async def test_a_subscriber_can_skip_payloads(notifier: Notifier, conn: psycopg.AsyncConnection) -> None:
    every: list[None] = []
    settler: list[None] = []
    notifier.subscribe("cyclone_run_ended", lambda: every.append(None))
    notifier.subscribe("cyclone_run_ended", lambda: settler.append(None), skip={"top"})
    await conn.execute("SELECT pg_notify('cyclone_run_ended', 'top')")
    await conn.execute("SELECT pg_notify('cyclone_run_ended', '')")
    await until(lambda: len(every) == 2)
    assert len(settler) == 1


async def test_every_notification_of_a_burst_reaches_the_subscribers(
        notifier: Notifier, db_url: str) -> None:
    """Notifications that arrive together are read together (Notifier._read): each one
    still fires, with its own payload, and a waiter wakes."""
    every: list[None] = []
    tops: list[None] = []
    notifier.subscribe("cyclone_run_ended", lambda: every.append(None))
    notifier.subscribe("cyclone_run_ended", lambda: tops.append(None), skip={""})
    waiting = asyncio.create_task(notifier.wait("cyclone_run_ended", timeout=30))
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as sender:
        for i in range(300):  # 300 transactions back to back (one would fold its notifications)
            await sender.execute("SELECT pg_notify('cyclone_run_ended', %s)", ("top" if i % 3 == 0 else "",))
    await until(lambda: len(every) == 300)
    assert len(tops) == 100
    assert await waiting is True
