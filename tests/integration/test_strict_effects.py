"""Strict edges of the engine (docs/lifecycle.md, "Choices where the lifecycle is open"): the backoff's first delay, one status per result,
the effects of an action visible when its call returns, messages never refused for their text,
and the dispatcher's wake-up at the next due time and its pace for a worker it caught up with."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from engine_helpers import claim_one, run_row, start, states, step, task, until

from cyclone_server.stream import dispatcher as dispatch
from cyclone_server.stream.conn import WorkerConn
from cyclone_server.stream.dispatcher import MAX_LOCKED_WAIT, MIN_DUE_WAIT, Dispatcher
from cyclone_server.records import Job, Result
from cyclone_server.store.engine import Engine
from cyclone_worker._loop import run as run_on

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


def wired(engine: Engine, conns: list[WorkerConn], **kw) -> Dispatcher:
    """A Dispatcher for `conns`, told of new work by `engine` as the server's is (serve/app.py)."""
    dispatcher = Dispatcher(engine, lambda: conns, lease_ttl=30, **kw)
    engine.available_listeners.append(dispatcher.new_work)
    return dispatcher


async def test_the_dispatcher_sleeps_until_the_next_due_step_and_not_at_all_when_none_is(engine: Engine) -> None:
    conn = WorkerConn(worker_id="w1", kinds=["later", "other"], slots=4)
    stats = {"claims": collections.Counter()}
    dispatcher = wired(engine, [conn], stats=stats, claim_pace=0)  # passes back to back
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


async def test_a_step_another_claim_locked_and_did_not_take_is_claimed_at_once_when_it_lets_go(
        engine: Engine, db_url: str) -> None:
    """Another server's claim for a worker of kinds x and y with one free slot locks the
    first x and the first y step (up to its limit of each kind) and takes one (x). This server's claim for a y worker,
    meanwhile, skips the locked y step and comes up short. Nothing announces y when that
    lock goes: the dispatcher looks again in MIN_DUE_WAIT while a step of its kinds is
    claimable, not at its next wake-up or IDLE_POLL (10 s). Found by review."""
    await engine.enqueue("x", input=1)
    await engine.enqueue("y", input=2)
    wb = WorkerConn(worker_id="wb", kinds=["y"], slots=1)
    async with await psycopg.AsyncConnection.connect(db_url) as other, \
            running_dispatcher(engine, wb, claim_pace=0) as dispatcher:
        rows = await (await other.execute(
            "SELECT kind FROM cyclone_steps_claim('wa', ARRAY['x', 'y'], 1, '30 s')")).fetchall()
        assert rows == [("x",)]  # y stays locked until `other` commits
        dispatcher.wake()  # as the other server's announcement would
        await until(lambda: wb.paced_until > 0.0, "this server's claim for wb to come up short")
        assert not wb.held
        await other.commit()
        await until(lambda: len(wb.held) == 1, "y's lease", deadline=3.0)


async def test_a_step_locked_for_long_is_looked_at_less_and_less_often_while_the_lock_lasts(
        engine: Engine, db_url: str) -> None:
    """A step claimable now that the claims cannot get (another session holds its lock:
    a long cancel of a big fan-out, a session left idle in a transaction) is looked at
    again in MIN_DUE_WAIT, doubling up to MAX_LOCKED_WAIT, not every 10 ms for as long as
    the lock lasts; once it goes, the step is claimed within that wait, without a wake-up."""
    await engine.enqueue("y", input=1)
    wb = WorkerConn(worker_id="wb", kinds=["y"], slots=1)
    async with await psycopg.AsyncConnection.connect(db_url) as other, \
            running_dispatcher(engine, wb, claim_pace=0) as dispatcher:
        await other.execute("SELECT 1 FROM cyclone_steps WHERE kind = 'y' FOR UPDATE")
        dispatcher.wake()
        await until(lambda: dispatcher._locked_passes >= 1, "a pass to find y locked")
        for _ in range(6):  # each pass waits twice as long as the one before
            n = dispatcher._locked_passes
            assert dispatcher._due_in == min(MIN_DUE_WAIT * 2 ** (n - 1), MAX_LOCKED_WAIT)
            await until(lambda: dispatcher._locked_passes > n, "the next pass")
        assert dispatcher._due_in == MAX_LOCKED_WAIT  # 10 ms doubled five times, then capped
        assert not wb.held
        await other.commit()
        await until(lambda: len(wb.held) == 1, "y's lease", deadline=5.0)
    assert dispatcher._locked_passes == 0


async def test_a_worker_a_claim_got_fewer_rows_than_its_free_slots_for_waits_out_a_pace(
        engine: Engine) -> None:
    """Jobs that come while a caught-up worker's pace runs go to it together, in one claim;
    a worker with a backlog is never paced."""
    idle = WorkerConn(worker_id="idle", kinds=["trickle"], slots=8)
    busy = WorkerConn(worker_id="busy", kinds=["backlog"], slots=2)
    stats = {"claims": collections.Counter()}
    dispatcher = wired(engine, [idle, busy], stats=stats, claim_pace=60)
    await engine.enqueue_many([Job("backlog", input=i) for i in range(6)])
    await engine.enqueue("trickle", input=0)
    assert await dispatcher._pass() is None  # nothing due, and no worker was passed over
    assert (len(idle.held), len(busy.held)) == (1, 2)
    assert idle.paced_until > time.monotonic() + 50 and busy.paced_until == 0.0  # 1 of 8 rows; 2 of 2
    for i in range(1, 4):
        await engine.enqueue("trickle", input=i)
    busy.held.clear()  # its two results came: both slots free
    wait = await dispatcher._pass()
    assert wait is not None and 50 < wait <= 60  # the pass for the idle worker is owed at its pace's end
    assert (len(idle.held), len(busy.held)) == (1, 2)  # the busy worker was served at once
    idle.paced_until = time.monotonic()  # its pace is over
    before = stats["claims"]["trickle"]
    await dispatcher._pass()
    assert len(idle.held) == 4 and stats["claims"]["trickle"] - before == 3  # the three, in this one pass


async def test_a_worker_whose_short_claim_found_a_stream_of_new_jobs_is_paced_longer(engine: Engine) -> None:
    """A short claim that found new jobs of its kinds at STREAM_RATE per second or more
    since the last claim of those kinds began (and STREAM_RATE x CLAIM_PACE of them at
    least) paces its worker STREAM_PACE times as long, and so the other workers whose
    kinds it emptied: under such a stream the claims, and the messages and result batches
    that follow each one, are shared by more jobs. A trickle, a row or two, or a first
    claim pace as usual."""
    w1 = WorkerConn(worker_id="w1", kinds=["trickle"], slots=200)  # every claim here comes up short
    w2 = WorkerConn(worker_id="w2", kinds=["trickle"], slots=200)
    dispatcher = wired(engine, [w1, w2], stats={"claims": collections.Counter()}, claim_pace=60)
    stream_pace = 60 * dispatch.STREAM_PACE

    def paces() -> list[float]:
        now = time.monotonic()
        return sorted(w.paced_until - now for w in (w1, w2))

    async def claim_after(jobs: int, seconds_since_last_claim: float) -> None:
        start = sum(len(w.held) for w in (w1, w2))
        await engine.enqueue_many([Job("trickle", input=i) for i in range(jobs)])
        w1.paced_until = w2.paced_until = 0.0  # their paces are over
        dispatcher._last_claim["trickle"] = time.monotonic() - seconds_since_last_claim
        await dispatcher._pass()
        assert sum(len(w.held) for w in (w1, w2)) == start + jobs

    await engine.enqueue("trickle", input=0)
    await dispatcher._pass()  # the first claim of the kind: no rate to measure yet
    assert len(w1.held) + len(w2.held) == 1 and all(50 < p <= 60 for p in paces())

    await claim_after(1, 0.001)  # 1 job since a claim 1 ms ago: too few to tell
    assert all(50 < p <= 60 for p in paces())

    await claim_after(40, 0.001)  # 40 jobs since a claim 1 ms ago: a stream
    assert all(p > stream_pace - 10 for p in paces())  # the worker claimed for, and the one left nothing

    await claim_after(12, 1.0)  # 12 jobs in a second: a trickle
    assert all(50 < p <= 60 for p in paces())


async def test_a_worker_passed_over_for_its_pace_is_owed_a_pass_at_its_end_even_with_no_free_slot(
        engine: Engine) -> None:
    """The pass that skips a paced worker owes it one at the pace's end, also when the
    worker has no free slot at the time (here a quiet after a hand-back holds them): a
    lost wake-up when they free would otherwise leave it to IDLE_POLL. The pass at the
    pace's end, finding the worker unpaced, owes nothing more."""
    conn = WorkerConn(worker_id="w1", kinds=["trickle"], slots=4)
    stats = {"claims": collections.Counter()}
    dispatcher = wired(engine, [conn], stats=stats, claim_pace=60)
    await engine.enqueue("trickle", input=0)
    assert await dispatcher._pass() is None and len(conn.held) == 1
    assert conn.paced_until > time.monotonic() + 50  # 1 of 4
    conn.hush(30)  # a zero-delay snooze came: no free slot until the worker speaks
    assert conn.free_slots == 0
    wait = await dispatcher._pass()
    assert wait is not None and 50 < wait <= 60
    conn.heard()
    conn.paced_until = time.monotonic()  # its pace is over
    await engine.enqueue("trickle", input=1)
    assert await dispatcher._pass() is None and len(conn.held) == 2
    conn.paced_until = 0.0
    conn.hush(30)
    assert await dispatcher._pass() is None  # not paced, no free slot: nothing owed


async def test_a_lone_enqueue_that_found_the_workers_slots_held_by_a_claim_is_claimed_at_the_next_pass(
        engine: Engine) -> None:
    """The claim that held the slots may have looked before the job was written: it finds
    nothing and must not pace the worker, or the job would wait out the pace."""
    conn = WorkerConn(worker_id="w1", kinds=["trickle"], slots=4)
    stats = {"claims": collections.Counter()}
    dispatcher = wired(engine, [conn], stats=stats, claim_pace=60)
    conn.reserved = 4  # a pass's claim for the worker is in progress
    assert await dispatcher.enqueue([engine.prepare_job(Job("trickle", input=1))]) is None  # not written here
    assert conn.prompt
    conn.reserved = 0
    assert await dispatcher._pass() is None  # that claim: it saw nothing, and paces no one
    assert conn.paced_until <= time.monotonic() and not conn.prompt
    await engine.enqueue("trickle", input=1)  # the Enqueue writes its job the usual way, and wakes a pass
    await dispatcher._pass()
    assert len(conn.held) == 1
    assert conn.paced_until > time.monotonic()  # 1 of 4: that one paces as usual


async def test_a_job_that_comes_during_a_workers_pace_is_claimed_at_its_end_without_another_wake(
        engine: Engine) -> None:
    conn = WorkerConn(worker_id="w1", kinds=["trickle"], slots=4)
    async with running_dispatcher(engine, conn, claim_pace=0.5):
        await engine.enqueue("trickle", input=1)
        await until(lambda: len(conn.held) == 1, "the first job's lease")
        paced_until = conn.paced_until
        assert paced_until > 0.0  # the claim asked for 4 and got 1
        await engine.enqueue("trickle", input=2)  # new jobs only: the pass this wakes passes the worker over
        # Well before IDLE_POLL (10 s), the dispatcher's look for a lost wake-up.
        await until(lambda: len(conn.held) == 2, "the second job's lease", deadline=5.0)
        assert time.monotonic() >= paced_until


async def test_a_runs_next_step_made_claimable_by_a_result_is_claimed_without_waiting_out_a_pace(
        engine: Engine) -> None:
    """A result frees its slot and wakes a pass before it is applied: that pass finds
    nothing and paces the worker. The next step its apply makes claimable is not a new
    job, and ends the pace."""
    conn = WorkerConn(worker_id="w1", kinds=["a", "b"], slots=4)
    async with running_dispatcher(engine, conn, claim_pace=60) as dispatcher:
        await start(engine, [task("a"), task("b", "a")])
        await until(lambda: len(conn.held) == 1, "a's lease")
        [(key, _)] = conn.held.items()
        conn.answer(key)  # its result arrived: the slot is free
        conn.paced_until = 0.0
        dispatcher.wake()
        await until(lambda: conn.paced_until > time.monotonic(), "the pass the free slot started to pace the worker")
        [(_, _, status)] = await engine.apply_results([Result(key[0], key[1], "completed", output=1)])
        assert status == "applied"
        conn.forget(key)
        await until(lambda: len(conn.held) == 1, "b's lease", deadline=5.0)  # not a minute later


async def test_a_step_due_far_ahead_does_not_keep_the_dispatcher_from_its_safety_net_look(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher sleeps until the next due step, but never longer than IDLE_POLL: a
    step due in an hour must not keep it from finding, within IDLE_POLL, work whose
    wake-up was lost (here a step made due by a statement that announces nothing)."""
    monkeypatch.setattr(dispatch, "IDLE_POLL", 0.3)
    conn = WorkerConn(worker_id="w1", kinds=["later"], slots=4)
    async with running_dispatcher(engine, conn, claim_pace=0) as dispatcher:
        run_id, step_id, _ = await engine.enqueue("later", scheduled_at=datetime.now(timezone.utc) + timedelta(hours=1))
        await until(lambda: (dispatcher._due_in or 0.0) > 3000, "a pass that found the step due in an hour")
        async with engine.pool.connection() as c:
            await c.execute("UPDATE cyclone_steps SET scheduled_at = now() WHERE id = %s", [step_id])
        await until(lambda: len(conn.held) == 1, "the lease, found by the safety net's look", deadline=5.0)


@contextlib.asynccontextmanager
async def running_dispatcher(engine: Engine, conn: WorkerConn, *, claim_pace: float) -> AsyncIterator[Dispatcher]:
    """A Dispatcher for `conn` alone, running, wired to `engine` as the server wires it."""
    dispatcher = Dispatcher(engine, lambda: [conn], lease_ttl=30, stats={"claims": collections.Counter()},
                            claim_pace=claim_pace)
    engine.prompt_listeners.append(dispatcher.unpace)
    engine.available_listeners.append(dispatcher.new_work)
    task_ = asyncio.create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        await dispatcher.stop()
        await task_


async def test_a_mixed_batch_gets_the_per_result_statuses_of_the_set_based_and_the_per_step_paths(
        engine: Engine, conn) -> None:
    jobs = [(await engine.enqueue("job", input=i))[0] for i in range(3)]
    dag = await start(engine, [task("a"), task("b", "a")])
    leases = {str(r["run_id"]): r for r in await engine.claim("w", ["job", "a"], 10, 30)}
    j0, j1, j2, a = (leases[jobs[0]], leases[jobs[1]], leases[jobs[2]], leases[dag])

    def res(lease, outcome="completed", gen=None, **kw):
        return Result(str(lease["step_id"]), lease["lease_generation"] if gen is None else gen, outcome, **kw)

    statuses = await engine.apply_results([
        res(j0, output="zero"),                  # a job: set-based
        res(j1, output="one"), res(j1, output="again"),  # answered twice: applied, then ended
        res(j2, gen=7, output="stale"),          # another generation: refused
        res(a, output={"x": 1}),                 # a step of a larger run: per step, promotes b
        res(j2, "failed", message="nope"),       # a failure: per step
    ])
    assert [s for _, _, s in statuses] == ["applied", "applied", "ended", "stale", "applied", "retried"]
    assert [(await run_row(conn, r))["state"] for r in jobs] == ["completed", "completed", "running"]
    assert (await run_row(conn, jobs[0]))["result"] == {"job": "zero"}
    assert (await run_row(conn, jobs[1]))["result"] == {"job": "one"}
    assert await states(conn, dag) == {"a": "completed", "b": "available"}


async def test_racing_batches_apply_each_job_completion_exactly_once(engine: Engine, conn) -> None:
    for i in range(0, 400, 100):
        await engine.enqueue_many([Job("race", input=i + k) for k in range(100)])
    leases = await engine.claim("w", ["race"], 400, 60)
    answers = [Result(str(r["step_id"]), r["lease_generation"], "completed", output=str(r["step_id"]))
               for r in leases] * 3  # every lease answered three times, in batches that race
    random.Random(7).shuffle(answers)
    batches = [answers[i:i + 50] for i in range(0, len(answers), 50)]
    results = await asyncio.gather(*(engine.apply_results(b) for b in batches))
    applied = [sid for rows in results for sid, _, status in rows if status == "applied"]
    assert sorted(applied) == sorted(str(r["step_id"]) for r in leases)  # once each
    assert {s for rows in results for _, _, s in rows} <= {"applied", "ended"}
    cur = await conn.execute("SELECT count(*) FROM cyclone_runs WHERE state = 'completed'"
                             " AND result = jsonb_build_object('race', (SELECT s.id::text FROM cyclone_steps s"
                             "                                           WHERE s.run_id = cyclone_runs.id))")
    assert (await cur.fetchone())[0] == 400


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_a_step_due_later_is_leased_by_the_first_claim_after_its_wait(db_url: str, choice: str) -> None:
    """The dispatcher waits for a step due later on a timer. uvloop's timers may fire up to a
    millisecond early: a claim made then comes up short (the step is not due yet), and the step is
    leased MIN_DUE_WAIT later. With the timer's slack (_loop.timer_slack) the claim that ends
    the wait gets it, on either loop."""
    if choice == "uvloop":
        pytest.importorskip("uvloop")

    async def trials() -> list[list[int]]:
        engine = await Engine.open(db_url, min_size=1, max_size=4)
        rows_per_claim: list[int] = []
        real_claim = engine.claim_leases

        async def counted(*args, **kwargs):  # the real claim, its rows counted
            rows = await real_claim(*args, **kwargs)
            rows_per_claim.append(len(rows))
            return rows
        engine.claim_leases = counted  # type: ignore[method-assign]
        conn = WorkerConn(worker_id="w", kinds=["later"], slots=1)
        out: list[list[int]] = []
        try:
            async with running_dispatcher(engine, conn, claim_pace=0):
                for _ in range(15):
                    rows_per_claim.clear()
                    await engine.enqueue("later", scheduled_at=datetime.now(timezone.utc) + timedelta(seconds=0.02))
                    await until(lambda: len(conn.held) == 1, "the due step's lease", deadline=10.0)
                    out.append(list(rows_per_claim))
                    conn.held.clear()  # its slot free for the next
        finally:
            await engine.close()
        return out

    claims = run_on(trials(), choice)
    early = [c for c in claims if c.count(0) > 1]  # a claim before the one at enqueue's wake-up and the one that leased
    assert early == [], f"claims that came before the step was due (rows per claim, by trial): {early}"
