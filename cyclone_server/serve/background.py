"""Periodic work of one server: the recovery sweep, the wait scanners, child settling and retention."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable

from cyclone_server.errors import Unavailable
from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier
from cyclone_server.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RETENTION_BATCH = 1000
RETENTION_MAX_BATCHES = 20  # per pass, so one pass never holds the database for long
# Child settling runs at most this often: every call that ends a child run settles its
# parent node itself, so this pass is the backstop (for a server that died in between), and
# while runs end by the thousand it must not scan once per commit.
SETTLE_MIN_INTERVAL = 0.05
# Flow control's rows of idle keys are tidied this often (Engine.tidy_limits), in batches.
LIMITS_TIDY_INTERVAL = 60.0
# The coming days of history are made this often (migrate makes them at start too): two
# days ahead, so inserts find their day even after a long pause.
HISTORY_ENSURE_INTERVAL = 600.0
# At most this many days of history dropped per retention pass (each one lock of the tables).
HISTORY_MAX_DROPS = 4
# Claims, results and submissions cost more with every partition of history, and their locks
# fill Postgres's lock table (docs/operations.md, "What the days cost"): past this many
# partitions a table, the server says so at start and then once a day (HISTORY_WARN_INTERVAL).
HISTORY_DAYS_WARN = 60
HISTORY_WARN_INTERVAL = 86_400.0
LIMITS_TIDY_BATCH = 1000


class Background:
    """Periodic work of one server.

    - every `sweep_interval`: the recovery sweep and the wait scanners (Engine.sweep);
    - on 'cyclone_run_ended' notifications too, when a child run may have ended (at most
      once per SETTLE_MIN_INTERVAL):
      child-node settling, so a parent node ends right after its child run instead of at
      the next sweep, even when the call that ended the child could not settle it;
    - every `retention_interval`, when given: the retention sweep, Engine.purge of terminal
      runs older than `retention_default_age` (per-step retention honoured) in bounded batches;
    - every LIMITS_TIDY_INTERVAL: flow control's rows of idle keys removed (Engine.tidy_limits);
    - every HISTORY_ENSURE_INTERVAL: the coming days of history made (Engine.ensure_history),
      the days that ended with every run in them terminal settled (Engine.settle_history: the
      claim and the sweeps read them no more), and a warning when the days are more than
      HISTORY_DAYS_WARN (at most once a day).

    The retention sweep first drops whole days of history whose runs may all go
    (Engine.drop_history_day), deletes what they leave in other tables (Engine.tidy_history),
    then purges what remains eligible run by run.

    Every pass is guarded: a failing pass (say, a lost database connection) is logged and
    the next interval tries again. Several servers may run this at once: every statement
    it calls is safe against concurrent copies of itself.

    Example::

        bg = Background(engine, notifier, sweep_interval=1.0)
        await bg.start()
        ...
        await bg.stop()
    """

    def __init__(self, engine: Engine, notifier: Notifier, *, sweep_interval: float,
                 retention_interval: float | None = None, retention_default_age: float | None = None,
                 renew_wait: float = 0.0, on_database: Callable[[bool], Awaitable[None]] | None = None) -> None:
        self.engine = engine
        # After the database was unreachable, the first sweep waits this long once it is back
        # (one lease renewal interval): the leases of connected workers, which expired
        # meanwhile, are renewed before the sweep could take them and run their steps again.
        self.renew_wait = renew_wait
        self.on_database = on_database  # told False when the database is lost, True when it is back
        self.database_lost = False
        self.notifier = notifier
        self.sweep_interval = sweep_interval
        self.retention_interval = retention_interval
        self.retention_default_age = retention_default_age
        # Totals since start, by scanner (leases_sweep = reclaims and reclaim_limit discards,
        # attempts_timeout, ..., children_settle, purged): counters for metrics.
        self.counts: collections.Counter[str] = collections.Counter()
        self.failed_passes = 0
        self._history_warned_at: float | None = None  # time.monotonic() of the last HISTORY_DAYS_WARN warning
        self._run_ended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        # 'top': only top-level runs ended, no parent node to settle.
        self.notifier.subscribe("cyclone_run_ended", self._run_ended.set, skip={"top"})
        self._tasks = [
            asyncio.create_task(self._every(self.sweep_interval, self._sweep, "sweep"), name="cyclone-sweep"),
            asyncio.create_task(self._settle_loop(), name="cyclone-settle"),
            asyncio.create_task(self._every(LIMITS_TIDY_INTERVAL, self._tidy_limits, "limits tidy"),
                                name="cyclone-limits-tidy"),
            asyncio.create_task(self._every(HISTORY_ENSURE_INTERVAL, self._ensure_history, "history days"),
                                name="cyclone-history-days"),
        ]
        if self.retention_interval:
            self._tasks.append(asyncio.create_task(
                self._every(self.retention_interval, self._retention, "retention"), name="cyclone-retention"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []  # (a second stop meanwhile finds nothing to stop)
        await cancel_and_wait(tasks)  # (cancelled again if a cancellation was lost)

    async def _guarded(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failed_passes += 1
            log.warning("%s pass failed: %s; trying again next interval", what, e)

    async def _every(self, interval: float, work: Callable[[], Awaitable[None]], what: str) -> None:
        while True:
            await self._guarded(work, what)
            await asyncio.sleep(interval)

    async def _sweep(self) -> None:
        if self.database_lost:
            await self.engine.ping()  # Unavailable while it is still down
            log.info("the database is back; sweeping in %.1fs, after the leases of connected workers are renewed",
                     self.renew_wait)
            if self.on_database is not None:
                await self.on_database(True)
            await asyncio.sleep(self.renew_wait)
            self.database_lost = False
        try:
            counts = await self.engine.sweep()
        except Unavailable:
            if not self.database_lost:
                self.database_lost = True
                if self.on_database is not None:
                    await self.on_database(False)
            raise
        done = {k: v for k, v in counts.items() if v}
        if done:
            log.info("sweep: %s", ", ".join(f"{k} {v}" for k, v in sorted(done.items())))
            self.counts.update(done)

    async def _settle_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._run_ended.wait()
            # Cleared before the query: a run that ends while it runs sets it again.
            self._run_ended.clear()
            began = loop.time()
            await self._guarded(self._settle, "child settling")
            await asyncio.sleep(max(0.0, began + SETTLE_MIN_INTERVAL - loop.time()))

    async def _settle(self) -> None:
        n = await self.engine.settle_children(limit=500)
        if n:
            self.counts["children_settle"] += n
        if n >= 500:  # more may be waiting: go again at once
            self._run_ended.set()

    async def _tidy_limits(self) -> None:
        for _ in range(RETENTION_MAX_BATCHES):
            n = await self.engine.tidy_limits(LIMITS_TIDY_BATCH)
            self.counts["limits_tidy"] += n
            if n < LIMITS_TIDY_BATCH:
                return

    async def _ensure_history(self) -> None:
        made = await self.engine.ensure_history()
        if made:
            log.info("history: made %d day(s) ahead", made)
        settled = await self.engine.settle_history()
        if settled:
            log.info("history: settled %d day(s) (every run in them ended)", settled)
        days = await self.engine.history_days()
        now = time.monotonic()
        if days > HISTORY_DAYS_WARN and (self._history_warned_at is None
                                         or now - self._history_warned_at >= HISTORY_WARN_INTERVAL):
            self._history_warned_at = now
            log.warning("history: %d partitions of runs, steps and edges (a day each); claims, results and "
                        "submissions slow with every one, and with enough of them Postgres runs out of lock "
                        "slots ('out of shared memory'): drop the days you no longer need "
                        "(--retention-interval with --retention-default-age; docs/operations.md, "
                        "'What the days cost')", days)

    async def _retention(self) -> None:
        for _ in range(HISTORY_MAX_DROPS):
            n = await self.engine.drop_history_day(self.retention_default_age)
            if n is None or n < 0:  # no day may go; or one may, and the next pass tries again
                break
            self.counts["purged"] += n
            log.info("retention: dropped a day of history (%d runs)", n)
        for _ in range(RETENTION_MAX_BATCHES):
            if await self.engine.tidy_history(RETENTION_BATCH) < RETENTION_BATCH:
                break
        for _ in range(RETENTION_MAX_BATCHES):
            n = await self.engine.purge(self.retention_default_age, limit=RETENTION_BATCH, sweep=True)
            self.counts["purged"] += n
            if n < RETENTION_BATCH:
                return
