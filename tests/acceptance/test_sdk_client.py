"""The SDK's Client against a real server: every call, its dataclasses, and its errors."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from cyclone_worker import (Client, Context, CycloneClientError, Job, Permanent, RunCancelled, RunFailed, Worker,
                            Workflow)

DEADLINE = 60.0


async def test_register_is_idempotent_and_versions_changes(client: Client) -> None:
    first = await client.register(Workflow("etl").task("extract").task("load", deps=["extract"]))
    again = await client.register(Workflow("etl").task("extract").task("load", deps=["extract"]))
    changed = await client.register(Workflow("etl").task("extract").task("load", deps=["extract"], max_attempts=3))
    assert (first.created, first.version, again.created, again.version) == (True, 1, False, 1)
    assert (changed.created, changed.version) == (True, 2)
    assert changed.nodes[1]["max_attempts"] == 3 and changed.nodes[1]["deps"] == ["extract"]
    assert (await client.get_workflow("etl", version=1)).nodes[1]["max_attempts"] == 25
    assert (await client.get_workflow("etl")).version == 2
    assert [(w.name, w.version) for w in await client.list_workflows("et", all_versions=True)] == [("etl", 1),
                                                                                                    ("etl", 2)]
    with pytest.raises(CycloneClientError) as e:
        await client.register(Workflow("bad").task("a", deps=["nowhere"]))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "nowhere" in e.value.message
    with pytest.raises(CycloneClientError) as e:
        await client.get_workflow("missing")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


async def test_submit_get_list_and_idempotency(client: Client) -> None:
    await client.register(Workflow("hello").task("greet"))
    run_id = await client.submit("hello", {"name": "Ada"}, idempotency_key="k1", priority=4, deadline=3600)
    assert await client.submit("hello", {"name": "Ada"}, idempotency_key="k1", priority=4, deadline=3600) == run_id
    run = await client.get(run_id)
    assert (run.workflow, run.workflow_version, run.state, run.input, run.priority) == ("hello", 1, "running",
                                                                                        {"name": "Ada"}, 4)
    assert run.deadline is not None and run.deadline > datetime.now(timezone.utc)
    assert [(s.node, s.state, s.attempt, s.lease_generation) for s in run.steps] == [("greet", "available", 1, 0)]
    listed = await client.list(workflow="hello", states=["running"], include_steps=True)
    assert [r.id for r in listed] == [run_id] and listed[0].steps[0].node == "greet"
    assert await client.list(states=["completed"]) == []
    with pytest.raises(CycloneClientError) as e:
        await client.submit("nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(CycloneClientError) as e:
        await client.get("not-an-id")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError, match="states"):
        await client.list(states=["done"])


async def test_wait_returns_the_unfinished_run_at_timeout_and_result_raises(client: Client) -> None:
    run_id = await client.enqueue("nobody-runs-this", scheduled_at=timedelta(hours=1))
    run = await client.wait(run_id, timeout=0.3)
    assert run.state == "running" and not run.terminal
    assert run.steps[0].scheduled_at is not None and run.steps[0].scheduled_at > datetime.now(timezone.utc)
    with pytest.raises(TimeoutError):
        await client.result(run_id, timeout=0.3)
    stats = {k.kind: k for k in await client.stats()}
    k = stats["nobody-runs-this"]
    assert (k.available, k.scheduled, k.running) == (0, 1, 0)  # not claimable for an hour: not backlog


async def test_pause_resume_cancel(client: Client) -> None:
    run_id = await client.enqueue("idle")
    assert (await client.pause(run_id)).steps[0].state == "paused"
    run = await client.resume(run_id)
    assert (run.state, run.steps[0].state) == ("running", "available")
    assert (await client.cancel(run_id)).state == "cancelled"
    assert (await client.cancel(run_id)).state == "cancelled"  # idempotent
    with pytest.raises(RunCancelled):
        await client.result(run_id, timeout=5)
    with pytest.raises(CycloneClientError) as e:
        await client.pause(run_id)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_signal_sleep_and_child_nodes(client: Client) -> None:
    await client.register(Workflow("approve").signal("approval", name="approved"))
    await client.register(Workflow("parent").sleep("nap", 0.2).child("sub", "approve", deps=["nap"]))
    run_id = await client.submit("parent", {"order": 9})
    run = await client.wait(run_id, timeout=0.1)
    assert run.step("nap").state in ("waiting_timer", "completed")

    async def child_run_id() -> str:
        while not (await client.get(run_id)).step("sub").child_run_id:
            await asyncio.sleep(0.05)
        return (await client.get(run_id)).step("sub").child_run_id

    child = await asyncio.wait_for(child_run_id(), DEADLINE)
    assert (await client.get(child)).parent_run_id == run_id
    assert await client.signal(child, "approved", {"by": "ada"})
    assert await client.result(run_id, timeout=DEADLINE) == {"sub": {"approval": {"by": "ada"}}}
    assert "fired_at" in (await client.get(run_id)).step("nap").output


async def test_retry_and_retry_all_reopen_discarded_nodes(server: Any, client: Client) -> None:
    await client.register(Workflow("twice").task("a").task("b"))
    calls: dict[str, int] = {}
    worker = Worker(server.address, slots=2)

    async def fail_first(ctx: Context) -> str:
        calls[ctx.node] = calls.get(ctx.node, 0) + 1
        if ctx.node == "a" and calls[ctx.node] == 1:
            raise Permanent(f"{ctx.node} broke")
        return f"{ctx.node} ok"

    worker.register("a", fail_first)
    worker.register("b", fail_first)
    async with worker:
        one = await client.enqueue("a")
        with pytest.raises(RunFailed):
            await client.result(one, timeout=DEADLINE)
        # The run as it stands after the retry: reopened, or already completed by the worker.
        assert (await client.retry(one, "a")).state in ("running", "completed")
        assert await client.result(one, timeout=DEADLINE) == {"a": "a ok"}

        calls.clear()
        both = await client.submit("twice")
        with pytest.raises(RunFailed) as failed:
            await client.result(both, timeout=DEADLINE)
        assert [s.node for s in failed.value.run.steps if s.state == "discarded"] == ["a"]
        await client.retry_all(both)
        # "b" completed before the discard, or was cancelled by fail-fast and reopened with "a".
        assert await client.result(both, timeout=DEADLINE) == {"a": "a ok", "b": "b ok"}
    with pytest.raises(CycloneClientError) as e:
        await client.retry(both, "a")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_enqueue_many_runs_every_job_and_names_a_bad_one(server: Any, client: Client) -> None:
    worker = Worker(server.address, slots=8)

    @worker.handler("double")
    async def double(ctx: Context) -> int:
        return ctx.input * 2

    jobs = [Job("double", i, priority=i % 2, max_attempts=3, attempt_timeout=30) for i in range(50)]
    async with worker:
        run_ids = await client.enqueue_many(iter(jobs))
        assert len(set(run_ids)) == 50
        results = [await client.result(r, timeout=DEADLINE) for r in run_ids]
    assert results == [{"double": 2 * i} for i in range(50)]
    assert (await client.get(run_ids[7])).steps[0].max_attempts == 3

    with pytest.raises(ValueError, match=r"jobs\[1\]\.input"):
        await client.enqueue_many([Job("x"), Job("x", float("nan"))])
    with pytest.raises(TypeError, match=r"jobs\[0\]"):
        await client.enqueue_many([{"kind": "x"}])  # type: ignore[list-item]
    with pytest.raises(CycloneClientError) as e:
        await client.enqueue_many([Job("x"), Job("x", max_attempts=0)])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "jobs[1].max_attempts" in e.value.message
    assert len(await client.list(limit=1000)) == 50  # the refused calls wrote nothing


async def test_a_closed_client_used_again_calls_on_a_new_channel(server: Any) -> None:
    # The client keeps one stub per service for its channel: after close() the next call
    # opens a new channel, and must not reach for a stub of the closed one.
    c = Client(server.address)
    first = await c.enqueue("x")
    await c.close()
    second = await c.enqueue("x")
    assert {r.id for r in await c.list(limit=10)} == {first, second}
    await c.close()


async def test_purge_deletes_terminal_runs(client: Client) -> None:
    done = await client.enqueue("x")
    await client.cancel(done)
    kept = await client.enqueue("x")
    assert await client.purge(timedelta(0)) == 1
    with pytest.raises(CycloneClientError) as e:
        await client.get(done)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert (await client.get(kept)).state == "running"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_wrong_address_fails_at_once_naming_it() -> None:
    port = _free_port()  # nothing listens there
    async with Client(f"127.0.0.1:{port}", rpc_timeout=30) as c:
        started = asyncio.get_running_loop().time()
        with pytest.raises(CycloneClientError) as e:
            await c.stats()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert e.value.message == f"cannot reach 127.0.0.1:{port}: connection refused"
    assert asyncio.get_running_loop().time() - started < 30  # not the rpc_timeout: no waiting at all
    async with Client(f"127.0.0.1:{port}", wait_for_server=0.5) as c:
        with pytest.raises(CycloneClientError) as e:
            await c.stats()
    assert e.value.message == f"cannot reach 127.0.0.1:{port}: no server answered within 0.5s"
    with pytest.raises(ValueError, match="wait_for_server"):
        Client("127.0.0.1:7233", wait_for_server=-1)


async def test_wait_for_server_waits_for_one_that_is_starting(start_server: Any, db_url: str) -> None:
    port = _free_port()
    async with Client(f"127.0.0.1:{port}", wait_for_server=DEADLINE) as c:
        call = asyncio.create_task(c.list_workflows())
        await asyncio.sleep(0.3)
        assert not call.done()  # waiting, not failed
        server = start_server(db_url)
        server.terminate()
        server.address = f"127.0.0.1:{port}"
        server.restart()  # now something listens on the port the client waits for
        assert await asyncio.wait_for(call, DEADLINE) == []
        # Once it has answered, a restart does not fail calls: they wait for the server again.
        server.kill()
        later = asyncio.create_task(c.list_workflows())
        await asyncio.sleep(0.3)
        server.restart()
        assert await asyncio.wait_for(later, DEADLINE) == []


async def test_the_sdk_measures_outputs_and_cuts_messages_as_the_server_does(server: Any, client: Client) -> None:
    worker = Worker(server.address, slots=2)

    @worker.handler("floats")
    async def floats(ctx: Context) -> list[float]:
        # 1.0 crosses the wire as the JSON number 1: 800,001 bytes, within the 1 MiB limit
        # (1,600,001 if measured as Python writes 1.0).
        return [1.0] * 400_000

    @worker.handler("long_failure")
    async def long_failure(ctx: Context) -> None:
        raise Permanent("m" * 70_000)

    async with worker:
        ok = await client.enqueue("floats")
        assert len((await client.result(ok, timeout=DEADLINE))["floats"]) == 400_000
        bad = await client.enqueue("long_failure")
        with pytest.raises(RunFailed):
            await client.result(bad, timeout=DEADLINE)
    message = (await client.get(bad)).steps[0].errors[-1].message
    # Cut by the SDK within the server's 64 KiB, marker included, so the server keeps it as
    # sent and the marker names the handler's size.
    assert message.startswith("m" * 1000) and message.endswith(" of 70000 bytes]")
    assert len(message.encode()) <= 64 * 1024
