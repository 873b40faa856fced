"""Pause, Resume and Cancel of runs with waits, through a real server and SDK workers.

One test per sentence group of the lifecycle document's "Paused" and "Paused run"
sections, and the transition-table rows into and out of paused and cancelled for the
wait states. The wait rows themselves are in test_waits_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta
from typing import Any

from cyclone_worker import CancelBranch, Client, Context, Permanent, Worker, Workflow

from waits_helpers import DEADLINE, cancelled, ended, run_when, states, until

# How far the measured wait may run past its duration: sweep interval 0.2 s plus a loaded
# machine. Below the ~1.5 s the waits ran before the pause, so a wait that restarted from
# its full duration at Resume would fail the check as surely as one that ran on while paused.
TOLERANCE = 1.0


async def test_pause_during_each_kind_of_wait_keeps_the_time_left_and_holds_signals_until_resume(
        server: Any, client: Client) -> None:
    # waiting_timer | waiting_signal | waiting_child -> paused -> back; (run) running -> paused -> running.
    # Each wait outlasts the set-up and the 1.5 s before the pause by 2 s or more, so that
    # the pause comes before any of them ends, even on a loaded machine.
    durations = {"nap": 4.0, "sig": 4.5, "kid": 5.0}
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("pausable").sleep("nap", durations["nap"])
                          .signal("sig", max_wait=durations["sig"]).child("kid", "sub", max_wait=durations["kid"])
                          .signal("go").task("after", deps=["sig", "kid"], on_dep_failure=CancelBranch))
    stopped: list[str] = []
    worker = Worker(server.address)

    @worker.handler("ct")
    async def ct(ctx: Context) -> None:
        try:
            await asyncio.sleep(DEADLINE)  # the child run outlives its node's max_wait
        finally:
            stopped.append(ctx.run_id)

    async with worker:
        run_id = await client.submit("pausable", deadline=DEADLINE)
        child_id = (await run_when(client, run_id, lambda r: r.step("kid").child_run_id != "", "kid")).step(
            "kid").child_run_id
        await run_when(client, child_id, lambda r: r.step("ct").state == "running", "ct running")
        # Let the waits run about 1.5 s (WaitRun times out: the run is not terminal), then pause.
        assert not (await client.wait(run_id, timeout=1.5)).terminal
        paused = await client.pause(run_id)
        assert paused.state == "paused"
        assert states(paused) == {"nap": "paused", "sig": "paused", "kid": "paused", "go": "paused",
                                  "after": "pending"}
        await client.signal(run_id, "go", {"approved": True})  # kept in the mailbox
        # Paused longer than any wait had left: had the clocks run on, every wait would have
        # ended. A paused run is not terminal, so WaitRun waits out its timeout.
        run = await client.wait(run_id, timeout=3.5)
        assert run.state == "paused" and states(run) == states(paused)
        assert (await client.get(child_id)).state == "running"  # a pause does not pause the child runs

        resumed = await client.resume(run_id)
        pause = (resumed.updated_at - paused.updated_at).total_seconds()
        assert states(resumed, "nap", "sig", "kid") == {"nap": "waiting_timer", "sig": "waiting_signal",
                                                        "kid": "waiting_child"}
        go = resumed.step("go")  # the signal sent during the pause, received at Resume
        assert (go.state, go.output, go.finished_at) == ("completed", {"approved": True}, resumed.updated_at)
        # The clocks stopped for exactly the pause: the timer fires, and the deadline passes, that much later.
        fires = run.created_at + timedelta(seconds=durations["nap"] + pause)
        assert abs((resumed.step("nap").scheduled_at - fires).total_seconds()) < 0.001
        assert abs((resumed.deadline - paused.deadline).total_seconds() - pause) < 0.001
        result = await client.result(run_id, timeout=DEADLINE)
        await until(lambda: stopped == [child_id], "the child's handler told to stop")
    assert result == {"nap": result["nap"], "go": {"approved": True}, "after": None}
    run = await client.get(run_id)
    assert run.step("nap").state == "completed"
    assert ended(run.step("sig")) == ended(run.step("kid")) == ("discarded", "permanent", "max_wait")
    assert (await client.get(child_id)).state == "cancelled"
    for node, duration in durations.items():
        waited = (run.step(node).finished_at - run.created_at).total_seconds() - pause
        assert duration <= waited < duration + TOLERANCE, f"{node} waited {waited:.2f} s, not {duration} s"


async def test_a_step_running_at_the_pause_completes_or_fails_the_run_and_a_failed_attempt_waits_paused(
        server: Any, client: Client) -> None:
    # (run) paused -> completed; (run) paused -> failed, paused and pending steps cancelled;
    # running -> paused (a failed attempt in a paused run); paused -> available at Resume.
    await client.register(Workflow("finisher").task("solo"))
    await client.register(Workflow("breaker").task("boom").signal("sig").task("later", deps=["boom"]))
    await client.register(Workflow("flaky").task("wobble", backoff_initial=0.1).task("next", deps=["wobble"]))
    go: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
    worker = Worker(server.address)

    async def held(ctx: Context) -> str:
        await go[ctx.run_id].wait()
        if ctx.node == "boom":
            raise Permanent("broke during the pause")
        if ctx.node == "wobble" and ctx.attempt == 1:
            raise RuntimeError("flaky")
        return ctx.node

    for kind in ("solo", "boom", "wobble"):
        worker.register(kind, held)
    worker.register("next", lambda ctx: "next")
    async with worker:
        runs = {name: await client.submit(name) for name in ("finisher", "breaker", "flaky")}
        for name, node in (("finisher", "solo"), ("breaker", "boom"), ("flaky", "wobble")):
            await run_when(client, runs[name], lambda r, n=node: r.step(n).state == "running", f"{node} running")
            run = await client.pause(runs[name])
            step = run.step(node)  # it continues under its lease and attempt timeout
            assert (run.state, step.state, step.attempt) == ("paused", "running", 1) and step.lease_owner
            go[runs[name]].set()

        run = await client.wait(runs["finisher"], timeout=DEADLINE)  # no work remains: the run completes
        assert (run.state, run.result) == ("completed", {"solo": "solo"})
        run = await client.wait(runs["breaker"], timeout=DEADLINE)  # a pause does not hide a failure
        assert run.state == "failed" and ended(run.step("boom")) == ("discarded", "permanent", "")
        assert cancelled(run, "sig", "later") == {"sig": ("cancelled", "fail_fast"), "later": ("cancelled", "fail_fast")}

        run = await run_when(client, runs["flaky"], lambda r: r.step("wobble").state == "paused", "wobble paused")
        assert (run.state, run.step("wobble").attempt, run.step("wobble").lease_generation) == ("paused", 2, 1)
        assert (await client.resume(runs["flaky"])).step("wobble").state in ("available", "running")
        assert await client.result(runs["flaky"], timeout=DEADLINE) == {"next": "next"}


async def test_cancel_and_fail_fast_end_waiting_and_paused_steps_with_their_child_runs(
        server: Any, client: Client) -> None:
    # waiting_* -> cancelled (client.Cancel; fail-fast), the child run cancelled in the same
    # transaction; available and waiting_* -> paused; paused -> cancelled; (run) paused -> cancelled;
    # cancelled -> pending (Retry of the discard that cancelled a child node).
    await client.register(Workflow("sub").task("ct"))
    waits = ("nap", "sig", "kid", "idle")
    await client.register(Workflow("waiter").sleep("nap", 600).signal("sig").child("kid", "sub").task("idle"))
    await client.register(Workflow("doomed").sleep("nap", 600).signal("sig").child("kid", "sub").task("bad")
                          .task("then", deps=["bad"]))
    stopped: list[str] = []
    executions: list[str] = []
    bad_go = asyncio.Event()
    worker = Worker(server.address)  # nothing handles "idle": it stays available

    @worker.handler("ct")
    async def ct(ctx: Context) -> None:
        try:
            await asyncio.sleep(DEADLINE)
        finally:
            stopped.append(ctx.run_id)

    @worker.handler("bad")
    async def bad(ctx: Context) -> None:
        await bad_go.wait()
        executions.append(ctx.step_id)
        if len(executions) == 1:
            raise Permanent("bad input")

    worker.register("then", lambda ctx: "then")
    async with worker:
        ids = [await client.submit("waiter"), await client.submit("waiter"), await client.submit("doomed")]
        children = []
        for run_id in ids:
            kid = (await run_when(client, run_id, lambda r: r.step("kid").child_run_id != "", "kid")).step("kid")
            children.append(kid.child_run_id)
            await run_when(client, kid.child_run_id, lambda r: r.step("ct").state == "running", "ct running")
        running, paused, doomed = ids
        assert states(await client.get(running)) == {"nap": "waiting_timer", "sig": "waiting_signal",
                                                     "kid": "waiting_child", "idle": "available"}
        assert set(states(await client.pause(paused)).values()) == {"paused"}
        for run_id, child in zip((running, paused), children):
            run = await client.cancel(run_id)
            assert run.state == "cancelled" and cancelled(run, *waits) == {n: ("cancelled", "operator") for n in waits}
            assert (await client.get(child)).state == "cancelled"  # in the same transaction
        bad_go.set()
        run = await client.wait(doomed, timeout=DEADLINE)
        assert run.state == "failed" and ended(run.step("bad")) == ("discarded", "permanent", "")
        waits_then = ("nap", "sig", "kid", "then")
        assert cancelled(run, *waits_then) == {n: ("cancelled", "fail_fast") for n in waits_then}
        assert (await client.get(children[2])).state == "cancelled"
        await until(lambda: sorted(stopped) == sorted(children), "every child's handler told to stop")
        # Retry of the discard reopens what its fail-fast cancelled: cancelled -> pending -> waiting_*,
        # and the child node, whose child run was cancelled, starts a new one.
        run = await client.retry(doomed, "bad")
        assert states(run, "nap", "sig") == {"nap": "waiting_timer", "sig": "waiting_signal"}
        run = await run_when(client, doomed, lambda r: r.step("then").state == "completed"
                             and r.step("kid").child_run_id not in ("", children[2]), "then and a new child run")
        assert run.step("kid").state == "waiting_child"
        await client.cancel(doomed)


async def test_nothing_moves_during_the_pause_until_resume_promotes_and_settles(server: Any, client: Client) -> None:
    # A child run ends during the pause: its node stays paused until Resume. A step that ran
    # through the pause completes: its dependent stays pending, and Resume promotes it.
    await client.register(Workflow("sub").task("ct"))
    await client.register(Workflow("relay").child("kid", "sub").task("first").task("second", deps=["first"]))
    go: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
    worker = Worker(server.address)

    async def held(ctx: Context) -> str:
        await go[ctx.kind].wait()
        return ctx.kind

    for kind in ("ct", "first", "second"):
        worker.register(kind, held)
    go["second"].set()
    async with worker:
        run_id = await client.submit("relay")
        run = await run_when(client, run_id, lambda r: r.step("first").state == "running", "first running")
        child_id = run.step("kid").child_run_id
        await run_when(client, child_id, lambda r: r.step("ct").state == "running", "ct running")
        paused = await client.pause(run_id)
        assert states(paused) == {"kid": "paused", "first": "running", "second": "pending"}
        go["ct"].set()
        go["first"].set()
        assert (await client.wait(child_id, timeout=DEADLINE)).state == "completed"  # the child run is not paused
        await run_when(client, run_id, lambda r: r.step("first").state == "completed", "first completed")
        # Give a wrongly moving node the time to move (the server settles on the child's end at once).
        run = await client.wait(run_id, timeout=1.0)
        assert run.state == "paused" and states(run) == {"kid": "paused", "first": "completed", "second": "pending"}
        resumed = await client.resume(run_id)
        assert (resumed.step("kid").state, resumed.step("kid").output) == ("completed", {"ct": "ct"})
        assert resumed.step("second").state in ("available", "running", "completed")
        assert await client.result(run_id, timeout=DEADLINE) == {"kid": {"ct": "ct"}, "second": "second"}
