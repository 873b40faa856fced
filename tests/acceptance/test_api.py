"""Every RPC of Workflows, Runs and Admin, end to end against a real server subprocess.

Steps are driven through the engine on the test's database (no worker connects, so the
server's dispatcher leaves them to us).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cyclone_server.convert import py_to_value, to_timestamp, value_to_py
from cyclone_server.store.engine import Engine
from cyclone_proto import (admin_pb2, admin_pb2_grpc, runs_pb2, runs_pb2_grpc, types_pb2,
                                   workflows_pb2, workflows_pb2_grpc)

from waits_helpers import secs, until

S = types_pb2  # enum values: S.RUN_STATE_RUNNING, S.STEP_STATE_AVAILABLE, ...


async def register(wf: workflows_pb2_grpc.WorkflowsStub, name: str, *nodes: types_pb2.Node) -> types_pb2.Workflow:
    return (await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name=name, nodes=nodes))).workflow


async def submit(runs: runs_pb2_grpc.RunsStub, workflow: str, **kw: Any) -> str:
    return (await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow=workflow, **kw))).run_id


async def get(runs: runs_pb2_grpc.RunsStub, run_id: str) -> types_pb2.Run:
    return await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))


def steps(run: types_pb2.Run) -> dict[str, types_pb2.Step]:
    return {s.node: s for s in run.steps}


async def status_of(call: Awaitable[Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code()


async def finish(engine: Engine, kind: str, output: Any = None, *, fail: bool = False) -> None:
    """Claim the one available step of `kind` and complete (or permanently fail) it."""
    leases = await engine.claim("test-worker", [kind], 1, 60)
    assert len(leases) == 1, f"no available step of kind {kind}"
    sid, gen = str(leases[0]["step_id"]), leases[0]["lease_generation"]
    status = await (engine.fail(sid, gen, "boom", permanent=True) if fail else engine.complete(sid, gen, output))
    assert status == ("discarded" if fail else "applied")


async def test_register_same_definition_is_noop_and_change_is_new_version(wf: workflows_pb2_grpc.WorkflowsStub) -> None:
    nodes = [types_pb2.Node(id="a"), types_pb2.Node(id="b", deps=["a"])]
    r1 = await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=nodes))
    assert r1.created and r1.workflow.version == 1
    assert r1.workflow.nodes[1].kind == "b" and r1.workflow.nodes[1].max_attempts == 25
    again = await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=nodes))
    assert not again.created and again.workflow.version == 1
    # The defaults spelled out, as the server returns them, are the same definition.
    spelled = await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=r1.workflow.nodes))
    assert not spelled.created and spelled.workflow.version == 1
    changed = [types_pb2.Node(id="a", max_attempts=3), types_pb2.Node(id="b", deps=["a"])]
    r2 = await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=changed))
    assert r2.created and r2.workflow.version == 2
    await register(wf, "other", types_pb2.Node(id="x"))

    latest = await wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="etl"))
    assert latest.version == 2 and latest.nodes[0].max_attempts == 3
    v1 = await wf.GetWorkflow(workflows_pb2.GetWorkflowRequest(name="etl", version=1))
    assert v1.version == 1 and v1.nodes[0].max_attempts == 25 and v1.HasField("created_at")

    listed = await wf.ListWorkflows(workflows_pb2.ListWorkflowsRequest())
    assert [(w.name, w.version) for w in listed.workflows] == [("etl", 2), ("other", 1)]
    every = await wf.ListWorkflows(workflows_pb2.ListWorkflowsRequest(all_versions=True))
    assert [(w.name, w.version) for w in every.workflows] == [("etl", 1), ("etl", 2), ("other", 1)]
    prefixed = await wf.ListWorkflows(workflows_pb2.ListWorkflowsRequest(name_prefix="oth"))
    assert [w.name for w in prefixed.workflows] == ["other"]


async def test_submit_and_get_run_with_steps_in_definition_order(wf: workflows_pb2_grpc.WorkflowsStub,
                                                               runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "order", types_pb2.Node(id="z"), types_pb2.Node(id="a", deps=["z"]),
                   types_pb2.Node(id="m", deps=["z", "a"]), types_pb2.Node(id="b"))
    before = datetime.now(timezone.utc)
    resp = await runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="order", input=py_to_value({"x": 1}),
                                                          priority=3, deadline_in=secs(3600)))
    assert resp.created
    run = await get(runs, resp.run_id)
    assert run.id == resp.run_id and run.workflow == "order" and run.workflow_version == 1
    assert run.state == S.RUN_STATE_RUNNING and run.priority == 3
    assert value_to_py(run.input) == {"x": 1} and isinstance(value_to_py(run.input)["x"], int)
    assert not run.HasField("result") and not run.HasField("finished_at")
    deadline = run.deadline.ToDatetime(tzinfo=timezone.utc)
    assert before + timedelta(minutes=59) < deadline < before + timedelta(minutes=61)
    assert [s.node for s in run.steps] == ["z", "a", "m", "b"]
    st = steps(run)
    assert st["z"].state == S.STEP_STATE_AVAILABLE and st["b"].state == S.STEP_STATE_AVAILABLE
    assert st["a"].state == S.STEP_STATE_PENDING and sorted(st["m"].deps) == ["a", "z"]
    assert all(s.run_id == run.id and s.attempt == 1 and s.priority == 3 for s in run.steps)


async def test_idempotency_key_returns_same_run_or_already_exists(wf: workflows_pb2_grpc.WorkflowsStub,
                                                                 runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="a"))
    req = runs_pb2.SubmitRunRequest(workflow="w", input=py_to_value([1, 2]), idempotency_key="k1",
                                    deadline_in=secs(60))
    first, second = await runs.SubmitRun(req), await runs.SubmitRun(req)
    assert first.created and not second.created and first.run_id == second.run_id
    other = runs_pb2.SubmitRunRequest(workflow="w", input=py_to_value([1, 3]), idempotency_key="k1")
    assert await status_of(runs.SubmitRun(other)) == grpc.StatusCode.ALREADY_EXISTS
    # SubmitRun and Enqueue share one key namespace.
    assert await status_of(runs.Enqueue(runs_pb2.EnqueueRequest(kind="a", idempotency_key="k1"))) \
        == grpc.StatusCode.ALREADY_EXISTS
    job = runs_pb2.EnqueueRequest(kind="mail", input=py_to_value({"to": "x"}), idempotency_key="k2", max_attempts=2)
    j1, j2 = await runs.Enqueue(job), await runs.Enqueue(job)
    assert j1.created and not j2.created and (j1.run_id, j1.step_id) == (j2.run_id, j2.step_id)


async def test_enqueue_standalone_job(runs: runs_pb2_grpc.RunsStub) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    resp = await runs.Enqueue(runs_pb2.EnqueueRequest(kind="email", input=py_to_value({"to": "a@b"}), priority=-1,
                                                      max_attempts=4, backoff_initial=secs(2),
                                                      scheduled_at=to_timestamp(later)))
    run = await get(runs, resp.run_id)
    assert run.workflow == "" and run.workflow_version == 0 and run.state == S.RUN_STATE_RUNNING
    [step] = run.steps
    assert step.id == resp.step_id and step.node == "email" and step.kind == "email"
    assert step.state == S.STEP_STATE_AVAILABLE and step.max_attempts == 4 and step.priority == -1
    assert abs(step.scheduled_at.ToDatetime(tzinfo=timezone.utc) - later) < timedelta(seconds=1)


async def test_enqueue_many_starts_every_job_in_request_order(runs: runs_pb2_grpc.RunsStub) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    E = runs_pb2.EnqueueRequest
    jobs = [E(kind="email", input=py_to_value({"to": "a@b"}), priority=-1, max_attempts=4),
            E(kind="resize", input=py_to_value([1, 2]), scheduled_at=to_timestamp(later), deadline_in=secs(600)),
            E(kind="mail", idempotency_key="k9"),
            E(kind="mail", idempotency_key="k9")]
    resp = await runs.EnqueueMany(runs_pb2.EnqueueManyRequest(jobs=jobs))
    assert [j.created for j in resp.jobs] == [True, True, True, False]
    assert resp.jobs[2].run_id == resp.jobs[3].run_id and resp.jobs[2].step_id == resp.jobs[3].step_id
    for request, made in zip(jobs, resp.jobs):
        run = await get(runs, made.run_id)
        [step] = run.steps
        assert run.state == S.RUN_STATE_RUNNING and step.id == made.step_id and step.kind == request.kind
        assert value_to_py(run.input) == value_to_py(request.input) and step.priority == request.priority
    email, resize = (await get(runs, resp.jobs[0].run_id)).steps[0], await get(runs, resp.jobs[1].run_id)
    assert email.max_attempts == 4 and email.state == S.STEP_STATE_AVAILABLE
    assert abs(resize.steps[0].scheduled_at.ToDatetime(tzinfo=timezone.utc) - later) < timedelta(seconds=1)
    assert resize.HasField("deadline")
    # The same request as a single Enqueue finds the run the batch made.
    again = await runs.Enqueue(jobs[2])
    assert again.run_id == resp.jobs[2].run_id and not again.created


async def test_concurrent_enqueue_calls_each_get_their_own_job(runs: runs_pb2_grpc.RunsStub) -> None:
    # The server writes concurrent Enqueue calls together; each answer must still be its own.
    await runs.Enqueue(runs_pb2.EnqueueRequest(kind="mail", idempotency_key="taken"))
    requests = [runs_pb2.EnqueueRequest(kind="job", input=py_to_value({"n": i})) for i in range(120)]
    requests[5] = runs_pb2.EnqueueRequest(kind="mail", input=py_to_value(1), idempotency_key="taken")
    answers = await asyncio.gather(*(runs.Enqueue(r) for r in requests), return_exceptions=True)
    assert isinstance(answers[5], grpc.aio.AioRpcError)
    assert answers[5].code() == grpc.StatusCode.ALREADY_EXISTS and "jobs[" not in (answers[5].details() or "")
    for i, (request, answer) in enumerate(zip(requests, answers)):
        if i == 5:
            continue
        run = await get(runs, answer.run_id)
        assert answer.created and value_to_py(run.input) == {"n": i} and run.steps[0].id == answer.step_id


async def test_list_runs_filters_and_pages(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="a"))
    await register(wf, "v", types_pb2.Node(id="a"))
    ids = [await submit(runs, "w") for _ in range(5)]
    other = await submit(runs, "v")
    await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=ids[1]))

    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = await runs.ListRuns(runs_pb2.ListRunsRequest(workflow="w", limit=2, page_token=token))
        seen += [r.id for r in page.runs]
        assert all(not r.steps for r in page.runs)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == list(reversed(ids)) and pages == 3  # newest first, no duplicates
    cancelled = await runs.ListRuns(runs_pb2.ListRunsRequest(states=[S.RUN_STATE_CANCELLED]))
    assert [r.id for r in cancelled.runs] == [ids[1]]
    live = await runs.ListRuns(runs_pb2.ListRunsRequest(states=[S.RUN_STATE_RUNNING], include_steps=True))
    assert len(live.runs) == 5 and all(len(r.steps) == 1 for r in live.runs)
    first = await get(runs, ids[0])
    after = await runs.ListRuns(runs_pb2.ListRunsRequest(created_after=first.created_at, workflow="w"))
    assert len(after.runs) == 5
    before = await runs.ListRuns(runs_pb2.ListRunsRequest(created_before=first.created_at))
    assert before.runs == []
    assert other in [r.id for r in (await runs.ListRuns(runs_pb2.ListRunsRequest())).runs]
    page = await runs.ListRuns(runs_pb2.ListRunsRequest(workflow="w", limit=2))
    moved = runs_pb2.ListRunsRequest(workflow="v", limit=2, page_token=page.next_page_token)
    assert await status_of(runs.ListRuns(moved)) == grpc.StatusCode.INVALID_ARGUMENT


async def test_wait_run_returns_when_terminal_and_times_out(wf: workflows_pb2_grpc.WorkflowsStub,
                                                            runs: runs_pb2_grpc.RunsStub, engine: Engine) -> None:
    await register(wf, "w", types_pb2.Node(id="a"), types_pb2.Node(id="b", deps=["a"]))
    run_id = await submit(runs, "w")
    timed = await runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=secs(0.3)))
    assert timed.timed_out and timed.run.state == S.RUN_STATE_RUNNING and len(timed.run.steps) == 2
    now = await runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=secs(0)))
    assert now.timed_out

    waiting = asyncio.ensure_future(runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=secs(60))))
    await finish(engine, "a", {"n": 1})
    await finish(engine, "b", {"n": 2})
    done = await asyncio.wait_for(waiting, 30)
    assert not done.timed_out and done.run.state == S.RUN_STATE_COMPLETED
    assert value_to_py(done.run.result) == {"b": {"n": 2}}
    assert value_to_py(steps(done.run)["a"].output) == {"n": 1}
    # A failed run is terminal for WaitRun too.
    failing = await submit(runs, "w")
    waiting = asyncio.ensure_future(runs.WaitRun(runs_pb2.WaitRunRequest(run_id=failing)))
    await finish(engine, "a", fail=True)
    done = await asyncio.wait_for(waiting, 30)
    assert not done.timed_out and done.run.state == S.RUN_STATE_FAILED


async def test_cancel_pause_resume(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="a"), types_pb2.Node(id="b", deps=["a"]))
    run_id = await submit(runs, "w")
    paused = await runs.PauseRun(runs_pb2.PauseRunRequest(run_id=run_id))
    assert paused.applied and paused.run.state == S.RUN_STATE_PAUSED
    assert steps(paused.run)["a"].state == S.STEP_STATE_PAUSED
    again = await runs.PauseRun(runs_pb2.PauseRunRequest(run_id=run_id))
    assert not again.applied and again.run.state == S.RUN_STATE_PAUSED
    resumed = await runs.ResumeRun(runs_pb2.ResumeRunRequest(run_id=run_id))
    assert resumed.applied and resumed.run.state == S.RUN_STATE_RUNNING
    assert steps(resumed.run)["a"].state == S.STEP_STATE_AVAILABLE
    assert await status_of(runs.ResumeRun(runs_pb2.ResumeRunRequest(run_id=run_id))) \
        == grpc.StatusCode.FAILED_PRECONDITION

    cancelled = await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id))
    assert cancelled.applied and cancelled.run.state == S.RUN_STATE_CANCELLED
    assert cancelled.run.HasField("finished_at")
    assert all(s.state == S.STEP_STATE_CANCELLED and s.cancel_cause == "operator" for s in cancelled.run.steps)
    noop = await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=run_id))
    assert not noop.applied and noop.run.state == S.RUN_STATE_CANCELLED
    for call in (runs.PauseRun(runs_pb2.PauseRunRequest(run_id=run_id)),
                 runs.ResumeRun(runs_pb2.ResumeRunRequest(run_id=run_id)),
                 runs.RetryAll(runs_pb2.RetryAllRequest(run_id=run_id))):
        assert await status_of(call) == grpc.StatusCode.FAILED_PRECONDITION


async def test_retry_step_and_retry_all(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub,
                                        engine: Engine) -> None:
    await register(wf, "w", types_pb2.Node(id="a", max_attempts=1), types_pb2.Node(id="b", deps=["a"]))
    run_id = await submit(runs, "w")
    await finish(engine, "a", fail=True)
    run = await get(runs, run_id)
    assert run.state == S.RUN_STATE_FAILED and steps(run)["a"].state == S.STEP_STATE_DISCARDED
    assert steps(run)["a"].error_kind == "permanent" and steps(run)["a"].errors[-1].message == "boom"
    assert steps(run)["b"].state == S.STEP_STATE_CANCELLED and steps(run)["b"].cancel_cause == "fail_fast"
    assert await status_of(runs.RetryStep(runs_pb2.RetryStepRequest(run_id=run_id, node="b"))) \
        == grpc.StatusCode.FAILED_PRECONDITION

    retried = await runs.RetryStep(runs_pb2.RetryStepRequest(run_id=run_id, node="a"))
    assert retried.applied and retried.run.state == S.RUN_STATE_RUNNING
    a, b = steps(retried.run)["a"], steps(retried.run)["b"]
    assert a.state == S.STEP_STATE_AVAILABLE and a.attempt == 1 and len(a.errors) == 1
    assert b.state == S.STEP_STATE_PENDING

    await finish(engine, "a", fail=True)
    assert (await get(runs, run_id)).state == S.RUN_STATE_FAILED
    all_ = await runs.RetryAll(runs_pb2.RetryAllRequest(run_id=run_id))
    assert all_.applied and all_.run.state == S.RUN_STATE_RUNNING
    await finish(engine, "a", 1)
    await finish(engine, "b", 2)
    assert (await get(runs, run_id)).state == S.RUN_STATE_COMPLETED
    assert await status_of(runs.RetryAll(runs_pb2.RetryAllRequest(run_id=run_id))) \
        == grpc.StatusCode.FAILED_PRECONDITION


async def test_retry_after_deadline_needs_a_new_deadline(wf: workflows_pb2_grpc.WorkflowsStub,
                                                          runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="go", type=S.NODE_TYPE_SIGNAL))
    run_id = await submit(runs, "w", deadline_in=secs(0.5))

    async def failed() -> bool:
        return (await get(runs, run_id)).state == S.RUN_STATE_FAILED
    await until(failed, "the run failed by its deadline", 30)
    go = steps(await get(runs, run_id))["go"]
    assert go.state == S.STEP_STATE_DISCARDED and go.reason == "deadline"
    assert await status_of(runs.RetryStep(runs_pb2.RetryStepRequest(run_id=run_id, node="go"))) \
        == grpc.StatusCode.FAILED_PRECONDITION
    retried = await runs.RetryStep(runs_pb2.RetryStepRequest(run_id=run_id, node="go", deadline_in=secs(3600)))
    assert retried.applied and retried.run.state == S.RUN_STATE_RUNNING
    assert steps(retried.run)["go"].state == S.STEP_STATE_WAITING_SIGNAL
    assert retried.run.deadline.ToDatetime(tzinfo=timezone.utc) > datetime.now(timezone.utc) + timedelta(minutes=59)


async def test_signal_consumed_at_once_or_kept_in_mailbox(wf: workflows_pb2_grpc.WorkflowsStub,
                                                         runs: runs_pb2_grpc.RunsStub, engine: Engine) -> None:
    await register(wf, "w", types_pb2.Node(id="go", type=S.NODE_TYPE_SIGNAL, signal="approve"))
    run_id = await submit(runs, "w")
    sent = await runs.Signal(runs_pb2.SignalRequest(run_id=run_id, name="approve", payload=py_to_value({"ok": True})))
    run = await get(runs, run_id)
    assert sent.signal_id and sent.consumed_by_step_id == steps(run)["go"].id
    assert run.state == S.RUN_STATE_COMPLETED and value_to_py(run.result) == {"go": {"ok": True}}
    assert await status_of(runs.Signal(runs_pb2.SignalRequest(run_id=run_id, name="approve"))) \
        == grpc.StatusCode.FAILED_PRECONDITION

    await register(wf, "later", types_pb2.Node(id="a"), types_pb2.Node(id="go", type=S.NODE_TYPE_SIGNAL, deps=["a"]))
    run_id = await submit(runs, "later")
    early = await runs.Signal(runs_pb2.SignalRequest(run_id=run_id, name="go", payload=py_to_value(7)))
    assert early.signal_id and early.consumed_by_step_id == ""
    await finish(engine, "a")
    run = await get(runs, run_id)
    assert run.state == S.RUN_STATE_COMPLETED and value_to_py(steps(run)["go"].output) == 7


async def test_purge_terminal_runs(wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="a"))
    done, live = await submit(runs, "w"), await submit(runs, "w")
    await runs.CancelRun(runs_pb2.CancelRunRequest(run_id=done))
    kept = await runs.PurgeTerminalRuns(runs_pb2.PurgeTerminalRunsRequest(older_than=secs(3600)))
    assert kept.deleted == 0
    purged = await runs.PurgeTerminalRuns(runs_pb2.PurgeTerminalRunsRequest(older_than=secs(0)))
    assert purged.deleted == 1
    assert await status_of(get(runs, done)) == grpc.StatusCode.NOT_FOUND
    assert (await get(runs, live)).state == S.RUN_STATE_RUNNING


async def test_get_stats_per_kind(channel: grpc.aio.Channel, runs: runs_pb2_grpc.RunsStub, engine: Engine) -> None:
    admin = admin_pb2_grpc.AdminStub(channel)
    assert list((await admin.GetStats(admin_pb2.GetStatsRequest())).kinds) == []
    for kind in ("email", "email", "sms"):
        await runs.Enqueue(runs_pb2.EnqueueRequest(kind=kind))
    await engine.claim("test-worker", ["email"], 1, 60)
    stats = await admin.GetStats(admin_pb2.GetStatsRequest())
    assert [(k.kind, k.available, k.running) for k in stats.kinds] == [("email", 1, 1), ("sms", 1, 0)]
    assert stats.kinds[1].oldest_available_age.ToTimedelta() >= timedelta(0)


async def test_health_reports_serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "cyclone.v1.Runs", "cyclone.v1.Workers"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_sigterm_answers_waiters_exits_0_and_restart_keeps_the_port(
        server: Any, wf: workflows_pb2_grpc.WorkflowsStub, runs: runs_pb2_grpc.RunsStub) -> None:
    await register(wf, "w", types_pb2.Node(id="a"))
    run_id = await submit(runs, "w")
    waiting = asyncio.ensure_future(runs.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id, timeout=secs(600))))
    await asyncio.sleep(0.5)  # let the call reach the server: it must not hold the shutdown for 600 s
    code = await asyncio.to_thread(server.terminate)
    assert code == 0
    assert "cyclone-server stopped" in server.log_text()
    answered = await asyncio.wait_for(waiting, 30)
    assert answered.timed_out and answered.run.state == S.RUN_STATE_RUNNING
    address = server.address
    await asyncio.to_thread(server.restart)
    assert server.address == address
    async with grpc.aio.insecure_channel(server.address) as ch:
        again = await runs_pb2_grpc.RunsStub(ch).GetRun(runs_pb2.GetRunRequest(run_id=run_id))
    assert again.state == S.RUN_STATE_RUNNING
