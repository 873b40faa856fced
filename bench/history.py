"""History on the hot path: a drain beside ten million terminal steps, against one beside none.

    nice -n 19 .venv/bin/python bench/history.py [--history 10000000] [--jobs 50000] [--rounds 5]
    nice -n 19 .venv/bin/python bench/history.py --embedded       # the embedded Postgres 18
    nice -n 19 .venv/bin/python bench/history.py --parts purge    # only the removal of a day

Two databases of one Postgres, made once and migrated, their days of history (migration 0014)
laid out from --history / --day days before today (UTC): `empty`, and `history` with --history
terminal one-step runs (completed, their output stored), --day of them on each of those days,
made through the day (their ids carry their creation time, as the engine's do), committed
1,000,000 per transaction, then VACUUM ANALYZE and a CHECKPOINT (what autovacuum and the
checkpointer do while history piles up). Each round, in each database in turn: --jobs jobs
committed through `cyclone_jobs_enqueue` (5,000 per call), VACUUM ANALYZE and a CHECKPOINT (as
burst.py's backlog), then a fresh `cyclone-server` and two SDK workers x 64 slots drain them,
timed from the go to the --jobs-th finished run; then, the queue empty, a fresh server and one
SDK worker take --latency lone jobs enqueued one at a time 10 ms apart (latency.py's measure):
their dispatch latency, scheduled_at to handler start. It prints each case's rate and latency
p50 / p99 per round, the medians with min and max, the ratios history/empty per round and
their medians, the tables' and indexes' sizes, and the Postgres version and settings. The
targets (issue 35): drain history/empty >= 0.95, latency within 5%.

The purge part (--parts purge), in the history database, each round: a drain of --purge-jobs
jobs alone; another with the oldest day of history (--day runs) removed beside it from 1 s
after its go, as the retention sweep removes it (`Engine.drop_history_day`: the day's runs
read in paced slices, its partitions detached and dropped; then `Engine.tidy_history`); the
day loaded again, removed with nothing beside, and loaded again. It prints the removal's
seconds beside the drain and alone; the two drains' rates over the same seconds after their
go (those of the removal, at least 1 s) and their ratio; and the whole drains' rates and
their ratio. (A drain's rate is not steady enough to be its own baseline: on Postgres 15
with autovacuum off it falls as dead entries pile up at the claim index's head.) The
targets (issue 35): a day of 1,000,000 runs removed in <= 10 s, the drain beside it >= 0.9
of the drain alone. The drained jobs stay as history (today's), a few hundred thousand
beside the millions.

--dsn (default the machine's Postgres 15) needs a role that may create databases and run
CHECKPOINT. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from cyclone_server.store.engine import Engine
from cyclone_server.store.migrate import migrate

# bench/ is sys.path[0] when run as a script
import latency
from _common import note, start_server
from _drain import fmt_int, print_rows
from _pg import MARK, create_db, settle, start_postgres
from _report import MIN_ROUNDS, fmt_spread, postgres_line
from burst import DEFAULT_DSN, External, commit_of_checkout, drain_first, enqueue

CHUNK = 1_000_000  # terminal runs per transaction of the load
PURGE_BATCH = 1000  # runs per purge call, as `cyclone runs purge` and the retention sweep

# One-step runs of kind "work" that completed, made through one UTC day (a day of history: the
# day of their ids, as the engine makes them), each ending a second after it began; the step as
# the engine leaves it (leased once, its output stored).
INSERT_HISTORY = f"""
WITH r AS (
    INSERT INTO cyclone_runs (id, state, input, result, created_at, updated_at, finished_at)
    SELECT encode(set_byte(substring(int8send((extract(epoch FROM t) * 1000)::bigint) FROM 3)
                           || substring(uuid_send(gen_random_uuid()) FROM 7), 6,
                           112 | (get_byte(uuid_send(gen_random_uuid()), 6) & 15)), 'hex')::uuid,
           'completed', jsonb_build_object('order', i),
           jsonb_build_object('work', jsonb_build_object('shipped', i)), t, t + interval '1 s', t + interval '1 s'
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i,
           LATERAL (SELECT %(day)s::timestamptz + (i - 1) * (interval '1 day' - interval '2 s') / %(per_day)s AS t) AS x
    RETURNING id, result, created_at, finished_at)
INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims, attempt_timeout,
                           backoff_initial, backoff_max, scheduled_at, lease_generation, lease_owner,
                           output, errors, created_at, started_at, finished_at)
SELECT {MARK} cyclone__step_uuid(r.id), r.id, 'work', 'work', 'task', 'completed', 25, 5, interval '10 min',
       interval '1 s', interval '10 min', r.created_at, 1, 'bench-worker', r.result -> 'work', '[]'::jsonb,
       r.created_at, r.created_at, r.finished_at
  FROM r
"""

SIZES = f"""
SELECT {MARK} t.name, pg_size_pretty(sum(pg_table_size(p.relid))) AS table_size,
       pg_size_pretty(sum(pg_indexes_size(p.relid))) AS indexes_size
  FROM unnest(ARRAY['cyclone_runs', 'cyclone_steps']) AS t (name), pg_partition_tree(t.name::regclass) p
 WHERE p.isleaf GROUP BY t.name ORDER BY 1
"""

TABLES = ("cyclone_runs", "cyclone_steps", "cyclone_step_deps")


def drop_days(c: psycopg.Connection) -> None:
    """Every day of history detached and dropped (the tables empty)."""
    for (suffix,) in c.execute("SELECT suffix FROM cyclone_history_days").fetchall():
        for t in TABLES:
            c.execute(f"ALTER TABLE {t} DETACH PARTITION {t}_{suffix}")
            c.execute(f"DROP TABLE {t}_{suffix}")
    c.execute("DELETE FROM cyclone_history_days")


def lay_out_days(url: str, days: int) -> None:
    """On a database just migrated (empty tables): history begins `days` days before today
    (UTC), a partition per day from then to two days ahead (what a database that has run that
    long holds), and the first partition all before; the days that ended settled, as the
    servers that ran all that time would have found them (migration 0015)."""
    with psycopg.connect(url, autocommit=True) as c:
        drop_days(c)
        c.execute("SELECT cyclone__history_day_make(NULL, cyclone__day_uuid(now() - make_interval(days => %s)), "
                  "'first', NULL)", (days,))
        c.execute("SELECT cyclone_history_ensure()")
        c.execute("SELECT cyclone__history_day_settle(d.lo) FROM cyclone__history_days_unsettled(now()) AS d (lo)")


def make_day(url: str, days_ago: int) -> None:
    """The partitions of the day `days_ago` days before today again, after it was dropped."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT cyclone__history_day_make(cyclone__day_uuid(d), cyclone__day_uuid(d + interval '1 day'), "
                  "to_char(d, 'YYYYMMDD'), (SELECT x.suffix FROM cyclone_history_days x ORDER BY x.hi DESC LIMIT 1)) "
                  "FROM (SELECT ((now() AT TIME ZONE 'UTC')::date - %s)::timestamp AT TIME ZONE 'UTC' AS d) y",
                  (days_ago,))


def load_history(url: str, total: int, per_day: int, first_day: int) -> float:
    """`total` terminal runs, `per_day` on each day from `first_day` days before today on."""
    t = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        for d in range(0, total, per_day):
            day = c.execute(f"SELECT {MARK} date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
                            "- make_interval(days => %s)", (first_day - d // per_day,)).fetchone()[0]
            for first in range(1, per_day + 1, CHUNK):
                c.execute(INSERT_HISTORY, {"first": first, "last": min(first + CHUNK - 1, per_day),
                                           "per_day": per_day, "day": day})
            note(f"  history: {d + per_day:,} runs")
    settle(url)
    return time.monotonic() - t


def remove_day(url: str, delay: float = 0.0) -> dict[str, float]:
    """The oldest day of history removed as the retention sweep removes it: its runs read in
    paced slices and its partitions dropped (`Engine.drop_history_day`, the empty days before
    it first), then what it left in other tables (`Engine.tidy_history`, in calls of 1,000).
    `delay` seconds first."""
    time.sleep(delay)
    return asyncio.run(_remove_day(url))


async def _remove_day(url: str) -> dict[str, float]:
    engine = await Engine.open(url, min_size=1, max_size=1)
    try:
        start = time.time()
        while True:
            n = await engine.drop_history_day(3600.0)
            if n is None:
                raise SystemExit("no day of history may go")
            if n > 0:
                break
        while await engine.tidy_history(PURGE_BATCH) >= PURGE_BATCH:
            pass
        return {"start": start, "end": time.time(), "deleted": n}
    finally:
        await engine.close()


def finished_between(url: str, start: float, end: float) -> int:
    """Runs finished in [start, end) (epoch seconds): a drain's, when after its go."""
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(f"SELECT {MARK} count(*) FROM cyclone_runs WHERE finished_at >= to_timestamp(%s) "
                         "AND finished_at < to_timestamp(%s)", (start, end)).fetchone()[0]


def purge_round(pg, db: str, day: int, days: int, jobs: int, timeout: float, workdir: Path) -> dict[str, float]:
    """One round of the purge part: a drain alone, a drain with the oldest day (`days` days
    ago, `day` runs) removed beside it (from 1 s after the go), the day loaded again, removed
    with nothing beside, loaded again. The drains' rates are compared over the same seconds
    after their go: those of the removal, at least one."""
    url = pg.url(db)
    enqueue(url, jobs)
    settle(url)
    alone = drain_first(pg, db, jobs, timeout, workdir)
    enqueue(url, jobs)
    settle(url)
    mixed = drain_first(pg, db, jobs, timeout, workdir, beside=lambda: remove_day(url, delay=1.0))
    p = mixed["beside"]
    if p["deleted"] != day:
        raise SystemExit(f"the removal took {p['deleted']:,} runs, not {day:,}")
    # The window: the removal's seconds (at least one), cut at the end of the shorter drain.
    a = p["start"] - mixed["t0"]
    b = min(max(p["end"] - mixed["t0"], a + 1.0), mixed["seconds"], alone["seconds"])
    if b - a < 1:
        raise SystemExit(f"the drains ended {b - a:.1f} s into the removal: raise --purge-jobs")
    rate_alone = finished_between(url, alone["t0"] + a, alone["t0"] + b) / (b - a)
    rate_mixed = finished_between(url, mixed["t0"] + a, mixed["t0"] + b) / (b - a)
    make_day(url, days)
    load_history(url, day, day, days)
    idle = remove_day(url)
    make_day(url, days)
    load_history(url, day, day, days)
    return {"removal beside a drain, s": p["end"] - p["start"], "removal alone, s": idle["end"] - idle["start"],
            "drain alone, jobs/s": rate_alone, "drain beside the removal, jobs/s": rate_mixed,
            "window, s": b - a, "whole drain alone, jobs/s": jobs / alone["seconds"],
            "whole drain with the removal, jobs/s": jobs / mixed["seconds"]}


def sizes(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as c:
        return ", ".join(f"{name} {table} + indexes {idx}" for name, table, idx in c.execute(SIZES).fetchall())


def drain(pg, db: str, jobs: int, timeout: float, workdir: Path) -> float:
    """`jobs` committed and settled, then drained: the seconds to the last's finish."""
    url = pg.url(db)
    enqueue(url, jobs)
    settle(url)
    return drain_first(pg, db, jobs, timeout, workdir)["seconds"]


def dispatch_latency(pg, db: str, jobs: int, workdir: Path) -> tuple[float, float]:
    """p50 and p99 of `jobs` lone jobs' dispatch latency (scheduled_at to handler start), in ms."""
    url = pg.url(db)
    server, address = start_server(url, workdir)
    worker = mp.get_context("spawn").Process(target=latency.worker_main, args=(address,), daemon=True)
    try:
        worker.start()
        waits = sorted(asyncio.run(latency.measure(address, url, jobs))["scheduled_at -> handler"])
    finally:
        worker.terminate()
        worker.join(10)
        server.terminate()
        server.wait(30)
    with psycopg.connect(url, autocommit=True) as c:  # the next round's measure counts its own jobs only
        c.execute(f"WITH s AS (DELETE {MARK} FROM cyclone_steps WHERE kind = %s RETURNING run_id) "
                  "DELETE FROM cyclone_runs r USING s WHERE r.id = s.run_id", (latency.KIND,))
    return statistics.median(waits) * 1000, waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=10_000_000, help="terminal steps (one-step runs) of history")
    ap.add_argument("--jobs", type=int, default=50_000, help="jobs drained per round and case")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--dsn", default=DEFAULT_DSN, help=f"a Postgres server's URL (default {DEFAULT_DSN})")
    ap.add_argument("--embedded", action="store_true", help="an embedded Postgres 18 instead of --dsn")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds one drain may take")
    ap.add_argument("--latency", type=int, default=200, help="lone jobs timed per round and case (0: none)")
    ap.add_argument("--parts", default="drain,purge",
                    help="drain: beside history / none; purge: a day of history purged beside a drain")
    ap.add_argument("--day", type=int, default=1_000_000, help="runs of history per day (the purge part removes one)")
    ap.add_argument("--purge-jobs", type=int, default=150_000,
                    help="jobs of each drain of the purge part (it must outlast the purge)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"drain", "purge"} or args.day > args.history or args.history % args.day:
        ap.error("--parts takes drain and purge; --history a multiple of --day")
    days = args.history // args.day
    if args.rounds < MIN_ROUNDS:
        note(f"{args.rounds} rounds: fewer than {MIN_ROUNDS} is a probe, not a figure")
    with tempfile.TemporaryDirectory(prefix="cyclone-history-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(workdir / "pg") if args.embedded else External(args.dsn)
        dbs = {"empty": "bench_history_empty", "history": "bench_history_full"}
        if "drain" not in parts:
            del dbs["empty"]
        try:
            settings = postgres_line(pg.url())
            note(settings)
            for case, db in dbs.items():
                url = create_db(pg, db)
                migrate(url)
                lay_out_days(url, days + 1)  # (the day before the first of history: empty)
                if case == "history":
                    note(f"history: loading {args.history:,} terminal runs and steps over {days} days")
                    took = load_history(url, args.history, args.day, days)
                    note(f"history: loaded and settled in {took:.0f} s")
            if "drain" in parts:
                drain_part(pg, dbs, args, settings, workdir)
            if "purge" in parts:
                purge_part(pg, dbs["history"], args, days, settings, workdir)
        finally:
            with psycopg.connect(pg.url(), autocommit=True) as c:
                for db in dbs.values():
                    c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            if args.embedded:
                pg.stop()


def purge_part(pg, db: str, args: argparse.Namespace, days: int, settings: str, workdir: Path) -> None:
    rounds = []
    for r in range(args.rounds):
        rounds.append(purge_round(pg, db, args.day, days, args.purge_jobs, args.timeout, workdir))
        note(f"purge round {r + 1}: " + ", ".join(f"{k} {v:,.1f}" for k, v in rounds[-1].items()))
    print(f"\npurge: the oldest day of history ({args.day:,} of {args.history:,} terminal runs) removed as the "
          f"retention sweep removes it, alone and beside a drain of {args.purge_jobs:,} jobs (2 workers x 64 slots; "
          f"rates over the removal's seconds), {len(rounds)} rounds, commit {commit_of_checkout()}, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    rows = [[k, *[f"{x[k]:,.1f}" for x in rounds], fmt_spread([x[k] for x in rounds], "{:,.1f}")] for k in rounds[0]]
    ratios = [x["drain beside the removal, jobs/s"] / x["drain alone, jobs/s"] for x in rounds]
    rows.append(["drain beside / alone, over the window", *[f"{x:.2f}" for x in ratios], fmt_spread(ratios, "{:.2f}")])
    whole = [x["whole drain with the removal, jobs/s"] / x["whole drain alone, jobs/s"] for x in rounds]
    rows.append(["whole drain with / without", *[f"{x:.2f}" for x in whole], fmt_spread(whole, "{:.2f}")])
    print_rows(["", *[f"round {i + 1}" for i in range(len(rounds))], "median (min, max)"], rows)


def drain_part(pg, dbs: dict[str, str], args: argparse.Namespace, settings: str, workdir: Path) -> None:
    rounds: list[dict[str, float]] = []
    lat: list[dict[str, tuple[float, float]]] = []
    for r in range(args.rounds):
        rates, ms = {}, {}
        for case, db in dbs.items():
            seconds = drain(pg, db, args.jobs, args.timeout, workdir)
            rates[case] = args.jobs / seconds
            note(f"round {r + 1}: {case} {rates[case]:,.0f} jobs/s")
            if args.latency:
                ms[case] = dispatch_latency(pg, db, args.latency, workdir)
                note(f"round {r + 1}: {case} dispatch latency p50 {ms[case][0]:.2f} ms, p99 {ms[case][1]:.2f} ms")
        rounds.append(rates)
        lat.append(ms)
    print(f"\nhistory: {args.jobs:,} jobs drained beside {args.history:,} terminal steps / none, "
          f"Cyclone 2 workers x 64 slots, {len(rounds)} rounds, commit {commit_of_checkout()}, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    for case, db in dbs.items():
        print(f"{case}: {sizes(pg.url(db))}")
    rows = [[f"{case}, jobs/s", *[fmt_int(x[case]) for x in rounds], fmt_spread([x[case] for x in rounds])]
            for case in dbs]
    ratios = [x["history"] / x["empty"] for x in rounds]
    rows.append(["history / empty", *[f"{x:.2f}" for x in ratios], fmt_spread(ratios, "{:.2f}")])
    if args.latency:
        for q, name in ((0, "p50"), (1, "p99")):
            for case in dbs:
                values = [x[case][q] for x in lat]
                rows.append([f"{case}, dispatch latency {name} ms", *[f"{v:.2f}" for v in values],
                             fmt_spread(values, "{:.2f}")])
            ratios = [x["history"][q] / x["empty"][q] for x in lat]
            rows.append([f"latency {name} history / empty", *[f"{v:.2f}" for v in ratios],
                         fmt_spread(ratios, "{:.2f}")])
    print_rows(["", *[f"round {i + 1}" for i in range(len(rounds))], "median (min, max)"], rows)


if __name__ == "__main__":
    main()
