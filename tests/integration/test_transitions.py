"""Each step row of the State Transition Table, exactly: states, counters, leases, timestamps."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from cyclone_server.records import Result

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition, NotFound

from engine_helpers import (claim_one, db_now, expire_lease, fetch, make_due, run_row, snapshot, start, step,
                             steps, task)

pytestmark = pytest.mark.statemachine


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if before[k] != after[k]}


def last_error_at(row: dict) -> datetime:
    return datetime.fromisoformat(row["errors"][-1]["at"])


async def test_submit_inserts_running_run_with_pending_and_available_steps(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a")], input={"x": 1})
    run = await run_row(conn, run_id)
    assert (run["state"], run["input"], run["finished_at"], run["result"]) == ("running", {"x": 1}, None, None)
    s = await steps(conn, run_id)
    assert s["a"]["state"] == "available" and s["b"]["state"] == "pending"
    for row in s.values():
        assert (row["attempt"], row["reclaims"], row["snoozes"], row["lease_generation"]) == (1, 0, 0, 0)
        assert row["lease_owner"] is row["lease_expiry"] is row["started_at"] is row["finished_at"] is None
    # The run and its first steps are one transaction: one now().
    assert s["a"]["scheduled_at"] == s["a"]["created_at"] == run["created_at"]


async def test_enqueue_is_a_one_node_run_available_at_once(engine: Engine, conn) -> None:
    run_id, step_id, created = await engine.enqueue("email", input={"to": "a@b"})
    assert created
    row = await step(conn, run_id, "email")
    assert (str(row["id"]), row["state"]) == (step_id, "available")
    lease = await claim_one(engine, "email")
    assert str(lease["step_id"]) == step_id and lease["input"] == {"to": "a@b"} and lease["parents"] == {}


async def test_pending_becomes_available_when_its_last_dep_completes(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b"), task("c", "a", "b")])
    la = await claim_one(engine, "a")
    assert await engine.complete(la["step_id"], la["lease_generation"], {"a": 1}) == "applied"
    assert (await step(conn, run_id, "c"))["state"] == "pending"
    lb = await claim_one(engine, "b")
    await engine.complete(lb["step_id"], lb["lease_generation"], {"b": 2})
    s = await steps(conn, run_id)
    assert s["c"]["state"] == "available"
    assert s["c"]["scheduled_at"] == s["b"]["finished_at"]  # FIFO key: when it became claimable
    lc = await claim_one(engine, "c")
    assert lc["parents"] == {"a": {"a": 1}, "b": {"b": 2}}


async def test_claim_writes_exactly_the_lease_fields(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", attempt_timeout=60)])
    before = await step(conn, run_id, "a")
    lease = await claim_one(engine, "a", owner="worker-7", ttl=30)
    after = await step(conn, run_id, "a")
    assert changed(before, after) == {"state", "lease_expiry", "lease_owner", "lease_generation", "started_at",
                                      "attempt_deadline"}
    assert after["state"] == "running" and after["lease_owner"] == "worker-7"
    assert after["lease_generation"] == before["lease_generation"] + 1 == lease["lease_generation"] == 1
    assert after["lease_expiry"] - after["started_at"] == timedelta(seconds=30)
    assert after["attempt_deadline"] - after["started_at"] == timedelta(seconds=60)
    assert abs((after["started_at"] - await db_now(conn)).total_seconds()) < 5
    assert after["attempt"] == lease["attempt"] == 1  # a claim never changes the attempt


async def test_claim_skips_pending_paused_and_future_steps_and_orders_by_priority(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", kind="k"), task("b", "a", kind="k")])
    await engine.enqueue("k", scheduled_at=await db_now(conn) + timedelta(hours=1))
    paused_run, _, _ = await engine.enqueue("k")
    await engine.pause_run(paused_run)
    low, _, _ = await engine.enqueue("k", priority=5)
    high, _, _ = await engine.enqueue("k", priority=-5)
    leases = await engine.claim("w", ["k"], limit=10, lease_ttl=30)
    assert [str(x["run_id"]) for x in leases] == [high, run_id, low]
    assert (await step(conn, run_id, "b"))["state"] == "pending"


async def test_complete_stores_output_and_completes_the_run(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a")])
    la = await claim_one(engine, "a")
    before = await step(conn, run_id, "a")
    await engine.complete(la["step_id"], la["lease_generation"], {"rows": 3})
    after = await step(conn, run_id, "a")
    assert changed(before, after) == {"state", "output", "finished_at"}
    assert after["state"] == "completed" and after["output"] == {"rows": 3}
    assert (await run_row(conn, run_id))["state"] == "running"
    lb = await claim_one(engine, "b")
    await engine.complete(lb["step_id"], lb["lease_generation"], [1, 2])
    run = await run_row(conn, run_id)
    b = await step(conn, run_id, "b")
    assert (run["state"], run["result"]) == ("completed", {"b": [1, 2]})  # the leaves, by node id
    assert run["finished_at"] == b["finished_at"]  # one transaction


async def test_retryable_failure_goes_back_to_available_after_backoff(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=5, backoff_initial=10, backoff_max=100)])
    lease = await claim_one(engine, "a")
    before = await step(conn, run_id, "a")
    assert await engine.fail(lease["step_id"], lease["lease_generation"], "boom") == "retried"
    after = await step(conn, run_id, "a")
    assert changed(before, after) == {"state", "attempt", "scheduled_at", "errors", "attempt_deadline"}
    assert (after["state"], after["attempt"], after["reclaims"]) == ("available", 2, 0)
    assert after["errors"][0]["attempt"] == 1 and after["errors"][0]["message"] == "boom"
    # The delay after the n-th failed execution is initial * 2^(n-1) (docs/lifecycle.md, "Retries and backoff"): the
    # first retry waits backoff_initial, 10 s, +-10%.
    assert 9.0 <= (after["scheduled_at"] - last_error_at(after)).total_seconds() <= 11.0
    assert await engine.claim("w", ["a"], 10, 30) == []  # not claimable before scheduled_at
    assert (await run_row(conn, run_id))["state"] == "running"
    # After the second failed execution: initial * 2^(2-1) = 20 s.
    await make_due(conn, run_id)
    lease = await claim_one(engine, "a")
    assert (lease["attempt"], lease["lease_generation"]) == (2, 2)
    await engine.fail(lease["step_id"], lease["lease_generation"], "again")
    row = await step(conn, run_id, "a")
    assert row["attempt"] == 3 and 18.0 <= (row["scheduled_at"] - last_error_at(row)).total_seconds() <= 22.0


async def test_backoff_is_capped_and_a_retry_delay_overrides_it(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=5, backoff_initial=10, backoff_max=12)])
    for _ in range(2):
        lease = await claim_one(engine, "a")
        await engine.fail(lease["step_id"], lease["lease_generation"], "x")
        row = await step(conn, run_id, "a")
        await make_due(conn, run_id)
    # 10 s, then 20 s capped at 12 s: jitter never takes a delay above backoff_max.
    assert 10.8 <= (row["scheduled_at"] - last_error_at(row)).total_seconds() <= 12.0
    lease = await claim_one(engine, "a")
    await engine.fail(lease["step_id"], lease["lease_generation"], "x", retry_delay=300)
    row = await step(conn, run_id, "a")
    assert (row["scheduled_at"] - last_error_at(row)).total_seconds() == pytest.approx(300, abs=0.01)


async def test_backoff_of_a_late_attempt_with_a_long_initial_is_capped_not_overflowed(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=60, backoff_initial=7200, backoff_max=86400)])
    await conn.execute("UPDATE cyclone_steps SET attempt = 45 WHERE run_id = %s", (run_id,))
    lease = await claim_one(engine, "a")
    assert await engine.fail(lease["step_id"], lease["lease_generation"], "x") == "retried"
    row = await step(conn, run_id, "a")
    assert row["attempt"] == 46
    assert 0.9 * 86400 <= (row["scheduled_at"] - last_error_at(row)).total_seconds() <= 86400


async def test_permanent_error_discards_with_the_same_attempt(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    assert await engine.fail(lease["step_id"], lease["lease_generation"], "bad input", permanent=True) == "discarded"
    row = await step(conn, run_id, "a")
    assert (row["state"], row["attempt"], row["error_kind"]) == ("discarded", 1, "permanent")
    assert row["finished_at"] == last_error_at(row)
    run = await run_row(conn, run_id)
    assert (run["state"], str(run["failed_by_step"])) == ("failed", str(row["id"]))


async def test_last_attempt_discards_with_attempt_equal_to_max_attempts(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=2)])
    lease = await claim_one(engine, "a")
    await engine.fail(lease["step_id"], lease["lease_generation"], "one")
    await make_due(conn, run_id)
    lease = await claim_one(engine, "a")
    assert await engine.fail(lease["step_id"], lease["lease_generation"], "two") == "discarded"
    row = await step(conn, run_id, "a")
    assert (row["state"], row["attempt"], row["error_kind"]) == ("discarded", 2, "max_attempts")
    assert [e["message"] for e in row["errors"]] == ["one", "two"]
    assert (await run_row(conn, run_id))["state"] == "failed"


async def test_lease_expiry_reclaims_with_same_attempt_and_no_backoff(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=3)])
    lease = await claim_one(engine, "a")
    await expire_lease(conn, lease["step_id"])
    before = await step(conn, run_id, "a")
    t0 = await db_now(conn)
    assert (await engine.sweep())["leases_sweep"] == 1
    after = await step(conn, run_id, "a")
    assert changed(before, after) == {"state", "reclaims", "scheduled_at", "attempt_deadline"}
    assert (after["state"], after["attempt"], after["reclaims"]) == ("available", 1, 1)
    assert t0 <= after["scheduled_at"] <= await db_now(conn)  # claimable at once
    again = await claim_one(engine, "a")
    assert (again["attempt"], again["lease_generation"], again["reclaims"]) == (1, 2, 1)


async def test_lease_expiry_past_max_reclaims_discards_with_reclaim_limit(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_reclaims=1)])
    for _ in range(2):
        lease = await claim_one(engine, "a")
        await expire_lease(conn, lease["step_id"])
        await engine.sweep()
    row = await step(conn, run_id, "a")
    assert (row["state"], row["error_kind"], row["attempt"], row["reclaims"]) == ("discarded", "reclaim_limit", 1, 1)
    assert (await run_row(conn, run_id))["state"] == "failed"


async def test_renew_extends_the_lease_and_reports_lost_ones(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b")])
    la, lb = await claim_one(engine, "a", ttl=5), await claim_one(engine, "b", ttl=5)
    await engine.complete(lb["step_id"], lb["lease_generation"], None)
    lost = await engine.renew("w1", [(str(la["step_id"]), 1), (str(lb["step_id"]), 1)], lease_ttl=60)
    assert lost == [(str(lb["step_id"]), 1)]
    row = await step(conn, run_id, "a")
    assert 50 < (row["lease_expiry"] - await db_now(conn)).total_seconds() <= 60
    assert row["attempt"] == 1 and row["lease_generation"] == 1


async def test_snooze_keeps_the_attempt_and_counts_apart(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")])
    lease = await claim_one(engine, "a")
    before = await step(conn, run_id, "a")
    t0 = await db_now(conn)
    assert await engine.snooze(lease["step_id"], lease["lease_generation"], 120) == "snoozed"
    t1 = await db_now(conn)
    after = await step(conn, run_id, "a")
    assert changed(before, after) == {"state", "snoozes", "scheduled_at", "attempt_deadline"}
    assert (after["state"], after["attempt"], after["snoozes"]) == ("available", 1, 1)
    assert t0 + timedelta(seconds=120) <= after["scheduled_at"] <= t1 + timedelta(seconds=120)
    assert await engine.claim("w", ["a"], 10, 30) == []


async def test_attempt_timeout_retries_then_discards_with_timeout(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a", max_attempts=2)])
    for expected in ("available", "discarded"):
        lease = await claim_one(engine, "a")
        await conn.execute("UPDATE cyclone_steps SET attempt_deadline = now() - interval '1s' WHERE id = %s",
                           (lease["step_id"],))
        assert (await engine.sweep())["attempts_timeout"] == 1
        row = await step(conn, run_id, "a")
        assert row["state"] == expected and row["errors"][-1]["error_kind"] == "timeout"
        await make_due(conn, run_id)
    assert (row["attempt"], row["error_kind"]) == (2, "timeout")
    assert await engine.complete(lease["step_id"], lease["lease_generation"], None) == "ended"


async def test_refused_results_change_nothing(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b")])
    old = await claim_one(engine, "a")
    await expire_lease(conn, old["step_id"])
    await engine.sweep()
    new = await claim_one(engine, "a")  # generation 2 holds the step now
    lb = await claim_one(engine, "b")
    await engine.complete(lb["step_id"], lb["lease_generation"], "done")
    unknown = "0190d8a4-0000-7000-8000-000000000000"
    before = await snapshot(conn)
    assert await engine.complete(old["step_id"], old["lease_generation"], "late") == "stale"
    assert await engine.fail(old["step_id"], old["lease_generation"], "late") == "stale"
    assert await engine.snooze(old["step_id"], old["lease_generation"], 1) == "stale"
    assert await engine.complete(lb["step_id"], lb["lease_generation"], "twice") == "ended"
    assert await engine.fail(lb["step_id"], lb["lease_generation"], "after", permanent=True) == "ended"
    assert await engine.snooze(lb["step_id"], lb["lease_generation"], 1) == "ended"
    assert await engine.complete(unknown, 1, None) == "unknown"
    assert await engine.apply_results([Result(str(old["step_id"]), 1, "completed"),
                                       Result(unknown, 1, "failed", message="x")]) == [
        (str(old["step_id"]), 1, "stale"), (unknown, 1, "unknown")]
    with pytest.raises(FailedPrecondition, match='node "a" is running'):
        await engine.retry(run_id, "a")
    with pytest.raises(FailedPrecondition, match="no discarded step"):
        await engine.retry(run_id)
    with pytest.raises(NotFound, match='node "zz"'):
        await engine.retry(run_id, "zz")
    assert await snapshot(conn) == before
    assert await engine.complete(new["step_id"], new["lease_generation"], "ok") == "applied"


async def test_apply_results_batches_outcomes_of_several_runs(engine: Engine, conn) -> None:
    runs = [(await engine.enqueue("k", options={"max_attempts": 3}))[0] for _ in range(3)]
    leases = {str(x["run_id"]): x for x in await engine.claim("w", ["k"], 10, 30)}
    outcomes = [Result(str(leases[runs[0]]["step_id"]), 1, "completed", output={"n": 0}),
                Result(str(leases[runs[1]]["step_id"]), 1, "failed", message="again"),
                Result(str(leases[runs[2]]["step_id"]), 1, "snoozed", delay=30)]
    statuses = [s for _, _, s in await engine.apply_results(outcomes)]
    assert statuses == ["applied", "retried", "snoozed"]
    rows = await fetch(conn, "SELECT run_id, state, attempt, snoozes FROM cyclone_steps")
    got = {str(r["run_id"]): (r["state"], r["attempt"], r["snoozes"]) for r in rows}
    assert got == {runs[0]: ("completed", 1, 0), runs[1]: ("available", 2, 0), runs[2]: ("available", 1, 1)}


async def test_output_over_the_limit_discards_the_step(db_url: str, conn) -> None:
    engine = await Engine.open(db_url, min_size=1, max_size=2, max_payload_bytes=100)
    try:
        run_id, _, _ = await engine.enqueue("k")
        lease = await claim_one(engine, "k")
        assert await engine.complete(lease["step_id"], 1, "x" * 200) == "output_too_large"
    finally:
        await engine.close()
    row = await step(conn, run_id, "k")
    assert (row["state"], row["error_kind"], row["reason"], row["output"]) == (
        "discarded", "permanent", "output_too_large", None)
