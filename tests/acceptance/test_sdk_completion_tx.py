"""ctx.completion_tx(): the handler's own writes and its step's completion commit together, or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cyclone_worker import Client, Context, Fenced, Reconnect, Worker

from waits_helpers import DEADLINE, until


@pytest.fixture
async def invoices(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    """The application's own table, in the same database as Cyclone's."""
    await conn.execute("CREATE TABLE invoices (step_id uuid, generation bigint, attempt int, "
                       "worker text, amount int)")
    return conn


async def rows(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute("SELECT generation, attempt, worker, amount FROM invoices ORDER BY attempt")
    return await cur.fetchall()


async def test_the_handlers_write_commits_with_the_completion_and_rolls_back_with_an_error(
        server: Any, db_url: str, invoices: psycopg.AsyncConnection[Any]) -> None:
    worker = Worker(server.address, slots=1, database_url=db_url)

    @worker.handler("invoice")
    async def invoice(ctx: Context) -> dict[str, int]:
        async with ctx.completion_tx() as tx:
            await tx.conn.execute("INSERT INTO invoices VALUES (%s, %s, %s, %s, %s)",
                                  [ctx.step_id, ctx.lease_generation, ctx.attempt, ctx.worker_id,
                                   ctx.input["amount"]])
            if ctx.attempt == 1:
                raise ConnectionError("payment gateway hiccup")  # rolls back the insert too
            tx.complete({"invoiced": ctx.input["amount"]})
        return {"ignored": True}  # the step completed inside the transaction

    async with Client(server.address) as client, worker:
        run_id = await client.enqueue("invoice", {"amount": 42}, backoff_initial=0.1)
        assert await client.result(run_id, timeout=DEADLINE) == {"invoice": {"invoiced": 42}}
        step = (await client.get(run_id)).steps[0]
        await until(lambda: worker.counts["ended"] == 1, what="the slot-freeing result's ack")
    assert (step.state, step.attempt) == ("completed", 2)
    assert step.errors[0].message == "ConnectionError: payment gateway hiccup"
    assert await rows(invoices) == [(step.lease_generation, 2, worker.worker_id, 42)]
    # attempt 1's failure was applied; attempt 2's answer after the commit is refused ENDED,
    # which the worker expects and does not count as an error.
    assert (worker.counts["applied"], worker.counts["ended"]) == (1, 1)


async def test_a_fenced_generation_rolls_back_the_handlers_write_and_raises_fenced(
        start_server: Callable[..., Any], db_url: str, invoices: psycopg.AsyncConnection[Any]) -> None:
    first, second = start_server(db_url, lease_ttl=1), start_server(db_url, lease_ttl=1)
    gate = asyncio.Event()
    fenced: list[Fenced] = []
    zombie = Worker(first.address, slots=1, database_url=db_url, grace=1,
                    reconnect=Reconnect(initial=0.1, maximum=0.5))
    healthy = Worker(second.address, slots=1, database_url=db_url)

    async def pay(ctx: Context) -> dict[str, str]:
        if ctx.worker_id == zombie.worker_id:
            await gate.wait()  # its server dies meanwhile, and the lease with it
        try:
            async with ctx.completion_tx() as tx:
                await tx.conn.execute("INSERT INTO invoices VALUES (%s, %s, %s, %s, %s)",
                                      [ctx.step_id, ctx.lease_generation, ctx.attempt, ctx.worker_id, 7])
                tx.complete({"paid_by": ctx.worker_id})
        except Fenced as e:
            fenced.append(e)
            raise
        return {"paid_by": ctx.worker_id}

    zombie.register("pay", pay)
    healthy.register("pay", pay)
    async with Client(second.address) as client:
        async with zombie:
            run_id = await client.enqueue("pay")
            await until(lambda: zombie.counts["leases"] == 1, what="the zombie's lease")
            first.kill()  # no renewals: the lease expires and the other server's sweep reclaims it
            async with healthy:
                assert await client.result(run_id, timeout=DEADLINE) == {"pay": {"paid_by": healthy.worker_id}}
            gate.set()
            await until(lambda: fenced, what="the zombie's completion_tx to be fenced")
        step = (await client.get(run_id)).steps[0]
    assert fenced[0].status == "stale" and fenced[0].lease_generation == 1
    assert (step.state, step.reclaims, step.lease_generation) == ("completed", 1, 2)
    assert await rows(invoices) == [(2, 1, healthy.worker_id, 7)]  # nothing of the zombie's
