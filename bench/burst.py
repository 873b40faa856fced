"""A burst: the first completions of a million jobs committed just before, against a small backlog.

    nice -n 19 .venv/bin/python bench/burst.py [--jobs 1000000] [--measure 50000] [--rounds 5]
    nice -n 19 .venv/bin/python bench/burst.py --embedded       # the embedded Postgres 18
    nice -n 19 .venv/bin/python bench/burst.py --dsn postgresql://postgres@host:5432/postgres
    nice -n 19 .venv/bin/python bench/burst.py --jobs 5000000 --cases fresh   # no settled case

Each round drains these databases of one Postgres, in this order, each made for it
(bench_burst_*, dropped after its drain) and migrated (--cases leaves out fresh or settled):

- backlog: --measure jobs, then VACUUM ANALYZE and a CHECKPOINT (the baseline);
- fresh: --jobs jobs, then ANALYZE only: the pages as the commits left them (no hint bits,
  no visibility map), checkpoints of the load maybe still under way;
- settled: --jobs jobs, then VACUUM ANALYZE and a CHECKPOINT.

Jobs are committed through the schema's own `cyclone_jobs_enqueue` (what the server runs for
Enqueue and EnqueueMany), 5,000 per call and transaction. Then a `cyclone-server` starts, two
SDK worker processes x 64 slots connect and wait for a go; the clock runs from the go to the
`finished_at` of the --measure-th finished run (its transaction's start, the same machine's
clock). It prints each case's rate per round, the median with min and max, and the ratios
fresh/backlog and settled/backlog of each round (a round's cases minutes apart) with their
median, min and max; and the Postgres version and settings. With pg_stat_statements loaded
(--embedded preloads it) it also prints the claim's and the results' cost per call.

--dsn (default the machine's Postgres 15) needs a role that may create databases and run
CHECKPOINT; the server's settings are used as they are. --embedded starts a durable embedded
Postgres 18 in a temporary directory (_pg.start_postgres).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from cyclone_server import definitions
from cyclone_server.store.migrate import migrate

# bench/ is sys.path[0] when run as a script
from _common import note, start_server
from _drain import KIND, Stage, cyclone_worker_main, fmt_int, print_rows
from _pg import MARK, create_db, settle, start_postgres, statements, statements_delta
from _report import MIN_ROUNDS, fmt_spread, postgres_line

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CALL = 5_000  # jobs per cyclone_jobs_enqueue call
CASES = ("backlog", "fresh", "settled")
POLL = 0.25  # seconds between looks for the --measure-th finished run


class External:
    """A Postgres server given by URL, with EmbeddedPostgres's `url(dbname)`."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def url(self, dbname: str = "postgres") -> str:
        return make_conninfo(self.dsn, dbname=dbname)


def enqueue(url: str, jobs: int) -> float:
    """`jobs` committed jobs, CALL per `cyclone_jobs_enqueue` call (one transaction each);
    returns the seconds it took."""
    node = json.dumps(definitions.normalize_job(KIND, {}))
    t = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        for start in range(0, jobs, CALL):
            c.execute(f"SELECT {MARK} count(*) FROM cyclone_jobs_enqueue((SELECT jsonb_agg(jsonb_build_object("
                      "'node', %s::jsonb, 'input', jsonb_build_object('i', i)) ORDER BY i) "
                      "FROM generate_series(%s::int, %s::int) i))", (node, start + 1, min(start + CALL, jobs)))
            if start and start % 250_000 == 0:
                note(f"  committed {start:,}")
    return time.monotonic() - t


def prepare(url: str, case: str) -> None:
    if case == "fresh":
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("ANALYZE")
    else:
        settle(url)


def has_statements(url: str) -> bool:
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"SELECT {MARK} 1 FROM pg_stat_statements LIMIT 1")
        return True
    except psycopg.Error:  # not preloaded (the machine's Postgres 15)
        return False


def per_call(stmts: list[dict], function: str) -> tuple[float, float] | None:
    """(ms, shared blocks) per call of the top-level statement that calls `function`."""
    s = next((s for s in stmts if s["top"] and function in s["query"]), None)
    return (s["ms"] / s["calls"], s["blocks"] / s["calls"]) if s else None


def drain_first(pg, db: str, measure: int, timeout: float, workdir: Path,
                beside: Callable[[], Any] | None = None) -> dict:
    """A fresh server and 2 SDK workers on `db`; the seconds from the go to the finish of the
    `measure`-th run (and the go, `t0`, on the clock of finished_at), and the claim's and
    results' costs when pg_stat_statements is there. `beside`, if given, runs in a thread from
    the go on; the drain waits for it too, and its result is `beside`."""
    url = pg.url(db)
    server, address = start_server(url, workdir)
    ctx = mp.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=cyclone_worker_main, args=(address, 64, ready, go), daemon=True)
             for _ in range(2)]
    stage = Stage(pg, db, procs, ready, go, server)
    stmts = has_statements(url)
    # Runs finished after the go only (history.py drains beside runs that finished before).
    query = (f"SELECT {MARK} extract(epoch FROM finished_at) FROM cyclone_runs "
             "WHERE state IN ('completed', 'failed', 'cancelled') AND finished_at >= to_timestamp(%s) "
             "ORDER BY finished_at OFFSET %s LIMIT 1")
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        before = statements(url) if stmts else {}
        pool = ThreadPoolExecutor(1)
        with psycopg.connect(url, autocommit=True) as c:
            t0 = time.time()  # finished_at is on this clock
            go.set()
            side = pool.submit(beside) if beside else None
            while (row := c.execute(query, (t0, measure - 1)).fetchone()) is None:
                if time.time() > t0 + timeout:
                    raise SystemExit(f"{db}: {measure:,} runs not finished after {timeout:.0f} s")
                time.sleep(POLL)
        out = {"seconds": float(row[0]) - t0, "t0": t0}
        if side:
            out["beside"] = side.result(timeout=timeout)
        pool.shutdown()
        if stmts:
            delta = statements_delta(before, statements(url))
            out |= {"claim": per_call(delta, "cyclone_leases_claim"), "apply": per_call(delta, "cyclone_results_apply")}
        return out
    finally:
        stage.stop()


def one(pg, case: str, jobs: int, measure: int, timeout: float, workdir: Path) -> dict:
    db = f"bench_burst_{case}"
    url = create_db(pg, db)
    try:
        migrate(url)
        n = measure if case == "backlog" else jobs
        note(f"{case}: committing {n:,} jobs")
        load = enqueue(url, n)
        t = time.monotonic()
        prepare(url, case)
        prep = time.monotonic() - t
        note(f"{case}: committed in {load:.0f} s ({n / load:,.0f} jobs/s), prepared in {prep:.0f} s; draining")
        d = drain_first(pg, db, measure, timeout, workdir)
        d |= {"rate": measure / d["seconds"], "load": load, "prep": prep}
        note(f"{case}: first {measure:,} at {d['rate']:,.0f} jobs/s")
        return d
    finally:
        with psycopg.connect(pg.url(), autocommit=True) as c:  # free the disk
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def commit_of_checkout() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return done.stdout.strip() or "?"


def report(rounds: list[dict[str, dict]], args, settings: str) -> None:
    cases = [c for c in CASES if c in rounds[0]]
    print(f"\nburst: first {args.measure:,} of {args.jobs:,} (backlog: {args.measure:,}), Cyclone 2 workers x 64 slots, "
          f"{len(rounds)} rounds, commit {commit_of_checkout()}, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} cores={os.cpu_count()} "
          f"load(1,5,15)={os.getloadavg()}")
    print(settings)
    rows = []
    for case in cases:
        rates = [r[case]["rate"] for r in rounds]
        rows.append([f"{case}, jobs/s", *[fmt_int(x) for x in rates], fmt_spread(rates)])
    for case in cases[1:]:
        ratios = [r[case]["rate"] / r["backlog"]["rate"] for r in rounds]
        rows.append([f"{case} / backlog", *[f"{x:.2f}" for x in ratios], fmt_spread(ratios, "{:.2f}")])
    for case in cases:
        rows.append([f"{case}: commit s / prepare s", *[f"{r[case]['load']:.0f} / {r[case]['prep']:.0f}" for r in rounds], ""])
    for key, label in (("claim", "claim"), ("apply", "results")):
        for case in cases:
            if any(r[case].get(key) for r in rounds):
                rows.append([f"{case}: {label} ms / blocks per call",
                             *[("{:.2f} / {:.0f}".format(*r[case][key]) if r[case].get(key) else "-") for r in rounds],
                             ""])
    print_rows(["", *[f"round {i + 1}" for i in range(len(rounds))], "median (min, max)"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1_000_000, help="jobs of the burst")
    ap.add_argument("--measure", type=int, default=50_000, help="completions timed, and the backlog's size")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--dsn", default=DEFAULT_DSN, help=f"a Postgres server's URL (default {DEFAULT_DSN})")
    ap.add_argument("--embedded", action="store_true", help="an embedded Postgres 18 instead of --dsn")
    ap.add_argument("--cases", default="fresh,settled", help="the bursts drained besides the backlog: fresh, settled")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds one drain may take")
    args = ap.parse_args()
    cases = ["backlog", *(c for c in CASES[1:] if c in args.cases.split(","))]
    if len(cases) == 1 or set(args.cases.split(",")) - set(CASES[1:]):
        ap.error("--cases: fresh, settled or both")
    if args.jobs < args.measure:
        ap.error("--jobs must be at least --measure")
    if args.rounds < MIN_ROUNDS:
        note(f"{args.rounds} rounds: fewer than {MIN_ROUNDS} is a probe, not a figure")

    with tempfile.TemporaryDirectory(prefix="cyclone-burst-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(workdir / "pg") if args.embedded else External(args.dsn)
        try:
            settings = postgres_line(pg.url())
            note(settings)
            rounds = []
            for r in range(args.rounds):
                rounds.append({case: one(pg, case, args.jobs, args.measure, args.timeout, workdir) for case in cases})
                note(f"round {r + 1}: " + ", ".join(
                    f"{c}/backlog {rounds[-1][c]['rate'] / rounds[-1]['backlog']['rate']:.2f}" for c in cases[1:]))
            report(rounds, args, settings)
        finally:
            if args.embedded:
                pg.stop()


if __name__ == "__main__":
    main()
