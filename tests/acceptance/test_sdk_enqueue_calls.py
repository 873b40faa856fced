"""The SDK Client's enqueue calls: a few on the wire, the jobs of the others together.

A real server in this process (so that a server interceptor can count the calls it
receives), on a real port and a real database; the SDK Client over its own channel.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from datetime import datetime, timedelta, timezone
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import psycopg
import pytest

from cyclone_server.serve.app import CycloneServer
from cyclone_server.serve.settings import Settings
from cyclone_server.auth import TokenAuthInterceptor
from cyclone_worker import Client, CycloneClientError


class Counter(grpc.aio.ServerInterceptor):
    """Counts the calls the server receives, by method name ("Enqueue", "EnqueueMany", ...)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1
        return await continuation(details)


@contextlib.asynccontextmanager
async def serving(db_url: str, *interceptors: grpc.aio.ServerInterceptor,
                  listen: str = "127.0.0.1:0") -> AsyncIterator[CycloneServer]:
    server = CycloneServer(Settings(database_url=db_url, listen=listen, migrate=False,
                                    interceptors=list(interceptors)))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def inputs_of(db_url: str, run_ids: list[str]) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        rows = await (await conn.execute("SELECT id::text, input FROM cyclone_runs WHERE id = ANY(%s::uuid[])",
                                          (run_ids,))).fetchall()
    return dict(rows)


async def answer_of(call: Awaitable[str]) -> str | CycloneClientError:
    """The run id, or the error the call raised."""
    try:
        return await call
    except CycloneClientError as e:
        return e


async def run_count(db_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        return (await (await conn.execute("SELECT count(*) FROM cyclone_runs")).fetchone())[0]


async def test_concurrent_enqueues_share_calls_and_each_caller_gets_its_own_job(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=2) as client:
        await client.enqueue("warmup")  # jobs go together once the server has answered
        counter.calls.clear()
        run_ids = await asyncio.gather(*(client.enqueue("email", {"i": i}) for i in range(300)))
    assert len(set(run_ids)) == 300
    # Each caller's run holds that caller's input.
    inputs = await inputs_of(db_url, run_ids)
    assert [inputs[r] for r in run_ids] == [{"i": i} for i in range(300)]
    assert await run_count(db_url) == 301
    # Two calls went alone; the other jobs waited for them and went together.
    assert counter.calls["EnqueueMany"] >= 1
    assert counter.calls["Enqueue"] + counter.calls["EnqueueMany"] < 30


async def test_enqueues_made_one_after_another_go_one_call_each(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=1) as client:
        for i in range(5):
            await client.enqueue("email", {"i": i})
    assert counter.calls["Enqueue"] == 5 and counter.calls["EnqueueMany"] == 0


async def test_enqueue_calls_zero_sends_one_enqueue_per_job(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=0) as client:
        await client.enqueue("warmup")
        await asyncio.gather(*(client.enqueue("email", {"i": i}) for i in range(40)))
    assert counter.calls["Enqueue"] == 41 and counter.calls["EnqueueMany"] == 0


@pytest.mark.parametrize("calls", [-1, 1.5, True, "2"])
async def test_enqueue_calls_must_be_a_whole_number(calls: Any) -> None:
    with pytest.raises(ValueError, match="enqueue_calls"):
        Client("127.0.0.1:1", enqueue_calls=calls)


async def test_until_the_server_answered_every_job_goes_in_a_call_of_its_own(db_url: str) -> None:
    # Each caller waits for a server that is still starting, with the whole rpc_timeout of
    # its own call once the server is there, and none waits for another's call.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    counter = Counter()
    async with Client(f"127.0.0.1:{port}", enqueue_calls=1, wait_for_server=30, rpc_timeout=1) as client:
        calls = asyncio.gather(*(client.enqueue("email", {"i": i}) for i in range(6)))
        await asyncio.sleep(1.2)  # the server starts later than rpc_timeout
        async with serving(db_url, counter, listen=f"127.0.0.1:{port}"):
            run_ids = await calls
    assert len(set(run_ids)) == 6
    assert counter.calls["Enqueue"] == 6 and counter.calls["EnqueueMany"] == 0


async def test_a_job_refused_by_the_database_fails_only_its_own_caller(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=1) as client:
        kept = await client.enqueue("email", {"to": "ada"}, idempotency_key="k1")
        counter.calls.clear()

        def job(i: int) -> Awaitable[str]:
            if i == 17:  # the key belongs to a run made by a different request
                return client.enqueue("email", {"to": "bob"}, idempotency_key="k1")
            if i == 23:  # the same request as the kept run: its run, not a new one
                return client.enqueue("email", {"to": "ada"}, idempotency_key="k1")
            return client.enqueue("email", {"i": i})

        answers = await asyncio.gather(*(answer_of(job(i)) for i in range(40)))
    conflict = answers[17]
    assert isinstance(conflict, CycloneClientError) and conflict.code == grpc.StatusCode.ALREADY_EXISTS
    assert "jobs[" not in conflict.message  # Enqueue's words, not EnqueueMany's
    assert answers[23] == kept
    made = [a for i, a in enumerate(answers) if i not in (17, 23)]
    assert all(isinstance(a, str) for a in made)
    inputs = await inputs_of(db_url, made)
    assert [inputs[r] for r in made] == [{"i": i} for i in range(40) if i not in (17, 23)]
    assert await run_count(db_url) == 1 + 38  # the kept run and the 38 others: nothing doubled
    # The batch was refused and written again around the refused job, not one call per
    # job: the first job alone, the refused batch, the refused job alone, the others again.
    assert counter.calls["EnqueueMany"] >= 2
    assert counter.calls["Enqueue"] + counter.calls["EnqueueMany"] <= 6


async def test_a_job_refused_on_reading_fails_only_its_own_caller_in_enqueues_words(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=1) as client:
        await client.enqueue("warmup")
        counter.calls.clear()

        def job(i: int) -> Awaitable[str]:
            if i == 11:  # a deadline already past
                return client.enqueue("email", {"i": i}, deadline=datetime.now(timezone.utc) - timedelta(seconds=5))
            return client.enqueue("email", {"i": i})

        answers = await asyncio.gather(*(answer_of(job(i)) for i in range(40)))
    past = answers[11]
    assert isinstance(past, CycloneClientError) and past.code == grpc.StatusCode.INVALID_ARGUMENT
    # Enqueue's wording, not EnqueueMany's ("jobs[3].deadline: ...").
    assert past.message.startswith("deadline") and "jobs[" not in past.message
    assert all(isinstance(a, str) for i, a in enumerate(answers) if i != 11)
    assert await run_count(db_url) == 1 + 39
    assert counter.calls["EnqueueMany"] >= 2
    assert counter.calls["Enqueue"] + counter.calls["EnqueueMany"] <= 6


async def test_a_batch_that_fails_as_a_whole_fails_every_caller_with_its_status(db_url: str) -> None:
    counter = Counter()
    tokens = TokenAuthInterceptor({"worker-token": ["worker"]})  # a worker's token may not submit
    async with serving(db_url, counter, tokens) as server, \
            Client(server.address, token="worker-token", enqueue_calls=1) as client:
        with pytest.raises(CycloneClientError):  # the server answers (refusing): jobs go together now
            await client.enqueue("email")
        counter.calls.clear()
        answers = await asyncio.gather(*(client.enqueue("email", {"i": i}) for i in range(20)),
                                       return_exceptions=True)
    assert counter.calls["EnqueueMany"] >= 1
    assert all(isinstance(a, CycloneClientError) and a.code == grpc.StatusCode.PERMISSION_DENIED for a in answers)
    # Not sent again one by one: every call the server saw was refused as a whole.
    assert counter.calls["Enqueue"] + counter.calls["EnqueueMany"] < 20
    assert await run_count(db_url) == 0


async def test_a_caller_cancelled_while_its_job_waits_never_sends_it(db_url: str) -> None:
    async with serving(db_url) as server, Client(server.address, enqueue_calls=1) as client:
        await client.enqueue("warmup")  # the channel is up
        first = asyncio.create_task(client.enqueue("email", {"n": "first"}))
        await asyncio.sleep(0)  # the first call is on the wire: the one call allowed
        waiting = asyncio.create_task(client.enqueue("email", {"n": "cancelled"}))
        await asyncio.sleep(0)  # its job waits for the first call
        waiting.cancel()
        run_id = await first
        with pytest.raises(asyncio.CancelledError):
            await waiting
        after = await client.enqueue("email", {"n": "after"})
    inputs = await inputs_of(db_url, [run_id, after])
    assert inputs == {run_id: {"n": "first"}, after: {"n": "after"}}
    assert await run_count(db_url) == 3


async def test_close_fails_the_waiting_jobs_and_sends_nothing_after(db_url: str) -> None:
    counter = Counter()
    async with serving(db_url, counter) as server:
        client = Client(server.address, enqueue_calls=1)
        await client.enqueue("warmup")
        first = asyncio.create_task(client.enqueue("email", {"n": "first"}))
        await asyncio.sleep(0)  # on the wire
        waiting = [asyncio.create_task(client.enqueue("email", {"n": i})) for i in range(4)]
        await asyncio.sleep(0)  # queued behind it
        await client.close()
        outcomes = await asyncio.gather(first, *waiting, return_exceptions=True)
        # The call the close cut off ends in CANCELLED too, not in a bare CancelledError of a
        # task nobody cancelled (unless it was answered first).
        assert isinstance(outcomes[0], str) or (isinstance(outcomes[0], CycloneClientError)
                                                and outcomes[0].code == grpc.StatusCode.CANCELLED), outcomes[0]
        for outcome in outcomes[1:]:
            assert isinstance(outcome, CycloneClientError) and outcome.code == grpc.StatusCode.CANCELLED
            assert "closed" in outcome.message
        assert counter.calls["EnqueueMany"] == 0
        # A closed client used again opens a new channel.
        await client.enqueue("again")
        await client.close()
    # The server has stopped, so every call it took has its outcome. The first call was on
    # the wire: answered before the close, its job exists; cut off, the server may have
    # committed it all the same (that outcome is what the client cannot learn). The jobs
    # that waited behind it were never sent.
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        sent = [r[0] for r in await (await conn.execute(
            "SELECT input ->> 'n' FROM cyclone_runs WHERE input ? 'n'")).fetchall()]
    assert (sent == ["first"]) if isinstance(outcomes[0], str) else (sent in ([], ["first"]))
    assert await run_count(db_url) == 2 + len(sent)  # the warm-up, "again", and the first if written


async def test_jobs_of_different_trace_contexts_never_share_a_call(db_url: str) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    context = pytest.importorskip("opentelemetry.context")

    def parent(n: int) -> str:
        return f"00-{n + 1:032x}-{n + 1:016x}-01"

    async def traced(n: int) -> str:
        span = trace.NonRecordingSpan(trace.SpanContext(n + 1, n + 1, is_remote=True,
                                                        trace_flags=trace.TraceFlags(1)))
        token = context.attach(trace.set_span_in_context(span))
        try:
            return await client.enqueue("email", {"n": n})
        finally:
            context.detach(token)

    counter = Counter()
    async with serving(db_url, counter) as server, Client(server.address, enqueue_calls=1) as client:
        await client.enqueue("warmup")
        # Three contexts, ten jobs each, interleaved: each job must keep its caller's.
        run_ids = await asyncio.gather(*(traced(i % 3) for i in range(30)))
        assert counter.calls["EnqueueMany"] >= 1  # the jobs of one context did go together
        counter.calls.clear()
        # A context per caller (a span per request): none shares, so none waits for another.
        alone = await asyncio.gather(*(traced(100 + i) for i in range(20)))
        assert counter.calls["Enqueue"] == 20 and counter.calls["EnqueueMany"] == 0
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        rows = dict(await (await conn.execute(
            "SELECT id::text, trace_context ->> 'traceparent' FROM cyclone_runs")).fetchall())
    assert [rows[r] for r in run_ids] == [parent(i % 3) for i in range(30)]
    assert [rows[r] for r in alone] == [parent(100 + i) for i in range(20)]
