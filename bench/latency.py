"""Where a lone job's dispatch latency goes, hop by hop.

One embedded Postgres with durable commits, one `cyclone-server`, one SDK worker process
(64 slots) whose handler returns the time it started. The client enqueues `--jobs` jobs
one at a time, 10 ms apart (no backlog), and then reads each step's times from the
database. It prints p50 / p90 / p99 of:

- call -> scheduled_at: the client's `Enqueue` call to the enqueue transaction's start;
- scheduled_at -> claim: to the claim transaction's start (`started_at`): the enqueue's
  commit, the dispatcher's wake-up and its claim;
- claim -> handler: the claim's commit, the Lease, the stream and the worker's task;
- scheduled_at -> handler: the dispatch latency `bench/throughput.py` reports;
- call round trip: the client's `Enqueue` call.

All times are taken on one machine's clock (Postgres's `now()` and `time.time()`).

    .venv/bin/python bench/latency.py            # --jobs 200
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cyclone_server.store.embedded import start_embedded  # noqa: E402
from cyclone_server.store.migrate import migrate  # noqa: E402
from cyclone_worker import Client, Context, Worker  # noqa: E402

from _common import note, start_server  # noqa: E402

KIND = "latency"


def worker_main(address: str) -> None:
    worker = Worker(address, slots=64)

    @worker.handler(KIND)
    async def started(ctx: Context) -> dict:
        return {"t": time.time()}

    worker.run_sync()


async def measure(address: str, url: str, jobs: int) -> dict[str, list[float]]:
    client = Client(address, wait_for_server=30)
    for i in range(20):  # warm-up: connections, prepared statements, the worker's stream
        await client.enqueue(KIND, {"warm": i})
    await asyncio.sleep(1)
    sent: dict[int, tuple[float, float]] = {}
    for i in range(jobs):
        t0 = time.time()
        await client.enqueue(KIND, {"i": i})
        sent[i] = (t0, time.time())
        await asyncio.sleep(0.01)
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            rows = await (await conn.execute(
                "SELECT (r.input ->> 'i')::int, extract(epoch FROM s.scheduled_at)::float8, "
                "extract(epoch FROM s.started_at)::float8, (s.output ->> 't')::float8 "
                "FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id "
                "WHERE s.kind = %s AND r.input ? 'i' AND s.state = 'completed'", (KIND,))).fetchall()
            if len(rows) == jobs:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(rows)} of {jobs} jobs completed")
            await asyncio.sleep(0.1)
    parts: dict[str, list[float]] = {k: [] for k in ("call -> scheduled_at", "scheduled_at -> claim", "claim -> handler",
                                                     "scheduled_at -> handler", "call round trip")}
    for i, scheduled, claimed, handled in rows:
        t0, t1 = sent[i]
        parts["call -> scheduled_at"].append(scheduled - t0)
        parts["scheduled_at -> claim"].append(claimed - scheduled)
        parts["claim -> handler"].append(handled - claimed)
        parts["scheduled_at -> handler"].append(handled - scheduled)
        parts["call round trip"].append(t1 - t0)
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cyclone-latency-") as tmp:
        workdir = Path(tmp)
        pg = start_embedded(workdir / "pg")
        server = worker = None
        try:
            url = pg.url()
            migrate(url)
            server, address = start_server(url, workdir)
            worker = mp.get_context("spawn").Process(target=worker_main, args=(address,), daemon=True)
            worker.start()
            note(f"{args.jobs} jobs, one at a time, 10 ms apart")
            parts = asyncio.run(measure(address, url, args.jobs))
        finally:
            if worker is not None:
                worker.terminate()
                worker.join(10)
            if server is not None:
                server.terminate()
                server.wait(30)
            pg.stop()
    print(f"jobs={args.jobs} date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name, values in parts.items():
        values.sort()
        p = lambda q: values[min(len(values) - 1, int(len(values) * q))] * 1000  # noqa: E731
        print(f"{name:24s} p50 {statistics.median(values) * 1000:6.2f} ms   p90 {p(0.9):6.2f} ms   p99 {p(0.99):6.2f} ms")


if __name__ == "__main__":
    main()
