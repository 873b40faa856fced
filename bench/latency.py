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

All times are taken on one machine's clock (Postgres's `now()` and `time.time()`). Each of
--rounds rounds runs on a fresh database, server and worker; each figure is the median of the
rounds' own percentiles, with their min and max, under the Postgres version and settings.

    .venv/bin/python bench/latency.py            # --jobs 200 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cyclone_server.store.embedded import start_embedded  # noqa: E402
from cyclone_server.store.migrate import migrate  # noqa: E402
from cyclone_worker import Client, Context, Worker  # noqa: E402

from _common import note, start_server  # noqa: E402
from _report import MIN_ROUNDS, check_rounds, fmt_spread, percentile_ms, postgres_line  # noqa: E402

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


def one_round(pg: Any, workdir: Path, r: int, jobs: int) -> dict[str, list[float]]:
    """A round on a fresh database, server and worker: each hop's times, in seconds."""
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE latency_{r}")
    url = pg.url(f"latency_{r}")
    migrate(url)
    server = worker = None
    try:
        server, address = start_server(url, workdir)
        worker = mp.get_context("spawn").Process(target=worker_main, args=(address,), daemon=True)
        worker.start()
        note(f"round {r + 1}: {jobs} jobs, one at a time, 10 ms apart")
        return asyncio.run(measure(address, url, jobs))
    finally:
        if worker is not None:
            worker.terminate()
            worker.join(10)
        if server is not None:
            server.terminate()
            server.wait(30)
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute(f"DROP DATABASE latency_{r} WITH (FORCE)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)
    with tempfile.TemporaryDirectory(prefix="cyclone-latency-") as tmp:
        workdir = Path(tmp)
        pg = start_embedded(workdir / "pg")
        try:
            settings = postgres_line(pg.url())
            note(settings)
            rounds = [one_round(pg, workdir, r, args.jobs) for r in range(args.rounds)]
        finally:
            pg.stop()
    print(f"jobs={args.jobs} rounds={args.rounds} date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    print("each: the median of the rounds' own percentile, ms (min, max)")
    for name in rounds[0]:
        for parts in rounds:
            parts[name].sort()
        cells = [f"p{int(q * 100)} " + fmt_spread([percentile_ms(parts[name], q) for parts in rounds], "{:.2f}")
                 for q in (0.5, 0.9, 0.99)]
        print(f"{name:24s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
