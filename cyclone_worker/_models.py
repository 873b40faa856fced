"""Plain dataclasses for what the client reads (runs, steps, workflows, stats), built from the wire messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.protobuf.message import Message

from cyclone_proto import admin_pb2, types_pb2
from .values import from_duration, from_timestamp, from_value

__all__ = ["Run", "Step", "StepError", "KindStats", "WorkerInfo", "WorkflowInfo", "TERMINAL_RUN_STATES"]

#: Run states after which WaitRun returns (a failed run may still be reopened by a retry).
TERMINAL_RUN_STATES = frozenset({"completed", "failed", "cancelled"})


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """'STEP_STATE_WAITING_CHILD' -> 'waiting_child': the document's own words."""
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:  # a state added by a newer server
        return f"unknown_{value}"


def _time(msg: Message, name: str) -> datetime | None:
    return from_timestamp(getattr(msg, name)) if msg.HasField(name) else None


def _value(msg: Message, name: str) -> Any:
    return from_value(getattr(msg, name)) if msg.HasField(name) else None


@dataclass
class StepError:
    """One entry of a step's error history (oldest first in `Step.errors`).

    Example::

        for err in run.step("charge").errors:
            print(err.attempt, err.error_kind, err.message)
    """

    attempt: int
    error_kind: str
    message: str
    at: datetime | None
    reason: str = ""
    details: str = ""  # Failed.details of the attempt, e.g. the handler's traceback


@dataclass
class Step:
    """One node of one run. `state` is the document's word: 'pending', 'available', 'running',
    'completed', 'discarded', 'cancelled', 'waiting_signal', 'waiting_timer', 'waiting_child', 'paused'.

    Example::

        step = run.step("fetch")
        if step.state == "discarded":
            print(step.error_kind, step.errors[-1].message)
    """

    id: str
    run_id: str
    node: str
    kind: str
    type: str
    state: str
    attempt: int
    max_attempts: int
    reclaims: int
    max_reclaims: int
    snoozes: int
    priority: int
    lease_generation: int
    lease_owner: str = ""
    output: Any = None
    error_kind: str = ""
    reason: str = ""
    cancel_cause: str = ""
    child_run_id: str = ""
    # An available step that a limit holds back: which limit and key, and why
    # ("limit per-tenant key acme: 2/2 running"); "" otherwise.
    held_by: str = ""
    # The limits the step consumes, as "<limit>=<key>" (docs/flow-control.md).
    limits: list[str] = field(default_factory=list)
    deps: list[str] = field(default_factory=list)
    errors: list[StepError] = field(default_factory=list)
    scheduled_at: datetime | None = None
    lease_expiry: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt_deadline: datetime | None = None

    @classmethod
    def from_proto(cls, s: types_pb2.Step) -> Step:
        return cls(
            id=s.id, run_id=s.run_id, node=s.node, kind=s.kind,
            type=enum_name(types_pb2.NodeType, s.type, "NODE_TYPE_"),
            state=enum_name(types_pb2.StepState, s.state, "STEP_STATE_"),
            attempt=s.attempt, max_attempts=s.max_attempts, reclaims=s.reclaims,
            max_reclaims=s.max_reclaims, snoozes=s.snoozes, priority=s.priority,
            lease_generation=s.lease_generation, lease_owner=s.lease_owner, output=_value(s, "output"),
            error_kind=s.error_kind, reason=s.reason, cancel_cause=s.cancel_cause,
            child_run_id=s.child_run_id, held_by=s.held_by, limits=list(s.limits), deps=list(s.deps),
            errors=[StepError(e.attempt, e.error_kind, e.message, _time(e, "at"), e.reason, e.details)
                    for e in s.errors],
            scheduled_at=_time(s, "scheduled_at"), lease_expiry=_time(s, "lease_expiry"),
            created_at=_time(s, "created_at"), started_at=_time(s, "started_at"),
            finished_at=_time(s, "finished_at"), attempt_deadline=_time(s, "attempt_deadline"))


@dataclass
class Run:
    """A run with its steps. `state` is 'running', 'paused', 'completed', 'failed' or 'cancelled';
    `result` (set when completed) holds the outputs of the leaf nodes by node id.

    Example::

        run = await client.get(run_id)
        print(run.state, {s.node: s.state for s in run.steps})
    """

    id: str
    workflow: str
    workflow_version: int
    state: str
    input: Any = None
    result: Any = None
    priority: int = 0
    idempotency_key: str = ""
    parent_run_id: str = ""
    parent_step_id: str = ""
    deadline: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    steps: list[Step] = field(default_factory=list)
    # Set for a run a schedule started: its name and the fire time.
    schedule_name: str = ""
    schedule_fire_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        """True when completed, failed or cancelled."""
        return self.state in TERMINAL_RUN_STATES

    def step(self, node: str) -> Step:
        """The step of node `node` (KeyError if the run has none)."""
        for s in self.steps:
            if s.node == node:
                return s
        raise KeyError(f"run {self.id} has no node {node!r} (nodes: {[s.node for s in self.steps]})")

    @classmethod
    def from_proto(cls, r: types_pb2.Run) -> Run:
        return cls(
            id=r.id, workflow=r.workflow, workflow_version=r.workflow_version,
            state=enum_name(types_pb2.RunState, r.state, "RUN_STATE_"),
            input=_value(r, "input"), result=_value(r, "result"), priority=r.priority,
            idempotency_key=r.idempotency_key, parent_run_id=r.parent_run_id,
            parent_step_id=r.parent_step_id, deadline=_time(r, "deadline"),
            created_at=_time(r, "created_at"), updated_at=_time(r, "updated_at"),
            finished_at=_time(r, "finished_at"), steps=[Step.from_proto(s) for s in r.steps],
            schedule_name=r.schedule_name, schedule_fire_at=_time(r, "schedule_fire_at"))


@dataclass
class WorkflowInfo:
    """A stored workflow version; `nodes` are dicts with every default filled in
    (durations in seconds; `type` and `on_dep_failure` as words; `limits` a list of
    {"limit", "key", "key_path"}).

    Example::

        info = await client.get_workflow("etl")
        print(info.version, [n["id"] for n in info.nodes])
    """

    name: str
    version: int
    nodes: list[dict[str, Any]]
    created_at: datetime | None = None
    created: bool = False  # set by Client.register: this call stored a new version

    @classmethod
    def from_proto(cls, w: Any, created: bool = False) -> WorkflowInfo:
        return cls(name=w.name, version=w.version, nodes=[_node_dict(n) for n in w.nodes],
                   created_at=_time(w, "created_at"), created=created)


def _node_dict(n: types_pb2.Node) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": n.id, "kind": n.kind, "type": enum_name(types_pb2.NodeType, n.type, "NODE_TYPE_"),
        "deps": list(n.deps),
        "on_dep_failure": enum_name(types_pb2.OnDepFailure, n.on_dep_failure, "ON_DEP_FAILURE_"),
    }
    for name in ("max_attempts", "priority", "max_reclaims"):
        d[name] = getattr(n, name) if n.HasField(name) else None
    for name in ("backoff_initial", "backoff_max", "attempt_timeout", "retention", "max_wait", "sleep"):
        d[name] = from_duration(getattr(n, name)) if n.HasField(name) else None
    d["signal"] = n.signal or None
    d["workflow"] = n.workflow or None
    d["limits"] = [{"limit": u.limit, "key": u.key, "key_path": u.key_path} for u in n.limits]
    return d


@dataclass
class KindStats:
    """Backlog of one step kind (`Client.stats`): `available` (claimable now), `running`,
    `scheduled` (waiting for a later scheduled_at: a backoff, a snooze, a scheduled job) and
    `oldest_available_age` in seconds; `workers` and `free_slots` of the connected workers
    that run it, `no_workers` when steps wait for a kind no connected worker runs.

    Example::

        for k in await client.stats():
            print(k.kind, k.available, k.scheduled, k.running, k.oldest_available_age)
    """

    kind: str
    available: int
    running: int
    oldest_available_age: float
    scheduled: int = 0
    workers: int = 0  # connected workers that run this kind
    free_slots: int = 0  # their free slots
    no_workers: bool = False  # steps wait to be claimed and no connected worker runs the kind

    @classmethod
    def from_proto(cls, k: admin_pb2.KindStats) -> KindStats:
        return cls(k.kind, k.available, k.running, from_duration(k.oldest_available_age), k.scheduled,
                   k.workers, k.free_slots, k.no_workers)


@dataclass
class WorkerInfo:
    """A worker connected to any server of the database (`Client.workers`): its id, SDK,
    kinds, slots, the leases it held at its last heartbeat, its server, when it connected
    and when its server last refreshed it.

    Example::

        for w in await client.workers("send_email"):
            print(w.worker_id, w.server_id, w.leases_held, "/", w.slots)
    """

    worker_id: str
    sdk: str
    kinds: list[str]
    slots: int
    leases_held: int
    server_id: str
    connected_since: datetime | None
    last_heartbeat: datetime | None

    @classmethod
    def from_proto(cls, w: admin_pb2.WorkerInfo) -> WorkerInfo:
        return cls(w.worker_id, w.sdk, list(w.kinds), w.slots, w.leases_held, w.server_id,
                   _time(w, "connected_since"), _time(w, "last_heartbeat"))
