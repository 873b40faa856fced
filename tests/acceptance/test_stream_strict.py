"""The worker stream's strict edges (docs/lifecycle.md, "One status per result"): one ack per result, no answer that keeps a
lease alive forever, nothing a worker sends ends its stream but a protocol violation."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from cyclone_server.store.engine import Engine
from cyclone_worker import Context, Worker
from cyclone_proto import types_pb2
from cyclone_proto import workers_pb2 as pb

from test_metrics_server import metrics_port, scrape
from test_stream import DEADLINE, RawWorker, completed, enqueue, get_step, one_lease, workers  # noqa: F401 (a fixture)
from waits_helpers import until

MIB = 1 << 20
LATER = duration_pb2.Duration(seconds=60)  # a retry stays available while the test looks at it


def failed(lease: pb.Lease, message: str = "boom", **kw: Any) -> pb.StepResult:
    return pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                         failed=pb.Failed(message=message, **kw))


def snoozed(lease: pb.Lease, delay: duration_pb2.Duration) -> pb.StepResult:
    return pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                         snoozed=pb.Snoozed(delay=delay))


async def step_row(engine: Engine, run_id: str) -> dict[str, Any]:
    return (await engine.get_run(run_id))["steps"][0]


async def test_two_answers_to_one_lease_in_one_message_get_applied_then_ended(db_url, start_server) -> None:
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    async with one_lease(srv.address) as (channel, job, w, lease):
        await w.send(completed(lease, "first"), completed(lease, "second"), failed(lease))
        acks = await w.acks(3)
        assert [a.status for a in acks] == [pb.ACK_STATUS_APPLIED, pb.ACK_STATUS_ENDED, pb.ACK_STATUS_ENDED]
        step = await get_step(channel, job.run_id)
        assert (step.state, step.output.string_value) == (types_pb2.STEP_STATE_COMPLETED, "first")
    # The counters count what happened: one completion, two fenced answers.
    samples = await scrape(metrics_port(srv))
    assert samples['cyclone_completions_total{kind="resize"}'] == 1
    assert samples['cyclone_fenced_results_total{status="ended"}'] == 2
    assert not [k for k in samples if k.startswith("cyclone_failures_total")]


async def test_a_failure_message_with_nul_is_stored_with_the_replacement_character(channel, workers, engine) -> None:
    (job,) = await enqueue(channel, "resize", max_attempts=3, backoff_initial=LATER)
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    await w.send(failed(lease, "bad bytes: \x00\x01\x00 end"))
    (a,) = await w.acks(1)
    assert (a.status, a.detail) == (pb.ACK_STATUS_APPLIED, "retried")
    step = await step_row(engine, job.run_id)
    assert (step["state"], step["attempt"]) == ("available", 2)
    assert step["errors"][-1]["message"] == "bad bytes: \ufffd\x01\ufffd end"


@pytest.mark.parametrize("make, field", [
    (lambda lease: snoozed(lease, duration_pb2.Duration(seconds=2**62)), "snoozed.delay"),
    (lambda lease: snoozed(lease, duration_pb2.Duration(seconds=-5)), "snoozed.delay"),
    (lambda lease: failed(lease, retry_delay=duration_pb2.Duration(seconds=2**62)), "failed.retry_delay"),
    (lambda lease: failed(lease, retry_delay=duration_pb2.Duration(seconds=4_000_000_000)), "failed.retry_delay"),
    (lambda lease: pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation), "outcome"),
    (lambda lease: completed(lease, "nul \x00 byte"), "completed.output"),
])
async def test_a_malformed_answer_is_acked_invalid_naming_the_field_and_fails_the_attempt(
        channel, workers, engine, make, field) -> None:
    (job,) = await enqueue(channel, "resize", max_attempts=3)
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    await w.send(make(lease))
    (a,) = await w.acks(1)
    assert a.status == pb.ACK_STATUS_INVALID and field in a.detail and "the attempt failed" in a.detail, a.detail
    # The lease is over on both sides: the attempt failed and will be retried; a second
    # answer to the same lease is refused.
    step = await step_row(engine, job.run_id)
    assert (step["state"], step["attempt"]) == ("available", 2)
    assert step["errors"][-1]["message"].startswith("invalid result: ") and field in step["errors"][-1]["message"]
    await w.send(completed(lease))
    assert (await w.acks(1))[0].status == pb.ACK_STATUS_ENDED
    # The stream stayed up: the retry comes to the same worker once it is due.
    async with engine.pool.connection() as conn:
        await conn.execute("UPDATE cyclone_steps SET scheduled_at = now() WHERE id = %s", (step["id"],))
    (again,) = await w.leases(1)
    assert (again.step_id, again.attempt) == (lease.step_id, 2)
    assert w.ended is None


@pytest.fixture
async def patient_channel(db_url, start_server):
    """A server whose heartbeat (10 s) leaves time to move tens of MiB on a busy machine."""
    srv = start_server(db_url, lease_ttl=30)
    async with grpc.aio.insecure_channel(srv.address) as channel:
        channel.address = srv.address
        yield channel


async def test_an_output_over_the_stream_message_size_discards_the_step_and_keeps_the_stream(
        patient_channel, workers, engine) -> None:
    channel = patient_channel
    await enqueue(channel, "resize", 2)
    w = workers(["resize"], 2, on=channel)
    welcome = await w.connect()
    assert welcome.max_payload_bytes == MIB
    big, small = await w.leases(2)
    await w.send(completed(big, "x" * (12 * MIB)))
    (a,) = await w.acks(1)
    assert (a.status, a.detail) == (pb.ACK_STATUS_APPLIED, "output_too_large")
    row = await engine.get_run((await step_run(engine, big.step_id)))
    assert (row["steps"][0]["state"], row["steps"][0]["reason"]) == ("discarded", "output_too_large")
    # A failure message as large is kept, cut, and the attempt retried; the stream is the same one.
    await w.send(failed(small, "y" * (12 * MIB)))
    (b,) = await w.acks(1)
    assert (b.status, b.detail) == (pb.ACK_STATUS_APPLIED, "retried")
    step = (await engine.get_run(await step_run(engine, small.step_id)))["steps"][0]
    message = step["errors"][-1]["message"]
    assert message.startswith("y" * 1000) and message.endswith(f"[cut at 65536 of {12 * MIB} bytes]")
    assert w.ended is None


async def test_an_output_measured_over_the_limit_is_sent_as_its_size(channel, workers, engine) -> None:
    (job,) = await enqueue(channel, "resize")
    w = workers(["resize"], 1)
    await w.connect()
    (lease,) = await w.leases(1)
    await w.send(pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                               completed=pb.Completed(oversized_output_bytes=5 * MIB)))
    (a,) = await w.acks(1)
    assert (a.status, a.detail) == (pb.ACK_STATUS_APPLIED, "output_too_large")
    step = await step_row(engine, job.run_id)
    assert (step["state"], step["reason"], step["output"]) == ("discarded", "output_too_large", None)
    assert f"output is {5 * MIB} bytes" in step["errors"][-1]["message"]


async def test_a_size_not_over_the_limit_is_invalid_not_a_completion_without_output(channel, workers,
                                                                                    engine) -> None:
    (job,) = await enqueue(channel, "resize")
    w = workers(["resize"], 1)
    welcome = await w.connect()
    (lease,) = await w.leases(1)
    await w.send(pb.StepResult(step_id=lease.step_id, lease_generation=lease.lease_generation,
                               completed=pb.Completed(oversized_output_bytes=welcome.max_payload_bytes)))
    (a,) = await w.acks(1)
    assert a.status == pb.ACK_STATUS_INVALID
    assert a.detail.startswith("completed.oversized_output_bytes: ") and "is not over the limit" in a.detail
    step = await step_row(engine, job.run_id)  # the attempt failed, and will be tried again
    assert (step["state"], step["attempt"], step["output"]) == ("available", 2, None)


async def test_the_sdk_sends_the_size_of_an_oversized_output_not_the_output(patient_channel, engine) -> None:
    (job,) = await enqueue(patient_channel, "huge")
    worker = Worker(patient_channel.address, slots=1)

    # Larger than the SDK's channel would even send (64 MiB): only its size can go out.
    @worker.handler("huge")
    async def huge(ctx: Context) -> dict[str, str]:
        return {"blob": "z" * (70 * MIB)}

    async with worker:
        step = await until(lambda: _ended(engine, job.run_id), "the step ended", DEADLINE)
        await until(lambda: worker.counts["applied"] == 1, "its ack", DEADLINE)
    assert (step["state"], step["reason"]) == ("discarded", "output_too_large")
    size = 70 * MIB + len('{"blob":""}')  # compact JSON
    assert f"output is {size} bytes" in step["errors"][-1]["message"]


async def _ended(engine: Engine, run_id: str) -> dict[str, Any] | None:
    step = await step_row(engine, run_id)
    return step if step["state"] in ("completed", "discarded") else None


async def step_run(engine: Engine, step_id: str) -> str:
    async with engine.pool.connection() as conn:
        row = await (await conn.execute("SELECT run_id FROM cyclone_steps WHERE id = %s", (step_id,))).fetchone()
    return str(row["run_id"])


async def test_a_silent_worker_s_leases_are_reclaimed_when_its_stream_ends_not_at_expiry(
        db_url, start_server, engine) -> None:
    # No recovery sweep in this test's lifetime: only the release can reclaim the lease.
    srv = start_server(db_url, lease_ttl=1.5, sweep_interval=3600, extra_args=["--metrics-listen", "127.0.0.1:0"])
    async with grpc.aio.insecure_channel(srv.address) as channel:
        (job,) = await enqueue(channel, "resize")
        w = RawWorker(channel, ["resize"], 1, pong=False)
        try:
            await w.connect()
            (lease,) = await w.leases(1)
            await until(lambda: w.ended, "the stream ended", DEADLINE)
            assert w.ended.code() == grpc.StatusCode.UNAVAILABLE
            step = await until(lambda: _reclaimed(engine, job.run_id), "the step reclaimed", DEADLINE)
            assert (step["state"], step["reclaims"], step["attempt"]) == ("available", 1, 1)
            # Counted, by how it happened (the CycloneLeasesReclaimed alert reads this counter).
            port = metrics_port(srv)
            samples = await until(lambda: _reclaims_counted(port), "the reclaim counted", DEADLINE)
            assert samples['cyclone_reclaims_total{how="expired"}'] == 0
            # Reclaimed as any expired lease: fenced, so the silent worker's late answer is stale.
            other = RawWorker(channel, ["resize"], 1)
            await other.connect()
            (again,) = await other.leases(1)
            assert again.lease_generation == lease.lease_generation + 1
            await other.send(completed(again))
            assert (await other.acks(1))[0].status == pb.ACK_STATUS_APPLIED
            await other.close()
        finally:
            await w.close()


async def _reclaims_counted(port: int) -> dict[str, float] | None:
    samples = await scrape(port)
    return samples if samples['cyclone_reclaims_total{how="worker_lost"}'] == 1 else None


async def _reclaimed(engine: Engine, run_id: str) -> dict[str, Any] | None:
    step = await step_row(engine, run_id)
    return step if step["reclaims"] == 1 else None


async def test_a_step_that_becomes_due_wakes_the_dispatcher_at_its_due_time(channel, workers, engine) -> None:
    w = workers(["resize"], 1)
    await w.connect()
    at = timestamp_pb2.Timestamp()
    at.FromNanoseconds(time.time_ns() + 1_500_000_000)
    (job,) = await enqueue(channel, "resize", scheduled_at=at)
    (lease,) = await w.leases(1, timeout=DEADLINE)
    step = await step_row(engine, job.run_id)
    # Leased after it was due (never before), by the dispatcher's timer: well before the
    # 10 s idle poll, with nothing else to wake it.
    assert step["started_at"] >= step["scheduled_at"]
    assert (step["started_at"] - step["scheduled_at"]).total_seconds() < 5.0
    assert lease.step_id == str(step["id"])
