"""Engine.enqueue_many (Runs.EnqueueMany): jobs made exactly as Enqueue makes them, in one
transaction, all or none; and EnqueueBatcher, which gives concurrent Enqueue calls shared
transactions."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from engine_helpers import fetch, snapshot, until, violations

from cyclone_server.api import batching
from cyclone_server.api.batching import EnqueueBatcher
from cyclone_server.records import ENQUEUE_MANY_MAX, Job
from cyclone_server.store.engine import Engine
from cyclone_server.errors import AlreadyExists, InvalidArgument, Unavailable
from cyclone_worker._loop import run as run_on

pytestmark = pytest.mark.statemachine

# Columns that differ between two otherwise identical jobs made at different moments.
VOLATILE = {"id", "run_id", "created_at", "updated_at", "scheduled_at", "deadline_at"}


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


async def job_rows(conn, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    [run] = await fetch(conn, "SELECT * FROM cyclone_runs WHERE id = %s", run_id)
    [step] = await fetch(conn, "SELECT * FROM cyclone_steps WHERE run_id = %s", run_id)
    return run, step


async def test_jobs_are_made_as_enqueue_makes_them_in_request_order(engine: Engine, conn) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    jobs = [
        Job("email", input={"to": "a@b"}, priority=-1, options={"max_attempts": 4, "backoff_initial": 2.0}),
        Job("resize", input=[1, 2, 3], deadline=later, options={"retention": 60.0, "attempt_timeout": 5.0}),
        Job("report", scheduled_at=later, options={"max_reclaims": 0, "backoff_max": 30.0}),
        Job("traced", input={"t": 1}, priority=2,
            trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}),
        Job("plain"),
    ]
    # Without idempotency keys the batch is written set-based (cyclone__jobs_create); a
    # single Enqueue goes through cyclone__run_create: the rows must be the same.
    made = await engine.enqueue_many(jobs)
    assert len(made) == len(jobs) and all(created for _, _, created in made)
    assert len({run_id for run_id, _, _ in made}) == len(jobs)
    assert await txns(conn, [run_id for run_id, _, _ in made]) == 1
    [row] = await fetch(conn, "SELECT count(DISTINCT cmin::text) AS n FROM cyclone_runs WHERE id = ANY (%s::uuid[])",
                        [run_id for run_id, _, _ in made])
    assert row["n"] == 1  # one INSERT wrote every run

    for job, (run_id, step_id, _) in zip(jobs, made):
        one_run, one_step, _ = await engine.enqueue_job(job)
        many = await job_rows(conn, run_id)
        single = await job_rows(conn, one_run)
        assert str(many[1]["id"]) == step_id and many[1]["kind"] == job.kind
        assert comparable(many[0]) == comparable(single[0])
        assert comparable(many[1]) == comparable(single[1])
        assert many[0]["deadline_at"] == single[0]["deadline_at"]
        if job.scheduled_at is not None:
            assert many[1]["scheduled_at"] == single[1]["scheduled_at"] == job.scheduled_at
    assert await violations(conn) == {}


async def test_keys_and_inputs_that_json_escapes_are_stored_as_given(engine: Engine, conn) -> None:
    """The batch goes to Postgres as JSON text that the server writes piece by piece
    (engine._job_item): what needs escaping arrives intact, on the set-based path and
    job by job (idempotency keys), and a repeat of the keyed job finds its run."""
    later = datetime.now(timezone.utc).replace(microsecond=123456) + timedelta(hours=1)
    key = 'quote " backslash \\ tab \t line \u2028 é 😀 </script>'
    payload = {"s": 'a"b\\c\n\u2028é😀', "k\"ey": [1.5, -2, None, True], "deep": {"x": {"y": []}}}
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=1,b=2"}
    jobs = [Job("keyed", input=payload, priority=-3, idempotency_key=key, deadline=later, scheduled_at=later,
                trace_context=trace),
            Job("plain", input=payload, priority=4, deadline=later, trace_context=trace)]
    for batch in (jobs, jobs[1:]):  # job by job (a key), then set-based
        made = await engine.enqueue_many(batch)
        for job, (run_id, _, created) in zip(batch, made):
            assert created
            run, step = await job_rows(conn, run_id)
            assert run["input"] == payload and run["priority"] == job.priority
            assert run["idempotency_key"] == job.idempotency_key and run["deadline_at"] == later
            assert run["trace_context"] == trace
            assert step["priority"] == job.priority
            assert step["scheduled_at"] == later if job.scheduled_at else step["scheduled_at"] < later
    first = (await fetch(conn, "SELECT id FROM cyclone_runs WHERE idempotency_key = %s", key))[0]["id"]
    assert (await engine.enqueue_job(jobs[0]))[:1] == (str(first),)
    assert (await engine.enqueue_many([jobs[0]]))[0][:1] == (str(first),)


async def test_a_lone_surrogate_fails_its_own_job_not_the_batch_it_would_share(engine: Engine) -> None:
    """Only Python callers can send one (protobuf strings are UTF-8): in an input or an
    idempotency key it is refused, naming the field, before the job joins a batch; the
    other callers' jobs are made."""
    batcher = EnqueueBatcher(engine)
    jobs = [Job("ok", input={"n": 1}), Job("bad", input={"s": "a\ud800"}), Job("ok", input={"n": 2}),
            Job("bad", idempotency_key="k\udfff"), Job("ok", input={"n": 3})]
    outcomes = await asyncio.gather(*(batcher.enqueue(j) for j in jobs), return_exceptions=True)
    assert isinstance(outcomes[1], InvalidArgument) and outcomes[1].message.startswith("input: contains a lone surrogate")
    assert isinstance(outcomes[3], InvalidArgument) and outcomes[3].message.startswith("idempotency_key: contains")
    assert all(isinstance(outcomes[i], tuple) and outcomes[i][2] for i in (0, 2, 4)), outcomes


async def test_a_repeated_idempotency_key_in_one_call_acts_as_calls_in_order(engine: Engine, conn) -> None:
    same = Job("mail", input={"to": "x"}, idempotency_key="k1")
    (r1, s1, c1), (r2, s2, c2), (r3, _, c3) = await engine.enqueue_many([same, same, Job("other")])
    assert c1 and not c2 and c3 and (r1, s1) == (r2, s2) and r3 != r1
    # A later call, and a single Enqueue, see the same run.
    [(r4, _, c4)] = await engine.enqueue_many([same])
    assert r4 == r1 and not c4
    assert (await engine.enqueue("mail", input={"to": "x"}, idempotency_key="k1"))[0] == r1
    assert len(await fetch(conn, "SELECT id FROM cyclone_runs")) == 2


async def test_a_bad_job_writes_nothing_and_is_named_by_index(engine: Engine, conn) -> None:
    await engine.enqueue("mail", input={"to": "x"}, idempotency_key="taken")
    before = await snapshot(conn)
    good = Job("ok")

    with pytest.raises(AlreadyExists) as e:  # the database refuses jobs[2], after jobs[0..1] were inserted
        await engine.enqueue_many([good, good, Job("mail", input={"to": "y"}, idempotency_key="taken"), good])
    assert e.value.message.startswith("jobs[2]: ") and "taken" in e.value.message
    with pytest.raises(AlreadyExists) as e:  # a conflict inside the call
        await engine.enqueue_many([Job("a", idempotency_key="k"), Job("a", input=1, idempotency_key="k")])
    assert e.value.message.startswith("jobs[1]: ")

    for bad, words in [
        (Job("ok", options={"max_attempts": 0}), ("jobs[1].max_attempts",)),
        (Job("no spaces"), ("jobs[1].kind",)),
        (Job("ok", input=["y" * 1000] * 1100), ("jobs[1].input", "limit")),
    ]:
        with pytest.raises(InvalidArgument) as e:
            await engine.enqueue_many([good, bad, good])
        assert all(w in e.value.message for w in words), e.value.message
        assert "nodes[0]" not in e.value.message

    with pytest.raises(InvalidArgument, match="jobs: at least one"):
        await engine.enqueue_many([])
    with pytest.raises(InvalidArgument, match=f"over the limit of {ENQUEUE_MANY_MAX}"):
        await engine.enqueue_many([good] * (ENQUEUE_MANY_MAX + 1))
    assert await snapshot(conn) == before


async def test_a_full_call_of_jobs_is_claimable_in_priority_then_fifo_order(engine: Engine) -> None:
    jobs = [Job("k", input=i, priority=i % 3) for i in range(ENQUEUE_MANY_MAX)]
    made = await engine.enqueue_many(jobs)
    claimed = await engine.claim("w", ["k"], ENQUEUE_MANY_MAX, 30)
    order = {step_id: i for i, (_, step_id, _) in enumerate(made)}
    got = [(jobs[order[str(c["step_id"])]].priority, order[str(c["step_id"])]) for c in claimed]
    assert len(got) == ENQUEUE_MANY_MAX and got == sorted(got)


async def txns(conn, run_ids: list[str]) -> int:
    """How many transactions wrote these runs."""
    [row] = await fetch(conn, "SELECT count(DISTINCT xmin::text) AS n FROM cyclone_runs WHERE id = ANY (%s::uuid[])",
                        run_ids)
    return row["n"]


async def test_concurrent_enqueue_calls_share_transactions_and_each_gets_its_own_answer(engine: Engine,
                                                                                         conn) -> None:
    await engine.enqueue("mail", input={"to": "x"}, idempotency_key="taken")
    batcher = EnqueueBatcher(engine)
    calls = [Job("k", input={"n": i}) for i in range(300)]
    calls[17] = Job("mail", input={"to": "y"}, idempotency_key="taken")  # refused inside its batch
    calls[40] = calls[41] = Job("k", input={"n": "same"}, idempotency_key="twice")
    answers = await asyncio.gather(*(batcher.enqueue(job) for job in calls), return_exceptions=True)

    assert isinstance(answers[17], AlreadyExists) and answers[17].message.startswith('idempotency_key "taken"')
    assert answers[40][0] == answers[41][0] and sorted([answers[40][2], answers[41][2]]) == [False, True]
    made = []
    for i, job in enumerate(calls):
        if i in (17, 40, 41):
            continue
        run_id, step_id, created = answers[i]
        [row] = await fetch(conn, "SELECT r.input, s.id FROM cyclone_runs r JOIN cyclone_steps s ON s.run_id = r.id "
                                  "WHERE r.id = %s", run_id)
        assert created and row["input"] == job.input and str(row["id"]) == step_id
        made.append(run_id)
    assert len(await fetch(conn, "SELECT id FROM cyclone_runs")) == 1 + 300 - 2
    # The refusal split its batch rather than sending every job alone.
    assert await txns(conn, made) < 50
    with pytest.raises(InvalidArgument, match="max_attempts"):  # refused before it joins a batch
        await batcher.enqueue(Job("k", options={"max_attempts": 0}))
    await batcher.close()


async def test_a_caller_that_leaves_before_its_batch_leaves_no_job(engine: Engine, db_url: str, conn) -> None:
    batcher = EnqueueBatcher(engine, parallel=1)
    # Hold the first batch in the database: it waits for its idempotency key's lock.
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as holder:
        await holder.execute("SELECT pg_advisory_lock(hashtextextended('cyclone.idempotency:' || 'held', 0))")
        first = asyncio.create_task(batcher.enqueue(Job("k", input="first", idempotency_key="held")))
        await eventually_waiting_for_lock(conn)  # its batch is in the database, waiting
        gone = asyncio.create_task(batcher.enqueue(Job("k", input="gone")))
        await asyncio.sleep(0)  # queued behind the held batch
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert not batcher._waiting
        await holder.execute("SELECT pg_advisory_unlock_all()")
    assert (await asyncio.wait_for(first, 30))[2]
    assert (await asyncio.wait_for(batcher.enqueue(Job("k", input="later")), 30))[2]
    inputs = sorted(r["input"] for r in await fetch(conn, "SELECT input FROM cyclone_runs"))
    assert inputs == ["first", "later"]
    await batcher.close()


async def test_when_the_database_is_unreachable_every_caller_gets_the_error(db_url: str, conn) -> None:
    engine = await Engine.open(db_url, min_size=1, max_size=2)
    batcher = EnqueueBatcher(engine)
    await engine.close()
    answers = await asyncio.wait_for(
        asyncio.gather(*(batcher.enqueue(Job("k", input=i)) for i in range(20)), return_exceptions=True), 30)
    assert all(isinstance(a, Unavailable) for a in answers), answers
    assert await fetch(conn, "SELECT id FROM cyclone_runs") == []
    await batcher.close()


async def test_calls_with_the_same_keys_in_other_orders_do_not_deadlock(engine: Engine, conn) -> None:
    keys = [f"key-{i}" for i in range(300)]
    forward = [Job("k", input=k, idempotency_key=k) for k in keys]
    backward = list(reversed(forward))
    a, b = await asyncio.gather(engine.enqueue_many(forward), engine.enqueue_many(backward))
    by_key = {k: run_id for k, (run_id, _, _) in zip(keys, a)}
    assert {k: run_id for k, (run_id, _, _) in zip(reversed(keys), b)} == by_key
    assert sum(created for _, _, created in a + b) == 300
    assert len(await fetch(conn, "SELECT id FROM cyclone_runs")) == 300


async def eventually_waiting_for_lock(conn, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await fetch(conn, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"):
        assert asyncio.get_running_loop().time() < deadline, "no transaction waits for the advisory lock"
        await asyncio.sleep(0.01)


async def test_a_batch_the_set_based_path_cannot_write_goes_job_by_job_and_names_the_job(engine: Engine,
                                                                                         conn) -> None:
    # Past Python's checks (a job made by hand): the set-based insert fails on the step's
    # NOT NULL kind, rolls back, and the job-by-job path names the job it failed on.
    node = engine.prepare_job(Job("ok")).params["node"]
    jobs = [{"node": node, "input": {"i": i}} for i in range(3)]
    jobs[1] = {"node": {**node, "kind": None}, "input": None}
    before = await snapshot(conn)
    with pytest.raises(psycopg.errors.NotNullViolation) as e:
        await conn.execute("SELECT * FROM cyclone_jobs_enqueue(%s)", [psycopg.types.json.Jsonb(jobs)])
    assert e.value.diag.message_primary.startswith("jobs[1]: ")
    assert await snapshot(conn) == before


async def test_enqueue_claim_takes_the_oldest_steps_first_and_announces_what_it_leaves(engine: Engine, conn) -> None:
    """Engine.enqueue_claim (Enqueue with a worker waiting) writes the jobs and claims in the
    same transaction, in priority then FIFO order: an older step of the kind goes first.
    It announces new work only when a job it made is left claimable."""
    announced = []
    engine.available_listeners.append(lambda: announced.append(1))
    old_run, old_step, _ = await engine.enqueue("k", input="old")
    announced.clear()

    rows, leases = await engine.enqueue_claim([engine.prepare_job(Job("k", input="new"))], "w", ["k"], 1, 30)
    [(new_run, new_step, created)] = rows
    assert created and [lease.step_id for lease in leases] == [old_step]  # the older one
    assert announced == [1]  # the new job is still claimable
    announced.clear()

    rows, leases = await engine.enqueue_claim([engine.prepare_job(Job("k", input="newer"))], "w", ["k"], 5, 30)
    [(newer_run, newer_step, _)] = rows
    assert [lease.step_id for lease in leases] == [new_step, newer_step]
    assert announced == []  # everything it made was claimed with it
    # The lease rows are the dispatcher's claim's, column for column.
    assert leases[1].run_id == newer_run and (leases[1].attempt, leases[1].lease_generation) == (1, 1)
    assert leases[1].input == '"newer"' and leases[1].parents is None
    steps = await fetch(conn, "SELECT s.id::text, s.state, s.lease_owner, s.started_at = r.created_at AS same_txn "
                              "FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id ORDER BY s.id")
    assert [(s["id"], s["state"], s["lease_owner"], s["same_txn"]) for s in steps] == [
        (old_step, "running", "w", False), (new_step, "running", "w", False), (newer_step, "running", "w", True)]
    assert await violations(conn) == {}


async def test_a_lone_call_is_written_with_a_claim_and_concurrent_calls_without(engine: Engine, conn) -> None:
    """EnqueueBatcher writes a call that comes alone with its claim for a waiting worker
    (the server's Dispatcher.enqueue); a job the database refuses there rolls back whole and
    is written again the usual way, which gives its error. Calls that come together are
    written as one batch without a claim: the dispatcher claims for them in bulk."""
    await engine.enqueue("mail", input={"to": "x"}, idempotency_key="taken")
    tried = []

    async def claim(jobs):
        tried.append(len(jobs))
        rows, _ = await engine.enqueue_claim(jobs, "w", ["k"], 100, 30)
        return rows

    batcher = EnqueueBatcher(engine, claim=claim)
    with pytest.raises(AlreadyExists, match='idempotency_key "taken"'):
        await batcher.enqueue(Job("mail", input={"to": "y"}, idempotency_key="taken"))
    run_id, _, created = await batcher.enqueue(Job("k", input="alone"))
    assert created and tried == [1, 1]
    [step] = await fetch(conn, "SELECT state, lease_owner FROM cyclone_steps WHERE run_id = %s", run_id)
    assert (step["state"], step["lease_owner"]) == ("running", "w")

    answers = await asyncio.gather(*(batcher.enqueue(Job("k", input=i)) for i in range(30)))
    assert all(created for _, _, created in answers) and tried == [1, 1]
    states = await fetch(conn, "SELECT s.state, count(*) AS n FROM cyclone_steps s JOIN cyclone_runs r "
                               "ON r.id = s.run_id WHERE r.input <> '\"alone\"' AND s.kind = 'k' GROUP BY s.state")
    assert [(r["state"], r["n"]) for r in states] == [("available", 30)]
    assert await violations(conn) == {}
    await batcher.close()


async def test_a_call_that_waited_for_a_batch_is_written_without_a_claim_even_alone(engine: Engine, conn) -> None:
    """A call that comes while a batch is written is part of a stream of calls: it goes in
    the next batch without a claim, even when it is that batch's only job, and the
    dispatcher's claim serves it with the rest. Each such lone claim cost a transaction,
    and a Leases, a Results and an acks message for one lease (docs/benchmarks.md)."""
    tried: list[str] = []
    writing = asyncio.Event()
    release = asyncio.Event()

    async def claim(jobs):
        tried.append(jobs[0].params["input"])
        writing.set()
        await release.wait()  # the first batch is still being written when the second call comes
        rows, _ = await engine.enqueue_claim(jobs, "w", ["k"], 100, 30)
        return rows

    batcher = EnqueueBatcher(engine, claim=claim)
    first = asyncio.create_task(batcher.enqueue(Job("k", input="first")))
    await asyncio.wait_for(writing.wait(), 10)
    second = asyncio.create_task(batcher.enqueue(Job("k", input="second")))
    while not batcher._waiting:  # the second call queued behind the batch in progress
        await asyncio.sleep(0)
    release.set()
    (first_run, _, _), (second_run, _, _) = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert tried == ["first"]
    rows = await fetch(conn, "SELECT run_id::text, state, lease_owner FROM cyclone_steps WHERE run_id = ANY(%s::uuid[])",
                       [first_run, second_run])
    states = {r["run_id"]: (r["state"], r["lease_owner"]) for r in rows}
    assert states == {first_run: ("running", "w"), second_run: ("available", None)}

    third_run, _, _ = await batcher.enqueue(Job("k", input="third"))  # alone again, once the writer is idle
    assert tried == ["first", "third"]
    [step] = await fetch(conn, "SELECT state, lease_owner FROM cyclone_steps WHERE run_id = %s", third_run)
    assert (step["state"], step["lease_owner"]) == ("running", "w")
    assert await violations(conn) == {}
    await batcher.close()


def held_claim(engine: Engine) -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A claim for EnqueueBatcher that holds the first batch (a lone call) until `release`:
    calls made meanwhile queue behind it."""
    writing, release = asyncio.Event(), asyncio.Event()

    async def claim(jobs):
        writing.set()
        await release.wait()
        rows, _ = await engine.enqueue_claim(jobs, "w", ["k"], 100, 30)
        return rows
    return claim, writing, release


def gather_times(monkeypatch, slice_: float = 0.5, max_: float = 10.0, **more: float) -> None:
    """Long GATHER_* times, so that the tests do not depend on the machine's pace."""
    for name, value in {"GATHER_SLICE": slice_, "GATHER_MAX": max_, **more}.items():
        monkeypatch.setattr(batching, name, value)


async def behind_a_held_batch(engine: Engine, waiting: int) -> tuple[EnqueueBatcher, list[asyncio.Task]]:
    """A batcher whose first batch was written after `waiting` calls queued behind it; returns
    once that batch committed, with the writer deciding about the next."""
    claim, writing, release = held_claim(engine)
    batcher = EnqueueBatcher(engine, claim=claim)
    first = asyncio.create_task(batcher.enqueue(Job("k", input="first")))
    await asyncio.wait_for(writing.wait(), 10)
    behind = [asyncio.create_task(batcher.enqueue(Job("k", input=i))) for i in range(waiting)]
    await until(lambda: len(batcher._waiting) == waiting, "the calls queue behind the held batch", deadline=10.0)
    release.set()
    await asyncio.wait_for(first, 10)
    return batcher, behind


async def test_a_batch_behind_another_waits_while_more_calls_come(engine: Engine, conn, monkeypatch) -> None:
    """Under a stream of calls (GATHER_MIN already waiting behind a batch), the next batch
    waits while each slice brings more calls: a call that comes during the wait joins it."""
    gather_times(monkeypatch)
    batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN)
    late = asyncio.create_task(batcher.enqueue(Job("k", input="late")))
    answers = await asyncio.wait_for(asyncio.gather(*behind, late), 10)
    assert all(created for _, _, created in answers)
    assert await txns(conn, [run_id for run_id, _, _ in answers]) == 1
    assert await violations(conn) == {}
    await batcher.close()


@pytest.mark.parametrize("waiting", ["too few", "enough"])
async def test_a_batch_behind_another_is_written_at_once_with_too_few_or_enough_calls(
        engine: Engine, conn, monkeypatch, waiting: str) -> None:
    """One call waiting behind a batch is no stream: it is written at once, as are
    GATHER_ENOUGH calls. A call that comes while that batch is written goes in the next."""
    gather_times(monkeypatch, GATHER_ENOUGH=4)
    batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN - 1 if waiting == "too few" else 4)
    late = asyncio.create_task(batcher.enqueue(Job("k", input="late")))
    answers = await asyncio.wait_for(asyncio.gather(*behind, late), 10)
    assert await txns(conn, [run_id for run_id, _, _ in answers[:-1]]) == 1
    assert await txns(conn, [run_id for run_id, _, _ in answers]) == 2
    await batcher.close()


async def test_a_batch_waits_on_while_each_slice_brings_more_calls_and_stops_after_one_that_brings_none(
        engine: Engine, conn, monkeypatch) -> None:
    slices: list[float] = []
    ends: asyncio.Queue[None] = asyncio.Queue()

    async def paced(seconds: float) -> None:  # a slice ends when the test says so
        slices.append(seconds)
        await ends.get()
    monkeypatch.setattr(batching, "_sleep", paced)
    gather_times(monkeypatch, max_=60.0)
    batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN)
    late = []
    for i in range(2):  # a call comes in each of two slices
        await until(lambda: len(slices) == i + 1, f"slice {i + 1} starts", deadline=10.0)
        late.append(asyncio.create_task(batcher.enqueue(Job("k", input=f"late{i}"))))
        await until(lambda: len(batcher._waiting) == batching.GATHER_MIN + i + 1, "the late call queues",
                    deadline=10.0)
        ends.put_nowait(None)
    await until(lambda: len(slices) == 3, "a third slice starts", deadline=10.0)  # and brings none
    ends.put_nowait(None)
    answers = await asyncio.wait_for(asyncio.gather(*behind, *late), 10)
    assert len(slices) == 3 and slices[0] == batching.GATHER_SLICE
    assert await txns(conn, [run_id for run_id, _, _ in answers]) == 1
    await batcher.close()


async def test_a_stream_that_never_stops_still_has_its_batch_written_within_gather_max(
        engine: Engine, conn, monkeypatch) -> None:
    gather_times(monkeypatch, 0.1, 0.5, GATHER_ENOUGH=10_000)  # only the time limit ends the wait
    batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN)
    stream: list[asyncio.Task] = []

    async def feed() -> None:  # a call every 20 ms, so that every slice brings more
        for i in range(1000):
            stream.append(asyncio.create_task(batcher.enqueue(Job("k", input=f"s{i}"))))
            await asyncio.sleep(0.02)
    feeder = asyncio.create_task(feed())
    try:
        answers = await asyncio.wait_for(asyncio.gather(*behind), 5)  # the stream goes on for 20 s
    finally:
        feeder.cancel()
    await asyncio.gather(*stream)
    assert await txns(conn, [run_id for run_id, _, _ in answers]) == 1
    await batcher.close()


async def test_callers_that_leave_while_a_batch_gathers_leave_no_job_and_the_writer_ends(
        engine: Engine, conn, monkeypatch) -> None:
    gather_times(monkeypatch)
    batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN)
    for task in behind:
        task.cancel()
    await asyncio.gather(*behind, return_exceptions=True)
    assert not batcher._waiting
    [writer] = batcher._tasks
    await asyncio.wait_for(batcher.close(), 10)  # the writer saw nobody left and ended, without an error
    assert batcher._writers == 0 and writer.exception() is None
    run_id, _, created = await asyncio.wait_for(batcher.enqueue(Job("k", input="later")), 10)
    inputs = sorted(r["input"] for r in await fetch(conn, "SELECT input FROM cyclone_runs"))
    assert created and inputs == ["first", "later"]
    await batcher.close()


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_a_gather_slice_is_one_the_loops_timers_can_wait(db_url: str, monkeypatch, choice: str) -> None:
    """uvloop's timers count whole milliseconds and drop the rest: there a slice of
    GATHER_SLICE (0.5 ms) would end after one turn of the loop, and the batch with it; the
    batcher waits GATHER_SLICE_UVLOOP (1 ms) there, which lasts what 0.5 ms does on asyncio's."""
    if choice == "uvloop":
        pytest.importorskip("uvloop")
    slices: list[float] = []

    async def recorded(seconds: float) -> None:
        slices.append(seconds)
        await asyncio.sleep(seconds)
    monkeypatch.setattr(batching, "_sleep", recorded)

    async def go() -> None:
        engine = await Engine.open(db_url, min_size=1, max_size=4)
        try:
            batcher, behind = await behind_a_held_batch(engine, batching.GATHER_MIN)
            await asyncio.wait_for(asyncio.gather(*behind), 10)
            await batcher.close()
        finally:
            await engine.close()
    run_on(go(), choice)
    assert slices
    if choice == "uvloop":  # a whole millisecond at least: uvloop drops a timer's sub-millisecond part
        assert slices[0] >= 0.001
    else:
        assert slices[0] == batching.GATHER_SLICE
