"""WaitRun's waiters, checked together.

A `cyclone_run_ended` notification carries no run id (so that Postgres folds them to one
per transaction). Each waiter reading its own run's state on every notification would
cost one query per waiter per ended run; instead one task reads the states of all the
runs being waited for in one query, on each notification and at least every
`recheck` seconds (a notification lost while the LISTEN connection was down costs a
moment, not the whole timeout), and wakes the waiters of the runs that ended.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from cyclone_server.records import TERMINAL_RUN_STATES

from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier
from cyclone_server.tasks import cancel_and_wait

log = logging.getLogger("cyclone.run_waits")


class RunEndWatch:
    """`ended(run_id, timeout)` for many concurrent callers, one state query per check."""

    def __init__(self, engine: Engine, notifier: Notifier, *, recheck: float = 2.0) -> None:
        self.engine = engine
        self.recheck = recheck
        self.checks = 0  # state queries made, for tests and curiosity
        self._waiters: dict[str, set[asyncio.Future[None]]] = collections.defaultdict(set)
        self._due = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        notifier.subscribe("cyclone_run_ended", self._due.set)

    async def ended(self, run_id: str, timeout: float) -> bool:
        """True once the run is terminal or gone (purged), False when `timeout` passes first."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[run_id].add(done)
        self._due.set()  # it may have ended before we began to wait: check at once
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="cyclone-run-waits")
        try:
            async with asyncio.timeout(timeout):  # not wait_for: see _watch
                await done
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.discard(done)
                if not waiters:
                    del self._waiters[run_id]

    async def close(self) -> None:
        task, self._task = self._task, None  # (a second stop meanwhile finds nothing to stop)
        if task is not None:
            await cancel_and_wait([task])  # (cancelled again if a cancellation was lost)

    async def _watch(self) -> None:
        try:
            while self._waiters:
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can turn a
                    # cancel (close()) that arrives as it times out into a TimeoutError.
                    async with asyncio.timeout(self.recheck):
                        await self._due.wait()
                except TimeoutError:
                    pass
                self._due.clear()
                await self._check()
        finally:
            # No await between the last look at _waiters and this: a new waiter after it
            # starts another task.
            self._task = None

    async def _check(self) -> None:
        run_ids = list(self._waiters)
        if not run_ids:
            return
        self.checks += 1
        try:
            states = await self.engine.run_states(run_ids)
        except Exception as e:  # the database is away: the waiters time out, or the next check answers
            log.warning("reading the states of %d awaited runs failed: %s", len(run_ids), e)
            await asyncio.sleep(min(self.recheck, 0.5))
            return
        for run_id in run_ids:
            state = states.get(run_id)
            if state is None or state in TERMINAL_RUN_STATES:
                for done in self._waiters.get(run_id, ()):
                    if not done.done():
                        done.set_result(None)
