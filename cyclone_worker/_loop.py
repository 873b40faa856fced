"""Which event loop a long-running Cyclone process runs on: uvloop's where it is installed.

The worker SDK's `Worker.run_sync` and the server (`--event-loop`) both run their asyncio code on
uvloop when it is installed (a dependency of the distribution on Linux and macOS): the same
coroutines, run by an event loop written in Cython on libuv. A drain of no-op jobs spends about a
tenth less CPU per job in the server and in the workers with it (docs/benchmarks.md). "asyncio"
keeps the standard library's loop, for a program that needs it or to rule the loop out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The new-loop function for `choice` (None: asyncio's own). "auto" is uvloop when it can be
    imported, else asyncio; "uvloop" that is not installed is a ValueError saying so."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop {choice!r} is not one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError("event loop 'uvloop': uvloop is not installed (pip install uvloop; it does not "
                             "run on Windows)") from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the event loop `choice` names (see loop_factory)."""
    try:
        factory = loop_factory(choice)
    except ValueError:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top of the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """"uvloop" or "asyncio": what runs `loop` (the running loop by default), for logs."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
