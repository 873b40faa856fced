"""Seeing inside (issue 12): the workers registry across servers, kinds no worker runs, and
failure details, against real servers, real workers and a real database."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from cyclone_proto import admin_pb2, admin_pb2_grpc, runs_pb2, runs_pb2_grpc
from cyclone_proto import workers_pb2 as pb
from cyclone_server.records import MAX_ERROR_DETAILS_BYTES
from cyclone_worker import Client, Context, StepLogFilter, Worker

from test_cli_ops import cli
from test_stream import RawWorker, enqueue, get_step
from waits_helpers import until


async def list_workers(channel: grpc.aio.Channel, kind: str = "") -> dict[str, admin_pb2.WorkerInfo]:
    resp = await admin_pb2_grpc.AdminStub(channel).ListWorkers(admin_pb2.ListWorkersRequest(kind=kind))
    return {w.worker_id: w for w in resp.workers}


async def kind_stats(channel: grpc.aio.Channel, kind: str) -> admin_pb2.KindStats | None:
    resp = await admin_pb2_grpc.AdminStub(channel).GetStats(admin_pb2.GetStatsRequest())
    return next((k for k in resp.kinds if k.kind == kind), None)


async def test_list_workers_shows_the_workers_of_every_server_of_the_database(
        start_server: Callable[..., Any], db_url: str) -> None:
    one, two = start_server(db_url), start_server(db_url)
    async with grpc.aio.insecure_channel(one.address) as ch1, grpc.aio.insecure_channel(two.address) as ch2:
        sdk_worker = Worker(one.address, worker_id="sdk-on-one", slots=2)

        @sdk_worker.handler("greet")
        async def greet(ctx: Context) -> str:
            return "hi"

        raw = RawWorker(ch2, ["resize", "thumbnail"], 3, worker_id="raw-on-two")
        try:
            welcome = await raw.connect()
            await enqueue(ch2, "resize")
            await raw.leases(1)  # held, never answered: counted in leases_held
            async with sdk_worker:
                async def both_listed() -> bool:
                    seen = await list_workers(ch1)
                    return set(seen) == {"sdk-on-one", "raw-on-two"} and seen["raw-on-two"].leases_held == 1
                await until(both_listed, "both workers listed by server one")
                # One registry, whichever server is asked: the two answers are the same rows (a
                # heartbeat, every lease_ttl / 3, may move last_heartbeat between two reads:
                # then read both again).
                listed: dict[str, admin_pb2.WorkerInfo] = {}

                async def same_on_both() -> bool:
                    nonlocal listed
                    listed = await list_workers(ch1)
                    return listed == await list_workers(ch2)
                await until(same_on_both, "the same workers listed by both servers")
                r = listed["raw-on-two"]
                assert (r.sdk, list(r.kinds), r.slots, r.server_id) == ("test/raw", ["resize", "thumbnail"], 3,
                                                                         welcome.server_id)
                assert r.connected_since.ToDatetime() <= r.last_heartbeat.ToDatetime()
                s = listed["sdk-on-one"]
                assert s.sdk.startswith("python/") and list(s.kinds) == ["greet"] and s.slots == 2
                assert s.server_id not in ("", welcome.server_id) and s.leases_held == 0
                assert set(await list_workers(ch1, kind="thumbnail")) == {"raw-on-two"}
                try:
                    await list_workers(ch1, kind="no spaces")
                    raise AssertionError("a malformed kind was accepted")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("kind: ")
                async with Client(two.address) as client:  # the SDK's view of the same
                    [info] = await client.workers("resize")
                    assert (info.worker_id, info.kinds, info.leases_held) == ("raw-on-two", ["resize", "thumbnail"], 1)
                    assert info.connected_since is not None and info.last_heartbeat is not None

                out = cli(one.address, "workers", "list")
                assert out.returncode == 0, out.stderr
                rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
                assert rows["raw-on-two"][1:5] == ["test/raw", "resize,thumbnail", "3", "1"]
                assert rows["sdk-on-one"][2:4] == ["greet", "2"]
        finally:
            await raw.close()


async def test_a_worker_that_disconnects_disappears_after_the_grace(
        start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url)  # lease TTL 2 s: the grace
    async with grpc.aio.insecure_channel(srv.address) as ch:
        raw = RawWorker(ch, ["resize"], 1, worker_id="leaves")
        await raw.connect()
        await until(lambda: _listed(ch, "leaves"), "the worker listed")
        await raw.close()
        await until(lambda: _gone(ch, "leaves"), "the disconnected worker gone after the grace")
        # A worker that comes back is listed again, with a new connection time.
        again = RawWorker(ch, ["resize"], 1, worker_id="leaves")
        try:
            await again.connect()
            await until(lambda: _listed(ch, "leaves"), "the reconnected worker listed")
        finally:
            await again.close()


async def test_the_workers_of_a_killed_server_disappear(start_server: Callable[..., Any], db_url: str) -> None:
    survivor, doomed = start_server(db_url), start_server(db_url)
    async with grpc.aio.insecure_channel(survivor.address) as ch1, grpc.aio.insecure_channel(doomed.address) as ch2:
        raw = RawWorker(ch2, ["resize"], 1, worker_id="on-doomed")
        try:
            await raw.connect()
            await until(lambda: _listed(ch1, "on-doomed"), "the worker of the doomed server listed")
            doomed.kill()  # SIGKILL: nothing is cleaned up on its side
            await until(lambda: _gone(ch1, "on-doomed"), "the killed server's worker gone")
        finally:
            await raw.close()


async def test_get_stats_flags_a_kind_no_worker_runs_until_one_connects(
        start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url)
    async with grpc.aio.insecure_channel(srv.address) as ch:
        run_id = (await enqueue(ch, "shoutt"))[0].run_id  # a typo: the worker runs "shout"
        k = await kind_stats(ch, "shoutt")
        assert k is not None and k.available == 1 and k.workers == 0 and k.no_workers
        async with Client(srv.address) as client:
            assert [s.no_workers for s in await client.stats() if s.kind == "shoutt"] == [True]
        waited = cli(srv.address, "runs", "wait", run_id, "--timeout", "1s")
        assert waited.returncode == 5 and "no connected worker runs kind `shoutt`" in waited.stderr

        raw = RawWorker(ch, ["shoutt", "other"], 4, worker_id="fixed")
        try:
            await raw.connect()
            await raw.leases(1)

            async def served() -> bool:
                k = await kind_stats(ch, "shoutt")
                return k is not None and (k.running, k.workers, k.free_slots, k.no_workers) == (1, 1, 3, False)
            await until(served, "the kind served by one worker with 3 free slots, no longer flagged")
        finally:
            await raw.close()


async def test_a_failing_handlers_traceback_shows_in_get_run_and_cyclone_runs_get(
        start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    keep.addFilter(StepLogFilter())
    for name in ("app", "cyclone_worker.handler"):
        logging.getLogger(name).addHandler(keep)
        logging.getLogger(name).setLevel(logging.INFO)
    worker = Worker(srv.address)

    def parse_amount(text: str) -> int:
        return int(text)

    @worker.handler("charge")
    async def charge(ctx: Context) -> int:
        logging.getLogger("app").info("charging")
        return parse_amount(ctx.input["amount"])

    try:
        async with Client(srv.address) as client, worker:
            run_id = await client.enqueue("charge", {"amount": "12 euros"}, max_attempts=2, backoff_initial=0.01)
            await until(lambda: _state(srv.address, run_id, "failed"), "the run failed")
            step = await _step(srv.address, run_id)
            assert [e.attempt for e in step.errors] == [1, 2]
            for e in step.errors:
                assert e.message == "ValueError: invalid literal for int() with base 10: '12 euros'"
                assert e.details.startswith("Traceback (most recent call last):")
                assert "in parse_amount" in e.details and e.details.rstrip().endswith(e.message)
            # The SDK's Step model has them too.
            assert "in parse_amount" in (await client.get(run_id)).steps[0].errors[-1].details
    finally:
        for name in ("app", "cyclone_worker.handler"):
            logging.getLogger(name).removeHandler(keep)

    got = cli(srv.address, "runs", "get", run_id)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert "errors, every attempt:" in lines  # both attempts' messages, then the latest details
    assert "details of charge attempt 2 (max_attempts):" in lines
    assert any(line.strip().startswith("File") and "in parse_amount" in line for line in lines)

    # The handler's own logging carries run, step and attempt (StepLogFilter); the worker
    # logged each failure with its traceback (ctx.log).
    mine = [r for r in records if r.name == "app"]
    assert [(r.run_id, r.step_id, r.attempt) for r in mine] == [(run_id, step.id, 1), (run_id, step.id, 2)]
    failed = [r for r in records if r.name == "cyclone_worker.handler"]
    assert len(failed) == 2
    logged = failed[0].getMessage()
    assert logged.startswith(f"[run {run_id} step {step.id} attempt 1] handler charge failed")
    assert "in parse_amount" in logged and logged.count("invalid literal for int()") == 1


async def test_a_huge_failure_message_is_logged_once_as_a_bounded_excerpt(
        start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    logging.getLogger().addHandler(keep)  # every logger of the SDK, whatever its name
    worker = Worker(srv.address)
    marker = "EXCERPT-MARKER"

    @worker.handler("huge")
    async def huge(ctx: Context) -> None:
        raise ValueError(marker + "x" * 4_000_000 + "END-OF-MESSAGE")

    try:
        async with Client(srv.address) as client, worker:
            run_id = await client.enqueue("huge", None, max_attempts=1)
            await until(lambda: _state(srv.address, run_id, "failed"), "the run failed")
            step = await _step(srv.address, run_id)
            assert step.errors[0].message.startswith("ValueError: " + marker)  # the attempt keeps its excerpt
    finally:
        logging.getLogger().removeHandler(keep)
    texts = [r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else "")
             for r in records if r.name.startswith("cyclone_worker")]
    assert sum(t.count(marker) for t in texts) == 1, "the message is logged once"
    (failed,) = [t for t in texts if marker in t]
    assert "handler huge failed" in failed and "in huge" in failed and failed.endswith("END-OF-MESSAGE")
    assert len(failed.encode()) < 17 * 1024, "a bounded excerpt, not 4 MB"


async def test_oversized_details_are_cut_and_marked(start_server: Callable[..., Any], db_url: str) -> None:
    srv = start_server(db_url)
    async with grpc.aio.insecure_channel(srv.address) as ch:
        run_id = (await enqueue(ch, "big"))[0].run_id
        raw = RawWorker(ch, ["big"], 1)
        try:
            await raw.connect()
            lease = (await raw.leases(1))[0]
            details = "é\x00" + "x" * (100 * 1024)
            await raw.send(pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                                         failed=pb.Failed(message="boom", permanent=True, details=details)))
            assert (await raw.acks(1))[0].status == pb.ACK_STATUS_APPLIED
        finally:
            await raw.close()
        stored = (await get_step(ch, run_id)).errors[-1].details
        size = len(details.replace("\x00", "\ufffd").encode())  # measured as stored
        assert stored.startswith("é\ufffdxxx")  # U+0000 stored as U+FFFD
        assert stored.endswith(f"... [cut at {MAX_ERROR_DETAILS_BYTES} of {size} bytes]")
        assert len(stored.encode()) <= MAX_ERROR_DETAILS_BYTES + 64


async def _listed(channel: grpc.aio.Channel, worker_id: str) -> bool:
    return worker_id in await list_workers(channel)


async def _gone(channel: grpc.aio.Channel, worker_id: str) -> bool:
    return worker_id not in await list_workers(channel)


async def _step(address: str, run_id: str) -> Any:
    async with grpc.aio.insecure_channel(address) as ch:
        return (await runs_pb2_grpc.RunsStub(ch).GetRun(runs_pb2.GetRunRequest(run_id=run_id))).steps[0]


async def _state(address: str, run_id: str, state: str) -> bool:
    async with Client(address) as client:
        return (await client.get(run_id)).state == state


