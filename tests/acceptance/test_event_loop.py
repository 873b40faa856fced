"""The event loop of the server (`--event-loop`) and of `Worker.run_sync(event_loop=...)`: uvloop
by default where it is installed (the distribution's dependency on Linux), asyncio's on request,
and steps complete on every pairing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cyclone_worker import Client

HERE = Path(__file__).parent


@pytest.fixture
def loop_worker() -> Iterator[Callable[[str, str, str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, kind: str, event_loop: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, str(HERE / "loop_worker_proc.py"), address, kind, event_loop])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("server_flag", "server_loop", "worker_choice", "worker_loop"), [
    ((), "uvloop", "auto", "uvloop"),                          # the defaults
    (("--event-loop", "asyncio"), "asyncio", "asyncio", "asyncio"),
    (("--event-loop", "uvloop"), "uvloop", "asyncio", "asyncio"),
])
async def test_server_and_worker_run_on_the_loop_chosen_and_steps_complete(
        start_server: Callable[..., Any], db_url: str, loop_worker: Any, server_flag: tuple[str, ...],
        server_loop: str, worker_choice: str, worker_loop: str) -> None:
    server = start_server(db_url, extra_args=server_flag)
    assert f"listening on {server.address} (event loop {server_loop})" in server.log_text()
    proc = loop_worker(server.address, "loop-report", worker_choice)
    async with Client(server.address) as client:
        run_ids = [await client.enqueue("loop-report") for _ in range(5)]
        outputs = [await client.result(run_id, timeout=60) for run_id in run_ids]
    assert outputs == [{"loop-report": {"loop": worker_loop}}] * 5  # a run's result: its steps' outputs by name
    assert proc.poll() is None, "the worker exited"
    assert server.terminate() == 0


def test_a_server_told_to_use_an_unknown_loop_does_not_start() -> None:
    out = subprocess.run([sys.executable, "-m", "cyclone_server", "--database-url", "postgresql:///x", "--listen", "127.0.0.1:0",
                          "--event-loop", "trio"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "argument --event-loop" in out.stderr and "'trio'" in out.stderr


def test_a_worker_told_to_use_an_unknown_loop_says_so() -> None:
    out = subprocess.run([sys.executable, str(HERE / "loop_worker_proc.py"), "127.0.0.1:1", "k", "trio"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "event loop 'trio' is not one of auto, uvloop, asyncio" in out.stderr


CYCLONE = "import sys; from cyclone_server.cli.main import main; sys.exit(main(sys.argv[1:]))"  # `cyclone ...`


@pytest.mark.parametrize("argv", [["-c", CYCLONE, "dev", "--no-worker"],
                                  ["-m", "cyclone_worker.demo", "--address", "127.0.0.1:1"]])
def test_cyclone_dev_and_the_demo_refuse_an_unknown_loop_in_the_environment(tmp_path: Path, argv: list[str]) -> None:
    out = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CYCLONE_EVENT_LOOP": "trio"})
    assert out.returncode == 2
    assert "CYCLONE_EVENT_LOOP='trio' is not one of auto, uvloop, asyncio" in out.stderr
    assert not (tmp_path / ".cyclone").exists()  # refused before anything started
