"""End-to-end throughput and dispatch latency of Cyclone, against raw SQL doing the same row work.

    .venv/bin/python bench/throughput.py [--jobs 10000] [--runs 1000] [--workers 2] [--slots 64] [--batch 100] [--rounds 5]

Everything runs on this machine together: an embedded Postgres with durable commits
(fsync and synchronous_commit on), one `cyclone-server`, Python SDK workers as separate
processes with no-op handlers, and the load generator. Each round runs every phase below
in turn, Cyclone's on a fresh database, server and workers, the raw SQL baseline on a
fresh database of its own (so a round's Cyclone and raw SQL figures are made minutes
apart at most), then the floor once both databases are dropped. It prints the Postgres
version and settings, and one table: a column per round, then the median of the rounds
with their min and max (a ratio: the ratio of the medians, with the min and max of the
rounds' own ratios):

- standalone jobs: Enqueue over gRPC -> claim -> handler -> complete, steps/s, once with
  one Enqueue call per job (64 calls in flight, `Client(enqueue_calls=0)`), once with one
  SDK `enqueue()` per job from 64 tasks on a default Client (at most 2 calls in flight,
  the other jobs going together in EnqueueMany calls), and once with EnqueueMany (--batch
  jobs per call, 4 calls in flight);
- DAG runs: SubmitRun of a 10-node workflow (fan-out / fan-in) -> every step done, steps/s;
- dispatch latency p50 / p99: from the step becoming available (scheduled_at) to its
  handler starting, measured with paced submissions (no backlog);
- the baseline: the same row work (insert a run and its step, claim with FOR UPDATE SKIP
  LOCKED, complete the step and the run, durable commits) as plain SQL from the same
  number of connections, steps/s, and Cyclone's ratio to it;
- the transport's floor: a bare grpc.aio server whose Enqueue answers a constant, called
  by the same client with the same 64 calls in flight (`_grpc_floor.py`), against the
  rate at which Cyclone answered its Enqueue calls (each once its job committed, while
  the workers drained them);
- CPU per job, read from each process every 50 ms: in the Enqueue-per-job phase for the
  server, Postgres (every backend), the workers and the load generator; in the raw-SQL
  baseline for Postgres and its client;
- the ceiling: the Enqueue-per-job rate if the server cost no more per job than the bare
  constant-answer server costs per call, with the load generator at the floor's cost, the
  workers and Postgres at their measured cost, and every core busy. No change to the
  server alone can take the phase past it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from cyclone_server.store.embedded import start_embedded
from cyclone_server.store.migrate import migrate
from cyclone_worker import Client, Context, Job, Worker

from _common import DAG_NODES, bench_dag, note, start_server  # bench/ is sys.path[0] when run as a script
from _grpc_floor import grpc_floor
from _pg import CpuSampler, postgres_pids
from _report import MIN_ROUNDS, check_rounds, fmt_spread, postgres_line

KIND = "noop"
DAG = bench_dag(KIND)


def worker_main(address: str, slots: int) -> None:
    worker = Worker(address, slots=slots)

    @worker.handler(KIND)
    async def noop(ctx: Context) -> dict:
        return {"t": time.time()}

    worker.run_sync()


async def wait_all_done(url: str, total_steps: int, timeout: float = 600) -> float:
    """Poll until no step is left to do, then check that `total_steps` steps completed;
    returns the monotonic time the last one finished.

    Called once every step of the phase was submitted. The poll reads only the steps not
    yet terminal (a small partial index), so it costs Postgres little however many steps
    have completed before it.
    """
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = await (await conn.execute(
                "SELECT count(*) FROM cyclone_steps WHERE state NOT IN ('completed', 'discarded', 'cancelled')"
            )).fetchone()
            if row[0] == 0:
                finished = time.monotonic()
                row = await (await conn.execute("SELECT count(*) FROM cyclone_steps WHERE state = 'completed'")).fetchone()
                if row[0] < total_steps:
                    raise SystemExit(f"only {row[0]} of {total_steps} steps completed")
                return finished
            await asyncio.sleep(0.02)
    raise SystemExit(f"timed out waiting for {total_steps} completed steps")


async def submit_concurrently(coros: list, concurrency: int = 64) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(c):
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def wait_workers(client: Client, workers: int, timeout: float = 60) -> None:
    """Until `workers` workers are connected: a phase that started before them would time
    their start-up and a drain of what queued meanwhile, not the phase."""
    deadline = time.monotonic() + timeout
    while len(await client.workers()) < workers:
        if time.monotonic() > deadline:
            raise SystemExit(f"{workers} workers did not connect in {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def bench_cyclone(url: str, address: str, jobs: int, runs: int, batch: int, workers: int,
                        meter: Callable[[], CpuSampler]) -> dict[str, Any]:
    """The phases' rates; `meter()` starts measuring the CPU of the Enqueue-per-job phase."""
    out: dict[str, Any] = {}
    async with Client(address, enqueue_calls=0) as single:
        await wait_workers(single, workers)
        note(f"enqueueing {jobs} standalone jobs, one Enqueue call each")
        sampler = meter()
        t0 = time.monotonic()
        await submit_concurrently([single.enqueue(KIND, {"i": i}) for i in range(jobs)])
        out["jobs_calls_per_s"] = jobs / (time.monotonic() - t0)  # every call answered (its job committed)
        out["jobs_steps_per_s"] = jobs / (await wait_all_done(url, jobs) - t0)
        out["jobs_cpu_us"] = {name: seconds / jobs * 1e6 for name, seconds in sampler.stop().items()}
        done = jobs
    async with Client(address) as client:
        await client.register(DAG)
        note(f"enqueueing {jobs} standalone jobs, one SDK enqueue() each (calls shared)")
        t0 = time.monotonic()
        await submit_concurrently([client.enqueue(KIND, {"i": i}) for i in range(jobs)])
        done += jobs
        out["shared_steps_per_s"] = jobs / (await wait_all_done(url, done) - t0)

        note(f"enqueueing {jobs} standalone jobs, {batch} per EnqueueMany call")
        t0 = time.monotonic()
        await submit_concurrently([client.enqueue_many(Job(KIND, {"i": i}) for i in range(start, min(start + batch, jobs)))
                                   for start in range(0, jobs, batch)], concurrency=4)
        done += jobs
        out["batched_steps_per_s"] = jobs / (await wait_all_done(url, done) - t0)

        note(f"submitting {runs} DAG runs")
        t0 = time.monotonic()
        await submit_concurrently([client.submit("bench_dag", {"i": i}) for i in range(runs)])
        steps = runs * DAG_NODES
        done += steps
        out["dag_steps_per_s"] = steps / (await wait_all_done(url, done) - t0)

        note("measuring dispatch latency")
        # Latency, paced: 200 jobs at about 100/s, so nothing queues behind a backlog.
        for i in range(200):
            await client.enqueue(KIND, {"latency": i})
            await asyncio.sleep(0.01)
        await wait_all_done(url, done + 200)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows = await (await conn.execute(
            "SELECT (s.output ->> 't')::float8 - extract(epoch FROM s.scheduled_at) "
            "FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id WHERE r.input ? 'latency'")).fetchall()
    lat = sorted(r[0] for r in rows)
    out["latency_p50_ms"] = statistics.median(lat) * 1000
    out["latency_p99_ms"] = lat[int(len(lat) * 0.99) - 1] * 1000
    return out


BASELINE_SCHEMA = """
CREATE TABLE raw_runs (id bigserial PRIMARY KEY, state text NOT NULL, input jsonb, result jsonb);
CREATE TABLE raw_steps (id bigserial PRIMARY KEY, run_id bigint NOT NULL REFERENCES raw_runs,
    state text NOT NULL, kind text NOT NULL, priority int NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL DEFAULT now(), lease_owner text, lease_expiry timestamptz,
    lease_generation bigint NOT NULL DEFAULT 0, started_at timestamptz, output jsonb);
CREATE INDEX ON raw_steps (kind, priority, scheduled_at, id) WHERE state = 'available';
"""


async def bench_raw(url: str, jobs: int, connections: int) -> float:
    """The same row work as a standalone job, in plain SQL, from `connections` connections."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(BASELINE_SCHEMA)

    async def producer(n: int) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for i in range(n):
                await conn.execute(
                    "WITH r AS (INSERT INTO raw_runs (state, input) VALUES ('running', %s) RETURNING id) "
                    "INSERT INTO raw_steps (run_id, state, kind) SELECT id, 'available', %s FROM r",
                    (json.dumps({"i": i}), KIND))

    producers = 8
    per = jobs // producers
    total = per * producers

    async def consumer(done: list[int]) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while done[0] < total:
                cur = await conn.execute(
                    "WITH c AS (SELECT id FROM raw_steps WHERE state = 'available' AND kind = %s "
                    "AND scheduled_at <= now() ORDER BY priority, scheduled_at, id LIMIT 32 FOR UPDATE SKIP LOCKED) "
                    "UPDATE raw_steps s SET state = 'running', lease_owner = 'w', lease_expiry = now() + interval '30s', "
                    "lease_generation = lease_generation + 1, started_at = now() FROM c WHERE s.id = c.id "
                    "RETURNING s.id, s.run_id, s.lease_generation", (KIND,))
                claimed = await cur.fetchall()
                if not claimed:
                    await asyncio.sleep(0.005)
                    continue
                async with conn.transaction():
                    for sid, rid, gen in claimed:
                        await conn.execute("SELECT 1 FROM raw_runs WHERE id = %s FOR NO KEY UPDATE", (rid,))
                        await conn.execute("UPDATE raw_steps SET state = 'completed', output = '{}' "
                                           "WHERE id = %s AND state = 'running' AND lease_generation = %s", (sid, gen))
                        await conn.execute("UPDATE raw_runs SET state = 'completed', result = '{}' WHERE id = %s", (rid,))
                done[0] += len(claimed)

    done = [0]
    t0 = time.monotonic()
    await asyncio.gather(*(producer(per) for _ in range(producers)), *(consumer(done) for _ in range(connections)))
    return total / (time.monotonic() - t0)


def one_round(pg: Any, tmp: Path, r: int, args: argparse.Namespace) -> dict[str, Any]:
    """One round: every Cyclone phase on a fresh database, server and workers; then the raw
    SQL baseline on its own fresh database; the databases dropped; then the transport's floor.
    Returns the figures."""
    admin = pg.url("postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE bench_cyclone_{r}")
        c.execute(f"CREATE DATABASE bench_raw_{r}")
    url = pg.url(f"bench_cyclone_{r}")
    migrate(url)
    note(f"round {r + 1}: starting the server and workers")
    server, address = start_server(url, tmp)
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=worker_main, args=(address, args.slots), daemon=True)
               for _ in range(args.workers)]
    for w in workers:
        w.start()
    me, server_pid, worker_pids = os.getpid(), server.pid, [w.pid for w in workers]
    groups = {"server": lambda: [server_pid], "postgres": lambda: postgres_pids(pg),
              "workers": lambda: worker_pids, "client": lambda: [me]}
    try:
        out = asyncio.run(bench_cyclone(url, address, args.jobs, args.runs, args.batch, args.workers,
                                        lambda: CpuSampler(groups)))
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.join(30)
        server.terminate()
        server.wait(30)
    note(f"round {r + 1}: baseline: raw SQL")
    sampler = CpuSampler({"postgres": lambda: postgres_pids(pg), "client": lambda: [me]})
    out["raw_steps_per_s"] = asyncio.run(bench_raw(pg.url(f"bench_raw_{r}"), args.jobs, connections=args.workers * 2))
    out["raw_cpu_us"] = {name: seconds / args.jobs * 1e6 for name, seconds in sampler.stop().items()}
    # Nothing of this round left for Postgres to vacuum or write out in the next one, or
    # under the floor (Postgres idles while it runs).
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"DROP DATABASE bench_cyclone_{r} WITH (FORCE)")
        c.execute(f"DROP DATABASE bench_raw_{r} WITH (FORCE)")
        c.execute("CHECKPOINT")
    note(f"round {r + 1}: floor: a bare grpc.aio server answering Enqueue with a constant")
    out["floor"] = grpc_floor(args.jobs, KIND)
    cpu, floor = out["jobs_cpu_us"], out["floor"]
    # What the Enqueue-per-job phase could reach if the server cost no more per job than the
    # bare constant-answer server does per call, everything else (client, workers, Postgres)
    # costing what it did, and every core busy: server-side work alone cannot go past it.
    out["ceiling"] = (os.cpu_count() or 1) * 1e6 / (floor["server_us"] + floor["client_us"] + cpu["workers"] + cpu["postgres"])
    note(f"round {r + 1}: Enqueue per job {out['jobs_steps_per_s']:.0f} steps/s, raw SQL {out['raw_steps_per_s']:.0f} "
         f"steps/s, ratio {out['jobs_steps_per_s'] / out['raw_steps_per_s']:.2f}")
    return out


def report(rounds: list[dict[str, Any]], args: argparse.Namespace, settings: str) -> None:
    """One table: a column per round, then the median of the rounds. In the ratio rows a
    round's column is that round's ratio, and the last column the ratio of the medians."""
    Get = Callable[[dict[str, Any]], float]

    def med(get: Get) -> float:
        return statistics.median(get(o) for o in rounds)

    def figure(*path: str) -> Get:
        """A round's figure at `path` in its results (one_round's dict)."""
        def get(o: Any) -> float:
            for key in path:
                o = o[key]
            return o
        return get

    measures: list[tuple[str, Get, str]] = [
        ("standalone jobs, Enqueue per job", figure("jobs_steps_per_s"), "steps/s"),
        ("standalone jobs, SDK enqueue() per job, calls shared", figure("shared_steps_per_s"), "steps/s"),
        (f"standalone jobs, EnqueueMany ({args.batch}/call)", figure("batched_steps_per_s"), "steps/s"),
        ("DAG runs (10 nodes), end to end", figure("dag_steps_per_s"), "steps/s"),
        ("dispatch latency p50", figure("latency_p50_ms"), "ms"),
        ("dispatch latency p99", figure("latency_p99_ms"), "ms"),
        ("baseline: raw SQL, same row work", figure("raw_steps_per_s"), "steps/s"),
        ("Enqueue calls answered, while the workers drain", figure("jobs_calls_per_s"), "calls/s"),
        ("floor: bare grpc.aio Enqueue, same client", figure("floor", "calls_per_s"), "calls/s"),
        ("floor: CPU per call, server", figure("floor", "server_us"), "us"),
        ("floor: CPU per call, client", figure("floor", "client_us"), "us"),
        *[(f"CPU per job, Enqueue per job: {who}", figure("jobs_cpu_us", who), "us")
          for who in ("server", "postgres", "workers", "client")],
        *[(f"CPU per job, raw SQL: {who}", figure("raw_cpu_us", who), "us") for who in ("postgres", "client")],
        ("ceiling: Enqueue per job with the server at the floor", figure("ceiling"), "steps/s"),
    ]
    raw = figure("raw_steps_per_s")
    ratios: list[tuple[str, Get, Get]] = [
        ("ratio: Enqueue per job / raw SQL", figure("jobs_steps_per_s"), raw),
        ("ratio: SDK enqueue() per job / raw SQL", figure("shared_steps_per_s"), raw),
        ("ratio: EnqueueMany / raw SQL", figure("batched_steps_per_s"), raw),
        ("ratio: ceiling / raw SQL", figure("ceiling"), raw),
        ("ratio: Enqueue calls answered / floor", figure("jobs_calls_per_s"), figure("floor", "calls_per_s")),
    ]
    table: list[list[str]] = []
    for name, get, unit in measures:
        fmt = "{:,.1f}" if unit == "ms" else "{:,.0f}"
        table.append([name, unit, *[fmt.format(get(o)) for o in rounds], fmt_spread([get(o) for o in rounds], fmt)])
    for name, top, bottom in ratios:
        each = [top(o) / bottom(o) for o in rounds]
        table.append([name, "", *[f"{x:.2f}" for x in each],
                      f"{med(top) / med(bottom):.2f} (min {min(each):.2f}, max {max(each):.2f})"])
    header = ["measure", "unit", *[f"round {i + 1}" for i in range(len(rounds))], "median (min, max)"]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    print(f"\njobs={args.jobs} runs={args.runs} workers={args.workers} slots={args.slots} batch={args.batch} "
          f"rounds={len(rounds)} cores={os.cpu_count()} load(1,5,15)={tuple(round(x, 2) for x in os.getloadavg())}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in table:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), *(c.rjust(w) for c, w in zip(row[2:], widths[2:]))]
        print("| " + " | ".join(cells) + " |")
    print("(ratio rows: a round's column is that round's ratio; the last column is the ratio of the medians, "
          "with the min and max of the rounds' ratios)")
    print(settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100, help="jobs per EnqueueMany call")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="each figure is the median of this many rounds")
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)

    with tempfile.TemporaryDirectory(prefix="cyclone-bench-") as tmp:
        pg = start_embedded(Path(tmp) / "pg")  # durable: the default
        try:
            settings = postgres_line(pg.url("postgres"))
            note(settings)
            rounds = [one_round(pg, Path(tmp), r, args) for r in range(args.rounds)]
        finally:
            pg.stop()
    report(rounds, args, settings)


if __name__ == "__main__":
    main()
