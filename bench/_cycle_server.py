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
from typing import Any

from cyclone_server import dispatch, engine, hub
from cyclone_server.cli import server_main

EVENTS: list[tuple[str, str, float, float, int]] = []
now = time.monotonic


def _timed_claim(inner: Any) -> Any:
    async def claim_leases(self: engine.Engine, owner: str, kinds: Any, limit: int, lease_ttl: float) -> list[Any]:
        t0 = now()
        rows = await inner(self, owner, kinds, limit, lease_ttl)
        EVENTS.append(("claim", owner, t0, now(), len(rows)))
        return rows
    return claim_leases


def _timed_apply(inner: Any) -> Any:
    async def apply_results(self: engine.Engine, results: Any) -> Any:
        t0 = now()
        out = await inner(self, results)
        EVENTS.append(("apply", "", t0, now(), len(results)))
        return out
    return apply_results


def _timed_results(inner: Any) -> Any:
    def on_results(self: hub.WorkerHub, conn: dispatch.WorkerConn, results: Any) -> None:
        t0 = now()
        inner(self, conn, results)
        EVENTS.append(("results", conn.worker_id, t0, now(), len(results)))
    return on_results


def _timed_deliver(inner: Any) -> Any:
    async def deliver(self: dispatch.Dispatcher, conn: dispatch.WorkerConn, rows: list[Any], claimed: float) -> None:
        t0 = now()
        await inner(self, conn, rows, claimed)
        EVENTS.append(("deliver", conn.worker_id, t0, now(), len(rows)))
    return deliver


def _timed_pass(inner: Any) -> Any:
    async def _pass(self: dispatch.Dispatcher) -> float | None:
        t0 = now()
        out = await inner(self)
        EVENTS.append(("pass", "", t0, now(), 0))
        return out  # type: ignore[no-any-return]
    return _pass


def main() -> int:
    engine.Engine.claim_leases = _timed_claim(engine.Engine.claim_leases)  # type: ignore[method-assign]
    engine.Engine.apply_results = _timed_apply(engine.Engine.apply_results)  # type: ignore[method-assign]
    hub.WorkerHub._on_results = _timed_results(hub.WorkerHub._on_results)  # type: ignore[method-assign]
    dispatch.Dispatcher.deliver = _timed_deliver(dispatch.Dispatcher.deliver)  # type: ignore[method-assign]
    dispatch.Dispatcher._pass = _timed_pass(dispatch.Dispatcher._pass)  # type: ignore[method-assign]
    ready = sys.argv[sys.argv.index("--ready-file") + 1]

    def dump() -> None:
        with open(f"{ready}.events.json", "w") as f:
            json.dump(EVENTS, f)
    atexit.register(dump)
    return server_main()


if __name__ == "__main__":
    sys.exit(main())
