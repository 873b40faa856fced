"""Acceptance fixtures: a real `cyclone-server` subprocess on a free loopback port, a channel and stubs to it.

`start_server(db_url)` launches `python -m cyclone_server` against a test database and waits
for its ready file; every server a test started is killed at teardown, and the logs of all
of them are printed when the test failed. `engine` is an Engine on the same database, for
tests that move steps as a worker would while no worker is connected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from cyclone_server.store.engine import Engine
from cyclone_proto import runs_pb2_grpc, workflows_pb2_grpc
from cyclone_worker import Client

READY_DEADLINE = 60.0
STOP_DEADLINE = 30.0


class ServerProc:
    """One server subprocess; restartable on the same port and database."""

    def __init__(self, db_url: str, workdir: Path, args: Sequence[str]) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.args = list(args)
        self.address = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self._starts = 0

    def _launch(self, listen: str) -> None:
        self._starts += 1
        ready = self.workdir / f"ready-{self._starts}.json"
        log = self.workdir / f"server-{self._starts}.log"
        self.logs.append(log)
        cmd = [sys.executable, "-m", "cyclone_server", "--database-url", self.db_url,
               "--listen", listen, "--ready-file", str(ready), *self.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + READY_DEADLINE
        while time.monotonic() < deadline:
            if ready.exists():
                self.address = json.loads(ready.read_text())["address"]
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server not ready within {READY_DEADLINE} s:\n{self.log_text()}")

    def start(self) -> ServerProc:
        self._launch("127.0.0.1:0")
        return self

    def restart(self) -> ServerProc:
        """Start again on the same port; the old process must be gone (terminate/kill first)."""
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
        deadline = time.monotonic() + 10
        while True:
            try:
                self._launch(self.address)
                return self
            except RuntimeError:
                # The port may still be held for a moment by the previous process's sockets.
                latest = self.logs[-1].read_text(errors="replace")
                if time.monotonic() > deadline or "failed to bind" not in latest.lower():
                    raise
                time.sleep(0.2)

    def terminate(self, timeout: float = STOP_DEADLINE) -> int:
        """SIGTERM and wait; returns the exit code (killed after `timeout`)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_text(self) -> str:
        """The output of every start of this server, oldest first."""
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')}" for p in self.logs if p.exists())


@pytest.fixture
def start_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., ServerProc]]:
    """Factory: start_server(db_url, *, lease_ttl=2, sweep_interval=0.2, extra_args=()) -> ServerProc."""
    started: list[ServerProc] = []
    request.node.cyclone_servers = started  # read by pytest_runtest_makereport on failure

    def start(db_url: str, *, lease_ttl: float = 2, sweep_interval: float = 0.2,
              extra_args: Sequence[str] = ()) -> ServerProc:
        workdir = tmp_path / f"server-{len(started) + 1}"
        workdir.mkdir()
        args = ["--lease-ttl", str(lease_ttl), "--sweep-interval", str(sweep_interval), *extra_args]
        srv = ServerProc(db_url, workdir, args)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.kill()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # A failed test shows the logs of the servers it started beside its traceback.
    rep = yield
    if rep.failed:
        for i, srv in enumerate(getattr(item, "cyclone_servers", ()), 1):
            rep.sections.append((f"cyclone-server {i} log", srv.log_text()))
    return rep


@pytest.fixture
def server(start_server: Callable[..., ServerProc], db_url: str) -> ServerProc:
    return start_server(db_url)


@pytest.fixture
async def channel(server: ServerProc) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture
def wf(channel: grpc.aio.Channel) -> workflows_pb2_grpc.WorkflowsStub:
    return workflows_pb2_grpc.WorkflowsStub(channel)


@pytest.fixture
def runs(channel: grpc.aio.Channel) -> runs_pb2_grpc.RunsStub:
    return runs_pb2_grpc.RunsStub(channel)


@pytest.fixture
async def client(server: ServerProc) -> AsyncIterator[Client]:
    """The SDK's client on the test's server."""
    async with Client(server.address) as c:
        yield c


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[Engine]:
    """An Engine over the test's database (a small pool: the server under test holds its own)."""
    e = await Engine.open(db_url, min_size=1, max_size=2)
    yield e
    await e.close()
