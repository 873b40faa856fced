"""A database of the last landed version, with a run and a step in every state, migrated to
this version: every row kept as it was, the new migrations recorded, and the state machine
working on the old rows.

The data is a pg_dump of that version (fixtures/landed_f1229d8.sql, made by
fixtures/make_landed.py with that version's own Engine). Nothing here counts migrations or
names columns that came later: the checks are "every column the landed version had", and
"every migration file of this version", so the test keeps passing as migrations are added.
"""

from __future__ import annotations

import os
from datetime import date, timedelta
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from cyclone_server.store import migrate as migrate_module
from cyclone_server.store.engine import Engine
from cyclone_server.store.migrate import functions, migrate, migrations

pytestmark = pytest.mark.statemachine

LANDED = Path(__file__).parent / "fixtures" / "landed_f1229d8.sql"
# psql's own commands in a plain dump (pg_dump 15.14 and later guard the restore with them);
# the SQL around them needs no psql.
PSQL_ONLY = ("\\restrict ", "\\unrestrict ")
RUN_STATES = {"running", "paused", "completed", "failed", "cancelled"}
STEP_STATES = {"pending", "available", "running", "completed", "discarded", "cancelled", "waiting_signal",
               "waiting_timer", "waiting_child", "paused"}


def restore(url: str, dump: str) -> None:
    lines = dump.splitlines()
    meta = [line for line in lines if line.startswith("\\")]
    assert all(line.startswith(PSQL_ONLY) for line in meta), meta
    with psycopg.connect(url, autocommit=True) as conn:
        # Without parameters psycopg sends the text as one simple query: many statements.
        conn.execute("\n".join(line for line in lines if not line.startswith("\\")).encode())


def _drop_db(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def scratch_db(pg_admin_url: str, db_url_for: Callable[[str], str]) -> Iterator[Callable[[str], str]]:
    """Makes empty databases `mig_<what>_<pid>` on the test server, dropped afterwards. Named
    like conftest's (the pid keeps pytest processes apart), with the prefix that a shared
    server (CYCLONE_TEST_DATABASE_URL) keeps for migration tests."""
    made: list[str] = []

    def make(what: str) -> str:
        name = f"mig_{what}_{os.getpid()}"
        _drop_db(pg_admin_url, name)  # a crashed earlier run with this pid may have left it
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return db_url_for(name)

    yield make
    for name in made:
        _drop_db(pg_admin_url, name)


@pytest.fixture
def landed_url(scratch_db: Callable[[str], str]) -> str:
    """A database restored from the landed version's dump, not migrated yet."""
    url = scratch_db("landed")
    restore(url, LANDED.read_text())
    return url


# -- reading a database ------------------------------------------------------------------------

def tables(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Every table of the public schema with its columns, in order."""
    rows = conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                        "WHERE table_schema = 'public' AND table_name IN (SELECT tablename FROM pg_tables "
                        "WHERE schemaname = 'public') ORDER BY table_name, ordinal_position").fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def primary_key(conn: psycopg.Connection, table: str) -> list[str]:
    rows = conn.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                        "AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                        "ORDER BY array_position(i.indkey::int2[], a.attnum)", (table,)).fetchall()
    return [r[0] for r in rows]


def contents(url: str, columns: dict[str, list[str]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each table's rows by primary key (as text), holding only the given columns."""
    out = {}
    with psycopg.connect(url) as conn:
        for table, cols in columns.items():
            key = primary_key(conn, table) or cols
            query = sql.SQL("SELECT ROW({key})::text, to_jsonb(t) FROM (SELECT {cols} FROM {table}) t").format(
                key=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in key),
                cols=sql.SQL(", ").join(map(sql.Identifier, cols)), table=sql.Identifier(table))
            out[table] = dict(conn.execute(query).fetchall())
    return out


def recorded(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, checksum FROM cyclone_migrations").fetchall())


def schema(url: str) -> tuple[set, set, set, set]:
    """The columns (with types, nullability, defaults), the index definitions, the constraints
    (foreign keys among them) and the triggers."""
    with psycopg.connect(url) as conn:
        columns = set(conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_schema = 'public'").fetchall())
        indexes = set(conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'").fetchall())
        # (Postgres 18 names each NOT NULL constraint after the table that made it: a table
        # made under another name and renamed, as migration 0011 makes cyclone_fair_keys, has
        # other names than the same table restored from a dump. Its definition is what counts.)
        constraints = set(conn.execute(
            "SELECT c.conrelid::regclass::text, CASE WHEN c.contype = 'n' THEN '' ELSE c.conname END, "
            "pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'public'").fetchall())
        triggers = set(conn.execute(
            "SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND NOT t.tgisinternal").fetchall())
    return columns, indexes, constraints, triggers


async def step_rows(conn: psycopg.AsyncConnection, run_id: Any) -> dict[str, dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM cyclone_steps WHERE run_id = %s", (run_id,))
        return {r["node"]: r for r in await cur.fetchall()}


async def run_row(conn: psycopg.AsyncConnection, where: str, *params: Any) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT * FROM cyclone_runs WHERE {where}", params)
        [row] = await cur.fetchall()
        return row


# -- the tests ----------------------------------------------------------------------------------

def test_migrating_keeps_every_row_of_the_landed_version(landed_url: str) -> None:
    with psycopg.connect(landed_url) as conn:
        before_columns = tables(conn)
        runs = dict(conn.execute("SELECT state, count(*) FROM cyclone_runs GROUP BY state").fetchall())
        steps = dict(conn.execute("SELECT state, count(*) FROM cyclone_steps GROUP BY state").fetchall())
    assert set(runs) == RUN_STATES and set(steps) == STEP_STATES  # the data covers every state
    landed_history = recorded(landed_url)
    kept = {t: c for t, c in before_columns.items() if t != "cyclone_migrations"}  # checked below
    before = contents(landed_url, kept)

    migrate(landed_url)

    with psycopg.connect(landed_url) as conn:
        after_columns = tables(conn)
    for table, cols in kept.items():
        assert set(cols) <= set(after_columns.get(table, ())), f"{table} lost columns"
    after = contents(landed_url, kept)
    for table in kept:
        assert after[table] == before[table], f"rows of {table} changed"
    assert all(before[t] for t in kept), [t for t in kept if not before[t]]  # not an empty comparison

    # Each landed migration keeps its record (a reworded one is recorded with its new text);
    # each migration of this version and each function file is recorded as it is now.
    history = recorded(landed_url)
    current = {f.name: f.checksum for f in migrations()}
    for name, checksum in landed_history.items():
        if not name.startswith("functions/"):
            assert name in current, f"{name} was applied and is gone"
            assert history[name] in (checksum, current[name])
            assert checksum == current[name] or checksum in migrate_module.REWORDED.get(name, ())
    assert {n: c for n, c in history.items() if not n.startswith("functions/")} == current
    assert {n: c for n, c in history.items() if n.startswith("functions/")} == \
        {f"functions/{f.name}": f.checksum for f in functions()}
    assert migrate(landed_url) == []


def test_the_migrated_schema_is_a_fresh_one(landed_url: str, scratch_db: Callable[[str], str]) -> None:
    fresh = scratch_db("fresh")
    migrate(fresh)
    migrate(landed_url)
    assert schema(landed_url) == schema(fresh)


async def test_the_state_machine_works_on_migrated_rows(landed_url: str) -> None:
    migrate(landed_url)
    engine = await Engine.open(landed_url, min_size=1, max_size=4)
    try:
        async with await psycopg.AsyncConnection.connect(landed_url, autocommit=True) as conn:
            mix = await run_row(conn, "workflow_name = 'mix'")
            s = await step_rows(conn, mix["id"])
            assert (s["run"]["state"], s["pend"]["state"], s["sig"]["state"]) == ("running", "pending", "waiting_signal")

            # The running step completes under the lease generation it had, and promotes its dependent.
            assert await engine.complete(str(s["run"]["id"]), s["run"]["lease_generation"], {"r": 1}) == "applied"
            # A waiting_signal step takes a signal; the signal buffered before the migration stays.
            signal_id, consumed_by = await engine.signal(str(mix["id"]), "go", {"p": 3})
            assert consumed_by == str(s["sig"]["id"])
            s = await step_rows(conn, mix["id"])
            assert (s["run"]["state"], s["run"]["output"]) == ("completed", {"r": 1})
            assert s["pend"]["state"] == "available"
            assert s["sig"]["state"] == "completed"
            unconsumed = await (await conn.execute(
                "SELECT name FROM cyclone_signals WHERE run_id = %s AND consumed_by IS NULL", (mix["id"],))).fetchall()
            assert unconsumed == [("later",)]

            # The paused run resumes: its steps back to the states of their kinds, the leased one untouched.
            pz = await run_row(conn, "workflow_name = 'pz'")
            assert await engine.resume_run(str(pz["id"])) is True
            p = await step_rows(conn, pz["id"])
            assert (await run_row(conn, "id = %s", pz["id"]))["state"] == "running"
            assert {n: r["state"] for n, r in p.items()} == {"pz_run": "running", "pz_avail": "available",
                                                             "pz_sig": "waiting_signal"}
            assert p["pz_run"]["lease_generation"] == 1

            # An available job is claimed; its idempotency key still finds its run.
            job = await run_row(conn, "idempotency_key = 'key-avail'")
            [lease] = await engine.claim("w-new", ["job_avail"], limit=10, lease_ttl=30)
            assert (lease["run_id"], lease["lease_generation"], lease["input"]) == (job["id"], 1, {"n": 2})
            run_id, _, created = await engine.enqueue("job_avail", input={"n": 2}, idempotency_key="key-avail")
            assert (run_id, created) == (str(job["id"]), False)

            # The running run is cancelled: its open steps and its child run with it; what ended stays.
            assert await engine.cancel_run(str(mix["id"])) is True
            assert (await run_row(conn, "id = %s", mix["id"]))["state"] == "cancelled"
            s = await step_rows(conn, mix["id"])
            assert {n for n, r in s.items() if r["state"] == "completed"} == {"done", "run", "sig", "sig_early"}
            assert {r["state"] for n, r in s.items() if n not in ("done", "run", "sig", "sig_early")} == {"cancelled"}
            assert s["done"]["output"] == {"v": 1}
            child = await run_row(conn, "parent_run_id = %s", mix["id"])
            assert child["state"] == "cancelled"

            # The schedule and the worker's row are read as before.
            assert (await engine.get_schedule("hourly"))["name"] == "hourly"
            assert [w["worker_id"] for w in await engine.list_workers()] == ["landed-worker"]
    finally:
        await engine.close()


def test_history_partitions_take_the_tables_as_they_are_after_a_preparation_that_blocks_no_write(
        landed_url: str) -> None:
    """Migration 0014 turns the tables into partitioned ones under a short lock: the plain
    indexes it keeps were built beforehand, concurrently, and the bound of the first
    partition proven by a constraint validated beforehand, so the migration builds no index
    and reads no table. A write between the preparation and the migration is kept."""
    with psycopg.connect(landed_url, autocommit=True) as conn:
        migrate_module._prepare_history(conn)
        prepared = dict(conn.execute(
            "SELECT c.relname, c.oid FROM pg_class c WHERE c.relname = ANY (%s)",
            (list(migrate_module._PLAIN_INDEXES),)).fetchall())
        valid = conn.execute("SELECT count(*) FROM pg_constraint WHERE conname LIKE '%%_before_partitions' "
                             "AND convalidated").fetchone()[0]
        runs = conn.execute("SELECT count(*) FROM cyclone_runs").fetchone()[0]
        conn.execute("INSERT INTO cyclone_runs (id, state) VALUES (cyclone_uuid7(), 'completed')")
    assert set(prepared) == set(migrate_module._PLAIN_INDEXES) and valid == 3

    migrate(landed_url)

    with psycopg.connect(landed_url, autocommit=True) as conn:
        for name, oid in prepared.items():  # the same index, now the first partition's
            row = conn.execute("SELECT c.relname, c.relispartition FROM pg_class c WHERE c.oid = %s", (oid,)).fetchone()
            assert row == (f"first_{name}", True), (name, row)
        assert conn.execute("SELECT count(*) FROM cyclone_runs_first").fetchone()[0] == runs + 1
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conname LIKE '%%_before_partitions'"
                            ).fetchone()[0] == 0
        kinds = dict(conn.execute("SELECT relname, relkind FROM pg_class WHERE relname IN "
                                  "('cyclone_runs', 'cyclone_steps', 'cyclone_step_deps')").fetchall())
        assert kinds == {"cyclone_runs": "p", "cyclone_steps": "p", "cyclone_step_deps": "p"}


def test_a_failed_migration_leaves_no_bound_behind(landed_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preparation's constraints refuse inserts past their bound (two days on): when the
    migration after it fails, they go, and the tables stay as they were."""
    broken = migrate_module.SqlFile("99_broken.sql", "SELECT 1/0;")
    monkeypatch.setattr(migrate_module, "functions", lambda: [*functions(), broken])
    with pytest.raises(Exception, match="division by zero"):
        migrate(landed_url)
    with psycopg.connect(landed_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conname LIKE '%%_before_partitions'"
                            ).fetchone()[0] == 0
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'cyclone_runs'").fetchone()[0] == "r"
        late = migrate_module.day_uuid(date.today() + timedelta(days=5))  # past the bound it had
        conn.execute("INSERT INTO cyclone_runs (id, state) VALUES (%s, 'completed')", (late,))
        conn.execute("DELETE FROM cyclone_runs WHERE id = %s", (late,))
    monkeypatch.undo()
    migrate(landed_url)  # prepared again, then migrated
    with psycopg.connect(landed_url, autocommit=True) as conn:
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'cyclone_runs'").fetchone()[0] == "p"
