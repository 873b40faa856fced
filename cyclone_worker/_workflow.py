"""The workflow builder: a named DAG of task, child, sleep and signal nodes, as the wire's Node messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cyclone_proto import limits_pb2, types_pb2, workflows_pb2
from ._limits import LimitUse, limit_request, limit_uses_proto
from .values import Seconds, seconds_of, to_duration

__all__ = ["Workflow", "CancelBranch", "FailRun", "OnDepFailure"]

# What a node does when a dependency is discarded (see the lifecycle document).
OnDepFailure = str
#: The discard fails the run (fail-fast); the default.
FailRun: OnDepFailure = "fail_run"
#: This node is cancelled and the run goes on, if every node downstream of the discard says so.
CancelBranch: OnDepFailure = "cancel_branch"

_ON_DEP_FAILURE = {
    FailRun: types_pb2.ON_DEP_FAILURE_FAIL_RUN,
    CancelBranch: types_pb2.ON_DEP_FAILURE_CANCEL_BRANCH,
}
_TYPES = {
    "task": types_pb2.NODE_TYPE_TASK,
    "child": types_pb2.NODE_TYPE_CHILD,
    "sleep": types_pb2.NODE_TYPE_SLEEP,
    "signal": types_pb2.NODE_TYPE_SIGNAL,
}
_DURATIONS = ("backoff_initial", "backoff_max", "attempt_timeout", "retention", "max_wait", "sleep")
_INTS = ("max_attempts", "priority", "max_reclaims")


@dataclass
class _Node:
    id: str
    type: str
    deps: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def to_proto(self) -> types_pb2.Node:
        node = types_pb2.Node(id=self.id, type=_TYPES[self.type], deps=list(self.deps))
        for name, value in self.options.items():
            if value is None:
                continue
            where = f'node "{self.id}": {name}'
            if name in _DURATIONS:
                getattr(node, name).CopyFrom(to_duration(value, where))
            elif name in _INTS:
                setattr(node, name, int(value))
            elif name == "limits":
                node.limits.extend(limit_uses_proto(value, where))
            elif name == "on_dep_failure":
                if value not in _ON_DEP_FAILURE:
                    raise ValueError(f"{where}: {value!r} is not CancelBranch or FailRun")
                node.on_dep_failure = _ON_DEP_FAILURE[value]
            else:  # kind, signal, workflow
                setattr(node, name, value)
        return node


class Workflow:
    """A workflow definition: a named DAG of nodes, built with chained calls.

    Durations are seconds (int or float) or timedeltas. Register it with
    `Client.register`, then start runs with `Client.submit`.

    Example::

        wf = (Workflow("etl")
              .task("extract")
              .task("transform", deps=["extract"], max_attempts=5, backoff_initial=2)
              .task("load", deps=["transform"], on_dep_failure=CancelBranch))
        await client.register(wf)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._nodes: dict[str, _Node] = {}
        self._run_limits: dict[str, limits_pb2.Limit] = {}

    @property
    def nodes(self) -> list[str]:
        """The node ids, in the order they were added."""
        return list(self._nodes)

    @property
    def kinds(self) -> list[str]:
        """The step kinds of the task nodes (what a worker for this workflow must handle)."""
        kinds = [n.options.get("kind") or n.id for n in self._nodes.values() if n.type == "task"]
        return list(dict.fromkeys(kinds))

    def _add(self, node_id: str, type_: str, deps: Iterable[str], **options: Any) -> Workflow:
        if not isinstance(node_id, str) or not node_id:
            raise ValueError(f"node id: {node_id!r} must be a non-empty string")
        if node_id in self._nodes:
            raise ValueError(f'node "{node_id}": duplicate node id in workflow "{self.name}"')
        if isinstance(deps, str):  # deps="a" would otherwise read as deps=("a",) one letter at a time
            deps = (deps,)
        for name in _DURATIONS:
            if options.get(name) is not None:
                seconds_of(options[name], f'node "{node_id}": {name}')
        uses = options.get("limits")
        if uses is not None:
            options["limits"] = uses if isinstance(uses, str | bytes | Mapping | LimitUse) else tuple(uses)
            limit_uses_proto(options["limits"], f'node "{node_id}": limits')  # a bad entry fails here
        self._nodes[node_id] = _Node(node_id, type_, tuple(deps), options)
        return self

    def task(self, id: str, *, kind: str | None = None, deps: Iterable[str] = (),
             max_attempts: int | None = None, backoff_initial: Seconds | None = None,
             backoff_max: Seconds | None = None, priority: int | None = None,
             max_reclaims: int | None = None, attempt_timeout: Seconds | None = None,
             on_dep_failure: OnDepFailure | None = None, retention: Seconds | None = None,
             limits: Iterable[LimitUse] | None = None) -> Workflow:
        """Add a task node, run by a worker that handles `kind` (default: the node id). Its steps
        consume `limits` (see `LimitUse`; the limits must exist when a run is submitted).

        Example::

            (Workflow("w").task("fetch", max_attempts=3, limits=[LimitUse("per-tenant", key_path="input.tenant")])
                          .task("parse", deps=["fetch"]))
        """
        return self._add(id, "task", deps, kind=kind, max_attempts=max_attempts,
                         backoff_initial=backoff_initial, backoff_max=backoff_max, priority=priority,
                         max_reclaims=max_reclaims, attempt_timeout=attempt_timeout,
                         on_dep_failure=on_dep_failure, retention=retention, limits=limits)

    def child(self, id: str, workflow: str | Workflow, *, deps: Iterable[str] = (),
              max_wait: Seconds | None = None, on_dep_failure: OnDepFailure | None = None,
              retention: Seconds | None = None) -> Workflow:
        """Add a child node: starts the registered `workflow` as a child run and completes
        with that run's result. The child run's input is
        ``{"input": <this run's input>, "parents": {<dep id>: <dep output>}}``.

        Example::

            Workflow("parent").task("prepare").child("sub", "etl", deps=["prepare"], max_wait=3600)
        """
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        return self._add(id, "child", deps, workflow=name, max_wait=max_wait,
                         on_dep_failure=on_dep_failure, retention=retention)

    def sleep(self, id: str, seconds: Seconds, *, deps: Iterable[str] = (), max_wait: Seconds | None = None,
              on_dep_failure: OnDepFailure | None = None, retention: Seconds | None = None) -> Workflow:
        """Add a durable timer: completes `seconds` after its deps complete, with output ``{"fired_at": ...}``.

        Example::

            Workflow("reminder").task("signup").sleep("wait-a-day", 86400, deps=["signup"])
        """
        return self._add(id, "sleep", deps, sleep=seconds, max_wait=max_wait,
                         on_dep_failure=on_dep_failure, retention=retention)

    def signal(self, id: str, *, name: str | None = None, deps: Iterable[str] = (),
               max_wait: Seconds | None = None, on_dep_failure: OnDepFailure | None = None,
               retention: Seconds | None = None) -> Workflow:
        """Add a signal node: waits for `Client.signal(run_id, name, payload)` (name defaults to
        the node id) and completes with the payload.

        Example::

            Workflow("order").task("reserve").signal("approval", deps=["reserve"], max_wait=600)
        """
        return self._add(id, "signal", deps, signal=name, max_wait=max_wait,
                         on_dep_failure=on_dep_failure, retention=retention)

    def limit_runs(self, limit: str, *, max_running: int | None = None, rate: int | None = None,
                   period: Seconds | None = None, strategy: str = "queue", key: str = "", key_path: str = "",
                   weights: Mapping[str, int] | None = None) -> Workflow:
        """Cap this workflow's runs with the limit named `limit`, of scope "runs": at most
        `max_running` active runs per key (a run holds its slot from its first claimed step until
        it ends) and at most `rate` run starts per key per `period` seconds. `Client.register`
        sets the limit (SetLimit, which needs the admin role) after registering the workflow,
        naming this workflow alone; a limit shared by several workflows is set with
        `Client.set_limit(..., scope="runs", workflows=[...])` instead.

        Example::

            wf = Workflow("ingest").task("pull").task("load", deps=["pull"])
            wf.limit_runs("ingest-per-account", max_running=1, key_path="input.account")
            await client.register(wf)
        """
        if limit in self._run_limits:
            raise ValueError(f'limit_runs: limit "{limit}" is declared twice in workflow "{self.name}"')
        self._run_limits[limit] = limit_request(limit, max_running=max_running, rate=rate, period=period,
                                                strategy=strategy, scope="runs", workflows=[self.name], key=key,
                                                key_path=key_path, weights=weights)
        return self

    @property
    def run_limits(self) -> list[limits_pb2.Limit]:
        """The limits `limit_runs` declared, as `Client.register` sets them."""
        return list(self._run_limits.values())

    def to_proto(self) -> workflows_pb2.RegisterWorkflowRequest:
        """The RegisterWorkflow request for this definition (the server validates the DAG).

        Example::

            request = Workflow("w").task("a").to_proto()
            assert request.nodes[0].id == "a"
        """
        return workflows_pb2.RegisterWorkflowRequest(
            name=self.name, nodes=[node.to_proto() for node in self._nodes.values()])

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, nodes={self.nodes})"
