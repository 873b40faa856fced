"""The worker's side of the stream protocol, against a scripted Workers server on a real port.

The real server cannot be made to go silent, refuse a Hello or lose a lease on cue; a small
grpc.aio server that speaks workers.proto by script can, so these pin the SDK's rules:
answer Ping with Pong, treat 3 silent heartbeats as a dead stream, re-send held leases in
Hello, stop the handlers of Welcome.lost, give up on INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2

from cyclone_worker import Context, CycloneClientError, Reconnect, Worker
from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc

DEADLINE = 30.0
HEARTBEAT = duration_pb2.Duration(nanos=200_000_000)

Script = Callable[[int, pb.Hello, grpc.aio.ServicerContext], Awaitable[None]]


class Scripted(workers_pb2_grpc.WorkersServicer):
    """Runs `script(connection number, hello, context)` for each stream after reading its Hello."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.hellos: list[pb.Hello] = []

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        first = await context.read()
        self.hellos.append(first.hello)
        await self.script(len(self.hellos), first.hello, context)


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Script], Awaitable[tuple[str, Scripted]]]]:
    servers: list[grpc.aio.Server] = []

    async def start(script: Script) -> tuple[str, Scripted]:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        servicer = Scripted(script)
        workers_pb2_grpc.add_WorkersServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", servicer

    yield start
    for server in servers:
        await server.stop(0)


def welcome(*lost: pb.LeaseRef) -> pb.ServerMessage:
    return pb.ServerMessage(welcome=pb.Welcome(server_id="scripted", heartbeat_interval=HEARTBEAT,
                                               lease_ttl=duration_pb2.Duration(seconds=1), lost=list(lost)))


async def read_until(context: grpc.aio.ServicerContext, kind: str) -> Any:
    while True:
        msg = await asyncio.wait_for(context.read(), DEADLINE)
        if msg.WhichOneof("msg") == kind:
            return getattr(msg, kind)


async def test_a_silent_stream_is_dead_after_three_heartbeats_and_the_worker_reconnects(scripted: Any) -> None:
    async def silent(n: int, hello: pb.Hello, context: grpc.aio.ServicerContext) -> None:
        await context.write(welcome())
        await asyncio.sleep(3600)  # never a ping

    address, servicer = await scripted(silent)
    worker = Worker(address, reconnect=Reconnect(initial=0.05, maximum=0.2))
    worker.register("noop", lambda ctx: None)
    async with worker:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while len(servicer.hellos) < 2:
            assert loop.time() - start < DEADLINE, "the worker never gave up on the silent stream"
            await asyncio.sleep(0.05)
        # 3 heartbeats of 0.2 s: not before 0.6 s of silence.
        assert loop.time() - start >= 0.5
    assert worker.counts["disconnects"] >= 1


async def test_held_leases_are_resent_in_hello_and_lost_ones_stop_their_handlers(scripted: Any) -> None:
    lease = pb.Lease(run_id="r1", step_id="s1", node="slow", kind="slow", attempt=1, max_attempts=3,
                     lease_generation=4)
    ref = pb.LeaseRef(step_id="s1", lease_generation=4)
    pong = asyncio.get_running_loop().create_future()

    async def script(n: int, hello: pb.Hello, context: grpc.aio.ServicerContext) -> None:
        if n == 1:
            await context.write(welcome())
            await context.write(pb.ServerMessage(ping=pb.Ping(nonce=7)))
            pong.set_result((await read_until(context, "pong")).nonce)
            await context.write(pb.ServerMessage(leases=pb.Leases(leases=[lease])))
            await asyncio.sleep(0.3)  # the handler starts
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scripted restart")
        await context.write(welcome(ref))  # the second stream: the lease is gone
        await asyncio.sleep(3600)

    address, servicer = await scripted(script)
    stopped = asyncio.Event()
    worker = Worker(address, slots=2, reconnect=Reconnect(initial=0.05, maximum=0.2))

    @worker.handler("slow")
    async def slow(ctx: Context) -> str:
        try:
            await asyncio.sleep(DEADLINE)
        finally:
            if ctx.is_cancelled():
                stopped.set()
        return "never"

    async with worker:
        assert await asyncio.wait_for(pong, DEADLINE) == 7
        await asyncio.wait_for(stopped.wait(), DEADLINE)
    first, second = servicer.hellos[:2]
    assert (first.worker_id, list(first.kinds), first.slots, list(first.held)) == (worker.worker_id, ["slow"], 2, [])
    assert first.sdk == f"python/{importlib.metadata.version('cyclone-workflows')}"  # the installed SDK's version
    assert second.worker_id == worker.worker_id and list(second.held) == [ref]
    assert worker.counts["stopped_lost"] == 1


async def test_handlers_of_every_shape_answer_their_leases(scripted: Any) -> None:
    """An async function, a plain function (run in a thread) and a callable object that cannot
    be hashed (a dataclass with __call__), each registered as a handler: each lease is answered
    with its handler's output, and a second lease of each kind is too (the worker remembers per
    kind how to call a handler)."""
    leases = [pb.Lease(run_id=f"r{i}", step_id=f"s{kind}{i}", node=kind, kind=kind, attempt=1, max_attempts=3,
                       lease_generation=1) for i in range(2) for kind in ("coro", "plain", "object")]
    answered = asyncio.get_running_loop().create_future()

    async def script(n: int, hello: pb.Hello, context: grpc.aio.ServicerContext) -> None:
        await context.write(welcome())
        await context.write(pb.ServerMessage(leases=pb.Leases(leases=leases)))
        results: dict[str, Any] = {}
        while len(results) < len(leases):
            for r in (await read_until(context, "results")).results:
                results[r.step_id] = r
        await context.write(pb.ServerMessage(acks=pb.ResultAcks(acks=[
            pb.ResultAck(step_id=r.step_id, lease_generation=r.lease_generation, status=pb.ACK_STATUS_APPLIED)
            for r in results.values()])))  # (so that the worker's stop waits for nothing)
        answered.set_result(results)
        await asyncio.sleep(3600)

    @dataclasses.dataclass
    class Doubler:  # __eq__ without __hash__: unhashable
        factor: int

        def __call__(self, ctx: Context) -> int:
            return self.factor * 21

    async def coro(ctx: Context) -> str:
        return f"coro {ctx.run_id}"

    address, _ = await scripted(script)
    worker = Worker(address, slots=8, reconnect=Reconnect(initial=0.05, maximum=0.2))
    worker.register("coro", coro)
    worker.register("plain", lambda ctx: f"plain {ctx.run_id}")
    worker.register("object", Doubler(2))
    async with worker:
        results = await asyncio.wait_for(answered, DEADLINE)
    outputs = {step_id: (r.WhichOneof("outcome"), r.completed.output) for step_id, r in results.items()}
    for i in range(2):
        assert outputs[f"scoro{i}"] == ("completed", struct_pb2.Value(string_value=f"coro r{i}"))
        assert outputs[f"splain{i}"] == ("completed", struct_pb2.Value(string_value=f"plain r{i}"))
        assert outputs[f"sobject{i}"] == ("completed", struct_pb2.Value(number_value=42))


async def test_a_tracer_provider_that_cannot_load_leaves_the_handlers_running_without_spans(
        scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_PYTHON_TRACER_PROVIDER naming no entry point makes OpenTelemetry raise on every
    lookup of the provider: the worker says so once and runs its handlers without spans, on the
    same stream."""
    pytest.importorskip("opentelemetry")
    from cyclone_worker import _tracing

    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "no_such_provider")
    monkeypatch.setattr(_tracing, "_provider_failed", False, raising=False)  # (restored after the test)
    leases = [pb.Lease(run_id="r1", step_id=f"s{i}", node="a", kind="a", attempt=1, max_attempts=3,
                       lease_generation=1) for i in range(2)]
    answered = asyncio.get_running_loop().create_future()

    async def script(n: int, hello: pb.Hello, context: grpc.aio.ServicerContext) -> None:
        await context.write(welcome())
        results: list[Any] = []
        for lease in leases:  # two Leases messages: the provider is looked up for each
            await context.write(pb.ServerMessage(leases=pb.Leases(leases=[lease])))
            results += (await read_until(context, "results")).results
        await context.write(pb.ServerMessage(acks=pb.ResultAcks(acks=[
            pb.ResultAck(step_id=r.step_id, lease_generation=1, status=pb.ACK_STATUS_APPLIED) for r in results])))
        answered.set_result(results)
        await asyncio.sleep(3600)

    address, servicer = await scripted(script)
    worker = Worker(address, reconnect=Reconnect(initial=0.05, maximum=0.2))
    worker.register("a", lambda ctx: "done")
    async with worker:
        results = await asyncio.wait_for(answered, DEADLINE)
    assert [(r.step_id, r.WhichOneof("outcome"), r.completed.output.string_value) for r in results] == [
        ("s0", "completed", "done"), ("s1", "completed", "done")]
    assert len(servicer.hellos) == 1 and worker.counts["disconnects"] == 0


async def test_invalid_argument_ends_run_with_the_error_instead_of_reconnecting(scripted: Any) -> None:
    async def refuse(n: int, hello: pb.Hello, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.kinds: 'bad kind' is not a valid kind")

    address, servicer = await scripted(refuse)
    worker = Worker(address, reconnect=Reconnect(initial=0.05, maximum=0.2))
    worker.register("bad kind", lambda ctx: None)
    with pytest.raises(CycloneClientError) as e:
        await asyncio.wait_for(worker.run(), DEADLINE)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "hello.kinds" in e.value.message
    assert len(servicer.hellos) == 1


async def test_reconnect_attempts_run_out_with_the_last_error() -> None:
    worker = Worker("127.0.0.1:1", reconnect=Reconnect(initial=0.01, maximum=0.05, attempts=3))
    worker.register("noop", lambda ctx: None)
    with pytest.raises(CycloneClientError) as e:
        await asyncio.wait_for(worker.run(), DEADLINE)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
