"""What a handler sees of its step: the lease's fields, cancellation, and `completion_tx`."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ._errors import Fenced, Permanent
from ._logging import StepLogger
from cyclone_proto import workers_pb2
from .values import from_struct, from_timestamp, from_value

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

__all__ = ["Context", "CancelFlag", "CompletionTx"]


class CancelFlag:
    """Set when the step's handler must stop; awaitable like asyncio.Event, readable from any thread.

    Example::

        done, _ = await asyncio.wait([work, asyncio.create_task(ctx.cancelled.wait())],
                                     return_when=asyncio.FIRST_COMPLETED)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        # Made on first wait only: most handlers never wait, and a worker makes one flag
        # per lease (making an Event and a threading.Event was 7% of a worker's py-spy samples
        # in a drain).
        # _LAZY orders their making against set(), which may come from another thread.
        self._event: asyncio.Event | None = None
        self._flag: threading.Event | None = None
        self.reason = ""

    def is_set(self) -> bool:
        """True once the handler has been told to stop."""
        return self._set

    async def wait(self) -> bool:
        """Block (in the worker's event loop) until the flag is set."""
        if self._event is None:
            with _LAZY:
                if self._event is None:
                    event = asyncio.Event()
                    if self._set:  # set() came first; this runs in the loop, so set it here
                        event.set()
                    self._event = event
        await self._event.wait()
        return True

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """Block a thread (plain-function handlers) until set or `timeout`; True if set."""
        if self._flag is None:
            with _LAZY:
                if self._flag is None:
                    flag = threading.Event()
                    if self._set:
                        flag.set()
                    self._flag = flag
        return self._flag.wait(timeout)

    def set(self, reason: str = "") -> None:
        """Set the flag (the worker does this on Stop); safe to call from any thread."""
        with _LAZY:
            if self._set:
                return
            self.reason = reason
            self._set = True
            event, flag = self._event, self._flag
        if flag is not None:
            flag.set()
        if event is not None:
            set_event(self._loop, event)


# CancelFlag: orders set() against the first wait that makes its events. Re-entrant: a
# signal handler may call set() while its thread makes them.
_LAZY = threading.RLock()


def set_event(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set an asyncio.Event of `loop` from any thread (an Event is not thread-safe)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        event.set()
    else:
        loop.call_soon_threadsafe(event.set)


@dataclass
class CompletionTx:
    """The handler's own Postgres transaction that also completes its step (see `Context.completion_tx`).

    Example::

        async with ctx.completion_tx() as tx:
            await tx.conn.execute("INSERT INTO invoices (id) VALUES (%s)", [ctx.input["id"]])
            tx.complete({"invoice": ctx.input["id"]})
    """

    conn: psycopg.AsyncConnection[Any]
    output: Any = None
    completed: bool = field(default=False)

    def complete(self, output: Any = None) -> None:
        """Complete the step with `output` when the block ends, in this transaction."""
        self.output = output
        self.completed = True


class Context:
    """Everything a handler gets: its lease (`run_id`, `step_id`, `node`, `kind`, `attempt`,
    `lease_generation`, `attempt_deadline`), the run `input`, the `parents`' outputs by node
    id, and `cancelled` / `is_cancelled()` to learn it must stop.

    Example::

        @worker.handler("total")
        async def total(ctx: Context) -> dict:
            items = ctx.parents["fetch"]["items"]
            return {"run": ctx.run_id, "total": sum(i["price"] for i in items)}
    """

    def __init__(self, lease: workers_pb2.Lease, *, loop: asyncio.AbstractEventLoop, worker_id: str,
                 pool: AsyncConnectionPool[Any] | None = None) -> None:
        self.run_id: str = lease.run_id
        self.step_id: str = lease.step_id
        self.node: str = lease.node
        self.kind: str = lease.kind
        self.attempt: int = lease.attempt
        self.max_attempts: int = lease.max_attempts
        self.reclaims: int = lease.reclaims
        self.snoozes: int = lease.snoozes
        self.lease_generation: int = lease.lease_generation
        self._lease = lease  # input, parents and attempt_deadline are converted on first use
        self.worker_id = worker_id
        #: The W3C trace context the step runs under (Lease.trace_context; "" when none). With
        #: the `otel` extra the handler's span is current already; these are for logs.
        self.traceparent: str = lease.trace_context.traceparent
        self.tracestate: str = lease.trace_context.tracestate
        self.cancelled = CancelFlag(loop)
        self._pool = pool
        # Set once completion_tx committed: the step is already completed in the database.
        self.completed_in_tx = False

    @functools.cached_property
    def input(self) -> Any:
        """The run's input (JSON: dict, list, str, number, bool or None), converted on first use."""
        lease = self._lease
        return from_value(lease.input) if lease.HasField("input") else None

    @functools.cached_property
    def parents(self) -> dict[str, Any]:
        """The outputs of the node's dependencies, by node id ({} for none), converted on first use."""
        return from_struct(self._lease.parents)

    @functools.cached_property
    def attempt_deadline(self) -> datetime | None:
        """When this attempt times out (None: the node has no attempt timeout)."""
        lease = self._lease
        return from_timestamp(lease.attempt_deadline) if lease.HasField("attempt_deadline") else None

    @property
    def log(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """A logger (`cyclone_worker.handler`) whose records carry this step's run_id,
        step_id, node, kind and attempt, and start with them (see StepLogFilter).

        Example::

            ctx.log.warning("upstream slow, retrying")
        """
        return StepLogger(logging.getLogger("cyclone_worker.handler"), self)

    @property
    def last_attempt(self) -> bool:
        """True when a failure of this attempt discards the step (attempt == max_attempts)."""
        return self.attempt >= self.max_attempts

    def is_cancelled(self) -> bool:
        """True once the step was cancelled, fenced or timed out; poll it from any thread.

        Example::

            for chunk in chunks:
                if ctx.is_cancelled():
                    return None
                process(chunk)
        """
        return self.cancelled.is_set()

    @asynccontextmanager
    async def completion_tx(self) -> AsyncIterator[CompletionTx]:
        """A transaction on the worker's `database_url` that completes this step together with
        the handler's own writes: call ``tx.complete(output)`` inside the block.

        At the end of the block, ``SELECT cyclone_step_complete(step_id, generation, output)``
        runs in the same transaction. If it applied, everything commits. Otherwise (the lease
        was fenced: cancelled, reclaimed, already ended) everything rolls back and `Fenced` is
        raised. An exception in the block rolls back too. Leaving the block without
        ``tx.complete`` is an error (rolled back): the point is that both commit together.

        Example::

            async with ctx.completion_tx() as tx:
                await tx.conn.execute("UPDATE accounts SET paid = true WHERE id = %s", [ctx.input["id"]])
                tx.complete({"paid": ctx.input["id"]})
        """
        if self._pool is None:
            raise RuntimeError("completion_tx needs a worker created with database_url=...")
        from psycopg.types.json import Jsonb

        async with self._pool.connection() as conn:
            async with conn.transaction():
                tx = CompletionTx(conn)
                yield tx
                if not tx.completed:
                    raise RuntimeError("completion_tx: the block ended without tx.complete(output); rolled back")
                cur = await conn.execute("SELECT cyclone_step_complete(%s, %s, %s)",
                                         [self.step_id, self.lease_generation, Jsonb(tx.output)])
                row = await cur.fetchone()
                status = row[0] if row else "unknown"
                if status == "output_too_large":
                    # The function discarded the step inside this transaction; rolling back
                    # undoes that too, so fail the step the same way from the handler.
                    raise Permanent("output_too_large: the output is over the server's size limit")
                if status != "applied":
                    raise Fenced(status, self.step_id, self.lease_generation)
        self.completed_in_tx = True
