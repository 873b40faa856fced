"""One worker stream's state: its slots, the leases it holds, its outbox and its pace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from cyclone_proto import workers_pb2 as pb

from cyclone_server import tracing
from cyclone_worker._loop import timer_slack, wait_event_until

LeaseKey = tuple[str, int]  # (step_id, lease_generation)

# After a zero-delay snooze, a worker gets no lease until its next message (the server
# pings it at once), or this many seconds. A stopping worker hands back the leases it did
# not start as zero-delay snoozes and half-closes right after; on a loaded machine, the
# snooze could be acked before the half-close was read, and a lease pushed in between
# would never run (WorkerConn.hush).
HANDBACK_QUIET = 0.1

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


class RatedLeases:
    """Put in a stream's outbox for a Leases message with leases whose starts count against
    a rate (`step_ids`): once it is written, the hub reports them (rated.RatedPushes)."""

    __slots__ = ("msg", "step_ids")

    def __init__(self, msg: pb.ServerMessage, step_ids: list[str]) -> None:
        self.msg = msg
        self.step_ids = step_ids


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
        back to it within a round trip, not `seconds` (docs/lifecycle.md: a due step is leased
        within 50 ms); a stopping one has half-closed, or no longer answers pings."""
        self.quiet_for = seconds
        self.quiet_until = time.monotonic() + seconds
        self._quiet_over.clear()
        self.ping()

    def call_at_quiet_end(self, callback: Callable[[], object]) -> None:
        """Call `callback` once, when the quiet is over by time.monotonic(), the clock
        `quiet_until` counts on (a quiet that `forget` extended meanwhile: at its new end; one that
        `heard` ended: at the next timer, the hub having woken the dispatcher then). A wake-up
        before the end would find the worker still quiet and be spent, and the next pass could be
        IDLE_POLL away: the timer has uvloop's slack (_loop.timer_slack), and one that fires early
        anyway is armed again for the rest."""
        loop = asyncio.get_running_loop()
        slack = timer_slack(loop)

        def at_end() -> None:
            left = self.quiet_until - time.monotonic()
            if self.quiet_until and left > 0 and not self.closed:
                loop.call_later(left + slack, at_end)
            else:
                callback()
        loop.call_later(max(self.quiet_until - time.monotonic(), 0.0) + slack, at_end)

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
        while self.quiet:  # (forget may extend the quiet meanwhile)
            await wait_event_until(self._quiet_over, self.quiet_until)

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

    def send(self, msg: pb.ServerMessage, rated: list[str] | None = None) -> None:
        """Queue `msg` for the stream; `rated`: the step ids of its leases whose starts count
        against a rate (reported once it is written)."""
        if not self.closed:
            self.outbox.put_nowait(RatedLeases(msg, rated) if rated else msg)

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


__all__ = ["LeaseKey", "HANDBACK_QUIET", "HeldLease", "End", "RatedLeases", "WorkerConn"]
