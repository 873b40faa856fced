"""The migration runner: each file applied exactly once, even by concurrent servers."""

from __future__ import annotations

import re
from pathlib import Path
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from cyclone_server.store import migrate as migrate_module
from cyclone_server.errors import MigrationError
from cyclone_server.store.migrate import SqlFile, functions, migrate, migrations


def expected_names() -> list[str]:
    return [f.name for f in migrations()] + [f"functions/{f.name}" for f in functions()]


def recorded(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, checksum FROM cyclone_migrations").fetchall())


def migrate_concurrently(url: str, n: int = 2) -> list[list[str]]:
    start = threading.Barrier(n)

    def run() -> list[str]:
        start.wait()
        return migrate(url)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: run(), range(n)))


@pytest.fixture
def use_files(monkeypatch: pytest.MonkeyPatch):
    """Makes the runner see the given migration and function files instead of the repo's."""

    def use(migration_files: list[SqlFile], function_files: list[SqlFile] | tuple[()] = ()) -> None:
        monkeypatch.setattr(migrate_module, "migrations", lambda: list(migration_files))
        monkeypatch.setattr(migrate_module, "functions", lambda: list(function_files))

    return use


# Each fake file logs its own application, so a second run of it would show.
_LOG = "CREATE TABLE applied_log (name text NOT NULL);"


def fake(name: str, body: str = "") -> SqlFile:
    return SqlFile(name, f"{body}\nINSERT INTO applied_log VALUES ('{name}');")


def test_fresh_database_gets_every_file_once(empty_db_url: str) -> None:
    applied = migrate(empty_db_url)

    assert applied == expected_names()
    assert sorted(recorded(empty_db_url)) == sorted(expected_names())


def test_second_run_applies_nothing(empty_db_url: str) -> None:
    migrate(empty_db_url)
    before = recorded(empty_db_url)

    assert migrate(empty_db_url) == []
    assert recorded(empty_db_url) == before


def test_concurrent_migrators_apply_each_file_once(empty_db_url: str) -> None:
    results = migrate_concurrently(empty_db_url)

    assert sorted(results[0] + results[1]) == sorted(expected_names())
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute("SELECT count(*), count(DISTINCT name) FROM cyclone_migrations").fetchone()
    assert rows == (len(expected_names()), len(expected_names()))


def test_concurrent_migrators_run_each_file_once(empty_db_url: str, use_files) -> None:
    # The slow first file keeps the first migrator inside its run while the second arrives.
    files = [
        fake("0001_log.sql", _LOG + " SELECT pg_sleep(0.3);"),
        fake("0002_table.sql", "CREATE TABLE t (id int);"),  # fails if run twice
    ]
    use_files(files, [fake("f.sql", "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';")])

    results = migrate_concurrently(empty_db_url)

    assert sorted(results[0] + results[1]) == ["0001_log.sql", "0002_table.sql", "functions/f.sql"]
    with psycopg.connect(empty_db_url) as conn:
        log = conn.execute("SELECT name, count(*) FROM applied_log GROUP BY name ORDER BY name").fetchall()
    assert log == [("0001_log.sql", 1), ("0002_table.sql", 1), ("f.sql", 1)]


def test_a_failing_file_leaves_the_database_as_it_was(empty_db_url: str, use_files) -> None:
    """Every pending file goes in one transaction: a migration that applied and the functions
    written for it become visible together, or not at all."""
    use_files([fake("0001_log.sql", _LOG), fake("0002_t.sql", "CREATE TABLE t (id int);")],
              [fake("f.sql", "SELECT no_such_function();")])
    with pytest.raises(Exception, match="no_such_function"):
        migrate(empty_db_url)
    assert recorded(empty_db_url) == {}
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('applied_log'), to_regclass('t')").fetchone() == (None, None)


def test_edited_migration_is_refused(empty_db_url: str, use_files) -> None:
    use_files([fake("0001_log.sql", _LOG), fake("0002_t.sql", "CREATE TABLE t (id int);")])
    migrate(empty_db_url)
    use_files([fake("0001_log.sql", _LOG), fake("0002_t.sql", "CREATE TABLE t (id bigint);")])

    with pytest.raises(MigrationError, match=re.escape("0002_t.sql")):
        migrate(empty_db_url)
    assert recorded(empty_db_url)["0002_t.sql"] == fake("0002_t.sql", "CREATE TABLE t (id int);").checksum


def test_edited_repo_migration_is_refused(empty_db_url: str, use_files) -> None:
    real = migrations()
    assert real, "the package holds no migration files"
    migrate(empty_db_url)
    edited = SqlFile(real[0].name, real[0].text + "\n-- edited after it was applied\n")
    use_files([edited, *real[1:]], functions())

    with pytest.raises(MigrationError, match=re.escape(real[0].name)):
        migrate(empty_db_url)


def test_edited_function_file_is_applied_again(empty_db_url: str, use_files) -> None:
    one = SqlFile("f.sql", "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';")
    two = SqlFile("f.sql", "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 2';")
    use_files([], [one])
    migrate(empty_db_url)
    use_files([], [two])

    assert migrate(empty_db_url) == ["functions/f.sql"]
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT f()").fetchone() == (2,)


def test_an_earlier_release_keeps_the_functions_of_a_newer_one(empty_db_url: str, use_files) -> None:
    """A rolling upgrade: a newer release migrated the database (a migration the earlier one
    does not know), then a server of the earlier release starts. It puts none of its own
    function files back over the newer ones, which the newer servers run on."""
    old = SqlFile("f.sql", "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1';")
    new = SqlFile("f.sql", "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 2';")
    use_files([fake("0001_log.sql", _LOG), fake("0002_t.sql", "CREATE TABLE t (id int);")], [new])
    migrate(empty_db_url)
    use_files([fake("0001_log.sql", _LOG)], [old])

    assert migrate(empty_db_url) == []
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT f()").fetchone() == (2,)
    assert recorded(empty_db_url)["functions/f.sql"] == new.checksum


def _files_in(folder) -> list[SqlFile]:
    files = sorted((SqlFile(p.name, p.read_text()) for p in folder.glob("*.sql")), key=lambda f: f.name)
    assert files, f"no SQL files in {folder}"  # a fixture gone missing must not pass as an empty database
    return files


def _functions_of(url: str) -> set[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return set(conn.execute(
            "SELECT proname, pg_get_function_arguments(oid) FROM pg_proc"
            " WHERE proname LIKE 'cyclone%' AND pronamespace = 'public'::regnamespace").fetchall())


def test_a_database_of_the_last_landed_version_upgrades_to_this_one(empty_db_url: str, db_url: str,
                                                                     use_files) -> None:
    # The SQL files as they were at the last landing (git archive of that commit): a
    # function whose parameters were renamed or removed must be dropped before it is
    # created again, or the upgrade fails where a fresh database does not.
    landed = Path(__file__).parent / "fixtures" / "sql_landed_f1229d8"
    use_files(_files_in(landed / "migrations"), _files_in(landed / "functions"))
    migrate(empty_db_url)
    use_files(migrations(), functions())
    applied = migrate(empty_db_url)
    # Nothing to apply is right too, right after a landing.
    assert all(name in expected_names() for name in applied)
    # The same functions as a database made fresh by this version: none left behind.
    assert _functions_of(empty_db_url) == _functions_of(db_url)


def test_the_functions_the_last_landed_version_calls_keep_their_rows(empty_db_url: str, db_url: str,
                                                                    use_files) -> None:
    """During a rolling upgrade, servers of the last landed version run on this version's
    functions with their statements prepared: a function they call (`cyclone_*`, not the
    internal `cyclone__*`) must return rows of the same type, or Postgres refuses the
    prepared statement ("cached plan must not change result type")."""
    landed = Path(__file__).parent / "fixtures" / "sql_landed_f1229d8"
    use_files(_files_in(landed / "migrations"), _files_in(landed / "functions"))
    migrate(empty_db_url)
    query = ("SELECT proname || '(' || pg_get_function_identity_arguments(oid) || ')', pg_get_function_result(oid)"
             " FROM pg_proc WHERE proname LIKE 'cyclone%' AND proname NOT LIKE 'cyclone\\_\\_%'"
             " AND pronamespace = 'public'::regnamespace")
    with psycopg.connect(empty_db_url) as conn:
        before = dict(conn.execute(query).fetchall())
    with psycopg.connect(db_url) as conn:
        now = dict(conn.execute(query).fetchall())
    changed = {f: (before[f], now.get(f)) for f in before if now.get(f) != before[f]}
    assert changed == {}, "\n".join(f"{k}: {v}" for k, v in changed.items())


def test_a_migration_reworded_in_its_comments_is_taken_as_applied(empty_db_url: str, use_files,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # A migration's comments were reworded after it landed (migrate.REWORDED lists the
    # checksums of its earlier texts): a database that applied the earlier text records
    # the new one and applies nothing again; any other edit is still refused.
    before = fake("0002_t.sql", "-- an old comment\nCREATE TABLE t (id int);")
    after = fake("0002_t.sql", "-- a new comment\nCREATE TABLE t (id int);")
    use_files([fake("0001_log.sql", _LOG), before])
    migrate(empty_db_url)
    monkeypatch.setitem(migrate_module.REWORDED, "0002_t.sql", frozenset({before.checksum}))
    use_files([fake("0001_log.sql", _LOG), after])
    assert migrate(empty_db_url) == []
    assert recorded(empty_db_url)["0002_t.sql"] == after.checksum
    use_files([fake("0001_log.sql", _LOG), fake("0002_t.sql", "CREATE TABLE t (id bigint);")])
    with pytest.raises(MigrationError, match=re.escape("0002_t.sql")):
        migrate(empty_db_url)


def test_the_landed_rewording_of_0003_is_accepted() -> None:
    landed = Path(__file__).parent / "fixtures" / "sql_landed_396a624" / "migrations" / "0003_kinds_scheduled.sql"
    assert SqlFile(landed.name, landed.read_text()).checksum in migrate_module.REWORDED[landed.name]
