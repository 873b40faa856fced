"""The leases a worker holds: runs their handlers, keeps each result until the server acks it.

This table outlives the streams: after a reconnect, its leases go out again in Hello.held
and its unacked results are sent again on the new stream.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

from ._context import Context
from ._errors import Permanent, outcome_of
from ._logging import current_step
from ._models import enum_name
from ._tracing import preload, spans_wanted, traced
from cyclone_proto import workers_pb2
from .values import from_value, to_duration, to_value

__all__ = ["Held", "LeaseTable"]

log = logging.getLogger("cyclone_worker")

LeaseKey = tuple[str, int]  # (step_id, lease_generation)

# What a server that does not say (Welcome.max_payload_bytes = 0) stores at most.
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# The server stores a failure message up to this many bytes and cuts the rest: so is it sent.
MAX_ERROR_MESSAGE_BYTES = 64 * 1024
# The same for a failure's details (the traceback).
MAX_ERROR_DETAILS_BYTES = 16 * 1024
# A failed handler's traceback is logged up to this many bytes (its middle cut past it).
LOG_EXCERPT_BYTES = 16 * 1024
# The counts' name of each ack status this SDK knows ('applied', ...), looked up once, not
# per ack; a newer server's status is named by enum_name as it comes ('unknown_7').
_ACK_NAMES = {v: enum_name(workers_pb2.AckStatus, v, "ACK_STATUS_") for v in workers_pb2.AckStatus.values()}


def completed(out: Any, max_payload_bytes: int) -> workers_pb2.StepResult:
    """The Completed answer for a handler's return value: the output, or only its size when
    it is over the server's limit (the step is then discarded as output_too_large, and the
    output never crosses the wire). Raises TypeError / ValueError for a value JSON cannot hold."""
    result = workers_pb2.StepResult()
    # Filled in place: built apart and passed in, the Value was copied twice (into Completed,
    # then into the StepResult).
    value = to_value(out, "output", into=result.completed.output)
    # The size that counts is compact JSON's; the protobuf size bounds it cheaply from below
    # by far (an escaped character costs at most 6 bytes in JSON), so most outputs skip it.
    if value.ByteSize() * 8 > max_payload_bytes:
        # Measured as the server measures what it receives: the value as it crosses the wire
        # (an integral float such as 1.0 is the JSON number 1, not 1.0).
        size = len(json.dumps(from_value(value), separators=(",", ":"), ensure_ascii=False)
                   .encode("utf-8", "surrogatepass"))
        if size > max_payload_bytes:
            return workers_pb2.StepResult(completed=workers_pb2.Completed(oversized_output_bytes=size))
    return result


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, its marker included, so that the server keeps it
    as sent and the marker names the size the handler's text had."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    keep = limit - len(f"... [cut at {limit} of {len(raw)} bytes]")  # the marker below is no longer
    return raw[:keep].decode("utf-8", "ignore") + f"... [cut at {keep} of {len(raw)} bytes]"


def log_excerpt(e: BaseException, limit: int = LOG_EXCERPT_BYTES) -> str:
    """The traceback of a failed handler as logged: its message once (at its end), and past
    `limit` bytes of UTF-8 cut in the middle, so that a huge message cannot flood the log
    (the attempt's own error keeps up to MAX_ERROR_MESSAGE_BYTES of it)."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip("\n")
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    half = limit // 2
    head = raw[:half].decode("utf-8", "ignore")
    tail = raw[-half:].decode("utf-8", "ignore")
    return f"{head}\n... [{len(raw) - 2 * half} bytes cut] ...\n{tail}"


def bounded_message(result: workers_pb2.StepResult) -> workers_pb2.StepResult:
    """Cut a failure message past MAX_ERROR_MESSAGE_BYTES and its details past
    MAX_ERROR_DETAILS_BYTES, as the server would store them."""
    if result.HasField("failed"):
        result.failed.message = _cut(result.failed.message, MAX_ERROR_MESSAGE_BYTES)
        result.failed.details = _cut(result.failed.details, MAX_ERROR_DETAILS_BYTES)
    return result


class Held:
    """One lease: its handler runs, or its result waits for an ack."""

    def __init__(self, lease: workers_pb2.Lease, ctx: Context) -> None:
        self.lease = lease
        self.ctx = ctx
        self.key: LeaseKey = (lease.step_id, lease.lease_generation)
        self.task: asyncio.Task[None] | None = None  # None: not started (deferred while draining)
        self.result: workers_pb2.StepResult | None = None
        self.stopped = False  # the server took the lease back (Stop, Welcome.lost) or the worker quit

    def ref(self) -> workers_pb2.LeaseRef:
        return workers_pb2.LeaseRef(step_id=self.key[0], lease_generation=self.key[1])

    def answer(self, result: workers_pb2.StepResult) -> workers_pb2.StepResult:
        result.step_id, result.lease_generation = self.key
        return result


class LeaseTable:
    """Held leases by (step_id, generation), and the handlers that run them."""

    def __init__(self, handlers: Mapping[str, Callable[[Context], Any]], worker_id: str, counts: Counter[str]) -> None:
        self.handlers = handlers
        self.worker_id = worker_id
        self.counts = counts
        self.held: dict[LeaseKey, Held] = {}
        # Sends a result on the stream that is up (Session.send_result), None between streams.
        # A callable, not the session: the session uses this table, never the other way.
        self.outlet: Callable[[workers_pb2.StepResult], None] | None = None
        self.draining = False  # new leases are held unstarted, and handed back at the end
        self.changed = asyncio.Event()  # set whenever a lease ends or gets its result
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: Executor | None = None
        self._pool: Any = None
        self.max_payload_bytes = DEFAULT_MAX_PAYLOAD_BYTES  # the server's, from its Welcome
        # Whether each kind's handler is a coroutine function, looked up once per kind, not per
        # lease (by kind: a handler may be a callable object that cannot be hashed).
        self._is_async: dict[str, bool] = {}

    def open(self, loop: asyncio.AbstractEventLoop, executor: Executor, pool: Any) -> None:
        self._loop, self._executor, self._pool = loop, executor, pool
        preload()  # not at the first lease's start (traced)

    def refs(self) -> list[workers_pb2.LeaseRef]:
        """What Hello.held lists: every lease the server has not taken back."""
        return [h.ref() for h in self.held.values() if not h.stopped]

    def welcomed(self, outlet: Callable[[workers_pb2.StepResult], None], lost: list[workers_pb2.LeaseRef],
                 max_payload_bytes: int = 0) -> list[workers_pb2.StepResult]:
        """A new stream is up: stop the lost leases; returns the results to send on it."""
        self.max_payload_bytes = max_payload_bytes or DEFAULT_MAX_PAYLOAD_BYTES
        for ref in lost:
            self.stop(ref, "lost")
        self.outlet = outlet
        return [h.result for h in self.held.values() if h.result is not None and not h.stopped]

    def start_all(self, leases: Iterable[workers_pb2.Lease]) -> None:
        """Run the handlers of a Leases message's leases (unless the table is draining)."""
        spans = spans_wanted()  # once per message (see spans_wanted)
        for lease in leases:
            self.start(lease, spans)

    def start(self, lease: workers_pb2.Lease, spans: bool | None) -> None:
        """Run a lease's handler (unless the table is draining); `spans` as spans_wanted() says."""
        if (lease.step_id, lease.lease_generation) in self.held:
            return
        assert self._loop is not None, "LeaseTable.open() first"
        h = Held(lease, Context(lease, loop=self._loop, worker_id=self.worker_id, pool=self._pool))
        self.held[h.key] = h
        self.counts["leases"] += 1
        if not self.draining:
            # No span to make and no trace context to pass on: the handler runs without
            # the tracing wrapper (traced() would only await it).
            run = (traced(h, self._execute) if spans or (spans is False and lease.trace_context.traceparent)
                   else self._execute(h))
            h.task = asyncio.create_task(run, name=f"cyclone-step-{lease.node}-{lease.step_id}")

    def stop(self, ref: workers_pb2.LeaseRef, reason: str) -> None:
        h = self.held.get((ref.step_id, ref.lease_generation))
        if h is None:
            return
        h.stopped = True
        self.counts[f"stopped_{reason}"] += 1
        h.ctx.cancelled.set(reason)
        if h.task is not None and not h.task.done():
            h.task.cancel()  # a thread handler keeps running; its result is dropped
        else:
            self._drop(h)

    def acked(self, ack: workers_pb2.ResultAck) -> None:
        h = self.held.get((ack.step_id, ack.lease_generation))
        if h is None:
            return
        status = _ACK_NAMES.get(ack.status) or enum_name(workers_pb2.AckStatus, ack.status, "ACK_STATUS_")
        self.counts[status] += 1
        if ack.status == workers_pb2.ACK_STATUS_INVALID:
            # The server could not use our answer and failed the attempt in its place: the
            # lease is over (a bug to report, not something to answer again).
            log.error("cyclone: result for step %s (node %s) refused as invalid: %s", ack.step_id,
                      h.lease.node, ack.detail)
        elif ack.status != workers_pb2.ACK_STATUS_APPLIED and not h.ctx.completed_in_tx:
            log.warning("cyclone: result for step %s (node %s, generation %d) refused: %s %s", ack.step_id,
                        h.lease.node, ack.lease_generation, status, ack.detail)
        self._drop(h)

    async def _execute(self, h: Held) -> None:
        fn = self.handlers.get(h.lease.kind)
        result: workers_pb2.StepResult | None
        current_step.set(h.ctx)  # this task's own context: what StepLogFilter reads
        try:
            if fn is None:
                raise LookupError(f"worker {self.worker_id} has no handler for kind {h.lease.kind!r}")
            is_async = self._is_async.get(h.lease.kind)
            if is_async is None:
                is_async = self._is_async[h.lease.kind] = inspect.iscoroutinefunction(fn)
            if is_async:
                out = await fn(h.ctx)
            else:
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(self._executor, contextvars.copy_context().run, fn, h.ctx)
                if inspect.isawaitable(out):
                    out = await out
            try:
                result = completed(out, self.max_payload_bytes)
            except (TypeError, ValueError) as e:
                result = outcome_of(Permanent(f"output is not JSON: {e}"))
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if not h.stopped and task is not None and task.cancelling():
                raise  # the worker itself is being torn down
            # Stopped by the server, or the handler raised CancelledError of its own: the
            # latter is an ordinary (retryable) failure, so the lease is answered, not orphaned.
            result = None if h.stopped else outcome_of(RuntimeError(f"handler raised CancelledError {e}".strip()))
        except Exception as e:  # noqa: BLE001 - every handler error becomes a result
            result = outcome_of(e)
            if result.HasField("failed"):  # the worker's log keeps the traceback too, bounded
                h.ctx.log.warning("handler %s failed:\n%s", h.lease.kind, log_excerpt(e))
        if h.ctx.completed_in_tx:
            # The step completed in the handler's transaction; this answer only frees the slot
            # (it is acked ENDED), so it carries no output that could fail to convert.
            result = workers_pb2.StepResult(completed=workers_pb2.Completed())
        if result is None or h.stopped:
            self._drop(h)
            return
        self._finish(h, h.answer(result))

    def _finish(self, h: Held, result: workers_pb2.StepResult) -> None:
        h.result = bounded_message(result)
        self.changed.set()
        if self.outlet is not None:
            self.outlet(result)

    def _drop(self, h: Held) -> None:
        self.held.pop(h.key, None)
        self.changed.set()

    # -- stopping -------------------------------------------------------------------------

    def running(self) -> int:
        """Started leases not yet answered and acked."""
        return sum(1 for h in self.held.values() if h.task is not None)

    def give_back_unstarted(self) -> None:
        """Answer every lease that never ran with a zero snooze: attempt and reclaims unchanged."""
        for h in list(self.held.values()):
            if h.task is None and h.result is None:
                self._finish(h, h.answer(workers_pb2.StepResult(snoozed=workers_pb2.Snoozed(delay=to_duration(0)))))

    async def abandon(self) -> None:
        """Cancel every handler still running and forget every lease (the worker is gone)."""
        tasks = [h.task for h in self.held.values() if h.task is not None and not h.task.done()]
        for h in self.held.values():
            h.stopped = True
            h.ctx.cancelled.set("shutdown")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.held.clear()
