"""`cyclone-server --processes N`: N server processes on one port, started and stopped as one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import grpc

from cyclone_worker import Client, Context, Worker
from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc

DEADLINE = 30.0


async def welcome_server_id(address: str) -> str:
    """Open a worker stream on a connection of its own; the server_id of its Welcome."""
    # A subchannel pool of its own: channels to one address otherwise share one connection
    # process-wide, and it would keep talking to the process that accepted it first.
    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        call = workers_pb2_grpc.WorkersStub(channel).Connect()
        await call.write(pb.WorkerMessage(hello=pb.Hello(worker_id=f"probe-{uuid.uuid4()}", kinds=["probe"],
                                                         slots=1)))
        first = await asyncio.wait_for(call.read(), DEADLINE)
        call.cancel()
        return first.welcome.server_id


async def test_processes_share_one_port_serve_one_database_and_stop_together(db_url, start_server) -> None:
    srv = start_server(db_url, extra_args=["--processes", "2", "--server-id", "multi"])
    ready = json.loads(next(p for p in sorted(srv.workdir.glob("ready-*.json"))).read_text())
    assert len(ready["pids"]) == 2 and ready["pid"] == srv.proc.pid
    # The kernel spreads connections between the two: 24 connections all landing on one
    # process would happen about once in 8 million tries.
    ids = {await welcome_server_id(srv.address) for _ in range(24)}
    assert ids == {"multi-0", "multi-1"}

    worker = Worker(srv.address, slots=8)
    done: list[str] = []

    @worker.handler("job")
    async def job(ctx: Context) -> int:
        done.append(ctx.step_id)
        return ctx.input

    async with Client(srv.address) as client, worker:
        runs = [await client.enqueue("job", i) for i in range(20)]
        results = [await client.result(r, timeout=DEADLINE) for r in runs]
    assert results == [{"job": i} for i in range(20)] and len(done) == 20

    assert srv.terminate() == 0  # SIGTERM to the supervisor stops both, gracefully
    for pid in ready["pids"]:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"server process {pid} outlived its supervisor")


async def test_when_one_process_dies_the_group_stops(db_url, start_server) -> None:
    srv = start_server(db_url, extra_args=["--processes", "2"])
    ready = json.loads(next(p for p in sorted(srv.workdir.glob("ready-*.json"))).read_text())
    os.kill(ready["pids"][0], signal.SIGKILL)
    code = await asyncio.to_thread(srv.proc.wait, DEADLINE)
    assert code != 0
