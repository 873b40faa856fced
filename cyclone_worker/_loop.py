"""Which event loop a long-running Cyclone process runs on: uvloop's where it is installed.

The worker SDK's `Worker.run_sync`, the demo worker, `cyclone dev` and the server
(`--event-loop`) run their asyncio code on uvloop when it is installed (a dependency of the
distribution on Linux and macOS): the same coroutines, run by an event loop written in Cython on
libuv. A drain of no-op jobs costs the server and the workers about a tenth less CPU per job on it
(docs/benchmarks.md). "asyncio" keeps the standard library's loop, for a program that needs it or
to rule the loop out; the environment variable CYCLONE_EVENT_LOOP chooses when the code does not.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
ENV = "CYCLONE_EVENT_LOOP"

T = TypeVar("T")

# What a loop may have taken over (add_signal_handler): put back after it, if it still holds them.
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def from_env(choice: str | None = None) -> str:
    """`choice`, or else CYCLONE_EVENT_LOOP (exactly one of EVENT_LOOPS, as the server's
    `--event-loop` takes it), or else "auto"."""
    if choice is not None:
        return choice
    value = os.environ.get(ENV)
    if value is None:
        return "auto"
    if value not in EVENT_LOOPS:
        raise ValueError(f"{ENV}={value!r} is not one of {', '.join(EVENT_LOOPS)}")
    return value


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
    """`asyncio.run(main)` on the event loop `choice` names (see loop_factory).

    SIGINT, SIGTERM and SIGHUP, when the loop took them (add_signal_handler), get back the
    handlers they had before: uvloop's loop removes its handlers only while it runs, so they would
    otherwise stay bound to a closed loop, and the rest of the program (its exit included) would
    not hear them; asyncio's sets the default disposition, not the handler it found. A handler the
    program itself set meanwhile stays, unless it is the default disposition (which is what a loop
    leaves behind); one set outside Python (getsignal None) cannot be put back and is left alone."""
    try:
        factory = loop_factory(choice)
    except ValueError:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top of the error
        raise
    main_thread = threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in _SIGNALS} if main_thread else {}
    runner = asyncio.Runner(loop_factory=factory)
    loop: asyncio.AbstractEventLoop | None = None
    try:
        with runner:
            loop = runner.get_loop()
            return runner.run(main)
    finally:
        for sig, handler in before.items():
            now = signal.getsignal(sig)
            taken = getattr(now, "__self__", None) is loop or now in (signal.SIG_DFL, signal.default_int_handler)
            if loop is not None and handler is not None and taken and now is not handler:
                signal.signal(sig, handler)


# uvloop's timers count whole milliseconds from the start of the loop's turn, so one may fire up
# to a millisecond before its time by time.monotonic(); asyncio's fire at their time or after.
UVLOOP_TIMER_SLACK = 0.001


def timer_slack(loop: asyncio.AbstractEventLoop | None = None) -> float:
    """Seconds to add to a timer that must not fire before a time.monotonic() deadline: 1 ms on
    uvloop (UVLOOP_TIMER_SLACK), none on asyncio's loop. Without it, a wake-up that comes early
    finds its deadline not yet passed and is spent, or spins the loop until it has."""
    return UVLOOP_TIMER_SLACK if loop_name(loop) == "uvloop" else 0.0


async def wait_event_until(event: asyncio.Event, deadline: float) -> bool:
    """Wait for `event` (True) or until time.monotonic() reaches `deadline` (False), and not a
    moment before it on either loop: the timer has uvloop's slack (timer_slack), and one that
    fires early anyway (a timer armed late in a long loop turn) is set again for the rest."""
    slack = timer_slack()
    while True:
        try:
            # asyncio.timeout, not wait_for, which can lose a cancel on Python 3.11.
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0) + slack):
                await event.wait()
            return True
        except TimeoutError:
            if time.monotonic() >= deadline:
                return False


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """"uvloop" or "asyncio": what runs `loop` (the running loop by default), for logs."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
