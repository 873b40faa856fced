"""Group commit for Enqueue: concurrent calls share one EnqueueMany transaction.

Each Enqueue call alone costs a transaction and a durable commit. Under load, the calls
that arrive while a batch is being written wait for the next one, and go in it together.
A lone call is written at once. Under a stream of calls (the next batch already holds
several), the writer waits a little for more to join it: while each half millisecond
brings more, for about 2 ms at most (GATHER_*). A call returns only once its own job has
committed.

When the database refuses one job of a batch (its idempotency key belongs to a different
request, say), the transaction rolls back and names the job's index: the jobs before it go
again together, the refused one is written alone, so that its caller gets the answer it
would have had alone, and the rest go again together. When the database cannot be reached,
every caller of the batch gets that error: the batch may have committed before the
connection broke, and writing it again would duplicate jobs without idempotency keys.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any


from cyclone_server.records import ENQUEUE_MANY_MAX, Job, PreparedJob

from cyclone_server.store.engine import Engine
from cyclone_server.errors import CycloneError, Unavailable
from cyclone_worker._loop import loop_name

log = logging.getLogger("cyclone.batching")

BATCH_INPUT_BYTES = 16 << 20  # inputs per batch (compact JSON), so one batch's parameter stays moderate
# Gathering a batch under a stream of calls (EnqueueBatcher._gather). With 64 calls in
# flight, batches grew from 5 to 6 jobs to 10 to 12, and Postgres's CPU per job fell by
# 11 to 19%; a closed loop of 8 callers lost about 6% of its rate to the wait
# (docs/benchmarks.md).
GATHER_MIN = 2  # calls already waiting: fewer is no stream, and is written at once
GATHER_ENOUGH = 32  # calls waiting: written at once
# Seconds; the writer waits on while each slice brings more calls. asyncio's loop rounds a
# timer up to its next millisecond when nothing else wakes it, so a slice takes 0.5 to 1 ms.
GATHER_SLICE = 0.0005
# The same slice on uvloop, whose timers count whole milliseconds and drop the rest (0.5 ms
# would end after one turn of the loop, and a batch with it): 1 ms there ends 0 to 1 ms
# later, as libuv's clock is the loop turn's start; both take about 1.1 ms on an idle loop.
GATHER_SLICE_UVLOOP = 0.001
# Seconds: no slice starts after this, and the last one ends by it (give or take that rounding).
GATHER_MAX = 0.002
_sleep = asyncio.sleep  # the wait of one slice (a test paces it)
_JOB_INDEX = re.compile(r"^jobs\[(\d+)\]: ")

Waiter = tuple[PreparedJob, "asyncio.Future[tuple[str, str, bool]]"]
# Writes a batch and claims for a worker that waits for its jobs, in one transaction; the
# jobs' rows as Engine.enqueue_prepared returns them, or None when no worker waits.
Claim = Callable[[list[PreparedJob]], Awaitable["list[tuple[str, str, bool]] | None"]]


class EnqueueBatcher:
    """Engine.enqueue_job for many concurrent callers, `parallel` transactions at a time.

    Calls that arrive while a batch is written go together in the next one; a call that
    comes alone is written at once. One transaction at a time is the default, as for the
    results (ResultCommitter): batches twice as big cost less per job than overlapping
    two commits did on a loaded machine."""

    def __init__(self, engine: Engine, *, parallel: int = 1, max_batch: int = ENQUEUE_MANY_MAX,
                 max_batch_bytes: int = BATCH_INPUT_BYTES, claim: Claim | None = None) -> None:
        self.engine = engine
        self.claim = claim  # the server's Dispatcher.enqueue
        self.parallel = parallel
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self._waiting: collections.deque[Waiter] = collections.deque()
        self._writers = 0  # counted by the writers themselves, so none can end unnoticed
        self._tasks: set[asyncio.Task[None]] = set()

    async def enqueue(self, job: Job) -> tuple[str, str, bool]:
        """(run_id, step_id, created) once the job's transaction committed; errors as Engine.enqueue_job.

        The job is checked first, so that bad input is refused without joining a batch.
        """
        entry: Waiter = (self.engine.prepare_job(job), asyncio.get_running_loop().create_future())
        entry[1].add_done_callback(_retrieve)
        self._waiting.append(entry)
        if self._writers < self.parallel:
            self._writers += 1
            task = asyncio.create_task(self._write(), name="cyclone-enqueue-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(entry[1])
        except asyncio.CancelledError:
            # The caller went away. A job not yet taken into a batch is dropped; one in a
            # batch being written has an outcome its caller cannot learn, as with a single
            # transaction cut off mid-commit.
            try:
                self._waiting.remove(entry)
            except ValueError:
                pass
            raise

    async def close(self) -> None:
        """Wait for the batches in progress (their callers are waiting for them). A close
        that is cancelled leaves them running: a writer stopped between two batches would
        leave the calls queued behind it with no writer."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _write(self) -> None:
        # Only the call that found no batch in progress may be written with a claim: one
        # that waited for a batch came in a stream of calls, and the dispatcher's claims
        # after each batch serve those in bulk (_write_jobs).
        first = True
        try:
            while self._waiting:
                if not first:
                    await self._gather()
                    if not self._waiting:  # every caller went away meanwhile
                        break
                await self._write_batch(self._next_batch(), may_claim=first)
                first = False
        finally:
            # No await between the last look at _waiting and this: a call that queues a
            # job after it sees the writer gone and starts another.
            self._writers -= 1

    async def _gather(self) -> None:
        """Before a batch that follows another: when several calls already wait for it (a
        stream of calls), wait while each GATHER_SLICE brings more, until GATHER_ENOUGH
        wait or GATHER_MAX has passed. Each batch costs a transaction, a durable commit and
        a statement's fixed cost, in Postgres and here; a few calls that came together and
        find no more behind them are written after one slice."""
        seen = len(self._waiting)
        enough = min(GATHER_ENOUGH, self.max_batch)
        if not GATHER_MIN <= seen < enough:
            return
        loop = asyncio.get_running_loop()
        slice_ = GATHER_SLICE_UVLOOP if loop_name(loop) == "uvloop" else GATHER_SLICE
        deadline = loop.time() + GATHER_MAX
        while (left := deadline - loop.time()) > 0:
            await _sleep(min(slice_, left))
            now = len(self._waiting)
            if now <= seen or now >= enough:
                return
            seen = now

    def _next_batch(self) -> list[Waiter]:
        batch = [self._waiting.popleft()]
        size = batch[0][0].input_bytes
        while self._waiting and len(batch) < self.max_batch:
            size += self._waiting[0][0].input_bytes
            if size > self.max_batch_bytes:
                break
            batch.append(self._waiting.popleft())
        return batch

    async def _write_batch(self, batch: list[Waiter], *, may_claim: bool = False) -> None:
        while batch:
            try:
                rows = await self._write_jobs([job for job, _ in batch], may_claim=may_claim)
            except CycloneError as e:
                if isinstance(e, Unavailable):  # unreachable, or the commit's fate unknown
                    _fail(batch, e)
                    return
                refused = _refused_index(e, len(batch))
                if refused is None:
                    for entry in batch:
                        await self._write_alone(entry)
                    return
                await self._write_batch(batch[:refused])
                await self._write_alone(batch[refused])
                batch = batch[refused + 1:]
                continue
            except Exception as e:  # a bug: the callers get INTERNAL, the log the traceback
                log.exception("writing %d jobs failed", len(batch))
                _fail(batch, e)
                return
            for (_, done), row in zip(batch, rows):
                _settle(done, row)
            return

    async def _write_jobs(self, jobs: list[PreparedJob], *, may_claim: bool = False) -> list[tuple[str, str, bool]]:
        """The batch in one transaction: with a claim for a waiting worker when the call came
        alone (one job, no other batch written or waiting, and none in progress when it
        came: `may_claim`). A claim of a step or two costs Postgres several times per step
        what the dispatcher's claim of many does, and so do the Leases, Results and acks
        messages of one lease. Under load the calls come in batches anyway, which the
        dispatcher serves in bulk; a call that had to wait for the batch before it is part
        of such a stream, even when it came alone in the next batch (docs/benchmarks.md)."""
        if (may_claim and self.claim is not None and len(jobs) == 1 and not self._waiting
                and self._writers == 1):
            try:
                rows = await self.claim(jobs)
            except CycloneError as e:
                if isinstance(e, Unavailable):  # as below: the commit's fate is unknown
                    raise
                rows = None  # rolled back: written again without the claim, which names a refused job
            if rows is not None:
                return rows
        return await self.engine.enqueue_prepared(jobs)

    async def _write_alone(self, entry: Waiter) -> None:
        job, done = entry
        try:
            row = await self.engine.enqueue_prepared_one(job)
        except Exception as e:
            _settle(done, error=e)
        else:
            _settle(done, row)


def _refused_index(error: CycloneError, size: int) -> int | None:
    """The index of the job the database refused, from its "jobs[i]: " message."""
    m = _JOB_INDEX.match(error.message)
    if m is None or int(m.group(1)) >= size:
        return None
    return int(m.group(1))


def _fail(batch: list[Waiter], error: BaseException) -> None:
    for _, done in batch:
        _settle(done, error=error)


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Read every outcome, so that a failure whose caller went away is logged rather than
    reported by asyncio as never retrieved."""
    if not done.cancelled() and done.exception() is not None:
        log.debug("enqueue failed: %s", done.exception())


def _settle(done: asyncio.Future[Any], result: Any = None, *, error: BaseException | None = None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
