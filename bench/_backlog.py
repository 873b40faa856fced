"""bench/peers.py --backlog: Cyclone draining from a small and a large committed backlog."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

import psycopg

from cyclone_server import definitions
from cyclone_server.store.embedded import EmbeddedPostgres
from cyclone_server.store.migrate import migrate

from _common import note, start_server
from _drain import KIND, Drain, Stage, cyclone_worker_main, fmt_int, poll_until, print_rows, print_statements
from _pg import MARK, create_db, settle, table_report
from _report import fmt_spread

TERMINAL_RUNS = "state IN ('completed', 'failed', 'cancelled')"
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


def load_backlog_copies(url: str, n: int) -> None:
    """`n` committed jobs: one made by the schema's own enqueue function, then copied row for
    row (every column as the function wrote it, new ids from cyclone_uuid7 and the input
    {"i": i}), 100,000 per transaction. Ten to twenty times faster than calling the function
    per job, which on a busy machine took over half an hour for a million."""
    node = json.dumps(definitions.normalize_job(KIND, {}))
    with psycopg.connect(url, autocommit=True) as c:
        proto = c.execute(f"SELECT {MARK} run_id FROM cyclone_job_enqueue(%s::jsonb, jsonb_build_object('i', 1), "
                          "0, NULL, NULL, NULL, NULL)", (node,)).fetchone()[0]
        for start in range(2, n + 1, 100_000):
            end = min(start + 100_000 - 1, n)
            with c.transaction():
                c.execute(f"CREATE {MARK} TEMP TABLE bench_ids ON COMMIT DROP AS "
                          "SELECT i, cyclone_uuid7() AS rid, cyclone_uuid7() AS sid FROM generate_series(%s::int, %s::int) i",
                          (start, end))
                # LATERAL: `(f(...)).*` would call f once per column.
                c.execute(f"INSERT {MARK} INTO cyclone_runs SELECT p.* FROM cyclone_runs r, bench_ids x, "
                          "LATERAL jsonb_populate_record(NULL::cyclone_runs, to_jsonb(r) || jsonb_build_object("
                          "'id', x.rid, 'input', jsonb_build_object('i', x.i))) p WHERE r.id = %s ORDER BY x.i",
                          (proto,))
                c.execute(f"INSERT {MARK} INTO cyclone_steps SELECT p.* FROM cyclone_steps s, bench_ids x, "
                          "LATERAL jsonb_populate_record(NULL::cyclone_steps, to_jsonb(s) || jsonb_build_object("
                          "'id', x.sid, 'run_id', x.rid)) p WHERE s.run_id = %s ORDER BY x.i", (proto,))
            if (end - start) and end % 200_000 < 100_000:
                note(f"  loaded {end:,}")


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
    load_backlog_copies(url, backlog)
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


def drain_all(pg: EmbeddedPostgres, db: str, total_done: int, jobs: int, timeout: float, workdir: Path,
              name: str) -> Drain:
    """Start a server and 2 workers on `db` and drain until `total_done` runs are terminal;
    measures the `jobs` completions of this drain (up to the last one's finished_at)."""
    url = pg.url(db)
    server, address = start_server(url, workdir)
    ctx = mp.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=cyclone_worker_main, args=(address, 64, ready, go), daemon=True) for _ in range(2)]
    stage = Stage(pg, db, procs, ready, go, server)

    def done(deadline: float) -> float:
        poll_until(url, f"SELECT {MARK} count(*) FROM cyclone_runs WHERE {TERMINAL_RUNS}",
                   lambda v: v >= total_done, deadline, interval=0.5)
        with psycopg.connect(url) as c:
            t_end = c.execute(f"SELECT {MARK} extract(epoch FROM max(finished_at)) FROM cyclone_runs").fetchone()[0]
        return time.monotonic() - (time.time() - float(t_end))

    return stage.run(name, jobs, done, timeout)


def drain_twice(pg: EmbeddedPostgres, size: int, timeout: float, workdir: Path, r: int = 0) -> list[Drain]:
    """--backlog-twice: `size` committed jobs drained to the end, then `size` more loaded into
    the same database and drained to the end. The first load is vacuumed and analyzed, as
    for every drain here; the second is not (only a checkpoint): what the first drain left
    behind is in the tables, and autovacuum (migration 0004's thresholds) does what it does.
    Reports each drain's rate, and the steps and runs tables before and after each; `r`: the
    round, which names the database."""
    db = f"peers_backlog_twice_{r}"
    url = create_db(pg, db)
    migrate(url)
    tables = ["cyclone_steps", "cyclone_runs"]
    results = []
    for phase in (1, 2):
        note(f"backlog twice: loading million {phase}")
        t = time.monotonic()
        load_backlog_copies(url, size)
        if phase == 1:
            settle(url)
        else:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("CHECKPOINT")
        note(f"backlog twice: loaded in {time.monotonic() - t:.0f} s; draining all {size:,}")
        before = table_report(url, tables)
        d = drain_all(pg, db, phase * size, size, timeout, workdir, f"backlog twice, drain {phase}")
        d.extra = {"backlog": size, "tuned": False, "before": before, "after": table_report(url, tables),
                   "phase": phase}
        note(f"backlog twice: drain {phase}: {d.rate:,.0f} jobs/s")
        results.append(d)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP DATABASE {db} WITH (FORCE)")
    return results


def report_twice(rounds: list[list[Drain]]) -> None:
    print(f"\nbacklog drained twice, Cyclone 2 workers x 64 slots, {len(rounds)} rounds, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} load(1,5,15)={os.getloadavg()}")
    rows = []
    for d in (d for results in rounds for d in results):
        for t in ("cyclone_steps", "cyclone_runs"):
            b, a = d.extra["before"][t], d.extra["after"][t]
            rows.append([f"drain {d.extra['phase']}: {d.jobs:,} jobs", fmt_int(d.rate) if t == "cyclone_steps" else "",
                         t, f"{fmt_int(b['live'])} -> {fmt_int(a['live'])}", f"{fmt_int(b['dead'])} -> {fmt_int(a['dead'])}",
                         f"{b['table_bytes'] / 2**20:.1f} -> {a['table_bytes'] / 2**20:.1f}",
                         f"{b['index_bytes'] / 2**20:.1f} -> {a['index_bytes'] / 2**20:.1f}",
                         str(a["autovacuums"] - b["autovacuums"]),
                         fmt_int(d.per_job(d.pg_cpu) * 1e6) if t == "cyclone_steps" else "",
                         fmt_int(d.per_job(d.server_cpu) * 1e6) if t == "cyclone_steps" else ""])
    print_rows(["drain", "jobs/s", "table", "live tuples", "dead tuples", "table MB", "indexes MB",
                "autovacuums", "PG CPU us/job", "server CPU us/job"], rows)
    first, second = [r[0].rate for r in rounds], [r[1].rate for r in rounds]
    print(f"\nfirst drain {fmt_spread(first)} jobs/s, second {fmt_spread(second)}; ratio second / first "
          f"(medians) {statistics.median(second) / statistics.median(first):.2f}, "
          f"each round's {fmt_spread([b / a for a, b in zip(first, second)], '{:.2f}')}")


def report_backlog(results: list[Drain], args) -> None:
    print(f"\nbacklog drain, Cyclone 2 workers x 64 slots, date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
          f"load(1,5,15)={os.getloadavg()}")
    rows = []
    for d in results:
        claim = next((s for s in d.statements if s["top"] and "cyclone_leases_claim" in s["query"]), None)
        apply = next((s for s in d.statements if s["top"] and "cyclone_results_apply" in s["query"]), None)
        b, a = d.extra["before"]["cyclone_steps"], d.extra["after"]["cyclone_steps"]
        rows.append([f"{d.extra['backlog']:,} jobs, first {d.jobs:,}" + (", tuned autovacuum" if d.extra["tuned"] else ""),
                     fmt_int(d.rate),
                     f"{claim['blocks'] / claim['calls']:.0f} / {claim['rows'] / claim['calls']:.1f}" if claim else "-",
                     f"{apply['blocks'] / apply['calls']:.0f} / {apply['rows'] / apply['calls']:.1f}" if apply else "-",
                     f"{fmt_int(b['dead'])} -> {fmt_int(a['dead'])}",
                     f"{b['table_bytes'] / 2**20:.1f} -> {a['table_bytes'] / 2**20:.1f}",
                     f"{b['index_bytes'] / 2**20:.1f} -> {a['index_bytes'] / 2**20:.1f}",
                     f"{b['indexes'].get('cyclone_steps_claim_free', 0) / 2**20:.2f} -> "
                     f"{a['indexes'].get('cyclone_steps_claim_free', 0) / 2**20:.2f}",
                     f"{a['hot_upd'] - b['hot_upd']} / {a['upd'] - b['upd']}",
                     str(a["autovacuums"] - b["autovacuums"]),
                     fmt_int(d.per_job(d.pg_cpu) * 1e6), fmt_int(d.per_job(d.server_cpu) * 1e6)])
    print_rows(["backlog", "jobs/s", "claim: blocks / steps per call", "results_apply: blocks / results per call", "steps dead tuples",
                "steps table MB", "steps indexes MB", "claim index MB", "HOT / all step updates",
                "autovacuums (steps)", "PG CPU us/job", "server CPU us/job"], rows)
    big = [d for d in results if d.extra["backlog"] == args.backlog_size and not d.extra["tuned"]]
    small = [d for d in results if d.extra["backlog"] == args.backlog_small]
    if big and small:
        # Each large drain against the small ones just before and after it (the plan brackets
        # every large drain with small ones), so a change in the machine's load cancels out.
        order = [d for d in results if not d.extra["tuned"]]
        pairs = []
        for i, d in enumerate(order):
            if d.extra["backlog"] == args.backlog_size:
                around = [x.rate for x in order[max(i - 1, 0):i + 2] if x.extra["backlog"] == args.backlog_small]
                if around:
                    pairs.append(d.rate / statistics.mean(around))
        print(f"\nlarge backlog: {fmt_spread([d.rate for d in big])} jobs/s; small: {fmt_spread([d.rate for d in small])}; "
              f"ratio large / small (medians): "
              f"{statistics.median(d.rate for d in big) / statistics.median(d.rate for d in small):.2f}"
              + (f" (each large drain against the small ones around it: {fmt_spread(pairs, '{:.2f}')})" if pairs else ""))
    for d in results:
        print(f"\n{d.name}, top-level statements, per job:")
        print_statements(d, limit=3)
    for d in results:
        r = d.extra["after"]["cyclone_runs"]
        print(f"{d.name}: runs table {r['table_bytes'] / 2**20:.1f} MB, indexes {r['index_bytes'] / 2**20:.1f} MB, "
              f"dead {r['dead']:,}; steps indexes after: "
              + ", ".join(f"{k} {v / 2**20:.1f} MB" for k, v in d.extra["after"]["cyclone_steps"]["indexes"].items()))
