"""A Python worker process for the tracing tests; spans go where the OTEL_* environment says.

    python otel_worker_proc.py ADDRESS

Kinds: `fetch` returns what the handler saw of its trace; `flaky` fails its first attempt,
then returns the same; `relay` enqueues a `fetch` job with the SDK client and returns
that job's output (so it shows the context the handler passed on). Runs until SIGTERM (then drains, and flushes its spans).
"""

from __future__ import annotations

import sys
from typing import Any

from cyclone_worker import Client, Context, Worker


def seen(ctx: Context) -> dict[str, Any]:
    return {"traceparent": ctx.traceparent, "tracestate": ctx.tracestate,
            "otel_imported": "opentelemetry" in sys.modules}


def main(address: str) -> None:
    worker = Worker(address, slots=2, grace=5)

    @worker.handler("fetch")
    async def fetch(ctx: Context) -> dict[str, Any]:
        return seen(ctx)

    @worker.handler("flaky")
    def flaky(ctx: Context) -> dict[str, Any]:  # a thread handler: the span is current there too
        if ctx.attempt == 1:
            raise RuntimeError("planned failure of the first attempt")
        return seen(ctx)

    @worker.handler("relay")
    async def relay(ctx: Context) -> dict[str, Any]:
        async with Client(address) as client:
            run_id = await client.enqueue("fetch")
            return (await client.result(run_id, timeout=30))["fetch"]

    worker.run_sync()


if __name__ == "__main__":
    main(sys.argv[1])
