"""The days of history on the hot path: drains and claims beside N empty days of history.

    nice -n 19 .venv/bin/python bench/days.py [--days 0,30,120,365] [--dag-days 0,30,120] [--jobs 20000] [--rounds 5]

Every day of history is a partition of cyclone_runs, cyclone_steps and cyclone_step_deps
(migration 0014), and a database without retention gains one a day. One embedded Postgres 18,
durable (bench/_pg.py). Each round, for each --days value (the order turning each round): a
fresh database laid out as one that has kept that many days (history.py's lay_out_days: a
partition per day, empty, from then to two days ahead; 0: as migrated), --jobs jobs committed
with EnqueueMany, then a fresh server and two SDK workers x 64 slots drain them (peers.py's
cyc2); for each --dag-days value the same with --jobs steps of 10-node DAG runs submitted with
SubmitRun (dag2). A submission that fails is reported with its error. Then, once per --days
value, in one session on a fresh database so laid out: --cycles cycles of 64 jobs enqueued,
claimed (cyclone_leases_claim_rated) and completed (cyclone_results_apply), each followed by a
claim that finds nothing, timed at the client (medians, the first 5 cycles left out).

It prints each case's rate per round, the median with min and max, and the rounds' ratios to
the first --days value; then the calls' times. docs/operations.md ("What the days cost")
states the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from cyclone_server import definitions
from cyclone_server.store.migrate import migrate

from _common import note
from _contestants import DAG_NODES, drain_cyclone
from _pg import MARK, create_db, start_postgres
from _report import MIN_ROUNDS, check_rounds, fmt_spread, postgres_line, print_rows
from burst import commit_of_checkout
from history import lay_out_days

WARM_UP = 5


def laid_out(pg, db: str, days: int) -> str:
    url = create_db(pg, db)
    migrate(url)
    if days:
        lay_out_days(url, days)
    return url


def drain(pg, db: str, days: int, jobs: int, dag: bool, timeout: float, workdir: Path) -> float | str:
    """The drain's rate (jobs or steps a second), or the error that stopped its submissions."""
    try:
        return drain_cyclone(pg, db, jobs, 2, timeout, workdir, dag=dag,
                             prepare=(lambda url: lay_out_days(url, days)) if days else None).rate
    except Exception as e:  # reported: how a database of that many days answered
        return f"submissions failed: {str(e).splitlines()[0][:100]}"


def calls(pg, db: str, days: int, cycles: int) -> dict[str, float]:
    """Median milliseconds of a claim of 64 jobs, of their results batch and of a claim that finds nothing."""
    url = laid_out(pg, db, days)
    node = json.dumps(definitions.normalize_job("k", {}))
    times: dict[str, list[float]] = {"claim of 64": [], "results of 64": [], "empty claim": []}
    claim = f"SELECT {MARK} step_id, lease_generation FROM cyclone_leases_claim_rated('w', ARRAY['k'], 64, '30 s')"
    with psycopg.connect(url, autocommit=True) as c:
        for _ in range(cycles):
            c.execute(f"SELECT {MARK} count(*) FROM cyclone_jobs_enqueue((SELECT jsonb_agg(jsonb_build_object("
                      "'node', %s::jsonb, 'input', jsonb_build_object('i', i))) FROM generate_series(1, 64) i))", (node,))
            t = time.perf_counter()
            leases = c.execute(claim).fetchall()
            times["claim of 64"].append(time.perf_counter() - t)
            batch = json.dumps([{"step_id": s, "generation": g, "outcome": "completed", "output_bytes": 4,
                                 "output": None} for s, g in leases])
            t = time.perf_counter()
            done = c.execute(f"SELECT {MARK} status FROM cyclone_results_apply(%s::jsonb, 1048576)", (batch,)).fetchall()
            times["results of 64"].append(time.perf_counter() - t)
            if len(leases) != 64 or any(s != "applied" for (s,) in done):
                raise SystemExit(f"{days} days: claimed {len(leases)}, results {sorted(set(s for (s,) in done))}")
            t = time.perf_counter()
            c.execute(claim).fetchall()
            times["empty claim"].append(time.perf_counter() - t)
    return {k: statistics.median(v[WARM_UP:]) * 1e3 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", default="0,30,120,365", help="days of history, comma-separated (jobs)")
    ap.add_argument("--dag-days", default="0,30,120", help="days of history for the DAG drains ('' for none)")
    ap.add_argument("--jobs", type=int, default=20000, help="jobs (DAG steps) drained per case and round")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--cycles", type=int, default=40, help="claim and results cycles timed per --days value")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one drain may take")
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)
    days = [int(x) for x in args.days.split(",") if x.strip()]
    dag_days = [int(x) for x in args.dag_days.split(",") if x.strip()]
    cases = [(d, False) for d in days] + [(d, True) for d in dag_days]
    steps = args.jobs - args.jobs % DAG_NODES
    rates: dict[tuple[int, bool], list[float | str]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="cyclone-days-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(workdir / "pg")
        try:
            settings = postgres_line(pg.url())
            note(settings)
            n = 0
            for r in range(args.rounds):
                turn = r % len(cases)
                for d, dag in cases[turn:] + cases[:turn]:
                    n += 1
                    db = f"bench_days_{n}"
                    rate = drain(pg, db, d, args.jobs, dag, args.timeout, workdir)
                    with psycopg.connect(pg.url(), autocommit=True) as c:
                        c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                    rates[(d, dag)].append(rate)
                    note(f"round {r + 1}: {'DAG steps' if dag else 'jobs'} beside {d} days: "
                         + (f"{rate:,.0f}/s" if isinstance(rate, float) else rate))
            timed = {d: calls(pg, f"bench_days_calls_{d}", d, args.cycles) for d in days}
        finally:
            pg.stop()
    print(f"\ndays: drains of {args.jobs:,} jobs ({steps:,} DAG steps) beside empty days of history, 2 workers x 64 "
          f"slots, {args.rounds} rounds, commit {commit_of_checkout()}, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    rows: list[list[str]] = []
    errors: set[tuple[str, str]] = set()
    for dag, listed in ((False, days), (True, dag_days)):
        for d in listed:
            got = rates[(d, dag)]
            what = f"{'DAG steps' if dag else 'jobs'}/s, {d} days"
            if any(isinstance(x, str) for x in got):
                rows.append([what, *["failed" if isinstance(x, str) else f"{x:,.0f}" for x in got], "-", "-"])
                errors.update((what, x) for x in got if isinstance(x, str))
                continue
            base = rates[(listed[0], dag)]
            ratios = [x / b for x, b in zip(got, base) if isinstance(x, float) and isinstance(b, float)]
            rows.append([what, *[f"{x:,.0f}" for x in got], fmt_spread(got),
                         fmt_spread(ratios, "{:.2f}") if ratios else "-"])
    print_rows(["case", *[f"round {i + 1}" for i in range(args.rounds)], "median (min, max)",
                "against the first of its days"], rows)
    for what, error in sorted(errors):
        print(f"{what}: {error} (the server's log names the cause)")
    print()
    print_rows(["days", *timed[days[0]]], [[str(d), *[f"{v:.2f} ms" for v in t.values()]] for d, t in timed.items()])


if __name__ == "__main__":
    main()
