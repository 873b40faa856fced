"""A worker process that reports the event loop it runs on: each step's output is {"loop": NAME}.

    python loop_worker_proc.py ADDRESS KIND EVENT_LOOP

EVENT_LOOP is Worker.run_sync's `event_loop` ("auto", "uvloop" or "asyncio").
"""

from __future__ import annotations

import sys

from cyclone_worker import Context, Worker
from cyclone_worker._loop import loop_name


def main(address: str, kind: str, event_loop: str) -> None:
    worker = Worker(address, slots=4)

    @worker.handler(kind)
    async def report(ctx: Context) -> dict[str, str]:
        return {"loop": loop_name()}

    worker.run_sync(event_loop=event_loop)


if __name__ == "__main__":
    main(*sys.argv[1:4])
