"""What one step costs Postgres, in counts that do not depend on the machine's load.

No server and no workers: the state machine's own functions, called from one connection as
the server calls them (`cyclone__steps_claim` of 64 steps, `cyclone_results_apply` of their
64 results), on a private embedded Postgres with durable commits and autovacuum off (so
nothing but the bench writes WAL). Two workloads:

- jobs: `--jobs` standalone jobs enqueued 64 per `cyclone_jobs_enqueue` call (a phase), as the
  server writes Enqueue and EnqueueMany calls, then vacuumed; then
  every one is claimed (a phase), then every result applied (a phase);
- DAG runs: `--runs` runs of a 10-node workflow (a root, 8 in parallel, a join), claimed
  and completed 64 at a time until every run ended.

Per step it reports, from `pg_walinspect` over each phase's WAL: B-tree leaf inserts (the
index entries written), heap records (updates, HOT updates, row locks) and WAL bytes; from
`pg_stat_statements` with `track = all`: statements run (nested ones included, as
PL/pgSQL runs them), shared buffers touched and execution time. All but the time are
deterministic: the same code gives the same counts on a busy machine or a quiet one. Each of
--rounds rounds runs both workloads on fresh databases; a figure that differs between rounds
(the time, and WAL bytes and buffers when a checkpoint falls in a phase) is printed as the
median of the rounds with their min and max, one that does not as its value.

    .venv/bin/python bench/rowcost.py              # --jobs 4096 --runs 200 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cyclone_server import definitions  # noqa: E402
from cyclone_server.store.embedded import start_embedded  # noqa: E402
from cyclone_server.store.migrate import migrate  # noqa: E402

from _common import note  # noqa: E402
from _pg import MARK, create_db  # noqa: E402
from _report import MIN_ROUNDS, check_rounds, fmt_spread, postgres_line  # noqa: E402

KIND = "rowcost"
BATCH = 64
DAG = [{"id": "root", "kind": KIND}] + [{"id": f"m{i}", "kind": KIND, "deps": ["root"]} for i in range(8)] + \
      [{"id": "join", "kind": KIND, "deps": [f"m{i}" for i in range(8)]}]


def lsn(c: psycopg.Connection) -> str:
    return c.execute(f"SELECT {MARK} pg_current_wal_insert_lsn()::text").fetchone()[0]


def wal(c: psycopg.Connection, start: str, end: str) -> Counter:
    rows = c.execute(f"SELECT {MARK} \"resource_manager/record_type\", count, record_size + fpi_size "
                     "FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true)", (start, end)).fetchall()
    out: Counter = Counter()
    for kind, count, size in rows:
        out[kind] += count
        out["bytes"] += size
    return out


def stmts(c: psycopg.Connection) -> tuple[int, int, float]:
    r = c.execute(f"SELECT {MARK} sum(calls), sum(shared_blks_hit + shared_blks_read), sum(total_exec_time) "
                  "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
                  "current_database()) AND query NOT LIKE '%%/* bench */%%' AND toplevel").fetchone()
    nested = c.execute(f"SELECT {MARK} sum(calls) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM "
                       "pg_database WHERE datname = current_database()) AND query NOT LIKE '%%/* bench */%%' "
                       "AND NOT toplevel").fetchone()[0]
    return int(r[0] or 0) + int(nested or 0), int(r[1] or 0), float(r[2] or 0.0)


class Phase:
    def __init__(self, c: psycopg.Connection, name: str) -> None:
        self.c, self.name = c, name

    def __enter__(self) -> "Phase":
        self.c.execute(f"SELECT {MARK} pg_stat_statements_reset()")
        self.start = lsn(self.c)
        self.t = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.t
        self.wal = wal(self.c, self.start, lsn(self.c))
        self.statements, self.blocks, self.ms = stmts(self.c)

    def row(self, steps: int) -> dict:
        w = self.wal
        btree = sum(v for k, v in w.items() if k.startswith("Btree/INSERT"))
        heap_upd = w["Heap/UPDATE"]
        hot = w["Heap/HOT_UPDATE"]
        return {"phase": self.name, "steps": steps,
                "index entries/step": btree / steps,
                "heap updates/step (HOT)": f"{(heap_upd + hot) / steps:.2f} ({hot / steps:.2f})",
                "row locks/step": w["Heap/LOCK"] / steps,
                "WAL B/step": w["bytes"] / steps,
                "statements/step": self.statements / steps,
                "buffers/step": self.blocks / steps,
                "PG exec µs/step": self.ms * 1000 / steps}


def claim(c: psycopg.Connection) -> list[tuple]:
    return c.execute("SELECT step_id, lease_generation FROM cyclone__steps_claim('rowcost', %s, %s, '5 min')",
                     ([KIND], BATCH)).fetchall()


def apply(c: psycopg.Connection, leases: list[tuple]) -> Counter:
    results = [{"step_id": str(s), "generation": g, "outcome": "completed", "output": {"ok": 1},
                "output_bytes": 8} for s, g in leases]
    rows = c.execute("SELECT status FROM cyclone_results_apply(%s, 1048576)", (Jsonb(results),)).fetchall()
    return Counter(r[0] for r in rows)


def jobs(url: str, n: int) -> list[dict]:
    node = definitions.normalize_job(KIND, {})
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SET pg_stat_statements.track = 'all'")
        with Phase(c, "jobs: enqueue (64 per call)") as p_enqueue:
            # As the server writes Enqueue calls (batched) and EnqueueMany: cyclone_jobs_enqueue.
            for start in range(0, n, BATCH):
                c.execute("SELECT count(*) FROM cyclone_jobs_enqueue(%s)",
                          (Jsonb([{"node": node, "input": {"i": i}, "priority": 0}
                                  for i in range(start, min(start + BATCH, n))]),))
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")
        c.execute("SET pg_stat_statements.track = 'all'")
        held: list[tuple] = []
        with Phase(c, "jobs: claim (64 per call)") as p_claim:
            while got := claim(c):
                held += got
        statuses: Counter = Counter()
        with Phase(c, "jobs: results (64 per call)") as p_done:
            for i in range(0, len(held), BATCH):
                statuses += apply(c, held[i:i + BATCH])
        assert statuses == Counter({"applied": n}), statuses
        return [p_enqueue.row(n), p_claim.row(n), p_done.row(n)]


def dags(url: str, runs: int) -> list[dict]:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT cyclone_workflow_register('rowcost_dag', %s)",
                  (Jsonb({"nodes": definitions.normalize_nodes(DAG)}),))
        c.execute(f"SELECT {MARK} count(*) FROM generate_series(1, %s) i, "
                  "LATERAL cyclone_run_submit('rowcost_dag', 0, jsonb_build_object('i', i), 0, NULL, NULL, NULL)",
                  (runs,))
        c.execute("VACUUM ANALYZE")
        c.execute("CHECKPOINT")
        c.execute("SET pg_stat_statements.track = 'all'")
        steps = 0
        with Phase(c, "DAG runs: claim + results, 64 per call") as p:
            while got := claim(c):
                st = apply(c, got)
                assert st == Counter({"applied": len(got)}), st
                steps += len(got)
        left = c.execute("SELECT count(*) FROM cyclone_runs WHERE state <> 'completed'").fetchone()[0]
        assert steps == runs * len(DAG) and left == 0, (steps, left)
        return [p.row(steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)
    with tempfile.TemporaryDirectory(prefix="cyclone-rowcost-") as tmp:
        pg = start_embedded(Path(tmp) / "pg")
        try:
            with psycopg.connect(pg.url(), autocommit=True) as c:
                c.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
                c.execute("ALTER SYSTEM SET autovacuum = off")
            pg.stop()
            pg = start_embedded(Path(tmp) / "pg")
            settings = postgres_line(pg.url())
            rounds: list[list[dict]] = []
            for r in range(args.rounds):
                rows = []
                for name, fn, n in (("rowcost_jobs", jobs, args.jobs), ("rowcost_dag", dags, args.runs)):
                    url = create_db(pg, name)
                    with psycopg.connect(url, autocommit=True) as c:
                        c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                    migrate(url)
                    note(f"round {r + 1}: {name}: {n}")
                    rows += fn(url, n)
                rounds.append(rows)
        finally:
            pg.stop()
    cols = list(rounds[0][0])
    print(f"{settings}\n{args.jobs} jobs, {args.runs} DAG runs of {len(DAG)} nodes, {args.rounds} rounds\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for i in range(len(rounds[0])):
        print("| " + " | ".join(cell([rows[i][col] for rows in rounds]) for col in cols) + " |")


def cell(values: list) -> str:
    """A column's values over the rounds: the value when every round had it, else the median
    of the rounds with their min and max."""
    if all(v == values[0] for v in values):
        v = values[0]
        return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
    if all(isinstance(v, (int, float)) for v in values):
        return fmt_spread(values, "{:,.2f}")
    return " / ".join(dict.fromkeys(str(v) for v in values))


if __name__ == "__main__":
    main()
