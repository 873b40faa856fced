"""A pure-Python model of the lifecycle in docs/lifecycle.md, with its choices where the lifecycle is open.

It is a second statement of the document, written from it rather than from the SQL, and
test_model.py checks the engine against it after every action. It covers task, sleep,
signal and child nodes, fail-fast and CancelBranch containment, attempts and reclaims,
snoozes, pause and resume, Cancel, Retry / RetryAll, the signal mailbox, timers and child
runs. Time is left out: the test makes every backoff and snooze due before a claim, and a
timer or lease expires only when it says so. The child scanners (a child node whose child
run ended; a retried child node that starts waiting again) are `settle_children`, which
the test runs on both sides after every action.

Each action returns what the engine must answer: a result status ('applied', 'retried',
'discarded', 'snoozed', 'stale', 'ended'), True / False for a run action that changed
something or found the run already so, or REFUSED where the state forbids the action.
"""

from __future__ import annotations

import itertools
from typing import Any

from model_runs import ENTRY, PAUSABLE, REFUSED, TERMINAL, Node, Run, Step

__all__ = ["Model"]


class Model:
    """The runs of one test, by run id, and every transition of the document over them.
    A child run's id is made here: "<parent run id>/<node>/<n>"."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self._moments = itertools.count(1)
        self.now = 0

    def _tick(self) -> None:
        """A new transaction: what happens in it shares one moment (Postgres's now())."""
        self.now = next(self._moments)

    # -- the shared rules ----------------------------------------------------------------

    def _enter(self, run: Run, step: Step) -> None:
        """pending -> the node's entry state: available, or a wait."""
        step.state = ENTRY[step.node.type]
        step.timer_due = False
        if step.node.type == "signal":
            step.wait_key = (self.now, step.node.id)
            self._deliver(run)  # a signal already in the mailbox is taken at once
        elif step.node.type == "child":
            self._attach(run, step)

    def _attach(self, run: Run, step: Step) -> None:
        """A child node starts waiting: it starts its child run in the same transaction, or,
        retried, reuses the one it has (docs/lifecycle.md, "Reopened child runs"): a completed one gives its result (the
        child scanner ends the node), a failed one reopens, a cancelled one is replaced."""
        child = self.runs.get(step.child_run or "")
        if child is not None and child.state != "cancelled":
            if child.state == "failed":
                self._reopen(child, {n for n, s in child.steps.items() if s.state == "discarded"})
            return
        run_id = next(k for k, r in self.runs.items() if r is run)
        key = f"{run_id}/{step.node.id}/{sum(1 for r in self.runs.values() if r.parent == (run_id, step.node.id))}"
        self._begin(key, list(step.node.child), parent=(run_id, step.node.id))
        step.child_run = key

    def _promote(self, run: Run, *, children: bool = True) -> None:
        """Each pending step whose deps all completed becomes claimable (or starts waiting).
        A paused run starts no new work: Resume promotes. Retry leaves its child nodes to
        the child scanner (children=False)."""
        if run.state != "running":
            return
        ready = [s for s in run.steps.values() if s.state == "pending" and run.deps_completed(s)
                 and (children or s.node.type != "child")]
        for s in ready:
            if s.state == "pending":
                self._enter(run, s)

    def _settle(self, run: Run) -> None:
        """The run completes when no non-terminal step remains (a pause never holds a
        finished run)."""
        if run.state in ("running", "paused") and all(s.state in TERMINAL for s in run.steps.values()):
            run.state = "completed"

    def _complete(self, run: Run, step: Step, output: Any) -> None:
        step.state, step.output = "completed", output
        self._promote(run)
        self._settle(run)

    def _cancel(self, steps: list[Step], cause: str, by: str | None) -> None:
        """Cancellation affects only non-terminal steps. A cancelled child node cancels its
        active child run in the same transaction."""
        for s in steps:
            if s.state not in TERMINAL:
                s.state, s.cancel_cause, s.cancelled_by = "cancelled", cause, by
                child = self.runs.get(s.child_run or "")
                if child is not None and child.state in ("running", "paused"):
                    self._cancel(list(child.steps.values()), "parent", None)
                    child.state = "cancelled"

    def _discard(self, run: Run, step: Step, error_kind: str) -> None:
        """Discard, then fail-fast unless every node downstream declared CancelBranch (a node
        with no dependents is never contained)."""
        step.state, step.error_kind = "discarded", error_kind
        down = run.dependents(step.node.id)
        if down and all(s.node.cancel_branch for s in down):
            self._cancel(down, "branch", step.node.id)
            self._settle(run)
            return
        self._cancel(list(run.steps.values()), "fail_fast", step.node.id)
        run.state, run.failed_by = "failed", step.node.id

    def _deliver(self, run: Run) -> None:
        """The signal node that started waiting first takes the oldest signal of its name
        (docs/lifecycle.md, "Signals"); each signal is consumed once. Not in a paused run."""
        while run.state == "running":
            names = [name for name, _ in run.mailbox]
            waiting = [s for s in run.steps.values() if s.state == "waiting_signal" and s.node.signal in names]
            if not waiting:
                return
            step = min(waiting, key=lambda s: s.wait_key or (0, ""))
            i = names.index(step.node.signal)
            _, payload = run.mailbox.pop(i)
            self._complete(run, step, payload)

    def _back_from_running(self, run: Run, step: Step) -> None:
        """running -> available, or -> available -> paused in a paused run (one transaction)."""
        step.state = "paused" if run.state == "paused" else "available"

    # -- runs begin ----------------------------------------------------------------------

    def submit(self, run_id: str, nodes: list[Node]) -> None:
        self._tick()
        self._begin(run_id, nodes)

    def _begin(self, run_id: str, nodes: list[Node], parent: tuple[str, str] | None = None) -> None:
        """A run begins in state running; a step with no deps starts in its entry state."""
        run = self.runs[run_id] = Run(nodes, parent=parent)
        for n in nodes:
            run.steps[n.id] = Step(n, "pending")
        for s in run.steps.values():
            if not s.node.deps:
                self._enter(run, s)

    # -- leases --------------------------------------------------------------------------

    def claim(self, run_id: str, node: str) -> int | None:
        """available -> running with a new lease generation; the attempt does not change."""
        self._tick()
        step = self.runs[run_id].steps[node]
        if step.state != "available":
            return None
        step.state = "running"
        step.generation += 1
        return step.generation

    def _fenced(self, step: Step, generation: int) -> str | None:
        """The refusal of a result for a lease that no longer holds the step, else None."""
        if step.state == "running" and step.generation == generation:
            return None
        return "stale" if step.generation != generation else "ended"

    def complete(self, run_id: str, node: str, generation: int, output: Any) -> str:
        self._tick()
        run = self.runs[run_id]
        step = run.steps[node]
        refusal = self._fenced(step, generation)
        if refusal:
            return refusal
        self._complete(run, step, output)
        return "applied"

    def fail(self, run_id: str, node: str, generation: int, permanent: bool) -> str:
        """Permanent, or attempt == max_attempts: discarded (attempt unchanged). Otherwise the
        attempt count grows and the step goes back to available."""
        self._tick()
        run = self.runs[run_id]
        step = run.steps[node]
        refusal = self._fenced(step, generation)
        if refusal:
            return refusal
        if permanent or step.attempt >= step.node.max_attempts:
            self._discard(run, step, "permanent" if permanent else "max_attempts")
            return "discarded"
        step.attempt += 1
        self._back_from_running(run, step)
        return "retried"

    def snooze(self, run_id: str, node: str, generation: int) -> str:
        """Back to available, attempt unchanged, counted apart."""
        self._tick()
        run = self.runs[run_id]
        step = run.steps[node]
        refusal = self._fenced(step, generation)
        if refusal:
            return refusal
        step.snoozes += 1
        self._back_from_running(run, step)
        return "snoozed"

    def expire_lease(self, run_id: str, node: str) -> None:
        self.runs[run_id].steps[node].lease_expired = True

    def timer_due(self, run_id: str, node: str) -> None:
        self.runs[run_id].steps[node].timer_due = True

    def sweep(self) -> None:
        """The recovery sweep, then the timers: an expired lease is reclaimed (same attempt,
        reclaims + 1), or dead-lettered after max_reclaims reclaims; a due timer completes
        its node. Neither wait completes in a paused run."""
        self._tick()
        for run in list(self.runs.values()):
            for step in run.steps.values():
                if step.state == "running" and step.lease_expired:
                    step.lease_expired = False
                    if step.reclaims >= step.node.max_reclaims:
                        self._discard(run, step, "reclaim_limit")
                    else:
                        step.reclaims += 1
                        self._back_from_running(run, step)
        self._tick()
        for run in list(self.runs.values()):
            for step in run.steps.values():
                if run.state == "running" and step.state == "waiting_timer" and step.timer_due:
                    self._complete(run, step, None)
        self.settle_children()

    def settle_children(self) -> None:
        """The child scanners, each a transaction of its own after the one that ended a child
        run (or retried a child node): a retried child node whose deps are complete starts
        waiting (reusing its child run); a waiting child node whose child run ended ends."""
        self._tick()
        for run in list(self.runs.values()):
            if run.state == "running":
                for step in run.steps.values():
                    if step.node.type == "child" and step.state == "pending" and run.deps_completed(step):
                        self._enter(run, step)
        self._tick()
        for run in list(self.runs.values()):
            if run.state == "running":
                self._settle_children_of(run)

    def _settle_children_of(self, run: Run) -> None:
        """The child run completed: the node completes with its result. It failed or was
        cancelled: the node is discarded (permanent), and OnDepFailure applies."""
        for step in run.steps.values():
            child = self.runs.get(step.child_run or "")
            if step.state != "waiting_child" or child is None:
                continue
            if child.state == "completed":
                leaves = [n.id for n in child.nodes if not any(n.id in m.deps for m in child.nodes)]
                self._complete(run, step, {n: child.steps[n].output for n in leaves})
            elif child.state in ("failed", "cancelled"):
                self._discard(run, step, "permanent")

    # -- run actions ---------------------------------------------------------------------

    def cancel(self, run_id: str) -> bool | str:
        self._tick()
        run = self.runs[run_id]
        if run.state == "cancelled":
            return False
        if run.state not in ("running", "paused"):
            return REFUSED
        self._cancel(list(run.steps.values()), "operator", None)
        run.state = "cancelled"
        return True

    def pause(self, run_id: str) -> bool | str:
        """Available steps and the waits move to paused; running steps go on."""
        self._tick()
        run = self.runs[run_id]
        if run.state == "paused":
            return False
        if run.state != "running":
            return REFUSED
        for s in run.steps.values():
            if s.state in PAUSABLE:
                s.state = "paused"
        run.state = "paused"
        return True

    def resume(self, run_id: str) -> bool | str:
        """Each paused step goes back to the state of its kind (keeping its place in the
        signal queue and its timer); signals stored meanwhile are delivered; pending steps
        whose deps completed during the pause are promoted."""
        self._tick()
        run = self.runs[run_id]
        if run.state != "paused":
            return REFUSED
        run.state = "running"
        for s in run.steps.values():
            if s.state == "paused":
                s.state = ENTRY[s.node.type]
        self._settle_children_of(run)  # child runs that ended during the pause
        self._deliver(run)
        self._promote(run)
        return True

    def retry(self, run_id: str, node: str | None) -> bool | str:
        """Reopen one discarded node, or all of them (a running, paused or failed run). A
        child run reopens only while its parent node still waits for it (docs/lifecycle.md, "Reopened child runs": else
        the Retry of that node is what reopens it)."""
        self._tick()
        run = self.runs[run_id]
        if run.state not in ("running", "paused", "failed"):
            return REFUSED
        if run.parent is not None:
            parent_node = self.runs[run.parent[0]].steps[run.parent[1]]
            if parent_node.child_run != run_id or parent_node.state not in ("waiting_child", "paused"):
                return REFUSED
        if node is not None:
            if run.steps[node].state != "discarded":
                return REFUSED
            # docs/design.md: only the discard that failed the run may be retried alone.
            if run.state == "failed" and run.failed_by != node:
                return REFUSED
            targets = {node}
        else:
            targets = {n for n, s in run.steps.items() if s.state == "discarded"}
            if not targets:
                return REFUSED
        self._reopen(run, targets)
        return True

    def _reopen(self, run: Run, targets: set[str]) -> None:
        """The target discards get a fresh attempt budget; the steps they cancelled
        (fail-fast, branch) reopen with their counters kept; a failed run runs again."""
        reopened = [s for s in run.steps.values()
                    if (s.state == "discarded" and s.node.id in targets)
                    or (s.state == "cancelled" and s.cancel_cause in ("fail_fast", "branch")
                        and s.cancelled_by in targets)]
        for s in reopened:
            if s.state == "discarded":
                s.attempt, s.reclaims = 1, 0
            s.state, s.error_kind, s.cancel_cause, s.cancelled_by, s.wait_key = "pending", None, None, None, None
        self._recancel(run, reopened)
        if run.state == "failed":
            run.state, run.failed_by = "running", None
        if run.state == "running":
            self._promote(run, children=False)
        else:  # paused: what could start waits in paused, with its timer whole; child nodes at Resume
            for s in reopened:
                if s.state == "pending" and run.deps_completed(s) and s.node.type != "child":
                    s.state, s.timer_due = "paused", False
                    if s.node.type == "signal":
                        s.wait_key = (self.now, s.node.id)

    def _recancel(self, run: Run, reopened: list[Step]) -> None:
        """A reopened step that still depends on a discard left in place (retried alone,
        another discard is not reopened) stays cancelled by that branch."""
        changed = True
        while changed:
            changed = False
            for s in reopened:
                if s.state != "pending":
                    continue
                ended = [run.steps[d] for d in sorted(s.node.deps, key=list(run.steps).index)
                         if run.steps[d].state in ("discarded", "cancelled")]
                if ended:
                    first = ended[0]
                    s.state, s.cancel_cause = "cancelled", "branch"
                    s.cancelled_by = first.node.id if first.state == "discarded" else first.cancelled_by
                    changed = True

    def signal(self, run_id: str, name: str, payload: Any) -> str | None:
        """Write to the mailbox of a running or paused run; a waiting node takes it at once
        in a running run. Returns the node that took it (None: it waits), or REFUSED."""
        self._tick()
        run = self.runs[run_id]
        if run.state not in ("running", "paused"):
            return REFUSED
        run.mailbox.append((name, payload))
        before = {n for n, s in run.steps.items() if s.state == "completed"}
        self._deliver(run)
        taken = [n for n, s in run.steps.items()
                 if s.state == "completed" and n not in before and s.output == payload]
        return taken[0] if taken else None
