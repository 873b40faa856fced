"""Unit tests of the workflow builder: nodes, options, durations and the RegisterWorkflow request."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cyclone_worker import CancelBranch, FailRun, Workflow
from cyclone_proto import types_pb2


def test_builder_produces_nodes_in_order_with_deps_and_types() -> None:
    wf = (Workflow("etl")
          .task("extract")
          .task("transform", deps=["extract"], kind="xform")
          .sleep("cool-off", 30, deps=["transform"])
          .signal("approval", deps=["cool-off"], name="approve", max_wait=timedelta(hours=1))
          .child("publish", "publisher", deps=["approval"], max_wait=600))
    req = wf.to_proto()
    assert req.name == "etl"
    assert [n.id for n in req.nodes] == ["extract", "transform", "cool-off", "approval", "publish"]
    types = [n.type for n in req.nodes]
    assert types == [types_pb2.NODE_TYPE_TASK, types_pb2.NODE_TYPE_TASK, types_pb2.NODE_TYPE_SLEEP,
                     types_pb2.NODE_TYPE_SIGNAL, types_pb2.NODE_TYPE_CHILD]
    extract, transform, cool, approval, publish = req.nodes
    assert list(transform.deps) == ["extract"] and transform.kind == "xform"
    assert extract.kind == ""  # the server fills in the default (the node id)
    assert cool.sleep.seconds == 30
    assert approval.signal == "approve" and approval.max_wait.seconds == 3600
    assert publish.workflow == "publisher" and publish.max_wait.seconds == 600
    assert wf.nodes == ["extract", "transform", "cool-off", "approval", "publish"]
    assert wf.kinds == ["extract", "xform"]


def test_task_options_map_to_their_fields_and_unset_stays_unset() -> None:
    node = Workflow("w").task(
        "a", max_attempts=3, backoff_initial=0.25, backoff_max=timedelta(seconds=90), priority=-2,
        max_reclaims=0, attempt_timeout=12.5, on_dep_failure=CancelBranch, retention=timedelta(days=7),
    ).to_proto().nodes[0]
    assert node.max_attempts == 3 and node.priority == -2
    assert node.HasField("max_reclaims") and node.max_reclaims == 0  # zero is a value, not "unset"
    assert node.backoff_initial.ToTimedelta() == timedelta(milliseconds=250)
    assert node.backoff_max.seconds == 90
    assert node.attempt_timeout.ToTimedelta() == timedelta(seconds=12.5)
    assert node.retention.seconds == 7 * 86400
    assert node.on_dep_failure == types_pb2.ON_DEP_FAILURE_CANCEL_BRANCH

    bare = Workflow("w").task("b").to_proto().nodes[0]
    for field in ("max_attempts", "priority", "max_reclaims", "backoff_initial", "attempt_timeout", "retention"):
        assert not bare.HasField(field), field
    assert bare.on_dep_failure == types_pb2.ON_DEP_FAILURE_UNSPECIFIED


def test_on_dep_failure_constants() -> None:
    wf = Workflow("w").task("a").task("b", deps=["a"], on_dep_failure=FailRun)
    assert wf.to_proto().nodes[1].on_dep_failure == types_pb2.ON_DEP_FAILURE_FAIL_RUN
    with pytest.raises(ValueError, match='node "c": on_dep_failure'):
        Workflow("w").task("c", on_dep_failure="ignore").to_proto()


def test_a_single_string_dep_is_one_dep() -> None:
    node = Workflow("w").task("a").task("b", deps="a").to_proto().nodes[1]
    assert list(node.deps) == ["a"]


def test_child_accepts_a_workflow_object() -> None:
    sub = Workflow("sub").task("x")
    assert Workflow("w").child("c", sub).to_proto().nodes[0].workflow == "sub"


def test_duplicate_ids_and_bad_durations_are_refused_at_once() -> None:
    wf = Workflow("w").task("a")
    with pytest.raises(ValueError, match='node "a": duplicate node id'):
        wf.task("a")
    with pytest.raises(ValueError, match='node "s": sleep'):
        Workflow("w").sleep("s", -1)
    with pytest.raises(TypeError, match='node "t": attempt_timeout'):
        Workflow("w").task("t", attempt_timeout="10s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node id"):
        Workflow("w").task("")
