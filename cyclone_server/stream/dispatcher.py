"""The dispatcher: claims steps in batches for the free slots of connected workers and pushes them as Leases."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, wait_exponential

from cyclone_proto import workers_pb2 as pb

from cyclone_server.errors import InvalidArgument
from cyclone_server.records import PreparedJob
from cyclone_server.store.engine import Engine

from cyclone_worker._loop import wait_event_until

from .conn import HeldLease, LeaseKey, WorkerConn
from .wire import lease_message, traced

log = logging.getLogger(__name__)

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
# sooner than CLAIM_PACE seconds after that claim, or STREAM_PACE times that while new jobs
# of its kinds come at STREAM_RATE per second or more (at least 8 of them): under such a
# stream, each claim and the messages and commits that follow it are shared by three times
# as many jobs (docs/benchmarks.md). 30 ms leaves room for the claim and its commit within
# the 50 ms in which a due step is leased (docs/lifecycle.md, "Due steps are leased within 50 ms").
CLAIM_PACE = 0.01
STREAM_PACE = 3
STREAM_RATE = 800.0
MIN_PACE_WAIT = 0.001

class Dispatcher:
    """Claims steps in batches for the free slots of connected workers and pushes them as Leases.

    Woken (coalesced) by `wake()` whenever steps may have become claimable. Steps that become
    claimable by the clock alone (a backoff, a snooze, a scheduled job) wake it too: after a
    pass whose claim came up short, it asks when the next step of those kinds is due and
    sleeps until then (docs/lifecycle.md, "Due steps are leased within 50 ms"). A step due now
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
        # Kinds whose claims came up short with nothing due (next_due None): empty, or every
        # step held by a limit at its cap. A pass claims for them again only after new work
        # (`new_work`: an announcement of this engine, a NOTIFY of another server or of a
        # freed limit slot) or the IDLE_POLL safety net, not on every freed worker slot.
        self._held: set[str] = set()
        self._news = 0  # calls of new_work: a pass holds no kind if new work came while it looked

    def wake(self) -> None:
        self._event.set()

    def new_work(self) -> None:
        """Steps may have become claimable (what and where is unknown): held kinds are looked at again."""
        self._held.clear()
        self._news += 1
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
            # The safety net holds whatever is due: a step due tomorrow is no reason to
            # miss a lost wake-up until then. The due and pace waits end by the database's clock
            # or time.monotonic(), and a claim made before then comes up short and leases the
            # step MIN_DUE_WAIT late: so never a moment early, on uvloop either (wait_event_until).
            wait = IDLE_POLL if self._due_in is None else min(self._due_in, IDLE_POLL)
            woken = await wait_event_until(self._event, time.monotonic() + wait)
            if not woken and (self._due_in is None or self._due_in >= IDLE_POLL):  # the safety net, not a due
                self._held.clear()    # timer: a wake-up lost with a LISTEN connection
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
                        s.outcome.exception().__cause__, s.next_action.sleep)):  # type: ignore[union-attr]
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
        """Claim for every worker with free slots that no pace holds back; returns the seconds
        until the next pass is owed (a step of an emptied kind becomes due, or a pace ends),
        None for none.

        A claim that gets fewer rows than it asked for paces its worker (`_pace`), and so
        does a pass that finds its kinds emptied by another worker's claim. Only a stream
        of new jobs is worth waiting for: any other work ends every pace at once
        (`unpace`), and a worker with a backlog is never paced."""
        began = time.monotonic()
        news = self._news
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
                if kinds and all(k in self._held for k in kinds):  # nothing new for them since
                    continue
                kinds = [k for k in kinds if k not in self._held]
                if not kinds:  # a claim of this pass found every one of them empty
                    conn.claimed(began + max(emptied.get(k, self.claim_pace) for k in conn.kinds))
                    continue
                conn.reserved += want
                try:
                    claimed = time.monotonic()
                    try:
                        rows = await self.engine.claim_leases(conn.worker_id, kinds, want, self.lease_ttl)
                    except InvalidArgument as e:  # this worker's data, not the database: serve the others
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
        if waiting and due is None and news == self._news:  # nothing due for them until new work comes
            self._held.update(waiting)
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
        rated = [row.step_id for row in rows if row.rated]
        # No await from the check above to the send below: the stream takes these.
        msg = pb.ServerMessage()
        add = msg.leases.leases.add
        for row in rows:
            trace = None
            if row.trace_context:
                row, trace = traced(row)
            held[(row.step_id, row.lease_generation)] = HeldLease(
                run_id=row.run_id, kind=row.kind, attempt=row.attempt,
                attempt_deadline_us=row.attempt_deadline_us, trace=trace)
            claims[row.kind] += 1
            lease_message(row, add())
        conn.send(msg, rated)
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


__all__ = ["Dispatcher", "IDLE_POLL", "MIN_DUE_WAIT", "MAX_LOCKED_WAIT", "CLAIM_PACE", "STREAM_PACE", "STREAM_RATE"]
