"""Concurrency: many claimers never share a step; racing actions end in legal states, never in deadlock."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from engine_helpers import db_now, expire_lease, fetch, fetch_one, task, violations
from psycopg.types.json import Jsonb

from cyclone_server import definitions
from cyclone_server.records import Result
from cyclone_server.store.engine import Engine
from cyclone_server.errors import FailedPrecondition, NotFound

pytestmark = pytest.mark.statemachine

CB = {"on_dep_failure": "cancel_branch"}


async def open_engines(db_url: str, n: int, size: int = 2) -> list[Engine]:
    return [await Engine.open(db_url, min_size=1, max_size=size) for _ in range(n)]


async def close_all(engines: list[Engine]) -> None:
    for e in engines:
        await e.close()


async def race(ops: list[Callable[[], Awaitable[Any]]], errors: list[BaseException]) -> None:
    """Run `ops` at once; FailedPrecondition and NotFound (a purged run) are legal answers to a race,
    anything else is kept."""
    async def guarded(op: Callable[[], Awaitable[Any]]) -> None:
        try:
            await op()
        except (FailedPrecondition, NotFound):
            pass
        except Exception as e:  # noqa: BLE001 - every other error is a finding
            errors.append(e)
    await asyncio.gather(*(guarded(op) for op in ops))


async def race_batch(conn: psycopg.AsyncConnection, rng: random.Random, ops: list[Callable[[], Awaitable[Any]]],
                     errors: list[BaseException], batch: int) -> None:
    """Race one batch of `ops` in a shuffled order; then no error but the legal ones, and no broken invariant."""
    rng.shuffle(ops)
    await race(ops, errors)
    assert not errors, errors
    assert await violations(conn) == {}, f"batch {batch}"


async def test_many_claimers_never_hold_one_step_under_two_leases(db_url: str, conn) -> None:
    total = 5000
    node = definitions.normalize_job("bulk", {})
    await conn.execute("SELECT cyclone_job_enqueue(%s, to_jsonb(i), 0, NULL, NULL, NULL, NULL) "
                       "FROM generate_series(1, %s) i", (Jsonb(node), total))
    claims: list[tuple[str, int]] = []
    applied: list[tuple[str, int]] = []
    engines = await open_engines(db_url, 9)

    async def remaining(engine: Engine) -> int:
        async with engine.pool.connection() as c:
            return (await fetch_one(c, "SELECT count(*) AS n FROM cyclone_steps WHERE state <> 'completed'"))["n"]

    async def async_worker(i: int, engine: Engine) -> None:
        rng = random.Random(i)
        late: list[dict] = []
        while True:
            leases = await engine.claim(f"w{i}", ["bulk"], rng.randint(1, 25), 60)
            if not leases:
                if await remaining(engine) == 0:
                    break
                await asyncio.sleep(0.01)
                continue
            claims.extend((str(x["step_id"]), x["lease_generation"]) for x in leases)
            keep = []
            for lease in leases:  # a few leases are abandoned: their worker stalls, the lease expires
                if rng.random() < 0.02:
                    late.append(lease)
                    async with engine.pool.connection() as c:
                        await expire_lease(c, lease["step_id"])
                else:
                    keep.append(lease)
            results = [Result(str(x["step_id"]), x["lease_generation"], "completed", output=i) for x in keep]
            if rng.random() < 0.3:  # some results from stalled workers arrive late, after a sweep
                results += [Result(str(x["step_id"]), x["lease_generation"], "completed", output=-1) for x in late]
                late.clear()
            for sid, gen, status in await engine.apply_results(results):
                if status == "applied":
                    applied.append((sid, gen))

    def thread_worker(i: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            while True:
                rows = c.execute("SELECT step_id, lease_generation FROM cyclone_steps_claim(%s, %s, 10, '60s')",
                                 (f"t{i}", ["bulk"])).fetchall()
                if not rows:
                    if c.execute("SELECT count(*) FROM cyclone_steps WHERE state <> 'completed'").fetchone()[0] == 0:
                        return
                    time.sleep(0.01)  # the rest is held by others, or waits for the sweep
                    continue
                for sid, gen in rows:
                    claims.append((str(sid), gen))
                    if c.execute("SELECT cyclone_step_complete(%s, %s, '1')", (sid, gen)).fetchone()[0] == "applied":
                        applied.append((str(sid), gen))

    async def sweeper() -> None:
        while await remaining(engines[-1]) > 0:
            await engines[-1].sweep()
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(asyncio.gather(
            *(async_worker(i, e) for i, e in enumerate(engines[:-1])),
            *(asyncio.to_thread(thread_worker, i) for i in range(2)), sweeper()), timeout=120)
    finally:
        await close_all(engines)

    assert len(claims) == len(set(claims)), "a (step, generation) lease was handed out twice"
    by_step: dict[str, list[int]] = defaultdict(list)
    for sid, gen in claims:
        by_step[sid].append(gen)
    assert len(by_step) == total  # none lost
    for gens in by_step.values():
        assert sorted(gens) == list(range(1, len(gens) + 1))
    assert any(len(gens) > 1 for gens in by_step.values())  # leases did expire and move on
    assert len(applied) == len(set(applied)) == total
    done = Counter(sid for sid, _ in applied)
    assert set(done.values()) == {1}  # each completed exactly once ...
    for sid, gen in applied:
        assert gen == max(by_step[sid])  # ... and only by the lease that held it last
    row = await fetch_one(conn, "SELECT count(*) FILTER (WHERE state = 'completed') AS n, count(*) AS total "
                                "FROM cyclone_runs")
    assert row == {"n": total, "total": total}


RACE_WF = [task("a", max_attempts=2), task("b", "a", **CB), task("c", "a"), task("d", max_attempts=2),
           task("s", type="signal")]
KINDS = ["a", "b", "c", "d"]


async def test_racing_actions_on_the_same_runs_end_in_legal_states(db_url: str, conn) -> None:
    engines = await open_engines(db_url, 4, size=4)
    errors: list[BaseException] = []
    rng = random.Random(7)
    try:
        await engines[0].register_workflow("race", RACE_WF)
        for batch in range(20):
            ops: list[Callable[[], Awaitable[Any]]] = []
            for _ in range(10):  # 200 runs in all
                e = rng.choice(engines)
                run_id, _ = await e.submit_run("race")
                held = await e.claim("setup", ["a", "d"], 10, 60)
                held = [x for x in held if str(x["run_id"]) == run_id]
                if held and rng.random() < 0.5:
                    await expire_lease(conn, held[0]["step_id"])
                ops += make_ops(rng, engines, run_id, held)
            await race_batch(conn, rng, ops, errors, batch)
    finally:
        await close_all(engines)
    # The races reached every run state, so each kind of ending was raced against the others.
    final = {r["state"] for r in await fetch(conn, "SELECT state FROM cyclone_runs")}
    assert final == {"running", "paused", "completed", "failed", "cancelled"}


def make_ops(rng: random.Random, engines: list[Engine], run_id: str, held: list[dict]) -> list:
    pick = lambda: rng.choice(engines)  # noqa: E731
    ops: list[Callable[[], Awaitable[Any]]] = []
    for lease in held:
        sid, gen = str(lease["step_id"]), lease["lease_generation"]
        choice = rng.choice(["complete", "fail", "permanent", "snooze"])
        if choice == "complete":
            ops.append(lambda e=pick(), s=sid, g=gen: e.complete(s, g, {"by": "race"}))
        elif choice == "snooze":
            ops.append(lambda e=pick(), s=sid, g=gen: e.snooze(s, g, 0))
        else:
            ops.append(lambda e=pick(), s=sid, g=gen, p=choice == "permanent": e.fail(s, g, "x", permanent=p))

    async def claim_and_complete(e: Engine) -> None:
        for lease in await e.claim("racer", KINDS, 3, 60):
            await e.complete(str(lease["step_id"]), lease["lease_generation"], 1)

    candidates = [
        lambda e=pick(): e.cancel_run(run_id),
        lambda e=pick(): e.pause_run(run_id),
        lambda e=pick(): e.resume_run(run_id),
        lambda e=pick(): e.retry(run_id),
        lambda e=pick(): e.retry(run_id, "a"),
        lambda e=pick(): e.signal(run_id, "s", 1),
        lambda e=pick(): e.sweep(),
        lambda e=pick(): claim_and_complete(e),
    ]
    ops += rng.sample(candidates, rng.randint(2, len(candidates)))
    return ops


TREES, TREES_PER_ROUND = 1000, 50


async def test_parent_and_child_runs_cancelled_and_completed_concurrently(db_url: str, conn) -> None:
    """1,000 trees of three runs (top -> mid -> leaf): in each, the leases complete or fail
    while the runs are cancelled, paused, resumed, retried, swept, settled and purged, all at
    once from four engines. No deadlock, no illegal state, and the races went both ways."""
    engines = await open_engines(db_url, 4, size=4)
    errors: list[BaseException] = []
    outcomes: Counter[str] = Counter()
    rng = random.Random(11)
    e0 = engines[0]
    try:
        await e0.register_workflow("leaf", [task("lt")])
        await e0.register_workflow("mid", [task("mk", type="child", workflow="leaf"), task("mt")])
        await e0.register_workflow("top", [task("tk", type="child", workflow="mid"), task("tt")])
        for round_ in range(TREES // TREES_PER_ROUND):
            tops = [r for r, _ in await asyncio.gather(
                *(engines[i % len(engines)].submit_run("top") for i in range(TREES_PER_ROUND)))]
            rows = await fetch(conn, "SELECT id, parent_run_id FROM cyclone_runs WHERE parent_run_id = ANY(%s)",
                               [uuid.UUID(t) for t in tops])
            mids = {str(r["parent_run_id"]): str(r["id"]) for r in rows}
            # Every tree's three task steps are leased, so its runs can complete while they are cancelled.
            leases = await e0.claim("setup", ["lt", "mt", "tt"], 3 * TREES_PER_ROUND, 60)
            assert len(leases) == 3 * TREES_PER_ROUND
            ops: list[Callable[[], Awaitable[Any]]] = []
            rng.shuffle(leases)
            while leases:  # single results, and batches over several trees as a server applies them
                size = rng.choice([1, 1, 4])
                batch, leases = leases[:size], leases[size:]
                ops.append(lambda e=rng.choice(engines), b=batch: finish(e, b, rng, outcomes))
            for top in tops:
                ops += tree_ops(rng, engines, top, mids[top], outcomes)
            rng.shuffle(ops)
            await race(ops, errors)
            deadlocks = [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)]
            assert not deadlocks, f"round {round_}: {deadlocks}"
            assert not errors, errors
            assert await violations(conn) == {}, f"round {round_}"
        # Settle what the races left: every tree ends up consistent once the scanners ran.
        for _ in range(4):
            await e0.sweep()
        assert await violations(conn) == {}
    finally:
        await close_all(engines)
    # Both orders of the race happened: cancels that ended live trees, completions that
    # ended runs, and completions refused because a cancel (or fail-fast) came first.
    for outcome in ("cancel applied", "result applied", "result ended"):
        assert outcomes[outcome] > 0, outcomes


async def finish(e: Engine, leases: list[dict], rng: random.Random, outcomes: Counter[str]) -> None:
    """Complete (80 %) or permanently fail the leases in one apply_results call."""
    results = [Result(str(x["step_id"]), x["lease_generation"], "completed", output=1) if rng.random() < 0.8
               else Result(str(x["step_id"]), x["lease_generation"], "failed", message="x", permanent=True)
               for x in leases]
    for _, _, status in await e.apply_results(results):
        outcomes["result " + ("applied" if status in ("applied", "discarded", "retried") else status)] += 1


def tree_ops(rng: random.Random, engines: list[Engine], top: str, mid: str, outcomes: Counter[str]) -> list:
    pick = lambda: rng.choice(engines)  # noqa: E731

    async def cancel(e: Engine, run_id: str) -> None:
        outcomes["cancel " + ("applied" if await e.cancel_run(run_id) else "no-op")] += 1

    candidates = [lambda e=pick(): cancel(e, top), lambda e=pick(): cancel(e, mid),
                  lambda e=pick(): e.sweep(), lambda e=pick(): e.settle_children(),
                  lambda e=pick(): e.pause_run(top), lambda e=pick(): e.resume_run(top),
                  lambda e=pick(): e.retry(mid), lambda e=pick(): e.retry(top)]
    ops = rng.sample(candidates, rng.randint(3, len(candidates)))
    if rng.random() < 0.1:  # a purge takes every terminal run of the database: now and then
        ops.append(lambda e=pick(): e.purge(0))
    return ops


WAITS_WF = [task("sig", type="signal", max_wait=60), task("nap", type="sleep", sleep=60, max_wait=120),
            task("kid", type="child", workflow="sub", max_wait=60), task("after", "sig", "nap", "kid", **CB)]


async def test_waits_racing_signals_pauses_cancels_and_scanners(db_url: str, conn) -> None:
    engines = await open_engines(db_url, 4, size=4)
    errors: list[BaseException] = []
    rng = random.Random(5)
    e0 = engines[0]
    try:
        await e0.register_workflow("sub", [task("st")])
        await e0.register_workflow("waits", WAITS_WF)
        for batch in range(20):
            ops: list[Callable[[], Awaitable[Any]]] = []
            for _ in range(5):  # 100 runs, each with a child run
                run_id, _ = await e0.submit_run("waits", deadline=await db_now(conn) + timedelta(hours=1))
                # Some timers, max_waits and deadlines are due, so the scanners race the actions.
                for column in ("timer_at", "max_wait_at"):
                    if rng.random() < 0.4:
                        await conn.execute(f"UPDATE cyclone_steps SET {column} = now() WHERE run_id = %s", (run_id,))
                if rng.random() < 0.2:
                    await conn.execute("UPDATE cyclone_runs SET deadline_at = now() WHERE id = %s", (run_id,))
                pick = lambda: rng.choice(engines)  # noqa: E731
                candidates = [
                    lambda e=pick(), r=run_id: e.signal(r, "sig", {"n": 1}),
                    lambda e=pick(), r=run_id: e.pause_run(r), lambda e=pick(), r=run_id: e.resume_run(r),
                    lambda e=pick(), r=run_id: e.cancel_run(r), lambda e=pick(), r=run_id: e.retry(r),
                    lambda e=pick(): e.sweep(), lambda e=pick(): e.sweep(),
                    lambda e=pick(): claim_and_finish(e, rng.random() < 0.2),
                ]
                ops += rng.sample(candidates, rng.randint(3, len(candidates)))
            await race_batch(conn, rng, ops, errors, batch)
    finally:
        await close_all(engines)


async def claim_and_finish(e: Engine, fail: bool) -> None:
    for lease in await e.claim("racer", ["st"], 2, 60):
        if fail:
            await e.fail(str(lease["step_id"]), lease["lease_generation"], "x", permanent=True)
        else:
            await e.complete(str(lease["step_id"]), lease["lease_generation"], 1)


async def test_a_batch_failing_a_parent_never_holds_its_grandchild_while_cancelling_down_to_it(
        db_url: str, conn) -> None:
    """A batch holds the top run T (a permanent failure: fail-fast cancels its child run M's
    tree) and the leaf run L below M (a completion). Another transaction X holds M and then
    wants L, as a cancel of M's tree does. If the batch held L while it waited for M, the
    two would deadlock; the failed step's results are applied in a transaction of their own,
    so L is free by then."""
    e = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        await e.register_workflow("leaf", [task("lt")])
        await e.register_workflow("mid", [task("mk", type="child", workflow="leaf"), task("mt")])
        await e.register_workflow("top", [task("tk", type="child", workflow="mid"), task("tt")])
        top, _ = await e.submit_run("top")
        leases = {x["kind"]: x for x in await e.claim("w", ["lt", "mt", "tt"], 3, 60)}
        assert set(leases) == {"lt", "mt", "tt"}
        mid = (await fetch_one(conn, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", uuid.UUID(top)))["id"]
        leaf = (await fetch_one(conn, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", mid))["id"]
        results = [Result(str(leases["tt"]["step_id"]), leases["tt"]["lease_generation"], "failed", message="no",
                          permanent=True),
                   Result(str(leases["lt"]["step_id"]), leases["lt"]["lease_generation"], "completed", output=1)]
        async with await psycopg.AsyncConnection.connect(db_url) as x:
            await x.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR NO KEY UPDATE", (mid,))  # X holds M
            batch = asyncio.create_task(e.apply_results(results))
            deadline = time.monotonic() + 30
            while not await fetch(conn, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND query LIKE '%%cyclone_results_apply%%'"):
                assert time.monotonic() < deadline and not batch.done(), "the batch never waited for M"
                await asyncio.sleep(0.02)
            # X now wants L: the batch must not be holding it.
            await x.execute("SET LOCAL lock_timeout = '20s'")
            await x.execute("SELECT 1 FROM cyclone_runs WHERE id = %s FOR NO KEY UPDATE", (leaf,))
            await x.commit()
            statuses = [s for _, _, s in await asyncio.wait_for(batch, 30)]
        assert statuses == ["discarded", "applied"]
        states = {r["id"]: r["state"] for r in await fetch(
            conn, "SELECT id, state FROM cyclone_runs WHERE id = ANY(%s)", [uuid.UUID(top), mid, leaf])}
        assert states == {uuid.UUID(top): "failed", mid: "cancelled", leaf: "completed"}
    finally:
        await e.close()
