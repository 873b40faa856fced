"""Connections kept out of the pool between the Engine's statements and transactions.

Taking a connection from psycopg_pool and giving it back, and making a cursor on it, cost
the server about 35 µs of CPU per statement, on top of the 45 to 50 µs that psycopg
spends on a trivial statement itself (docs/benchmarks.md). Under load the
server runs its statements one after another (a batch of jobs, a claim, a batch of
results), so a connection that has just served one is kept, with its cursors, for the
next: a free list in front of the pool.

A kept connection goes back to the pool when it has been unused for `idle` seconds (they
are looked at every `idle` seconds, so up to twice that), when it was taken from the pool
more than `hold` seconds ago (so the pool's own checks and max_lifetime still apply to
it), after any error (the pool replaces a connection that broke, as it would have), and,
with every other kept one, whenever somebody waits for a connection of the pool. At most
`size` are kept. A cursor is not kept after a statement with large text parameters or many
rows, which it would hold until its next statement. The pool's connections must be in
autocommit: between two uses one holds no transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

WARM_SIZE = 4  # connections kept at most
WARM_IDLE = 1.0  # seconds unused before a kept connection goes back to the pool
WARM_HOLD = 30.0  # seconds out of the pool, at most, before it goes back at its next use
# A cursor keeps its last statement's parameters and rows until its next statement: one
# whose text parameters or rows were larger than this is not kept for the next.
CURSOR_KEEP_CHARS = 64 * 1024
CURSOR_KEEP_ROWS = 1000
log = logging.getLogger("cyclone.engine")


class _Warm:
    __slots__ = ("conn", "cursors", "taken", "parked")

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.cursors: dict[Any, psycopg.AsyncCursor[Any]] = {}  # by row factory
        self.taken = time.monotonic()
        self.parked = self.taken


class WarmConnections:
    """Single statements on connections of `pool`, kept between statements.

    Example::

        warm = WarmConnections(pool)
        rows = await warm.fetch("SELECT %(x)s AS x", {"x": 1}, dict_row)
        await warm.close()  # before pool.close()
    """

    def __init__(self, pool: AsyncConnectionPool, *, size: int = WARM_SIZE, idle: float = WARM_IDLE,
                 hold: float = WARM_HOLD) -> None:
        if not (pool.kwargs or {}).get("autocommit"):
            # Kept between uses, a connection must hold no transaction (and the pool's
            # connection() committed on the way out; these blocks don't).
            raise ValueError("WarmConnections needs a pool of autocommit connections")
        self.pool = pool
        self.size = size
        self.idle = idle
        self.hold = hold
        self._free: list[_Warm] = []  # the last one parked at the end: taken first
        self._cooling: asyncio.TimerHandle | None = None
        self._returning: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def kept(self) -> int:
        """How many connections are kept now, unused."""
        return len(self._free)

    async def _take(self) -> _Warm:
        """The connection kept last, else one of the pool's."""
        return self._free.pop() if self._free else _Warm(await self.pool.getconn())

    async def fetch(self, query: str, params: Mapping[str, Any], row_factory: Any) -> list[Any]:
        """The rows of one statement (none for a statement that returns no rows)."""
        warm = await self._take()
        try:
            cur = warm.cursors.get(row_factory)
            if cur is None:
                cur = warm.cursors[row_factory] = warm.conn.cursor(row_factory=row_factory)
            await cur.execute(query, params)
            rows = await cur.fetchall() if cur.description else []
            if len(rows) > CURSOR_KEEP_ROWS or sum(len(v) for v in params.values()
                                                   if isinstance(v, str)) > CURSOR_KEEP_CHARS:
                del warm.cursors[row_factory]  # its parameters and rows go with it
                await cur.close()
        except BaseException:
            # Back to the pool, which rolls back, or replaces a connection that broke or
            # was left mid-statement by a cancellation.
            await self.pool.putconn(warm.conn)
            raise
        await self._park(warm)
        return rows

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for several statements (a transaction, a pipeline), kept afterwards
        like fetch's; given back to the pool if the block raised."""
        warm = await self._take()
        try:
            yield warm.conn
        except BaseException:
            await self.pool.putconn(warm.conn)
            raise
        await self._park(warm)

    async def _park(self, warm: _Warm) -> None:
        """Keep a connection that served a statement, or give it back: when closing, when
        enough are kept, when it has been out of the pool `hold` seconds, when it is not
        idle, and when somebody waits for one of the pool's. Then the kept ones go back
        too: a connection kept would sit unused while they wait."""
        if self.pool.get_stats().get("requests_waiting", 0):
            kept, self._free = self._free, []
            await self._give_back([warm, *kept])
            return
        now = time.monotonic()
        if (self._closed or len(self._free) >= self.size or now - warm.taken > self.hold
                or warm.conn.pgconn.transaction_status != TransactionStatus.IDLE
                or warm.conn.pgconn.pipeline_status != PipelineStatus.OFF):
            await self.pool.putconn(warm.conn)
            return
        warm.parked = now
        self._free.append(warm)
        if self._cooling is None:
            self._cooling = asyncio.get_running_loop().call_later(self.idle, self._cool)

    def _cool(self) -> None:
        """Give back the connections unused for `idle` seconds; look again later if some are left."""
        self._cooling = None
        now = time.monotonic()
        stale = [w for w in self._free if now - w.parked >= self.idle]
        if stale:
            self._free = [w for w in self._free if now - w.parked < self.idle]
            task = asyncio.get_running_loop().create_task(self._give_back(stale))
            self._returning.add(task)
            task.add_done_callback(self._returning.discard)
        if self._free:
            self._cooling = asyncio.get_running_loop().call_later(self.idle, self._cool)

    async def _give_back(self, kept: list[_Warm]) -> None:
        """Give `kept` back to the pool: each one, whatever happened to the one before, and
        all of them even if the caller is cancelled meanwhile."""
        await asyncio.shield(self._give_back_each(kept))

    async def _give_back_each(self, kept: list[_Warm]) -> None:
        for warm in kept:
            try:
                await self.pool.putconn(warm.conn)
            except Exception as e:
                log.warning("giving a connection back to the pool failed: %s", e)

    async def close(self) -> None:
        """Give every kept connection back to the pool; later statements give theirs back at once."""
        self._closed = True
        if self._cooling is not None:
            self._cooling.cancel()
            self._cooling = None
        kept, self._free = self._free, []
        await self._give_back(kept)
        await asyncio.gather(*self._returning, return_exceptions=True)
