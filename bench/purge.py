"""Whether purging a million terminal runs holds up claims: claim latency with and without the retention sweep.

    .venv/bin/python bench/purge.py [--runs 1000000] [--claimers 4] [--batch 1000] [--pass-batches 20] [--rounds 5]

On an embedded Postgres with durable commits (fsync and synchronous_commit on), the script
bulk-inserts --runs terminal runs that finished two days ago, each with one step, as the
engine leaves them (90 % completed with their output, 10 % failed with a discarded step),
plus a live queue of available steps of another kind. --claimers tasks loop Engine.claim
(one step) + Engine.complete throughout, and the latency of each cycle is recorded:

1. baseline: --baseline seconds with nothing else running;
2. then the retention sweep's work as Background does it: passes of up to --pass-batches
   calls of Engine.purge(age=1 h, limit=--batch, sweep=True), back to back, until a call
   deletes fewer than --batch runs. After each pass the purge pauses as long as the pass
   took, so claims are measured both during passes and between them: interleaved windows,
   which keep the comparison fair on a machine whose other load changes over minutes.

It prints the latency per window kind, the ratio of "purge passes" to "baseline" and to
"between passes", the purge rate and the time of one batch (one transaction), and checks
that exactly the old runs (and their steps) were deleted; per round (each on a fresh
database), then a table of the rounds and their median with min and max, under the
Postgres version and settings.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cyclone_server.serve.background import RETENTION_BATCH, RETENTION_MAX_BATCHES  # noqa: E402
from cyclone_server.store.embedded import start_embedded  # noqa: E402
from cyclone_server.store.engine import Engine  # noqa: E402
from cyclone_server.store.migrate import migrate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import MIN_ROUNDS, check_rounds, percentile_ms, postgres_line, print_rounds  # noqa: E402

LIVE_KIND = "live"
CLAIM_APP = "cyclone-bench-claims"  # application_name of the claim connections
PURGE_AGE = 3600.0  # seconds: the bulk runs finished two days ago, the live ones just now

# Terminal standalone jobs (node "work"), one per millisecond two days ago. cyclone_uuid7()
# keeps ids time-ordered as the engine makes them; every 10th run failed.
INSERT_OLD_RUNS = """
INSERT INTO cyclone_runs (id, state, input, result, failed_by_step, created_at, updated_at, finished_at)
SELECT cyclone_uuid7(), CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END,
       jsonb_build_object('order', i), CASE WHEN i %% 10 = 0 THEN NULL
                                            ELSE jsonb_build_object('work', jsonb_build_object('shipped', i)) END,
       NULL, t, t + interval '1 s', t + interval '1 s'
  FROM generate_series(1, %(runs)s) AS i,
       LATERAL (SELECT now() - interval '2 days' + i * interval '1 ms' AS t) AS x
"""
INSERT_OLD_STEPS = """
INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims, attempt_timeout,
                           backoff_initial, backoff_max, scheduled_at, lease_generation, lease_owner,
                           output, error_kind, errors, created_at, started_at, finished_at)
SELECT cyclone_uuid7(), r.id, 'work', 'work', 'task', CASE r.state WHEN 'failed' THEN 'discarded' ELSE 'completed' END,
       25, 5, interval '10 min', interval '1 s', interval '10 min', r.created_at, 1, 'bench-worker',
       r.result -> 'work', CASE r.state WHEN 'failed' THEN 'permanent' END,
       CASE r.state WHEN 'failed' THEN jsonb_build_array(jsonb_build_object(
           'attempt', 1, 'error_kind', 'permanent', 'message', 'card declined', 'at', r.finished_at))
            ELSE '[]'::jsonb END,
       r.created_at, r.created_at, r.finished_at
  FROM cyclone_runs r
 WHERE r.state IN ('completed', 'failed')
"""
LINK_FAILED = """
UPDATE cyclone_runs r SET failed_by_step = s.id FROM cyclone_steps s WHERE s.run_id = r.id AND r.state = 'failed'
"""
# The live queue: running one-node runs whose step is available now.
INSERT_LIVE_RUNS = """
INSERT INTO cyclone_runs (id, state, input) SELECT cyclone_uuid7(), 'running', jsonb_build_object('n', i)
  FROM generate_series(1, %(queue)s) AS i
"""
INSERT_LIVE_STEPS = """
INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims, attempt_timeout,
                           backoff_initial, backoff_max, scheduled_at)
SELECT cyclone_uuid7(), r.id, 'live', 'live', 'task', 'available', 25, 5, interval '10 min', interval '1 s',
       interval '10 min', r.created_at
  FROM cyclone_runs r WHERE r.state = 'running'
"""


@dataclass
class Sample:
    at: float  # monotonic start of the cycle
    claim: float  # seconds for Engine.claim
    cycle: float  # seconds for claim + complete


@dataclass
class Load:
    samples: list[Sample] = field(default_factory=list)
    empty: int = 0  # claims that found nothing (the live queue ran dry: too small for the run)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # (time, claim connections waiting on a row or table lock, on the NOTIFY queue lock, busy at all):
    # pg_stat_activity samples.
    lock_samples: list[tuple[float, int, int, int]] = field(default_factory=list)


async def claimer(engine: Engine, name: str, load: Load) -> None:
    while not load.stop.is_set():
        t0 = time.perf_counter()
        rows = await engine.claim(name, [LIVE_KIND], 1, lease_ttl=30)
        t1 = time.perf_counter()
        if not rows:
            load.empty += 1
            await asyncio.sleep(0.01)
            continue
        status = await engine.complete(str(rows[0]["step_id"]), rows[0]["lease_generation"], {"ok": True})
        assert status == "applied", status
        load.samples.append(Sample(t0, t1 - t0, time.perf_counter() - t0))


async def watch_locks(url: str, load: Load) -> None:
    """Sample pg_stat_activity: is a claim connection waiting on a lock, one the purge could hold?

    Lock waits on "object" are the NOTIFY queue's lock, which every committing transaction
    that notified takes (a completion that ends a run notifies): those are counted apart.
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not load.stop.is_set():
            row = await (await conn.execute(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event <> 'object'), "
                "count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'object'), "
                "count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity WHERE application_name = %s",
                (CLAIM_APP,))).fetchone()
            assert row is not None
            load.lock_samples.append((time.perf_counter(), *row))
            await asyncio.sleep(0.02)


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(p50, p99, max) in milliseconds."""
    v = sorted(values)
    if not v:
        return (float("nan"),) * 3
    return percentile_ms(v, 0.5), percentile_ms(v, 0.99), v[-1] * 1000


def prepare(url: str, runs: int, queue: int) -> None:
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        t = time.perf_counter()
        with conn.transaction():
            conn.execute(INSERT_OLD_RUNS, {"runs": runs})
            conn.execute(INSERT_OLD_STEPS)
            conn.execute(LINK_FAILED)
        with conn.transaction():
            conn.execute(INSERT_LIVE_RUNS, {"queue": queue})
            conn.execute(INSERT_LIVE_STEPS)
        print(f"inserted {runs:,} terminal runs + steps and a live queue of {queue:,} in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        # What autovacuum would have done long before the retention sweep reaches these rows.
        t = time.perf_counter()
        conn.execute("VACUUM ANALYZE cyclone_runs")
        conn.execute("VACUUM ANALYZE cyclone_steps")
        conn.execute("CHECKPOINT")
        print(f"vacuum analyze + checkpoint in {time.perf_counter() - t:.1f} s", flush=True)


async def purge_passes(retention: Engine, batch: int, per_pass: int,
                       windows: list[tuple[str, float, float]], batches: list[float]) -> int:
    """Background's retention passes (up to `per_pass` batches, until one comes back short), each followed by
    an idle window as long as the pass; returns the runs deleted. Windows are recorded for the report."""
    deleted, done = 0, False
    while not done:
        start = time.perf_counter()
        for _ in range(per_pass):
            t = time.perf_counter()
            n = await retention.purge(PURGE_AGE, limit=batch, sweep=True)  # as Background calls it
            batches.append(time.perf_counter() - t)
            deleted += n
            if n < batch:
                done = True
                break
        end = time.perf_counter()
        windows.append(("purge passes", start, end))
        if not done:
            await asyncio.sleep(end - start)
            windows.append(("between passes", end, time.perf_counter()))
    return deleted


async def measure(url: str, runs: int, claimers: int, batch: int, per_pass: int, baseline: float) -> dict[str, float]:
    work = await Engine.open(make_conninfo(url, application_name=CLAIM_APP), min_size=claimers, max_size=claimers)
    retention = await Engine.open(url, min_size=1, max_size=1)
    load = Load()
    tasks = [asyncio.create_task(claimer(work, f"bench-{i}", load)) for i in range(claimers)]
    tasks.append(asyncio.create_task(watch_locks(url, load)))
    batches: list[float] = []
    windows: list[tuple[str, float, float]] = []
    try:
        t_base = time.perf_counter()
        await asyncio.sleep(baseline)
        windows.append(("baseline", t_base, time.perf_counter()))
        deleted = await purge_passes(retention, batch, per_pass, windows, batches)
    finally:
        load.stop.set()
        await asyncio.gather(*tasks)
        await work.close()
        await retention.close()

    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM cyclone_runs WHERE finished_at < now() - interval '1 hour'"
                            ).fetchone()[0]
        old_steps = conn.execute("SELECT count(*) FROM cyclone_steps WHERE kind = 'work'").fetchone()[0]
    if left or old_steps or deleted != runs:
        raise SystemExit(f"purge incomplete: deleted {deleted:,}, {left:,} old runs and {old_steps:,} steps left")
    if load.empty:
        raise SystemExit(f"the live queue ran dry ({load.empty} empty claims): raise --queue")

    rows, locks = {}, {}
    for name in ("baseline", "between passes", "purge passes"):
        spans = [(s, e) for n, s, e in windows if n == name]
        ss = [x for x in load.samples if any(s <= x.at < e for s, e in spans)]
        seconds = sum(e - s for s, e in spans)
        if not seconds:  # a purge done in one pass has no pause after it
            continue
        rows[name] = (len(ss), len(ss) / seconds, *quantiles([x.claim for x in ss]), *quantiles([x.cycle for x in ss]))
        ls = [x for x in load.lock_samples if any(s <= x[0] < e for s, e in spans)]
        locks[name] = (sum(1 for x in ls if x[1]), sum(1 for x in ls if x[2]), len(ls))
    print(f"\n{claimers} claim tasks (Engine.claim of 1 step + Engine.complete), durable commits; times in ms")
    print(f"{'':<22} {'cycles':>7} {'cycles/s':>9} {'claim p50':>10} {'p99':>8} {'max':>8} "
          f"{'cycle p50':>10} {'p99':>8} {'max':>8}")
    for name, (n, rate, *q) in rows.items():
        print(f"{name:<22} {n:>7} {rate:>9.0f} {q[0]:>10.2f} {q[1]:>8.2f} {q[2]:>8.1f} "
              f"{q[3]:>10.2f} {q[4]:>8.2f} {q[5]:>8.1f}")
    during = rows["purge passes"]
    for name in [n for n in ("baseline", "between passes") if n in rows]:
        ratio = [d / b for d, b in zip(during[1:], rows[name][1:], strict=True)]
        print(f"{'ratio passes / ' + name.split()[0]:<22} {'':>7} {ratio[0]:>8.2f}x " + " ".join(
            f"{r:>{w}.2f}x" for r, w in zip(ratio[1:], (9, 7, 7, 9, 7, 7), strict=True)))
    active = sum(e - s for n, s, e in windows if n == "purge passes")
    wall = windows[-1][2] - windows[1][1]
    b50, b99, bmax = quantiles(batches)
    print(f"\npurge: {deleted:,} runs (+ {deleted:,} steps) in {len(batches)} batches of {batch} "
          f"(passes of {per_pass}): {deleted / active:,.0f} runs/s while purging ({active:.1f} s), "
          f"{deleted / wall:,.0f} runs/s with the pauses ({wall:.1f} s)")
    print(f"one batch (one transaction): p50 {b50:.1f} ms, p99 {b99:.1f} ms, max {bmax:.1f} ms")
    print("samples of pg_stat_activity (every 20 ms) with a claim connection waiting on a row or table lock / "
          "on the NOTIFY queue lock: " + ", ".join(f"{name} {w} / {nq} of {n}" for name, (w, nq, n) in locks.items()))
    base = rows["baseline"]
    return {"rate": during[1] / base[1], "claim_p50": during[2] / base[2], "claim_p99": during[3] / base[3],
            "cycle_p50": during[5] / base[5], "cycle_p99": during[6] / base[6], "purged": deleted / active,
            "batch_p50": b50, "batch_p99": b99}


FIGURES = [("rate", "claim cycles/s, purge passes / baseline", "{:.2f}"),
           ("claim_p50", "claim p50, purge passes / baseline", "{:.2f}"),
           ("claim_p99", "claim p99, purge passes / baseline", "{:.2f}"),
           ("cycle_p50", "cycle p50, purge passes / baseline", "{:.2f}"),
           ("cycle_p99", "cycle p99, purge passes / baseline", "{:.2f}"),
           ("purged", "runs purged per second while purging", "{:,.0f}"),
           ("batch_p50", "one batch (one transaction), p50 ms", "{:.1f}"),
           ("batch_p99", "one batch (one transaction), p99 ms", "{:.1f}")]


def create_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(**{**conninfo_to_dict(admin_url), "dbname": name})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1_000_000, help="terminal runs to purge")
    p.add_argument("--queue", type=int, default=300_000, help="available steps in the live queue")
    p.add_argument("--claimers", type=int, default=4, help="concurrent claim + complete loops")
    p.add_argument("--batch", type=int, default=RETENTION_BATCH, help="purge limit per call (as Background)")
    p.add_argument("--pass-batches", type=int, default=RETENTION_MAX_BATCHES, help="batches per pass (as Background)")
    p.add_argument("--baseline", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--database-url", help="a database on the server to measure, whose role may create databases: "
                                          "each round makes and drops one of its own there "
                                          "(default: embedded Postgres in a temp dir)")
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="each round on a fresh database")
    args = p.parse_args()
    check_rounds(p, args.rounds, lambda text: print(text, flush=True))
    started = time.perf_counter()

    def rounds_on(admin_url: str) -> tuple[str, list[dict[str, float]]]:
        settings = postgres_line(admin_url)
        out = []
        for r in range(args.rounds):
            name = f"cyclone_bench_purge_{r}"
            url = create_database(admin_url, name)
            try:
                prepare(url, args.runs, args.queue)
                out.append(asyncio.run(measure(url, args.runs, args.claimers, args.batch, args.pass_batches,
                                               args.baseline)))
            finally:  # a round that fails leaves no million runs on the server
                with psycopg.connect(admin_url, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        return settings, out

    if args.database_url:
        settings, rounds = rounds_on(args.database_url)
    else:
        with tempfile.TemporaryDirectory(prefix="cyclone-purge-") as tmp:
            pg = start_embedded(Path(tmp) / "pg")  # durable: fsync and synchronous_commit stay on
            try:
                settings, rounds = rounds_on(pg.url())
            finally:
                pg.stop()
    print(f"\nruns={args.runs:,} rounds={args.rounds} date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    print_rounds(FIGURES, rounds)
    print(f"(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
