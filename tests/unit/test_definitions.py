"""Workflow validation: every error names the node and the problem; every option gets its default."""

from __future__ import annotations

import grpc
import pytest

from cyclone_server.definitions import normalize_job, normalize_nodes, validate_kind, validate_name
from cyclone_server.errors import InvalidArgument


def invalid(nodes: object, *fragments: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        normalize_nodes(nodes)  # type: ignore[arg-type]
    assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT
    for fragment in fragments:
        assert fragment in err.value.message, err.value.message


def test_defaults_are_filled_in_for_every_option() -> None:
    assert normalize_nodes([{"id": "a"}]) == [{
        "id": "a", "kind": "a", "type": "task", "deps": [], "max_attempts": 25, "backoff_initial": 1.0,
        "backoff_max": 600.0, "priority": None, "max_reclaims": 5, "attempt_timeout": 600.0,
        "on_dep_failure": "fail_run", "retention": None, "max_wait": None, "sleep": None, "signal": None,
        "workflow": None}]


def test_given_options_are_kept_and_durations_become_floats() -> None:
    [a, b] = normalize_nodes([
        {"id": "a", "kind": "etl.extract", "max_attempts": 3, "backoff_initial": 2, "backoff_max": 20,
         "priority": -1, "max_reclaims": 0, "attempt_timeout": 30, "retention": 0},
        {"id": "b", "deps": ["a"], "on_dep_failure": "cancel_branch"}])
    assert (a["kind"], a["max_attempts"], a["backoff_initial"], a["backoff_max"], a["priority"]) == (
        "etl.extract", 3, 2.0, 20.0, -1)
    assert (a["max_reclaims"], a["attempt_timeout"], a["retention"]) == (0, 30.0, 0.0)
    assert isinstance(a["backoff_initial"], float)
    assert (b["deps"], b["on_dep_failure"]) == (["a"], "cancel_branch")


def test_wait_nodes() -> None:
    sleep, sig, kid = normalize_nodes([
        {"id": "nap", "type": "sleep", "sleep": 5, "max_wait": 10},
        {"id": "go", "type": "signal"},
        {"id": "kid", "type": "child", "workflow": "sub"}])
    assert (sleep["sleep"], sleep["max_wait"]) == (5.0, 10.0)
    assert sig["signal"] == "go"  # a signal node waits for its own id by default
    assert kid["workflow"] == "sub"


@pytest.mark.parametrize("bad_id", ["", "a b", "é", "x" * 129, None, 7, "a/b"])
def test_malformed_node_id(bad_id: object) -> None:
    invalid([{"id": bad_id}], "nodes[0]: id:", "not a valid node id")


def test_duplicate_ids_name_both_nodes() -> None:
    invalid([{"id": "a"}, {"id": "b"}, {"id": "a"}], 'nodes[2] (id "a")', "duplicate node id", "nodes[0]")


def test_unknown_dep() -> None:
    invalid([{"id": "a"}, {"id": "b", "deps": ["a", "zz"]}], 'nodes[1] (id "b")', 'unknown node "zz"')


def test_self_dependency_and_repeated_dep() -> None:
    invalid([{"id": "a", "deps": ["a"]}], 'nodes[0] (id "a")', "depend on itself")
    invalid([{"id": "a"}, {"id": "b", "deps": ["a", "a"]}], 'nodes[1] (id "b")', "listed twice")


@pytest.mark.parametrize("deps", ["ab", {"a": 1}, 5, [1]])
def test_deps_must_be_a_list_of_ids(deps: object) -> None:
    invalid([{"id": "a"}, {"id": "b"}, {"id": "c", "deps": deps}], 'nodes[2] (id "c")', "deps:")


def test_cycle_names_a_node_and_the_path() -> None:
    invalid([{"id": "a", "deps": ["c"]}, {"id": "b", "deps": ["a"]}, {"id": "c", "deps": ["b"]}],
            "cycle", "a", "b", "c", "deps:")
    invalid([{"id": "x"}, {"id": "p", "deps": ["q"]}, {"id": "q", "deps": ["p"]}], "cycle", "p -> q")


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_attempts", 0, "max_attempts: must be an integer from 1"),
    ("max_attempts", 2.5, "max_attempts: must be an integer"),
    ("max_attempts", True, "max_attempts: must be an integer"),
    ("max_reclaims", -1, "max_reclaims: must be an integer from 0"),
    ("backoff_initial", 0, "backoff_initial: must be a positive number"),
    ("backoff_initial", float("nan"), "backoff_initial: must be a positive number"),
    ("attempt_timeout", float("inf"), "attempt_timeout: must be a positive number"),
    ("attempt_timeout", 1e300, "attempt_timeout: must be at most"),
    ("attempt_timeout", "10s", "attempt_timeout: must be a positive number"),
    ("retention", -1, "retention: must be a non-negative number"),
    ("priority", 2**40, "priority: must be a 32-bit integer"),
    ("on_dep_failure", "ignore", "on_dep_failure: 'ignore' is not one of"),
    ("kind", "bad kind", "kind:"),
    ("type", "cron", "type: 'cron' is not one of"),
    ("colour", "red", "unknown option(s) colour"),
    ("max_wait", 10, "max_wait: only wait nodes"),
    ("sleep", 10, "sleep: only a sleep node"),
    ("signal", "go", "signal: only a signal node"),
    ("workflow", "sub", "workflow: only a child node"),
])
def test_bad_options_name_the_node_and_the_option(option: str, value: object, message: str) -> None:
    invalid([{"id": "ok"}, {"id": "n1", option: value}], 'nodes[1] (id "n1")', message)


def test_backoff_max_below_initial() -> None:
    invalid([{"id": "a", "backoff_initial": 10, "backoff_max": 5}], "backoff_max: must be at least backoff_initial")


def test_type_specific_requirements() -> None:
    invalid([{"id": "s", "type": "sleep"}], 'nodes[0] (id "s")', "sleep: a sleep node needs a duration")
    invalid([{"id": "c", "type": "child"}], "workflow: a child node names the workflow")
    invalid([{"id": "c", "type": "child", "workflow": "no way"}], "workflow:", "not a valid name")
    invalid([{"id": "g", "type": "signal", "signal": "bad name"}], "signal:", "not a valid name")


@pytest.mark.parametrize("nodes", [[], None, "a", {"id": "a"}, ["a"]])
def test_the_node_list_itself(nodes: object) -> None:
    invalid(nodes, "nodes")


def test_too_many_nodes() -> None:
    invalid([{"id": f"n{i}"} for i in range(10_001)], "more than the limit of 10000")


def test_job_node_is_named_after_its_kind() -> None:
    assert normalize_job("email.send", {"max_attempts": 3})["id"] == "email.send"
    job = normalize_job("queue:email/send", {})
    assert (job["id"], job["kind"], job["type"]) == ("job", "queue:email/send", "task")
    with pytest.raises(InvalidArgument, match="kind:"):
        normalize_job("", {})


def test_names_and_kinds() -> None:
    assert validate_name("etl.daily-v2") == "etl.daily-v2"
    with pytest.raises(InvalidArgument, match="workflow: 'a b' is not a valid name"):
        validate_name("a b", "workflow")
    assert validate_kind("ns:kind/x") == "ns:kind/x"
    with pytest.raises(InvalidArgument, match="kind"):
        validate_kind("x" * 201)
