"""Wait nodes through a real server and SDK workers: child runs, timers, signals, max_wait, deadlines, a crash.

Each test names the rows of the lifecycle document's transition table that it drives; the
pause and cancel rows of the same states are in test_pause_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import grpc
import pytest
from psycopg.rows import dict_row

from cyclone_server.store.engine import Engine
from cyclone_worker import CancelBranch, Client, Context, CycloneClientError, Permanent, Worker, Workflow

from waits_helpers import DEADLINE, ended, run_when, states


async def test_child_node_waits_for_its_child_run_and_completes_with_its_result(server: Any, client: Client) -> None:
    # pending -> waiting_child; waiting_child -> completed with the child run's result.
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("parent").task("prep").child("kid", "sub", deps=["prep"]).task("use", deps=["kid"]))
    go: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
    worker = Worker(server.address)

    @worker.handler("prep")
    async def prep(ctx: Context) -> dict[str, int]:
        await go["prep"].wait()
        return {"rows": ctx.input["n"]}

    @worker.handler("ct")
    async def ct(ctx: Context) -> dict[str, int]:
        await go["ct"].wait()
        return {"sum": ctx.input["parents"]["prep"]["rows"] * 2}

    @worker.handler("use")
    async def use(ctx: Context) -> Any:
        return ctx.parents["kid"]

    async with worker:
        run_id = await client.submit("parent", {"n": 21})
        run = await run_when(client, run_id, lambda r: r.step("prep").state == "running", "prep running")
        assert (run.step("kid").state, run.step("kid").child_run_id) == ("pending", "")
        go["prep"].set()
        run = await run_when(client, run_id, lambda r: r.step("kid").state == "waiting_child", "kid waiting")
        kid = run.step("kid")
        assert kid.lease_owner == "" and kid.attempt == 1  # no worker holds a waiting child node
        child = await run_when(client, kid.child_run_id, lambda r: r.step("ct").state == "running", "ct running")
        assert (child.workflow, child.state, child.parent_run_id, child.parent_step_id) == (
            "sub", "running", run_id, kid.id)
        assert child.input == {"input": {"n": 21}, "parents": {"prep": {"rows": 21}}}
        assert [r.id for r in await client.list(workflow="sub")] == [child.id]
        go["ct"].set()
        assert await client.result(run_id, timeout=DEADLINE) == {"use": {"ct": {"sum": 42}}}
    run, child = await client.get(run_id), await client.get(kid.child_run_id)
    assert (run.step("kid").state, run.step("kid").output) == ("completed", {"ct": {"sum": 42}})
    assert child.state == "completed" and child.result == {"ct": {"sum": 42}}
    assert run.step("kid").finished_at >= child.finished_at  # ended by a later transaction


async def test_child_failure_or_cancel_discards_the_node_and_a_retry_reuses_or_renews_the_child_run(
        server: Any, client: Client) -> None:
    # waiting_child -> discarded (child failed / cancelled); then OnDepFailure; then
    # discarded -> pending -> waiting_child by Retry, reusing a failed child run, renewing a cancelled one.
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("strict").child("kid", "sub").task("other"))
    await client.register(Workflow("lenient").child("kid", "sub").task("main")
                          .task("extra", deps=["kid"], on_dep_failure=CancelBranch))
    fixed = asyncio.Event()
    worker = Worker(server.address)

    @worker.handler("ct")
    async def ct(ctx: Context) -> str:
        mode = ctx.input["input"]["mode"]
        if not fixed.is_set() and mode == "fail":
            raise Permanent("bad batch")
        if not fixed.is_set() and mode == "hold":
            await asyncio.sleep(DEADLINE)  # until the test cancels the child run
        return f"{mode} fixed"

    for kind in ("other", "main", "extra"):
        worker.register(kind, lambda ctx: ctx.node)

    async with worker:
        failed = await client.submit("strict", {"mode": "fail"})
        held = await client.submit("lenient", {"mode": "fail"})
        cancelled = await client.submit("strict", {"mode": "hold"})
        run = await client.wait(failed, timeout=DEADLINE)
        assert run.state == "failed"
        assert ended(run.step("kid")) == ("discarded", "permanent", "child_failed")
        first_child = run.step("kid").child_run_id
        assert (await client.get(first_child)).state == "failed"
        run = await client.wait(held, timeout=DEADLINE)
        assert run.state == "completed" and run.result == {"main": "main", "extra": None}
        assert ended(run.step("kid")) == ("discarded", "permanent", "child_failed")
        assert (run.step("extra").state, run.step("extra").cancel_cause) == ("cancelled", "branch")

        kid = (await run_when(client, cancelled, lambda r: r.step("kid").child_run_id != "", "child run")).step("kid")
        await run_when(client, kid.child_run_id, lambda r: r.step("ct").state == "running", "ct running")
        await client.cancel(kid.child_run_id)
        run = await client.wait(cancelled, timeout=DEADLINE)
        assert run.state == "failed" and ended(run.step("kid")) == ("discarded", "permanent", "child_cancelled")

        fixed.set()
        for run_id in (failed, cancelled):  # discarded -> pending; the child scanner starts it again
            run = await client.retry(run_id, "kid")
            assert run.state == "running" and run.step("kid").state in ("pending", "waiting_child", "completed")
        assert await client.result(failed, timeout=DEADLINE) == {"kid": {"ct": "fail fixed"}, "other": "other"}
        assert (await client.get(failed)).step("kid").child_run_id == first_child  # the failed child run, reopened
        assert (await client.get(first_child)).state == "completed"
        assert await client.result(cancelled, timeout=DEADLINE) == {"kid": {"ct": "hold fixed"}, "other": "other"}
        assert (await client.get(cancelled)).step("kid").child_run_id not in ("", kid.child_run_id)  # a new one


async def test_three_nested_levels_complete_and_a_bottom_failure_fails_the_top_unless_contained(
        server: Any, client: Client) -> None:
    await client.register(Workflow("leaf").task("lt"))
    await client.register(Workflow("mid").child("mk", "leaf"))
    await client.register(Workflow("top").child("tk", "mid"))
    await client.register(Workflow("top_held").child("tk", "mid").task("main")
                          .task("after", deps=["tk"], on_dep_failure=CancelBranch))
    worker = Worker(server.address)

    @worker.handler("lt")
    async def lt(ctx: Context) -> Any:
        top_input = ctx.input["input"]["input"]  # leaf input <- mid input <- top input
        if top_input.get("fail"):
            raise Permanent("bottom failed")
        return top_input["v"]

    worker.register("main", lambda ctx: "main")
    async with worker:
        ok = await client.submit("top", {"v": 7})
        bad = await client.submit("top", {"fail": True})
        held = await client.submit("top_held", {"fail": True})
        assert await client.result(ok, timeout=DEADLINE) == {"tk": {"mk": {"lt": 7}}}
        chain = [await client.get(ok)]
        for node in ("tk", "mk"):
            chain.append(await client.get(chain[-1].step(node).child_run_id))
        assert [(r.workflow, r.state) for r in chain] == [("top", "completed"), ("mid", "completed"),
                                                         ("leaf", "completed")]
        assert [r.parent_run_id for r in chain] == ["", chain[0].id, chain[1].id]

        run = await client.wait(bad, timeout=DEADLINE)
        assert run.state == "failed" and ended(run.step("tk")) == ("discarded", "permanent", "child_failed")
        mid = await client.get(run.step("tk").child_run_id)
        assert mid.state == "failed" and ended(mid.step("mk")) == ("discarded", "permanent", "child_failed")
        assert (await client.get(mid.step("mk").child_run_id)).state == "failed"
        assert await client.result(held, timeout=DEADLINE) == {"main": "main", "after": None}


async def test_sleep_node_completes_with_fired_at_after_its_duration(server: Any, client: Client) -> None:
    # pending -> waiting_timer when the dep completes; waiting_timer -> completed when due.
    await client.register(Workflow("nap").task("a").sleep("nap", 1.5, deps=["a"]))
    worker = Worker(server.address)
    worker.register("a", lambda ctx: "a")
    async with worker:
        run_id = await client.submit("nap")
        run = await run_when(client, run_id, lambda r: r.step("nap").state == "waiting_timer", "nap waiting")
        fires = run.step("nap").scheduled_at  # a waiting timer shows when it fires
        assert abs((fires - run.step("a").finished_at).total_seconds() - 1.5) < 0.001
        assert (await client.result(run_id, timeout=DEADLINE)).keys() == {"nap"}
    run = await client.get(run_id)
    nap = run.step("nap")
    fired_at = datetime.fromisoformat(nap.output["fired_at"])
    assert nap.output == {"fired_at": nap.output["fired_at"]} and fired_at.tzinfo is not None
    assert 1.5 <= (fired_at - run.step("a").finished_at).total_seconds() < 1.5 + 10
    assert fired_at == nap.finished_at >= fires


async def test_signals_before_and_after_the_node_waits_and_the_first_waiter_wins(server: Any, client: Client) -> None:
    # pending -> waiting_signal; waiting_signal -> completed with the payload, oldest signal first.
    await client.register(Workflow("approve").task("gate").signal("pre", deps=["gate"])
                          .signal("after_gate", name="go", deps=["gate"]).signal("free", name="go"))
    go = asyncio.Event()
    worker = Worker(server.address)

    @worker.handler("gate")
    async def gate(ctx: Context) -> None:
        await go.wait()

    async with worker:
        run_id = await client.submit("approve")
        await client.signal(run_id, "pre", "early")  # no node waits for it yet: kept in the mailbox
        await client.signal(run_id, "unrelated", 1)
        run = await run_when(client, run_id, lambda r: r.step("gate").state == "running", "gate running")
        assert states(run) == {"gate": "running", "pre": "pending", "after_gate": "pending",
                               "free": "waiting_signal"}
        go.set()
        run = await run_when(client, run_id, lambda r: r.step("after_gate").state == "waiting_signal",
                             "after_gate waiting")
        assert (run.step("pre").state, run.step("pre").output) == ("completed", "early")
        # Both wait for "go": "free" started waiting first, though "after_gate" sorts first.
        await client.signal(run_id, "go", {"n": 1})
        assert states(await client.get(run_id))["after_gate"] == "waiting_signal"
        await client.signal(run_id, "go", {"n": 2})
        result = await client.result(run_id, timeout=DEADLINE)
    assert result == {"pre": "early", "after_gate": {"n": 2}, "free": {"n": 1}}
    with pytest.raises(CycloneClientError) as refused:
        await client.signal(run_id, "go", 3)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_max_wait_discards_each_kind_of_wait(server: Any, client: Client) -> None:
    # waiting_timer | waiting_signal | waiting_child -> discarded (max_wait); the child run is cancelled.
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("patience").sleep("nap", 600, max_wait=1).signal("sig", max_wait=1)
                          .child("kid", "sub", max_wait=1).task("main")
                          .task("after", deps=["nap", "sig", "kid"], on_dep_failure=CancelBranch))
    worker = Worker(server.address)
    worker.register("main", lambda ctx: "main")

    @worker.handler("ct")
    async def ct(ctx: Context) -> None:
        await asyncio.sleep(DEADLINE)  # the child run outlives its node's max_wait

    async with worker:
        run_id = await client.submit("patience")
        assert await client.result(run_id, timeout=DEADLINE) == {"main": "main", "after": None}  # contained
    run = await client.get(run_id)
    for node in ("nap", "sig", "kid"):
        step = run.step(node)
        assert ended(step) == ("discarded", "permanent", "max_wait")
        assert (step.finished_at - run.created_at).total_seconds() >= 1.0
    child = await client.get(run.step("kid").child_run_id)
    assert (child.state, child.step("ct").state, child.step("ct").cancel_cause) == ("cancelled", "cancelled", "parent")


async def test_deadline_fails_the_run_and_a_retry_needs_a_new_deadline(server: Any, client: Client) -> None:
    # waiting_* -> discarded (deadline), the rest cancelled, the child run cancelled; then
    # (run) failed -> running by RetryAll with a new deadline, and the run completes.
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("timed").signal("sig").sleep("nap", 3).child("kid", "sub").task("t"))
    retried = asyncio.Event()
    worker = Worker(server.address)

    async def first_holds(ctx: Context) -> str:
        if not retried.is_set():
            await asyncio.sleep(DEADLINE)  # until the deadline cancels it
        return ctx.kind

    worker.register("ct", first_holds)
    worker.register("t", first_holds)
    async with worker:
        run_id = await client.submit("timed", deadline=1.0)
        run = await client.wait(run_id, timeout=DEADLINE)
        assert run.state == "failed"
        for node in ("sig", "nap", "kid"):
            assert ended(run.step(node)) == ("discarded", "permanent", "deadline")
        assert (run.step("t").state, run.step("t").cancel_cause) == ("cancelled", "deadline")
        old_child = run.step("kid").child_run_id
        assert (await client.get(old_child)).state == "cancelled"
        for retry in (lambda: client.retry_all(run_id), lambda: client.retry(run_id, "sig")):
            with pytest.raises(CycloneClientError, match="deadline") as refused:
                await retry()
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION

        retried.set()
        run = await client.retry_all(run_id, deadline=DEADLINE)
        assert run.state == "running" and run.deadline is not None
        assert (run.deadline - datetime.now(timezone.utc)).total_seconds() > DEADLINE - 15
        assert states(run, "sig", "nap") == {"sig": "waiting_signal", "nap": "waiting_timer"}
        await client.signal(run_id, "sig", "ok")
        result = await client.result(run_id, timeout=DEADLINE)
    assert result["sig"] == "ok" and result["kid"] == {"ct": "ct"} and result["t"] == "t"
    # Its child run was cancelled by the deadline: the retried node started a new one.
    assert (await client.get(run_id)).step("kid").child_run_id not in ("", old_child)


async def test_a_crash_between_the_child_commit_and_the_parent_commit_is_healed_by_the_scanner(
        start_server: Any, db_url: str) -> None:
    srv = start_server(db_url)
    async with Client(srv.address) as client:
        await client.register(Workflow("sub").task("ct"))
        await client.register(Workflow("crashy").child("kid", "sub").task("after", deps=["kid"]))
        run_id = await client.submit("crashy")
        child = (await run_when(client, run_id, lambda r: r.step("kid").child_run_id != "", "child")).step("kid")
    # The server dies (SIGKILL); the child run's last step commits without it: nothing is
    # left to run the parent's transaction, as after a crash between the two commits.
    srv.kill()
    engine = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        lease = (await engine.claim("crash-test", ["ct"], 1, 30))[0]
        assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], "from-child") == "applied"
        async with engine.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT s.state, c.state AS child_state FROM cyclone_steps s "
                              "JOIN cyclone_runs c ON c.id = s.child_run_id WHERE s.id = %s", (child.id,))
            assert await cur.fetchone() == {"state": "waiting_child", "child_state": "completed"}
    finally:
        await engine.close()
    srv.restart()
    async with Client(srv.address) as client:
        worker = Worker(srv.address)
        worker.register("after", lambda ctx: ctx.parents["kid"])
        async with worker:
            assert await client.result(run_id, timeout=DEADLINE) == {"after": {"ct": "from-child"}}
        kid = (await client.get(run_id)).step("kid")
    assert (kid.state, kid.output, kid.child_run_id) == ("completed", {"ct": "from-child"}, child.child_run_id)
