"""The result committer: group-commits the results of every stream, then acks each on its own stream."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from cyclone_proto import workers_pb2 as pb

from cyclone_server import tracing
from cyclone_server.errors import CycloneError, Unavailable
from cyclone_server.records import Result
from cyclone_server.store.engine import Engine

from .conn import WorkerConn
from .wire import ACK_OF_STATUS, DETAIL_OF_STATUS, invalid_result

log = logging.getLogger(__name__)
# How a committer waits between attempts while the database is unavailable (0.1 s doubling to 2 s).
UNTIL_BACK = wait_exponential(multiplier=0.1, min=0.1, max=2.0)


class ResultCommitter:
    """Group commit: results from all streams, applied with one Engine.apply_results per batch.

    Up to `parallel` batches are applied at once, each in its own transaction. While every
    slot is busy, new results queue up and go together in the next batch, so a result that
    comes alone is applied at once and the batches grow with the load. One at a time is the
    default: with two, a batch's commit overlapped the next one's work, but the batches
    were half as big, and on a loaded machine the statements and stream messages per
    result cost more than the overlap saved (docs/benchmarks.md).
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
            except Unavailable as e:
                # The database is unreachable (or the batch lost a deadlock): apply again, for
                # as long as it takes. That is safe: results are fenced, so one that did commit
                # before the error comes back 'ended', and is then told apart (in_doubt).
                log.warning("applying %d results failed: %s; retrying", len(results), e.__cause__ or e)
                async for attempt in AsyncRetrying(
                        retry=retry_if_exception_type(Unavailable),
                        wait=UNTIL_BACK,
                        before_sleep=lambda s: log.warning(
                            "applying %d results failed: %s; retrying in %.1fs", len(results),
                            s.outcome.exception().__cause__, s.next_action.sleep)):  # type: ignore[union-attr]
                    with attempt:
                        rows = await self.engine.apply_results(results)
                return await self._in_doubt([(r, status) for r, (_, _, status) in zip(results, rows)])
            return [(r, status) for r, (_, _, status) in zip(results, rows)]
        except CycloneError as e:
            # The database refused the data: find the results it refuses by applying
            # them alone, and fail those attempts instead (the worker takes the INVALID
            # ack as the end of its lease).
            if len(results) > 1:
                out: list[tuple[Result, str]] = []
                for r in results:
                    out += await self._apply([r])
                return out
            r = results[0]
            why = e.message
            if r.invalid is not None:  # even the failure was refused: a bug, not the worker's data
                raise
            return await self._apply([invalid_result(r.step_id, r.generation,
                                                      f"the database refused it: {why or e}")])

    async def _in_doubt(self, applied: list[tuple[Result, str]]) -> list[tuple[Result, str]]:
        """Results applied again after a commit whose fate was unknown: one that finds its lease
        ended may be the one that ended it. Its status is then what it did (APPLIED to the
        worker, counted once); only a result that truly changed nothing stays ENDED. Only the
        first answer to a lease in the batch can be it: a later one stays ENDED."""
        first: dict[tuple[str, int], int] = {}
        for i, (r, _) in enumerate(applied):
            first.setdefault((r.step_id, r.generation), i)
        ended = [i for i, (r, status) in enumerate(applied)
                 if status == "ended" and first[(r.step_id, r.generation)] == i]
        if not ended:
            return applied
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(Unavailable), wait=UNTIL_BACK):
            with attempt:
                held = await self.engine.in_doubt_statuses([applied[i][0] for i in ended])
        out = list(applied)
        for i, status in zip(ended, held):
            if status is not None:
                out[i] = (applied[i][0], status)
        if any(held):
            log.info("%d of %d results whose commit was in doubt had committed", sum(map(bool, held)), len(ended))
        return out

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
        for conn, msg in acks.items():
            conn.send(msg)
            conn.unacked -= len(msg.acks.acks)
            if conn.draining and conn.unacked == 0:
                conn.end()
            if conn.quiet:  # a hand-back's ack: a pass at the quiet's end (WorkerConn.forget)
                conn.call_at_quiet_end(self.on_applied)
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


__all__ = ["ResultCommitter"]
