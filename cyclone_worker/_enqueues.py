"""Client.enqueue for many concurrent callers: a few calls on the wire, the other jobs together.

A gRPC call costs far more than a job's row work: on the machines of docs/benchmarks.md
one `Enqueue` call per job spent three times the bare call's CPU in the server, and the
server writes a job in well under 0.1 ms. A service that enqueues jobs one by one from
many tasks would spend its time in the transport. So a Client has at most `limit` enqueue
calls in flight per trace context; the jobs of the `enqueue` calls made meanwhile wait,
and go together in one EnqueueMany as soon as a call returns. A call made while fewer are
in flight goes at once, as an Enqueue: no timer, nothing added to a lone job's latency.

Each caller gets the answer it would have had alone:

- A batch the server refuses (INVALID_ARGUMENT, ALREADY_EXISTS, RESOURCE_EXHAUSTED,
  UNIMPLEMENTED) wrote nothing (EnqueueMany is all or none). The refusal names the job
  (`jobs[3]...`): the refused one goes alone, so that its caller gets the refusal in
  Enqueue's words, and the others go back to the head of the queue, to go together again.
  A refusal that names no job halves the batch until the refused job is alone; after an
  UNIMPLEMENTED (a server without EnqueueMany) every job goes alone.
- Any other failure (UNAVAILABLE, DEADLINE_EXCEEDED, UNAUTHENTICATED, ...) reaches every
  caller of the batch: its jobs share one transaction and so one fate, and a call that may
  have been applied is not made again (jobs without idempotency keys would be doubled).
- Trace contexts: each has its own calls and its own queue (`_Lane`), since the server
  keeps the call's context with every run the call makes. Callers in spans of their own
  (a span per request) share nothing and wait for nothing; the jobs of one span (a
  handler that enqueues many) go together.
- Each call has `rpc_timeout` from when it is sent, as a lone call has; a job waits before
  that at most for a call in flight to return.
- Until the server has answered once, every job goes in a call of its own, so that each
  caller waits for the server (`wait_for_server`) and gets the "cannot reach" answer itself.
- A caller cancelled while its job waits takes the job out: it is never sent. Cancelled
  while its job is in a call, the job's fate is that call's, as for a lone call cut off;
  it is not sent again after a refusal.
- `close()` fails the jobs still waiting (CANCELLED) and waits for the senders; a call
  that the closed channel cut off ends in CANCELLED too (Client._call), not in a bare
  CancelledError of a task nobody cancelled.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ._errors import CycloneClientError
from cyclone_proto import runs_pb2

# EnqueueMany's own limit on jobs per call (the server refuses more).
MAX_JOBS = 1000
# Request bytes per batch: one message stays moderate; a bigger job goes alone.
MAX_BYTES = 1 << 20
# Nothing was written: the server refused the call as a whole, or one of its jobs.
_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED})
# How EnqueueMany names the job it refused: "jobs[3].kind: ..." or "jobs[3]: ...".
_JOB_INDEX = re.compile(r"^jobs\[(\d+)\][.:]")

Trace = tuple[tuple[str, str], ...]
# Client._call for the Runs service: (method, request, trace metadata) -> response.
Call = Callable[[str, Any, Trace], Awaitable[Any]]


@dataclass(slots=True)
class _Waiting:
    request: runs_pb2.EnqueueRequest
    size: int
    future: asyncio.Future[str]  # cancelled with its caller: then never sent (again)


@dataclass(slots=True)
class _Lane:
    """The calls and the waiting jobs of one trace context."""
    trace: Trace
    in_flight: int = 0  # calls on the wire, sent by callers or by senders
    waiting: collections.deque[_Waiting] = field(default_factory=collections.deque)


class Enqueues:
    """The enqueue calls of one Client; `limit` 0 sends one Enqueue per job, without limit.

    `ready()` says whether the server has answered the client once (jobs go together only
    then)."""

    def __init__(self, call: Call, limit: int, ready: Callable[[], bool]) -> None:
        if type(limit) is not int or limit < 0:
            raise ValueError(f"enqueue_calls: {limit!r} is not a whole number of calls >= 0")
        self._call = call
        self.limit = limit
        self._ready = ready
        self._lanes: dict[Trace, _Lane] = {}
        self._senders: set[asyncio.Task[None]] = set()
        self._closing = False
        self._many_unimplemented = False  # the server has no EnqueueMany: every job alone

    async def enqueue(self, request: runs_pb2.EnqueueRequest, trace: Trace) -> str:
        """The job's run id once it committed; errors as Enqueue's."""
        if self._closing:
            raise CycloneClientError(grpc.StatusCode.CANCELLED, "the Client was closed")
        if self.limit == 0 or not self._ready() or self._many_unimplemented:
            return (await self._call("Enqueue", request, trace)).run_id
        lane = self._lanes.get(trace)
        if lane is None:
            lane = self._lanes[trace] = _Lane(trace)
        if lane.in_flight < self.limit and not lane.waiting:
            lane.in_flight += 1
            try:
                return (await self._call("Enqueue", request, trace)).run_id
            finally:
                lane.in_flight -= 1
                self._next(lane)
        entry = _Waiting(request, request.ByteSize(), asyncio.get_running_loop().create_future())
        entry.future.add_done_callback(_retrieve)
        lane.waiting.append(entry)
        self._next(lane)
        try:
            # Not shielded: cancelling the caller cancels the future at once, so no sender
            # takes the job after that, even in the same turn of the loop.
            return await entry.future
        except asyncio.CancelledError:
            # Not sent yet: never sent. In a call: that call's fate, and never sent again.
            try:
                lane.waiting.remove(entry)
            except ValueError:
                pass
            self._drop_if_idle(lane)
            raise

    def close(self) -> None:
        """Fail the jobs still waiting; the caller closes the channel (which ends the calls
        on it), then awaits `closed()`."""
        self._closing = True
        for lane in list(self._lanes.values()):
            waiting, lane.waiting = list(lane.waiting), collections.deque()
            _fail(waiting, CycloneClientError(grpc.StatusCode.CANCELLED, "the Client was closed"))

    async def closed(self) -> None:
        """Wait for the senders to end; the Client can be used again afterwards."""
        try:
            await asyncio.gather(*self._senders, return_exceptions=True)
        finally:
            self._closing = False

    def _next(self, lane: _Lane) -> None:
        """Senders for the lane's waiting jobs while a call may go; else forget an idle lane."""
        while lane.waiting and lane.in_flight < self.limit and not self._closing:
            lane.in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(lane), name="cyclone-enqueue-batch")
            self._senders.add(task)
            # The bookkeeping is the task's done callback, not a `finally`: a task cancelled
            # before its first step never runs its body, and must still give back its slot.
            task.add_done_callback(lambda t, lane=lane: self._sender_done(lane, t))
        self._drop_if_idle(lane)

    def _sender_done(self, lane: _Lane, task: asyncio.Task[None]) -> None:
        self._senders.discard(task)
        lane.in_flight -= 1  # (a lane is forgotten only with nothing in flight: it is still the trace's)
        self._next(lane)

    def _drop_if_idle(self, lane: _Lane) -> None:
        if not lane.in_flight and not lane.waiting and self._lanes.get(lane.trace) is lane:
            del self._lanes[lane.trace]

    async def _send(self, lane: _Lane) -> None:
        # No await between the last look at the queue and the task's end (its done
        # callback gives the slot back and starts a sender for jobs queued meanwhile).
        while lane.waiting and not self._closing:
            await self._send_jobs(lane, self._next_batch(lane))

    @staticmethod
    def _next_batch(lane: _Lane) -> list[_Waiting]:
        """The oldest waiting jobs, within the limits."""
        first = lane.waiting.popleft()
        batch, size = [first], first.size
        while lane.waiting and len(batch) < MAX_JOBS and size + lane.waiting[0].size <= MAX_BYTES:
            size += lane.waiting[0].size
            batch.append(lane.waiting.popleft())
        return batch

    async def _send_jobs(self, lane: _Lane, part: list[_Waiting]) -> None:
        """Send the jobs in one call, each caller getting its own answer."""
        part = [entry for entry in part if not entry.future.done()]  # not those of cancelled callers
        if not part:
            return
        if self._closing:
            _fail(part, CycloneClientError(grpc.StatusCode.CANCELLED, "the Client was closed"))
            return
        try:
            if self._many_unimplemented:  # as with enqueue_calls=0: every waiting job, at once
                part += lane.waiting
                lane.waiting.clear()
                await asyncio.gather(*(self._alone(lane.trace, e) for e in part if not e.future.done()))
                return
            if len(part) == 1:
                await self._alone(lane.trace, part[0])
                return
            request = runs_pb2.EnqueueManyRequest(jobs=[entry.request for entry in part])
            resp = await self._call("EnqueueMany", request, lane.trace)
            run_ids = [job.run_id for job in resp.jobs]
            if len(run_ids) != len(part):
                raise CycloneClientError(grpc.StatusCode.INTERNAL,
                                         f"EnqueueMany answered {len(run_ids)} jobs for {len(part)}")
        except CycloneClientError as e:
            if e.code not in _REFUSALS:
                _fail(part, e)
                return
            if self._closing:  # close() emptied the queue meanwhile: nothing goes back, nothing more is sent
                _fail(part, CycloneClientError(grpc.StatusCode.CANCELLED, "the Client was closed"))
                return
            # Nothing was written. The refused job goes alone, so that its caller gets
            # Enqueue's answer; the others go back to the head of the queue, to go again
            # together (with newer jobs) once this call slot is free.
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                self._many_unimplemented = True
            match = _JOB_INDEX.match(e.message)
            i = int(match.group(1)) if match else None
            if i is not None and i < len(part):
                lane.waiting.extendleft(reversed(part[:i] + part[i + 1:]))
                if not part[i].future.done():
                    await self._alone(lane.trace, part[i])
            else:  # no job named: halve the batch until the refused job is alone
                half = len(part) // 2
                lane.waiting.extendleft(reversed(part[half:]))
                await self._send_jobs(lane, part[:half])
            return
        except asyncio.CancelledError:
            _fail(part, asyncio.CancelledError())
            raise
        except Exception as e:  # reaches the callers; the sender carries on with the next batch
            _fail(part, e)
            return
        for entry, run_id in zip(part, run_ids):
            if not entry.future.done():
                entry.future.set_result(run_id)

    async def _alone(self, trace: Trace, entry: _Waiting) -> None:
        try:
            run_id = (await self._call("Enqueue", entry.request, trace)).run_id
        except asyncio.CancelledError:
            _fail([entry], asyncio.CancelledError())
            raise
        except Exception as e:
            _fail([entry], e)
        else:
            if not entry.future.done():
                entry.future.set_result(run_id)


def _fail(entries: list[_Waiting], error: BaseException) -> None:
    for entry in entries:
        if entry.future.done():
            continue
        if isinstance(error, CycloneClientError):  # one instance per caller: each raises its own
            entry.future.set_exception(CycloneClientError(error.code, error.message))
        elif isinstance(error, asyncio.CancelledError):
            entry.future.cancel()
        else:
            entry.future.set_exception(error)


def _retrieve(future: asyncio.Future[str]) -> None:
    # A caller cancelled meanwhile never reads its future's error: read it here, so that
    # asyncio does not log it as never retrieved.
    if not future.cancelled():
        future.exception()
