"""Applies Cyclone's schema: numbered forward-only migrations, then the SQL functions."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from importlib import resources

import psycopg

from cyclone_server.errors import MigrationError

from .failover import with_failover_defaults
from .faults import translated

log = logging.getLogger(__name__)

# Every migrator takes this advisory lock for the whole run, so servers that start at once
# apply each file exactly once.
_LOCK_KEY = 0x6379636C6F6E65  # "cyclone"

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS cyclone_migrations (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


# Applied migrations whose comments were reworded later (their statements are unchanged):
# the checksums of their earlier texts, which a database that applied them still holds.
# The migrator takes such a checksum as the current one and records the new text's.
REWORDED: dict[str, frozenset[str]] = {
    "0003_kinds_scheduled.sql": frozenset({"65534818f6b86a1ae7b9866efef5c39c3b17430d78a7c8d4cec87d083bd74523"}),  # cited a document outside the repository
}


@dataclass(frozen=True)
class SqlFile:
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _files(folder: str) -> list[SqlFile]:
    root = resources.files("cyclone_server.store").joinpath("sql", folder)
    files = [SqlFile(p.name, p.read_text()) for p in root.iterdir() if p.name.endswith(".sql")]
    return sorted(files, key=lambda f: f.name)


def migrations() -> list[SqlFile]:
    """The numbered migrations, in order. An applied one must never change."""
    return _files("migrations")


def functions() -> list[SqlFile]:
    """The SQL functions of the state machine: re-applied whenever their text changes.

    They are `CREATE OR REPLACE` definitions, so unlike migrations they are kept as the
    one current source of each transition and re-run when edited.
    """
    return _files("functions")


def migrate(conninfo: str) -> list[str]:
    """Bring the database at `conninfo` up to date; return the names of the files applied."""
    applied: list[str] = []
    with translated(), psycopg.connect(with_failover_defaults(conninfo), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(_BOOKKEEPING)
            done = dict(conn.execute("SELECT name, checksum FROM cyclone_migrations").fetchall())
            prepared = _HISTORY not in done and _prepare_history(conn)
            # Every file in one transaction: servers still running (a rolling upgrade) see the
            # old schema with the old functions, then the new schema with the new functions,
            # never a migrated table under functions written for the one before; and a file
            # that fails leaves the database as it was.
            try:
                with conn.transaction():
                    applied = _apply_pending(conn, done)
            except BaseException:
                if prepared:  # the bound's constraints would refuse inserts once it passes
                    _unprepare_history(conn)
                raise
            # The coming days of history (migration 0014), so a server that starts can
            # insert; its Background makes them again as days pass.
            if conn.execute("SELECT to_regproc('cyclone_history_ensure') IS NOT NULL").fetchone()[0]:
                conn.execute("SELECT cyclone_history_ensure()")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied


def _apply_pending(conn: psycopg.Connection, done: dict[str, str]) -> list[str]:
    """The migrations not applied yet, then the function files whose text changed; but
    none of the function files when a newer release has migrated the database (it
    recorded a migration this one does not know): a server of the earlier release that
    starts during a rolling upgrade would otherwise put its own functions back under the
    newer servers, which need theirs."""
    applied: list[str] = []
    known = {f.name for f in migrations()}
    newer = sorted(name for name in done if not name.startswith("functions/") and name not in known)
    for f in migrations():
        if f.name in done:
            if done[f.name] in REWORDED.get(f.name, ()):
                _record(conn, f.name, f.checksum)
            elif done[f.name] != f.checksum:
                raise MigrationError(
                    f"migration {f.name} was edited after it was applied "
                    "(migrations are forward-only: add a new numbered file instead)"
                )
            continue
        _apply(conn, f, f.name)
        applied.append(f.name)
    if applied:  # a migration may ask for every function file again (0014 does)
        done = dict(conn.execute("SELECT name, checksum FROM cyclone_migrations").fetchall())
    if newer:
        log.warning("the database was migrated by a newer release (%s): its SQL functions are kept", ", ".join(newer))
        return applied
    for f in functions():
        key = f"functions/{f.name}"
        if done.get(key) == f.checksum:
            continue
        _apply(conn, f, key)
        applied.append(key)
    return applied


def _apply(conn: psycopg.Connection, f: SqlFile, key: str) -> None:
    with conn.transaction():  # a savepoint in migrate's transaction
        conn.execute(f.text.encode())  # no parameters: the file may hold many statements
        _record(conn, key, f.checksum)


def _record(conn: psycopg.Connection, key: str, checksum: str) -> None:
    conn.execute(
        "INSERT INTO cyclone_migrations (name, checksum) VALUES (%s, %s) "
        "ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
        (key, checksum),
    )


_HISTORY = "0014_history_partitions.sql"

# What 0014 needs done outside its transaction, so that the table lock it takes stays short
# (the migration's comment says why): plain copies of three unique indexes, built without
# blocking writes, and a valid CHECK constraint that proves the first partition's bound.
_PLAIN_INDEXES = {
    "cyclone_runs_idempotency_any":
        "ON cyclone_runs (idempotency_key) WHERE idempotency_key IS NOT NULL",
    "cyclone_runs_schedule_fire_any":
        "ON cyclone_runs (schedule_name, schedule_fire_at) WHERE schedule_name IS NOT NULL",
    "cyclone_steps_run_node": "ON cyclone_steps (run_id, node)",
}
_BOUND_KEYS = {"cyclone_runs": "id", "cyclone_steps": "id", "cyclone_step_deps": "step_id"}
_BOUND_OF = (
    "SELECT substring(pg_get_constraintdef(c.oid) FROM '''([0-9a-f-]{36})''')::uuid, c.convalidated"
    " FROM pg_constraint c WHERE c.conrelid = %s::regclass AND c.conname = %s"
)
# The short locks these statements take wait at most this long, each tried this many times:
# a waiting lock request holds up every statement behind it.
_PREPARE_LOCK_TIMEOUT = "2s"
_PREPARE_TRIES = 5


def day_uuid(day: dt.date) -> uuid.UUID:
    """The uuid that starts a UTC day: that day's first millisecond in its first 48 bits,
    the rest zero (SQL cyclone__day_uuid)."""
    ms = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()) * 1000
    return uuid.UUID(bytes=ms.to_bytes(6, "big") + bytes(10))


def _prepare_history(conn: psycopg.Connection) -> bool:
    """Before migration 0014 on a database with plain tables: its plain indexes, built
    CONCURRENTLY, and its bound, as constraints added NOT VALID then validated (a read
    that blocks no write). Each statement is its own transaction, and is skipped when done
    already, so a migrator that stopped half way goes on where it was. Returns whether it
    prepared (the tables are plain)."""
    kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass('cyclone_runs')").fetchone()
    if kind is None or kind[0] != "r":
        return False
    for name, rest in _PLAIN_INDEXES.items():
        # (no lock timeout: a concurrent build waits for the transactions before it, and
        # blocks none; one stopped midway leaves an invalid index, built again here)
        row = conn.execute("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
                           (name,)).fetchone()
        if row is not None and not row[0]:
            conn.execute(f"DROP INDEX CONCURRENTLY {name}".encode())
            row = None
        if row is None:
            conn.execute(f"CREATE INDEX CONCURRENTLY {name} {rest}".encode())
    # The first partition holds every id before the day after tomorrow (UTC): at least a day
    # for the migration to run after its preparation. Should it not follow (it failed, the
    # migrator was stopped), the constraints stay until the next migrator replaces a stale
    # one, or removes them when the migration fails (_unprepare_history): past the bound,
    # they would refuse every insert (docs/operations.md says how to remove them by hand).
    today = dt.datetime.now(dt.timezone.utc).date()
    bound, least = day_uuid(today + dt.timedelta(days=2)), day_uuid(today + dt.timedelta(days=1))
    conn.execute(f"SET lock_timeout = '{_PREPARE_LOCK_TIMEOUT}'")
    try:
        for table, key in _BOUND_KEYS.items():
            name = f"{table}_before_partitions"
            row = conn.execute(_BOUND_OF.encode(), (table, name)).fetchone()
            if row is not None and (row[0] is None or row[0] < least):  # prepared long ago
                _retried(conn, f"ALTER TABLE {table} DROP CONSTRAINT {name}")
                row = None
            if row is None:
                _retried(conn, f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({key} < '{bound}') NOT VALID")
                row = (bound, False)
            if not row[1]:
                _retried(conn, f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")
    finally:
        conn.execute("RESET lock_timeout")
    return True


def _unprepare_history(conn: psycopg.Connection) -> None:
    """After migration 0014 failed: its bound's constraints removed (best effort: the next
    migrator prepares again)."""
    try:
        conn.execute(f"SET lock_timeout = '{_PREPARE_LOCK_TIMEOUT}'")
        for table in _BOUND_KEYS:
            _retried(conn, f"ALTER TABLE IF EXISTS {table} DROP CONSTRAINT IF EXISTS {table}_before_partitions")
        conn.execute("RESET lock_timeout")
    except psycopg.Error as e:
        log.warning("migration 0014 failed, and its preparation's constraints could not be removed (%s): "
                    "remove them before the day after tomorrow (docs/operations.md)", e)


def _retried(conn: psycopg.Connection, statement: str) -> None:
    for attempt in range(_PREPARE_TRIES):
        try:
            conn.execute(statement.encode())
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == _PREPARE_TRIES - 1:
                raise
            log.info("migration 0014's preparation waits for a lock: %s", statement)
            time.sleep(1.0)
