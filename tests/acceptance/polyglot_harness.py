"""Harness of the polyglot acceptance tests: launch the Node, Go and Python demo workers, drive runs over raw stubs.

The demo workers are small programs on each language's SDK: examples/worker-node (on
sdks/typescript) and examples/worker-go (on sdks/go), built by scripts/examples_setup.sh
(which scripts/test.sh runs), and tests/acceptance/polyglot_python_worker.py (on
cyclone_worker). A missing or stale build fails the test (never skips it).
Each worker's behaviour per step kind is scripted with `--kind NAME=BEHAVIOUR` (succeed,
fail:N, faildelay:N:MS, permanent, panic, snooze:SECONDS, block, sleep:SECONDS, big:BYTES,
trace, hang, submit:WORKFLOW, signal:NAME). The scenarios every language must pass are in
polyglot_scenarios.py.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, json_format, struct_pb2

from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc

from waits_helpers import until

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "worker-node"
TS_SDK_DIR = ROOT / "sdks" / "typescript"
GO_DIR = ROOT / "examples" / "worker-go"
GO_SDK_DIR = ROOT / "sdks" / "go"
PYTHON_WORKER = Path(__file__).resolve().parent / "polyglot_python_worker.py"
SETUP = "run scripts/examples_setup.sh (scripts/test.sh runs it)"
DEADLINE = 60.0
#: Every language with a demo worker, as the test modules name them.
LANGS = ("node", "go", "python")


def _files(*roots: Path, pattern: str = "*") -> list[Path]:
    return [p for root in roots if root.exists() for p in (root.rglob(pattern) if root.is_dir() else [root])
            if p.is_file()]


def worker_command(lang: str) -> list[str]:
    """The demo worker's command line for `lang`; fails the test when it is not built or stale
    (older than a source that scripts/examples_setup.sh builds it from)."""
    if lang == "python":
        return [sys.executable, str(PYTHON_WORKER)]
    if lang == "node":
        node = shutil.which("node")
        if node is None:
            pytest.fail(f"node (Node.js 20 or newer) is not on PATH: {SETUP}")
        binary = NODE_DIR / "dist" / "demo.js"
        sources = [*_files(NODE_DIR / "src", TS_SDK_DIR / "src", pattern="*.ts"), NODE_DIR / "package-lock.json",
                   TS_SDK_DIR / "package-lock.json"]
        command = [node, str(binary)]
    elif lang == "go":
        binary = GO_DIR / "bin" / "demo-worker"
        sources = _files(GO_DIR / "cmd", GO_DIR / "go.mod", *(GO_SDK_DIR / d for d in (
            "worker", "client", "internal", "cyclonepb", "cycloneotel")))
        command = [str(binary)]
    else:
        raise ValueError(lang)
    if not binary.exists():
        pytest.fail(f"the {lang} demo worker is not built ({binary} is missing): {SETUP}")
    newest = max(sources, key=lambda p: p.stat().st_mtime, default=None)
    if newest is not None and binary.stat().st_mtime < newest.stat().st_mtime:
        pytest.fail(f"the {lang} demo worker is older than its sources ({binary}, {newest}): {SETUP}")
    return command


class DemoWorker:
    """One demo worker process; its log is printed at teardown (shown when the test fails)."""

    def __init__(self, lang: str, address: str, kinds: dict[str, str], *, worker_id: str,
                 marker_dir: Path, log: Path, slots: int = 1, token: str | None = None) -> None:
        self.lang, self.worker_id, self.log = lang, worker_id, log
        args = ["--address", address, "--worker-id", worker_id, "--slots", str(slots),
                "--marker-dir", str(marker_dir)]
        if token is not None:  # only for a server with auth: the flag is optional in every demo worker
            args += ["--token", token]
        for kind, behaviour in kinds.items():
            args += ["--kind", f"{kind}={behaviour}"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([*worker_command(lang), *args], stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no goodbye on the stream, its leases only expire."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM (graceful drain) and wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class WorkerFixtures:
    """Fixtures of a test class that launches demo workers (inherit it to use them)."""

    @pytest.fixture
    def markers(self, tmp_path: Path) -> Path:
        """The folder where block/sleep/hang handlers write <step_id>.started, .stopped, .done."""
        path = tmp_path / "markers"
        path.mkdir()
        return path

    @pytest.fixture
    def launch_worker(self, tmp_path: Path, markers: Path) -> Iterator[Callable[..., DemoWorker]]:
        """Factory: launch_worker(lang, address, {kind: behaviour}, slots=1, token=None) -> DemoWorker."""
        started: list[DemoWorker] = []

        def launch(lang: str, address: str, kinds: dict[str, str], *, slots: int = 1,
                   token: str | None = None) -> DemoWorker:
            n = len(started) + 1
            worker = DemoWorker(lang, address, kinds, worker_id=f"{lang}-worker-{n}", marker_dir=markers,
                                log=tmp_path / f"{lang}-worker-{n}.log", slots=slots, token=token)
            started.append(worker)
            return worker

        yield launch
        for worker in started:
            worker.kill()
            print(f"--- {worker.worker_id} (exit {worker.proc.returncode}) ---\n{worker.log_text()}")


async def wait_for_file(path: Path, timeout: float = DEADLINE) -> str:
    async def read() -> str | None:
        return path.read_text() if path.exists() else None
    return await until(read, f"{path.name}", timeout)


class StreamBreaker:
    """A TCP relay in front of the server whose `drop()` cuts every stream through it: it breaks a
    worker's stream while the server (and its lease renewals) stays up, which a restart cannot."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.writers: set[asyncio.StreamWriter] = set()
        self.relays: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.relays.add(asyncio.current_task())  # type: ignore[arg-type]
        self.writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self.writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    def drop(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.server.close()
        self.drop()
        await asyncio.gather(*self.relays, return_exceptions=True)


def seconds(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d


def task(id: str, kind: str, deps: Sequence[str] = (), **options: Any) -> types_pb2.Node:
    """A task node; backoff is short so retries do not slow the tests down."""
    return types_pb2.Node(id=id, kind=kind, deps=list(deps), backoff_initial=seconds(0.1),
                          backoff_max=seconds(0.5), **options)


def to_py(value: struct_pb2.Value) -> Any:
    return json_format.MessageToDict(value)  # JSON numbers come back as floats: 2.0 == 2


class Runs:
    """The few Workflows/Runs calls the tests need, over the raw generated stubs."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.workflows = workflows_pb2_grpc.WorkflowsStub(channel)
        self.runs = runs_pb2_grpc.RunsStub(channel)

    async def start(self, name: str, nodes: Sequence[types_pb2.Node], input: Any = None,
                    metadata: Sequence[tuple[str, str]] = ()) -> str:
        await self.workflows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name=name, nodes=nodes))
        value = struct_pb2.Value()
        json_format.ParseDict(input, value)
        request = runs_pb2.SubmitRunRequest(workflow=name, input=value)
        return (await self.runs.SubmitRun(request, metadata=tuple(metadata))).run_id

    async def wait(self, run_id: str, timeout: float = DEADLINE) -> types_pb2.Run:
        reply = await self.runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=seconds(timeout)),
                                        timeout=timeout + 10)
        assert not reply.timed_out, f"run {run_id} not terminal after {timeout} s: {reply.run}"
        return reply.run

    async def cancel(self, run_id: str) -> types_pb2.Run:
        return (await self.runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id))).run

    async def step(self, run_id: str, node: str) -> types_pb2.Step:
        return step_of(await self.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)), node)

    async def wait_step(self, run_id: str, node: str, state: int, timeout: float = DEADLINE) -> types_pb2.Step:
        async def check() -> types_pb2.Step | None:
            step = await self.step(run_id, node)
            return step if step.state == state else None
        return await until(check, f"step {node} of run {run_id} to be {types_pb2.StepState.Name(state)}", timeout)


def step_of(run: types_pb2.Run, node: str) -> types_pb2.Step:
    return next(s for s in run.steps if s.node == node)  # every node has exactly one step


def state_name(run: types_pb2.Run) -> str:
    return types_pb2.RunState.Name(run.state)
