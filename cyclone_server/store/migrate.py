"""Applies Cyclone's schema: numbered forward-only migrations, then the SQL functions."""

from __future__ import annotations

import hashlib
import logging
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
            # Every file in one transaction: servers still running (a rolling upgrade) see the
            # old schema with the old functions, then the new schema with the new functions,
            # never a migrated table under functions written for the one before; and a file
            # that fails leaves the database as it was.
            with conn.transaction():
                applied = _apply_pending(conn, done)
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
