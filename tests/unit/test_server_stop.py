"""A server's background loops stop even when a cancellation is lost (cyclone_server/tasks.py).

On Python 3.11, asyncio.wait_for returns its result when the awaited thing completes in the
same turn as the cancel (CPython gh-86296), and psycopg_pool's getconn waits through it: a
sweep pass cancelled just as the pool hands it a connection carries on. Here a fake engine's
first sweep swallows the cancel the same way; Background.stop must still return.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cyclone_server.serve.background import Background
from cyclone_server.tasks import cancel_and_wait


class Notifier:
    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        pass


class Engine:
    """Its first sweep waits, and takes a cancel that comes meanwhile as wait_for on 3.11 can: as done."""

    def __init__(self) -> None:
        self.sweeps = 0
        self.waiting = asyncio.Event()

    async def sweep(self) -> dict[str, int]:
        self.sweeps += 1
        if self.sweeps == 1:
            self.waiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass  # lost: the pass goes on, and so does the loop
        return {}

    async def tidy_limits(self, n: int) -> int:
        return 0


async def test_a_background_loop_that_lost_its_cancellation_still_stops() -> None:
    engine = Engine()
    bg = Background(engine, Notifier(), sweep_interval=0.01)
    await bg.start()
    await asyncio.wait_for(engine.waiting.wait(), 5)
    await asyncio.wait_for(bg.stop(), 10)
    assert engine.sweeps >= 2  # the first cancel was lost: the loop went on until cancelled again


async def test_cancel_and_wait_returns_once_every_task_ended() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 2:
                    raise

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(asyncio.sleep(30))]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(tasks), 10)
    assert all(t.done() for t in tasks) and swallowed == 2


async def test_a_notification_wait_cancelled_as_its_notification_arrives_is_cancelled() -> None:
    """Notifier.wait does not swallow a cancel that lands in the turn its notification is
    fired: with asyncio.wait_for (Python 3.11) the wait returned True and the cancelled caller
    carried on."""
    from cyclone_server.store.notify import Notifier as RealNotifier

    notifier = RealNotifier("postgresql:///unused")  # not started: _fire is called by hand
    waiting = asyncio.create_task(notifier.wait("cyclone_available", 30))
    await asyncio.sleep(0)  # the wait is registered and blocked
    notifier._fire("cyclone_available")
    waiting.cancel()  # the same turn as the notification
    try:
        result = await waiting
    except asyncio.CancelledError:
        return
    raise AssertionError(f"the cancel was lost: wait returned {result!r}")
