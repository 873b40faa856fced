"""cyclone_v_kinds: per-kind counts and the oldest available age, read from an index."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from engine_helpers import claim_one, db_now, fetch, fetch_one

from cyclone_server.engine import Engine

pytestmark = pytest.mark.statemachine


async def test_counts_and_oldest_available_age_per_kind(engine: Engine, conn) -> None:
    now = await db_now(conn)
    await engine.enqueue("mail", scheduled_at=now - timedelta(seconds=100))
    await engine.enqueue("mail", scheduled_at=now - timedelta(seconds=10))
    await engine.enqueue("mail", scheduled_at=now + timedelta(hours=1))  # available, not yet claimable
    await engine.enqueue("later", scheduled_at=now + timedelta(hours=1))
    await engine.enqueue("busy")
    await claim_one(engine, "busy")
    done, _, _ = await engine.enqueue("gone")
    lease = await claim_one(engine, "gone")
    await engine.complete(lease["step_id"], lease["lease_generation"], None)
    stats = {r["kind"]: r for r in await engine.stats()}
    assert set(stats) == {"mail", "later", "busy"}  # kinds with nothing available or running are left out
    assert (stats["mail"]["available"], stats["mail"]["running"]) == (3, 0)
    assert 100 <= stats["mail"]["oldest_available_age"].total_seconds() < 160
    assert (stats["later"]["available"], stats["later"]["oldest_available_age"]) == (1, timedelta(0))
    assert (stats["busy"]["available"], stats["busy"]["running"], stats["busy"]["oldest_available_age"]) == (
        0, 1, timedelta(0))


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


async def test_view_reads_the_index_not_the_table(conn) -> None:
    await conn.execute("INSERT INTO cyclone_runs (id, state) VALUES ('00000000-0000-7000-8000-000000000001', "
                       "'running')")
    # 50,000 available steps in 5 kinds, 10,000 more that the view must not read.
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, scheduled_at, max_attempts, max_reclaims,
                                   attempt_timeout, backoff_initial, backoff_max)
        SELECT gen_random_uuid(), '00000000-0000-7000-8000-000000000001', 'n' || i, 'kind' || (i % 5), 'task',
               CASE WHEN i <= 50000 THEN 'available' WHEN i <= 55000 THEN 'running' ELSE 'completed' END,
               now() - make_interval(secs => i % 1000), 25, 5, '600s', '1s', '600s'
          FROM generate_series(1, 60000) i""")
    await conn.execute("ANALYZE cyclone_steps")
    plan = (await fetch_one(conn, "EXPLAIN (FORMAT JSON) SELECT * FROM cyclone_v_kinds"))["QUERY PLAN"][0]["Plan"]
    scans = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if n.get("Relation Name") ==
             "cyclone_steps"]
    assert scans and all(t != "Seq Scan" for t, _ in scans), scans
    assert {i for _, i in scans if i} == {"cyclone_steps_active_kind"}
    rows = await fetch(conn, "SELECT * FROM cyclone_v_kinds ORDER BY kind")
    assert [(r["kind"], r["available"], r["running"]) for r in rows] == [
        (f"kind{k}", 10000, 1000) for k in range(5)]
    assert all(990 <= r["oldest_available_age"].total_seconds() < 1100 for r in rows)
