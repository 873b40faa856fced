"""A real failover: the primary crashes under load, its synchronous standby is promoted, and the same server carries on.

A primary and a streaming standby (pg_replica.ReplicaPair) on two loopback ports; the
server's URL names both hosts with target_session_attrs=read-write. Two SDK workers run
jobs and 5-node DAG runs submitted at a steady pace, each submission repeated with its
idempotency key until it is acknowledged. Mid-run the primary stops in immediate mode, and
OUTAGE seconds later (longer than the lease TTL: what a failover manager takes to decide)
the standby is promoted. Then every acknowledged submission is on the new primary, every
run completes with the outputs its handlers computed, no step's result is applied twice,
the server process is the one started at first, and the test prints how long after the
promotion steps completed again (docs/operations.md, "High availability").
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import pytest

from cyclone_server.store.migrate import migrate
from cyclone_worker import Client, Context, CycloneClientError, Worker, Workflow

from pg_replica import ReplicaPair
from waits_helpers import until

LEASE_TTL = 2.0
OUTAGE = 3.0  # seconds from the crash to the promotion: longer than the lease TTL
PACE = 0.08  # seconds between two submissions
BEFORE, AFTER = 40, 25  # submissions acknowledged before the crash, and made after the promotion
DEADLINE = 60.0
RECOVERY_BOUND = 30.0  # a generous bound on promotion -> first completed step; the figure is printed
KIND = "replica"
DAG = (Workflow("replica_dag").task("a", kind=KIND)
       .task("b", kind=KIND, deps=["a"]).task("c", kind=KIND, deps=["a"]).task("d", kind=KIND, deps=["a"])
       .task("e", kind=KIND, deps=["b", "c", "d"]))
DAG_PARENTS = {"a": [], "b": ["a"], "c": ["a"], "d": ["a"], "e": ["b", "c", "d"]}


def expected_output(i: int, node: str) -> dict[str, Any]:
    """What the handler returns for submission `i`'s node `node` (besides gen/attempt)."""
    return {"i": i, "node": node, "parents": [f"{i}:{p}" for p in DAG_PARENTS.get(node, [])]}


class Load:
    """Submissions at a steady pace, each one repeated with its idempotency key until acknowledged."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.acked: dict[str, tuple[str, str, float]] = {}  # key -> (what, run id, monotonic time of the ack)
        self.started: dict[str, float] = {}  # key -> monotonic time of the first call
        self.failed_calls = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self.runner: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        for task in (self.runner, *self.tasks):
            if task is not None:
                task.cancel()

    async def run(self) -> None:
        self.runner = asyncio.current_task()
        i = 0
        while not self.stop.is_set():
            self.tasks.append(asyncio.create_task(self._submit(i)))
            i += 1
            await asyncio.sleep(PACE)
        await asyncio.gather(*self.tasks)

    async def _submit(self, i: int) -> None:
        what = "dag" if i % 3 == 0 else "job"
        key = f"{what}-{i}"
        self.started[key] = time.monotonic()
        end = time.monotonic() + DEADLINE
        while True:
            try:
                if what == "dag":
                    run_id = await self.client.submit(DAG.name, {"i": i}, idempotency_key=key)
                else:
                    run_id = await self.client.enqueue(KIND, {"i": i}, idempotency_key=key)
                self.acked[key] = (what, run_id, time.monotonic())
                return
            except CycloneClientError:
                self.failed_calls += 1
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)


async def test_the_primary_crashes_the_standby_is_promoted_and_the_same_server_carries_on(
        start_server: Callable[..., Any], capsys: pytest.CaptureFixture[str],
        record_property: Callable[[str, object], None]) -> None:
    with ReplicaPair() as pair:
        url = pair.create_database("cyclone")
        await asyncio.to_thread(migrate, url)
        srv = start_server(url, lease_ttl=LEASE_TTL, sweep_interval=0.2)
        executions: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)  # step -> [(gen, attempt)]

        async def handle(ctx: Context) -> dict[str, Any]:
            executions[ctx.step_id].append((ctx.lease_generation, ctx.attempt))
            await asyncio.sleep(random.uniform(0, 0.1))
            parents = sorted(f"{p['i']}:{p['node']}" for p in ctx.parents.values())
            return {"i": ctx.input["i"], "node": ctx.node, "parents": parents,
                    "gen": ctx.lease_generation, "attempt": ctx.attempt}

        workers = [Worker(srv.address, slots=4) for _ in range(2)]
        for w in workers:
            w.register(KIND, handle)
        async with workers[0], workers[1], Client(srv.address, rpc_timeout=10) as client:
            await client.register(DAG)
            load = Load(client)
            submitting = asyncio.create_task(load.run())
            try:
                await until(lambda: len(load.acked) >= BEFORE and len(executions) >= BEFORE,
                            "load running before the crash", DEADLINE)
                await asyncio.to_thread(pair.crash_primary)
                crash_wall = time.time()  # whatever committed later committed on the new primary
                acked_before_crash = dict(load.acked)
                await asyncio.sleep(OUTAGE)
                promote_s = await asyncio.to_thread(pair.promote)
                promoted, promoted_wall = time.monotonic(), time.time()
                # Synchronous replication: what the old primary acknowledged, the standby had.
                on_new = await keys_on(pair.standby.url("cyclone"), acked_before_crash)
                lost = sorted(set(acked_before_crash) - on_new)
                assert not lost, f"{len(lost)} of {len(acked_before_crash)} acknowledged submissions lost: {lost[:10]}"
                await until(lambda: sum(load.started[k] > promoted for k in load.acked) >= AFTER,
                            f"{AFTER} submissions made and acknowledged after the promotion", DEADLINE)
            except BaseException:
                load.cancel()
                raise
            load.stop.set()
            await submitting
            new_primary = pair.standby.url("cyclone")
            await until(lambda: all_terminal(new_primary, len(load.acked)), "every run terminal", DEADLINE)
        assert srv.proc is not None and srv.proc.poll() is None, "the server process exited"
        assert len(srv.logs) == 1, "the server was started again"

        with psycopg.connect(new_primary, autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            runs = {key: (str(rid), state, result) for key, rid, state, result in conn.execute(
                "SELECT idempotency_key, id, state, result FROM cyclone_runs")}
            steps = conn.execute("SELECT run_id::text, id::text, node, state, attempt, reclaims, lease_generation, "
                                 "output FROM cyclone_steps").fetchall()
            first_done = conn.execute("SELECT extract(epoch FROM min(finished_at)) FROM cyclone_steps "
                                      "WHERE finished_at > to_timestamp(%s)", (crash_wall,)).fetchone()[0]

    # Every acknowledged submission is on the new primary, as the run the server answered with.
    assert {k: runs.get(k, ("missing",))[0] for k in acked_before_crash} == \
        {k: rid for k, (_, rid, _) in acked_before_crash.items()}
    assert {k: runs.get(k, ("missing",))[0] for k in load.acked} == {k: rid for k, (_, rid, _) in load.acked.items()}
    assert len(runs) == len(load.acked), "runs that no acknowledged submission made"

    # Every run completed, with the outputs its handlers computed.
    key_of = {rid: key for key, (rid, _, _) in runs.items()}
    by_run: dict[str, dict[str, tuple[Any, ...]]] = collections.defaultdict(dict)
    for run_id, *step in steps:
        by_run[run_id][step[1]] = tuple(step)
    bad_runs = []
    for key, (rid, state, result) in runs.items():
        what, i = key.split("-")
        nodes = by_run[rid]
        want_nodes = set(DAG_PARENTS) if what == "dag" else {KIND}
        if state != "completed" or set(nodes) != want_nodes:
            bad_runs.append((key, state, sorted(nodes)))
            continue
        leaf = "e" if what == "dag" else KIND
        got_leaf = {k: {f: v for f, v in out.items() if f not in ("gen", "attempt")} for k, out in result.items()}
        if got_leaf != {leaf: expected_output(int(i), leaf)}:
            bad_runs.append((key, "result", result))
    assert not bad_runs, bad_runs[:10]

    # No step ran twice under one lease, every output is from the step's final lease, and no
    # result was applied twice: the workers were told APPLIED once per step, no more.
    wrong, ran_again = [], []
    for run_id, sid, node, state, attempt, reclaims, gen, output in steps:
        i = int(key_of[run_id].split("-")[1])
        if state != "completed" or output != {**expected_output(i, node), "gen": gen, "attempt": attempt}:
            wrong.append((key_of[run_id], node, state, gen, attempt, output))
        runs_of_step = executions[sid]
        if (gen, attempt) not in runs_of_step or len(set(runs_of_step)) != len(runs_of_step) \
                or len(runs_of_step) > 1 + reclaims or attempt != 1:
            ran_again.append((key_of[run_id], node, runs_of_step, gen, attempt, reclaims))
    assert not wrong, wrong[:10]
    assert not ran_again, ran_again[:10]
    counts = sum((w.counts for w in workers), collections.Counter())
    assert counts["applied"] == len(steps), counts
    reclaimed = sum(s[5] for s in steps)
    assert reclaimed <= len(steps) // 10, f"{reclaimed} reclaims of {len(steps)} steps"

    assert first_done is not None, "no step completed after the crash"
    recovery = float(first_done) - promoted_wall
    acked_after = min(t for *_, t in load.acked.values() if t > promoted) - promoted
    record_property("promotion_to_first_completed_step_s", round(recovery, 2))
    with capsys.disabled():
        print(f"\nfailover: {len(runs)} runs, {len(steps)} steps ({len(acked_before_crash)} runs acknowledged "
              f"before the crash); outage {OUTAGE:g} s; promote took {promote_s:.2f} s; first step completed "
              f"{recovery:.2f} s after the promotion, first submission acknowledged {acked_after:.2f} s after; "
              f"{reclaimed} reclaims, {sum(map(len, executions.values())) - len(steps)} re-executions, "
              f"{load.failed_calls} failed submit calls, worker acks {dict(counts)}")
    assert recovery < RECOVERY_BOUND, f"steps completed again only {recovery:.1f} s after the promotion"


async def keys_on(url: str, keys: Iterable[str]) -> set[str]:
    """Which of the idempotency keys `keys` have a run on `url`'s database."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows = await (await conn.execute("SELECT idempotency_key FROM cyclone_runs WHERE idempotency_key = ANY(%s)",
                                         (list(keys),))).fetchall()
    return {k for (k,) in rows}


async def all_terminal(url: str, runs: int) -> bool:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state NOT IN ('completed', 'failed', 'cancelled')) "
            "FROM cyclone_runs")).fetchone()
    assert row is not None
    return row[0] >= runs and row[1] == 0
