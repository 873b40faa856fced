"""Group commit for Enqueue: concurrent calls share one EnqueueMany transaction.

Each Enqueue call alone costs a transaction and a durable commit. Under load, the calls
that arrive while a batch is being written wait for the next one, and go in it together
(no timer: a lone call is written at once). A call still returns only once its own job has
committed. When the database refuses a batch (one job's idempotency key belongs to a
different request, say), each of its jobs is written again alone, so every call gets the
answer it would have had alone.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from .engine import ENQUEUE_MANY_MAX, Engine, Job


class EnqueueBatcher:
    """Engine.enqueue_job for many concurrent callers, `parallel` transactions at a time."""

    def __init__(self, engine: Engine, *, parallel: int = 2, max_batch: int = ENQUEUE_MANY_MAX) -> None:
        self.engine = engine
        self.parallel = parallel
        self.max_batch = max_batch
        self._waiting: collections.deque[tuple[Job, asyncio.Future[tuple[str, str, bool]]]] = collections.deque()
        self._writers: set[asyncio.Task[None]] = set()

    async def enqueue(self, job: Job) -> tuple[str, str, bool]:
        """(run_id, step_id, created) once the job's transaction committed; errors as Engine.enqueue_job.

        The job is validated first, so that bad input is refused without joining a batch.
        """
        self.engine.check_job(job)
        done: asyncio.Future[tuple[str, str, bool]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)  # no "exception never retrieved" when the caller left
        self._waiting.append((job, done))
        if len(self._writers) < self.parallel:
            writer = asyncio.create_task(self._write(), name="cyclone-enqueue-batch")
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        # A caller that goes away (its RPC cancelled) leaves its job to the batch: as with a
        # single transaction cut off mid-commit, its outcome is unknown to it.
        return await asyncio.shield(done)

    async def close(self) -> None:
        """Wait for the batches in progress (their callers are waiting for them)."""
        await asyncio.gather(*self._writers, return_exceptions=True)

    async def _write(self) -> None:
        while self._waiting:
            batch = [self._waiting.popleft() for _ in range(min(len(self._waiting), self.max_batch))]
            try:
                rows = await self.engine.enqueue_many([job for job, _ in batch])
            except Exception:
                # The transaction rolled back: nothing of the batch was written.
                await self._write_alone(batch)
                continue
            for (_, done), row in zip(batch, rows):
                _settle(done, row)

    async def _write_alone(self, batch: list[tuple[Job, asyncio.Future[tuple[str, str, bool]]]]) -> None:
        for job, done in batch:
            try:
                row = await self.engine.enqueue_job(job)
            except Exception as e:
                _settle(done, error=e)
            else:
                _settle(done, row)


def _retrieve(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


def _settle(done: asyncio.Future[Any], result: Any = None, *, error: BaseException | None = None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
