"""The real server's metrics endpoint: after a known workload, every counter and gauge equals what the database says.

The server runs with `--metrics-listen 127.0.0.1:0` and reports the bound port in its
ready file ("metrics_address"). The workload is run by an SDK worker over the real
stream (completions, retried failures, a permanent failure, a max_attempts discard, a
step still running), plus one raw stream that completes a step and replays the same
result, which the lease fence refuses as ENDED.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import psycopg

from cyclone_worker import Client, Context, Permanent, RetryAfter, Worker
from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc

from test_metrics import http_get, parse
from waits_helpers import DEADLINE, until

N_OK, M_FLAKY, N_BACKLOG = 12, 3, 4


def metrics_port(srv: Any) -> int:
    """The bound metrics port, from the newest ready file of `srv`."""
    ready = max(srv.workdir.glob("ready-*.json"), key=lambda p: p.stat().st_mtime)
    address = json.loads(ready.read_text())["metrics_address"]
    host, _, port = address.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    return int(port)


async def scrape(port: int) -> dict[str, float]:
    """The samples, plus "cyclone_reclaims_total": the sum of its `how` series (the database
    counts a step's reclaims, not how each came about)."""
    status, _, body = await http_get(port)
    assert status == 200
    samples = parse(body)
    samples["cyclone_reclaims_total"] = sum(v for k, v in samples.items() if k.startswith("cyclone_reclaims_total{"))
    return samples


async def database_says(conn: psycopg.AsyncConnection) -> dict[str, float]:
    """The expected samples, in the metric names and labels of the exposition, read from the tables."""
    expected: dict[str, float] = {}
    rows = await (await conn.execute(
        "SELECT kind, sum(lease_generation), count(*) FILTER (WHERE state = 'completed'), sum(reclaims) "
        "FROM cyclone_steps GROUP BY kind")).fetchall()
    reclaims = 0
    for kind, claims, completed, kind_reclaims in rows:
        if claims:  # a kind never claimed has no claims sample
            expected[f'cyclone_claims_total{{kind="{kind}"}}'] = claims
        if completed:
            expected[f'cyclone_completions_total{{kind="{kind}"}}'] = completed
        reclaims += kind_reclaims
    expected["cyclone_reclaims_total"] = reclaims
    # Every failed attempt is one entry of the step's error history, with its error_kind
    # (error: retried; permanent; max_attempts): exactly what cyclone_failures_total counts.
    for kind, error_kind, n in await (await conn.execute(
            "SELECT s.kind, e ->> 'error_kind', count(*) FROM cyclone_steps s, jsonb_array_elements(s.errors) e "
            "GROUP BY 1, 2")).fetchall():
        expected[f'cyclone_failures_total{{error_kind="{error_kind}",kind="{kind}"}}'] = n
    # Available: claimable now; scheduled: waiting for a later scheduled_at (not backlog).
    for kind, available, scheduled, running in await (await conn.execute(
            "SELECT kind, count(*) FILTER (WHERE state = 'available' AND scheduled_at <= now()), "
            "count(*) FILTER (WHERE state = 'available' AND scheduled_at > now()), "
            "count(*) FILTER (WHERE state = 'running') "
            "FROM cyclone_steps WHERE state IN ('available', 'running') GROUP BY kind")).fetchall():
        expected[f'cyclone_available{{kind="{kind}"}}'] = available
        expected[f'cyclone_scheduled{{kind="{kind}"}}'] = scheduled
        expected[f'cyclone_running{{kind="{kind}"}}'] = running
    return expected


async def complete_and_replay(address: str) -> tuple[int, int]:
    """Over a raw stream: take the one `raw` lease, complete it, send the same result again; returns both acks."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = workers_pb2_grpc.WorkersStub(channel).Connect()
        await call.write(pb.WorkerMessage(hello=pb.Hello(worker_id="raw-replayer", kinds=["raw"], slots=1)))
        acks: list[int] = []
        result = None
        async for msg in call:
            which = msg.WhichOneof("msg")
            if which == "ping":
                await call.write(pb.WorkerMessage(pong=pb.Pong(nonce=msg.ping.nonce)))
            elif which == "leases":
                lease = msg.leases.leases[0]
                result = pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                                       completed=pb.Completed())
                await call.write(pb.WorkerMessage(results=pb.Results(results=[result])))
            elif which == "acks":
                acks += [a.status for a in msg.acks.acks]
                if len(acks) == 1:  # the replay goes out only after the first result was applied
                    await call.write(pb.WorkerMessage(results=pb.Results(results=[result])))
                else:
                    await call.done_writing()
                    break
        call.cancel()
    return acks[0], acks[1]


async def test_metrics_address_is_reported_with_port_0(start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    samples = await scrape(metrics_port(srv))
    assert samples["cyclone_stats_up"] == 1 and samples["cyclone_connected_workers"] == 0


async def test_counters_and_gauges_equal_the_database_after_a_known_workload(
        start_server: Callable[..., Any], db_url: str, conn: psycopg.AsyncConnection) -> None:
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    port = metrics_port(srv)
    release = asyncio.Event()
    worker = Worker(srv.address, slots=4, grace=2.0)  # a failed assertion leaves "slow" running

    @worker.handler("ok")
    async def ok(ctx: Context) -> dict[str, Any]:
        return {"n": ctx.input["n"]}

    @worker.handler("flaky")
    async def flaky(ctx: Context) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise RetryAfter(0.05, "first attempt fails")
        return {"attempt": ctx.attempt}

    @worker.handler("doomed")
    async def doomed(ctx: Context) -> None:
        raise Permanent("cannot be done")

    @worker.handler("hopeless")
    async def hopeless(ctx: Context) -> None:
        raise RetryAfter(0.05, "fails every time")

    @worker.handler("slow")
    async def slow(ctx: Context) -> None:
        await release.wait()

    async with Client(srv.address) as client, worker:
        for n in range(N_OK):
            await client.enqueue("ok", {"n": n})
        for n in range(M_FLAKY):
            await client.enqueue("flaky", {"n": n}, max_attempts=5)
        doomed_run = await client.enqueue("doomed")
        hopeless_run = await client.enqueue("hopeless", max_attempts=2)
        await client.enqueue("slow")
        for n in range(N_BACKLOG):
            await client.enqueue("backlog", {"n": n})  # no worker runs this kind
        await client.enqueue("backlog", {"n": "later"}, scheduled_at=3600)  # not claimable for an hour
        await client.enqueue("raw")
        assert await asyncio.wait_for(complete_and_replay(srv.address), DEADLINE) == (
            pb.ACK_STATUS_APPLIED, pb.ACK_STATUS_ENDED)

        async def workload_done() -> bool:
            row = await (await conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'completed' AND kind IN ('ok', 'flaky', 'raw')), "
                "count(*) FILTER (WHERE state = 'discarded'), count(*) FILTER (WHERE kind = 'slow' AND "
                "state = 'running') FROM cyclone_steps")).fetchone()
            return row == (N_OK + M_FLAKY + 1, 2, 1)

        await until(workload_done, "the workload to finish")
        assert (await client.get(doomed_run)).steps[0].error_kind == "permanent"
        assert (await client.get(hopeless_run)).steps[0].error_kind == "max_attempts"

        expected = await database_says(conn)
        # What the workload was, spelled out, so the database query above is checked too.
        assert expected['cyclone_claims_total{kind="flaky"}'] == 2 * M_FLAKY
        assert expected['cyclone_completions_total{kind="ok"}'] == N_OK
        assert expected['cyclone_failures_total{error_kind="error",kind="flaky"}'] == M_FLAKY
        assert expected['cyclone_failures_total{error_kind="permanent",kind="doomed"}'] == 1
        assert expected['cyclone_failures_total{error_kind="max_attempts",kind="hopeless"}'] == 1
        assert expected['cyclone_available{kind="backlog"}'] == N_BACKLOG
        assert expected['cyclone_scheduled{kind="backlog"}'] == 1
        assert expected['cyclone_scheduled{kind="slow"}'] == 0
        assert expected['cyclone_running{kind="slow"}'] == 1

        expected["cyclone_connected_workers"] = 1  # the SDK worker; the raw stream has ended
        last: dict[str, float] = {}

        async def metrics_match() -> bool:
            nonlocal last
            last = await scrape(port)
            return all(last.get(name) == value for name, value in expected.items())

        try:
            await until(metrics_match, "the metrics to match the database")
        except AssertionError:
            mismatch = {k: (v, last.get(k)) for k, v in expected.items() if last.get(k) != v}
            raise AssertionError(f"metric: (database, scraped): {mismatch}") from None
        # Nothing beyond what the database accounts for: no other kind, status or error_kind.
        counted = {k for k in last if k.startswith(("cyclone_claims_total{", "cyclone_completions_total{",
                                                    "cyclone_failures_total{", "cyclone_available{",
                                                    "cyclone_scheduled{", "cyclone_running{"))}
        assert counted == set(expected) - {"cyclone_reclaims_total", "cyclone_connected_workers"}
        assert last['cyclone_fenced_results_total{status="ended"}'] == 1
        assert not [k for k in last if k.startswith("cyclone_fenced_results_total") and "ended" not in k]
        assert last["cyclone_dispatch_latency_seconds_count"] == sum(
            v for k, v in expected.items() if k.startswith("cyclone_claims_total{"))
        assert last["cyclone_stream_reconnects_total"] == 0
        oldest = (await (await conn.execute(
            "SELECT extract(epoch FROM oldest_available_age) FROM cyclone_v_kinds WHERE kind = 'backlog'"
        )).fetchone())[0]
        assert 0 < last['cyclone_oldest_available_age_seconds{kind="backlog"}'] <= float(oldest)

        # The series of issue 12: workers per kind, kinds without workers, execution and
        # queue-wait histograms per kind, runs ended per workflow and state.
        assert last['cyclone_kind_workers{kind="ok"}'] == 1
        assert last['cyclone_kind_workers{kind="backlog"}'] == 0
        assert last["cyclone_kinds_without_workers"] == 1  # backlog: available, and nobody runs it
        assert last['cyclone_step_duration_seconds_count{kind="ok"}'] == N_OK
        assert last['cyclone_step_duration_seconds_count{kind="flaky"}'] == 2 * M_FLAKY
        assert last['cyclone_queue_wait_seconds_count{kind="ok"}'] == N_OK
        assert last["process_resident_memory_bytes"] > 0
        ended = {state: n for state, n in (await (await conn.execute(
            "SELECT state, count(*) FROM cyclone_runs WHERE state IN ('completed', 'failed') GROUP BY 1")
        ).fetchall())}

        async def runs_ended_counted() -> bool:  # runs count once they ended 5 s ago (RUNS_ENDED_LAG)
            nonlocal last
            last = await scrape(port)
            by_state: dict[str, float] = {}
            for k, v in last.items():
                if k.startswith("cyclone_runs_ended_total{"):
                    state = k.split('state="')[1].split('"')[0]
                    by_state[state] = by_state.get(state, 0) + v
            # ... and free slots as of a heartbeat after the workload: "slow" holds one of 4.
            return by_state == ended and last['cyclone_kind_free_slots{kind="slow"}'] == 3

        await until(runs_ended_counted, "runs ended to be counted by workflow and state")
        release.set()


async def test_dispatch_latency_runs_to_the_push_for_a_job_claimed_by_its_own_enqueue(
        start_server: Callable[..., Any], db_url: str, conn: psycopg.AsyncConnection) -> None:
    """A job enqueued while a worker waits for its kind is claimed in its Enqueue's own
    transaction: claimable and claimed at that transaction's start. Its dispatch latency
    still covers the claim, the commit and the push (it was 0 for every such job).

    An Enqueue that comes while a dispatcher pass claims for the worker (the pass the last
    result started holds the worker's slots) is written alone and claimed by the next
    pass, so the test enqueues one job at a time until three were claimed by their own
    Enqueue, and looks at what each of those alone added to the histogram."""
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    port = metrics_port(srv)
    worker = Worker(srv.address, slots=4)

    @worker.handler("ok")
    async def ok(ctx: Context) -> None:
        return None

    async with Client(srv.address) as client, worker:
        async def connected() -> bool:
            return (await scrape(port))["cyclone_connected_workers"] == 1

        await until(connected, "the worker to connect")
        inline: list[float] = []  # what each job claimed by its own Enqueue added to the sum
        for jobs in range(1, 31):
            before = (await scrape(port))["cyclone_dispatch_latency_seconds_sum"]
            run_id = await client.enqueue("ok")
            await client.result(run_id)
            samples = await scrape(port)
            assert samples["cyclone_dispatch_latency_seconds_count"] == jobs
            row = await (await conn.execute(
                "SELECT started_at = scheduled_at FROM cyclone_steps WHERE run_id = %s", [run_id])).fetchone()
            if row[0]:  # claimed in its Enqueue's transaction
                inline.append(samples["cyclone_dispatch_latency_seconds_sum"] - before)
                if len(inline) == 3:
                    break
        assert len(inline) == 3, f"only {len(inline)} of {jobs} jobs were claimed by their own Enqueue"
        assert all(added > 0 for added in inline), inline
