"""The schedule loop of one server: wakes at the next due fire time and fires it, exactly once across servers.

Every server runs one. Exactly once does not depend on them agreeing: each fire is one
transaction that starts the run and moves the schedule's next fire time on with a
compare-and-set (cyclone_schedule_fire), so of several servers waking for one fire time,
one starts the run and the others find it gone ('lost') and change nothing; a server
killed mid-fire leaves the transaction rolled back and the fire time due for the next
server (or itself, restarted) within the catch-up window.

No polling: the loop sleeps until the earliest due time (at most MAX_SLEEP, a safety net
for a lost notification), and wakes early when a schedule is made, changed or resumed
(in this process at once; in others by NOTIFY cyclone_schedules), and when runs end while
a buffer_one schedule holds a buffered fire time.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from cyclone_server import schedule_spec
from cyclone_server.errors import Unavailable
from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier
from cyclone_server.tasks import cancel_and_wait
from cyclone_worker._loop import wait_event_until

log = logging.getLogger(__name__)

MAX_SLEEP = 60.0  # seconds; the loop re-reads the schedules at least this often
RETRY_AFTER = 1.0  # seconds after a failed pass (a lost database connection, ...)
BATCH = 100


class Scheduler:
    """Fires due schedules; `counts[(outcome, schedule)]` totals what this process did.

    Outcomes: started, skipped (overlap policy), buffered, missed (fire times older than
    the catch-up window, counted per fire time), lost (another server fired it first).

    Example::

        scheduler = Scheduler(engine, notifier)
        await scheduler.start()
        ...
        await scheduler.stop()
    """

    def __init__(self, engine: Engine, notifier: Notifier) -> None:
        self.engine = engine
        self.notifier = notifier
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.passes = 0
        self.failed_passes = 0
        self._wake = asyncio.Event()
        self._buffered = False  # a buffered fire time waits: runs ending matter
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def _run_ended(self) -> None:
        if self._buffered:
            self._wake.set()

    async def start(self) -> None:
        self.notifier.subscribe("cyclone_schedules", self.wake)
        self.notifier.subscribe("cyclone_run_ended", self._run_ended)
        self.engine.schedule_listeners.append(self.wake)
        self._task = asyncio.create_task(self._loop(), name="cyclone-scheduler")

    async def stop(self) -> None:
        task, self._task = self._task, None  # (a second stop meanwhile finds nothing to stop)
        if task is not None:
            await cancel_and_wait([task])  # (cancelled again if a cancellation was lost)

    async def _loop(self) -> None:
        while True:
            # Cleared before the pass: a change made while it runs wakes the next one.
            self._wake.clear()
            try:
                delay = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failed_passes += 1
                log.warning("schedule pass failed: %s; trying again in %.0f s", e, RETRY_AFTER)
                delay = RETRY_AFTER
            # The database's clock says when: a wake-up before then would cost a pass for nothing.
            await wait_event_until(self._wake, time.monotonic() + min(delay, MAX_SLEEP))

    async def run_once(self) -> float:
        """Fire everything due, start released buffered fire times; seconds until the next due time."""
        self.passes += 1
        failed = False
        while True:
            due = await self.engine.schedules_due(BATCH)
            for row in due:
                try:
                    await self._fire(row)
                except (asyncio.CancelledError, Unavailable):  # the database: the whole pass waits
                    raise
                except Exception as e:  # one schedule that cannot fire must not hold up the others
                    self.failed_passes += 1
                    failed = True
                    log.warning('schedule "%s": fire failed: %s', row["name"], e)
            if len(due) < BATCH or failed:
                break
        for r in await self.engine.release_schedules(BATCH):
            if r["run_id"] is None:  # refused now (a limit deleted since): dropped, a miss
                log.warning('schedule "%s": the buffered fire time %s was refused and is dropped',
                            r["name"], r["fire_at"])
                self.counts["missed", r["name"]] += 1
            else:
                self.counts["started", r["name"]] += 1
        seconds, self._buffered = await self.engine.schedules_next_due()
        if seconds is None:
            return MAX_SLEEP
        if seconds <= 0:  # became due during this pass, or could not fire: again now, or after a failure soon
            return RETRY_AFTER if failed else 0.0
        return seconds

    async def _fire(self, row: dict) -> None:
        """All of one schedule's due fire times (a catch-up may hold several), one transaction each."""
        spec = schedule_spec.Spec.from_row(row)
        name, expected, due = row["name"], row["next_fire_at"], row["next_due_at"]
        now = row["db_now"]  # the clock that found it due: a server whose own clock is off neither spins nor skips
        while expected is not None and due is not None:
            if due > now:
                return
            plan = schedule_spec.plan(spec, expected, due, now, catchup_window=row["catchup_window"].total_seconds(),
                                      jitter=row["jitter"].total_seconds())
            result = await self.engine.fire_schedule(name, expected, plan)
            outcome = result["outcome"]
            if outcome == "lost":  # another server fired it, or the schedule changed: the next pass re-reads
                self.counts["lost", name] += 1
                return
            if plan.missed:
                self.counts["missed", name] += plan.missed
                log.warning('schedule "%s": %d fire times older than its catch-up window were skipped',
                            name, plan.missed)
            if outcome == "refused":  # a miss of the schedule's; the next fire time comes as usual
                log.warning('schedule "%s": the fire time %s was refused and is skipped: %s',
                            name, plan.fire_at, result["detail"])
                self.counts["missed", name] += 1
            elif outcome != "missed":
                self.counts[outcome, name] += 1
            expected, due = plan.next_fire_at, plan.next_due_at
