"""Stopping the server's own looping tasks, for sure.

On Python 3.11 a cancellation can be lost: `asyncio.wait_for` returns its result when the
awaited thing completes in the same turn of the loop as the cancel (CPython gh-86296, fixed
in 3.12 only), and psycopg_pool's getconn waits through wait_for. A background pass cancelled
just as the pool hands it a connection carries on, and a loop such as the sweep's then never
ends: a server's stop waited for it forever (seen as a test hanging under load).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

# How long a cancelled task has to end before it is cancelled again.
CANCEL_AGAIN_AFTER = 1.0


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel the tasks and return once every one has ended, cancelling again those still
    running after CANCEL_AGAIN_AFTER seconds. Their outcomes (a cancellation, an exception)
    are taken and dropped: a stopped task's end is not an error."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_AFTER)
    await asyncio.gather(*tasks, return_exceptions=True)
