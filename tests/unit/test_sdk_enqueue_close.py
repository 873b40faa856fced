"""The SDK's enqueue batching (cyclone_worker/_enqueues.py) against a scripted call, at close."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from cyclone_proto import runs_pb2
from cyclone_worker import CycloneClientError
from cyclone_worker._enqueues import Enqueues


async def test_a_batch_refused_as_the_client_closes_answers_every_caller_and_sends_nothing_more() -> None:
    """The server refuses job 1 of a batch [b, c] in the turn in which close() starts: close()
    has already failed the waiting jobs, so the batch's jobs are failed too (CANCELLED), none is
    put back in the queue nor sent again alone."""
    answers: dict[str, asyncio.Future[Any]] = {}
    calls: list[str] = []

    async def call(method: str, request: Any, trace: Any) -> Any:
        calls.append(method)
        answers[method] = asyncio.get_running_loop().create_future()
        return await answers[method]

    enqueues = Enqueues(call, 1, lambda: True)
    a = asyncio.create_task(enqueues.enqueue(runs_pb2.EnqueueRequest(kind="a"), ()))
    await asyncio.sleep(0)
    b = asyncio.create_task(enqueues.enqueue(runs_pb2.EnqueueRequest(kind="b"), ()))
    c = asyncio.create_task(enqueues.enqueue(runs_pb2.EnqueueRequest(kind="c"), ()))
    await asyncio.sleep(0)
    answers.pop("Enqueue").set_result(runs_pb2.EnqueueResponse(run_id="run-a"))
    while "EnqueueMany" not in answers:
        await asyncio.sleep(0)
    answers.pop("EnqueueMany").set_exception(CycloneClientError(grpc.StatusCode.INVALID_ARGUMENT, "jobs[1].kind: bad"))
    enqueues.close()
    await asyncio.wait_for(enqueues.closed(), 5)
    done, pending = await asyncio.wait([a, b, c], timeout=5)
    assert not pending
    assert a.result() == "run-a"
    for t in (b, c):
        assert isinstance(t.exception(), CycloneClientError) and t.exception().code == grpc.StatusCode.CANCELLED
    assert calls == ["Enqueue", "EnqueueMany"]
