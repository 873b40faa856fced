"""A worker process for crash tests: each lease it gets is written to a file, then its handler hangs.

    python sdk_worker_proc.py ADDRESS KIND LEASES_FILE

Each line of LEASES_FILE is the JSON of one lease (step_id, lease_generation, attempt,
reclaims, worker_id). The test SIGKILLs the process while a handler hangs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from cyclone_worker import Context, Worker


def main(address: str, kind: str, leases_file: str) -> None:
    worker = Worker(address, slots=1)

    @worker.handler(kind)
    async def hang(ctx: Context) -> None:
        line = json.dumps({"step_id": ctx.step_id, "lease_generation": ctx.lease_generation,
                           "attempt": ctx.attempt, "reclaims": ctx.reclaims, "worker_id": ctx.worker_id})
        with open(leases_file, "a") as f:  # one small append: the test never reads half a line
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        await asyncio.Event().wait()  # until SIGKILL

    worker.run_sync()


if __name__ == "__main__":
    main(*sys.argv[1:4])
