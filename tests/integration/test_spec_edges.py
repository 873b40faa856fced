"""Edges of the lifecycle document that a first implementation got wrong, one test each."""

from __future__ import annotations

import pytest
from engine_helpers import claim_one, fetch_one, run_row, start, states, step, task

from cyclone_server.records import Result

from cyclone_server.store.engine import Engine

pytestmark = pytest.mark.statemachine

CB = {"on_dep_failure": "cancel_branch"}


async def test_output_size_limit_counts_compact_json(engine: Engine, conn) -> None:
    # 400,000 one-digit numbers: 800 KB as compact JSON, about 1.2 MB as jsonb text (", ").
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    [(_, _, status)] = await engine.apply_results(
        [Result(str(lease["step_id"]), lease["lease_generation"], "completed", output=[1] * 400_000)])
    assert status == "applied"
    assert (await step(conn, run_id, "a"))["state"] == "completed"


async def test_output_over_the_limit_discards_the_step(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    [(_, _, status)] = await engine.apply_results(
        [Result(str(lease["step_id"]), lease["lease_generation"], "completed", output="x" * (1 << 20))])
    assert status == "output_too_large"
    row = await step(conn, run_id, "a")
    assert (row["state"], row["error_kind"], row["reason"], row["output"]) == ("discarded", "permanent",
                                                                                "output_too_large", None)


async def test_signal_nodes_that_start_waiting_together_are_served_in_node_id_order(engine: Engine, conn) -> None:
    # Defined b before a; both start waiting at submit, in one transaction: "a" goes first.
    run_id = await start(engine, [task("b", type="signal", signal="go"), task("a", type="signal", signal="go")])
    await engine.signal(run_id, "go", {"n": 1})
    assert await states(conn, run_id) == {"b": "waiting_signal", "a": "completed"}
    assert (await step(conn, run_id, "a"))["output"] == {"n": 1}


async def test_retrying_one_of_two_contained_discards_keeps_the_shared_branch_cancelled(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b"), task("c", "a", "b", **CB), task("d")])
    for kind in ("a", "b"):
        lease = await claim_one(engine, kind)
        await engine.fail(str(lease["step_id"]), lease["lease_generation"], "no", permanent=True)
    assert await states(conn, run_id) == {"a": "discarded", "b": "discarded", "c": "cancelled", "d": "available"}
    await engine.retry(run_id, "a")
    # c still depends on b, which stays discarded: c stays cancelled, by b's branch.
    assert await states(conn, run_id) == {"a": "available", "b": "discarded", "c": "cancelled", "d": "available"}
    c = await step(conn, run_id, "c")
    b = await step(conn, run_id, "b")
    assert (c["cancel_cause"], c["cancelled_by"]) == ("branch", b["id"])
    for kind in ("a", "d"):
        lease = await claim_one(engine, kind)
        assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], {}) == "applied"
    assert (await run_row(conn, run_id))["state"] == "completed"


async def test_a_retried_attempt_timeout_shows_error_kind_timeout(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=3, attempt_timeout=60)])
    lease = await claim_one(engine, "a")
    await conn.execute("UPDATE cyclone_steps SET attempt_deadline = now() - interval '1 s' WHERE id = %s",
                       (lease["step_id"],))
    await engine.sweep()
    row = await step(conn, run_id, "a")
    assert (row["state"], row["attempt"], row["error_kind"]) == ("available", 2, "timeout")
    assert row["errors"][-1]["error_kind"] == "timeout"


async def test_purge_terminal_runs_never_deletes_a_run_before_its_own_retention(engine: Engine, conn) -> None:
    keep = await start(engine, [task("a", retention=3600)])
    short = await start(engine, [task("b", retention=0)])
    for kind in ("a", "b"):
        lease = await claim_one(engine, kind)
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], {})
    await conn.execute("UPDATE cyclone_runs SET finished_at = now() - interval '2 minutes'")
    # PurgeTerminalRuns: older than a day takes neither; older than a minute takes "short"
    # (its retention, 0, has passed) but not "keep" (an hour of retention). The retention
    # sweep, default age a day, takes "keep" once its own hour has passed.
    assert await engine.purge(86400) == 0
    assert await engine.purge(60) == 1
    assert (await fetch_one(conn, "SELECT count(*) AS n FROM cyclone_runs WHERE id = %s", short))["n"] == 0
    await conn.execute("UPDATE cyclone_runs SET finished_at = now() - interval '2 hours'")
    assert await engine.purge(86400, sweep=True) == 1
    assert (await fetch_one(conn, "SELECT count(*) AS n FROM cyclone_runs WHERE id = %s", keep))["n"] == 0
