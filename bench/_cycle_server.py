"""`cyclone-server`, timing the steps of a worker's cycle, for bench/drain_cycle.py.

Runs the server as `python -m cyclone_server` would, with its flags, after wrapping five
methods so that each call is recorded with its start and end on the monotonic clock: the
dispatcher's passes and claims, the Leases pushed, the Results messages read and the
result batches applied. At exit the records are written beside the server's ready file, as
`<ready file>.events.json`: a list of [what, worker id, start, end, rows].
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cyclone_server.stream import dispatcher as dispatch
from cyclone_server.stream.conn import WorkerConn

from cyclone_server.store import engine

from cyclone_server.stream import hub
from cyclone_server.cli.main import server_main

EVENTS: list[tuple[str, str, float, float, int]] = []
now = time.monotonic


def _timed(what: str, inner: Callable[..., Awaitable[Any]], who: Callable[..., str],
           rows: Callable[[tuple, Any], int]) -> Callable[..., Awaitable[Any]]:
    """`inner` (an async method the server calls with positional arguments), recording each
    call: `who(*args)` names the worker, and `rows(args, result)` counts the rows."""
    async def timed(self: Any, *args: Any) -> Any:
        t0 = now()
        out = await inner(self, *args)
        EVENTS.append((what, who(*args), t0, now(), rows(args, out)))
        return out
    return timed


def _timed_results(inner: Callable[..., None]) -> Callable[..., None]:
    """WorkerHub._on_results (not async), recording each Results message read."""
    def on_results(self: hub.WorkerHub, conn: WorkerConn, results: Any) -> None:
        t0 = now()
        inner(self, conn, results)
        EVENTS.append(("results", conn.worker_id, t0, now(), len(results)))
    return on_results


def main() -> int:
    nobody = lambda *args: ""  # noqa: E731
    engine.Engine.claim_leases = _timed(  # type: ignore[method-assign]
        "claim", engine.Engine.claim_leases, lambda owner, *_: owner, lambda args, out: len(out))
    engine.Engine.apply_results = _timed(  # type: ignore[method-assign]
        "apply", engine.Engine.apply_results, nobody, lambda args, out: len(args[0]))
    hub.WorkerHub._on_results = _timed_results(hub.WorkerHub._on_results)  # type: ignore[method-assign]
    dispatch.Dispatcher.deliver = _timed(  # type: ignore[method-assign]
        "deliver", dispatch.Dispatcher.deliver, lambda conn, *_: conn.worker_id, lambda args, out: len(args[1]))
    dispatch.Dispatcher._pass = _timed(  # type: ignore[method-assign]
        "pass", dispatch.Dispatcher._pass, nobody, lambda args, out: 0)
    ready = sys.argv[sys.argv.index("--ready-file") + 1]

    def dump() -> None:
        with open(f"{ready}.events.json", "w") as f:
            json.dump(EVENTS, f)
    atexit.register(dump)
    return server_main()


if __name__ == "__main__":
    sys.exit(main())
