"""WarmConnections: the Engine's statements keep a connection between them, and give it
back to the pool when idle, when somebody waits for the pool, when it broke, and at close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool
from engine_helpers import until

from cyclone_server.store.engine import Engine
from cyclone_server.store.warm import WarmConnections

PID = "SELECT pg_backend_pid() AS pid"


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    p = AsyncConnectionPool(db_url, min_size=2, max_size=2, open=False, kwargs={"autocommit": True})
    await p.open(wait=True, timeout=30)
    try:
        yield p
    finally:
        await p.close()


async def pid(warm: WarmConnections) -> int:
    return (await warm.fetch(PID, {}, dict_row))[0]["pid"]


def available(pool: AsyncConnectionPool) -> int:
    return pool.get_stats()["pool_available"]


async def test_statements_one_after_another_share_a_kept_connection(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=60)
    try:
        first = await pid(warm)
        assert warm.kept == 1 and available(pool) == 1  # kept out of the pool between statements
        assert [await pid(warm) for _ in range(5)] == [first] * 5
        # Another row factory gets its own cursor on the same connection.
        assert await warm.fetch(PID, {}, tuple_row) == [(first,)]
        async with warm.connection() as conn, conn.transaction():
            assert (await (await conn.execute(PID)).fetchone())[0] == first
        assert warm.kept == 1
    finally:
        await warm.close()
    assert warm.kept == 0 and available(pool) == 2


async def test_a_kept_connection_goes_back_to_the_pool_once_idle(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=0.2)
    try:
        await pid(warm)
        assert warm.kept == 1
        await until(lambda: warm.kept == 0 and available(pool) == 2)
    finally:
        await warm.close()


async def test_a_connection_out_of_the_pool_longer_than_hold_goes_back_at_its_next_use(
        pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=60, hold=0.2)
    try:
        await pid(warm)
        assert warm.kept == 1
        await asyncio.sleep(0.3)  # past `hold`: the next statement gives it back after running
        await pid(warm)
        assert warm.kept == 0 and available(pool) == 2
    finally:
        await warm.close()


async def test_a_caller_waiting_for_the_pool_gets_the_connection_a_statement_ends_with(db_url: str) -> None:
    """With one connection in the pool: a statement runs on it while another caller waits
    for the pool; when the statement ends, its connection goes to that caller, not to the
    kept ones (which nothing outside would take before `idle`)."""
    one = AsyncConnectionPool(db_url, min_size=1, max_size=1, open=False, kwargs={"autocommit": True})
    await one.open(wait=True, timeout=30)
    warm = WarmConnections(one, idle=60)
    try:
        sleeping = asyncio.create_task(warm.fetch("SELECT pg_sleep(0.3)", {}, tuple_row))
        await until(lambda: available(one) == 0)
        async with one.connection(timeout=10) as conn:  # PoolTimeout if the statement kept it
            await conn.execute("SELECT 1")
        await sleeping
        assert warm.kept == 0
    finally:
        await warm.close()
        await one.close()


async def test_a_connection_that_broke_is_given_back_and_the_next_statement_gets_another(
        pool: AsyncConnectionPool, db_url: str) -> None:
    warm = WarmConnections(pool, idle=60)
    try:
        broken = await pid(warm)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (broken,))
        with pytest.raises(psycopg.OperationalError):
            await pid(warm)
        assert warm.kept == 0
        fresh = await pid(warm)
        assert fresh != broken
    finally:
        await warm.close()


async def test_a_failed_statement_or_transaction_gives_its_connection_back(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=60)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            await warm.fetch("SELECT 1 / 0", {}, tuple_row)
        assert warm.kept == 0 and available(pool) == 2
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with warm.connection() as conn, conn.transaction():
                await conn.execute("SELECT 1 / 0")
        assert warm.kept == 0 and available(pool) == 2
        assert await pid(warm)  # the pool's connections still work
    finally:
        await warm.close()


async def test_statements_after_close_give_their_connection_back_at_once(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=60)
    await pid(warm)
    await warm.close()
    assert warm.kept == 0 and available(pool) == 2
    await pid(warm)
    assert warm.kept == 0 and available(pool) == 2


async def test_at_most_size_connections_are_kept(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, size=1, idle=60)
    try:
        await asyncio.gather(warm.fetch("SELECT pg_sleep(0.2)", {}, tuple_row),
                             warm.fetch("SELECT pg_sleep(0.2)", {}, tuple_row))
        assert warm.kept == 1 and available(pool) == 1
    finally:
        await warm.close()


async def test_the_engine_runs_its_statements_on_a_kept_connection_and_closes_cleanly(db_url: str) -> None:
    engine = await Engine.open(db_url, min_size=1, max_size=4)
    try:
        await engine.enqueue("thumbnail", input={"n": 1})
        assert engine.warm.kept == 1
        (lease,) = await engine.claim("w1", ["thumbnail"], 1, 30)
        run = await engine.get_run(str(lease["run_id"]))  # a snapshot transaction on the kept one
        assert run["state"] == "running" and engine.warm.kept == 1
    finally:
        await engine.close()
    assert engine.warm.kept == 0


async def test_when_somebody_waits_for_the_pool_every_kept_connection_goes_back(db_url: str) -> None:
    three = AsyncConnectionPool(db_url, min_size=3, max_size=3, open=False, kwargs={"autocommit": True})
    await three.open(wait=True, timeout=30)
    warm = WarmConnections(three, size=3, idle=60)
    try:
        await asyncio.gather(*(warm.fetch("SELECT pg_sleep(0.1)", {}, tuple_row) for _ in range(3)))
        assert warm.kept == 3 and available(three) == 0
        waiting = asyncio.create_task(three.getconn(timeout=10))
        await until(lambda: three.get_stats().get("requests_waiting", 0) == 1)
        await pid(warm)  # takes a kept one; parking it, it sees the waiter
        conn = await waiting
        assert warm.kept == 0 and available(three) == 2
        await three.putconn(conn)
    finally:
        await warm.close()
        await three.close()


async def test_a_cursor_is_not_kept_after_a_large_statement(pool: AsyncConnectionPool) -> None:
    warm = WarmConnections(pool, idle=60)
    try:
        await warm.fetch("SELECT length(%(s)s) AS n", {"s": "x" * 10}, dict_row)
        assert list(warm._free[-1].cursors) == [dict_row]
        big = "x" * (200 * 1024)
        assert (await warm.fetch("SELECT length(%(s)s) AS n", {"s": big}, dict_row)) == [{"n": len(big)}]
        assert warm._free[-1].cursors == {}  # its parameters went with it
        rows = await warm.fetch("SELECT generate_series(1, 5000) AS i", {}, tuple_row)
        assert len(rows) == 5000 and warm._free[-1].cursors == {}
    finally:
        await warm.close()


async def test_a_pool_whose_connections_are_not_in_autocommit_is_refused(db_url: str) -> None:
    plain = AsyncConnectionPool(db_url, min_size=1, max_size=1, open=False)
    with pytest.raises(ValueError, match="autocommit"):
        WarmConnections(plain)
