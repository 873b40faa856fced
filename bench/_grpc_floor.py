"""The transport's floor for one Enqueue call per job: a bare grpc.aio server whose Enqueue
answers a constant at once (no database, no checks), called by the same SDK `Client` with
the same concurrency as Cyclone's Enqueue phase in `throughput.py`.

Whatever Cyclone does per call comes on top of this, so the floor bounds its Enqueue rate
on the machine; the server's and the client's CPU per call say where the floor's time goes.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import grpc
import psutil

from cyclone_proto import runs_pb2, runs_pb2_grpc
from cyclone_worker import Client

RUN_ID = "0190a1b2-0000-7000-8000-000000000000"
STEP_ID = "0190a1b2-0000-7000-8000-000000000001"


class _Constant(runs_pb2_grpc.RunsServicer):
    async def Enqueue(self, request: runs_pb2.EnqueueRequest,
                      context: grpc.aio.ServicerContext) -> runs_pb2.EnqueueResponse:
        return runs_pb2.EnqueueResponse(run_id=RUN_ID, step_id=STEP_ID, created=True)


def _serve(ports: mp.Queue) -> None:
    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        runs_pb2_grpc.add_RunsServicer_to_server(_Constant(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ports.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


async def _calls(address: str, jobs: int, kind: str, concurrency: int) -> tuple[float, float]:
    """(seconds, client CPU seconds) for `jobs` calls, `concurrency` in flight, after a warm-up."""
    async with Client(address, enqueue_calls=0) as client:  # one Enqueue call per job
        await client.enqueue(kind, {"warm": 1})
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await client.enqueue(kind, {"i": i})

        t0, c0 = time.monotonic(), os.times()
        await asyncio.gather(*(one(i) for i in range(jobs)))
        t1, c1 = time.monotonic(), os.times()
    return t1 - t0, (c1.user - c0.user) + (c1.system - c0.system)


def grpc_floor(jobs: int, kind: str, concurrency: int = 64) -> dict[str, float]:
    """calls/s, and the server's and the client's CPU microseconds per call."""
    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_serve, args=(ports,), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=60)
        proc = psutil.Process(server.pid)
        before = sum(proc.cpu_times()[:2])
        seconds, client_cpu = asyncio.run(_calls(f"127.0.0.1:{port}", jobs, kind, concurrency))
        server_cpu = sum(proc.cpu_times()[:2]) - before
    finally:
        server.terminate()
        server.join(10)
    return {"calls_per_s": jobs / seconds, "server_us": server_cpu / jobs * 1e6, "client_us": client_cpu / jobs * 1e6}
