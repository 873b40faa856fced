"""`cyclone dev` as a user meets it: a second one on the same data dir, a busy port, a closed terminal, a kill."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cyclone_worker import Client, CycloneClientError

ENTRY = "import sys; from cyclone_server.cli.main import main; sys.exit(main(sys.argv[1:]))"
DEADLINE = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.1)


class Dev:
    """One `cyclone dev` process; `started()` waits for its banner and reads its pids."""

    def __init__(self, data_dir: Path, port: int, log: Path, *extra: str) -> None:
        self.data_dir, self.address, self.log = data_dir, f"127.0.0.1:{port}", log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", ENTRY, "dev", "--data-dir", str(data_dir),
                                          "--listen", self.address, "--http-listen", "127.0.0.1:0", *extra],
                                         stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def started(self) -> Dev:
        wait_until(f"cyclone dev banner in {self.log}", lambda: "Cyclone is running on" in self.text()
                   or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.text()
        match = re.search(r"demo worker \(pid (\d+)\)", self.text())
        assert match, self.text()
        self.worker_pid = int(match.group(1))
        self.postgres_pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return self

    def gone(self) -> bool:
        return self.proc.poll() is not None and not alive(self.worker_pid) and not alive(self.postgres_pid)


@pytest.fixture
def devs(tmp_path: Path) -> Iterator[list[Dev]]:
    started: list[Dev] = []
    yield started
    for dev in started:
        if dev.proc.poll() is None:
            dev.proc.send_signal(signal.SIGINT)
            try:
                dev.proc.wait(60)
            except subprocess.TimeoutExpired:
                dev.proc.kill()
                dev.proc.wait()


async def stats_ok(address: str) -> bool:
    async with Client(address, wait_for_server=10) as client:
        await client.stats()
    return True


async def test_the_demo_worker_of_a_dev_runs_the_demo_workflow(tmp_path: Path, devs: list[Dev]) -> None:
    """What the README's first command promises: the server and a demo worker that serves the
    workflow "demo", so that a run of it, submitted as the banner says, completes."""
    dev = Dev(tmp_path / "pg", free_port(), tmp_path / "dev.log")
    devs.append(dev)
    dev.started()
    async with Client(dev.address, wait_for_server=10) as client:
        deadline = time.monotonic() + DEADLINE
        while True:  # the worker registers "demo" once it is up
            try:
                run_id = await client.submit("demo", {"city": "Lisbon", "days": 7})
                break
            except CycloneClientError as e:
                assert e.code == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, (e, dev.text())
                assert alive(dev.worker_pid), f"the demo worker exited:\n{dev.text()}"
                await asyncio.sleep(0.2)
        run = await client.wait(run_id, timeout=DEADLINE)
    assert run.state == "completed", (run, dev.text())
    assert {s.node: s.state for s in run.steps} == dict.fromkeys(("fetch", "parse", "enrich", "report"), "completed")
    assert alive(dev.worker_pid)


# The child's pid and death signal, as prctl(PR_GET_PDEATHSIG) reads it after the exec (Linux,
# as /proc above).
PDEATHSIG_CHILD = ("import ctypes, os; libc = ctypes.CDLL(None); sig = ctypes.c_int(); "
                   "libc.prctl(2, ctypes.byref(sig)); print(os.getpid(), sig.value)")


async def test_the_demo_worker_starts_whole_beside_a_busy_grpc_server() -> None:
    """`cyclone dev` starts its demo worker once its grpc.aio server is serving. Started with
    subprocess's preexec_fn (Python run in the child between fork and exec), about one child
    in ten died before its exec while the server was busy (SIGSEGV, or SIGABRT after gRPC's
    "epoll_wait error: Bad file descriptor"). Started as `cyclone dev` starts it, each of
    these 40 runs to its end, with SIGTERM as its death signal."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from cyclone_server.cli.devguard import start_dying_with_this_process

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    busy = True

    async def calls() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while busy:
                await stub.Check(health_pb2.HealthCheckRequest())

    callers = [asyncio.create_task(calls()) for _ in range(8)]
    try:
        for i in range(40):
            child = await start_dying_with_this_process([sys.executable, "-c", PDEATHSIG_CHILD],
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(child.communicate(), DEADLINE)
            # The pid `cyclone dev` prints is the worker's: the exec keeps it.
            assert (child.returncode, out.decode().split()) == (0, [str(child.pid), str(int(signal.SIGTERM))]), \
                f"start {i + 1}: {err.decode()}"
    finally:
        busy = False
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        await server.stop(None)


def test_the_demo_worker_starts_with_the_default_signal_dispositions() -> None:
    """Python ignores SIGPIPE and SIGXFSZ from its start, and an exec keeps what is ignored:
    the fresh Python that sets the death signal puts them back before it execs the worker,
    as subprocess does for the children it starts."""
    from cyclone_server.cli.devguard import dying_with_this_process

    status = subprocess.run(dying_with_this_process(["/bin/grep", "SigIgn", "/proc/self/status"]),
                            capture_output=True, text=True, check=True, timeout=DEADLINE).stdout
    ignored = int(status.split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & 1 << (sig - 1), f"{sig.name} is ignored: {status}"


def test_a_worker_whose_dev_exited_before_it_started_does_not_start() -> None:
    """A `cyclone dev` that exits between starting its demo worker and the worker setting its
    death signal: the worker's parent is no longer that dev, so no signal would ever come,
    and the worker does not start (here: pid 1 stands for the dev that is gone)."""
    done = subprocess.run([sys.executable, "-m", "cyclone_server.cli.devguard", "--die-with", "1", "--",
                           sys.executable, "-c", "print('started')"],
                          capture_output=True, text=True, timeout=DEADLINE)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"its parent (pid 1) exited: not starting {sys.executable}\n"


async def test_a_second_dev_on_the_same_data_dir_or_port_refuses_and_leaves_the_first_alone(
        tmp_path: Path, devs: list[Dev]) -> None:
    first = Dev(tmp_path / "pg", free_port(), tmp_path / "first.log")
    devs.append(first)
    first.started()

    second = Dev(tmp_path / "pg", free_port(), tmp_path / "second.log")
    devs.append(second)
    assert second.proc.wait(DEADLINE) == 1
    lines = second.text().strip().splitlines()
    assert lines[-1] == (f"cyclone dev: another cyclone dev (pid {first.proc.pid}, listening on {first.address}) is "
                         f"using {tmp_path / 'pg'}; stop it first, or give this one its own --data-dir, --listen "
                         "and --http-listen")
    assert "Traceback" not in second.text()

    port = int(first.address.rsplit(":", 1)[1])
    third = Dev(tmp_path / "other", port, tmp_path / "third.log")
    devs.append(third)
    assert third.proc.wait(DEADLINE) == 1
    line = third.text().strip()
    assert line.startswith(f"cyclone dev: {first.address} is already in use by pid {first.proc.pid} (")
    assert line.endswith("pick another address with --listen HOST:PORT") and "\n" not in line
    assert not (tmp_path / "other").exists()  # refused before starting anything

    # The first one still has its Postgres: calls work, and Ctrl-C stops it all.
    assert alive(first.postgres_pid) and await stats_ok(first.address)
    first.proc.send_signal(signal.SIGINT)
    assert first.proc.wait(DEADLINE) == 0
    wait_until("the first dev's Postgres and demo worker stop", first.gone)


@pytest.mark.parametrize("how", ["SIGHUP", "SIGTERM", "SIGKILL"])
async def test_a_closed_terminal_or_a_killed_dev_leaves_nothing_running(tmp_path: Path, devs: list[Dev],
                                                                       how: str) -> None:
    dev = Dev(tmp_path / "pg", free_port(), tmp_path / "dev.log")
    devs.append(dev)
    dev.started()
    dev.proc.send_signal(getattr(signal, how))
    dev.proc.wait(DEADLINE)
    wait_until(f"Postgres (pid {dev.postgres_pid}) and the demo worker (pid {dev.worker_pid}) stop after {how}",
               dev.gone)
    # The data dir is free again: the next dev starts on it.
    again = Dev(tmp_path / "pg", free_port(), tmp_path / "again.log")
    devs.append(again)
    again.started()
    assert await stats_ok(again.address)
