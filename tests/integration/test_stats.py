"""cyclone_v_kinds: per-kind counts and the oldest available age, read from an index.

`available` counts only what is claimable now; a step waiting for a future scheduled_at
(backoff, snooze, Enqueue.scheduled_at) is `scheduled`, not backlog (docs/lifecycle.md, "Backlog and scheduled").
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from engine_helpers import claim_one, db_now, fetch, fetch_one, partition_parents, plan_nodes

from cyclone_server.store.engine import Engine

pytestmark = pytest.mark.statemachine


async def test_counts_and_oldest_available_age_per_kind(engine: Engine, conn) -> None:
    now = await db_now(conn)
    await engine.enqueue("mail", scheduled_at=now - timedelta(seconds=100))
    await engine.enqueue("mail", scheduled_at=now - timedelta(seconds=10))
    await engine.enqueue("mail", scheduled_at=now + timedelta(hours=1))  # available, not yet claimable
    await engine.enqueue("later", scheduled_at=now + timedelta(hours=1))
    await engine.enqueue("later", scheduled_at=now + timedelta(seconds=30))
    await engine.enqueue("busy")
    await claim_one(engine, "busy")
    done, _, _ = await engine.enqueue("gone")
    lease = await claim_one(engine, "gone")
    await engine.complete(lease["step_id"], lease["lease_generation"], None)
    stats = {r["kind"]: r for r in await engine.stats()}
    assert set(stats) == {"mail", "later", "busy"}  # kinds with nothing available or running are left out
    figures = {k: (r["available"], r["scheduled"], r["running"]) for k, r in stats.items()}
    assert figures == {"mail": (2, 1, 0), "later": (0, 2, 0), "busy": (0, 0, 1)}
    assert 100 <= stats["mail"]["oldest_available_age"].total_seconds() < 160
    assert stats["later"]["oldest_available_age"] == stats["busy"]["oldest_available_age"] == timedelta(0)


async def test_a_retried_step_is_scheduled_until_its_backoff_passes(engine: Engine, conn) -> None:
    await engine.enqueue("flaky", options={"backoff_initial": 3600, "backoff_max": 3600})
    lease = await claim_one(engine, "flaky")
    assert await engine.fail(str(lease["step_id"]), lease["lease_generation"], "try later") == "retried"
    row = (await engine.stats())[0]
    assert (row["kind"], row["available"], row["scheduled"], row["running"]) == ("flaky", 0, 1, 0)
    await conn.execute("UPDATE cyclone_steps SET scheduled_at = now() - interval '1s' WHERE kind = 'flaky'")
    row = (await engine.stats())[0]
    assert (row["available"], row["scheduled"]) == (1, 0)


async def test_view_reads_the_index_not_the_table(conn) -> None:
    await conn.execute("INSERT INTO cyclone_runs (id, state) VALUES ('00000000-0000-7000-8000-000000000001', "
                       "'running')")
    # 50,000 available steps in 5 kinds (one in 8 scheduled for later), 10,000 more that the
    # view must not read.
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, scheduled_at, max_attempts, max_reclaims,
                                   attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), '00000000-0000-7000-8000-000000000001', 'n' || i, 'kind' || (i % 5), 'task',
               CASE WHEN i <= 50000 THEN 'available' WHEN i <= 55000 THEN 'running' ELSE 'completed' END,
               now() + CASE WHEN i % 8 = 0 THEN interval '1 hour' ELSE -make_interval(secs => i % 1000) END,
               25, 5, '600s', '1s', '600s'
          FROM generate_series(1, 60000) i""")
    await conn.execute("ANALYZE cyclone_steps")
    plan = (await fetch_one(conn, "EXPLAIN (FORMAT JSON) SELECT * FROM cyclone_v_kinds"))["QUERY PLAN"][0]["Plan"]
    parents = await partition_parents(conn)  # a plan names the days it reads (migration 0014)
    # (a day to come is empty: its plan is a sequential scan, of nothing)
    filled = {r["name"] for r in await fetch(conn, "SELECT relid::regclass::text AS name FROM pg_partition_tree("
                                                   "'cyclone_steps') WHERE isleaf AND pg_relation_size(relid) > 0")}
    scans = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if n.get("Relation Name") in filled]
    # Available steps from the claim index, running ones from the index of running steps
    # (migration 0009), directly or through a bitmap.
    indexes = {parents[n["Index Name"]] for n in plan_nodes(plan) if n.get("Index Name")}
    # The limited steps due now are in two indexes of the same rows (the fair order, and by key
    # for the claim's walk): the planner reads either.
    fair = indexes & {"cyclone_steps_claim_fair", "cyclone_steps_claim_heads"}
    assert len(fair) == 1 and indexes - fair == {"cyclone_steps_claim_free", "cyclone_steps_claim_later",
                                                 "cyclone_steps_running"}, indexes
    rows = await fetch(conn, "SELECT * FROM cyclone_v_kinds ORDER BY kind")
    later = {k: sum(1 for i in range(1, 50001) if i % 5 == k and i % 8 == 0) for k in range(5)}
    assert [(r["kind"], r["available"], r["scheduled"], r["running"]) for r in rows] == [
        (f"kind{k}", 10000 - later[k], later[k], 1000) for k in range(5)]
    assert all(990 <= r["oldest_available_age"].total_seconds() < 1100 for r in rows)
