"""Cancellation: fail-fast, CancelBranch containment on DAG shapes, and client.Cancel."""

from __future__ import annotations

import pytest
from engine_helpers import (claim_one, discard, finish, run_row, snapshot, start, states, step, steps, task,
                            violations)

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition, NotFound

pytestmark = pytest.mark.statemachine

CB = {"on_dep_failure": "cancel_branch"}


async def test_diamond_discard_fails_fast(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a"), task("c", "a"), task("d", "b", "c")])
    await finish(engine, "a")
    lc = await claim_one(engine, "c")
    await discard(engine, "b")
    s = await steps(conn, run_id)
    assert {n: r["state"] for n, r in s.items()} == {"a": "completed", "b": "discarded", "c": "cancelled",
                                                    "d": "cancelled"}
    for n in "cd":
        assert (s[n]["cancel_cause"], s[n]["cancelled_by"]) == ("fail_fast", s["b"]["id"])
        assert s[n]["finished_at"] == s["b"]["finished_at"]  # one transaction
    run = await run_row(conn, run_id)
    assert (run["state"], run["failed_by_step"], run["finished_at"]) == ("failed", s["b"]["id"], s["b"]["finished_at"])
    # The running step's late result is fenced out.
    assert await engine.complete(lc["step_id"], lc["lease_generation"], "late") == "ended"
    assert (await step(conn, run_id, "c"))["state"] == "cancelled"


async def test_diamond_contained_when_every_downstream_node_declares_cancel_branch(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a"), task("c", "a"), task("d", "b", "c", **CB)])
    await finish(engine, "a")
    lc = await claim_one(engine, "c")
    await discard(engine, "b")
    s = await steps(conn, run_id)
    assert (s["d"]["state"], s["d"]["cancel_cause"], s["d"]["cancelled_by"]) == ("cancelled", "branch", s["b"]["id"])
    assert s["c"]["state"] == "running" and s["c"]["lease_generation"] == lc["lease_generation"]
    assert (await run_row(conn, run_id))["state"] == "running"
    await engine.complete(lc["step_id"], lc["lease_generation"], "c-out")
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"], run["failed_by_step"]) == ("completed", {"d": None}, None)


async def test_fan_out_contained_discard_cancels_every_branch_and_completes(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a")] + [task(f"b{i}", "a", **CB) for i in range(4)])
    await discard(engine, "a")
    assert await states(conn, run_id) == {"a": "discarded", **{f"b{i}": "cancelled" for i in range(4)}}
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"]) == ("completed", {f"b{i}": None for i in range(4)})


async def test_fan_in_contains_one_branch_while_the_others_run(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a1"), task("a2"), task("a3"), task("z", "a1", "a2", "a3", **CB),
                                  task("solo")])
    l2, l3 = await claim_one(engine, "a2"), await claim_one(engine, "a3")
    await discard(engine, "a1")
    assert await states(conn, run_id) == {"a1": "discarded", "a2": "running", "a3": "running", "z": "cancelled",
                                         "solo": "available"}
    await engine.complete(l2["step_id"], 1, 2)
    await engine.complete(l3["step_id"], 1, 3)
    assert (await run_row(conn, run_id))["state"] == "running"  # "solo" remains
    await finish(engine, "solo", {"s": 1})
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"]) == ("completed", {"z": None, "solo": {"s": 1}})
    assert await violations(conn) == {}


async def test_discarded_leaf_is_never_contained(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("a"), task("b", "a", **CB), task("c")])
    await finish(engine, "a")
    await discard(engine, "b")
    assert await states(conn, run_id) == {"a": "completed", "b": "discarded", "c": "cancelled"}
    assert (await run_row(conn, run_id))["state"] == "failed"
    job, _, _ = await engine.enqueue("j")
    await discard(engine, "j")
    assert (await run_row(conn, job))["state"] == "failed"


@pytest.mark.parametrize("shape", ["chain", "sibling"])
async def test_one_fail_run_anywhere_downstream_means_fail_fast(engine: Engine, conn, shape: str) -> None:
    if shape == "chain":  # a -> b (CancelBranch) -> c (FailRun): c is downstream of a, transitively
        nodes = [task("a"), task("b", "a", **CB), task("c", "b"), task("x")]
    else:  # a -> b (CancelBranch), a -> c (FailRun)
        nodes = [task("a"), task("b", "a", **CB), task("c", "a"), task("x")]
    run_id = await start(engine, nodes)
    await discard(engine, "a")
    s = await steps(conn, run_id)
    assert {n: r["state"] for n, r in s.items()} == {"a": "discarded", "b": "cancelled", "c": "cancelled",
                                                    "x": "cancelled"}
    assert {s[n]["cancel_cause"] for n in "bcx"} == {"fail_fast"}
    assert (await run_row(conn, run_id))["state"] == "failed"


async def test_contained_discard_result_holds_leaf_outputs_and_nulls(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("x"), task("y", "x", **CB), task("y2", "y", **CB), task("z")])
    await discard(engine, "x")
    assert await states(conn, run_id) == {"x": "discarded", "y": "cancelled", "y2": "cancelled", "z": "available"}
    await finish(engine, "z", {"z": True})
    run = await run_row(conn, run_id)
    assert (run["state"], run["result"]) == ("completed", {"y2": None, "z": {"z": True}})


async def test_fail_fast_cancels_waits_and_child_runs(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("a"), task("sig", type="signal"), task("nap", type="sleep", sleep=3600),
                                  task("kid", type="child", workflow="sub")])
    s = await steps(conn, run_id)
    assert [s[n]["state"] for n in ("sig", "nap", "kid")] == ["waiting_signal", "waiting_timer", "waiting_child"]
    child = s["kid"]["child_run_id"]
    await discard(engine, "a")
    s = await steps(conn, run_id)
    assert {s[n]["state"] for n in ("sig", "nap", "kid")} == {"cancelled"}
    child_run = await run_row(conn, child)
    assert child_run["state"] == "cancelled"
    assert (await step(conn, child, "ct"))["cancel_cause"] == "parent"


async def test_cancel_moves_every_non_terminal_state_to_cancelled_at_once(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("ct")])
    run_id = await start(engine, [task("done"), task("run"), task("avail"), task("pend", "run"),
                                  task("sig", type="signal"), task("nap", type="sleep", sleep=3600),
                                  task("kid", type="child", workflow="sub")])
    await finish(engine, "done", 1)
    lease = await claim_one(engine, "run")
    child = (await step(conn, run_id, "kid"))["child_run_id"]
    await claim_one(engine, "ct")
    assert await engine.cancel_run(run_id) is True
    run = await run_row(conn, run_id)
    s = await steps(conn, run_id)
    assert run["state"] == "cancelled" and s["done"]["state"] == "completed"
    for n in ("run", "avail", "pend", "sig", "nap", "kid"):
        assert (s[n]["state"], s[n]["cancel_cause"], s[n]["finished_at"]) == ("cancelled", "operator",
                                                                                run["finished_at"])
    child_run = await run_row(conn, child)
    assert (child_run["state"], child_run["finished_at"]) == ("cancelled", run["finished_at"])  # one transaction
    assert await engine.complete(lease["step_id"], lease["lease_generation"], "late") == "ended"
    assert await engine.renew("w1", [(str(lease["step_id"]), 1)], 30) == [(str(lease["step_id"]), 1)]
    assert await violations(conn) == {}


async def test_cancel_of_a_paused_run_cancels_paused_pending_and_running_steps(engine: Engine, conn) -> None:
    run_id = await start(engine, [task("r"), task("a"), task("p", "a"), task("w", type="signal")])
    await claim_one(engine, "r")
    await engine.pause_run(run_id)
    assert await states(conn, run_id) == {"r": "running", "a": "paused", "p": "pending", "w": "paused"}
    assert await engine.cancel_run(run_id) is True
    assert set((await states(conn, run_id)).values()) == {"cancelled"}
    run = await run_row(conn, run_id)
    assert (run["state"], run["paused_at"]) == ("cancelled", None)


async def test_cancel_is_idempotent_and_refused_on_ended_runs(engine: Engine, conn) -> None:
    cancelled, _, _ = await engine.enqueue("a")
    await engine.cancel_run(cancelled)
    completed, _, _ = await engine.enqueue("b")
    await finish(engine, "b")
    failed, _, _ = await engine.enqueue("c")
    await discard(engine, "c")
    before = await snapshot(conn)
    assert await engine.cancel_run(cancelled) is False
    for run_id, state in ((completed, "completed"), (failed, "failed")):
        with pytest.raises(FailedPrecondition, match=f"is {state}"):
            await engine.cancel_run(run_id)
    with pytest.raises(NotFound):
        await engine.cancel_run("0190d8a4-0000-7000-8000-000000000000")
    assert await snapshot(conn) == before
