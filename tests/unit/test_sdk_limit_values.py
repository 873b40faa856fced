"""Unit tests of the SDK's flow-control declarations: LimitUse on nodes and jobs, the workflow's
limits of runs, the SetLimit request built from keyword arguments, and the Limit read back."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cyclone_proto import limits_pb2, types_pb2
from cyclone_worker import Job, Limit, LimitUse, Step, Workflow, WorkflowInfo
from cyclone_worker._limits import limit_request


def test_a_node_carries_its_limit_uses_in_order() -> None:
    wf = Workflow("sync").task("pull", limits=[LimitUse("per-tenant", key_path="input.tenant"),
                                               LimitUse("api", key="global"), LimitUse("db")])
    node = wf.to_proto().nodes[0]
    assert [(u.limit, u.key, u.key_path) for u in node.limits] == [
        ("per-tenant", "", "input.tenant"), ("api", "global", ""), ("db", "", "")]
    assert not Workflow("w").task("a").to_proto().nodes[0].limits


def test_a_generator_of_uses_is_read_once_and_kept() -> None:
    wf = Workflow("w").task("a", limits=(LimitUse(name) for name in ("x", "y")))
    assert [u.limit for u in wf.to_proto().nodes[0].limits] == ["x", "y"]
    assert [u.limit for u in wf.to_proto().nodes[0].limits] == ["x", "y"]


def test_bad_uses_are_refused_at_once_naming_the_node() -> None:
    with pytest.raises(TypeError, match=r'node "a": limits\[1\]: expected a cyclone_worker.LimitUse, got str'):
        Workflow("w").task("a", limits=[LimitUse("x"), "y"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r'node "a": limits: expected a list of LimitUse'):
        Workflow("w").task("a", limits=LimitUse("x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="give key or key_path, not both"):
        LimitUse("x", key="a", key_path="input.t")
    with pytest.raises(ValueError, match="limit: '' must be a limit's name"):
        LimitUse("")


def test_a_job_carries_its_limit_uses_and_a_bad_one_is_named_by_index() -> None:
    req = Job("email", {"tenant": "acme"}, limits=[LimitUse("smtp", key_path="tenant")]).to_proto()
    assert [(u.limit, u.key_path) for u in req.limits] == [("smtp", "tenant")]
    assert not Job("email").to_proto().limits
    with pytest.raises(TypeError, match=r"^jobs\[3\]\.limits\[0\]: expected a cyclone_worker.LimitUse"):
        Job("email", limits=[{"limit": "smtp"}]).to_proto("jobs[3]")  # type: ignore[list-item]


def test_set_limit_arguments_become_the_limit_message() -> None:
    m = limit_request("api", max_running=5, rate=100, period=timedelta(minutes=1), strategy="cancel_oldest",
                      kinds=["call"], key_path="input.tenant", weights={"gold": 3})
    assert (m.name, m.max_running, m.rate, m.period.seconds) == ("api", 5, 100, 60)
    assert m.strategy == limits_pb2.LIMIT_STRATEGY_CANCEL_OLDEST and m.scope == limits_pb2.LIMIT_SCOPE_STEPS
    assert list(m.kinds) == ["call"] and m.key_path == "input.tenant" and dict(m.weights) == {"gold": 3}
    bare = limit_request("fair")
    assert (bare.max_running, bare.rate, bare.HasField("period")) == (0, 0, False)
    with pytest.raises(ValueError, match="strategy: 'lifo' is not one of queue, cancel_newest"):
        limit_request("x", strategy="lifo")
    with pytest.raises(ValueError, match="scope: 'tenants' is not one of steps, runs"):
        limit_request("x", scope="tenants")
    with pytest.raises(TypeError, match="kinds: expected a list of names, got the string 'call'"):
        limit_request("x", kinds="call")  # type: ignore[arg-type]


def test_a_workflow_declares_limits_of_its_runs_naming_itself() -> None:
    wf = Workflow("ingest").task("pull").limit_runs("per-account", max_running=1, key_path="input.account")
    [m] = wf.run_limits
    assert (m.name, m.scope, list(m.workflows), m.max_running) == ("per-account", limits_pb2.LIMIT_SCOPE_RUNS,
                                                                   ["ingest"], 1)
    with pytest.raises(ValueError, match='limit "per-account" is declared twice in workflow "ingest"'):
        wf.limit_runs("per-account", max_running=2)
    assert Workflow("w").task("a").run_limits == []


def test_a_limit_reads_back_with_words_and_its_keys() -> None:
    msg = limits_pb2.Limit(name="t", max_running=2, strategy=limits_pb2.LIMIT_STRATEGY_QUEUE,
                           scope=limits_pb2.LIMIT_SCOPE_STEPS, kinds=["k"], key_path="input.tenant",
                           weights={"gold": 4})
    msg.keys.add(key="acme", running=2, waiting=3, starts_in_window=0).oldest_waiting_age.FromMilliseconds(1500)
    limit = Limit.from_proto(msg)
    assert (limit.max_running, limit.rate, limit.period, limit.strategy, limit.scope) == (2, None, None, "queue",
                                                                                          "steps")
    assert limit.key_stats("acme") is not None and limit.key_stats("acme").oldest_waiting_age == 1.5
    assert (limit.key_stats("acme").running, limit.key_stats("acme").waiting) == (2, 3)
    assert limit.key_stats("other") is None and limit.weights == {"gold": 4}


def test_a_step_shows_what_holds_it_and_a_node_its_limits() -> None:
    step = Step.from_proto(types_pb2.Step(id="s", run_id="r", node="n", state=types_pb2.STEP_STATE_AVAILABLE,
                                          held_by="limit t key acme: 2/2 running", limits=["t=acme"]))
    assert (step.state, step.held_by, step.limits) == ("available", "limit t key acme: 2/2 running", ["t=acme"])
    node = types_pb2.Node(id="a", kind="a", type=types_pb2.NODE_TYPE_TASK,
                          limits=[limits_pb2.LimitUse(limit="t", key_path="input.tenant")])
    info = WorkflowInfo.from_proto(types_pb2.Workflow(name="w", version=1, nodes=[node]))
    assert info.nodes[0]["limits"] == [{"limit": "t", "key": "", "key_path": "input.tenant"}]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_running": 1.5}, TypeError, r"max_running: expected an integer, got 1.5"),
    ({"max_running": True}, TypeError, r"max_running: expected an integer, got True"),
    ({"max_running": 1 << 40}, ValueError, r"max_running: 1099511627776 is out of range"),
    ({"rate": 1 << 31, "period": 1}, ValueError, r"rate: 2147483648 is out of range"),
    ({"weights": {"a": 2.5}}, TypeError, r"weights\['a'\]: expected an integer"),
])
def test_numbers_the_message_cannot_carry_are_refused_naming_the_argument(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        limit_request("x", **kwargs)
