"""The contestants of bench/peers.py: each loads --jobs committed jobs into a fresh database
and returns the Drain of its consumers."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Callable, Sequence

import psycopg

from cyclone_server.store.embedded import EmbeddedPostgres
from cyclone_server.store.migrate import migrate

from _common import DAG_NODES, SERVER, bench_dag, start_server
from _drain import (KIND, RAW_SCHEMA, Drain, Stage, cyclone_worker_main, pgq_consumer_main, poll_until,
                    raw_consumer_main)
from _pg import MARK, create_db, settle


def load_raw(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(RAW_SCHEMA)
        c.execute("INSERT INTO raw_jobs (kind, payload) SELECT %s, jsonb_build_object('i', i) "
                  "FROM generate_series(1, %s) i", (KIND, jobs))


def drain_raw(pg: EmbeddedPostgres, db: str, jobs: int, batch: int, timeout: float) -> Drain:
    url = create_db(pg, db)
    load_raw(url, jobs)
    settle(url)
    ctx = mp.get_context("spawn")
    ready, report, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=raw_consumer_main, args=(url, batch, 4, ready, go, report), daemon=True)

    def done(deadline: float) -> float:
        return report.get(timeout=max(1.0, deadline - time.monotonic()))

    d = Stage(pg, db, [proc], ready, go).run(f"raw{batch}", jobs, done, timeout)
    with psycopg.connect(url) as c:
        n = c.execute(f"SELECT {MARK} count(*) FROM raw_jobs WHERE status = 'done'").fetchone()[0]
    if n != jobs:
        raise SystemExit(f"raw{batch}: {n} of {jobs} jobs done")
    return d


def drain_pgq(pg: EmbeddedPostgres, db: str, jobs: int, timeout: float, driver: str = "asyncpg") -> Drain:
    """PgQueuer draining `jobs` jobs it enqueued itself, set up as its benchmark tool sets it up
    (pgq_consumer_main); `driver`: "asyncpg" (the tool's default) or "psycopg"."""
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries
    url = create_db(pg, db)

    async def load() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            q = Queries(PsycopgDriver(conn))
            await q.install()
            for start in range(0, jobs, 1000):
                n = min(1000, jobs - start)
                await q.enqueue([KIND] * n, [json.dumps({"i": start + i}).encode() for i in range(n)], [0] * n)
    asyncio.run(load())
    settle(url)
    ctx = mp.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=pgq_consumer_main, args=(url, 5, 10, driver, ready, go), daemon=True)
    # A finished job is deleted from pgqueuer (and logged in pgqueuer_log) in one statement.
    d = Stage(pg, db, [proc], ready, go).run(
        "pgq" if driver == "asyncpg" else "pgqpsy", jobs,
        lambda dl: poll_until(url, f"SELECT {MARK} count(*) FROM pgqueuer", lambda v: v == 0, dl), timeout)
    with psycopg.connect(url) as c:
        n = c.execute(f"SELECT {MARK} count(*) FROM pgqueuer_log WHERE status = 'successful'").fetchone()[0]
    if n != jobs:
        raise SystemExit(f"{d.name}: {n} of {jobs} jobs logged successful")
    return d


async def enqueue_cyclone(address: str, jobs: int) -> None:
    from cyclone_worker import Client, Job
    async with Client(address) as client:
        sem = asyncio.Semaphore(4)

        async def call(start: int) -> None:
            async with sem:
                await client.enqueue_many(Job(KIND, {"i": i}) for i in range(start, min(start + 1000, jobs)))
        await asyncio.gather(*(call(s) for s in range(0, jobs, 1000)))


async def submit_dags(address: str, steps: int) -> None:
    """steps / 10 runs of bench_dag (root, fan-out to 8, fan-in), 16 SubmitRun calls in flight."""
    from cyclone_worker import Client
    async with Client(address) as client:
        await client.register(bench_dag(KIND))
        sem = asyncio.Semaphore(16)

        async def call(i: int) -> None:
            async with sem:
                await client.submit("bench_dag", {"i": i})
        await asyncio.gather(*(call(i) for i in range(steps // DAG_NODES)))


def cyclone_stage(pg: EmbeddedPostgres, db: str, workdir: Path, workers: int, slots: int,
                  load: Callable[[str, str], None], server_args: Sequence[str] = (),
                  server_program: tuple[str, ...] = SERVER,
                  prepare: Callable[[str], None] | None = None) -> Stage:
    """A fresh database (given to `prepare(url)` once migrated, before the server starts),
    loaded by `load(url, address)`, a fresh server, worker processes waiting."""
    url = create_db(pg, db)
    migrate(url)
    if prepare is not None:
        prepare(url)
    server, address = start_server(url, workdir, *server_args, program=server_program)
    try:
        load(url, address)
        settle(url)
    except BaseException:
        server.kill()
        raise
    ctx = mp.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=cyclone_worker_main, args=(address, slots, ready, go), daemon=True)
             for _ in range(workers)]
    return Stage(pg, db, procs, ready, go, server)


def check_cyclone(url: str, jobs: int, name: str) -> None:
    with psycopg.connect(url) as c:
        n = c.execute(f"SELECT {MARK} count(*) FROM cyclone_steps WHERE state = 'completed'").fetchone()[0]
    if n < jobs:
        raise SystemExit(f"{name}: {n} of {jobs} steps completed")


def drain_cyclone(pg: EmbeddedPostgres, db: str, jobs: int, workers: int, timeout: float, workdir: Path,
                  during: Callable[[Stage], None] | None = None, server_processes: int = 1,
                  dag: bool = False, server_program: tuple[str, ...] = SERVER,
                  slots: int = 64, prepare: Callable[[str], None] | None = None) -> Drain:
    """`jobs` committed jobs drained; with `dag`, as many steps in runs of a 10-node DAG (the
    roots claimable at the start, the rest promoted as their parents complete). `prepare`:
    as cyclone_stage's."""
    if dag:
        jobs -= jobs % DAG_NODES
    stage = cyclone_stage(pg, db, workdir, workers, slots,
                          lambda url, address: asyncio.run(submit_dags(address, jobs) if dag
                                                           else enqueue_cyclone(address, jobs)),
                          server_args=("--processes", str(server_processes)) if server_processes > 1 else (),
                          server_program=server_program, prepare=prepare)
    query = (f"SELECT {MARK} EXISTS (SELECT 1 FROM cyclone_steps "
             "WHERE state NOT IN ('completed', 'discarded', 'cancelled'))")
    name = f"{'dag' if dag else 'cyc'}{workers}"
    d = stage.run(name, jobs, lambda dl: poll_until(stage.url, query, lambda v: not v, dl), timeout,
                  during=(lambda: during(stage)) if during else None)
    check_cyclone(stage.url, jobs, d.name)
    return d
