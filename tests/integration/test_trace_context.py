"""Integration: a run keeps its submitter's trace context, child runs inherit it, and claims return it."""

from __future__ import annotations

import psycopg

from cyclone_server.records import Job

from cyclone_server.store.engine import Engine
from engine_helpers import fetch, run_row, start, task

CTX = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE"}
OTHER = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


async def test_submit_keeps_the_context_and_the_claim_returns_it(engine: Engine,
                                                                  conn: psycopg.AsyncConnection) -> None:
    traced = await start(engine, [task("a")], trace_context=CTX)
    plain = await start(engine, [task("a")], name="plain")
    assert (await run_row(conn, traced))["trace_context"] == CTX
    assert (await run_row(conn, plain))["trace_context"] is None
    rows = await engine.claim("w", ["a"], 10, 30)
    assert {str(r["run_id"]): r["trace_context"] for r in rows} == {traced: CTX, plain: None}


async def test_a_repeated_submit_keeps_the_first_context(engine: Engine, conn: psycopg.AsyncConnection) -> None:
    await engine.register_workflow("wf", [task("a")])
    first, created = await engine.submit_run("wf", idempotency_key="k", trace_context=CTX)
    again, created_again = await engine.submit_run("wf", idempotency_key="k", trace_context=OTHER)
    assert (first, created, created_again) == (again, True, False)
    assert (await run_row(conn, first))["trace_context"] == CTX


async def test_enqueue_and_enqueue_many_keep_each_jobs_context(engine: Engine,
                                                                conn: psycopg.AsyncConnection) -> None:
    one, _, _ = await engine.enqueue_job(Job("email", trace_context=CTX))
    rows = await engine.enqueue_many([Job("email", trace_context=OTHER), Job("email")])
    got = {r["id"]: r["trace_context"] for r in await fetch(conn, "SELECT id, trace_context FROM cyclone_runs")}
    assert {str(k): v for k, v in got.items()} == {one: CTX, rows[0][0]: OTHER, rows[1][0]: None}


async def test_a_child_run_inherits_its_parents_context(engine: Engine, conn: psycopg.AsyncConnection) -> None:
    await engine.register_workflow("sub", [task("x")])
    parent = await start(engine, [task("kid", type="child", workflow="sub")], trace_context=CTX)
    children = await fetch(conn, "SELECT trace_context FROM cyclone_runs WHERE parent_run_id = %s", parent)
    assert [c["trace_context"] for c in children] == [CTX]
