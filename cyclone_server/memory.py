"""Freed memory goes back to the system after a large request.

glibc's malloc keeps what the gRPC threads free in their arenas, for reuse: after a request
of hundreds of MiB (refused or served) the server's resident memory stayed 300 to 450 MiB
above where it was (measured after four refused 256 MiB Enqueue calls) until the arenas
happened to shrink, which an idle server may never do. `release_after` asks malloc_trim(3)
to hand the free pages back once such a call is done: a call of at least LARGE_REQUEST_BYTES,
rare enough that its cost (a walk over the arenas, a few milliseconds, off the event loop)
does not matter. Where malloc_trim does not exist (not glibc) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable
from typing import Any

LARGE_REQUEST_BYTES = 32 << 20


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def release_after(context: Any) -> None:
    """Once the gRPC call of `context` is done, give the memory the process has free back to
    the system (off the event loop)."""
    if _trim is None:
        return
    loop = asyncio.get_running_loop()

    def done(_: Any) -> None:
        # The done callback runs as the call ends; the request's last references (the
        # handler's task and frames) go with the loop's next turns, so the trim waits a moment.
        try:
            loop.call_soon_threadsafe(loop.call_later, 0.05, _start, loop)
        except RuntimeError:  # the loop closed meanwhile (the server stopped): nothing to give back for
            pass

    context.add_done_callback(done)


def _start(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_in_executor(None, _run)
    except RuntimeError:  # the default executor shut down (the server is stopping)
        pass


def _run() -> None:
    assert _trim is not None
    _trim(0)
