"""A worker process for the flow-control tests: its handlers record what they see in a shared file.

    python sdk_limits_worker_proc.py ADDRESS SLOTS STATE_FILE

Kind "tenant_job" (input {"tenant": ...}): counts, under an exclusive lock on STATE_FILE shared
by every worker process, how many of its tenant's handlers run at once, and keeps the most it
ever saw per tenant ({"now": {...}, "most": {...}, "done": N}). It holds its step until its
tenant has two running (or 5 s pass), so that a limit of two per tenant is reached, not just
allowed. Kind "rate_job": appends {"tenant", "at": time.time(), "run_id"} to STATE_FILE +
".starts" when it starts. Both finish at once otherwise. SIGTERM stops the worker gracefully.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path
from typing import Any

from cyclone_worker import Context, Worker

HOLD_UNTIL_PAIRED = 5.0


def _update(state: Path, change: Any) -> dict[str, Any]:
    """Apply `change(data)` to the JSON in `state` under an exclusive lock; returns the data."""
    with open(state, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        data = json.loads(f.read() or '{"now": {}, "most": {}, "done": 0}')
        change(data)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(data))
        return data


def main(address: str, slots: str, state_file: str) -> None:
    state = Path(state_file)
    worker = Worker(address, slots=int(slots))

    @worker.handler("tenant_job")
    def tenant_job(ctx: Context) -> dict[str, Any]:  # a thread of its own: sleeping blocks nothing else
        tenant = ctx.input["tenant"]

        def start(data: dict[str, Any]) -> None:
            data["now"][tenant] = data["now"].get(tenant, 0) + 1
            data["most"][tenant] = max(data["most"].get(tenant, 0), data["now"][tenant])

        def end(data: dict[str, Any]) -> None:
            data["now"][tenant] -= 1
            data["done"] += 1

        _update(state, start)
        # The work: wait (bounded) for a second step of the tenant to be running beside this one.
        end_at = time.monotonic() + HOLD_UNTIL_PAIRED
        while _update(state, lambda d: None)["now"][tenant] < 2 and time.monotonic() < end_at:
            time.sleep(0.01)
        _update(state, end)  # before the result is sent: the count is never above the server's
        return {"tenant": tenant}

    @worker.handler("rate_job")
    def rate_job(ctx: Context) -> None:
        line = json.dumps({"tenant": ctx.input["tenant"], "at": time.time(), "run_id": ctx.run_id})
        with open(f"{state_file}.starts", "a") as f:  # one small append per start
            f.write(line + "\n")

    worker.run_sync()


if __name__ == "__main__":
    main(*sys.argv[1:4])
