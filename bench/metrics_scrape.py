"""What one Prometheus scrape costs with 1,000,000 available steps, against an empty queue.

    .venv/bin/python bench/metrics_scrape.py                      # embedded Postgres in a temp dir
    .venv/bin/python bench/metrics_scrape.py --database-url URL   # an existing, empty database

Each scrape is a full HTTP GET /metrics against `serve_metrics`, so it includes the read
of cyclone_v_kinds. The backlog is inserted in bulk (this is a read benchmark, so the
engine's submit path is not what is measured), spread over --kinds kinds, then measured
as inserted and again after VACUUM ANALYZE (what autovacuum leaves behind: the view's
counts can then use index-only scans).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cyclone_server.store.engine import Engine  # noqa: E402
from cyclone_server.serve.metrics import Metrics, serve_metrics  # noqa: E402
from cyclone_server.store.migrate import migrate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import fmt_spread, postgres_line  # noqa: E402

# Runs of `per_run` task steps each, all available, kinds round-robin over the steps. Ids as
# the schema makes them (a run's a uuid7, its steps' starting with it: each row in its run's
# day of history, migration 0014).
INSERT_RUNS = """
INSERT INTO cyclone_runs (id, state) SELECT cyclone_uuid7(), 'running' FROM generate_series(1, %(runs)s)
"""
INSERT_STEPS = """
INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims, attempt_timeout,
                           backoff_initial, backoff_max, scheduled_at)
SELECT cyclone__step_uuid(r.id), r.id, 'n' || i, 'kind_' || (i %% %(kinds)s), 'task', 'available', 25, 5,
       interval '10 min', interval '1 s', interval '10 min', now() - interval '1 s' * i
  FROM cyclone_runs r, generate_series(1, %(per_run)s) AS i
"""


async def scrape(port: int) -> float:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
    await writer.drain()
    body = await reader.read()
    writer.close()
    elapsed = time.perf_counter() - start
    assert body.split(b" ", 2)[1] == b"200", body[:100]
    return elapsed


async def measure(port: int, n: int) -> tuple[list[float], float]:
    """The `n` scrapes' times (s), and their p95."""
    for _ in range(3):  # warm the caches and the pool
        await scrape(port)
    times = sorted([await scrape(port) for _ in range(n)])
    return times, times[int(0.95 * (len(times) - 1))]


async def bench(url: str, steps: int, kinds: int, scrapes: int) -> None:
    migrate(url)
    engine = await Engine.open(url, min_size=1, max_size=2)
    server = await serve_metrics(Metrics(), engine, "127.0.0.1", 0)
    rows: list[tuple[str, list[float], float]] = []
    settings = postgres_line(url)
    try:
        rows.append(("empty queue", *await measure(server.port, scrapes)))
        per_run = 1000
        t = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(INSERT_RUNS, {"runs": steps // per_run})
            conn.execute(INSERT_STEPS, {"kinds": kinds, "per_run": per_run})
            n = conn.execute("SELECT count(*) FROM cyclone_steps WHERE state = 'available'").fetchone()[0]
        print(f"inserted {n:,} available steps over {kinds} kinds in {time.perf_counter() - t:.1f} s", flush=True)
        rows.append((f"{n:,} available, as inserted", *await measure(server.port, scrapes)))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE cyclone_steps")
        rows.append((f"{n:,} available, vacuumed", *await measure(server.port, scrapes)))
    finally:
        await server.close()
        await engine.close()
    base = statistics.median(rows[0][1])
    print(f"\n{'backlog':<34} {'median ms (min, max)':>30} {'p95 ms':>10} {'ratio':>8}")
    for name, times, p95 in rows:
        print(f"{name:<34} {fmt_spread([t * 1000 for t in times], '{:.2f}'):>30} {p95 * 1000:>10.2f} "
              f"{statistics.median(times) / base:>7.1f}x")
    print(f"\n({scrapes} scrapes each; ratio = median / median of the empty queue)")
    print(settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", help="an empty database (default: embedded Postgres in a temp dir)")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--kinds", type=int, default=10)
    p.add_argument("--scrapes", type=int, default=30, help="at least 5")
    args = p.parse_args()
    if args.scrapes < 5:
        p.error("--scrapes: at least 5")
    if args.database_url:
        asyncio.run(bench(args.database_url, args.steps, args.kinds, args.scrapes))
        return
    from cyclone_server.store.embedded import start_embedded
    with tempfile.TemporaryDirectory(prefix="cyclone-bench-") as tmp:
        pg = start_embedded(Path(tmp) / "pg", fast=True)
        try:
            asyncio.run(bench(pg.url(), args.steps, args.kinds, args.scrapes))
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
