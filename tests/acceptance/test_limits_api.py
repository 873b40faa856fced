"""The Limits service over a real port: set, get, list, delete; bad input is INVALID_ARGUMENT naming the
field and stores nothing; a step held by a limit says so in GetRun; a limit set on one server holds the
claims of another server on the same database at once."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from cyclone_proto import (limits_pb2, limits_pb2_grpc, runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2,
                          workflows_pb2_grpc)
from cyclone_server.store.engine import Engine

from waits_helpers import until


def tenants(max_running: int = 1, **kw) -> limits_pb2.Limit:
    return limits_pb2.Limit(name="tenants", max_running=max_running, kinds=["work"], key_path="input.tenant", **kw)


async def code_of(call) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


async def test_set_get_list_delete(server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        limits = limits_pb2_grpc.LimitsStub(ch)
        made = await limits.SetLimit(limits_pb2.SetLimitRequest(limit=tenants(
            3, rate=10, period=duration_pb2.Duration(seconds=60), weights={"acme": 2})))
        assert (made.name, made.max_running, made.rate, made.period.seconds) == ("tenants", 3, 10, 60)
        assert made.strategy == limits_pb2.LIMIT_STRATEGY_QUEUE and made.scope == limits_pb2.LIMIT_SCOPE_STEPS
        assert made.key_path == "input.tenant" and dict(made.weights) == {"acme": 2}
        assert made.HasField("created_at") and list(made.kinds) == ["work"]
        changed = await limits.SetLimit(limits_pb2.SetLimitRequest(limit=tenants(
            5, strategy=limits_pb2.LIMIT_STRATEGY_CANCEL_NEWEST)))
        assert changed.max_running == 5 and changed.rate == 0 and not changed.HasField("period")
        assert changed.strategy == limits_pb2.LIMIT_STRATEGY_CANCEL_NEWEST
        assert (await limits.GetLimit(limits_pb2.GetLimitRequest(name="tenants"))).max_running == 5
        assert [x.name for x in (await limits.ListLimits(limits_pb2.ListLimitsRequest())).limits] == ["tenants"]
        await limits.DeleteLimit(limits_pb2.DeleteLimitRequest(name="tenants"))
        assert (await code_of(limits.GetLimit(limits_pb2.GetLimitRequest(name="tenants"))))[0] == \
            grpc.StatusCode.NOT_FOUND
        assert (await code_of(limits.DeleteLimit(limits_pb2.DeleteLimitRequest(name="tenants"))))[0] == \
            grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("limit", "field"), [
    (limits_pb2.Limit(), "limit.name: '' is not a valid name"),
    (limits_pb2.Limit(name="x", max_running=-1), "limit.max_running: must be from 1"),
    (limits_pb2.Limit(name="x", rate=2_000_000, period=duration_pb2.Duration(seconds=1)), "limit.rate"),
    (limits_pb2.Limit(name="x", rate=5), "limit.period: a rate needs a period"),
    (limits_pb2.Limit(name="x", rate=5, period=duration_pb2.Duration(seconds=-1)), "limit.period"),
    (limits_pb2.Limit(name="x", strategy=limits_pb2.LIMIT_STRATEGY_CANCEL_OLDEST), "needs max_running"),
    (limits_pb2.Limit(name="x", strategy=99), "limit.strategy: 99 is not a known value"),
    (limits_pb2.Limit(name="x", key_path="input.a..b"), "limit.key_path"),
    (limits_pb2.Limit(name="x", weights={"a": 5000}), "limit.weights['a']"),
    (limits_pb2.Limit(name="x", key="a\x00b"), "limit.key: must be a string"),
])
async def test_a_bad_limit_is_invalid_argument_naming_the_field(server, limit, field: str) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        limits = limits_pb2_grpc.LimitsStub(ch)
        code, details = await code_of(limits.SetLimit(limits_pb2.SetLimitRequest(limit=limit)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, details
        assert list((await limits.ListLimits(limits_pb2.ListLimitsRequest())).limits) == []


async def test_held_steps_say_so_and_a_limit_holds_every_server(start_server, server, db_url: str) -> None:
    other = start_server(db_url)
    async with grpc.aio.insecure_channel(server.address) as ch, grpc.aio.insecure_channel(other.address) as ch2:
        await limits_pb2_grpc.LimitsStub(ch2).SetLimit(limits_pb2.SetLimitRequest(limit=tenants(1)))
        runs = runs_pb2_grpc.RunsStub(ch)
        ids = []
        for _ in range(2):
            req = runs_pb2.EnqueueRequest(kind="work")
            req.input.struct_value.update({"tenant": "acme"})
            ids.append((await runs.Enqueue(req)).run_id)
        bad = runs_pb2.EnqueueRequest(kind="work")
        bad.input.struct_value.update({"customer": "acme"})
        code, details = await code_of(runs.Enqueue(bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and 'key_path "input.tenant"' in details, details
        unknown = runs_pb2.EnqueueRequest(kind="other", limits=[limits_pb2.LimitUse(limit="nope")])
        code, details = await code_of(runs.Enqueue(unknown))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and 'unknown limit "nope"' in details, details
        both = runs_pb2.EnqueueRequest(kind="other", limits=[limits_pb2.LimitUse(limit="tenants", key="a",
                                                                                 key_path="input.t")])
        code, details = await code_of(runs.Enqueue(both))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "limits[0]: give key or key_path" in details, details

        # No worker yet: both wait. A claim by hand (a worker of the other server would do the same).
        engine = await Engine.open(db_url, min_size=1, max_size=2)
        try:
            leases = await engine.claim("w", ["work"], 5, 30)
            assert len(leases) == 1
            held_id = next(i for i in ids if i != str(leases[0]["run_id"]))
            run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=held_id))
            step = run.steps[0]
            assert step.state == types_pb2.STEP_STATE_AVAILABLE
            assert step.held_by == "limit tenants key acme: 1/1 running" and list(step.limits) == ["tenants=acme"]
            got = await limits_pb2_grpc.LimitsStub(ch).GetLimit(limits_pb2.GetLimitRequest(name="tenants"))
            assert [(k.key, k.running, k.waiting) for k in got.keys] == [("acme", 1, 1)]
            await engine.complete(str(leases[0]["step_id"]), leases[0]["lease_generation"], None)

            async def held_no_more() -> bool:
                r = await runs.GetRun(runs_pb2.GetRunRequest(run_id=held_id))
                return r.steps[0].held_by == ""
            await until(held_no_more, "the held step to be free", 10)
        finally:
            await engine.close()


async def test_a_workflow_node_declares_its_limits(server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        await limits_pb2_grpc.LimitsStub(ch).SetLimit(limits_pb2.SetLimitRequest(
            limit=limits_pb2.Limit(name="db", max_running=2)))
        node = types_pb2.Node(id="load", limits=[limits_pb2.LimitUse(limit="db", key_path="input.region")])
        registered = await workflows_pb2_grpc.WorkflowsStub(ch).RegisterWorkflow(
            workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=[node]))
        assert [(u.limit, u.key_path) for u in registered.workflow.nodes[0].limits] == [("db", "input.region")]
        bad = types_pb2.Node(id="s", type=types_pb2.NODE_TYPE_SLEEP, sleep=duration_pb2.Duration(seconds=1),
                             limits=[limits_pb2.LimitUse(limit="db")])
        code, details = await code_of(workflows_pb2_grpc.WorkflowsStub(ch).RegisterWorkflow(
            workflows_pb2.RegisterWorkflowRequest(name="bad", nodes=[bad])))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "only task nodes consume limits" in details
        runs = runs_pb2_grpc.RunsStub(ch)
        req = runs_pb2.SubmitRunRequest(workflow="etl")
        req.input.struct_value.update({"region": "eu"})
        run_id = (await runs.SubmitRun(req)).run_id
        run = await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
        assert list(run.steps[0].limits) == ["db=eu"]
        code, details = await code_of(runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow="etl")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and 'key_path "input.region"' in details, details
