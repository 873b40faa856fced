"""Model-based test of the state machine: random actions on the engine and on the model of
the lifecycle document (model_lifecycle.py); after each one, every run and step agree.

The engine runs on a real Postgres (this test's own database, emptied before each example).
Hypothesis picks the actions: submit small DAGs (task, sleep, signal and child nodes, some
with CancelBranch) and enqueue jobs; claim, complete, fail (retryable or permanent, with small
max_attempts), snooze, answer with a lease that no longer holds the step, let a lease
expire, make a timer due (each followed by the sweep), cancel, pause, resume, Retry,
RetryAll and signal, on top-level and child runs. Time is never waited for: backoffs and
snoozes are made due in SQL before a claim, leases and timers run out when the test moves
them back. After each action the child scanners run (Engine.settle_children), as a server
runs them when a run ends, and then both sides must agree.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from typing import Any

import psycopg
import pytest
from engine_helpers import fetch, violations
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)
from model_lifecycle import Model
from model_runs import REFUSED, Node, Step

from cyclone_server.records import Result

from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition

pytestmark = pytest.mark.statemachine

MAX_RUNS = 8  # per example, and at most MAX_ACTIVE not yet terminal: few enough to reach deep states
MAX_ACTIVE = 3
OWNER = "model-worker"
LEASE_TTL = 3600.0  # leases expire only when the test says so
_names = itertools.count(1)


@st.composite
def dags(draw: st.DrawFn) -> list[Node]:
    """1 to 4 nodes, each depending on up to two earlier ones; a child node's workflow is
    one task node."""
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, 4))):
        deps = draw(st.lists(st.sampled_from([n.id for n in nodes]), max_size=2, unique=True)) if nodes else []
        kind = draw(st.sampled_from(["task", "task", "task", "sleep", "signal", "child"]))
        child = (Node("ct", max_attempts=draw(st.integers(1, 2)), max_reclaims=draw(st.integers(0, 1))),)
        nodes.append(Node(f"n{i}", kind, tuple(deps), cancel_branch=draw(st.sampled_from([True, True, False])),
                          max_attempts=draw(st.integers(1, 3)), max_reclaims=draw(st.integers(0, 1)),
                          signal=draw(st.sampled_from("ab")) if kind == "signal" else None,
                          child=child if kind == "child" else ()))
    return nodes


def definition(node: Node, workflow: str) -> dict[str, Any]:
    """The engine's node: tiny backoff (made due anyway), timers and attempts that never run
    out by themselves. Names: kind "<workflow>.<node>"; a child node's workflow, the same."""
    d: dict[str, Any] = {"id": node.id, "kind": f"{workflow}.{node.id}", "type": node.type, "deps": list(node.deps),
                         "on_dep_failure": "cancel_branch" if node.cancel_branch else "fail_run",
                         "max_attempts": node.max_attempts, "max_reclaims": node.max_reclaims,
                         "backoff_initial": 0.001, "backoff_max": 0.001, "attempt_timeout": 3600}
    if node.type == "sleep":
        d["sleep"] = 3600
    if node.type == "signal":
        d["signal"] = node.signal
    if node.type == "child":
        d["workflow"] = f"{workflow}.{node.id}"
    return d


def pick(items: list[Any], i: int) -> Any:
    return items[i % len(items)]


class LifecycleMachine(RuleBasedStateMachine):
    """One example: a fresh model and an emptied database, then random actions on both."""

    # Set by the test: the engine, a connection for the test's own SQL, and their loop.
    loop: asyncio.AbstractEventLoop
    engine: Engine
    conn: psycopg.AsyncConnection

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        # Runs by the model's id (a child run's is made by the model) and the database's.
        self.db_ids: dict[str, str] = {}
        self.model_ids: dict[str, str] = {}
        self.workflows: dict[str, str | None] = {}  # run -> workflow name (None: a job)
        self.step_ids: dict[tuple[str, str], str] = {}  # (run, node) -> step id
        self.kinds: dict[tuple[str, str], str] = {}
        self.leases: list[tuple[str, str, int]] = []  # every (run, node, generation) handed out
        self.signals = itertools.count(1)

    def do(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def refused_or(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """The engine's answer, or REFUSED for FAILED_PRECONDITION."""
        try:
            return self.do(coro)
        except FailedPrecondition:
            return REFUSED

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        return self.do(fetch(self.conn, query, *params))

    @initialize()
    def empty_database(self) -> None:
        self.sql("TRUNCATE cyclone_signals, cyclone_step_deps, cyclone_steps, cyclone_runs, cyclone_workflows")

    # -- what the rules choose from ------------------------------------------------------

    def steps_where(self, ok: Any) -> list[tuple[str, str, Step]]:
        return [(rid, n, s) for rid, run in self.model.runs.items() for n, s in run.steps.items() if ok(s)]

    def live_leases(self) -> list[tuple[str, str, int]]:
        return [lease for lease in self.leases if self.model.runs[lease[0]].steps[lease[1]].state == "running"
                and self.model.runs[lease[0]].steps[lease[1]].generation == lease[2]]

    def dead_leases(self) -> list[tuple[str, str, int]]:
        live = set(self.live_leases())
        return [lease for lease in self.leases if lease not in live]

    def room_for_a_run(self) -> bool:
        top = [r for r in self.model.runs.values() if r.parent is None]
        return len(top) < MAX_RUNS and sum(r.state in ("running", "paused") for r in top) < MAX_ACTIVE

    def run_ids(self) -> list[str]:
        return list(self.model.runs)

    # -- runs begin ----------------------------------------------------------------------

    def _track(self, run_id: str, db_id: str, workflow: str | None) -> None:
        self.db_ids[run_id], self.model_ids[db_id], self.workflows[run_id] = db_id, run_id, workflow
        for row in self.sql("SELECT node, id FROM cyclone_steps WHERE run_id = %s", db_id):
            self.step_ids[(run_id, row["node"])] = str(row["id"])
            self.kinds[(run_id, row["node"])] = f"{workflow}.{row['node']}" if workflow else row["node"]

    def _track_child_runs(self) -> None:
        """Pair the child runs the engine started with those the model started (one per
        parent node and action)."""
        rows = self.sql("SELECT r.id, r.parent_run_id, p.node FROM cyclone_runs r "
                        "JOIN cyclone_steps p ON p.id = r.parent_step_id ORDER BY r.id")
        for r in rows:
            if str(r["id"]) in self.model_ids:
                continue
            parent = self.model_ids[str(r["parent_run_id"])]
            [mine] = [k for k, run in self.model.runs.items()
                      if run.parent == (parent, r["node"]) and k not in self.db_ids]
            self._track(mine, str(r["id"]), f"{self.workflows[parent]}.{r['node']}")

    @precondition(lambda self: self.room_for_a_run())
    @rule(nodes=dags())
    def submit(self, nodes: list[Node]) -> None:
        name = f"wf{next(_names)}"
        for n in nodes:
            if n.type == "child":
                self.do(self.engine.register_workflow(f"{name}.{n.id}", [definition(c, f"{name}.{n.id}")
                                                                         for c in n.child]))
        self.do(self.engine.register_workflow(name, [definition(n, name) for n in nodes]))
        run_id, _ = self.do(self.engine.submit_run(name))
        self.model.submit(run_id, nodes)
        self._track(run_id, run_id, name)

    @precondition(lambda self: self.room_for_a_run())
    @rule(max_attempts=st.integers(1, 3), max_reclaims=st.integers(0, 1))
    def enqueue(self, max_attempts: int, max_reclaims: int) -> None:
        kind = f"job{next(_names)}"
        node = Node(kind, max_attempts=max_attempts, max_reclaims=max_reclaims)
        opts = {k: v for k, v in definition(node, "").items() if k not in ("id", "kind", "type", "deps")}
        run_id, _, _ = self.do(self.engine.enqueue(kind, options=opts))
        self.model.submit(run_id, [node])
        self._track(run_id, run_id, None)

    # -- leases --------------------------------------------------------------------------

    def _claim(self, run_id: str, node: str) -> None:
        # Any backoff or snooze is over: the step is claimable now if it is available.
        self.sql("UPDATE cyclone_steps SET scheduled_at = now() - interval '1 ms' "
                 "WHERE id = %s AND state = 'available'", self.step_ids[(run_id, node)])
        leases = self.do(self.engine.claim(OWNER, [self.kinds[(run_id, node)]], limit=5, lease_ttl=LEASE_TTL))
        expected = self.model.claim(run_id, node)
        assert [(str(x["step_id"]), x["lease_generation"]) for x in leases] == (
            [] if expected is None else [(self.step_ids[(run_id, node)], expected)])
        if expected is not None:
            assert leases[0]["attempt"] == self.model.runs[run_id].steps[node].attempt
            self.leases.append((run_id, node, expected))

    @precondition(lambda self: self.steps_where(lambda s: s.node.type == "task"))
    @rule(i=st.integers(0, 99), unclaimable=st.sampled_from([False, False, False, True]))
    def claim(self, i: int, unclaimable: bool) -> None:
        """Claim an available step, or try one that is pending, paused, running or ended
        (never leased). Claims go by kind, which the child runs of one node share: a step is
        tried only when no other step of its kind is available."""
        candidates = self.steps_where(lambda s: s.node.type == "task" and (s.state == "available") != unclaimable)
        available = {self.kinds[(r, n)] for r, n, _ in self.steps_where(lambda s: s.state == "available")}
        if unclaimable:
            candidates = [(r, n, s) for r, n, s in candidates if self.kinds[(r, n)] not in available]
        if candidates:
            run_id, node, _ = pick(candidates, i)
            self._claim(run_id, node)

    @precondition(lambda self: self.steps_where(lambda s: s.state == "available"))
    @rule(i=st.integers(0, 99), outcome=st.sampled_from(["complete", "complete", "fail", "fail", "snooze"]),
          permanent=st.booleans(), batch=st.booleans())
    def work(self, i: int, outcome: str, permanent: bool, batch: bool) -> None:
        """A worker claims a step and answers at once."""
        run_id, node, _ = pick(self.steps_where(lambda s: s.state == "available"), i)
        self._claim(run_id, node)
        self._answer(self.leases[-1], outcome, permanent, batch)

    def _answer(self, lease: tuple[str, str, int], outcome: str, permanent: bool = False,
                batch: bool = False) -> None:
        """Answer a lease with the one-result calls, or in a result batch as the server
        applies a worker's results (Engine.apply_results)."""
        run_id, node, gen = lease
        sid = self.step_ids[(run_id, node)]
        if outcome == "complete":
            result = Result(sid, gen, "completed", output={"gen": gen})
            want = self.model.complete(run_id, node, gen, {"gen": gen})
        elif outcome == "fail":
            result = Result(sid, gen, "failed", message="boom", permanent=permanent)
            want = self.model.fail(run_id, node, gen, permanent)
        else:
            result = Result(sid, gen, "snoozed", delay=0)
            want = self.model.snooze(run_id, node, gen)
        if batch:
            [(_, _, got)] = self.do(self.engine.apply_results([result]))
        else:
            got = self.do(self.apply_one(result))
        assert got == want, (outcome, lease)

    def apply_one(self, r: Result) -> Coroutine[Any, Any, str]:
        if r.outcome == "completed":
            return self.engine.complete(r.step_id, r.generation, r.output)
        if r.outcome == "failed":
            return self.engine.fail(r.step_id, r.generation, r.message, permanent=r.permanent)
        return self.engine.snooze(r.step_id, r.generation, r.delay or 0)

    @precondition(lambda self: self.live_leases())
    @rule(i=st.integers(0, 99), batch=st.booleans())
    def complete(self, i: int, batch: bool) -> None:
        self._answer(pick(self.live_leases(), i), "complete", batch=batch)

    @precondition(lambda self: len(self.live_leases()) >= 2)
    @rule(picks=st.lists(st.integers(0, 99), min_size=2, max_size=6))
    def complete_many(self, picks: list[int]) -> None:
        """Several completions in one result batch, as a server group-commits them: the
        set-based path of cyclone_results_apply (steps of the same run and of several runs
        at once, promotions, runs ending) must do what completing them one by one does."""
        live = self.live_leases()
        chosen = list(dict.fromkeys(live[i % len(live)] for i in picks))
        results, want = [], []
        for run_id, node, gen in chosen:
            results.append(Result(self.step_ids[(run_id, node)], gen, "completed", output={"gen": gen}))
            want.append(self.model.complete(run_id, node, gen, {"gen": gen}))
        got = [status for _, _, status in self.do(self.engine.apply_results(results))]
        assert got == want, (chosen, got, want)

    @precondition(lambda self: self.live_leases())
    @rule(i=st.integers(0, 99), permanent=st.booleans(), batch=st.booleans())
    def fail(self, i: int, permanent: bool, batch: bool) -> None:
        self._answer(pick(self.live_leases(), i), "fail", permanent, batch)

    @precondition(lambda self: self.live_leases())
    @rule(i=st.integers(0, 99), batch=st.booleans())
    def snooze(self, i: int, batch: bool) -> None:
        self._answer(pick(self.live_leases(), i), "snooze", batch=batch)

    @precondition(lambda self: self.dead_leases())
    @rule(i=st.integers(0, 99), outcome=st.sampled_from(["complete", "fail", "snooze"]), batch=st.booleans())
    def late_answer(self, i: int, outcome: str, batch: bool) -> None:
        """A result under a lease that no longer holds the step is fenced, never applied."""
        self._answer(pick(self.dead_leases(), i), outcome, permanent=True, batch=batch)

    # -- the sweep: leases and timers --------------------------------------------------------

    def _sweep(self) -> None:
        self.do(self.engine.sweep())
        self.model.sweep()

    @precondition(lambda self: self.steps_where(lambda s: s.state == "running"))
    @rule(i=st.integers(0, 99))
    def lease_expires(self, i: int) -> None:
        run_id, node, _ = pick(self.steps_where(lambda s: s.state == "running"), i)
        self.sql("UPDATE cyclone_steps SET lease_expiry = now() - interval '1 s' WHERE id = %s",
                 self.step_ids[(run_id, node)])
        self.model.expire_lease(run_id, node)
        self._sweep()

    @precondition(lambda self: self.steps_where(lambda s: s.node.type == "sleep"
                                                and s.state in ("waiting_timer", "paused")))
    @rule(i=st.integers(0, 99))
    def timer_runs_out(self, i: int) -> None:
        """The timer of a sleep node is due (in a paused run: no time is left of it)."""
        run_id, node, _ = pick(self.steps_where(lambda s: s.node.type == "sleep"
                                                and s.state in ("waiting_timer", "paused")), i)
        self.sql("UPDATE cyclone_steps SET timer_at = CASE WHEN state = 'waiting_timer' "
                 "THEN now() - interval '1 ms' ELSE timer_at END, "
                 "timer_left = CASE WHEN state = 'paused' THEN interval '0' END WHERE id = %s",
                 self.step_ids[(run_id, node)])
        self.model.timer_due(run_id, node)
        self._sweep()

    @rule()
    def sweep(self) -> None:
        self._sweep()

    # -- run actions ---------------------------------------------------------------------

    @precondition(lambda self: self.model.runs)
    @rule(i=st.integers(0, 99), action=st.sampled_from(["pause", "pause", "resume", "resume", "cancel"]))
    def run_action(self, i: int, action: str) -> None:
        run_id = pick(self.run_ids(), i)
        got = self.refused_or(getattr(self.engine, f"{action}_run")(self.db_ids[run_id]))
        assert got == getattr(self.model, action)(run_id), (action, run_id)

    @precondition(lambda self: self.steps_where(lambda s: s.state == "discarded"))
    @rule(i=st.integers(0, 99), every=st.booleans())
    def retry(self, i: int, every: bool) -> None:
        """Retry of a discarded node, or RetryAll of its run."""
        run_id, node, _ = pick(self.steps_where(lambda s: s.state == "discarded"), i)
        target = None if every else node
        got = self.refused_or(self.engine.retry(self.db_ids[run_id], target))
        assert got == self.model.retry(run_id, target), (run_id, target)

    @precondition(lambda self: self.model.runs)
    @rule(i=st.integers(0, 99), j=st.integers(0, 9))
    def signal(self, i: int, j: int) -> None:
        """A signal to a run, mostly of a name one of its nodes waits for."""
        run_id = pick(self.run_ids(), i)
        names = [s.node.signal for s in self.model.runs[run_id].steps.values() if s.node.signal] + ["a", "b"]
        name = pick(names, j)
        payload = {"sig": next(self.signals)}
        try:
            _, consumed_by = self.do(self.engine.signal(self.db_ids[run_id], name, payload))
            got = None if consumed_by is None else next(
                n for (r, n), sid in self.step_ids.items() if r == run_id and sid == consumed_by)
        except FailedPrecondition:
            got = REFUSED
        assert got == self.model.signal(run_id, name, payload), (run_id, name)

    # -- after every action --------------------------------------------------------------

    @invariant()
    def after_the_child_scanners_database_and_model_agree(self) -> None:
        self.do(self.engine.settle_children())
        self.model.settle_children()
        self._track_child_runs()
        rows = self.sql("SELECT r.id AS run_id, r.state AS run_state, s.node, s.type, s.state, s.attempt, "
                        "s.reclaims, s.snoozes, s.lease_generation, s.error_kind, s.output "
                        "FROM cyclone_runs r JOIN cyclone_steps s ON s.run_id = r.id")
        db: dict[str, Any] = {}
        for r in rows:
            run = db.setdefault(self.model_ids.get(str(r["run_id"]), str(r["run_id"])),
                                {"state": r["run_state"], "steps": {}})
            run["steps"][r["node"]] = self.step_view(r["type"], r["state"], r["attempt"], r["reclaims"], r["snoozes"],
                                                     r["lease_generation"], r["error_kind"], r["output"])
        want = {rid: {"state": run.state,
                      "steps": {n: self.step_view(s.node.type, s.state, s.attempt, s.reclaims, s.snoozes,
                                                  s.generation, s.error_kind, s.output)
                                for n, s in run.steps.items()}}
                for rid, run in self.model.runs.items()}
        assert db == want
        mail = self.sql("SELECT run_id, name, payload FROM cyclone_signals WHERE consumed_by IS NULL "
                        "ORDER BY created_at, id")
        assert [(self.model_ids[str(m["run_id"])], m["name"], m["payload"]) for m in mail] == sorted(
            [(rid, name, p) for rid, run in self.model.runs.items() for name, p in run.mailbox],
            key=lambda m: m[2]["sig"])

    @staticmethod
    def step_view(type_: str, state: str, attempt: int, reclaims: int, snoozes: int, generation: int,
                  error_kind: str | None, output: Any) -> tuple[Any, ...]:
        """What must agree: states and counters; the error kind of a discard; the output of
        a completed task (its lease generation), signal node (the signal it took) or child
        node (its child run's result)."""
        return (state, attempt, reclaims, snoozes, generation,
                error_kind if state == "discarded" else None,
                output if state == "completed" and type_ != "sleep" else None)

    def teardown(self) -> None:
        assert self.do(violations(self.conn)) == {}


# Passing takes seconds; a failure is shrunk for up to Hypothesis's 5 minutes before it is shown.
@pytest.mark.timeout(900)
def test_engine_agrees_with_the_model_of_the_lifecycle(db_url: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        LifecycleMachine.loop = loop
        LifecycleMachine.engine = loop.run_until_complete(Engine.open(db_url, min_size=1, max_size=2))
        LifecycleMachine.conn = loop.run_until_complete(psycopg.AsyncConnection.connect(db_url, autocommit=True))
        try:
            run_state_machine_as_test(LifecycleMachine, settings=settings(
                max_examples=60, stateful_step_count=50, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
        finally:
            loop.run_until_complete(LifecycleMachine.conn.close())
            loop.run_until_complete(LifecycleMachine.engine.close())
    finally:
        loop.close()
