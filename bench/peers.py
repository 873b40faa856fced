"""Drain against the peers: the same backlog drained by raw SQL, PgQueuer and Cyclone, one Postgres.

    .venv/bin/python bench/peers.py [--jobs 20000] [--rounds 5] [--only raw1,raw10,pgq,pgqpsy,cyc2,cyc1,cyc2p2,dag2]
    .venv/bin/python bench/peers.py --backlog [--backlog-size 1000000] [--backlog-small 10000] [--backlog-tuned]
    .venv/bin/python bench/peers.py --backlog-twice [--backlog-size 1000000] [--backlog-rounds 5]
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
- pgq: PgQueuer 1.6 (its own schema) set up as its own benchmark tool sets it up
  (tools/benchmark.py's defaults, which its docs/benchmark.md runs): the asyncpg driver, 5
  queue managers in one process on uvloop, batch size 10, drain mode, no-op entrypoint;
- pgqpsy: as pgq, with the psycopg driver (in PgQueuer's docs 0.6 x asyncpg's throughput);
- cyc2p2: as cyc2, with `cyclone-server --processes 2` (two server processes on one port);
- cyc2 / cyc1: one `cyclone-server` and 2 (1) SDK worker processes x 64 slots; the jobs are
  enqueued with EnqueueMany before the workers start;
- dag2: as cyc2, but the --jobs steps are those of --jobs / 10 runs of a 10-node DAG (a root,
  8 nodes that depend on it, one that depends on the 8), submitted with SubmitRun before the
  workers start: the roots are claimable at the go, every other step once its parents
  completed. Its rate is in steps/s, for the ratio dag2/cyc2 (a DAG's step against a job).

Each figure is the median of --rounds rounds (default 5; contestants interleaved within a
round, so a change in the machine's load hits all of them), printed with its min and max;
a ratio is the ratio of the medians, with the min and max of the rounds' own ratios. The
report names the Postgres version and its settings (_report.py). Per job it reports
Postgres statements (top-level pg_stat_statements calls: round trips), rows inserted +
updated + deleted (pg_stat_database, read after the consumers disconnected), WAL bytes of
those statements, and CPU time of all Postgres processes, of the cyclone-server and of the
consumer/worker processes (psutil, microseconds).

--backlog: Cyclone (2 workers) only. A database of --backlog-small and one of --backlog-size
committed jobs are loaded once each with SQL (cyclone_job_enqueue over generate_series,
50,000 per transaction), vacuumed and analyzed; every drain works on a fresh copy (CREATE
DATABASE ... TEMPLATE) after a CHECKPOINT, with a fresh server. The order is small, then
(large, small) --backlog-rounds times (default 5), so that every large drain has a small one
just before and after it, which show how much the machine's load moved; the rates are
reported as medians with min and max, and each large drain against the small ones around it. With --backlog-tuned, each large drain is repeated with the
autovacuum settings docs/benchmarks.md suggests (TUNED_TABLES, naptime 10 s). It compares
the rate of the first min(--jobs, backlog) completions, with buffers per claim and per
results batch, dead tuples, HOT updates, autovacuum runs and table/index sizes.

--backlog-twice: Cyclone (2 workers) only. --backlog-size jobs loaded (vacuumed and
analyzed) and drained to the end; then as many again loaded into the same database, with
no vacuum but autovacuum's own, and drained to the end; --backlog-rounds times, each on a
fresh database. Both rates and their ratio, per round and as medians with min and max, and the
live and dead tuples and sizes of the steps and runs tables before and after each drain.

--profile DIR: one Cyclone drain (2 workers) with pg_stat_statements.track = all (nested
statements inside the PL/pgSQL functions too), py-spy recording the server and the first
worker (raw collapsed stacks in DIR/server.pyspy and DIR/worker.pyspy), the statements in
DIR/statements.txt, and EXPLAIN (ANALYZE, BUFFERS) of every statement inside one claim of
64 steps and one cyclone_results_apply of their 64 results (auto_explain, nested) in
DIR/explain.txt.

The parts: _pg.py (the Postgres server, databases and what is measured around a drain),
_drain.py (consumer processes, one drain, the printed tables), _contestants.py,
_backlog.py and _profile.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

# bench/ is sys.path[0] when run as a script
from _backlog import backlog_template, drain_backlog, drain_twice, report_backlog, report_twice
from _common import note
from _contestants import drain_cyclone, drain_pgq, drain_raw
from _drain import Drain, fmt_int, print_rows, print_statements
from _pg import start_postgres
from _profile import profile
from _report import MIN_ROUNDS, check_rounds, fmt_spread, postgres_line

CONTESTANTS = {
    "raw1": "raw SQL, claim 1 + complete 1 per transaction, 4 connections",
    "raw10": "raw SQL, claim 10 + complete 10 per transaction, 4 connections",
    "pgq": "PgQueuer 1.6 (asyncpg driver, uvloop, 5 queue managers, batch 10)",
    "pgqpsy": "PgQueuer 1.6 (psycopg driver, uvloop, 5 queue managers, batch 10)",
    "cyc2": "Cyclone, 2 SDK worker processes x 64 slots",
    "cyc1": "Cyclone, 1 SDK worker process x 64 slots",
    "cyc2p2": "Cyclone, 2 SDK worker processes x 64 slots, cyclone-server --processes 2",
    "dag2": "Cyclone, 2 SDK worker processes x 64 slots, steps of 10-node DAG runs",
}


def median_drain(ds: list[Drain]) -> Drain:
    return sorted(ds, key=lambda d: d.rate)[len(ds) // 2] if len(ds) % 2 else \
        sorted(ds, key=lambda d: d.rate)[len(ds) // 2 - 1]


def report_peers(results: dict[str, list[Drain]], args, settings: str) -> None:
    print(f"\njobs={args.jobs} rounds={args.rounds} cores={os.cpu_count()} "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} load(1,5,15)={os.getloadavg()}")
    print(settings)
    header = ["contestant", *[f"round {i + 1}" for i in range(args.rounds)], "median jobs/s (min, max)", "statements/job",
              "rows written/job", "WAL B/job", "PG CPU us/job", "server CPU us/job", "client CPU us/job"]
    rows = []
    med: dict[str, float] = {}
    for key, ds in results.items():
        med[key] = statistics.median(d.rate for d in ds)
        m = median_drain(ds)
        top = [s for s in m.statements if s["top"]]
        rows.append([CONTESTANTS[key], *[fmt_int(d.rate) for d in ds], fmt_spread([d.rate for d in ds]),
                     f"{m.per_job(sum(s['calls'] for s in top)):.2f}",
                     f"{m.per_job(m.counters['inserted'] + m.counters['updated'] + m.counters['deleted']):.1f}",
                     fmt_int(m.per_job(sum(s['wal'] for s in top))),
                     fmt_int(m.per_job(m.pg_cpu) * 1e6),
                     fmt_int(m.per_job(m.server_cpu) * 1e6) if key.startswith(("cyc", "dag")) else "-",
                     fmt_int(m.per_job(m.client_cpu) * 1e6)])
    print_rows(header, rows)
    ratios = []
    for cyc in ("cyc2", "cyc1", "cyc2p2", "dag2"):
        for peer in ("pgq", "pgqpsy", "raw10", "raw1", "cyc2"):
            if cyc in med and peer in med and cyc != peer:
                rounds = [a.rate / b.rate for a, b in zip(results[cyc], results[peer])]
                ratios.append(f"{cyc}/{peer} = {med[cyc] / med[peer]:.2f} "
                              f"(rounds: min {min(rounds):.2f}, max {max(rounds):.2f})")
    print("\nratios of medians: " + ", ".join(ratios))
    for key in results:
        m = median_drain(results[key])
        print(f"\n{key}, statements of the median round (top-level), per job:")
        print_statements(m, limit=8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--only", default=",".join(CONTESTANTS), help="comma-separated contestants: " + ", ".join(CONTESTANTS))
    ap.add_argument("--timeout", type=float, default=600, help="seconds one drain may take before the bench gives up")
    ap.add_argument("--backlog", action="store_true", help="measure the drain from a large backlog instead")
    ap.add_argument("--backlog-size", type=int, default=1_000_000)
    ap.add_argument("--backlog-small", type=int, default=10_000)
    ap.add_argument("--backlog-rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--backlog-tuned", action="store_true",
                    help="also drain the large backlog with the suggested autovacuum settings")
    ap.add_argument("--backlog-twice", action="store_true",
                    help="drain --backlog-size jobs to the end, load as many again, drain them too")
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
            settings = postgres_line(pg.url())
            note(settings)
            if args.profile:
                profile(pg, args, workdir)
                return
            if args.backlog_twice:
                check_rounds(ap, args.backlog_rounds, note)
                report_twice([drain_twice(pg, args.backlog_size, args.timeout, workdir, r)
                              for r in range(args.backlog_rounds)])
                print(settings)
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
                print(settings)
                return
            results: dict[str, list[Drain]] = {k: [] for k in only}
            for r in range(args.rounds):
                for key in only:
                    db = f"peers_{key}_{r}"
                    note(f"round {r + 1}: {CONTESTANTS[key]}")
                    if key.startswith("raw"):
                        d = drain_raw(pg, db, args.jobs, int(key[3:]), args.timeout)
                    elif key.startswith("pgq"):
                        d = drain_pgq(pg, db, args.jobs, args.timeout, "psycopg" if key == "pgqpsy" else "asyncpg")
                    else:
                        workers, _, processes = key[3:].partition("p")
                        d = drain_cyclone(pg, db, args.jobs, int(workers), args.timeout, workdir,
                                          server_processes=int(processes or 1), dag=key.startswith("dag"))
                    results[key].append(d)
                    note(f"round {r + 1}: {key}: {d.rate:,.0f} jobs/s ({d.seconds:.2f} s)")
                    with psycopg.connect(pg.url(), autocommit=True) as c:
                        c.execute(f"DROP DATABASE {db} WITH (FORCE)")
            report_peers(results, args, settings)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
