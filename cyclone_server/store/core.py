"""The store's core: the connection pool, named statements, snapshots, and announcing new work.

The rules themselves live in the SQL functions (sql/functions); the store converts
arguments and results, checks input that the database should never see, and raises
Cyclone's own errors (faults.py). It is the only package of the server that talks to
Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from cyclone_server.records import DEFAULT_MAX_PAYLOAD_BYTES, PreparedJob

from .failover import POOL_TIMEOUT, install_capped_backoff, with_failover_defaults
from .faults import translated
from .queries import Q
from .warm import WarmConnections

ANNOUNCE_WINDOW = 0.005  # seconds: an engine's NOTIFY cyclone_available waits this long for more new work
# seconds: and comes this long after the engine's previous one at the earliest, so that a
# stream of new work is announced once per gap (the other servers' dispatchers pace their
# claims under a stream anyway: Dispatcher._pace)
ANNOUNCE_GAP = 0.020
# The statements after which steps may have become claimable (when they returned rows).
# results_apply says so per result (Engine.apply_results).
MAY_MAKE_AVAILABLE = frozenset({
    "run_submit", "job_enqueue", "jobs_enqueue", "step_complete", "step_fail", "step_snooze",
    "leases_sweep", "leases_release", "attempts_timeout", "timers_fire", "waits_expire", "children_start",
    "children_settle", "child_runs_settle", "run_resume", "run_retry", "run_signal", "limit_set", "limit_delete"})
# The queries that write the jobs of Enqueue and EnqueueMany: the new work a stream of
# calls brings, which the dispatcher paces its claims for (announce(jobs_only=True)).
JOBS_WRITTEN = frozenset({"job_enqueue", "jobs_enqueue"})
log = logging.getLogger("cyclone.engine")




Issue = Callable[..., Awaitable[psycopg.AsyncCursor[dict[str, Any]]]]


def issuer(conn: psycopg.AsyncConnection[Any]) -> Issue:
    """Sends a named query on `conn` and returns its cursor; in a pipeline the rows are
    waited for only when read."""
    async def issue(query: str, /, **params: Any) -> psycopg.AsyncCursor[dict[str, Any]]:
        return await conn.cursor().execute(Q[query], params)
    return issue


async def run_with_steps(issue: Issue, rid: uuid.UUID) -> dict[str, Any] | None:
    """The run `rid` with its steps (None: no such run); both queries are sent before either
    is read, so in a pipeline they share one round trip."""
    run, steps = await issue("run_get", run_id=rid), await issue("runs_steps", run_ids=[rid])
    row = await run.fetchone()
    if row is not None:
        row["steps"] = await steps.fetchall()
    return row



def seconds(td: float | timedelta | None) -> timedelta | None:
    """A duration in seconds (or a timedelta already) as a timedelta for Postgres."""
    if td is None:
        return None
    return td if isinstance(td, timedelta) else timedelta(seconds=td)


def jobs_payload(jobs: Sequence[PreparedJob]) -> str:
    """cyclone_jobs_enqueue's p_jobs for prepared jobs, as JSON text."""
    return "[" + ",".join(j.item for j in jobs) + "]"


class Core:
    """A connection pool and what every part of the store does with it."""

    def __init__(self, pool: AsyncConnectionPool, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 announces: bool = False) -> None:
        self.pool = pool
        # Statements and transactions run on connections kept between them (warm.py).
        self.warm = WarmConnections(pool)
        self.max_payload_bytes = max_payload_bytes
        # Called after every transition that may have made steps claimable (e.g. the
        # server's dispatcher wake-up).
        self.available_listeners: list[Callable[[], None]] = []
        # Called before those, unless only new jobs were written: the server's dispatcher
        # then claims without waiting out a pace (Dispatcher.unpace).
        self.prompt_listeners: list[Callable[[], None]] = []
        # With `announces`, the pool's sessions don't NOTIFY cyclone_available in their
        # transactions (see cyclone__notify_available); this engine sends one NOTIFY per
        # ANNOUNCE_WINDOW instead, at most one per ANNOUNCE_GAP, on the side, for the other
        # servers.
        self.announces = announces
        # The payload of this engine's own announcements (never empty, as the SQL functions'
        # payload is). The server's dispatcher skips them (WorkerHub.start): announce() has
        # woken it already, and each echo would cost it a pass that finds nothing new.
        self.announce_token = uuid.uuid4().hex
        # Called when a schedule was made, changed or resumed (the server's scheduler wake-up).
        self.schedule_listeners: list[Callable[[], None]] = []
        self._announcing: asyncio.Task[None] | None = None
        self._announced = float("-inf")  # the loop's time of the last announcement sent
        self._announcements: set[asyncio.Task[None]] = set()  # waiting or sending
        # Days of history whose read found a run that must stay: the monotonic time until
        # which the retention sweep does not read them again (Runs.drop_history_day).
        self._history_kept: dict[Any, float] = {}

    @classmethod
    async def open(cls, url: str, *, min_size: int = 2, max_size: int = 10, announces: bool = False,
                   **kw: Any) -> Any:
        """A pool of `min_size`..`max_size` connections. `announces=True` is for a server:
        new work is announced by `announce()`, coalesced, rather than by each transaction."""
        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            if announces:
                await conn.execute("SET cyclone.announce = 'server'")

        install_capped_backoff()
        pool = AsyncConnectionPool(with_failover_defaults(url), min_size=min_size, max_size=max_size, open=False,
                                   configure=configure, timeout=POOL_TIMEOUT,
                                   kwargs={"autocommit": True, "row_factory": dict_row})
        with translated():
            await pool.open(wait=True, timeout=30)
        return cls(pool, announces=announces, **kw)

    def announce(self, *, jobs_only: bool = False) -> None:
        """Steps may have become claimable: tell the listeners now, other servers soon.
        `jobs_only`: the new work is only jobs that Enqueue or EnqueueMany wrote."""
        if not jobs_only:
            for listener in self.prompt_listeners:
                listener()
        for listener in self.available_listeners:
            listener()
        if self.announces and self._announcing is None:
            task = self._announcing = asyncio.get_running_loop().create_task(self._notify_others())
            self._announcements.add(task)  # until sent: close() waits for it
            task.add_done_callback(self._announcements.discard)

    async def _notify_others(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # What else becomes claimable meanwhile rides along.
            await asyncio.sleep(max(ANNOUNCE_WINDOW, self._announced + ANNOUNCE_GAP - loop.time()))
        finally:
            # From here on, new work needs a new announcement (the next window's task).
            self._announcing = None
        self._announced = loop.time()
        try:
            async with self.warm.connection() as conn:
                await conn.execute("SELECT pg_notify('cyclone_available', %s)", (self.announce_token,))
        except Exception as e:  # the other servers' dispatch timers still find the work
            log.warning("announcing new work failed: %s", e)

    async def close(self) -> None:
        if self._announcing is not None:  # still waiting: nothing to send it for any more
            self._announcing.cancel()
        await asyncio.gather(*self._announcements, return_exceptions=True)  # one being sent ends first
        await self.warm.close()
        await self.pool.close()

    async def _all(self, query: str, /, **params: Any) -> list[dict[str, Any]]:
        return await self._fetch(query, params, dict_row)

    async def _fetch(self, query: str, params: Mapping[str, Any], row_factory: Any) -> list[Any]:
        """The rows of the named query, made by `row_factory`; a database error that means
        bad input becomes its CycloneError; new work is announced after the statements that
        may have made some."""
        with translated():
            rows = await self.warm.fetch(Q[query], params, row_factory)
        if rows and query in MAY_MAKE_AVAILABLE:
            self.announce(jobs_only=query in JOBS_WRITTEN)
        return rows

    async def ping(self) -> None:
        """One round trip to the database; Unavailable when it cannot be reached."""
        await self._all("ping")

    async def _one(self, query: str, /, **params: Any) -> dict[str, Any] | None:
        rows = await self._all(query, **params)
        return rows[0] if rows else None

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Issue]:
        """Named queries that all see the database at one moment. Pipelined: a query is sent
        when issued, and its cursor waits for its rows only when read, so the queries that
        need no earlier answer share one round trip."""
        with translated():
            async with self.warm.connection() as conn, conn.pipeline(), conn.transaction():
                await conn.execute(Q["read_snapshot"])
                yield issuer(conn)

