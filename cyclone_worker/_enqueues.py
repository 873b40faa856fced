"""Client.enqueue for many concurrent callers: a few calls on the wire, the other jobs together.

A gRPC call costs far more than a job's row work: on the 2-core machine of
docs/benchmarks.md a bare grpc.aio unary call takes about 1 ms of CPU between client and
server, while the server writes a job in well under 0.1 ms. A service that enqueues jobs one
by one from many tasks would spend its time in the transport. So a Client has at most
`limit` enqueue calls in flight; the jobs of the `enqueue` calls made meanwhile wait, and
go together in one EnqueueMany as soon as a call returns. A call made while fewer are in
flight goes at once, as an Enqueue: no timer, nothing added to a lone job's latency.

Each caller gets the answer it would have had alone:

- A batch the server refuses (INVALID_ARGUMENT, ALREADY_EXISTS, RESOURCE_EXHAUSTED) wrote
  nothing (EnqueueMany is all or none): its jobs go again, one Enqueue each, so that only
  the refused job's caller gets the refusal, in Enqueue's words.
- Any other failure (UNAVAILABLE, DEADLINE_EXCEEDED, UNAUTHENTICATED, ...) reaches every
  caller of the batch: its jobs share one transaction and so one fate, and a call that may
  have been applied is not made again (jobs without idempotency keys would be doubled).
- Jobs go together only with jobs of the same trace context: the server keeps the call's
  context with every run the call makes.
- A batch's deadline is its oldest job's (each job's is `rpc_timeout` from its `enqueue`
  call); a job whose deadline passed while it waited fails alone with DEADLINE_EXCEEDED.
- A caller cancelled while its job waits takes the job out: it is never sent.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ._errors import CycloneClientError
from cyclone_proto import runs_pb2

# EnqueueMany's own limit on jobs per call (the server refuses more).
MAX_JOBS = 1000
# Request bytes per batch: one message stays moderate; a bigger job goes alone.
MAX_BYTES = 1 << 20
# Jobs of other trace contexts looked past for one batch, at most.
SCAN_OTHERS = 256
# Nothing was written: the server refused the call as a whole or one of its jobs.
_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                       grpc.StatusCode.RESOURCE_EXHAUSTED})

Trace = tuple[tuple[str, str], ...]
# Client._call for the Runs service: (method, request, timeout, trace metadata) -> response.
Call = Callable[[str, Any, float, Trace], Awaitable[Any]]


@dataclass(slots=True)
class _Waiting:
    request: runs_pb2.EnqueueRequest
    trace: Trace
    deadline: float  # loop time
    size: int
    future: asyncio.Future[str]


class Enqueues:
    """The enqueue calls of one Client; `limit` 0 sends one Enqueue per job, without limit."""

    def __init__(self, call: Call, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"enqueue_calls: {limit!r} is not a number of calls >= 0")
        self._call = call
        self.limit = limit
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._in_flight = 0  # calls on the wire, sent by callers or by senders
        self._senders: set[asyncio.Task[None]] = set()

    async def enqueue(self, request: runs_pb2.EnqueueRequest, timeout: float, trace: Trace) -> str:
        """The job's run id once it committed; errors as Enqueue's."""
        if self.limit == 0:
            return (await self._call("Enqueue", request, timeout, trace)).run_id
        if self._in_flight < self.limit and not self._waiting:
            self._in_flight += 1
            try:
                return (await self._call("Enqueue", request, timeout, trace)).run_id
            finally:
                self._in_flight -= 1
                self._start()
        loop = asyncio.get_running_loop()
        entry = _Waiting(request, trace, loop.time() + timeout, request.ByteSize(), loop.create_future())
        entry.future.add_done_callback(_retrieve)
        self._waiting.append(entry)
        self._start()
        try:
            return await asyncio.shield(entry.future)
        except asyncio.CancelledError:
            # Not sent yet: never sent. Already in a call: its outcome is that call's, which
            # this caller cannot learn, as when a lone call is cut off.
            try:
                self._waiting.remove(entry)
            except ValueError:
                pass
            raise

    async def close(self) -> None:
        """Wait for the calls that senders have on the wire (their callers wait for them)."""
        await asyncio.gather(*self._senders, return_exceptions=True)

    def _start(self) -> None:
        """A sender for the waiting jobs, if a call may go now."""
        if self._waiting and self._in_flight < self.limit:
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(), name="cyclone-enqueue-batch")
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send(self) -> None:
        try:
            while self._waiting:
                await self._send_batch(self._next_batch())
        finally:
            # No await between the last look at _waiting and this: a job queued after it
            # finds the call slot free and starts a sender.
            self._in_flight -= 1

    def _next_batch(self) -> list[_Waiting]:
        """The oldest waiting job and those after it of the same trace context, within the limits."""
        first = self._waiting.popleft()
        batch, size, others = [first], first.size, []
        while self._waiting and len(batch) < MAX_JOBS:
            entry = self._waiting[0]
            if entry.trace != first.trace:
                if len(others) == SCAN_OTHERS:  # many contexts waiting: do not scan them all each time
                    break
                others.append(self._waiting.popleft())
            elif size + entry.size > MAX_BYTES:
                break
            else:
                size += entry.size
                batch.append(self._waiting.popleft())
        self._waiting.extendleft(reversed(others))
        return batch

    async def _send_batch(self, batch: list[_Waiting]) -> None:
        now = asyncio.get_running_loop().time()
        live = []
        for entry in batch:
            if entry.future.done():
                continue
            if entry.deadline <= now:
                entry.future.set_exception(CycloneClientError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                                              "Deadline Exceeded (waiting to be sent)"))
            else:
                live.append(entry)
        if not live:
            return
        if len(live) == 1:
            await self._alone(live[0])
            return
        timeout = min(entry.deadline for entry in live) - now
        try:
            resp = await self._call("EnqueueMany", runs_pb2.EnqueueManyRequest(jobs=[e.request for e in live]),
                                    timeout, live[0].trace)
        except CycloneClientError as e:
            if e.code in _REFUSALS:
                await asyncio.gather(*(self._alone(entry) for entry in live))
            else:
                _fail(live, e)
            return
        except asyncio.CancelledError:
            _fail(live, asyncio.CancelledError())
            raise
        except Exception as e:  # reaches the callers; the sender carries on with the next batch
            _fail(live, e)
            return
        if len(resp.jobs) != len(live):
            _fail(live, CycloneClientError(grpc.StatusCode.INTERNAL,
                                           f"EnqueueMany answered {len(resp.jobs)} jobs for {len(live)}"))
            return
        for entry, job in zip(live, resp.jobs):
            if not entry.future.done():
                entry.future.set_result(job.run_id)

    async def _alone(self, entry: _Waiting) -> None:
        remaining = entry.deadline - asyncio.get_running_loop().time()
        try:
            run_id = (await self._call("Enqueue", entry.request, max(remaining, 0.001), entry.trace)).run_id
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
