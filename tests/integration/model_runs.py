"""What the model of the lifecycle (model_lifecycle.py) holds: node definitions, and runs
and steps with the states and counters the document gives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REFUSED = "refused"  # FAILED_PRECONDITION
TERMINAL = frozenset({"completed", "discarded", "cancelled"})
# The state a node enters once all its deps completed (or at submit, with no deps).
ENTRY = {"task": "available", "sleep": "waiting_timer", "signal": "waiting_signal", "child": "waiting_child"}
# What Pause moves to paused.
PAUSABLE = frozenset({"available", "waiting_timer", "waiting_signal", "waiting_child"})


@dataclass(frozen=True)
class Node:
    """One node of a workflow definition."""

    id: str
    type: str = "task"  # task | sleep | signal | child
    deps: tuple[str, ...] = ()
    cancel_branch: bool = False  # OnDepFailure(CancelBranch)
    max_attempts: int = 3
    max_reclaims: int = 1
    signal: str | None = None  # a signal node's signal name
    child: tuple[Node, ...] = ()  # a child node's workflow


@dataclass
class Step:
    node: Node
    state: str
    attempt: int = 1
    reclaims: int = 0
    snoozes: int = 0
    generation: int = 0
    error_kind: str | None = None  # set on a discard only
    # Why it was cancelled and by which discarded node: Retry of that node reopens it.
    cancel_cause: str | None = None
    cancelled_by: str | None = None
    # Signal nodes: the order in which they take signals (the moment they started waiting,
    # then the node id). A moment is a transaction: one action of the model.
    wait_key: tuple[int, str] | None = None
    timer_due: bool = False  # a sleep node whose timer has run out
    lease_expired: bool = False
    output: Any = None
    child_run: str | None = None  # a child node's child run (the last one it started)


@dataclass
class Run:
    nodes: list[Node]
    state: str = "running"
    failed_by: str | None = None  # the discarded node whose uncontained discard failed the run
    steps: dict[str, Step] = field(default_factory=dict)  # in definition order
    mailbox: list[tuple[str, Any]] = field(default_factory=list)  # unconsumed (name, payload), oldest first
    parent: tuple[str, str] | None = None  # a child run's parent run and node

    def dependents(self, node: str) -> list[Step]:
        """Every step downstream of `node`, transitively, in definition order."""
        down: set[str] = set()
        frontier = {node}
        while frontier:
            frontier = {n.id for n in self.nodes if set(n.deps) & frontier} - down
            down |= frontier
        return [s for s in self.steps.values() if s.node.id in down]

    def deps_completed(self, step: Step) -> bool:
        return all(self.steps[d].state == "completed" for d in step.node.deps)
