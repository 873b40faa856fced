"""Helpers for the state-machine tests: workflows, raw rows, time travel and invariants."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from cyclone_server.store.engine import Engine

Row = dict[str, Any]


def task(node_id: str, *deps: str, **options: Any) -> dict[str, Any]:
    """A node definition; `type` defaults to task and `kind` to the id (so kinds name nodes)."""
    return {"id": node_id, "deps": list(deps), **options}


async def start(engine: Engine, nodes: Iterable[dict[str, Any]], *, name: str = "wf",
                input: Any = None, **kw: Any) -> str:
    """Register `nodes` as workflow `name` and submit one run of it."""
    await engine.register_workflow(name, list(nodes))
    run_id, created = await engine.submit_run(name, input=input, **kw)
    assert created
    return run_id


async def fetch(conn: psycopg.AsyncConnection, sql: str, *params: Any) -> list[Row]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def fetch_one(conn: psycopg.AsyncConnection, sql: str, *params: Any) -> Row:
    rows = await fetch(conn, sql, *params)
    assert len(rows) == 1, rows
    return rows[0]


async def log_plans(conn: psycopg.AsyncConnection, *, analyze: bool = False) -> tuple[
        list[tuple[str, dict[str, Any]]], Callable[[psycopg.errors.Diagnostic], None]]:
    """Turn on auto_explain for every statement this session runs from now on, nested ones
    inside functions included: the list fills with their (query text, plan), the plans
    those functions actually use (their cached plans included), with actual row counts when
    `analyze`. Also returns the notice handler, for the caller to remove."""
    plans: list[tuple[str, dict[str, Any]]] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""  # "duration: 0.123 ms  plan:\n{...}"
        doc = json.loads(text[text.index("{"):])
        plans.append((doc["Query Text"], doc["Plan"]))

    settings = {"log_min_duration": "0", "log_nested_statements": "on", "log_format": "json",
                "log_level": "notice", "log_analyze": "on" if analyze else "off", "log_timing": "off"}
    await conn.execute("LOAD 'auto_explain'")
    conn.add_notice_handler(keep)
    for name, value in settings.items():
        await conn.execute(f"SET auto_explain.{name} = {value}")
    return plans, keep


async def nested_plans(conn: psycopg.AsyncConnection, sql: str, *params: Any,
                       analyze: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(query text, plan) of every statement `sql` runs inside functions (log_plans)."""
    plans, keep = await log_plans(conn, analyze=analyze)
    try:
        await fetch(conn, sql, *params)
    finally:
        await conn.execute("RESET auto_explain.log_min_duration")
        conn.remove_notice_handler(keep)
    return plans


async def history_from(conn, days_ago: int) -> None:
    """Lay the (empty) tables out as if history began `days_ago` days ago (UTC): a first
    partition of everything before that day, then one partition per day to two days ahead."""
    for row in await fetch(conn, "SELECT suffix FROM cyclone_history_days"):
        for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps"):
            await conn.execute(f"ALTER TABLE {t} DETACH PARTITION {t}_{row['suffix']}")
            await conn.execute(f"DROP TABLE {t}_{row['suffix']}")
    await conn.execute("DELETE FROM cyclone_history_days")
    await conn.execute("SELECT cyclone__history_day_make(NULL, cyclone__day_uuid(now() - make_interval(days => %s)), "
                       "'first', NULL)", (days_ago,))
    made = (await fetch_one(conn, "SELECT cyclone_history_ensure() AS n"))["n"]
    assert made == days_ago + 3


async def partition_parents(conn: psycopg.AsyncConnection) -> dict[str, str]:
    """The name of each partition of a table or index (the days of history, migration 0014)
    to its parent's: a plan names the partitions it reads."""
    rows = await fetch(conn, "SELECT i.inhrelid::regclass::text AS part, i.inhparent::regclass::text AS parent "
                             "FROM pg_inherits i")
    return {r["part"]: r["parent"] for r in rows}



def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan's nodes, depth first."""
    out = [plan]
    for child in plan.get("Plans", []):
        out += plan_nodes(child)
    return out


def wide_nodes(plans: Iterable[tuple[str, dict[str, Any]]], rows: int) -> dict[str, list[tuple[Any, ...]]]:
    """The nodes of analyzed plans that read more than `rows` rows in all their loops, as
    (node type, index or relation, rows) by the first words of their statement."""
    wide: dict[str, list[tuple[Any, ...]]] = {}
    for text, plan in plans:
        for n in plan_nodes(plan):
            read = n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
            if read > rows:
                wide.setdefault(" ".join(text.split())[:90], []).append(
                    (n["Node Type"], n.get("Index Name") or n.get("Relation Name"), read))
    return wide


async def run_row(conn: psycopg.AsyncConnection, run_id: str) -> Row:
    return await fetch_one(conn, "SELECT * FROM cyclone_runs WHERE id = %s", run_id)


async def steps(conn: psycopg.AsyncConnection, run_id: str) -> dict[str, Row]:
    """The run's steps by node id."""
    rows = await fetch(conn, "SELECT * FROM cyclone_steps WHERE run_id = %s", run_id)
    return {r["node"]: r for r in rows}


async def step(conn: psycopg.AsyncConnection, run_id: str, node: str) -> Row:
    return await fetch_one(conn, "SELECT * FROM cyclone_steps WHERE run_id = %s AND node = %s", run_id, node)


async def states(conn: psycopg.AsyncConnection, run_id: str) -> dict[str, str]:
    return {n: r["state"] for n, r in (await steps(conn, run_id)).items()}


async def snapshot(conn: psycopg.AsyncConnection) -> list[list[Row]]:
    """Every row of every Cyclone table, to show that a refused action changed nothing."""
    out = []
    for table, key in (("cyclone_runs", "id"), ("cyclone_steps", "id"),
                       ("cyclone_step_deps", "step_id, dep_id"), ("cyclone_signals", "id")):
        out.append(await fetch(conn, f"SELECT * FROM {table} ORDER BY {key}"))
    return out


async def db_now(conn: psycopg.AsyncConnection) -> datetime:
    return (await fetch_one(conn, "SELECT clock_timestamp() AS t"))["t"]


async def claim_one(engine: Engine, kind: str, *, owner: str = "w1", ttl: float = 30.0) -> Row:
    """Claim exactly one step of `kind` (node ids are kinds in these tests)."""
    leases = await engine.claim(owner, [kind], limit=10, lease_ttl=ttl)
    assert len(leases) == 1, leases
    return leases[0]


async def finish(engine: Engine, kind: str, output: object = None) -> Row:
    """Claim the one step of `kind` and complete it (applied); returns its lease."""
    lease = await claim_one(engine, kind)
    assert await engine.complete(lease["step_id"], lease["lease_generation"], output) == "applied"
    return lease


async def discard(engine: Engine, kind: str) -> Row:
    """Claim the one step of `kind` and fail it permanently (discarded); returns its lease."""
    lease = await claim_one(engine, kind)
    assert await engine.fail(lease["step_id"], lease["lease_generation"], "no", permanent=True) == "discarded"
    return lease


async def expire_lease(conn: psycopg.AsyncConnection, step_id: Any) -> None:
    await conn.execute("UPDATE cyclone_steps SET lease_expiry = now() - interval '1s' WHERE id = %s", (step_id,))


async def make_due(conn: psycopg.AsyncConnection, run_id: str) -> None:
    """Skip every backoff and snooze of the run: its available steps become claimable now."""
    await conn.execute("UPDATE cyclone_steps SET scheduled_at = now() - interval '1ms' "
                       "WHERE run_id = %s AND state IN ('available', 'paused')", (run_id,))


async def until(cond: Callable[[], Any], what: str = "the condition", deadline: float = 20.0) -> None:
    """Poll `cond` (a plain function, for state in this process) until it holds, failing
    after `deadline` seconds; `eventually` is for a check that awaits."""
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 20.0,
                     step: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Poll `check` (running `step` before each poll) until it holds or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            await step()
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)


async def lock_waits(conn: psycopg.AsyncConnection) -> int:
    """How many sessions of this database wait for a lock now."""
    row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                                "AND wait_event_type = 'Lock'")
    return row["n"]


async def lock_waits_are(conn: psycopg.AsyncConnection, n: int) -> bool:
    return await lock_waits(conn) == n

async def sweep_until_run(engine: Engine, conn: psycopg.AsyncConnection, run_id: str, state: str) -> Row:
    """Run the sweep and wait scanners until the run is in `state`; returns the run row."""
    async def done() -> bool:
        return (await run_row(conn, run_id))["state"] == state
    await eventually(done, step=engine.sweep)
    return await run_row(conn, run_id)


def close_to(a: datetime | timedelta, b: datetime | timedelta, tolerance: float = 1.0) -> bool:
    return abs((a - b).total_seconds()) <= tolerance  # type: ignore[operator]


# Each query returns the rows that break one rule of the lifecycle document.
INVARIANTS: dict[str, str] = {
    # No foreign key holds these since migration 0012: the functions do.
    "a step, edge or signal of a run that does not exist": """
        SELECT x.id FROM (SELECT id, run_id FROM cyclone_steps
                          UNION ALL SELECT step_id, run_id FROM cyclone_step_deps
                          UNION ALL SELECT id, run_id FROM cyclone_signals) x
         WHERE NOT EXISTS (SELECT 1 FROM cyclone_runs r WHERE r.id = x.run_id)""",
    # A step's id starts with its run's (cyclone__step_uuid), so its row and its edges are in
    # its run's day of history: the lookups of a run's steps and edges read from that day on.
    "a step or edge outside its run's day of history": """
        SELECT x.id FROM (SELECT id, run_id FROM cyclone_steps
                          UNION ALL SELECT step_id, run_id FROM cyclone_step_deps
                          UNION ALL SELECT dep_id, run_id FROM cyclone_step_deps) x
         WHERE (SELECT d.lo FROM cyclone__days_span(x.id, x.id) d)
               IS DISTINCT FROM (SELECT d.lo FROM cyclone__days_span(x.run_id, x.run_id) d)""",
    "child run of a run that does not exist": """
        SELECT c.id FROM cyclone_runs c
         WHERE c.parent_run_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM cyclone_runs r WHERE r.id = c.parent_run_id)""",
    "running step without a lease": """
        SELECT id FROM cyclone_steps WHERE state = 'running'
           AND (lease_owner IS NULL OR lease_expiry IS NULL OR lease_generation = 0 OR started_at IS NULL)""",
    "paused step in a run that is not paused": """
        SELECT s.id FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id
         WHERE s.state = 'paused' AND r.state <> 'paused'""",
    "non-terminal step in an ended run": """
        SELECT s.id FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id
         WHERE r.state IN ('completed', 'failed', 'cancelled')
           AND s.state NOT IN ('completed', 'discarded', 'cancelled')""",
    "completed run with a step that is not completed or contained": """
        SELECT s.id FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id
         WHERE r.state = 'completed'
           AND NOT (s.state = 'completed'
                    OR (s.state = 'cancelled' AND s.cancel_cause = 'branch')
                    OR (s.state = 'discarded'
                        AND EXISTS (SELECT 1 FROM cyclone_step_deps d WHERE d.dep_id = s.id)
                        AND NOT EXISTS (
                            WITH RECURSIVE down (id) AS (
                                SELECT d.step_id FROM cyclone_step_deps d WHERE d.dep_id = s.id
                                UNION SELECT d.step_id FROM cyclone_step_deps d JOIN down ON d.dep_id = down.id)
                            SELECT 1 FROM down JOIN cyclone_steps x ON x.id = down.id
                             WHERE x.on_dep_failure <> 'cancel_branch')))""",
    "completed run without a result": """
        SELECT id FROM cyclone_runs WHERE state = 'completed' AND result IS NULL""",
    "ended run without finished_at, or active run with it": """
        SELECT id FROM cyclone_runs
         WHERE (state IN ('completed', 'failed', 'cancelled')) <> (finished_at IS NOT NULL)""",
    "failed run without its cause": """
        SELECT id FROM cyclone_runs
         WHERE state = 'failed' AND failed_by_step IS NULL AND NOT failed_by_deadline""",
    "step started before its deps completed": """
        SELECT s.id FROM cyclone_steps s JOIN cyclone_step_deps d ON d.step_id = s.id
          JOIN cyclone_steps p ON p.id = d.dep_id
         WHERE s.state IN ('available', 'running', 'completed', 'waiting_timer', 'waiting_signal', 'waiting_child')
           AND p.state <> 'completed'""",
    "pending step of a running run whose deps all completed": """
        SELECT s.id FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id
         WHERE s.state = 'pending' AND r.state = 'running'
           AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = s.id AND p.state <> 'completed')""",
    "terminal step without finished_at, or non-terminal with it": """
        SELECT id FROM cyclone_steps
         WHERE (state IN ('completed', 'discarded', 'cancelled')) <> (finished_at IS NOT NULL)""",
    "waiting child node without an active child run of its own": """
        SELECT s.id FROM cyclone_steps s LEFT JOIN cyclone_runs c ON c.id = s.child_run_id
         WHERE s.state = 'waiting_child'
           AND (c.id IS NULL OR c.parent_step_id <> s.id)""",
    "active child run whose parent node is not waiting for it": """
        SELECT c.id FROM cyclone_runs c LEFT JOIN cyclone_steps s ON s.id = c.parent_step_id
         WHERE c.parent_run_id IS NOT NULL AND c.state IN ('running', 'paused')
           AND (s.id IS NULL OR s.child_run_id IS DISTINCT FROM c.id
                OR s.state NOT IN ('waiting_child', 'paused'))""",
    "attempt out of range": """
        SELECT id FROM cyclone_steps WHERE attempt < 1 OR attempt > max_attempts
            OR reclaims < 0 OR reclaims > max_reclaims""",
    "signal consumed twice or by a step that is not completed": """
        SELECT g.id FROM cyclone_signals g JOIN cyclone_steps s ON s.id = g.consumed_by
         WHERE s.state <> 'completed'
            OR (SELECT count(*) FROM cyclone_signals h WHERE h.consumed_by = g.consumed_by) > 1""",
}


async def violations(conn: psycopg.AsyncConnection) -> dict[str, list[Any]]:
    """The broken invariants (rule -> offending ids); empty when every row is legal."""
    out: dict[str, list[Any]] = {}
    for rule, sql in INVARIANTS.items():
        rows = await fetch(conn, sql)
        if rows:
            out[rule] = [r["id"] for r in rows]
    return out
