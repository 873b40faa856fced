"""One drain: consumer processes that connect, say ready and wait for the go, and the
measurements from the go until every job is done; and the tables the bench prints."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import psycopg

from cyclone_server.store.embedded import EmbeddedPostgres

from _pg import CpuSampler, db_counters, postgres_pids, statements, statements_delta
from _report import print_rows  # (imported from here by the scripts too)

KIND = "noop"
POLL = 0.02  # seconds between "is everything done?" checks


# -- consumer processes (spawned: each imports, connects, says ready, waits for the go) ------------

RAW_SCHEMA = """
CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, kind text NOT NULL, status text NOT NULL DEFAULT 'queued',
    priority int NOT NULL DEFAULT 0, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz, finished_at timestamptz);
CREATE INDEX raw_jobs_claim ON raw_jobs (kind, priority, id) WHERE status = 'queued';
"""
RAW_CLAIM = """
WITH c AS (SELECT id FROM raw_jobs WHERE status = 'queued' AND kind = %s ORDER BY priority, id
           LIMIT %s FOR UPDATE SKIP LOCKED)
UPDATE raw_jobs j SET status = 'running', started_at = now() FROM c WHERE j.id = c.id RETURNING j.id, j.payload
"""
RAW_COMPLETE = "UPDATE raw_jobs SET status = 'done', finished_at = now() WHERE id = ANY (%s) AND status = 'running'"


def raw_consumer_main(url: str, batch: int, connections: int, ready, go, report) -> None:
    async def main() -> None:
        conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(connections)]
        ready.put(os.getpid())
        go.wait()

        async def loop(conn) -> float:
            last = time.monotonic()
            while True:
                rows = await (await conn.execute(RAW_CLAIM, (KIND, batch))).fetchall()
                if not rows:  # nothing queued is left unlocked: the others hold the rest
                    return last
                await conn.execute(RAW_COMPLETE, ([r[0] for r in rows],))
                last = time.monotonic()

        ends = await asyncio.gather(*(loop(c) for c in conns))
        report.put(max(ends))
        await hold(conns)
    asyncio.run(main())


async def hold(conns) -> None:
    """Keep the connections (and so their backends, whose CPU time is measured) until the
    bench terminates this process."""
    await asyncio.Event().wait()


def pgq_consumer_main(url: str, managers: int, batch: int, driver: str, ready, go) -> None:
    """PgQueuer's consumers as its own benchmark tool runs them (tools/benchmark.py, whose
    defaults its docs/benchmark.md uses): `managers` queue managers of `batch` jobs, each on
    a connection of its own, in drain mode, on uvloop; `driver` "asyncpg" (the tool's default
    and, in those docs, 1.7 x psycopg's throughput) or "psycopg"."""
    import uvloop
    from pgqueuer.db import AsyncpgDriver, PsycopgDriver
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    async def connect():
        if driver == "asyncpg":
            import asyncpg
            conn = await asyncpg.connect(dsn=url)
            return conn, AsyncpgDriver(conn)
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        return conn, PsycopgDriver(conn)

    async def main() -> None:
        qms, conns = [], []
        for _ in range(managers):
            conn, db = await connect()
            conns.append(conn)
            qm = QueueManager(Queries(db))

            @qm.entrypoint(KIND)
            async def noop(job) -> None:
                return None
            qms.append(qm)
        ready.put(os.getpid())
        go.wait()
        await asyncio.gather(*(qm.run(batch_size=batch, mode=QueueExecutionMode.drain) for qm in qms))
        await hold(conns)
    uvloop.run(main())


def cyclone_worker_main(address: str, slots: int, ready, go) -> None:
    from cyclone_worker import Context, Worker
    worker = Worker(address, slots=slots)

    @worker.handler(KIND)
    async def noop(ctx: Context) -> None:
        return None

    ready.put(os.getpid())
    go.wait()
    worker.run_sync()


# -- one drain ----------------------------------------------------------------------------------

@dataclass
class Drain:
    name: str
    jobs: int = 0
    seconds: float = 0.0
    statements: list[dict] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    pg_cpu: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def per_job(self, total: float) -> float:
        return total / self.jobs


class Stage:
    """Consumer processes waiting for the go; measures from the go to `done()`."""

    def __init__(self, pg: EmbeddedPostgres, db: str, procs: list[mp.Process], ready, go,
                 server: subprocess.Popen | None = None) -> None:
        self.pg, self.db, self.url = pg, db, pg.url(db)
        self.procs, self.ready, self.go, self.server = procs, ready, go, server

    def run(self, name: str, jobs: int, done: Callable[[float], float], timeout: float,
            during: Callable[[], None] | None = None) -> Drain:
        for p in self.procs:
            p.start()
        pids = []
        try:
            for _ in self.procs:
                pids.append(self.ready.get(timeout=120))
            time.sleep(1.2)  # idle backends flush their statistics about once a second
            counters0 = db_counters(self.pg, self.db)
            stmts0 = statements(self.url)
            # With --processes N the server is a supervisor and N children: count them all.
            server_pids = ([self.server.pid, *(p.pid for p in psutil.Process(self.server.pid).children())]
                           if self.server else [])
            # Read every 50 ms, so that a process that exits during the drain (an autovacuum
            # worker, a pool's connection) is counted too.
            cpu = CpuSampler({"postgres": lambda: postgres_pids(self.pg), "server": lambda: server_pids,
                              "client": lambda: pids})
            t0 = time.monotonic()
            self.go.set()
            if during:
                during()
            end = done(t0 + timeout)
            used = cpu.stop()
            stmts1 = statements(self.url)
        finally:
            self.stop()
        time.sleep(1.2)
        counters1 = db_counters(self.pg, self.db)
        return Drain(name, jobs, end - t0, statements_delta(stmts0, stmts1),
                     {k: counters1[k] - counters0[k] for k in counters0},
                     used["postgres"], used["server"], used["client"])

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)
        if self.server:
            self.server.terminate()
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(5)


def poll_until(url: str, query: str, finished: Callable[[object], bool], deadline: float,
               interval: float = POLL) -> float:
    """Run `query` every `interval` s until `finished(first column)`; the monotonic time it did."""
    with psycopg.connect(url, autocommit=True) as c:
        while time.monotonic() < deadline:
            value = c.execute(query).fetchone()[0]
            if finished(value):
                return time.monotonic()
            time.sleep(interval)
    raise SystemExit(f"timed out: {query}")


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def print_statements(d: Drain, limit: int = 12) -> None:
    rows = []
    for s in d.statements[:limit]:
        q = " ".join(s["query"].split())[:90]
        rows.append([("" if s["top"] else "  (nested) ") + q, f"{d.per_job(s['calls']):.3f}",
                     f"{s['ms'] / s['calls']:.3f}", f"{s['rows'] / s['calls']:.1f}",
                     f"{s['blocks'] / s['calls']:.1f}", f"{s['ms'] / d.jobs * 1000:.0f}"])
    print_rows(["statement", "calls/job", "ms/call", "rows/call", "blocks/call", "us/job"], rows)
