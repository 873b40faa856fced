"""The worker hub's two batching loops: claiming leases for free slots, and group-committing results."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
from google.protobuf import timestamp_pb2
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from cyclone_proto import workers_pb2 as pb
from cyclone_worker.values import fill_stored

from . import tracing
from .convert import duration_seconds, optional_value
from .definitions import MAX_SECONDS
from .engine import Engine, PreparedJob, Result, canonical_id
from .errors import CycloneError, InvalidArgument

log = logging.getLogger(__name__)
_loads = json.loads

LeaseKey = tuple[str, int]  # (step_id, lease_generation)

# The longest retry delay or snooze a worker may ask for, as for a node's backoff settings.
MAX_DELAY_SECONDS = MAX_SECONDS
# The dispatcher looks at least once in this many seconds, however far the next due step
# is: a safety net for a wake-up lost with a LISTEN connection, not the way due steps are
# found.
IDLE_POLL = 10.0
# The soonest the dispatcher looks again for a step it was told is due (a step that is due
# but locked by another server's claim must not make it spin).
MIN_DUE_WAIT = 0.01
# A step claimable now that a claim came up short of is locked by another transaction: the
# dispatcher looks again in MIN_DUE_WAIT, doubling while it stays so, up to this (a long
# cancel of a big fan-out, or a session left idle in a transaction, holds such locks).
MAX_LOCKED_WAIT = 0.5
# A worker for whom a claim got fewer rows than it asked for is claimed for again no
# sooner than this many seconds after that claim (WorkerConn.paced_until, Dispatcher._pass),
CLAIM_PACE = 0.01
# or STREAM_PACE times as long when that claim found new jobs of its kinds at STREAM_RATE
# per second or more, and at least STREAM_RATE x CLAIM_PACE (8) of them (Dispatcher._pace):
# under such a stream, each claim, its commit, its Leases message and the Results, result
# batch and acks that follow are shared by three times as many jobs, and the jobs queue
# behind the busy server anyway (docs/benchmarks.md, fourteenth pass). 30 ms stays inside
# the 50 ms in which a due step is leased (DECISIONS 3b), which a pace may delay by as
# much, with room for the claim and its commit.
STREAM_PACE = 3
STREAM_RATE = 800.0
MIN_PACE_WAIT = 0.001
# After a zero-delay snooze, a worker gets no lease until its next message (the server
# pings it at once), or this many seconds. A stopping worker hands back the leases it did
# not start as zero-delay snoozes and half-closes right after; on a loaded machine, the
# snooze could be acked before the half-close was read, and a lease pushed in between
# would never run (WorkerConn.hush).
HANDBACK_QUIET = 0.1

# The SQL statuses of a result, and the ack each becomes (the SQL's finer 'applied' kinds
# travel in the ack's detail).
ACK_OF_STATUS = {
    "applied": pb.ACK_STATUS_APPLIED, "retried": pb.ACK_STATUS_APPLIED, "discarded": pb.ACK_STATUS_APPLIED,
    "snoozed": pb.ACK_STATUS_APPLIED, "output_too_large": pb.ACK_STATUS_APPLIED,
    "stale": pb.ACK_STATUS_STALE, "ended": pb.ACK_STATUS_ENDED, "unknown": pb.ACK_STATUS_UNKNOWN,
    "invalid": pb.ACK_STATUS_INVALID,
}


@dataclass
class HeldLease:
    """What the hub remembers of a lease a worker holds (little, for Stop reasons and metrics)."""

    run_id: str | None = None
    kind: str | None = None
    attempt: int = 0
    attempt_deadline_us: int | None = None  # microseconds since the epoch
    # Once its StepResult arrived (on its way to the database): a snooze hands the lease
    # back; any other result frees its slot.
    slot_freed: bool = False
    handed_back: bool = False
    trace: tracing.StepSpan | None = None  # the step's span, when the server traces
    pushed_at: float = field(default_factory=time.monotonic)  # for the execution-time metric

    @property
    def result_pending(self) -> bool:
        """A StepResult for this lease arrived and is on its way to the database."""
        return self.slot_freed or self.handed_back


class End:
    """Put in a stream's outbox to end the stream, with a status (None: end with OK)."""

    def __init__(self, code: grpc.StatusCode | None = None, message: str = "") -> None:
        self.code = code
        self.message = message


@dataclass(eq=False)
class WorkerConn:
    """One open worker stream."""

    worker_id: str
    kinds: list[str]
    slots: int
    sdk: str = ""
    held: dict[LeaseKey, HeldLease] = field(default_factory=dict)
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    last_pong: float = field(default_factory=time.monotonic)
    reserved: int = 0  # slots held by a claim in progress for this worker (the dispatcher's or an Enqueue's)
    unacked: int = 0  # results submitted and not yet acked
    answered: int = 0  # leases in `held` whose result arrived and freed their slot: no longer running
    handing_back: int = 0  # leases in `held` whose snooze arrived and is not acked yet
    draining: bool = False  # the worker half-closed: ack what it sent, then end
    closed: bool = False
    quiet_until: float = 0.0  # time.monotonic(); no lease before it unless the worker speaks (hush)
    quiet_for: float = 0.0  # the quiet's length, from the snooze and again from its ack (hush, forget)
    paced_until: float = 0.0  # time.monotonic(); no claim by the dispatcher before it (Dispatcher._pass)
    prompt: bool = False  # its next claim paces it not: work came that that claim may not see (Dispatcher.unpace)
    nonce: int = 0  # of the last Ping sent
    _quiet_over: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> int:
        """Leases the worker still runs: held and not yet answered."""
        return len(self.held) - self.answered

    @property
    def free_slots(self) -> int:
        """`slots` is how many steps the worker runs at once, so a slot frees as soon as
        the lease's result arrives: the next lease is claimed while that result commits.
        A snooze is different: it hands a lease back, as a stopping worker does with the
        leases it did not start just before it half-closes, so nothing is pushed to a
        worker while one of its snoozes waits for its ack (a lease pushed in between
        would go to a worker that will not run it, and wait for its expiry). Slots held by
        a claim in progress are not free: two claims for one worker never both fill them."""
        if self.closed or self.draining or self.handing_back or self.quiet:
            return 0
        return max(0, self.slots - self.running - self.reserved)

    @property
    def quiet(self) -> bool:
        """A zero-delay snooze came last, less than HANDBACK_QUIET ago (hush)."""
        return self.quiet_until > 0.0 and time.monotonic() < self.quiet_until

    def hush(self, seconds: float) -> None:
        """A zero-delay snooze arrived: the worker may be stopping, and half-closing right
        after it. Nothing is pushed to it until its next message (heard) shows it is not, or
        EOF that it is, or `seconds` pass; the caller wakes the dispatcher then. A Ping goes
        out now: a worker that carries on answers it at once, so its snoozed step comes
        back to it within a round trip, not `seconds` (DECISIONS 3b: a due step is leased
        within 50 ms); a stopping one has half-closed, or no longer answers pings."""
        self.quiet_for = seconds
        self.quiet_until = time.monotonic() + seconds
        self._quiet_over.clear()
        self.ping()

    def heard(self) -> bool:
        """A message (or EOF) came from the worker: a quiet after its last snooze is over.
        Returns whether there was one (its slots may be free now)."""
        if not self.quiet_until:
            return False
        self.quiet_until = 0.0
        self._quiet_over.set()
        return True

    def unpace(self) -> None:
        """Work came that a claim in progress may not have seen: no pace now, nor from the
        next claim (Dispatcher.unpace)."""
        self.paced_until = 0.0
        self.prompt = True

    def claimed(self, pace_until: float | None) -> None:
        """A claim for this worker ended; `pace_until`: it came up short, so no claim before
        then, unless work came that it may not have seen (prompt)."""
        if pace_until is not None and not self.prompt:
            self.paced_until = pace_until
        self.prompt = False

    async def quiet_over(self) -> None:
        """Return once the quiet after a zero-delay snooze is over (at once when there is none)."""
        while self.quiet:
            try:
                async with asyncio.timeout(max(self.quiet_until - time.monotonic(), 0.0)):
                    await self._quiet_over.wait()
            except TimeoutError:
                pass

    def answer(self, key: LeaseKey, *, snooze: bool = False) -> HeldLease | None:
        """A result for the lease `key` arrived: the lease stays held, and renewed, until
        the result is applied and acked; its slot is free now, or for a snooze at the ack."""
        held = self.held.get(key)
        if held is not None and not held.result_pending:
            if snooze:
                held.handed_back = True
                self.handing_back += 1
            else:
                held.slot_freed = True
                self.answered += 1
        return held

    def forget(self, key: LeaseKey) -> HeldLease | None:
        """The lease `key` is over (acked, stopped or refused). When it was handed back and
        the worker has said nothing since, the quiet lasts `quiet_for` from now: the
        half-close that may follow the ack is what it waits for, and on a loaded machine the
        snooze's commit alone can outlast a quiet counted from the snooze. The snooze's ack
        (ResultCommitter._acknowledge) wakes the dispatcher at the quiet's end; a hand-back
        forgotten otherwise (a Stop while its result is applied) is acked too, later."""
        held = self.held.pop(key, None)
        if held is not None:
            self.answered -= held.slot_freed
            self.handing_back -= held.handed_back
            if held.handed_back and self.quiet_until:
                self.quiet_until = max(self.quiet_until, time.monotonic() + self.quiet_for)
        return held

    def send(self, msg: pb.ServerMessage) -> None:
        if not self.closed:
            self.outbox.put_nowait(msg)

    def ping(self) -> None:
        """Send a Ping (the worker answers with a Pong of the same nonce)."""
        self.nonce += 1
        at = timestamp_pb2.Timestamp()
        at.GetCurrentTime()
        self.send(pb.ServerMessage(ping=pb.Ping(nonce=self.nonce, at=at)))

    def end(self, code: grpc.StatusCode | None = None, message: str = "") -> None:
        """End the stream after what is already queued; no lease is pushed to it from now on."""
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(End(code, message))

    def drain(self) -> None:
        """The worker sent its last message: end (OK) once its results are acked."""
        self.draining = True
        if self.unacked == 0:
            self.end()


def _set_time_us(ts: Any, us: int) -> None:
    """Microseconds since the epoch into the Timestamp `ts` (what Timestamp.FromDatetime
    makes of the same instant)."""
    ts.seconds, micros = divmod(us, 1_000_000)
    ts.nanos = micros * 1000


def lease_message(row: Any, lease: pb.Lease | None = None) -> pb.Lease:
    """The Lease for a claimed row (Engine.claim_leases), filled into `lease` when given (an
    element added to the outgoing Leases, so that nothing is built twice and copied). The
    input and the parents arrive as JSON text and go straight into the message's own
    fields; the times arrive in microseconds. On the wire it is the same message as ever,
    field for field (`parents` is present, empty, for a step without parents)."""
    if lease is None:
        lease = pb.Lease()
    lease.run_id = row.run_id
    lease.step_id = row.step_id
    lease.node = row.node
    lease.kind = row.kind
    lease.attempt = row.attempt
    lease.max_attempts = row.max_attempts
    lease.reclaims = row.reclaims
    lease.snoozes = row.snoozes
    lease.lease_generation = row.lease_generation
    fill_stored(lease.input, None if row.input is None else _loads(row.input))
    if row.parents is not None:
        fields = lease.parents.fields
        for key, item in _loads(row.parents).items():
            fill_stored(fields[key], item)
    else:
        lease.parents.SetInParent()
    _set_time_us(lease.lease_expiry, row.lease_expiry_us)
    if row.attempt_deadline_us is not None:
        _set_time_us(lease.attempt_deadline, row.attempt_deadline_us)
    if row.trace_context:
        lease.trace_context.CopyFrom(tracing.lease_context(row.trace_context))
    return lease


def _traced(row: Any) -> tuple[Any, tracing.StepSpan | None]:
    """A claimed row of a run with a trace context: its step span (None when the server
    does not trace), and the row with the context the lease carries (the span's)."""
    fields = row._asdict()
    trace = tracing.step_claimed(fields)
    return row._replace(trace_context=fields["trace_context"]), trace


def to_result(r: pb.StepResult, max_output_bytes: int) -> Result | str:
    """The engine's Result for a StepResult, or 'unknown: why' when the step id is not an id.
    `max_output_bytes`: Welcome.max_payload_bytes, which an oversized_output_bytes must exceed.

    A malformed answer (a NaN or U+0000 in the output, a delay out of range, no outcome)
    becomes a failed attempt carrying why (`Result.invalid`): the worker takes an INVALID
    ack as the end of its lease, so the server must end the attempt too, never keep a
    lease that nobody will answer. A failure message is never refused (engine.storable_message).
    """
    try:
        step_id = canonical_id(r.step_id, "step_id")
    except CycloneError:
        return "unknown: step_id is not a valid id"
    outcome = r.WhichOneof("outcome")
    try:
        if outcome == "completed":
            if r.completed.oversized_output_bytes < 0:
                raise InvalidArgument("completed.oversized_output_bytes: must be >= 0, "
                                      f"got {r.completed.oversized_output_bytes}")
            if r.completed.oversized_output_bytes > 0:
                if r.completed.oversized_output_bytes <= max_output_bytes:
                    # Completing with no output would lose it without a word: the worker's bug, said.
                    raise InvalidArgument(f"completed.oversized_output_bytes: {r.completed.oversized_output_bytes} "
                                          f"is not over the limit of {max_output_bytes} bytes "
                                          "(Welcome.max_payload_bytes): send the output itself")
                return Result(step_id, r.lease_generation, "completed",
                              oversized_output_bytes=r.completed.oversized_output_bytes)
            try:
                output = optional_value(r.completed, "output")
            except CycloneError as e:
                raise InvalidArgument(f"completed.{e.message}") from None
            return Result(step_id, r.lease_generation, "completed", output=output)
        if outcome == "failed":
            return Result(step_id, r.lease_generation, "failed", message=r.failed.message,
                          permanent=r.failed.permanent, details=r.failed.details,
                          retry_delay=_delay(r.failed, "retry_delay", "failed.retry_delay"))
        if outcome == "snoozed":
            return Result(step_id, r.lease_generation, "snoozed",
                          delay=_delay(r.snoozed, "delay", "snoozed.delay") or 0.0)
        raise InvalidArgument("the result has no outcome (completed, failed or snoozed)")
    except CycloneError as e:
        return invalid_result(step_id, r.lease_generation, e.message)


def invalid_result(step_id: str, generation: int, why: str) -> Result:
    """The failed attempt that stands for a malformed answer to the lease (step_id, generation)."""
    return Result(step_id, generation, "failed", message=f"invalid result: {why}", invalid=why)


def _delay(msg: Any, name: str, field: str) -> float | None:
    """A worker's Duration in seconds (None when unset), within [0, MAX_DELAY_SECONDS]."""
    return duration_seconds(msg, name, field=field, maximum=MAX_DELAY_SECONDS)


# The ack detail of each SQL status: the kind of applied result, or why it was refused.
DETAIL_OF_STATUS = {
    "applied": "", "retried": "retried", "discarded": "discarded", "snoozed": "snoozed",
    "output_too_large": "output_too_large",
    "stale": "the step runs, or ran, under another lease generation",
    "ended": "the step already left running under this lease generation",
    "unknown": "no such step", "invalid": "the result is malformed",
}


def ack(step_id: str, generation: int, status: str, detail: str | None = None) -> pb.ResultAck:
    return pb.ResultAck(step_id=step_id, lease_generation=generation, status=ACK_OF_STATUS[status],
                        detail=DETAIL_OF_STATUS[status] if detail is None else detail)


class Dispatcher:
    """Claims steps in batches for the free slots of connected workers and pushes them as Leases.

    Woken (coalesced) by `wake()` whenever steps may have become claimable. Steps that become
    claimable by the clock alone (a backoff, a snooze, a scheduled job) wake it too: after a
    pass whose claim came up short, it asks when the next step of those kinds is due and
    sleeps until then (DECISIONS 3b: leased within 50 ms of becoming due). A step due now
    that the claim did not get (another transaction held its lock) counts as due in
    MIN_DUE_WAIT, doubling up to MAX_LOCKED_WAIT while that lasts. With nothing due soon it looks
    again only every IDLE_POLL seconds.
    Workers are served round-robin so several workers of the same kinds share the backlog.
    """

    def __init__(self, engine: Engine, conns: Callable[[], list[WorkerConn]], *, lease_ttl: float,
                 stats: dict[str, Any], claim_pace: float = CLAIM_PACE) -> None:
        self.engine = engine
        self.conns = conns
        self.lease_ttl = lease_ttl
        self.stats = stats
        self.claim_pace = claim_pace
        # Called with each lease's dispatch latency in seconds (e.g. a metrics histogram).
        self.latency_observers: list[Callable[[float], None]] = []
        self.claim_observers: list[Callable[[str, float], None]] = []  # (kind, seconds waited)
        self._event = asyncio.Event()
        self._turn = itertools.count()
        self._stopping = False
        self._due_in: float | None = None  # seconds from the last pass to the next due step
        self._locked_passes = 0  # passes in a row that found a step due now but locked (MAX_LOCKED_WAIT)
        self._deferred: set[asyncio.Task[None]] = set()  # deliveries waiting out a worker's quiet
        self._last_claim: dict[str, float] = {}  # kind -> time.monotonic() its last claim began (_pace)

    def wake(self) -> None:
        self._event.set()

    def unpace(self) -> None:
        """Steps other than new jobs may have become claimable (a DAG's next steps, a
        retry, a submitted run, a signal, another server's work): end every worker's pace,
        and keep each worker's next claim (maybe one in progress, which may have looked
        before they were written) from starting one (WorkerConn.prompt). Only a stream of
        new jobs is worth waiting for."""
        for conn in self.conns():
            conn.unpace()

    async def stop(self) -> None:
        """Make `run` return after the pass in progress and the deliveries it deferred (deliver),
        so no claimed lease is left unpushed."""
        self._stopping = True
        self._event.set()

    async def _deliver_after_quiet(self, conn: WorkerConn, rows: list[Any], claimed: float) -> None:
        try:
            await conn.quiet_over()
        finally:
            conn.reserved -= len(rows)
        try:
            await self.deliver(conn, rows, claimed)
        except Exception:  # a bug; the sweep reclaims the leases at their expiry
            log.exception("pushing %d leases after a worker's snooze failed", len(rows))

    async def _deliveries(self) -> None:
        while self._deferred:
            await asyncio.gather(*self._deferred, return_exceptions=True)

    async def run(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for (see ResultCommitter._gather).
                # The safety net holds whatever is due: a step due tomorrow is no reason to
                # miss a lost wake-up until then.
                async with asyncio.timeout(IDLE_POLL if self._due_in is None else min(self._due_in, IDLE_POLL)):
                    await self._event.wait()
            except TimeoutError:
                pass
            if self._stopping:
                await self._deliveries()
                return
            if self._event.is_set():  # woken: something new, so a locked step's back-off starts over
                self._locked_passes = 0
            self._event.clear()
            try:
                self._due_in = await self._pass()
                continue
            except Exception as e:
                log.warning("dispatch pass failed: %s; retrying", e)
            # A lost database: log, back off (0.1 s doubling to 5 s), try again until a pass works.
            async for attempt in AsyncRetrying(
                    wait=wait_exponential(multiplier=0.1, min=0.1, max=5.0),
                    before_sleep=lambda s: log.warning(
                        "dispatch pass failed: %s; retrying in %.1fs",
                        s.outcome.exception(), s.next_action.sleep)):  # type: ignore[union-attr]
                with attempt:
                    if self._stopping:
                        await self._deliveries()
                        return
                    self._due_in = await self._pass()

    async def release(self, owner: str, keys: list[LeaseKey]) -> None:
        """Reclaim now leases whose worker can no longer answer them (fenced by owner and
        generation), rather than at their expiry. A lease answered meanwhile is left to its
        result; one in a run that stays busy, and any after a failure, to the sweep."""
        for _ in range(3):
            try:
                released = await self.engine.release(owner, keys)
            except Exception as e:  # the recovery sweep reclaims them at expiry
                log.warning("releasing %d leases of worker %s failed: %s", len(keys), owner, e)
                return
            self.stats["releases"] += len(released)
            done = {s for s, _ in released}
            keys = [k for k in keys if k[0] not in done]
            if not released or not keys:
                return

    async def _pass(self) -> float | None:
        """Claim for every worker with free slots, but not yet again for one paced by a
        claim less than its pace ago (`claim_pace`, three times that under a stream of
        new jobs: _pace); returns how long until the next pass: until the
        next step of a kind they ran out of becomes due, or a worker passed over for its
        pace may be claimed for (None: neither).

        A claim that gets fewer rows than it asked for paces its worker, and so does a
        pass that finds the worker's kinds emptied by another worker's claim. Under a
        stream of new jobs, each pass would claim the few that came since the last (a
        pass comes after each batch of jobs written and after each batch of results), and
        those claims, their commits and the small result batches that follow them had
        become most of the work per job (docs/benchmarks.md, ninth pass). Only new jobs
        are worth waiting for: any other work (a DAG's next steps, a retry, a submitted
        run, another server's) ends every pace at once (unpace), and so does a job enqueued
        alone that found a worker's slots held by a claim in progress (enqueue); after
        either, the claims in progress pace no one (WorkerConn.prompt). A worker with a
        backlog gets every row it asks for and is never paced, and an Enqueue's own claim
        ignores paces. A pace delays a lease by at most 30 ms (STREAM_PACE x CLAIM_PACE),
        within the 50 ms in which a due step is leased (DECISIONS 3b)."""
        began = time.monotonic()
        everyone = self.conns()
        # Owed a pass at its pace's end: every worker this pass skips for its pace, also one
        # with no free slot now (an Enqueue's claim or a quiet after a hand-back may hold
        # them). The wake-ups of those ending should bring a pass too; this one does not
        # depend on them, and costs no query when the worker has no free slot by then. That
        # pass finds the worker unpaced: it claims for it, or owes it nothing more.
        paced = [c.paced_until for c in everyone if c.paced_until > began]
        conns = [c for c in everyone if c.free_slots > 0 and c.paced_until <= began]
        exhausted: set[str] = set()  # kinds that had nothing left to claim in this pass
        emptied: dict[str, float] = {}  # kind -> the pace of the claim that found it empty
        if conns:
            start = next(self._turn) % len(conns)
            for conn in conns[start:] + conns[:start]:
                kinds = [k for k in conn.kinds if k not in exhausted]
                want = conn.free_slots
                if want <= 0:
                    continue
                if not kinds:  # a claim of this pass found every one of them empty
                    conn.claimed(began + max(emptied.get(k, self.claim_pace) for k in conn.kinds))
                    continue
                conn.reserved += want
                try:
                    claimed = time.monotonic()
                    try:
                        rows = await self.engine.claim_leases(conn.worker_id, kinds, want, self.lease_ttl)
                    except psycopg.DataError as e:  # this worker's data, not the database: serve the others
                        log.warning("claim for worker %r failed: %s", conn.worker_id, e)
                        continue
                    short = len(rows) < want
                    paced_for = self._pace(kinds, len(rows), claimed) if short else None
                    if paced_for is not None:  # these kinds have nothing left for now
                        exhausted.update(kinds)
                        emptied.update(dict.fromkeys(kinds, paced_for))
                    conn.claimed(None if paced_for is None else claimed + paced_for)
                    self._claimed(kinds, claimed)
                    await self.deliver(conn, rows, claimed)
                finally:
                    conn.reserved -= want
        waits = [max(min(paced) - time.monotonic(), MIN_PACE_WAIT)] if paced else []
        waiting = sorted({k for c in conns if c.free_slots > 0 for k in c.kinds} & exhausted)
        due = await self.engine.next_due(waiting) if waiting else None
        if due is not None and due <= 0.0:  # claimable now, yet the claims came up short: locked
            due = min(MIN_DUE_WAIT * 2 ** min(self._locked_passes, 16), MAX_LOCKED_WAIT)
            self._locked_passes += 1
        else:
            self._locked_passes = 0
        if due is not None:
            waits.append(max(due, MIN_DUE_WAIT))
        return min(waits, default=None)

    def _pace(self, kinds: list[str], rows: int, claimed: float) -> float:
        """How long a claim of `kinds` that began at `claimed` and came up short with `rows`
        paces its worker: STREAM_PACE times `claim_pace` when those rows came at STREAM_RATE
        per second or more since the last claim of those kinds began (a stream of new jobs),
        else `claim_pace`. The rate is taken over CLAIM_PACE at least, so that a row or two
        found just after a claim is no stream. It is the kinds' rate, not the worker's: two
        workers of the same kinds take turns at the new jobs. The rows found are not all new
        when the claim before was full (slots ran out before the queue did): at the end of a
        backlog, one claim may be paced 30 ms instead of 10."""
        since = max((self._last_claim.get(k, 0.0) for k in kinds), default=0.0)
        if rows and since and rows >= STREAM_RATE * max(claimed - since, CLAIM_PACE):
            return STREAM_PACE * self.claim_pace
        return self.claim_pace

    def _claimed(self, kinds: list[str], claimed: float) -> None:
        """A claim of `kinds` began at `claimed` (the dispatcher's or an Enqueue's): the
        rows of those kinds found by the next one came after it (_pace). Claims overlap: the
        one that began last counts."""
        for k in kinds:
            self._last_claim[k] = max(claimed, self._last_claim.get(k, 0.0))

    async def deliver(self, conn: WorkerConn, rows: list[Any], claimed: float) -> None:
        """Push the leases claimed for `conn` (Engine.claim_leases rows) in one Leases message;
        `claimed` is the time.monotonic() at which the claim's statement was sent."""
        if not rows:
            return
        if conn.quiet:
            # A zero-delay snooze came while the claim ran: the worker may be stopping. The
            # leases wait for its next message (or EOF) in a task of their own, holding
            # their slots, so that the pass goes on serving the other workers.
            conn.reserved += len(rows)
            task = asyncio.create_task(self._deliver_after_quiet(conn, rows, claimed),
                                       name="cyclone-deliver-after-quiet")
            self._deferred.add(task)
            task.add_done_callback(self._deferred.discard)
            return
        if conn.closed or conn.draining:
            # The worker half-closed or went away while the claim ran: it will never
            # answer these leases, so they are reclaimed now rather than at their expiry.
            await self.release(conn.worker_id, [(r.step_id, r.lease_generation) for r in rows])
            return
        claims = self.stats["claims"]
        held = conn.held
        # No await from the check above to the send below: the stream takes these.
        msg = pb.ServerMessage()
        add = msg.leases.leases.add
        for row in rows:
            trace = None
            if row.trace_context:
                row, trace = _traced(row)
            held[(row.step_id, row.lease_generation)] = HeldLease(
                run_id=row.run_id, kind=row.kind, attempt=row.attempt,
                attempt_deadline_us=row.attempt_deadline_us, trace=trace)
            claims[row.kind] += 1
            lease_message(row, add())
        conn.send(msg)
        # From claimable (scheduled_at) to pushed: `waited` runs to the claim's transaction
        # start (0 for a job claimed by its own Enqueue), then the claim, its commit and
        # this push, timed here on one clock.
        since_claim = time.monotonic() - claimed
        for row in rows:
            for observe in self.latency_observers:
                observe(row.waited + since_claim)
            for observe_kind in self.claim_observers:
                observe_kind(row.kind, row.waited)

    async def enqueue(self, jobs: list[PreparedJob]) -> list[tuple[str, str, bool]] | None:
        """Write jobs for Enqueue and, when a worker connected here has free slots for their
        kinds, claim for it in the same transaction (Engine.enqueue_claim) and push what was
        claimed: the new job's lease goes out one commit and one dispatcher pass sooner.
        Returns the jobs' rows as Engine.enqueue_prepared does, or None when no worker waits
        for these jobs (then nothing was written). Workers take turns as in a pass."""
        ready = [j.params["node"]["kind"] for j in jobs if j.params["scheduled_at"] is None]  # claimable now
        kinds = set(ready)
        if self._stopping or not kinds:
            return None
        conns = [c for c in self.conns() if c.free_slots > 0 and not kinds.isdisjoint(c.kinds)]
        if not conns:
            # Something holds the slots of a worker for these kinds (a claim in progress,
            # which may have looked before this job is written, or a delivery waiting out
            # a quiet): its next claim must not pace that worker (_pass).
            for c in self.conns():
                if c.reserved and not kinds.isdisjoint(c.kinds):
                    c.unpace()
            return None
        conn = conns[next(self._turn) % len(conns)]
        served = [k for k in conn.kinds if k in kinds]
        want = min(conn.free_slots, sum(1 for kind in ready if kind in served))
        conn.reserved += want
        try:
            claimed = time.monotonic()
            rows, leases = await self.engine.enqueue_claim(jobs, conn.worker_id, served, want, self.lease_ttl)
            self._claimed(served, claimed)
            try:
                await self.deliver(conn, leases, claimed)
            except Exception:  # a bug; the jobs committed all the same, and the sweep reclaims the leases
                log.exception("pushing %d leases claimed at Enqueue failed", len(leases))
        finally:
            conn.reserved -= want
        if len(leases) < want:
            # Short (a job that existed already under its idempotency key): a pass that ran
            # meanwhile could not claim for this worker, so another one looks.
            self.wake()
        return rows


class ResultCommitter:
    """Group commit: results from all streams, applied with one Engine.apply_results per batch.

    Up to `parallel` batches are applied at once, each in its own transaction. While every
    slot is busy, new results queue up and go together in the next batch, so a result that
    comes alone is applied at once and the batches grow with the load. One at a time is the
    default: with two, a batch's commit overlapped the next one's work, but the batches
    were half as big, and on a loaded machine the statements and stream messages per
    result cost more than the overlap saved (docs/benchmarks.md, sixth pass).
    """

    def __init__(self, engine: Engine, *, stats: dict[str, Any], on_applied: Callable[[], None],
                 window: float = 0.0, max_batch: int = 200, parallel: int = 1) -> None:
        self.engine = engine
        self.stats = stats
        self.on_applied = on_applied
        self.window = window
        self.max_batch = max_batch
        self._queue: asyncio.Queue[tuple[WorkerConn, Result, str]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(parallel)
        self._gathering = False
        self._flushing: set[asyncio.Task[None]] = set()

    def submit(self, conn: WorkerConn, result: Result, wire_step_id: str) -> None:
        """Queue a result; its ack echoes `wire_step_id`, the step id as the worker wrote it.

        The result frees its lease's slot now; a snooze frees it at its ack, and until
        then the worker gets no lease (WorkerConn.free_slots)."""
        conn.answer((result.step_id, result.generation), snooze=result.outcome == "snoozed")
        conn.unacked += 1
        self._queue.put_nowait((conn, result, wire_step_id))

    def idle(self) -> bool:
        """True when no result waits to be applied or acked."""
        return self._queue.empty() and not self._gathering and not self._flushing

    async def run(self) -> None:
        try:
            while True:
                await self._slots.acquire()
                try:
                    batch = await self._gather()
                except BaseException:
                    self._slots.release()
                    raise
                task = asyncio.create_task(self._flush(batch), name="cyclone-results-batch")
                self._flushing.add(task)
                task.add_done_callback(self._flushing.discard)
                self._gathering = False
        finally:
            for task in self._flushing:
                task.cancel()
            await asyncio.gather(*self._flushing, return_exceptions=True)

    async def _gather(self) -> list[tuple[WorkerConn, Result, str]]:
        """The next batch: what is queued, and what arrives within `window` of the first."""
        batch = [await self._queue.get()]
        self._gathering = True
        deadline = time.monotonic() + self.window
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can turn the
                # hub's cancel at shutdown, arriving as the window ends, into a timeout.
                async with asyncio.timeout(left):
                    batch.append(await self._queue.get())
            except TimeoutError:
                break
        return batch

    async def _flush(self, batch: list[tuple[WorkerConn, Result, str]]) -> None:
        try:
            applied = await self._apply([r for _, r, _ in batch])
            self._acknowledge(batch, applied)
        except Exception:  # a bug, not a database outage: let the workers reconnect and resend
            log.exception("applying %d results failed", len(batch))
            for conn, _, _ in batch:
                conn.end(grpc.StatusCode.UNAVAILABLE, "the server could not apply results; reconnect and resend")
        finally:
            self._slots.release()

    async def _apply(self, results: list[Result]) -> list[tuple[Result, str]]:
        """(the result applied, its SQL status) per result, in order. A result the database
        refuses for its data is replaced by an invalid-result failure of its attempt."""
        try:
            try:
                rows = await self.engine.apply_results(results)
            except psycopg.OperationalError as e:
                # The database is unreachable (or the batch lost a deadlock): apply again, for
                # as long as it takes. That is safe: results are fenced, so one that did commit
                # before the error comes back 'ended', as a resent one would.
                log.warning("applying %d results failed: %s; retrying", len(results), e)
                async for attempt in AsyncRetrying(
                        retry=retry_if_exception_type(psycopg.OperationalError),
                        wait=wait_exponential(multiplier=0.1, min=0.1, max=2.0),
                        before_sleep=lambda s: log.warning(
                            "applying %d results failed: %s; retrying in %.1fs", len(results),
                            s.outcome.exception(), s.next_action.sleep)):  # type: ignore[union-attr]
                    with attempt:
                        rows = await self.engine.apply_results(results)
            return [(r, status) for r, (_, _, status) in zip(results, rows)]
        except (psycopg.Error, CycloneError) as e:
            # The database refused the data: find the results it refuses by applying
            # them alone, and fail those attempts instead (the worker takes the INVALID
            # ack as the end of its lease).
            if len(results) > 1:
                out: list[tuple[Result, str]] = []
                for r in results:
                    out += await self._apply([r])
                return out
            r = results[0]
            why = e.diag.message_primary if isinstance(e, psycopg.Error) else e.message
            if r.invalid is not None:  # even the failure was refused: a bug, not the worker's data
                raise
            return await self._apply([invalid_result(r.step_id, r.generation,
                                                      f"the database refused it: {why or e}")])

    def _acknowledge(self, batch: list[tuple[WorkerConn, Result, str]],
                     applied: list[tuple[Result, str]]) -> None:
        self.stats["result_batches"] += 1
        # One ResultAcks per stream, each ack added in place (not built and then copied).
        acks: dict[WorkerConn, pb.ServerMessage] = {}
        for (conn, _, wire_step_id), (r, status) in zip(batch, applied):
            key = (r.step_id, r.generation)
            held = conn.forget(key)  # the lease is over whatever the status
            kind = held.kind if held is not None and held.kind else "unknown"
            self._count(kind, r, status)
            if held is not None:
                tracing.result_applied(held.trace, r.outcome, "invalid" if r.invalid is not None else status,
                                       r.message)
            msg = acks.get(conn)
            if msg is None:
                msg = acks[conn] = pb.ServerMessage()
            if r.invalid is not None:
                fate = "the attempt failed" if status in ("retried", "discarded") else f"the lease had {status}"
                msg.acks.acks.add(step_id=wire_step_id, lease_generation=r.generation,
                                  status=ACK_OF_STATUS["invalid"], detail=f"{r.invalid}; {fate}")
            else:
                msg.acks.acks.add(step_id=wire_step_id, lease_generation=r.generation,
                                  status=ACK_OF_STATUS[status], detail=DETAIL_OF_STATUS[status])
        now = time.monotonic()
        for conn, msg in acks.items():
            conn.send(msg)
            conn.unacked -= len(msg.acks.acks)
            if conn.draining and conn.unacked == 0:
                conn.end()
            if conn.quiet:  # a hand-back's ack: a pass at the quiet's end (WorkerConn.forget)
                asyncio.get_running_loop().call_later(conn.quiet_until - now, self.on_applied)
        self.on_applied()

    def _count(self, kind: str, r: Result, status: str) -> None:
        if status in ("stale", "ended", "unknown"):
            self.stats["fenced_results"][status] += 1
        elif status == "applied" and r.outcome == "completed":
            self.stats["completions"][kind] += 1
        elif status == "output_too_large":
            self.stats["failures"][(kind, "output_too_large")] += 1
        elif status in ("retried", "discarded"):
            error_kind = "error" if status == "retried" else "permanent" if r.permanent else "max_attempts"
            self.stats["failures"][(kind, error_kind)] += 1
        elif status == "snoozed":
            self.stats["snoozes"][kind] += 1
