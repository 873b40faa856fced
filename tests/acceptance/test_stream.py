"""The worker stream (Workers.Connect) against a real server, spoken with the raw generated stubs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import duration_pb2, struct_pb2

from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc
from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc
from cyclone_server.stream.conn import HANDBACK_QUIET

from waits_helpers import until

DEADLINE = 30.0


class RawWorker:
    """A worker written against the stubs only: answers Pings, sorts what the server sends.

    Its writes go one at a time (write, done_writing): grpc.aio allows one write in flight
    per call, and two at once end the call with INTERNAL "Internal error from Core" (20
    streams of 20 broke within 100 tries of two concurrent writes). A Pong the reader wrote
    while a test's write was in flight would end the stream that way, and the reader with
    it, unseen: the test then waited its whole DEADLINE for leases. A `next` that times out
    says how the reader ended (ended, broken)."""

    def __init__(self, channel: grpc.aio.Channel, kinds: list[str], slots: int, *,
                 worker_id: str | None = None, held: list[pb.LeaseRef] = (), pong: bool = True) -> None:
        self.stub = workers_pb2_grpc.WorkersStub(channel)
        self.hello = pb.Hello(worker_id=worker_id or f"raw-{uuid.uuid4()}", kinds=kinds, slots=slots,
                              held=list(held), sdk="test/raw")
        self.inbox: dict[str, asyncio.Queue[Any]] = {k: asyncio.Queue() for k in ("welcome", "leases", "acks", "stop")}
        self.pings = 0
        self.pong = pong
        self.call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()
        self.ended: grpc.aio.AioRpcError | None = None  # the status the stream ended with
        self.broken: BaseException | None = None  # what else ended the reader

    async def connect(self) -> pb.Welcome:
        self.call = self.stub.Connect()
        await self.write(pb.WorkerMessage(hello=self.hello))
        self._reader = asyncio.create_task(self._read())
        return await self.next("welcome")

    async def write(self, msg: pb.WorkerMessage) -> None:
        async with self._writing:
            await self.call.write(msg)

    async def done_writing(self) -> None:
        self.pong = False  # no write after the half-close (a Ping may still come)
        async with self._writing:
            await self.call.done_writing()

    async def _read(self) -> None:
        try:
            async for msg in self.call:
                which = msg.WhichOneof("msg")
                if which == "ping":
                    self.pings += 1
                    if self.pong:
                        await self.write(pb.WorkerMessage(pong=pb.Pong(nonce=msg.ping.nonce)))
                else:
                    self.inbox[which].put_nowait(getattr(msg, which))
        except grpc.aio.AioRpcError as e:
            self.ended = e
        except Exception as e:
            self.broken = e
            raise

    async def next(self, kind: str, timeout: float = DEADLINE) -> Any:
        try:
            return await asyncio.wait_for(self.inbox[kind].get(), timeout)
        except TimeoutError as e:
            if self.broken is not None:
                raise AssertionError(f"no {kind} within {timeout} s: the reader broke with {self.broken!r}") \
                    from self.broken
            if self.ended is not None:
                e.add_note(f"the stream had ended: {self.ended.code()} {self.ended.details()!r}")
            raise

    async def leases(self, n: int, timeout: float = DEADLINE) -> list[pb.Lease]:
        """The next `n` leases (they may come in several Leases messages)."""
        out: list[pb.Lease] = []
        while len(out) < n:
            out += (await self.next("leases", timeout)).leases
        return out

    async def acks(self, n: int) -> list[pb.ResultAck]:
        out: list[pb.ResultAck] = []
        while len(out) < n:
            out += (await self.next("acks")).acks
        return out

    async def send(self, *results: pb.StepResult) -> None:
        await self.write(pb.WorkerMessage(results=pb.Results(results=list(results))))

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def completed(lease: pb.Lease, output: Any = None, generation: int | None = None) -> pb.StepResult:
    value = struct_pb2.Value()
    if output is not None:
        value.string_value = str(output)
    return pb.StepResult(step_id=lease.step_id,
                         lease_generation=lease.lease_generation if generation is None else generation,
                         completed=pb.Completed(output=value))


async def enqueue(channel: grpc.aio.Channel, kind: str, n: int = 1, **options: Any) -> list[runs_pb2.EnqueueResponse]:
    runs = runs_pb2_grpc.RunsStub(channel)
    return [await runs.Enqueue(runs_pb2.EnqueueRequest(kind=kind, **options)) for _ in range(n)]


async def get_step(channel: grpc.aio.Channel, run_id: str) -> types_pb2.Step:
    run = await runs_pb2_grpc.RunsStub(channel).GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    return run.steps[0]


@contextlib.asynccontextmanager
async def one_lease(address: str, kind: str = "resize") -> AsyncIterator[tuple[Any, ...]]:
    """A channel to the server at `address`, one job of `kind`, and a one-slot RawWorker
    holding its lease: yields (channel, job, worker, lease)."""
    async with grpc.aio.insecure_channel(address) as channel:
        (job,) = await enqueue(channel, kind)
        w = RawWorker(channel, [kind], 1)
        try:
            await w.connect()
            (lease,) = await w.leases(1)
            yield channel, job, w, lease
        finally:
            await w.close()


async def claim_waits(watch: psycopg.AsyncConnection) -> bool:
    """A claim (cyclone_leases_claim) is waiting for a lock: the test holds it up."""
    row = await (await watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%%cyclone_leases_claim%%'")).fetchone()
    return row[0] > 0


@pytest.fixture
async def workers(channel: grpc.aio.Channel):
    made: list[RawWorker] = []

    def make(kinds: list[str], slots: int, *, on: grpc.aio.Channel | None = None, **kw: Any) -> RawWorker:
        w = RawWorker(on or channel, kinds, slots, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        await w.close()


async def test_hello_is_answered_with_welcome(workers) -> None:
    welcome = await workers(["resize"], 1).connect()
    assert welcome.server_id
    assert welcome.lease_ttl.ToTimedelta().total_seconds() == 2
    assert welcome.heartbeat_interval.ToTimedelta().total_seconds() == pytest.approx(2 / 3, abs=0.01)
    assert list(welcome.lost) == []


async def test_leases_never_exceed_slots_and_follow_results(channel, workers) -> None:
    jobs = await enqueue(channel, "resize", 5)
    w = workers(["resize"], 2)
    await w.connect()
    first = await w.leases(2)
    # Two heartbeats later the server has had every chance to push more: it did not.
    await until(lambda: w.pings >= 2, "two heartbeats", DEADLINE)
    assert w.inbox["leases"].empty()
    states = [(await get_step(channel, j.run_id)).state for j in jobs]
    assert states.count(types_pb2.STEP_STATE_RUNNING) == 2
    done = 0
    held = list(first)
    while held:
        lease = held.pop()
        await w.send(completed(lease))
        (a,) = await w.acks(1)
        assert (a.step_id, a.lease_generation, a.status) == (lease.step_id, lease.lease_generation,
                                                             pb.ACK_STATUS_APPLIED)
        done += 1
        if done + len(held) < 5:
            held += await w.leases(1)  # the freed slot is filled without asking
        assert len(held) <= 2
    assert done == 5
    for j in jobs:
        assert (await get_step(channel, j.run_id)).state == types_pb2.STEP_STATE_COMPLETED


async def test_a_slot_frees_when_its_result_arrives_while_the_result_commits(channel, workers, db_url) -> None:
    """`slots` is how many leases a worker runs at once: once a lease's result reaches the
    server, the next lease is pushed while that result is still being applied (held up
    here by a lock on its run), and the ack follows when it commits."""
    await enqueue(channel, "resize", 2)
    w = workers(["resize"], 1)
    await w.connect()
    (first,) = await w.leases(1)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR UPDATE", [first.run_id])
            await w.send(completed(first))
            (second,) = await w.leases(1)
            assert second.step_id != first.step_id
            assert w.inbox["acks"].empty(), "the first result cannot have been applied: its run is locked"
    (a,) = await w.acks(1)
    assert (a.step_id, a.status) == (first.step_id, pb.ACK_STATUS_APPLIED)
    await w.send(completed(second))
    (b,) = await w.acks(1)
    assert (b.step_id, b.status) == (second.step_id, pb.ACK_STATUS_APPLIED)
    assert (await get_step(channel, first.run_id)).state == types_pb2.STEP_STATE_COMPLETED


async def test_no_lease_is_pushed_to_a_worker_while_its_snooze_waits_for_its_ack(channel, workers, db_url) -> None:
    """A snooze hands a lease back. A stopping worker hands back the leases it did not
    start as zero-delay snoozes and half-closes right after (the Python SDK does): a lease
    pushed to it in between (the step just handed back, or any other) would never run and
    wait for its lease to expire. So while a worker's snooze waits for its ack (held up
    here by a lock on its run) it gets no lease, though it has a free slot and work
    arrives; after the ack it does."""
    (job1,) = await enqueue(channel, "resize")
    w = workers(["resize"], 2)
    await w.connect()
    (first,) = await w.leases(1)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR UPDATE", [first.run_id])
            await w.send(pb.StepResult(step_id=first.step_id, lease_generation=first.lease_generation,
                                       snoozed=pb.Snoozed(delay=duration_pb2.Duration())))
            (job2,) = await enqueue(channel, "resize")
            with pytest.raises(TimeoutError):  # pushed within milliseconds were the worker not paused
                await w.next("leases", timeout=0.5)
    (a,) = await w.acks(1)
    assert (a.step_id, a.status) == (first.step_id, pb.ACK_STATUS_APPLIED)
    again = {x.step_id: x for x in await w.leases(2)}
    assert set(again) == {first.step_id, job2.step_id}
    assert (again[first.step_id].attempt, again[first.step_id].lease_generation) == (1, first.lease_generation + 1)


@pytest.mark.parametrize("commit_outlasts_quiet", [False, True], ids=["commit-fast", "commit-outlasts-quiet"])
async def test_a_worker_that_half_closes_once_its_hand_back_is_acked_is_pushed_nothing_in_between(
        channel, workers, db_url, commit_outlasts_quiet) -> None:
    """A stopping worker hands back the leases it did not start (zero-delay snoozes) and
    half-closes right after. On a loaded machine the server could ack the snooze before it
    read the half-close, and push the step, claimable again at once, back to that worker:
    it would never run it (and the lease, claimed again, counted a reclaim). After a
    zero-delay snooze a worker gets no lease until its next message shows it carries on,
    or HANDBACK_QUIET passes: this worker half-closes only once the ack is in.

    commit-outlasts-quiet: the snooze's commit takes longer than HANDBACK_QUIET (a lock
    on the run holds it up, as a loaded machine could), so a quiet counted from the
    snooze alone would be over by the ack; it lasts HANDBACK_QUIET from the ack as well."""
    (job,) = await enqueue(channel, "resize")
    w = workers(["resize"], 2, pong=False)
    await w.connect()
    (lease,) = await w.leases(1)
    hand_back = pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                              snoozed=pb.Snoozed(delay=duration_pb2.Duration()))
    if commit_outlasts_quiet:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR UPDATE", [lease.run_id])
                await w.send(hand_back)
                with pytest.raises(TimeoutError):  # the snooze waits for the lock, longer than the quiet
                    await w.next("acks", timeout=3 * HANDBACK_QUIET)
    else:
        await w.send(hand_back)
    (a,) = await w.acks(1)
    assert (a.step_id, a.status) == (lease.step_id, pb.ACK_STATUS_APPLIED)
    await w.done_writing()
    assert await asyncio.wait_for(w.call.code(), DEADLINE) == grpc.StatusCode.OK
    assert w.inbox["leases"].empty()
    step = await get_step(channel, job.run_id)
    assert (step.state, step.attempt, step.snoozes, step.reclaims, step.lease_generation) == (
        types_pb2.STEP_STATE_AVAILABLE, 1, 1, 0, lease.lease_generation)


async def test_a_hand_back_is_answered_with_a_ping_and_a_worker_that_carries_on_gets_its_step_back(
        db_url, start_server) -> None:
    """After a zero-delay snooze the server pings the worker at once (heartbeats come every
    lease_ttl / 3, 20 s here): a worker that carries on answers, which ends the quiet, and
    its snoozed step, due at once, comes back to it (docs/lifecycle.md, "Due steps are leased within 50 ms") within that round trip."""
    srv = start_server(db_url, lease_ttl=60)
    async with one_lease(srv.address) as (_, _, w, lease):
        await w.send(pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                                   snoozed=pb.Snoozed(delay=duration_pb2.Duration())))
        await until(lambda: w.pings > 0, "a heartbeat", 10)
        (again,) = await w.leases(1)
        assert (again.step_id, again.lease_generation, again.snoozes) == (
            lease.step_id, lease.lease_generation + 1, 1)


async def test_leases_claimed_while_a_hand_back_arrives_are_pushed_once_the_worker_carries_on(
        channel, workers, db_url) -> None:
    """A claim for a worker can be under way when its zero-delay snooze arrives. Its leases
    wait, in their slots, until the worker shows it carries on (or the quiet passes), then
    go out; nothing is lost and the worker's slots are never exceeded. The claim is held up
    by a lock on the steps table while the snooze arrives."""
    (a,) = await enqueue(channel, "resize")
    (c,) = await enqueue(channel, "resize")
    w = workers(["resize"], 2, pong=False)
    await w.connect()
    first = {x.step_id: x for x in await w.leases(2)}
    (b,) = await enqueue(channel, "resize")
    async with await psycopg.AsyncConnection.connect(db_url) as conn, \
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as watch:
        async with conn.transaction():
            await conn.execute("LOCK TABLE cyclone_steps IN SHARE ROW EXCLUSIVE MODE")
            await w.send(completed(first[c.step_id]))  # its slot frees now: a claim for b starts
            await until(lambda: claim_waits(watch), "a claim waiting for the lock", DEADLINE)
            handed = first[a.step_id]
            await w.send(pb.StepResult(step_id=handed.step_id, lease_generation=handed.lease_generation,
                                       snoozed=pb.Snoozed(delay=duration_pb2.Duration())))
    acks = {x.step_id: x.status for x in await w.acks(2)}
    assert acks == {a.step_id: pb.ACK_STATUS_APPLIED, c.step_id: pb.ACK_STATUS_APPLIED}
    again = {x.step_id: x for x in await w.leases(2)}
    assert set(again) == {a.step_id, b.step_id}
    assert (again[a.step_id].attempt, again[a.step_id].lease_generation) == (1, handed.lease_generation + 1)
    with pytest.raises(TimeoutError):  # two slots, two leases held: nothing more
        await w.next("leases", timeout=0.3)


async def test_leases_claimed_for_a_worker_that_half_closed_meanwhile_are_reclaimed_at_once(
        db_url, start_server) -> None:
    """The dispatcher checks a worker's free slots, then claims: a worker can half-close
    (stop) while the claim runs, and would never answer what it claimed. Those leases are
    reclaimed as soon as the claim returns, not at their expiry (60 s here). The claim is
    held up by a lock on the steps table until the worker is gone."""
    srv = start_server(db_url, lease_ttl=60)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        (job,) = await enqueue(channel, "resize")
        w = RawWorker(channel, ["resize"], 1)
        try:
            async with await psycopg.AsyncConnection.connect(db_url) as conn, \
                    await psycopg.AsyncConnection.connect(db_url, autocommit=True) as watch:
                async with conn.transaction():
                    await conn.execute("LOCK TABLE cyclone_steps IN SHARE ROW EXCLUSIVE MODE")
                    await w.connect()
                    await until(lambda: claim_waits(watch), "a claim waiting for the lock", DEADLINE)
                    w.pong = False
                    await w.done_writing()
                    assert await asyncio.wait_for(w.call.code(), DEADLINE) == grpc.StatusCode.OK
            # (Polled until reclaimed: right after the lock goes, the claim may not have run yet.)
            step = await until(lambda: _reclaimed(channel, job.run_id), "the step reclaimed", 10)
            assert (step.state, step.attempt) == (types_pb2.STEP_STATE_AVAILABLE, 1)
            assert w.inbox["leases"].empty()
        finally:
            await w.close()


async def _reclaimed(channel: grpc.aio.Channel, run_id: str) -> types_pb2.Step | None:
    step = await get_step(channel, run_id)
    return step if step.reclaims > 0 else None


async def test_results_batched_in_one_message_each_get_an_ack(channel, workers) -> None:
    await enqueue(channel, "resize", 4)
    w = workers(["resize"], 4)
    await w.connect()
    leases = await w.leases(4)
    await w.send(*(completed(lease, i) for i, lease in enumerate(leases)))
    acks = await w.acks(4)
    assert {(a.step_id, a.lease_generation) for a in acks} == {(x.step_id, x.lease_generation) for x in leases}
    assert {a.status for a in acks} == {pb.ACK_STATUS_APPLIED}


async def test_a_stale_generation_is_refused_and_changes_nothing(channel, workers) -> None:
    (job,) = await enqueue(channel, "resize")
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    await w.send(completed(lease, generation=lease.lease_generation + 7))
    (a,) = await w.acks(1)
    assert a.status == pb.ACK_STATUS_STALE
    step = await get_step(channel, job.run_id)
    assert (step.state, step.lease_generation) == (types_pb2.STEP_STATE_RUNNING, lease.lease_generation)
    await w.send(completed(lease))
    assert (await w.acks(1))[0].status == pb.ACK_STATUS_APPLIED


async def test_unknown_and_malformed_steps_are_refused_unknown(workers) -> None:
    w = workers(["resize"], 1)
    await w.connect()
    await w.send(pb.StepResult(step_id=str(uuid.uuid4()), lease_generation=1, completed=pb.Completed()),
                 pb.StepResult(step_id="not-a-step", lease_generation=1, completed=pb.Completed()))
    acks = await w.acks(2)
    assert [a.status for a in acks] == [pb.ACK_STATUS_UNKNOWN] * 2


async def test_an_output_that_cannot_be_stored_is_invalid_and_spares_the_rest_of_the_batch(channel, workers) -> None:
    # The retry of `bad` is due in a minute: its second answer meets an ended lease, not a new one.
    await enqueue(channel, "resize", 2, backoff_initial=duration_pb2.Duration(seconds=60))
    w = workers(["resize"], 2)
    await w.connect()
    bad, good = await w.leases(2)
    await w.send(completed(bad, "nul \x00 byte"), completed(good, "fine"))
    acks = {a.step_id: a for a in await w.acks(2)}
    assert acks[good.step_id].status == pb.ACK_STATUS_APPLIED
    assert acks[bad.step_id].status == pb.ACK_STATUS_INVALID
    assert "completed.output" in acks[bad.step_id].detail
    # The server failed that attempt in the answer's place: the lease is over.
    await w.send(completed(bad, "no nul byte"))
    assert (await w.acks(1))[0].status == pb.ACK_STATUS_ENDED


@pytest.mark.parametrize("first, field", [
    (pb.WorkerMessage(pong=pb.Pong(nonce=1)), "first message must be hello"),
    (pb.WorkerMessage(hello=pb.Hello(worker_id="w", kinds=["a"], slots=0)), "hello.slots"),
    (pb.WorkerMessage(hello=pb.Hello(worker_id="w", slots=1)), "hello.kinds"),
    (pb.WorkerMessage(hello=pb.Hello(kinds=["a"], slots=1)), "hello.worker_id"),
    (pb.WorkerMessage(hello=pb.Hello(worker_id="w", kinds=["no spaces"], slots=1)), "hello.kinds"),
    # Postgres text cannot hold U+0000: such an id would break every claim made for it.
    (pb.WorkerMessage(hello=pb.Hello(worker_id="w\x00", kinds=["a"], slots=1)), "hello.worker_id"),
])
async def test_a_bad_opening_ends_the_stream_with_invalid_argument(channel, first, field) -> None:
    call = workers_pb2_grpc.WorkersStub(channel).Connect()
    await call.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(call.read(), DEADLINE)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details()


async def test_a_second_hello_ends_the_stream_with_invalid_argument(workers) -> None:
    w = workers(["resize"], 1)
    await w.connect()
    await w.write(pb.WorkerMessage(hello=w.hello))
    await until(lambda: w.ended, "the stream ended", DEADLINE)
    assert w.ended.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello" in w.ended.details()


async def test_a_worker_that_stops_answering_pings_is_disconnected(workers) -> None:
    w = workers(["resize"], 1, pong=False)
    await w.connect()
    await until(lambda: w.ended, "the stream ended", DEADLINE)
    assert w.ended.code() == grpc.StatusCode.UNAVAILABLE
    assert "pong" in w.ended.details()
    assert w.pings >= 2


async def test_a_half_closed_stream_gets_its_acks_then_ends_ok(channel, workers) -> None:
    await enqueue(channel, "resize", 2)
    w = workers(["resize"], 2)
    await w.connect()
    leases = await w.leases(2)
    await w.send(*(completed(x) for x in leases))
    await w.done_writing()
    acks = await w.acks(2)
    assert {a.status for a in acks} == {pb.ACK_STATUS_APPLIED}
    assert await asyncio.wait_for(w.call.code(), DEADLINE) == grpc.StatusCode.OK


async def test_an_output_over_the_limit_discards_the_step_and_is_acked_applied(db_url, start_server) -> None:
    srv = start_server(db_url, extra_args=["--max-payload-bytes", "100"])
    async with one_lease(srv.address) as (channel, job, w, lease):
        await w.send(completed(lease, "x" * 500))
        (a,) = await w.acks(1)
        assert (a.status, a.detail) == (pb.ACK_STATUS_APPLIED, "output_too_large")
        step = await get_step(channel, job.run_id)
        assert (step.state, step.error_kind, step.reason) == (types_pb2.STEP_STATE_DISCARDED, "permanent",
                                                              "output_too_large")


async def test_cancelling_a_run_stops_the_handler_and_fences_its_result(channel, workers) -> None:
    (job,) = await enqueue(channel, "resize")
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    await runs_pb2_grpc.RunsStub(channel).CancelRun(runs_pb2.CancelRunRequest(run_id=job.run_id))
    # Renewal runs every lease_ttl/3 (0.67 s): a few seconds of slack on a busy machine.
    stop = await w.next("stop", timeout=10)
    assert stop.reason == "cancelled"
    assert [(r.step_id, r.lease_generation) for r in stop.leases] == [(lease.step_id, lease.lease_generation)]
    await w.send(completed(lease))
    assert (await w.acks(1))[0].status == pb.ACK_STATUS_ENDED
    assert (await get_step(channel, job.run_id)).state == types_pb2.STEP_STATE_CANCELLED


async def test_an_attempt_timeout_stops_the_handler_with_reason_timeout(channel, workers) -> None:
    (job,) = await enqueue(channel, "resize", attempt_timeout=duration_pb2.Duration(seconds=1),
                           backoff_initial=duration_pb2.Duration(seconds=60))
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    stop = await w.next("stop")
    assert stop.reason == "timeout"
    step = await get_step(channel, job.run_id)
    assert (step.state, step.attempt, step.errors[-1].error_kind) == (types_pb2.STEP_STATE_AVAILABLE, 2, "timeout")


async def test_a_dropped_stream_lease_expires_and_another_worker_gets_the_step(channel, workers) -> None:
    (job,) = await enqueue(channel, "resize")
    w1 = workers(["resize"], 1)
    await w1.connect()
    (lease,) = await w1.leases(1)
    await w1.close()
    w2 = workers(["resize"], 1)
    await w2.connect()
    (again,) = await w2.leases(1)
    assert again.step_id == lease.step_id
    assert again.lease_generation > lease.lease_generation
    assert (again.attempt, again.reclaims) == (1, 1)
    await w2.send(completed(again))
    assert (await w2.acks(1))[0].status == pb.ACK_STATUS_APPLIED
    step = await get_step(channel, job.run_id)
    assert (step.state, step.reclaims, step.attempt) == (types_pb2.STEP_STATE_COMPLETED, 1, 1)


async def test_a_reconnecting_worker_keeps_its_held_lease(channel, workers) -> None:
    (job,) = await enqueue(channel, "resize")
    w1 = workers(["resize"], 1, worker_id="steady")
    await w1.connect()
    (lease,) = await w1.leases(1)
    await w1.close()
    ref = pb.LeaseRef(step_id=lease.step_id, lease_generation=lease.lease_generation)
    bogus = pb.LeaseRef(step_id=str(uuid.uuid4()), lease_generation=3)
    w2 = workers(["resize"], 1, worker_id="steady", held=[ref, bogus])
    welcome = await w2.connect()
    assert list(welcome.lost) == [bogus]
    # Outlive the lease TTL several times: the server renews what the worker holds.
    await until(lambda: w2.pings >= 10, "ten heartbeats", DEADLINE)
    step = await get_step(channel, job.run_id)
    assert (step.state, step.lease_generation, step.reclaims) == (types_pb2.STEP_STATE_RUNNING,
                                                                  lease.lease_generation, 0)
    assert w2.inbox["leases"].empty()  # the held lease took the only slot
    await w2.send(completed(lease, "late but valid"))
    assert (await w2.acks(1))[0].status == pb.ACK_STATUS_APPLIED
    assert (await get_step(channel, job.run_id)).state == types_pb2.STEP_STATE_COMPLETED


async def test_two_servers_share_one_database_and_run_each_step_once(db_url, start_server) -> None:
    servers = [start_server(db_url), start_server(db_url)]
    channels = [grpc.aio.insecure_channel(s.address) for s in servers]
    try:
        jobs = await enqueue(channels[0], "bulk", 200)
        applied: dict[str, int] = {}
        ws = [RawWorker(channels[i % 2], ["bulk"], 8) for i in range(4)]

        async def work(w: RawWorker) -> None:
            await w.connect()
            while len(applied) < 200:
                try:
                    msg = await w.next("leases", timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                await w.send(*(completed(x) for x in msg.leases))
                for a in await w.acks(len(msg.leases)):
                    if a.status == pb.ACK_STATUS_APPLIED:
                        applied[a.step_id] = applied.get(a.step_id, 0) + 1

        await asyncio.wait_for(asyncio.gather(*(work(w) for w in ws)), 120)
        for w in ws:
            await w.close()
        assert sorted(applied) == sorted(j.step_id for j in jobs)
        assert set(applied.values()) == {1}
        for j in jobs:
            assert (await get_step(channels[1], j.run_id)).state == types_pb2.STEP_STATE_COMPLETED
    finally:
        for ch in channels:
            await ch.close()


async def test_sigterm_lets_held_leases_finish_and_keeps_them_valid_across_a_restart(db_url, start_server) -> None:
    # A long TTL: the lease must outlive the restart without being swept meanwhile.
    srv = start_server(db_url, lease_ttl=30, extra_args=["--grace", "3"])
    channel = grpc.aio.insecure_channel(srv.address)
    jobs = await enqueue(channel, "resize", 3)
    quick = RawWorker(channel, ["resize"], 1)
    slow = RawWorker(channel, ["resize"], 1, worker_id="slow")
    await quick.connect()
    (q,) = await quick.leases(1)
    await slow.connect()
    (s,) = await slow.leases(1)
    stopping = asyncio.create_task(asyncio.to_thread(srv.terminate))
    # During the grace period results are still applied, but no new lease is pushed.
    await until(lambda: "stopping" in srv.log_text() or "signal" in srv.log_text(), "the server stopping", DEADLINE)
    await quick.send(completed(q))
    assert (await quick.acks(1))[0].status == pb.ACK_STATUS_APPLIED
    assert await stopping == 0
    await until(lambda: quick.ended is not None and slow.ended is not None, "both streams ended", DEADLINE)
    assert slow.ended.code() == grpc.StatusCode.UNAVAILABLE
    assert quick.inbox["leases"].empty()
    await channel.close()

    srv.restart()
    channel = grpc.aio.insecure_channel(srv.address)
    try:
        back = RawWorker(channel, ["resize"], 1, worker_id="slow",
                         held=[pb.LeaseRef(step_id=s.step_id, lease_generation=s.lease_generation)])
        assert list((await back.connect()).lost) == []
        await back.send(completed(s))
        assert (await back.acks(1))[0].status == pb.ACK_STATUS_APPLIED
        step = await get_step(channel, next(j.run_id for j in jobs if j.step_id == s.step_id))
        assert (step.state, step.reclaims) == (types_pb2.STEP_STATE_COMPLETED, 0)
        await back.close()
    finally:
        await quick.close()
        await slow.close()
        await channel.close()


async def test_a_child_run_ending_settles_its_parent_node_without_waiting_for_the_sweep(db_url, start_server) -> None:
    # The sweep runs once at start and then not for 10 minutes: only the
    # 'cyclone_run_ended' notification can end the parent's child node in time.
    srv = start_server(db_url, sweep_interval=600)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        flows = workflows_pb2_grpc.WorkflowsStub(channel)
        await flows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
            name="inner", nodes=[types_pb2.Node(id="work", kind="inner_work")]))
        await flows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
            name="outer", nodes=[types_pb2.Node(id="sub", type=types_pb2.NODE_TYPE_CHILD, workflow="inner")]))
        runs = runs_pb2_grpc.RunsStub(channel)
        parent = await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="outer"))
        w = RawWorker(channel, ["inner_work"], 1)
        try:
            await w.connect()
            (lease,) = await w.leases(1)
            await w.send(completed(lease, "done"))
            assert (await w.acks(1))[0].status == pb.ACK_STATUS_APPLIED

            async def parent_completed() -> bool:
                run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=parent.run_id))
                return run.state == types_pb2.RUN_STATE_COMPLETED

            await until(parent_completed, "the parent run completed", DEADLINE)
        finally:
            await w.close()


async def test_an_enqueue_for_a_waiting_worker_is_claimed_in_its_own_transaction(channel, workers, db_url) -> None:
    """With a worker of the kind waiting, Enqueue writes the job and claims it for that
    worker in one transaction (one commit, no dispatcher pass): the claim's start time
    (`started_at`, the transaction's now()) is the run's `created_at`. A job enqueued with
    no worker waiting is claimed later, by the dispatcher. (While a dispatcher pass holds
    the worker's free slots, an Enqueue only writes its job: so up to 10 tries.)"""
    (alone,) = await enqueue(channel, "resize")
    w = workers(["resize"], 2)
    await w.connect()
    (first,) = await w.leases(1)
    assert first.run_id == alone.run_id
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        async def claimed_with_its_run(run_id: str) -> tuple[bool, str, str]:
            row = await (await conn.execute(
                "SELECT s.started_at = r.created_at, s.state, s.lease_owner FROM cyclone_runs r "
                "JOIN cyclone_steps s ON s.run_id = r.id WHERE r.id = %s", (run_id,))).fetchone()
            return row

        assert await claimed_with_its_run(alone.run_id) == (False, "running", w.hello.worker_id)
        for _ in range(10):
            (job,) = await enqueue(channel, "resize")
            (lease,) = await w.leases(1)
            assert (lease.run_id, lease.step_id, lease.attempt, lease.lease_generation) == (
                job.run_id, job.step_id, 1, 1)
            same, state, owner = await claimed_with_its_run(job.run_id)
            assert (state, owner) == ("running", w.hello.worker_id)
            if same:
                break
            await w.send(completed(lease))
            await w.acks(1)
        assert same, "no Enqueue claimed its job in its own transaction"


async def test_enqueues_and_the_dispatcher_together_never_push_more_leases_than_slots(channel, workers) -> None:
    """Enqueue claims for a waiting worker while the dispatcher may claim for the same
    worker: each holds the slots it claims for until it pushed, so that the worker never
    gets more leases than it has slots, while 60 concurrent Enqueues and its results race."""
    slots, jobs = 3, 60
    w = workers(["resize"], slots)
    await w.connect()
    runs = runs_pb2_grpc.RunsStub(channel)
    calls = asyncio.gather(*(runs.Enqueue(runs_pb2.EnqueueRequest(kind="resize")) for _ in range(jobs)))
    outstanding, most, done = 0, 0, set()
    while len(done) < jobs:
        msg = await w.next("leases")
        outstanding += len(msg.leases)
        most = max(most, outstanding)
        assert outstanding <= slots, f"{outstanding} leases held by a worker with {slots} slots"
        done.update(lease.step_id for lease in msg.leases)
        # Answered one message at a time: a result frees its slot, and wakes the dispatcher.
        await w.send(*(completed(lease) for lease in msg.leases))
        outstanding -= len(msg.leases)
    assert len(await calls) == jobs and most >= 1


async def test_claims_at_once_for_one_free_slot_fill_it_once(channel, workers, db_url) -> None:
    """A claim for a waiting worker, an Enqueue's or the dispatcher's, holds the worker's
    free slots until it pushed: the dispatcher's pass, woken by a second job meanwhile,
    finds no free slot. The claims are held up by a lock on cyclone_step_deps, which a
    claim reads and a job's insert does not."""
    w = workers(["resize"], 1)
    await w.connect()
    runs = runs_pb2_grpc.RunsStub(channel)
    async with await psycopg.AsyncConnection.connect(db_url) as lock, \
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as watch:
        async def waiting_claims() -> int:
            row = await (await watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND (query LIKE '%%cyclone_jobs_enqueue_claim%%' OR query LIKE '%%cyclone_leases_claim%%')"
            )).fetchone()
            return row[0]

        async with lock.transaction():
            await lock.execute("LOCK TABLE cyclone_step_deps IN ACCESS EXCLUSIVE MODE")
            first = asyncio.ensure_future(runs.Enqueue(runs_pb2.EnqueueRequest(kind="resize")))
            # This Enqueue's claim, or a dispatcher pass's:
            await until(waiting_claims, "a claim waiting for the lock", DEADLINE)
            # The second job comes through EnqueueMany, which writes on its own (Enqueue's
            # batches are written one at a time, so a second Enqueue would wait for the
            # first) and announces it; with the slot held, the dispatcher's pass that this
            # wakes does not claim for the worker.
            second = asyncio.ensure_future(runs.EnqueueMany(runs_pb2.EnqueueManyRequest(
                jobs=[runs_pb2.EnqueueRequest(kind="resize")])))
            await until(lambda: _either(second, waiting_claims), "the second call answered, or its claim waiting",
                        DEADLINE)
        a, (b,) = await first, (await second).jobs
        (lease,) = await w.leases(1)
        running = await (await watch.execute(
            "SELECT r.id::text FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id "
            "WHERE s.state = 'running' AND s.lease_owner = %s", (w.hello.worker_id,))).fetchall()
    assert [r[0] for r in running] == [lease.run_id]
    await w.send(completed(lease))
    (after,) = await w.leases(1)  # the slot is free again: the dispatcher claims the other job
    assert {lease.run_id, after.run_id} == {a.run_id, b.run_id}


async def _either(call: asyncio.Future[Any], waiting: Callable[[], Any]) -> bool:
    return call.done() or await waiting() >= 2
