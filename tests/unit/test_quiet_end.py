"""WorkerConn.call_at_quiet_end: the wake-up after a hand-back's quiet comes once the quiet is
over by the clock it counts on, on either event loop (uvloop's timers may fire a millisecond early)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cyclone_server.stream.conn import WorkerConn
from cyclone_worker._loop import run


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_wake_up_comes_when_the_quiet_is_over_not_before(choice: str) -> None:
    if choice == "uvloop":
        pytest.importorskip("uvloop")

    async def quiets() -> list[tuple[bool, float, float]]:
        conn = WorkerConn("w", ["k"], 1)
        conn.ping = lambda: None  # type: ignore[method-assign]  # no stream to ping on
        seen: list[tuple[bool, float, float]] = []
        for _ in range(30):
            conn.hush(0.0105)
            woken = asyncio.Event()

            def wake() -> None:
                seen.append((conn.quiet, time.monotonic(), conn.quiet_until))
                woken.set()
            conn.call_at_quiet_end(wake)
            await asyncio.wait_for(woken.wait(), 10)
        return seen

    seen = run(quiets(), choice)
    assert len(seen) == 30
    early = [(round((until - at) * 1e3, 3)) for quiet, at, until in seen if quiet]
    assert early == [], f"woken this many ms before the quiet's end: {early}"
