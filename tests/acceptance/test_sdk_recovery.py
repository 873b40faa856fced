"""The SDK under failure: killed workers, reclaims, cancellation, server restarts, two servers on one database."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cyclone_worker import Client, Context, Reconnect, Worker, Workflow
from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc
from cyclone_worker.values import to_value

from waits_helpers import DEADLINE, until

HERE = Path(__file__).parent


@pytest.fixture
def crashy_worker(tmp_path: Path) -> Iterator[Callable[[str, str], tuple[subprocess.Popen[bytes], Path]]]:
    """Starts sdk_worker_proc.py (a worker whose handler hangs) as its own process."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(address: str, kind: str) -> tuple[subprocess.Popen[bytes], Path]:
        leases = tmp_path / f"leases-{len(procs)}.jsonl"
        leases.touch()
        proc = subprocess.Popen([sys.executable, str(HERE / "sdk_worker_proc.py"), address, kind, str(leases)])
        procs.append(proc)
        return proc, leases

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def first_lease(leases: Path) -> dict[str, Any]:
    await until(lambda: leases.read_text().strip(), what=f"a lease in {leases.name}")
    return json.loads(leases.read_text().splitlines()[0])


async def replay(address: str, result: pb.StepResult) -> pb.ResultAck:
    """Send one result over a raw stream of a fresh worker (as a zombie would) and return its ack."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = workers_pb2_grpc.WorkersStub(channel).Connect()
        hello = pb.Hello(worker_id="zombie", kinds=["nothing-to-run"], slots=1, sdk="test/raw")
        await call.write(pb.WorkerMessage(hello=hello))
        assert (await call.read()).WhichOneof("msg") == "welcome"
        await call.write(pb.WorkerMessage(results=pb.Results(results=[result])))
        while True:
            msg = await asyncio.wait_for(call.read(), DEADLINE)
            if msg.WhichOneof("msg") == "acks":
                call.cancel()
                return msg.acks.acks[0]  # type: ignore[no-any-return]


def completed(step_id: str, generation: int, output: Any) -> pb.StepResult:
    return pb.StepResult(step_id=step_id, lease_generation=generation,
                         completed=pb.Completed(output=to_value(output)))


async def test_a_killed_workers_step_goes_to_another_worker_with_the_same_attempt(
        start_server: Callable[..., Any], db_url: str, crashy_worker: Any) -> None:
    server = start_server(db_url, lease_ttl=1)
    async with Client(server.address) as client:
        run_id = await client.enqueue("crashy")
        proc, leases = crashy_worker(server.address, "crashy")
        dead = await first_lease(leases)
        assert (dead["attempt"], dead["reclaims"]) == (1, 0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

        seen: list[Context] = []
        worker = Worker(server.address, slots=1)

        @worker.handler("crashy")
        async def crashy(ctx: Context) -> str:
            seen.append(ctx)
            return "recovered"

        async with worker:
            assert await client.result(run_id, timeout=DEADLINE) == {"crashy": "recovered"}
        (ctx,) = seen
        assert ctx.step_id == dead["step_id"]
        assert (ctx.attempt, ctx.reclaims) == (1, 1)
        assert ctx.lease_generation > dead["lease_generation"]

        # The killed worker's result, replayed with its old generation, is refused.
        ack = await replay(server.address, completed(dead["step_id"], dead["lease_generation"], "zombie"))
        assert ack.status == pb.ACK_STATUS_STALE
        step = (await client.get(run_id)).steps[0]
        assert (step.state, step.output, step.attempt, step.reclaims) == ("completed", "recovered", 1, 1)
        assert step.lease_generation == ctx.lease_generation


async def test_past_max_reclaims_the_step_is_discarded_with_reclaim_limit(
        start_server: Callable[..., Any], db_url: str, crashy_worker: Any) -> None:
    server = start_server(db_url, lease_ttl=1)
    async with Client(server.address) as client:
        run_id = await client.enqueue("crashy", max_reclaims=1)
        for reclaims in (0, 1):
            proc, leases = crashy_worker(server.address, "crashy")
            lease = await first_lease(leases)
            assert (lease["attempt"], lease["reclaims"]) == (1, reclaims)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        run = await client.wait(run_id, timeout=DEADLINE)
        step = run.steps[0]
        assert run.state == "failed"
        assert (step.state, step.error_kind, step.attempt, step.reclaims) == ("discarded", "reclaim_limit", 1, 1)


async def test_cancelling_a_run_stops_running_handlers_and_their_late_results_change_nothing(
        start_server: Callable[..., Any], db_url: str) -> None:
    lease_ttl = 6.0  # renewals (and so Stops) every 2 s
    server = start_server(db_url, lease_ttl=lease_ttl)
    started: dict[str, Context] = {}
    seen: dict[str, float] = {}
    worker = Worker(server.address, slots=2)

    @worker.handler("waiter")
    async def waiter(ctx: Context) -> str:
        started[ctx.node] = ctx
        try:
            await ctx.cancelled.wait()
        finally:
            seen[ctx.node] = time.monotonic()
        return "late"

    @worker.handler("poller")
    def poller(ctx: Context) -> str:  # a thread handler cannot be interrupted: it polls
        started[ctx.node] = ctx
        end = time.monotonic() + DEADLINE
        while not ctx.is_cancelled() and time.monotonic() < end:
            time.sleep(0.02)
        seen[ctx.node] = time.monotonic()
        return "late"

    async with Client(server.address) as client, worker:
        await client.register(Workflow("cancel-me").task("waiter").task("poller"))
        run_id = await client.submit("cancel-me")
        await until(lambda: len(started) == 2, what="both handlers to start")
        cancelled_at = time.monotonic()
        run = await client.cancel(run_id)
        assert run.state == "cancelled"
        await until(lambda: len(seen) == 2, what="both handlers to see the cancellation")
        # Told on the next renewal (every lease_ttl/3), well before the lease could expire.
        assert max(seen.values()) - cancelled_at < lease_ttl
        assert started["waiter"].cancelled.reason == "cancelled"
        await until(lambda: worker.counts["stopped_cancelled"] == 2, what="two stops")

        ctx = started["poller"]
        ack = await replay(server.address, completed(ctx.step_id, ctx.lease_generation, "late"))
        assert ack.status == pb.ACK_STATUS_ENDED
        run = await client.get(run_id)
        assert run.state == "cancelled"
        assert [(s.state, s.cancel_cause, s.output) for s in run.steps] == [("cancelled", "operator", None)] * 2


async def test_workers_reconnect_across_a_server_restart_and_deliver_results_held_meanwhile(
        start_server: Callable[..., Any], db_url: str) -> None:
    server = start_server(db_url, lease_ttl=10, extra_args=["--grace", "1"])
    runs: Counter[str] = Counter()
    gate = asyncio.Event()
    fast = Reconnect(initial=0.1, maximum=0.5)
    w1 = Worker(server.address, slots=2, reconnect=fast)
    w2 = Worker(server.address, slots=2, reconnect=fast)

    a_finished = asyncio.Event()

    async def step(ctx: Context) -> str:
        runs[ctx.node] += 1
        if ctx.node == "a":
            await gate.wait()
            a_finished.set()  # the worker records the result in this same event-loop step
        return ctx.node

    for w in (w1, w2):
        for kind in ("b", "c"):
            w.register(kind, step)
    w1.register("a", step)

    async with Client(server.address) as client, w1, w2:
        await client.register(Workflow("chain").task("a").task("b", deps=["a"]).task("c", deps=["b"]))
        run_id = await client.submit("chain")
        await until(lambda: runs["a"] == 1, what="a to start")
        await asyncio.to_thread(server.terminate)
        await until(lambda: not w1.connected and not w2.connected, what="the workers to notice")
        gate.set()  # "a" finishes while no server is up: its result waits in the worker
        await asyncio.wait_for(a_finished.wait(), DEADLINE)
        await asyncio.sleep(0.1)
        assert not w1.connected
        await asyncio.to_thread(server.restart)
        assert await client.result(run_id, timeout=DEADLINE) == {"c": "c"}
        await until(lambda: w1.connected and w2.connected, what="both workers to reconnect")
        run = await client.get(run_id)
    assert runs == {"a": 1, "b": 1, "c": 1}
    a = run.step("a")
    # The held lease survived the restart: no reclaim, no second claim.
    assert (a.attempt, a.reclaims, a.lease_generation) == (1, 0, 1)
    assert w1.counts["welcomes"] >= 2 and w2.counts["welcomes"] >= 2


async def test_two_servers_on_one_database_run_every_step_exactly_once(
        start_server: Callable[..., Any], db_url: str) -> None:
    servers = [start_server(db_url), start_server(db_url)]
    executions: Counter[tuple[str, str]] = Counter()
    by_server: Counter[int] = Counter()
    workers = []
    for i, srv in enumerate(servers):
        for _ in range(2):
            w = Worker(srv.address, slots=3)

            async def work(ctx: Context, i: int = i) -> int:
                executions[(ctx.run_id, ctx.node)] += 1
                by_server[i] += 1
                await asyncio.sleep(0.02)
                return len(ctx.parents)

            for kind in ("split", "part", "merge"):
                w.register(kind, work)
            workers.append(w)
    wf = Workflow("fan").task("split")
    for j in range(5):
        wf.task(f"p{j}", kind="part", deps=["split"])
    wf.task("merge", deps=[f"p{j}" for j in range(5)])

    async with Client(servers[0].address) as client:
        await client.register(wf)
        for w in workers:
            await w.__aenter__()
        try:
            run_ids = [await client.submit("fan", {"n": n}) for n in range(12)]
            for run_id in run_ids:
                assert await client.result(run_id, timeout=DEADLINE) == {"merge": 5}
        finally:
            for w in workers:
                await w.__aexit__(None, None, None)
    assert len(executions) == 12 * 7
    assert set(executions.values()) == {1}
    assert by_server[0] > 0 and by_server[1] > 0
