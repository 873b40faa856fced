"""The server through a lost database: fast UNAVAILABLE, health, commits in doubt, and no re-run of healthy work.

The server reaches Postgres through a proxy (pg_proxy.PgProxy) that the test cuts and
restores, or that loses the answer to one statement after Postgres ran it: what a crashed
primary and a failover look like from the server. docs/operations.md ("High availability")
describes the behaviour these tests hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cyclone_proto import runs_pb2, runs_pb2_grpc
from cyclone_proto import workers_pb2 as pb
from cyclone_server.store.engine import Engine
from cyclone_worker import Context, Worker

from pg_proxy import PgProxy, SilentHost
from test_stream import RawWorker, completed, enqueue
from waits_helpers import until

DEADLINE = 60.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


async def health(channel: grpc.aio.Channel, service: str = "cyclone.v1.Runs") -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return (await health_pb2_grpc.HealthStub(channel).Check(request, timeout=10)).status


async def step_of(engine: Engine, run_id: str) -> dict[str, Any]:
    return (await engine.get_run(run_id))["steps"][0]


async def test_a_result_whose_commit_was_in_doubt_is_acked_applied(start_server: Callable[..., Any], db_url: str,
                                                                    engine: Engine) -> None:
    with PgProxy(db_url) as proxy:
        srv = start_server(proxy.url)
        async with grpc.aio.insecure_channel(srv.address) as channel:
            (job,) = await enqueue(channel, "resize")
            w = RawWorker(channel, ["resize"], 1)
            try:
                await w.connect()
                (lease,) = await w.leases(1)
                # Postgres applies the result; the server's connection breaks before the answer.
                proxy.swallow_answer_to(b"cyclone_results_apply")
                await w.send(completed(lease, "done"))
                (ack,) = await w.acks(1)
            finally:
                await w.close()
        assert proxy.swallowed == 1, "the answer to the result's statement was not lost: nothing was in doubt"
        assert ack.status == pb.ACK_STATUS_APPLIED, ack
        step = await step_of(engine, job.run_id)
        assert (step["state"], step["output"], step["attempt"]) == ("completed", "done", 1)


async def test_of_two_answers_to_one_lease_in_doubt_only_the_first_is_applied(
        start_server: Callable[..., Any], db_url: str, engine: Engine) -> None:
    with PgProxy(db_url) as proxy:
        srv = start_server(proxy.url)
        async with grpc.aio.insecure_channel(srv.address) as channel:
            (job,) = await enqueue(channel, "resize")
            w = RawWorker(channel, ["resize"], 1)
            try:
                await w.connect()
                (lease,) = await w.leases(1)
                proxy.swallow_answer_to(b"cyclone_results_apply")
                await w.send(completed(lease, "done"), completed(lease, "done"))
                acks = await w.acks(2)
            finally:
                await w.close()
        assert proxy.swallowed == 1
        assert [a.status for a in acks] == [pb.ACK_STATUS_APPLIED, pb.ACK_STATUS_ENDED], acks
        assert (await step_of(engine, job.run_id))["state"] == "completed"


async def test_while_the_database_is_unreachable_calls_are_unavailable_and_health_not_serving(
        start_server: Callable[..., Any], db_url: str) -> None:
    with PgProxy(db_url) as proxy:
        srv = start_server(proxy.url, sweep_interval=0.2)
        async with grpc.aio.insecure_channel(srv.address) as channel:
            runs = runs_pb2_grpc.RunsStub(channel)
            run_id = (await enqueue(channel, "k"))[0].run_id
            proxy.cut()
            # A call is refused UNAVAILABLE (which retry policies handle) well before its
            # own 30 s deadline, not left to run out as DEADLINE_EXCEEDED.
            try:
                await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id), timeout=30)
                raise AssertionError("GetRun answered while the database was unreachable")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
            await until(lambda: _health_is(channel, NOT_SERVING), "health NOT_SERVING", DEADLINE)
            # The server as a whole stays SERVING: a liveness probe must not restart it.
            assert await health(channel, "") == SERVING
            proxy.restore()
            await until(lambda: _health_is(channel, SERVING), "health SERVING again", DEADLINE)
            assert (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id), timeout=30)).id == run_id


async def _health_is(channel: grpc.aio.Channel, status: int) -> bool:
    return await health(channel) == status


async def test_an_outage_longer_than_the_lease_ttl_runs_no_handler_of_a_connected_worker_again(
        start_server: Callable[..., Any], db_url: str, engine: Engine) -> None:
    lease_ttl = 3.0
    with PgProxy(db_url) as proxy:
        srv = start_server(proxy.url, lease_ttl=lease_ttl, sweep_interval=0.2)
        release = threading.Event()
        runs: list[tuple[str, int]] = []

        worker = Worker(srv.address, slots=2)

        @worker.handler("long")
        def long(ctx: Context) -> dict[str, int]:
            runs.append((ctx.step_id, ctx.attempt))
            release.wait(DEADLINE)
            return {"ran": len(runs)}

        async with worker:
            async with grpc.aio.insecure_channel(srv.address) as channel:
                (job,) = await enqueue(channel, "long")
                await until(lambda: runs, "the handler running", DEADLINE)
                proxy.cut()
                await until(lambda: _health_is(channel, NOT_SERVING), "the server seeing the outage", DEADLINE)
                # The outage outlasts the lease: without renewals, its expiry passes.
                out_until = time.monotonic() + 2 * lease_ttl
                await until(lambda: time.monotonic() > out_until, "two lease TTLs of outage", DEADLINE)
                proxy.restore()
                await until(lambda: _health_is(channel, SERVING), "the database back", DEADLINE)
                # Past the server's sweep after its reconnect: any reclaim would have happened.
                swept_after = time.monotonic() + lease_ttl / 3 + 2.0
                await until(lambda: time.monotonic() > swept_after, "the first sweep after the outage", DEADLINE)
                release.set()
                step = await until(lambda: _completed(engine, job.run_id), "the step completed", DEADLINE)
        assert runs == [(str(step["id"]), 1)], runs  # ran once: never reclaimed and run again
        assert (step["attempt"], step["reclaims"], step["output"]) == (1, 0, {"ran": 1})


async def _completed(engine: Engine, run_id: str) -> dict[str, Any] | None:
    step = await step_of(engine, run_id)
    return step if step["state"] == "completed" else None


async def test_a_first_host_that_never_answers_is_passed_over(start_server: Callable[..., Any], db_url: str,
                                                               engine: Engine) -> None:
    # host1 accepts and never answers (a hung postmaster); the database is on host2. libpq
    # without a connect timeout waits on host1 for ever; the server gives it CONNECT_TIMEOUT.
    params = conninfo_to_dict(db_url)
    with SilentHost() as silent:
        hosts = f"127.0.0.1,{params.get('host') or '127.0.0.1'}"
        ports = f"{silent.port},{params.get('port') or 5432}"
        url = make_conninfo(**{k: v for k, v in params.items() if k not in ("host", "port", "hostaddr")},
                            host=hosts, port=ports)
        srv = start_server(url)
        worker = Worker(srv.address)
        worker.register("k", lambda ctx: {"ok": True})
        async with worker, grpc.aio.insecure_channel(srv.address) as channel:
            (job,) = await enqueue(channel, "k")
            step = await until(lambda: _completed(engine, job.run_id), "a job done through host2", DEADLINE)
        assert step["output"] == {"ok": True}
