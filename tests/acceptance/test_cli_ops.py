"""`cyclone runs|workflows|stats` as an operator runs them: a CLI process against a real server process.

Steps are moved through the engine on the test's database (no worker connects, so the
server's dispatcher leaves them alone); the CLI sees the result over gRPC.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from cyclone_server.store.engine import Engine
from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc

ENTRY = "import sys; from cyclone_server.cli.main import main; sys.exit(main(sys.argv[1:]))"
ETL = [types_pb2.Node(id="extract"), types_pb2.Node(id="load", deps=["extract"], max_attempts=1)]


def cli(address: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CYCLONE_ADDRESS": address, "COLUMNS": "200"}
    env.pop("CYCLONE_TOKEN", None)
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True, timeout=120, env=env)


def spawn(address: str, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", ENTRY, *args, "--address", address],
                            env={**os.environ, "COLUMNS": "200"}, **kw)


@pytest.fixture
async def stubs(channel: grpc.aio.Channel) -> tuple[runs_pb2_grpc.RunsStub, workflows_pb2_grpc.WorkflowsStub]:
    wf = workflows_pb2_grpc.WorkflowsStub(channel)
    await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=ETL))
    await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="approval", nodes=[
        types_pb2.Node(id="approve", type=types_pb2.NODE_TYPE_SIGNAL)]))
    return runs_pb2_grpc.RunsStub(channel), wf


async def submit(runs: runs_pb2_grpc.RunsStub, workflow: str = "etl") -> str:
    return (await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow=workflow))).run_id


async def step(engine: Engine, kind: str, *, fail: bool = False) -> None:
    """Claim one step of `kind` and complete it (or fail it for good), as a worker would."""
    deadline = time.monotonic() + 30
    while not (leases := await engine.claim("cli-test", [kind], 1, lease_ttl=30)):
        assert time.monotonic() < deadline, f"no {kind} step became claimable"
        await asyncio.sleep(0.05)
    lease = leases[0]
    if fail:
        status = await engine.fail(str(lease["step_id"]), lease["lease_generation"], "boom", permanent=True)
        assert status == "discarded"
    else:
        assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], {"ok": kind}) == "applied"


async def test_workflows_list_and_get(server: Any, stubs: Any) -> None:
    out = cli(server.address, "workflows", "list")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].split() == ["NAME", "VERSION", "NODES", "REGISTERED", "(UTC)"]
    assert [line.split()[:3] for line in out.stdout.splitlines()[1:]] == [["approval", "1", "1"], ["etl", "1", "2"]]
    got = cli(server.address, "workflows", "get", "etl")
    assert got.returncode == 0 and "workflow  etl v1" in got.stdout
    assert ["load", "load", "task", "extract", "1", "fail_run"] in [line.split() for line in got.stdout.splitlines()]
    data = json.loads(cli(server.address, "workflows", "get", "etl", "--json").stdout)
    assert [n["id"] for n in data["nodes"]] == ["extract", "load"]
    missing = cli(server.address, "workflows", "get", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("cyclone: NOT_FOUND:") and "nope" in missing.stderr


async def test_runs_list_get_and_stats(server: Any, stubs: Any, engine: Engine) -> None:
    runs, _ = stubs
    first, second = await submit(runs), await submit(runs)
    await step(engine, "extract")  # one of the two runs moves on
    out = cli(server.address, "runs", "list")
    assert out.returncode == 0, out.stderr
    assert [line.split()[:3] for line in out.stdout.splitlines()[1:]] == [[second, "etl", "running"],
                                                                           [first, "etl", "running"]]
    listed = json.loads(cli(server.address, "runs", "list", "--state", "completed", "--json").stdout)
    assert listed == []
    paged = cli(server.address, "runs", "list", "--limit", "1")
    assert len(paged.stdout.splitlines()) == 2 and "--page-token" in paged.stderr
    assert len(json.loads(cli(server.address, "runs", "list", "--limit", "1", "--all", "--json").stdout)) == 2

    got = cli(server.address, "runs", "get", first)
    assert got.returncode == 0, got.stderr
    table = [line.split() for line in got.stdout.splitlines()]
    rows = {words[0]: words for words in table if words[:1] in (["extract"], ["load"])}
    assert rows["extract"][3] == "completed" and rows["load"][3] == "available"
    assert got.stdout.splitlines()[-1] == "no connected worker runs kind `load`"
    assert json.loads(cli(server.address, "runs", "get", first, "--json").stdout)["id"] == first

    # A job not claimable for an hour is not backlog: its kind shows nothing available.
    later = timestamp_pb2.Timestamp()
    later.FromDatetime(datetime.now(timezone.utc) + timedelta(hours=1))
    await runs.Enqueue(runs_pb2.EnqueueRequest(kind="report", scheduled_at=later))
    stats = cli(server.address, "stats")
    assert stats.returncode == 0, stats.stderr
    lines = stats.stdout.splitlines()
    assert lines[0].split() == ["KIND", "AVAILABLE", "SCHEDULED", "RUNNING", "OLDEST", "AVAILABLE", "WORKERS",
                                "FREE", "SLOTS"]
    rows = lines[1:lines.index("")]
    figures = {words[0]: (words[1], words[3]) for words in map(str.split, rows)}
    assert figures == {"extract": ("1", "0"), "load": ("1", "0"), "report": ("0", "0")}  # (available, running)
    # No worker is connected: every kind with steps waiting says so.
    assert {words[0]: words[5] for words in map(str.split, rows)} == {"extract": "NONE", "load": "NONE",
                                                                       "report": "NONE"}
    assert lines[lines.index("") + 1:] == [f"no connected worker runs kind `{k}`" for k in ("extract", "load", "report")]
    kinds = json.loads(cli(server.address, "stats", "--json").stdout)["kinds"]
    # int64 is a JSON string; a zero is left out
    assert {k["kind"]: k.get("available") for k in kinds} == {"extract": "1", "load": "1", "report": None}


async def test_cancel_pause_resume(server: Any, stubs: Any) -> None:
    runs, _ = stubs
    run_id = await submit(runs)
    out = cli(server.address, "runs", "pause", run_id)
    assert out.returncode == 0 and out.stdout.strip() == f"run {run_id}: paused; state paused"
    assert "no change" in cli(server.address, "runs", "pause", run_id).stdout
    assert cli(server.address, "runs", "resume", run_id).stdout.strip() == f"run {run_id}: resumed; state running"
    resumed_again = cli(server.address, "runs", "resume", run_id)
    assert resumed_again.returncode == 1 and "FAILED_PRECONDITION" in resumed_again.stderr
    cancelled = cli(server.address, "runs", "cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["applied"] is True
    assert (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))).state == types_pb2.RUN_STATE_CANCELLED


async def test_retry_and_retry_all_reopen_discarded_nodes(server: Any, stubs: Any, engine: Engine) -> None:
    runs, _ = stubs
    run_id = await submit(runs)
    await step(engine, "extract")
    await step(engine, "load", fail=True)
    got = cli(server.address, "runs", "get", run_id)
    assert "state     failed" in got.stdout and "permanent: boom" in got.stdout
    out = cli(server.address, "runs", "retry", run_id, "load")
    assert out.returncode == 0 and out.stdout.strip() == f"run {run_id}: retried; state running"
    await step(engine, "load", fail=True)
    assert cli(server.address, "runs", "retry-all", run_id).returncode == 0
    assert (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))).state == types_pb2.RUN_STATE_RUNNING
    bad = cli(server.address, "runs", "retry", run_id, "extract")  # completed, not discarded
    assert bad.returncode == 1 and "FAILED_PRECONDITION" in bad.stderr


async def test_signal_completes_the_waiting_node(server: Any, stubs: Any) -> None:
    runs, _ = stubs
    run_id = await submit(runs, "approval")
    out = cli(server.address, "runs", "signal", run_id, "approve", "--payload", '{"by": "ops"}')
    assert out.returncode == 0 and "consumed by step" in out.stdout
    run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    assert run.state == types_pb2.RUN_STATE_COMPLETED
    again = cli(server.address, "runs", "signal", run_id, "approve")
    assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stderr
    bad = cli(server.address, "runs", "signal", run_id, "approve", "--payload", "{not json")
    assert bad.returncode == 2 and "--payload" in bad.stderr


async def test_purge_deletes_terminal_runs_in_batches(server: Any, stubs: Any) -> None:
    runs, _ = stubs
    ended = [await submit(runs) for _ in range(3)]
    alive = await submit(runs)
    for run_id in ended:
        await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id))
    none = cli(server.address, "runs", "purge", "--older-than", "1d")
    assert none.stdout.strip() == "deleted 0 terminal runs that ended more than 1d ago"
    out = cli(server.address, "runs", "purge", "--older-than", "0s", "--limit", "2", "--all", "--yes")
    assert out.returncode == 0 and out.stdout.strip() == "deleted 3 terminal runs that ended more than 0s ago"
    remaining = json.loads(cli(server.address, "runs", "list", "--json").stdout)
    assert [r["id"] for r in remaining] == [alive]
    assert cli(server.address, "runs", "purge", "--older-than", "soon").returncode == 2


async def test_purge_needs_a_unit_counts_on_dry_run_and_asks_first(server: Any, stubs: Any) -> None:
    runs, _ = stubs
    for _ in range(2):
        await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=await submit(runs)))

    def left() -> int:
        return len(json.loads(cli(server.address, "runs", "list", "--json").stdout))

    bare = cli(server.address, "runs", "purge", "--older-than", "30")
    assert bare.returncode == 2 and "'30' has no unit: write 30d, 30h, 30m or 30s" in bare.stderr
    for text in ("30d", "12h", "45m", "90s", "1h30m"):
        assert cli(server.address, "runs", "purge", "--older-than", text, "--dry-run").returncode == 0
    dry = cli(server.address, "runs", "purge", "--older-than", "0s", "--dry-run")
    assert dry.stdout.strip() == "would delete 2 terminal runs that ended more than 0s ago" and left() == 2
    assert json.loads(cli(server.address, "runs", "purge", "--older-than", "0s", "--dry-run", "--json").stdout) \
        == {"eligible": 2}
    piped = cli(server.address, "runs", "purge", "--older-than", "0s")  # stdin is no terminal: no one to ask
    assert piped.returncode == 2 and "confirm with --yes" in piped.stderr and left() == 2

    async def on_a_terminal(answer: bytes) -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        proc = spawn(server.address, "runs", "purge", "--older-than", "0s", stdin=follower, stdout=follower,
                     stderr=subprocess.STDOUT)
        os.close(follower)
        seen, deadline = b"", time.monotonic() + 60
        while b"[y/N]" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, f"no prompt; got {seen!r}"
            ready, _, _ = await asyncio.to_thread(select.select, [leader], [], [], 0.1)
            if ready:
                seen += os.read(leader, 65536)
        os.write(leader, answer + b"\n")
        code = await asyncio.to_thread(proc.wait, 60)
        os.close(leader)
        return code, seen

    code, prompt = await on_a_terminal(b"n")
    assert code == 2 and b"Delete 2 terminal runs that ended more than 0s ago? [y/N]" in prompt and left() == 2
    code, _ = await on_a_terminal(b"y")
    assert code == 0 and left() == 0


async def test_wait_prints_one_line_per_step_change_when_not_a_tty(server: Any, stubs: Any, engine: Engine) -> None:
    runs, _ = stubs
    run_id = await submit(runs)
    proc = spawn(server.address, "runs", "wait", run_id, "--interval", "0.05", stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    assert proc.stdout is not None
    lines: list[list[str]] = []

    async def read_until(*words: str) -> None:
        while list(words) not in [line[1:1 + len(words)] for line in lines]:
            raw = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)  # type: ignore[union-attr]
            assert raw, f"the CLI ended before printing {words}: {lines}"
            lines.append(raw.decode().split())

    await read_until("extract", "available")
    await read_until("load", "pending")
    await step(engine, "extract")
    await read_until("load", "pending", "->", "available")
    await step(engine, "load")
    await read_until("load", "available", "->", "completed")
    rest = await asyncio.wait_for(asyncio.to_thread(proc.stdout.read), 60)  # to the end: the CLI exits
    assert await asyncio.to_thread(proc.wait, 60) == 0
    assert rest.decode().splitlines()[-1].startswith(f"run {run_id} completed after")
    # (a poll may or may not catch the moment the step was running)
    assert {("extract", "available", "->", "completed"), ("extract", "running", "->", "completed")} & {
        tuple(line[1:5]) for line in lines}
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", line[0]) for line in lines)  # the server's time of the change


async def test_wait_exit_codes(server: Any, stubs: Any, engine: Engine) -> None:
    runs, _ = stubs
    run_id = await submit(runs)
    timed_out = cli(server.address, "runs", "wait", run_id, "--timeout", "0.3s")
    assert timed_out.returncode == 5 and "still running" in timed_out.stderr
    await step(engine, "extract")
    await step(engine, "load", fail=True)
    failed = cli(server.address, "runs", "wait", run_id, "--json")
    assert failed.returncode == 3 and json.loads(failed.stdout)["state"] == "RUN_STATE_FAILED"
    cancelled_id = await submit(runs)
    await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=cancelled_id))
    assert cli(server.address, "runs", "wait", cancelled_id).returncode == 4


async def test_wait_redraws_a_live_table_on_a_terminal(server: Any, stubs: Any, engine: Engine) -> None:
    runs, _ = stubs
    run_id = await submit(runs)
    leader, follower = pty.openpty()
    proc = spawn(server.address, "runs", "wait", run_id, "--interval", "0.05", stdout=follower,
                 stderr=subprocess.PIPE)
    os.close(follower)
    seen = b""

    async def read_until(marker: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 60
        while marker not in seen:
            assert time.monotonic() < deadline, f"{marker!r} not shown; got {seen!r}"
            ready, _, _ = await asyncio.to_thread(select.select, [leader], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:  # the CLI exited and closed the terminal
                    break

    await read_until(b"0/2 steps ended")
    await step(engine, "extract")
    await read_until(b"1/2 steps ended")
    await step(engine, "load")
    await read_until(b"completed after")
    assert await asyncio.to_thread(proc.wait, 60) == 0
    os.close(leader)
    assert b"\x1b[1A" in seen and b"\x1b[2K" in seen  # rich's Live: moved up and cleared, redrawn in place
    assert b"[" + b"#" * 20 + b"] 2/2 steps ended" in seen


async def test_connection_and_argument_errors(server: Any, stubs: Any) -> None:
    missing = cli(server.address, "runs", "get", "0190a0a0-0000-7000-8000-000000000000")
    assert missing.returncode == 1 and missing.stderr.startswith("cyclone: NOT_FOUND:")
    malformed = cli(server.address, "runs", "get", "not-an-id")
    assert malformed.returncode == 1 and "INVALID_ARGUMENT" in malformed.stderr and "run_id" in malformed.stderr
    down = cli("127.0.0.1:1", "stats", "--rpc-timeout", "5s")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr
    assert cli(server.address, "runs", "frobnicate").returncode == 2
