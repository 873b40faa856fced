"""bench/peers.py --profile: one Cyclone drain with nested statement counts, py-spy on the
server, and EXPLAIN (ANALYZE, BUFFERS) of the claim and of cyclone_results_apply."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from cyclone_server.store.embedded import EmbeddedPostgres
from cyclone_server.store.migrate import migrate

from _backlog import load_backlog_sql
from _common import note
from _contestants import drain_cyclone
from _drain import Stage, print_statements
from _pg import create_db, settle


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
        # The server, and the first worker process.
        for name, pid in (("server", stage.server.pid), ("worker", stage.procs[0].pid)):
            spies.append(subprocess.Popen(
                [pyspy, "record", "-d", str(args.profile_seconds), "-r", "200", "-p", str(pid),
                 "-o", str(out / f"{name}.pyspy"), "--format", "raw", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=open(out / f"py-spy-{name}.log", "w")))

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
            rows = c.execute("SELECT step_id, lease_generation FROM cyclone__steps_claim('bench', ARRAY['noop'], 64, "
                             "interval '30 s')").fetchall()
            c.execute("SELECT * FROM cyclone_results_apply(%s::jsonb)", (json.dumps(
                [{"step_id": str(r[0]), "generation": r[1], "outcome": "completed", "output": None,
                  "output_bytes": 4} for r in rows]),))
        c.execute("LOAD 'auto_explain'")
        for k, v in {"log_min_duration": "0", "log_analyze": "on", "log_buffers": "on", "log_timing": "on",
                     "log_nested_statements": "on", "log_level": "notice", "log_verbose": "off"}.items():
            c.execute(f"SET auto_explain.{k} = '{v}'")
        notices.append("==== SELECT * FROM cyclone__steps_claim('bench', ARRAY['noop'], 64, '30 s')")
        rows = c.execute("SELECT step_id, lease_generation FROM cyclone__steps_claim('bench', ARRAY['noop'], 64, "
                         "interval '30 s')").fetchall()
        notices.append(f"==== SELECT * FROM cyclone_results_apply(<{len(rows)} completed results>)")
        c.execute("SELECT * FROM cyclone_results_apply(%s::jsonb)", (json.dumps(
            [{"step_id": str(r[0]), "generation": r[1], "outcome": "completed", "output": None,
              "output_bytes": 4} for r in rows]),))
    path.write_text("\n\n".join(notices) + "\n")
