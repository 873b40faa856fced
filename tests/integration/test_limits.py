"""Flow control on a real Postgres (docs/flow-control.md): concurrency limits per key that racing
claimers on several engines never exceed, slots given back exactly once on every path that
ends a lease, rate limits, strategies, limits of whole runs, fair dispatch, and bad input."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from engine_helpers import (eventually, expire_lease, fetch, fetch_one, history_from, lock_waits_are, make_due, nested_plans,
                            partition_parents, plan_nodes,
                            start, task, violations, wide_nodes)

from cyclone_server import definitions, limit_spec
from cyclone_server.errors import InvalidArgument, NotFound
from cyclone_server.records import Job, Result
from cyclone_server.store.engine import Engine
from cyclone_server.stream.conn import WorkerConn
from cyclone_server.stream.dispatcher import Dispatcher

pytestmark = pytest.mark.statemachine


def limit(name: str, **fields: Any) -> dict[str, Any]:
    return limit_spec.normalize_limit({"name": name, **fields})


async def jobs(engine: Engine, kind: str, inputs: list[Any], **options: Any) -> list[tuple[str, str, bool]]:
    return await engine.enqueue_many([Job(kind, input=i, options=options) for i in inputs])


async def claim(engine: Engine, kind: str, n: int, owner: str = "w1", ttl: float = 30.0) -> list[dict[str, Any]]:
    return await engine.claim(owner, [kind], n, ttl)


def tenants_of(leases: list[dict[str, Any]]) -> list[str]:
    return [lease["input"]["tenant"] for lease in leases]


async def running_per_key(conn, name: str) -> dict[str, int]:
    rows = await fetch(conn, "SELECT key, running FROM cyclone_limit_keys_stats(%s, 1000)", name)
    return {r["key"]: r["running"] for r in rows}



async def test_a_limited_claim_takes_its_picked_steps_within_their_days(engine: Engine, conn) -> None:
    """The claim's statements over the steps flow control picked (locking them, admitting
    their runs, merging them with the free ones, taking their starts), and an arrival's locks,
    go by id = ANY, which prunes no day of history in a generic plan: bounded by the steps'
    days, they read no day of a month before them."""
    await history_from(conn, 30)
    parents = await partition_parents(conn)
    table_of = {r["ix"]: r["tab"] for r in await fetch(conn, "SELECT indexrelid::regclass::text AS ix, "
                                                             "indrelid::regclass::text AS tab FROM pg_index")}
    past = {f"{t}_{r['suffix']}" for r in await fetch(conn, "SELECT suffix FROM cyclone_history_days "
                                                            "WHERE hi <= cyclone__day_uuid(now())")
            for t in ("cyclone_runs", "cyclone_steps")}
    assert len(past) == 2 * 31
    await engine.set_limit(limit("tenants", max_running=2, kinds=["work"], key_path="input.tenant"))
    await jobs(engine, "work", [{"tenant": t} for t in "aaabbc"])
    await jobs(engine, "free", [{}])  # no limit: claimed beside the picked ones
    plans = await nested_plans(conn, "SELECT input FROM cyclone__steps_claim('w1', ARRAY['work', 'free'], 10, '30 s')",
                               analyze=True)
    claimed = await fetch(conn, "SELECT input FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id "
                                "WHERE s.state = 'running'")
    assert Counter(r["input"].get("tenant") for r in claimed) == {"a": 2, "b": 2, "c": 1, None: 1}
    # An arrival's locks (cyclone__arrivals_lock, as a submit and a promotion take them) go by
    # the steps' ids too.
    # (under a generic plan, as a results batch and a submit run them; a custom plan prunes with the ids known)
    ids = [r["id"] for r in await fetch(conn, "SELECT id FROM cyclone_steps WHERE kind = 'work'")]
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    plans += await nested_plans(conn, "SELECT cyclone__arrivals_lock(%s::uuid[])", ids, analyze=True)
    await conn.execute("RESET plan_cache_mode")
    mine = [plan for text, plan in plans if "ANY (limited)" in text or "ANY (picked)" in text or "ids || picked" in text
            or "WITH mine AS MATERIALIZED" in text  # (the starts this claim took: cyclone__limits_take)
            or "ANY (p_step_ids)" in text]
    assert len(mine) >= 6
    read = {table_of.get(name, name) for plan in mine for n in plan_nodes(plan)
            if (name := n.get("Index Name") or n.get("Relation Name")) and n.get("Actual Loops", 0) > 0}
    assert {t for t in read if t in parents} and not read & past, sorted(read & past)


# -- concurrency -------------------------------------------------------------------------


async def test_a_key_never_runs_more_than_its_limit(engine: Engine, conn) -> None:
    await engine.set_limit(limit("tenants", max_running=2, kinds=["work"], key_path="input.tenant"))
    await jobs(engine, "work", [{"tenant": t} for t in "aaaaabbbc"])
    first = await claim(engine, "work", 10)
    assert Counter(tenants_of(first)) == {"a": 2, "b": 2, "c": 1}
    assert await claim(engine, "work", 10) == []
    assert await running_per_key(conn, "tenants") == {"a": 2, "b": 2, "c": 1}
    a = next(lease for lease in first if lease["input"]["tenant"] == "a")
    assert await engine.complete(a["step_id"], a["lease_generation"], None) == "applied"
    assert tenants_of(await claim(engine, "work", 10)) == ["a"]


async def test_a_key_at_its_limit_costs_the_other_keys_nothing(engine: Engine, conn) -> None:
    """20,000 steps of one tenant wait behind its limit of 1; a claim still finds the other
    tenants' steps at once, reading a bounded number of rows (the fair order interleaves the
    keys), never the held backlog."""
    await engine.set_limit(limit("tenants", max_running=1, kinds=["k"], key_path="tenant"))
    for _ in range(20):
        await jobs(engine, "k", [{"tenant": "big"}] * 1000)
    assert tenants_of(await claim(engine, "k", 10)) == ["big"]
    await jobs(engine, "k", [{"tenant": f"small{i}"} for i in range(5)])
    await conn.execute("ANALYZE cyclone_steps")
    plans = await nested_plans(conn, "SELECT input FROM cyclone_steps_claim('w', ARRAY['k'], 10, '30 s')",
                               analyze=True)
    claimed = await fetch(conn, "SELECT r.input ->> 'tenant' AS t FROM cyclone_steps s JOIN cyclone_runs r "
                                "ON r.id = s.run_id WHERE s.state = 'running' ORDER BY 1")
    assert [r["t"] for r in claimed] == ["big"] + [f"small{i}" for i in range(5)]
    for text, plan in plans:
        nodes = plan_nodes(plan)
        assert all(n["Node Type"] != "Seq Scan" for n in nodes), (text, nodes)
        assert max(n["Actual Rows"] * n["Actual Loops"] for n in nodes) <= 10 * 4 + 64, (text, nodes)


async def test_one_kinds_held_backlog_does_not_hide_anothers_claimable_step(engine: Engine) -> None:
    """Each kind's fair places count from its own virtual time: a worker of two limited kinds
    sees the one that has room, however long the other's held backlog."""
    await engine.set_limit(limit("x", kinds=["x"], key_path="n"))
    await engine.set_limit(limit("y", max_running=1, kinds=["y"]))
    await jobs(engine, "x", [{"n": i % 3} for i in range(600)])
    for lease in await claim(engine, "x", 599):  # x's virtual time moves far ahead (to about 200)
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    await jobs(engine, "y", list(range(100)))
    assert len(await claim(engine, "y", 1)) == 1  # y at its cap: 99 held, at places 1 to 99
    got = await engine.claim("w", ["x", "y"], 1, 30)
    assert [lease["kind"] for lease in got] == ["x"]


async def test_a_free_key_behind_a_window_of_held_steps_is_claimed(engine: Engine, conn) -> None:
    """One key's held backlog fills the claim's window (here at a higher priority, so the fair
    order cannot interleave it): a step of a free key further back is still claimed, and
    next_due says it is due rather than leaving idle workers waiting for new work."""
    await engine.set_limit(limit("tenants", max_running=1, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(300)], priority=-1)
    assert tenants_of(await claim(engine, "k", 5)) == ["big"]  # its cap: 299 held at the front
    await jobs(engine, "k", [{"tenant": "small"}])
    assert await engine.next_due(["k"]) <= 0.0
    await conn.execute("ANALYZE cyclone_steps")
    plans = await nested_plans(conn, "SELECT input FROM cyclone_steps_claim('w', ARRAY['k'], 5, '30 s')",
                               analyze=True)
    claimed = await fetch(conn, "SELECT r.input ->> 'tenant' AS t FROM cyclone_steps s JOIN cyclone_runs r "
                                "ON r.id = s.run_id WHERE s.state = 'running' ORDER BY 1")
    assert [r["t"] for r in claimed] == ["big", "small"]
    for text, plan in plans:  # the window, then one probe per key: never the held backlog
        nodes = plan_nodes(plan)
        assert max(n["Actual Rows"] * n["Actual Loops"] for n in nodes) <= 5 * 4 + 64, (text, nodes)
    assert await engine.next_due(["k"]) is None


async def test_a_heavy_weight_key_at_its_cap_does_not_hide_a_light_one(engine: Engine) -> None:
    """A weight of 1,000 places a key's steps a thousandth apart: hundreds of them stand before
    the next step of a weight-1 key. When the heavy key is at its cap, the light one still runs."""
    await engine.set_limit(limit("tenants", max_running=2, kinds=["k"], key_path="tenant",
                                 weights={"gold": 1000}))
    await jobs(engine, "k", [{"tenant": "gold"}] * 400 + [{"tenant": "std"}] * 2)
    first = await claim(engine, "k", 3)
    assert Counter(tenants_of(first)) == {"gold": 2, "std": 1}  # gold at its cap of 2
    std = next(lease for lease in first if lease["input"]["tenant"] == "std")
    assert await engine.complete(str(std["step_id"]), std["lease_generation"], None) == "applied"
    # std's second step stands at fair place 1.0, behind 398 held steps of gold (0.002 to 0.399).
    assert tenants_of(await claim(engine, "k", 10)) == ["std"]


async def test_a_cap_set_while_a_claim_is_in_flight_is_not_overrun(engine: Engine, db_url: str) -> None:
    """A claim under a limit without a cap (fair order only) is still open when SetLimit gives
    the limit a cap of 1: another claim must not count the key's running steps without the
    first claim's, so it skips the key (locked by the first) rather than adding one more, and
    it does not wait for the first to commit."""
    import psycopg
    await engine.set_limit(limit("t", kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "x"}] * 7)
    [seen] = await claim(engine, "k", 1)  # the key's row exists (a new key's insert waits for its commit)
    await engine.complete(str(seen["step_id"]), seen["lease_generation"], None)
    async with await psycopg.AsyncConnection.connect(db_url) as first:  # a transaction left open
        cur = await first.execute("SELECT step_id FROM cyclone_steps_claim('w1', ARRAY['k'], 3, '30 s')")
        assert len(await cur.fetchall()) == 3
        await engine.set_limit(limit("t", kinds=["k"], key_path="tenant", max_running=1))
        assert await asyncio.wait_for(engine.claim("w2", ["k"], 5, 30), 10) == []
        await first.commit()
    assert await engine.claim("w2", ["k"], 5, 30) == []  # 3 running, cap 1: the cap holds from now on


async def test_a_free_key_behind_more_held_keys_than_a_window_is_claimed(engine: Engine, conn) -> None:
    """200 keys at their cap, each with a step waiting at a higher priority, and one free key:
    the walk judges every other key's head, however many; next_due reads each key's usage once
    (no pass over the running steps per key)."""
    await engine.set_limit(limit("tenants", max_running=1, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": f"t{i:03}"} for i in range(200)] * 2, priority=-1)
    assert len(await claim(engine, "k", 200)) == 200  # each key at its cap, one step of each held
    await jobs(engine, "k", [{"tenant": "free"}])
    await conn.execute("ANALYZE cyclone_steps")
    plans = await nested_plans(conn, "SELECT cyclone__limits_next_due(ARRAY['k'])", analyze=True)
    assert wide_nodes(plans, 4 * 201) == {}
    assert await engine.next_due(["k"]) <= 0.0
    assert tenants_of(await claim(engine, "k", 1)) == ["free"]
    assert await engine.next_due(["k"]) is None


async def test_next_due_walks_the_keys_when_a_rate_holds_the_window(engine: Engine) -> None:
    """The window is one key's backlog held by its rate (due in a minute): next_due still finds
    another key's step claimable now, as the claim does."""
    await engine.set_limit(limit("api", rate=1, period=60.0, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(100)], priority=-1)
    assert tenants_of(await claim(engine, "k", 5)) == ["big"]
    await jobs(engine, "k", [{"tenant": "small"}])
    assert await engine.next_due(["k"]) <= 0.0
    assert tenants_of(await claim(engine, "k", 5)) == ["small"]
    assert 50.0 < await engine.next_due(["k"]) <= 60.05


async def test_a_claim_reads_one_chunk_of_a_backlog_its_rate_holds(engine: Engine, conn) -> None:
    """A rate's backlog is claimed for every time a start comes due (100 times a second for a
    rate of 100 per second, by every server): when the first chunk of the window is one key
    out of starts and no other key has a waiting step, the claim reads no more of its
    backlog. Another key's step, once there, is taken as before."""
    await engine.set_limit(limit("api", rate=1, period=60.0, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(1000)], priority=-1)
    assert tenants_of(await claim(engine, "k", 5)) == ["big"]
    await conn.execute("ANALYZE cyclone_steps")
    plans = await nested_plans(conn, "SELECT input FROM cyclone_steps_claim('w', ARRAY['k'], 64, '30 s')",
                               analyze=True)
    read = sum(n["Actual Rows"] * n["Actual Loops"] for _, plan in plans for n in plan_nodes(plan)
               if n["Node Type"].startswith("Index") and n.get("Relation Name") == "cyclone_steps")
    assert read <= 2 * (64 + 16), read  # the first chunk (the claim's size + 16), not the window (4 x + 64)
    await jobs(engine, "k", [{"tenant": "small"}])
    assert tenants_of(await claim(engine, "k", 64)) == ["small"]


def fair_use(key: str) -> dict[str, Any]:
    return {"limits": [{"limit": "fair", "key": key}]}


async def test_behind_a_held_backlog_a_claim_fills_with_the_next_keys_steps_in_priority_order(engine: Engine) -> None:
    """A key held by its rate has a backlog at the highest priority; behind it, keys of an
    ordering limit: hi (10 steps, priority -1) and lo (100, priority 0). One claim of 64 takes
    every hi step before any lo step, and fills itself from lo's: a claim that gave up on the
    held backlog after its first chunk would take one step per key (hi's first, then lo's)."""
    await engine.set_limit(limit("api", rate=1, period=60.0))
    await engine.set_limit(limit("fair"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(100)], priority=-2,
               limits=[{"limit": "api", "key": "big"}])
    assert tenants_of(await claim(engine, "k", 5)) == ["big"]
    await jobs(engine, "k", [{"tenant": "hi", "n": i} for i in range(10)], priority=-1, **fair_use("hi"))
    await jobs(engine, "k", [{"tenant": "lo", "n": i} for i in range(100)], **fair_use("lo"))
    assert tenants_of(await claim(engine, "k", 64)) == ["hi"] * 10 + ["lo"] * 54


async def test_steps_whose_first_limit_was_deleted_are_free_behind_a_held_backlog(engine: Engine) -> None:
    await engine.set_limit(limit("api", rate=1, period=60.0))
    await engine.set_limit(limit("old"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(30)], priority=-1,
               limits=[{"limit": "api", "key": "big"}])
    assert len(await claim(engine, "k", 1)) == 1
    await jobs(engine, "k", [{"tenant": "d", "n": i} for i in range(100)], limits=[{"limit": "old", "key": "d"}])
    await engine.delete_limit("old")
    assert tenants_of(await claim(engine, "k", 20)) == ["d"] * 20


async def test_a_raised_rate_applies_at_the_next_claim(engine: Engine) -> None:
    """1 start per hour, one taken; SetLimit raises it to 100 per 100 s: the key's pace at the
    old rate no longer holds it (its bucket starts anew, with one start; the window still
    counts the first), and the next start comes a pace (1 s) later. (A pace of 10 ms, as at
    100 per second, could pass between the claim and the look at the next due time on a
    loaded machine: it did in CI.)"""
    await engine.set_limit(limit("r", rate=1, period=3600.0, kinds=["k"]))
    await jobs(engine, "k", list(range(5)))
    assert len(await claim(engine, "k", 5)) == 1
    await engine.set_limit(limit("r", rate=100, period=100.0, kinds=["k"]))
    assert len(await claim(engine, "k", 5)) == 1
    assert 0.0 < await engine.next_due(["k"]) <= 1.01


async def test_a_limit_created_while_a_claim_is_in_flight_is_not_overrun(engine: Engine, conn, db_url: str) -> None:
    """A claim judged its steps by their tokens, then waits (here on an old start of its key it
    deletes); meanwhile SetLimit creates limit b (cap 1) for the kind, one step of it running,
    and gives b's token to the waiting steps. The claim does not take steps whose tokens
    changed since it judged them: b is never overrun."""
    import psycopg
    await engine.set_limit(limit("a", rate=1000, period=1.0, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "y"}])
    assert len(await claim(engine, "k", 1)) == 1  # y runs
    await jobs(engine, "k", [{"tenant": "x"}] * 2)
    await conn.execute("INSERT INTO cyclone_limit_keys (limit_name, key) VALUES ('a', 'x')")
    await conn.execute("INSERT INTO cyclone_limit_starts VALUES ('a', 'x', now() - interval '1 hour')")
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_limit_starts WHERE key = 'x' FOR UPDATE")
        second = asyncio.create_task(engine.claim("w2", ["k"], 5, 30))

        async def waiting() -> bool:
            row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                                        "AND wait_event_type = 'Lock'")
            return row["n"] == 1
        await eventually(waiting)
        await engine.set_limit(limit("b", max_running=1, kinds=["k"]))
        await blocker.rollback()
    assert await second == []
    running = await fetch(conn, "SELECT limit_keys FROM cyclone_steps WHERE state = 'running'")
    assert len(running) == 1 and "b\x1f" in running[0]["limit_keys"]
    assert await claim(engine, "k", 5) == []  # b is full


async def test_claims_making_the_same_new_keys_in_other_orders_never_deadlock(engine: Engine, conn,
                                                                              db_url: str) -> None:
    """Claim A (1 step, chunks of 16) makes the new key row of m in its first chunk and, m being
    out of starts, that of a in its second; claim B (20 steps, one chunk) makes a's, then m's.
    A is held up in its first chunk (by a lock on an old start of m, which it deletes), so B
    makes a's row and meets A's m: B does not wait for A (it skips those keys this time)."""
    import psycopg
    await engine.set_limit(limit("r", rate=1, period=60.0, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "m", "n": i} for i in range(16)], priority=-1)
    await jobs(engine, "k", [{"tenant": "a", "n": i} for i in range(60)])
    await conn.execute("INSERT INTO cyclone_limit_starts VALUES ('r', 'm', now() - interval '1 hour'), "
                       "('r', 'm', now())")  # m: out of starts, and an old start to delete
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_limit_starts WHERE at < now() - interval '1 minute' FOR UPDATE")

        async def waiting(n: int) -> bool:
            row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                                        "AND wait_event_type = 'Lock'")
            return row["n"] == n
        a = asyncio.create_task(engine.claim("wA", ["k"], 1, 30))
        await eventually(lambda: waiting(1))
        b = await asyncio.wait_for(engine.claim("wB", ["k"], 20, 30), 10)
        await blocker.rollback()
    got = [b, await a]
    assert sum(len(x) for x in got) <= 1  # a's single start of the minute, if its row was made
    await eventually(lambda: waiting(0))


async def test_delete_limit_beside_a_claim_holding_its_keys_never_deadlocks(engine: Engine, conn,
                                                                           db_url: str) -> None:
    """A claim holds key x of rate limit r and waits (on an old start of x, which it deletes);
    DeleteLimit r starts meanwhile. The claim, let go, records its start, which needs r's row:
    had the delete kept r's row while its cascade waited for x, each would wait for the other
    (a deadlock, one of them UNAVAILABLE). The delete gives way instead: both succeed, and the
    limit is gone with its keys and starts."""
    import psycopg
    await engine.set_limit(limit("r", rate=100, period=1.0, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "x"}])
    await conn.execute("INSERT INTO cyclone_limit_keys (limit_name, key) VALUES ('r', 'x')")
    await conn.execute("INSERT INTO cyclone_limit_starts VALUES ('r', 'x', now() - interval '1 hour')")

    async def claim_waiting() -> bool:
        row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock'")
        return row["n"] == 1

    async def deleting() -> bool:
        row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active' "
                                    "AND query LIKE '%%cyclone_limit_delete%%' AND pid <> pg_backend_pid()")
        return row["n"] == 1

    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_limit_starts WHERE key = 'x' FOR UPDATE")
        claiming = asyncio.create_task(engine.claim("w1", ["k"], 1, 30))
        await eventually(claim_waiting)
        delete = asyncio.create_task(engine.delete_limit("r"))
        await eventually(deleting)
        await blocker.rollback()
    got = await asyncio.wait_for(claiming, 30)
    await asyncio.wait_for(delete, 30)
    assert len(got) == 1
    assert await engine.list_limits() == []
    left = await fetch_one(conn, "SELECT (SELECT count(*) FROM cyclone_limit_keys) + "
                                 "(SELECT count(*) FROM cyclone_limit_starts) AS n")
    assert left["n"] == 0


async def test_delete_limit_beside_a_placement_holding_its_clock_never_deadlocks(engine: Engine, conn,
                                                                                 db_url: str) -> None:
    """A transaction placed a step of limit t (it holds the key's fair clock) and then takes a key
    of t (an arrival), which needs t's row. DeleteLimit, holding t's row, would wait for the
    clock: it gives way instead, and deletes t once the other transaction is done."""
    import psycopg
    await engine.set_limit(limit("t", strategy="keep_newest", kinds=["k"], key="all"))
    await jobs(engine, "k", [{}])  # the key's clock exists
    async with await psycopg.AsyncConnection.connect(db_url) as other:
        await other.execute("SELECT cyclone__fair_at('t' || chr(31) || 'all', 'k')")
        deleting = asyncio.create_task(engine.delete_limit("t"))

        async def delete_running() -> bool:
            row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active' "
                                        "AND query LIKE '%%cyclone_limit_delete%%' AND pid <> pg_backend_pid()")
            return row["n"] == 1
        await eventually(delete_running)
        await other.execute("SELECT cyclone__limit_key_lock('t', 'other')")
        await other.rollback()
    await asyncio.wait_for(deleting, 30)
    assert await engine.list_limits() == []


async def test_steps_without_limits_are_claimed_as_before_beside_held_ones(engine: Engine) -> None:
    await engine.set_limit(limit("one", max_running=1, kinds=["held"]))
    await jobs(engine, "held", [1, 2, 3])
    free = await jobs(engine, "free", [1, 2, 3])
    got = await engine.claim("w1", ["held", "free"], 10, 30)
    assert [lease["kind"] for lease in got].count("held") == 1
    assert sorted(str(lease["step_id"]) for lease in got if lease["kind"] == "free") == sorted(s for _, s, _ in free)


async def test_racing_claimers_on_several_engines_never_exceed_a_limit(db_url: str, engine: Engine) -> None:
    """Nine engines (nine servers' pools) claim and complete 600 jobs of 6 tenants, limit 3 each:
    no tenant ever has more than 3 leases at once, and every job completes exactly once."""
    await engine.set_limit(limit("tenants", max_running=3, kinds=["race"], key_path="tenant"))
    await jobs(engine, "race", [{"tenant": f"t{i % 6}", "n": i} for i in range(600)])
    engines = [await Engine.open(db_url, min_size=1, max_size=2) for _ in range(9)]
    held: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    done: Counter[int] = Counter()

    async def claimer(i: int, e: Engine) -> None:
        rng = random.Random(i)
        idle = 0
        while idle < 50:
            leases = await e.claim(f"w{i}", ["race"], rng.randint(1, 8), 30)
            if not leases:
                idle += 1
                await asyncio.sleep(0.005)
                continue
            idle = 0
            for lease in leases:
                t = lease["input"]["tenant"]
                held[t] += 1
                most[t] = max(most[t], held[t])
            await asyncio.sleep(rng.random() * 0.01)
            for lease in leases:
                held[lease["input"]["tenant"]] -= 1  # before the completion commits: a subset of its lease
                assert await e.complete(lease["step_id"], lease["lease_generation"], None) == "applied"
                done[lease["input"]["n"]] += 1

    try:
        await asyncio.gather(*(claimer(i, e) for i, e in enumerate(engines)))
    finally:
        for e in engines:
            await e.close()
    assert max(most.values()) <= 3, dict(most)
    assert min(most.values()) == 3  # the limit, not a lack of racing, held them
    assert sorted(done) == list(range(600)) and set(done.values()) == {1}


@pytest.mark.parametrize("path", ["complete", "retry", "snooze", "discard", "expire", "release", "timeout",
                                  "cancel"])
async def test_every_end_of_a_lease_gives_its_slot_back_once(engine: Engine, conn, path: str) -> None:
    await engine.set_limit(limit("solo", max_running=1, kinds=["one"]))
    (r1, s1, _), (r2, s2, _) = await jobs(engine, "one", ["first", "second"], backoff_initial=60.0,
                                           backoff_max=60.0, max_attempts=5)
    [lease] = await claim(engine, "one", 5)
    assert lease["input"] == "first" and await claim(engine, "one", 5) == []
    sid, gen = str(lease["step_id"]), lease["lease_generation"]
    if path == "complete":
        assert await engine.complete(sid, gen, None) == "applied"
    elif path == "retry":
        assert await engine.fail(sid, gen, "again") == "retried"
    elif path == "snooze":
        assert await engine.snooze(sid, gen, 60) == "snoozed"
    elif path == "discard":
        assert await engine.fail(sid, gen, "no", permanent=True) == "discarded"
    elif path == "expire":
        await expire_lease(conn, sid)
        assert (await engine.sweep())["leases_sweep"] == 1
    elif path == "release":
        assert len(await engine.release("w1", [(sid, gen)])) == 1
    elif path == "timeout":
        await conn.execute("UPDATE cyclone_steps SET attempt_deadline = now() - interval '1s' WHERE id = %s", (sid,))
        await conn.execute("SELECT * FROM cyclone_attempts_timeout(10)")
    elif path == "cancel":
        assert await engine.cancel_run(r1)
    [second] = await claim(engine, "one", 5)
    assert second["input"] == "second"
    assert await claim(engine, "one", 5) == []  # one slot came back, not two
    assert await running_per_key(conn, "solo") == {"": 1}


async def test_a_paused_run_keeps_its_running_slot_and_holds_no_queued_one(engine: Engine, conn) -> None:
    await engine.set_limit(limit("solo", max_running=1, kinds=["one"]))
    (r1, _, _), (r2, _, _), (r3, _, _) = await jobs(engine, "one", [1, 2, 3])
    [lease] = await claim(engine, "one", 5)
    await engine.pause_run(r1)  # the running step runs on under its lease: its slot stays taken
    assert await claim(engine, "one", 5) == []
    await engine.pause_run(r2)
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], None) == "applied"
    assert [x["input"] for x in await claim(engine, "one", 5)] == [3]


async def test_raising_a_limit_frees_held_steps_at_the_next_claim(engine: Engine) -> None:
    await engine.set_limit(limit("cap", max_running=1, kinds=["k"]))
    await jobs(engine, "k", [1, 2, 3])
    assert len(await claim(engine, "k", 5)) == 1
    await engine.set_limit(limit("cap", max_running=3, kinds=["k"]))
    assert len(await claim(engine, "k", 5)) == 2
    await engine.delete_limit("cap")
    await jobs(engine, "k", [4, 5])
    assert len(await claim(engine, "k", 5)) == 2  # deleted: nothing holds them


async def test_a_limit_created_for_a_kind_holds_its_queue_and_counts_its_running_steps(engine: Engine) -> None:
    await jobs(engine, "late", [{"tenant": "a"}] * 4)
    assert len(await claim(engine, "late", 1)) == 1
    await engine.set_limit(limit("late", max_running=2, kinds=["late"], key_path="tenant"))
    assert len(await claim(engine, "late", 5)) == 1  # the one running already counts


async def test_a_limit_set_while_an_enqueue_is_in_flight_applies_to_its_jobs(engine: Engine, db_url: str,
                                                                             conn) -> None:
    """The enqueue read no limit; SetLimit waits for it to commit, and its backfill then sees its jobs."""
    import psycopg
    node = definitions.normalize_job("k", {})
    async with await psycopg.AsyncConnection.connect(db_url) as t1:
        await t1.execute("SELECT * FROM cyclone_jobs_enqueue(%s::jsonb)",
                         [json.dumps([{"node": node, "input": i} for i in range(3)])])
        setting = asyncio.create_task(engine.set_limit(limit("late", max_running=1, kinds=["k"])))

        async def set_limit_waits() -> bool:
            row = await fetch_one(conn, "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' "
                                        "AND NOT granted")
            return row["n"] == 1
        await eventually(set_limit_waits)
        assert not setting.done()
        await t1.commit()
        await asyncio.wait_for(setting, 10)
    assert len(await claim(engine, "k", 5)) == 1


async def test_a_node_consumes_the_limits_it_names_under_keys_from_the_input(engine: Engine, conn) -> None:
    await engine.set_limit(limit("db", max_running=1))
    await engine.set_limit(limit("api", max_running=5))
    nodes = [task("load", limits=[{"limit": "db", "key_path": "input.region"}, {"limit": "api", "key": "x"}])]
    r1 = await start(engine, nodes, input={"region": "eu"})
    r2, _ = await engine.submit_run("wf", input={"region": "eu"})
    r3, _ = await engine.submit_run("wf", input={"region": "us"})
    got = await claim(engine, "load", 5)
    assert sorted(str(lease["run_id"]) for lease in got) == sorted([r1, r3])
    row = await fetch_one(conn, "SELECT limit_keys FROM cyclone_steps WHERE run_id = %s", r2)
    assert row["limit_keys"] == ["db\x1feu", "api\x1fx"]
    held = (await engine.get_run(r2))["steps"][0]["held_by"]
    assert held == "limit db key eu: 1/1 running"


# -- rate limits ---------------------------------------------------------------------------


async def test_a_rate_paces_its_starts_and_says_when_the_next_is_due(engine: Engine, conn) -> None:
    """20 starts per 10 s: one start (a new key's bucket), then a start every 1/20 of the window,
    at most 2 at once for a claim that comes late (cyclone__rate_left), whatever the claims
    ask; next_due says when the next is allowed."""
    await engine.set_limit(limit("rps", rate=20, period=10.0, kinds=["call"]))
    await jobs(engine, "call", list(range(30)))
    first = await claim(engine, "call", 10)
    assert [x["input"] for x in first] == [0]
    for lease in first:  # finishing does not give starts back: the window does
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    assert await claim(engine, "call", 10) == []
    pace = 10.05 / 20  # the period and its margin (cyclone__rate_window), per start
    due = await engine.next_due(["call"])
    assert due is not None and 0.0 < due <= pace
    waiting = await fetch_one(conn, "SELECT run_id FROM cyclone_steps WHERE state = 'available' ORDER BY id LIMIT 1")
    held_by = (await engine.get_run(str(waiting["run_id"])))["steps"][0]["held_by"]
    assert held_by.startswith('limit rps key "": 1/20 starts per 10 s, paced at one per 0.503 s, the next in 0.'), held_by
    got = [x["input"] for x in first]
    while len(got) < 5:
        await asyncio.sleep(max(await engine.next_due(["call"]), 0.0) + 0.005)  # when the database says
        taken = await claim(engine, "call", 10)
        assert 1 <= len(taken) <= 2
        got += [x["input"] for x in taken]
    assert got[:5] == list(range(5))
    starts = [r["at"] for r in await fetch(conn, "SELECT at FROM cyclone_limit_starts ORDER BY at")]
    for i in range(len(starts)):  # the pace: at most the burst, and one per pace, in any span
        for j in range(i, len(starts)):
            assert j - i + 1 <= 2 + (starts[j] - starts[i]).total_seconds() / pace + 1e-6, (i, j, starts)


async def test_a_rate_holds_its_quota_in_the_window(engine: Engine, conn) -> None:
    """2 starts per second: the first, the second a pace later (half the window), then the third
    waits for the first to leave the window, and GetRun says so."""
    await engine.set_limit(limit("rps", rate=2, period=1.0, kinds=["call"]))
    await jobs(engine, "call", list(range(5)))
    assert [x["input"] for x in await claim(engine, "call", 10)] == [0]
    await asyncio.sleep(await engine.next_due(["call"]) + 0.005)
    assert [x["input"] for x in await claim(engine, "call", 10)] == [1]
    assert await claim(engine, "call", 10) == []
    due = await engine.next_due(["call"])
    assert due is not None and 0.0 < due <= 1.01
    waiting = await fetch_one(conn, "SELECT run_id FROM cyclone_steps WHERE state = 'available' ORDER BY id LIMIT 1")
    held_by = (await engine.get_run(str(waiting["run_id"])))["steps"][0]["held_by"]
    assert re.fullmatch(r'limit rps key "": 2/2 starts per 1 s, the next in \d\.\d s', held_by), held_by
    await asyncio.sleep(due + 0.005)
    assert [x["input"] for x in await claim(engine, "call", 10)] == [2]  # the first left


async def test_a_rated_start_counts_from_the_push_of_its_lease(engine: Engine, conn) -> None:
    """A start against a rate counts from its claim until the server reports its lease written to
    the worker (cyclone_limit_starts_pushed), then from that moment: a lease pushed late (here a
    whole window after its claim, as if the claim's commit or the server had stalled) keeps its
    start in the window from the push. Reported again, it moves no more. Claims say which rows
    are rated."""
    await engine.set_limit(limit("r", rate=1, period=1.0, kinds=["k"]))
    await jobs(engine, "k", [1, 2])
    await jobs(engine, "free", [1])
    [first] = await engine.claim_leases("w1", ["k"], 5, 30.0)  # the dispatcher's claim
    [free] = await engine.claim_leases("w1", ["free"], 5, 30.0)
    assert first.rated and not free.rated
    row = await fetch_one(conn, "SELECT step_id::text, pushed FROM cyclone_limit_starts")
    assert (row["step_id"], row["pushed"]) == (first.step_id, False)
    # As if claimed 5 s ago: its window and the bucket's pace have passed.
    await conn.execute("UPDATE cyclone_limit_starts SET at = at - interval '5 s'")
    await conn.execute("UPDATE cyclone_limit_keys SET paced = paced - interval '5 s'")
    assert await engine.next_due(["k"]) <= 0.0
    before = (await fetch_one(conn, "SELECT clock_timestamp() AS t"))["t"]
    assert await engine.limit_starts_pushed([first.step_id, free.step_id]) == 1
    row = await fetch_one(conn, "SELECT at, pushed FROM cyclone_limit_starts")
    assert row["pushed"] and row["at"] >= before
    assert await claim(engine, "k", 5) == []  # one start per window, counted from the push
    assert 0.9 < await engine.next_due(["k"]) <= 1.01
    assert await engine.limit_starts_pushed([first.step_id]) == 0


async def test_a_push_moves_its_own_lease_start_not_an_earlier_unpushed_one(engine: Engine, conn) -> None:
    """A lease released before it was pushed (its worker went away) leaves a start that stays
    counted from its claim; the step's next lease, pushed, moves its own start only."""
    await engine.set_limit(limit("r", rate=10, period=60.0, kinds=["k"]))
    await jobs(engine, "k", [1])
    [lease] = await claim(engine, "k", 1, owner="gone")
    assert await engine.release("gone", [(str(lease["step_id"]), lease["lease_generation"])])
    await conn.execute("UPDATE cyclone_limit_keys SET paced = NULL")  # a start left in the bucket
    [again] = await claim(engine, "k", 1, owner="w2")
    assert again["step_id"] == lease["step_id"]
    before = await fetch(conn, "SELECT at FROM cyclone_limit_starts ORDER BY at")
    assert len(before) == 2
    assert await engine.limit_starts_pushed([str(again["step_id"])]) == 1
    after = await fetch(conn, "SELECT at, pushed FROM cyclone_limit_starts ORDER BY at")
    assert [r["pushed"] for r in after] == [True, True]
    assert after[0]["at"] == before[0]["at"] and after[1]["at"] > before[1]["at"]


async def test_a_claim_records_starts_only_for_the_steps_it_took(engine: Engine, conn) -> None:
    """A claim may choose a step from a snapshot taken before another claim of its key committed
    it: the step is running, but not this claim's start. cyclone__limits_take counts only the
    steps leased to its owner by its own transaction."""
    await engine.set_limit(limit("r", rate=10, period=60.0, kinds=["k"], key="one"))
    await jobs(engine, "k", [1, 2, 3])
    [taken] = await claim(engine, "k", 1, owner="w1")
    step = str(taken["step_id"])
    await conn.execute("SELECT cyclone__limits_take(ARRAY[%s]::uuid[], 'w2')", (step,))  # another owner
    await conn.execute("SELECT cyclone__limits_take(ARRAY[%s]::uuid[], 'w1')", (step,))  # another transaction
    starts = await fetch_one(conn, "SELECT count(*) AS n FROM cyclone_limit_starts")
    assert starts["n"] == 1


async def test_a_concurrency_limit_at_its_cap_is_not_due_until_a_slot_frees(engine: Engine) -> None:
    await engine.set_limit(limit("cap", max_running=1, kinds=["k"]))
    await jobs(engine, "k", [1, 2])
    [lease] = await claim(engine, "k", 5)
    assert await engine.next_due(["k"]) is None  # no polling: the slot's release wakes the dispatchers
    await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    assert await engine.next_due(["k"]) <= 0.0


async def test_a_worker_of_a_kind_held_at_its_cap_is_claimed_for_again_only_after_new_work(engine: Engine) -> None:
    """Freed worker slots (results of other kinds) wake the dispatcher many times a second: a kind
    whose claim found nothing due is not claimed for again until new work is announced (here by
    hand: the NOTIFY of the freed limit slot, or an Enqueue), so a held kind costs the others no claims."""
    await engine.set_limit(limit("cap", max_running=1, kinds=["held"]))
    await jobs(engine, "held", [1, 2])
    conn = WorkerConn(worker_id="w", kinds=["held"], slots=4)
    dispatcher = Dispatcher(engine, lambda: [conn], lease_ttl=30, stats={"claims": Counter()}, claim_pace=0)
    claims: list[list[str]] = []
    real = engine.claim_leases

    async def counted(owner: str, kinds: list[str], n: int, ttl: float) -> list[Any]:
        claims.append(list(kinds))
        return await real(owner, kinds, n, ttl)

    engine.claim_leases = counted  # type: ignore[method-assign]
    assert await dispatcher._pass() is None and len(conn.held) == 1  # the other is held: nothing due
    for _ in range(5):
        await dispatcher._pass()
    assert len(claims) == 1
    lease = next(iter(conn.held.values()))
    step_id, gen = next(iter(conn.held))
    assert await engine.complete(step_id, gen, None) == "applied"
    conn.held.clear()
    dispatcher.new_work()  # the slot's NOTIFY
    await dispatcher._pass()
    assert len(claims) == 2 and len(conn.held) == 1 and lease.kind == "held"


async def test_delayed_limited_steps_become_claimable_when_due(engine: Engine, conn) -> None:
    await engine.set_limit(limit("cap", max_running=5, kinds=["k"]))
    [(run_id, _, _)] = await jobs(engine, "k", [1])
    [lease] = await claim(engine, "k", 5)
    assert await engine.snooze(str(lease["step_id"]), lease["lease_generation"], 3600) == "snoozed"
    assert await claim(engine, "k", 5) == []
    assert 3500 < await engine.next_due(["k"]) <= 3600
    await make_due(conn, run_id)
    assert len(await claim(engine, "k", 5)) == 1


async def test_a_limit_of_runs_with_a_rate_counts_each_admission_once(engine: Engine, conn) -> None:
    await engine.set_limit(limit("runs2", scope="runs", workflows=["wf"], rate=10, period=60))
    await engine.register_workflow("wf", [task("a", kind="k")])  # a burst of 2 admissions
    for i in range(3):
        await engine.submit_run("wf", input={"i": i})
    assert len(await claim(engine, "k", 1)) == 1
    assert (await fetch_one(conn, "SELECT count(*) AS n FROM cyclone_limit_starts"))["n"] == 1
    await conn.execute("UPDATE cyclone_limit_keys SET paced = now()")  # the pace's 6 s passed: a full bucket
    assert len(await claim(engine, "k", 10)) == 2  # the bucket's 2 starts, not one fewer for the run admitted


async def shuffled_batches(db_url: str, rounds: int, per_tenant: int, seed: int) -> None:
    """Six engines each enqueue `rounds` batches of jobs of kind k for tenants t0..t5, every batch
    with its tenants in a random order, `per_tenant` jobs each."""
    engines = [await Engine.open(db_url, min_size=1, max_size=2) for _ in range(6)]
    rng = random.Random(seed)

    async def batches(e: Engine) -> None:
        for _ in range(rounds):
            tenants = [f"t{i}" for i in range(6)]
            rng.shuffle(tenants)
            await jobs(e, "k", [{"tenant": t} for t in tenants for _ in range(per_tenant)])

    try:
        await asyncio.gather(*(batches(e) for e in engines))
    finally:
        for e in engines:
            await e.close()


async def test_batches_of_many_keys_in_any_order_never_deadlock(db_url: str, engine: Engine) -> None:
    """Placing a step in the fair order moves its key's clock (a row locked until commit):
    EnqueueMany places its jobs key by key, so batches of the same keys in other orders wait
    for each other instead of deadlocking."""
    await engine.set_limit(limit("t", kinds=["k"], key_path="tenant"))
    await shuffled_batches(db_url, rounds=6, per_tenant=3, seed=7)
    rows = await engine.list_limits()
    assert sum(k["waiting"] for k in rows[0]["keys"]) == 6 * 6 * 18


async def test_batches_of_many_keys_in_any_order_under_a_strategy_never_deadlock(db_url: str,
                                                                                   engine: Engine) -> None:
    """Each arrival locks its key to judge it; EnqueueMany has locked its keys' fair clocks in one
    order before (placing its jobs), so batches of the same keys in other orders wait for each
    other instead of deadlocking, and cancel_newest leaves exactly max_running per key."""
    await engine.set_limit(limit("t", max_running=2, strategy="cancel_newest", kinds=["k"], key_path="tenant"))
    await shuffled_batches(db_url, rounds=4, per_tenant=2, seed=11)
    rows = await engine.list_limits()
    assert {k["key"]: k["waiting"] for k in rows[0]["keys"]} == {f"t{i}": 2 for i in range(6)}



@pytest.mark.parametrize("strategy", ["queue", "cancel_newest"])
async def test_submits_whose_root_steps_take_keys_in_other_orders_never_deadlock(db_url: str, engine: Engine,
                                                                                strategy: str) -> None:
    """A run's root steps enter available at submit, each placed under its key's fair clock (and
    judged under its key, for a strategy). Node x takes its key from input.first, node y from
    input.second; runs with the keys swapped race on six engines. The clocks and keys are
    locked in one order first, so the submits wait for each other instead of deadlocking."""
    await engine.set_limit(limit("t", max_running=1000, strategy=strategy))
    node = {"kind": "k", "limits": [{"limit": "t", "key_path": ["first"]}]}
    await engine.register_workflow("two", [{**task("x"), **node},
                                           {**task("y"), **node, "limits": [{"limit": "t", "key_path": ["second"]}]}])
    engines = [await Engine.open(db_url, min_size=1, max_size=2) for _ in range(6)]
    keys = [f"t{i}" for i in range(4)]

    async def submits(i: int, e: Engine) -> None:
        rng = random.Random(i)
        for _ in range(15):
            first, second = rng.sample(keys, 2)
            await e.submit_run("two", input={"first": first, "second": second})

    try:
        await asyncio.gather(*(submits(i, e) for i, e in enumerate(engines)))
    finally:
        for e in engines:
            await e.close()
    rows = await engine.list_limits()
    assert sum(k["waiting"] for k in rows[0]["keys"]) == 6 * 15 * 2

# -- strategies ------------------------------------------------------------------------------


async def test_cancel_newest_cancels_an_arrival_beyond_the_limit(engine: Engine, conn) -> None:
    await engine.set_limit(limit("dedupe", max_running=2, strategy="cancel_newest", kinds=["k"], key_path="user"))
    made = await jobs(engine, "k", [{"user": "u"}] * 3 + [{"user": "v"}])
    states = [(await engine.get_run(r))["state"] for r, _, _ in made]
    assert states == ["running", "running", "cancelled", "running"]
    step = (await engine.get_run(made[2][0]))["steps"][0]
    assert step["cancel_cause"] == "limit" and 'limit "dedupe" key "u"' in step["reason"]
    assert await violations(conn) == {}


async def test_cancel_oldest_cancels_the_oldest_running_or_waiting_to_make_room(engine: Engine, conn) -> None:
    await engine.set_limit(limit("latest", max_running=1, strategy="cancel_oldest", kinds=["k"]))
    (r1, s1, _), = await jobs(engine, "k", ["old"])
    [lease] = await claim(engine, "k", 5)
    (r2, _, _), = await jobs(engine, "k", ["new"])
    assert (await engine.get_run(r1))["state"] == "cancelled"  # its handler learns it at its next renewal
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], None) != "applied"
    assert [x["input"] for x in await claim(engine, "k", 5)] == ["new"]
    assert await violations(conn) == {}


async def test_a_claim_placing_a_due_step_never_deadlocks_with_the_keep_newest_arrival_cancelling_it(
        engine: Engine, conn, db_url: str) -> None:
    """A scheduled step of a keep_newest key comes due: a claim places it in the fair order under
    its key's fair clock. A new job of the key holds that clock (its arrival) and cancels the
    older waiting step. The claim waits for the clock before it locks the step (locking the
    step first, it deadlocked with the arrival, one of the two UNAVAILABLE): the new job
    arrives, the old one is cancelled, and the new one is claimed."""
    import psycopg
    await engine.set_limit(limit("d", max_running=1, strategy="keep_newest", kinds=["k"], key_path="doc"))
    [(old_run, _, _)] = await engine.enqueue_many([Job("k", input={"doc": "x", "v": 0}, scheduled_at=datetime.now(timezone.utc) + timedelta(minutes=1))])
    await make_due(conn, old_run)
    node = json.dumps(definitions.normalize_job("k", {}))
    async with await psycopg.AsyncConnection.connect(db_url) as arrival:
        await arrival.execute("SELECT cyclone__fair_keys_lock(ARRAY['k'], ARRAY['d' || chr(31) || 'x'])")
        claiming = asyncio.create_task(claim(engine, "k", 5))
        async def claim_done_or_waiting() -> bool:
            return claiming.done() or await lock_waits_are(conn, 1)
        await eventually(claim_done_or_waiting)
        await arrival.execute("SELECT * FROM cyclone_jobs_enqueue(jsonb_build_array(jsonb_build_object("
                              "'node', %s::jsonb, 'input', '{\"doc\": \"x\", \"v\": 1}'::jsonb)))", (node,))
        await arrival.commit()
        got = await asyncio.wait_for(claiming, 30)
    assert (await engine.get_run(old_run))["state"] == "cancelled"
    assert [x["input"] for x in got + await claim(engine, "k", 5)] == [{"doc": "x", "v": 1}]
    assert await violations(conn) == {}


async def test_a_claim_holding_an_unlimited_step_never_waits_for_a_clock_the_arrival_cancelling_its_run_holds(
        engine: Engine, conn, db_url: str) -> None:
    """Run R has node k (kind k, a keep_newest key d/x) and node u (kind u, no limits), both
    waiting; D is a due step of key f/x not yet placed in the fair order. A new job N of keys
    f/x and d/x arrives: it holds the clock of f/x and cancels R, u included. A claim of k and
    u locks u's row, then needs f/x's clock to place D: it places due steps first, before it
    holds any row (it locked u first, and deadlocked with N, one of the two UNAVAILABLE)."""
    import psycopg
    await engine.set_limit(limit("f"))
    await engine.set_limit(limit("d", max_running=1, strategy="keep_newest"))
    run_r = await start(engine, [task("k", limits=[{"limit": "d", "key": "x"}]), task("u")], input={})
    [(run_d, _, _)] = await engine.enqueue_many([Job("k", input={"d": 1},
                                                     scheduled_at=datetime.now(timezone.utc) + timedelta(minutes=1),
                                                     options={"limits": [{"limit": "f", "key": "x"}]})])
    await make_due(conn, run_d)
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT cyclone__limit_key_lock('d', 'x')")  # N waits here, holding f/x's clock
        arrival = asyncio.create_task(engine.enqueue_many([Job("k", input={"new": 1}, options={
            "limits": [{"limit": "f", "key": "x"}, {"limit": "d", "key": "x"}]})]))
        await eventually(lambda: lock_waits_are(conn, 1))
        claiming = asyncio.create_task(engine.claim("w", ["k", "u"], 5, 30))
        await eventually(lambda: lock_waits_are(conn, 2))
        await blocker.rollback()
        await asyncio.wait_for(asyncio.gather(arrival, claiming), 30)
    assert (await engine.get_run(run_r))["state"] == "cancelled"
    assert await violations(conn) == {}


async def test_clocks_made_and_locked_in_one_order_never_deadlock_with_an_enqueue(engine: Engine, conn,
                                                                                 db_url: str) -> None:
    """A claim places due steps of keys a, b (their clocks exist) and c (no clock yet), and waits
    for a's clock; an EnqueueMany of keys b and c takes their clocks in one sorted pass. The
    claim takes its clocks in that same order, each made or locked in its turn, so it holds
    none of b and c yet and the enqueue goes through (the claim made c's clock before locking
    a and b: the enqueue waited for c, holding b, which the claim then waited for: a deadlock)."""
    import psycopg
    await engine.set_limit(limit("f", kinds=["k"], key_path="tenant"))
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    for run_id, _, _ in await engine.enqueue_many([Job("k", input={"tenant": t}, scheduled_at=later) for t in "abc"]):
        await make_due(conn, run_id)
    await conn.execute("INSERT INTO cyclone_fair_keys VALUES ('k', 'f' || chr(31) || 'a', 0.0), "
                       "('k', 'f' || chr(31) || 'b', 0.0)")
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_fair_keys WHERE kind = 'k' AND token = 'f' || chr(31) || 'a' "
                              "FOR UPDATE")
        claiming = asyncio.create_task(engine.claim("w", ["k"], 5, 30))
        await eventually(lambda: lock_waits_are(conn, 1))
        await asyncio.wait_for(engine.enqueue_many([Job("k", input={"tenant": t}) for t in "bc"]), 10)
        await blocker.rollback()
        got = await asyncio.wait_for(claiming, 30)
    assert sorted(x["input"]["tenant"] for x in got + await claim(engine, "k", 10)) == ["a", "b", "b", "c", "c"]


async def test_a_claim_skips_a_picked_step_that_an_arrival_is_cancelling(engine: Engine, conn, db_url: str) -> None:
    """A new job of keys d/x and e/y (both keep_newest) cancels runs R and R2 (d/x); R's step w
    (key e/y) waits. The arrival has cancelled R and waits for R2's step (held by a blocker). A
    claim of w locks e/y and picks w; it leaves w (its row held by the arrival) instead of
    waiting for it while holding e/y, which the arrival takes next (a deadlock)."""
    await engine.set_limit(limit("d", max_running=5))
    await engine.set_limit(limit("e", max_running=5))
    run_r = await start(engine, [task("k", limits=[{"limit": "d", "key": "x"}]),
                                 task("w", limits=[{"limit": "e", "key": "y"}])], input={})
    [(run_r2, step_r2, _)] = await engine.enqueue_many([Job("k2", input={}, options={"limits": [{"limit": "d", "key": "x"}]})])
    assert str(run_r) < str(run_r2)  # cancelled in this order
    await engine.set_limit(limit("d", max_running=5, strategy="keep_newest"))
    await engine.set_limit(limit("e", max_running=5, strategy="keep_newest"))
    got = await claim_beside_an_arrival_held_at(engine, conn, db_url, step_r2, Job("n", input={"new": 1}, options={
        "limits": [{"limit": "d", "key": "x"}, {"limit": "e", "key": "y"}]}))
    assert got == []
    assert (await engine.get_run(run_r))["state"] == "cancelled"
    assert await violations(conn) == {}


async def claim_beside_an_arrival_held_at(engine: Engine, conn, db_url: str, step_id: Any, job: Job) -> list[Any]:
    """Enqueue `job` while a blocker holds step `step_id`'s row (its arrival, cancelling that
    step's run, waits there); claim kind w meanwhile; then let the arrival go on. Returns the
    claim's leases, once the arrival is done too."""
    import psycopg
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_steps WHERE id = %s FOR UPDATE", (step_id,))
        arrival = asyncio.create_task(engine.enqueue_many([job]))
        await eventually(lambda: lock_waits_are(conn, 1))
        got = await asyncio.wait_for(engine.claim("w", ["w"], 5, 30), 30)
        await blocker.rollback()
        await asyncio.wait_for(arrival, 30)
    return got


async def test_a_claim_skips_a_step_whose_run_a_cancel_holds_before_admitting_it(engine: Engine, conn,
                                                                                  db_url: str) -> None:
    """Run R of a workflow under a limit of runs (not admitted yet) has steps k (key d/x,
    keep_newest) and w. A new job of d/x cancels R: it holds R, and waits for k's row (a
    blocker holds it). A claim of w would admit R when w starts: it leaves w out rather than
    wait for R while it holds w, which the cancel reaches next (a deadlock)."""
    await engine.set_limit(limit("rl", scope="runs", workflows=["wf"], max_running=5))
    await engine.set_limit(limit("d", max_running=5))
    run_r = await start(engine, [task("k", limits=[{"limit": "d", "key": "x"}]), task("w")], input={})
    step_k = (await fetch_one(conn, "SELECT id FROM cyclone_steps WHERE run_id = %s AND node = 'k'", run_r))["id"]
    await engine.set_limit(limit("d", max_running=5, strategy="keep_newest"))
    got = await claim_beside_an_arrival_held_at(engine, conn, db_url, step_k, Job("n", input={"new": 1}, options={
        "limits": [{"limit": "d", "key": "x"}]}))
    assert got == []
    assert (await engine.get_run(run_r))["state"] == "cancelled"
    assert await violations(conn) == {}


async def test_set_limit_places_the_steps_it_backfills_in_clock_order_beside_a_claim(engine: Engine, conn,
                                                                                      db_url: str) -> None:
    """Due steps of tenants b, a and a2 (limit m, not yet placed, in that order in the table); a
    claim placing them waits for a2's clock (a blocker holds it) after taking a's. SetLimit of
    another limit of their kind gives the steps its token, which places them: it takes their
    clocks first, in order, so it waits for a behind the claim (placing b first, row by row, it
    held b's clock, which the claim wanted next: a deadlock, SetLimit UNAVAILABLE)."""
    import psycopg
    await engine.set_limit(limit("m", kinds=["k"], key_path="tenant"))
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    for run_id, _, _ in await engine.enqueue_many([Job("k", input={"tenant": t}, scheduled_at=later)
                                                   for t in ["b", "a", "a2"]]):
        await make_due(conn, run_id)
    await conn.execute("INSERT INTO cyclone_fair_keys VALUES ('k', 'm' || chr(31) || 'a2', 0.0)")
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_fair_keys WHERE kind = 'k' AND token = 'm' || chr(31) || 'a2' "
                              "FOR UPDATE")
        claiming = asyncio.create_task(engine.claim("w", ["k"], 5, 30))
        await eventually(lambda: lock_waits_are(conn, 1))
        setting = asyncio.create_task(engine.set_limit(limit("l", kinds=["k"], max_running=9)))
        await eventually(lambda: lock_waits_are(conn, 2))
        await blocker.rollback()
        got, _ = await asyncio.wait_for(asyncio.gather(claiming, setting), 30)
    assert sorted(x["input"]["tenant"] for x in got + await claim(engine, "k", 5)) == ["a", "a2", "b"]
    assert await violations(conn) == {}


async def test_keep_newest_leaves_only_the_newest_waiting(engine: Engine, conn) -> None:
    await engine.set_limit(limit("debounce", max_running=1, strategy="keep_newest", kinds=["k"], key_path="doc"))
    made = await jobs(engine, "k", [{"doc": "d", "v": i} for i in range(4)] + [{"doc": "e", "v": 9}])
    states = [(await engine.get_run(r))["state"] for r, _, _ in made]
    assert states == ["cancelled", "cancelled", "cancelled", "running", "running"]
    assert sorted(x["input"]["v"] for x in await claim(engine, "k", 5)) == [3, 9]
    assert await violations(conn) == {}


@pytest.mark.parametrize("batched", [False, True])
async def test_a_step_promoted_by_its_dependency_arrives_for_the_strategies(engine: Engine, conn,
                                                                             batched: bool) -> None:
    """A node whose last dependency completes arrives for its key (docs/flow-control.md,
    "Strategies"), whether the completion comes alone or in a worker's batch of results: under
    cancel_newest at max_running 1, with a step of the key already waiting, its run is
    cancelled; under keep_newest the older waiting step's run is."""
    await engine.register_workflow("pipe", [task("pre"), {**task("go", "pre"), "kind": "k"}])
    for strategy, cancelled in (("cancel_newest", "promoted"), ("keep_newest", "waiting")):
        await conn.execute("DELETE FROM cyclone_step_deps; DELETE FROM cyclone_steps; DELETE FROM cyclone_runs")
        await engine.set_limit(limit("one", max_running=1, strategy=strategy, kinds=["k"], key="all"))
        [(waiting, _, _)] = await jobs(engine, "k", ["first"])
        promoted, _ = await engine.submit_run("pipe")
        [lease] = await engine.claim("w", ["pre"], 1, 30)
        if batched:
            [(_, _, status)] = await engine.apply_results([Result(str(lease["step_id"]), lease["lease_generation"],
                                                                  "completed")])
        else:
            status = await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
        assert status == "applied"
        states = {r: (await engine.get_run(r))["state"] for r in (waiting, promoted)}
        assert states == {waiting: "cancelled" if cancelled == "waiting" else "running",
                          promoted: "cancelled" if cancelled == "promoted" else "running"}, (strategy, batched)
        assert await violations(conn) == {}
        await engine.delete_limit("one")


@pytest.mark.parametrize(("strategy", "left"), [("cancel_newest", 0), ("keep_newest", 1)])
async def test_steps_promoted_in_one_batch_arrive_in_order(engine: Engine, strategy: str, left: int) -> None:
    """Two runs' pre complete in one batch of results: their go steps arrive in turn, the second
    not counted by the first's arrival, so cancel_newest keeps the first run and keep_newest
    the second, as when the two completions come one at a time."""
    await engine.register_workflow("pipe", [task("pre"), {**task("go", "pre"), "kind": "k"}])
    await engine.set_limit(limit("one", max_running=1, strategy=strategy, kinds=["k"], key="all"))
    runs = [(await engine.submit_run("pipe"))[0] for _ in range(2)]
    leases = await engine.claim("w", ["pre"], 2, 30)
    statuses = await engine.apply_results([Result(str(x["step_id"]), x["lease_generation"], "completed")
                                           for x in leases])
    assert {status for _, _, status in statuses} == {"applied"}
    states = [(await engine.get_run(r))["state"] for r in runs]
    assert states == ["running" if i == left else "cancelled" for i in range(2)]


async def test_a_promotion_across_kinds_and_an_enqueue_take_clocks_and_keys_in_one_order(engine: Engine, conn,
                                                                                          db_url: str) -> None:
    """pre's completion makes a (kind k1) and b (k2) available, one key of a keep_newest limit on
    both. Entered one by one, it would hold a's clock and the key, then wait for b's clock; an
    enqueue of k2 holds b's clock and waits for the key. The promotion locks both clocks, then
    the key, first: the enqueue waits for it, and both succeed (a blocker on b's row holds the
    promotion in between)."""
    import psycopg
    await engine.register_workflow("two", [task("pre"), {**task("a", "pre"), "kind": "k1"},
                                           {**task("b", "pre"), "kind": "k2"}])
    await engine.set_limit(limit("t", strategy="keep_newest", kinds=["k1", "k2"], key="all"))
    run_id, _ = await engine.submit_run("two")
    [lease] = await engine.claim("w", ["pre"], 1, 30)
    b = await fetch_one(conn, "SELECT id FROM cyclone_steps WHERE run_id = %s AND node = 'b'", run_id)
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        await blocker.execute("SELECT 1 FROM cyclone_steps WHERE id = %s FOR UPDATE", (b["id"],))
        completing = asyncio.create_task(engine.complete(str(lease["step_id"]), lease["lease_generation"], None))
        await eventually(lambda: lock_waits_are(conn, 1))
        enqueuing = asyncio.create_task(engine.enqueue_many([Job("k2", input={})]))
        await eventually(lambda: lock_waits_are(conn, 2))
        await blocker.rollback()
    assert await completing == "applied"
    await enqueuing




async def hold_key(blocker, limit_name: str, key: str) -> None:
    """Lock a limit key's row (made and committed first) in the blocker's open transaction."""
    await blocker.execute("INSERT INTO cyclone_limit_keys (limit_name, key) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                          (limit_name, key))
    await blocker.commit()
    await blocker.execute("SELECT 1 FROM cyclone_limit_keys WHERE limit_name = %s AND key = %s FOR UPDATE",
                          (limit_name, key))

async def test_a_new_runs_keys_of_runs_are_locked_before_its_steps_keys(engine: Engine, conn, db_url: str) -> None:
    """A run's arrival takes the keys of its limits of runs, then those of its steps' limits
    (cyclone__limits_arrive). A run with two root steps locks its keys first
    (cyclone__arrivals_lock), in that same order: with "all" of the runs' limit held by a
    blocker, a one-step run of key s1 and then a two-step run of keys s1 and s2 wait for it,
    and both are made once it is released (the two-step run locked s1 before "all" and
    deadlocked with the other)."""
    import psycopg
    await engine.set_limit(limit("runs", scope="runs", max_running=10, strategy="cancel_newest",
                                 workflows=["one", "two"], key="all"))
    await engine.set_limit(limit("s", max_running=10, strategy="cancel_newest"))

    def node(node_id: str, kind: str, path: str) -> dict[str, Any]:
        return {**task(node_id), "kind": kind, "limits": [{"limit": "s", "key_path": [path]}]}
    await engine.register_workflow("one", [node("x", "k2", "a")])
    await engine.register_workflow("two", [node("y", "k", "a"), node("z", "k", "b")])
    other = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        async with await psycopg.AsyncConnection.connect(db_url) as blocker:
            await hold_key(blocker, "runs", "all")
            first = asyncio.create_task(engine.submit_run("one", input={"a": "s1"}))
            await eventually(lambda: lock_waits_are(conn, 1))
            second = asyncio.create_task(other.submit_run("two", input={"a": "s1", "b": "s2"}))
            await eventually(lambda: lock_waits_are(conn, 2))
            await blocker.rollback()
        made = [await first, await second]
    finally:
        await other.close()
    assert [(await engine.get_run(run_id))["state"] for run_id, _ in made] == ["running", "running"]


async def test_enqueue_many_locks_its_jobs_strategy_keys_in_one_order(engine: Engine, conn, db_url: str) -> None:
    """Jobs under two limits with strategies arrive job by job; an EnqueueMany locks all their
    keys first, sorted. Batch y ([c, Y], [d, Z]) waits for Y, held by a blocker, then batch x
    ([a, Z], [b, Y]) does too: x has not locked Z before Y, so both go through once Y is
    released (job by job, x held Z and y then waited for it while x waited for Y)."""
    import psycopg
    await engine.set_limit(limit("t1", max_running=10, strategy="cancel_newest", kinds=["k"], key_path="a"))
    await engine.set_limit(limit("t2", max_running=10, strategy="cancel_newest", kinds=["k"], key_path="b"))
    other = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        async with await psycopg.AsyncConnection.connect(db_url) as blocker:
            await hold_key(blocker, "t2", "Y")
            y = asyncio.create_task(engine.enqueue_many([Job("k", input={"a": "c", "b": "Y"}),
                                                         Job("k", input={"a": "d", "b": "Z"})]))
            await eventually(lambda: lock_waits_are(conn, 1))
            x = asyncio.create_task(other.enqueue_many([Job("k", input={"a": "a", "b": "Z"}),
                                                        Job("k", input={"a": "b", "b": "Y"})]))
            await eventually(lambda: lock_waits_are(conn, 2))
            await blocker.rollback()
        made = [*await y, *await x]
    finally:
        await other.close()
    assert [(await engine.get_run(run_id))["state"] for run_id, _, _ in made] == ["running"] * 4


async def test_the_one_argument_arrivals_lock_survives_an_earlier_release_applying_its_own(conn) -> None:
    """A server of the previous release that restarts during an upgrade applies its function
    files again, cyclone__arrivals_lock(uuid[]) among them: the one-argument calls (promotions
    in a results batch) must still find one function, not two candidates."""
    await conn.execute("CREATE OR REPLACE FUNCTION cyclone__arrivals_lock(p_step_ids uuid[]) RETURNS void "
                       "LANGUAGE plpgsql AS $$ BEGIN END $$")
    await conn.execute("SELECT cyclone__arrivals_lock(ARRAY[gen_random_uuid(), gen_random_uuid()])")

async def test_two_batches_promoting_keys_in_other_orders_never_deadlock(engine: Engine, conn,
                                                                         db_url: str) -> None:
    """Batch 1 makes the go steps of tenants a then b available, batch 2 those of b then a (by
    step id). Each locks the keys' fair clocks in one order before placing them: batch 2 waits
    for batch 1 (held up by a blocker on one of its steps), and both apply."""
    import psycopg
    await engine.register_workflow("pipe", [task("pre"), {**task("go", "pre"), "kind": "k"}])
    await engine.set_limit(limit("t", kinds=["k"], key_path="tenant"))
    runs = [(await engine.submit_run("pipe", input={"tenant": t}))[0] for t in "abba"]
    leases = {str(x["run_id"]): x for x in await engine.claim("w", ["pre"], 4, 30)}

    def result(i: int) -> Result:
        x = leases[runs[i]]
        return Result(str(x["step_id"]), x["lease_generation"], "completed")
    go = await fetch_one(conn, "SELECT id FROM cyclone_steps WHERE run_id = %s AND node = 'go'", runs[1])
    other = await Engine.open(db_url, min_size=1, max_size=2)
    try:
        async with await psycopg.AsyncConnection.connect(db_url) as blocker:
            await blocker.execute("SELECT 1 FROM cyclone_steps WHERE id = %s FOR UPDATE", (go["id"],))
            first = asyncio.create_task(engine.apply_results([result(0), result(1)]))
            await eventually(lambda: lock_waits_are(conn, 1))
            second = asyncio.create_task(other.apply_results([result(2), result(3)]))
            await eventually(lambda: lock_waits_are(conn, 2))
            await blocker.rollback()
        for batch in (await first, await second):
            assert {status for _, _, status in batch} == {"applied"}
    finally:
        await other.close()


async def test_promotions_racing_in_batches_on_several_engines_keep_a_strategy(db_url: str, engine: Engine,
                                                                                 conn) -> None:
    """Six engines complete the first steps of 60 runs in batches at once; each completion
    promotes a step of kind k, which arrives for cancel_newest at max_running 3 (one key, nobody
    claims k): exactly 3 runs are left, and no batch fails on a deadlock."""
    await engine.register_workflow("pipe", [task("pre"), {**task("go", "pre"), "kind": "k"}])
    await engine.set_limit(limit("three", max_running=3, strategy="cancel_newest", kinds=["k"]))
    runs = [(await engine.submit_run("pipe", input={"i": i}))[0] for i in range(60)]
    engines = [await Engine.open(db_url, min_size=1, max_size=2) for _ in range(6)]

    async def completer(i: int, e: Engine) -> None:
        rng = random.Random(i)
        while leases := await e.claim(f"w{i}", ["pre"], rng.randint(1, 6), 30):
            statuses = await e.apply_results([Result(str(x["step_id"]), x["lease_generation"], "completed")
                                              for x in leases])
            assert {status for _, _, status in statuses} == {"applied"}

    try:
        await asyncio.gather(*(completer(i, e) for i, e in enumerate(engines)))
    finally:
        for e in engines:
            await e.close()
    states = Counter([(await engine.get_run(r))["state"] for r in runs])
    assert states == {"running": 3, "cancelled": 57}
    assert await violations(conn) == {}


async def test_a_promoted_step_is_no_new_run_for_a_limit_of_runs(engine: Engine) -> None:
    """Under keep_newest of scope runs, only a new run arrives: a step of an admitted run that
    its dependency promotes does not cancel the runs waiting for their slot."""
    await engine.register_workflow("pipe", [task("a"), task("b", "a")])
    await engine.set_limit(limit("r", scope="runs", max_running=1, strategy="keep_newest", workflows=["pipe"]))
    r1, _ = await engine.submit_run("pipe")
    [lease] = await engine.claim("w", ["a"], 5, 30)  # r1 takes the slot
    r2, _ = await engine.submit_run("pipe")  # waits for it
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], None) == "applied"
    assert [(await engine.get_run(r))["state"] for r in (r1, r2)] == ["running", "running"]


@pytest.mark.parametrize("strategy", ["cancel_newest", "keep_newest"])
async def test_racing_arrivals_on_several_engines_keep_a_strategy(db_url: str, engine: Engine, conn,
                                                                  strategy: str) -> None:
    """Six engines enqueue 60 jobs of one key at once: the key's lock serializes the arrivals, so
    cancel_newest leaves exactly max_running of them and keep_newest exactly one waiting."""
    await engine.set_limit(limit("k", max_running=3, strategy=strategy, kinds=["k"]))
    engines = [await Engine.open(db_url, min_size=1, max_size=2) for _ in range(6)]
    try:
        await asyncio.gather(*(e.enqueue("k", input=i * 10 + j) for i, e in enumerate(engines) for j in range(10)))
    finally:
        for e in engines:
            await e.close()
    rows = await fetch(conn, "SELECT state, count(*) AS n FROM cyclone_runs GROUP BY state ORDER BY state")
    alive = 3 if strategy == "cancel_newest" else 1
    assert {r["state"]: r["n"] for r in rows} == {"cancelled": 60 - alive, "running": alive}
    assert await violations(conn) == {}


@pytest.mark.parametrize("seed", range(6))
async def test_strategies_against_a_model(engine: Engine, seed: int) -> None:
    """Random arrivals, claims and completions under each strategy, against a model of what
    the key may hold: never more than max_running running, the states the strategy promises."""
    rng = random.Random(seed)
    strategy = ["queue", "cancel_newest", "cancel_oldest", "keep_newest"][seed % 4]
    cap = rng.randint(1, 3)
    await engine.set_limit(limit("m", max_running=cap, strategy=strategy, kinds=["k"]))
    model: dict[str, str] = {}  # run id -> waiting | running | done | cancelled
    order: list[str] = []
    leases: dict[str, dict[str, Any]] = {}
    for _ in range(60):
        op = rng.choice(["arrive", "arrive", "claim", "finish"])
        if op == "arrive":
            (run_id, _, _), = await jobs(engine, "k", [len(order)])
            live = [r for r in order if model[r] in ("waiting", "running")]
            waiting = [r for r in live if model[r] == "waiting"]
            order.append(run_id)
            model[run_id] = "waiting"
            if strategy == "cancel_newest" and len(live) >= cap:
                model[run_id] = "cancelled"
            elif strategy == "cancel_oldest" and len(live) + 1 > cap:
                for r in live[:len(live) + 1 - cap]:
                    model[r] = "cancelled"
                    leases.pop(r, None)
            elif strategy == "keep_newest":
                for r in waiting:
                    model[r] = "cancelled"
        elif op == "claim":
            got = await claim(engine, "k", rng.randint(1, 3))
            for lease in got:
                r = str(lease["run_id"])
                assert model[r] == "waiting", (r, model[r])
                model[r] = "running"
                leases[r] = lease
        elif leases:
            r = rng.choice(sorted(leases))
            lease = leases.pop(r)
            assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], None) == "applied"
            model[r] = "done"
        assert sum(1 for s in model.values() if s == "running") <= cap
        for r in order:
            state = (await engine.get_run(r))["state"]
            want = {"waiting": "running", "running": "running", "done": "completed", "cancelled": "cancelled"}[model[r]]
            assert state == want, (strategy, r, model[r], state)


# -- limits of whole runs ----------------------------------------------------------------------


async def test_a_limit_of_runs_admits_runs_per_key_until_they_end(engine: Engine) -> None:
    nodes = [task("a"), task("b", "a")]
    await engine.register_workflow("pipeline", nodes)
    await engine.set_limit(limit("pipes", scope="runs", max_running=1, workflows=["pipeline"], key_path="acct"))
    r1, _ = await engine.submit_run("pipeline", input={"acct": 1})
    r2, _ = await engine.submit_run("pipeline", input={"acct": 1})
    r3, _ = await engine.submit_run("pipeline", input={"acct": 2})
    got = await engine.claim("w", ["a"], 5, 30)
    assert sorted(str(x["run_id"]) for x in got) == sorted([r1, r3])
    first = next(x for x in got if str(x["run_id"]) == r1)
    await engine.complete(str(first["step_id"]), first["lease_generation"], None)
    # r1 holds its slot between its steps: r2 waits until r1 ends, b of r1 goes at once.
    assert [str(x["run_id"]) for x in await engine.claim("w", ["a", "b"], 5, 30)] == [r1]
    assert (await engine.get_run(r2))["steps"][0]["held_by"] == "limit pipes key 1: 1/1 runs active"
    b = (await fetch_run_lease(engine, r1, "b"))
    await engine.complete(b[0], b[1], None)
    assert [str(x["run_id"]) for x in await engine.claim("w", ["a"], 5, 30)] == [r2]


@pytest.mark.parametrize("batched", [False, True])
async def test_a_child_run_its_limit_refuses_discards_its_node_not_the_result_before(engine: Engine,
                                                                                     batched: bool) -> None:
    """The child run of node sub is made when pre completes, its input {input, parents}; its
    workflow's limit of runs keys on a field pre's output lacks. The child run is refused, so
    sub is discarded (permanent, child_run_refused, naming the limit), the run fails, and pre's
    result, which was fine, is applied once: never refused and retried."""
    await engine.register_workflow("child", [task("c")])
    await engine.register_workflow("parent", [task("pre"), task("sub", "pre", type="child", workflow="child")])
    await engine.set_limit(limit("regions", scope="runs", max_running=1, workflows=["child"],
                                 key_path="input.parents.pre.region"))
    run_id, _ = await engine.submit_run("parent")
    [lease] = await engine.claim("w", ["pre"], 1, 30)
    if batched:
        [(_, _, status)] = await engine.apply_results([Result(str(lease["step_id"]), lease["lease_generation"],
                                                              "completed", output={"ok": True})])
    else:
        status = await engine.complete(str(lease["step_id"]), lease["lease_generation"], {"ok": True})
    assert status == "applied"
    run = await engine.get_run(run_id)
    steps = {s["node"]: s for s in run["steps"]}
    assert (steps["pre"]["state"], steps["pre"]["attempt"]) == ("completed", 1)
    assert (steps["sub"]["state"], steps["sub"]["error_kind"], steps["sub"]["reason"]) == \
        ("discarded", "permanent", "child_run_refused")
    assert 'limit "regions": key_path "input.parents.pre.region"' in steps["sub"]["errors"][-1]["message"]
    assert run["state"] == "failed"


async def test_a_submit_whose_root_child_run_its_limit_refuses_is_refused_naming_the_node(engine: Engine,
                                                                                          conn) -> None:
    """A root child node's run is made in the submit: a key its input lacks refuses the submit
    (INVALID_ARGUMENT naming the node and the limit), and nothing is stored."""
    await engine.register_workflow("child", [task("c")])
    await engine.register_workflow("parent", [task("sub", type="child", workflow="child")])
    await engine.set_limit(limit("regions", scope="runs", max_running=1, workflows=["child"],
                                 key_path="input.input.region"))
    with pytest.raises(InvalidArgument, match=r'^node "sub" \(child workflow child\): limit "regions": '
                                              r'key_path "input.input.region"'):
        await engine.submit_run("parent", input={})
    assert await fetch(conn, "SELECT id FROM cyclone_runs") == []


async def test_a_limit_of_runs_counts_active_runs_not_their_running_steps(engine: Engine) -> None:
    """A run's steps carry its limit of runs too; the slots are the admitted runs alone."""
    await engine.register_workflow("one", [task("a")])
    await engine.set_limit(limit("two", scope="runs", max_running=2, workflows=["one"]))
    runs = [(await engine.submit_run("one", input={"i": i}))[0] for i in range(3)]
    got = await engine.claim("w", ["a"], 5, 30)
    assert sorted(str(x["run_id"]) for x in got) == sorted(runs[:2])
    await engine.complete(str(got[0]["step_id"]), got[0]["lease_generation"], None)  # its run ends
    assert [str(x["run_id"]) for x in await engine.claim("w", ["a"], 5, 30)] == [runs[2]]


async def test_a_run_between_its_steps_holds_its_slot_beside_one_running(engine: Engine) -> None:
    """Two runs active under a cap of 2: one with a step running, one between its steps. A
    third is not admitted: the claim counts active runs, not running steps."""
    await engine.register_workflow("two", [task("a"), task("b", "a")])
    await engine.set_limit(limit("cap2", scope="runs", max_running=2, workflows=["two"]))
    runs = [(await engine.submit_run("two", input={"i": i}))[0] for i in range(3)]
    got = await engine.claim("w", ["a"], 2, 30)
    assert sorted(str(x["run_id"]) for x in got) == sorted(runs[:2])
    await engine.complete(str(got[0]["step_id"]), got[0]["lease_generation"], None)  # now between a and b
    assert await engine.claim("w", ["a"], 5, 30) == []
    assert await engine.next_due(["a"]) is None


async def test_a_step_of_a_run_holding_its_slot_is_due_though_the_key_is_full(engine: Engine) -> None:
    """next_due agrees with the claim: the key of a limit of runs is full, but the run of this
    step holds one of its slots, so the step is due now (not parked until new work)."""
    await engine.register_workflow("pipeline", [task("a"), task("b", "a")])
    await engine.set_limit(limit("pipes", scope="runs", max_running=1, workflows=["pipeline"]))
    r1, _ = await engine.submit_run("pipeline")
    [a] = await engine.claim("w", ["a"], 5, 30)
    await engine.complete(str(a["step_id"]), a["lease_generation"], None)  # b of r1 is available
    due = await engine.next_due(["b"])
    assert due is not None and due <= 0.0


async def test_a_run_started_while_its_limit_of_runs_was_deleted_counts_when_the_limit_is_made_again(
        engine: Engine) -> None:
    """A run keeps its tokens when its limit of runs is deleted; its first step starting then
    admits it all the same, so a limit made again under that name counts it: a second run of
    the key waits, and the first one's next step is not held behind it."""
    await engine.register_workflow("pipeline", [task("a"), task("b", "a")])
    spec = limit("pipes", scope="runs", max_running=1, workflows=["pipeline"])
    await engine.set_limit(spec)
    r1, _ = await engine.submit_run("pipeline")
    await engine.delete_limit("pipes")
    [a] = await engine.claim("w", ["a"], 5, 30)
    assert str(a["run_id"]) == r1
    await engine.set_limit(spec)
    r2, _ = await engine.submit_run("pipeline")
    await engine.complete(str(a["step_id"]), a["lease_generation"], None)  # r1 is between its steps
    got = await engine.claim("w", ["a", "b"], 5, 30)
    assert [(str(x["run_id"]), x["node"]) for x in got] == [(r1, "b")]
    assert (await engine.get_run(r2))["steps"][0]["held_by"] == 'limit pipes key "": 1/1 runs active'


async def fetch_run_lease(engine: Engine, run_id: str, node: str) -> tuple[str, int]:
    step = next(s for s in (await engine.get_run(run_id))["steps"] if s["node"] == node)
    return str(step["id"]), step["lease_generation"]


# -- fair dispatch ---------------------------------------------------------------------------


async def test_keys_share_claims_round_robin_whatever_the_backlog_of_one(engine: Engine) -> None:
    await engine.set_limit(limit("fair", kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "big", "n": i} for i in range(300)])
    for lease in await claim(engine, "k", 20):  # the big tenant has been served a while
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    await jobs(engine, "k", [{"tenant": t, "n": i} for t in ("b", "c", "d") for i in range(5)])
    got = tenants_of(await claim(engine, "k", 20))
    assert Counter(got) == {"big": 5, "b": 5, "c": 5, "d": 5}
    got_first = tenants_of(await claim(engine, "k", 4))
    assert set(got_first) == {"big"}  # then only the big one has work left


async def test_without_keys_the_order_is_priority_then_fifo(engine: Engine) -> None:
    made = await jobs(engine, "plain", list(range(5)))
    await engine.enqueue("plain", input="urgent", priority=-1)
    got = [x["input"] for x in await claim(engine, "plain", 10)]
    assert got == ["urgent", 0, 1, 2, 3, 4] and len(made) == 5


async def test_weighted_keys_get_claims_in_proportion(engine: Engine) -> None:
    await engine.set_limit(limit("w", kinds=["k"], key_path="tenant", weights={"gold": 4}))
    await jobs(engine, "k", [{"tenant": t} for t in ("gold", "std") for _ in range(100)])
    got = Counter(tenants_of(await claim(engine, "k", 50)))
    assert got == {"gold": 40, "std": 10}


async def test_a_batch_places_each_kinds_steps_from_that_kinds_virtual_time(engine: Engine, conn) -> None:
    """EnqueueMany places a batch's steps in the fair order a key at a time; a key with jobs of
    two kinds in one batch is placed step by step, each from its own kind's virtual time (one
    kind far ahead must not push the other kind's step behind its own backlog)."""
    await engine.set_limit(limit("shared", kinds=["x", "y"], key_path="tenant"))
    await conn.execute("INSERT INTO cyclone_fair_clocks (kind, vt) VALUES ('x', 100.0)")
    await engine.enqueue_many([Job("y", input={"tenant": "t"}), Job("x", input={"tenant": "t"}),
                               Job("y", input={"tenant": "u"}), Job("y", input={"tenant": "u"})])
    rows = await fetch(conn, "SELECT kind, limit_keys[1] AS tok, fair_at FROM cyclone_steps ORDER BY kind, fair_at")
    placed = [(r["kind"], r["tok"].split("\x1f")[1], r["fair_at"]) for r in rows]
    assert placed == [("x", "t", 100.0), ("y", "t", 0.0), ("y", "u", 0.0), ("y", "u", 1.0)]


async def test_a_key_busy_in_one_kind_is_not_pushed_back_in_another(engine: Engine) -> None:
    """A limit shared by several kinds orders each on its own: tenant x's 50 queued steps of
    kind a put its clock far ahead in a, not in b1 or b2, where x came first and is served
    first (enqueued one at a time, and in one batch)."""
    await engine.set_limit(limit("t", kinds=["a", "b1", "b2"], key_path="tenant"))
    await jobs(engine, "a", [{"tenant": "x"}] * 50)
    for tenant in "xyz":
        await engine.enqueue("b1", input={"tenant": tenant})
    await jobs(engine, "b2", [{"tenant": t} for t in "xyz"])
    for kind in ("b1", "b2"):
        assert [tenants_of(await claim(engine, kind, 1)) for _ in range(3)] == [["x"], ["y"], ["z"]], kind


async def test_priority_comes_before_fairness(engine: Engine) -> None:
    await engine.set_limit(limit("fair", kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": "a"}] * 3)
    await engine.enqueue("k", input={"tenant": "b"}, priority=5)
    await engine.enqueue("k", input={"tenant": "c"}, priority=-5)
    assert tenants_of(await claim(engine, "k", 5)) == ["c", "a", "a", "a", "b"]


async def test_the_clocks_of_a_database_from_before_clocks_per_kind_keep_fifo(engine: Engine, conn,
                                                                             db_url: str) -> None:
    """Migration 0011 on a database with steps placed under the clocks kept per token: each
    (kind, token) with steps waiting starts at its token's old clock, so the next step of such
    a key is placed behind the ones waiting (FIFO holds); keys with nothing waiting start afresh."""
    from cyclone_server.store.migrate import migrate
    await engine.set_limit(limit("t", max_running=1, kinds=["a", "b"], key_path="tenant"))
    await jobs(engine, "a", [{"tenant": "x"}] * 5 + [{"tenant": "y"}])
    await jobs(engine, "b", [{"tenant": "x"}] * 2)
    await jobs(engine, "a", [{"tenant": "gone"}])
    for lease in await claim(engine, "a", 10):  # x's first and y's and gone's run and end
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    # The table as the last landed version had it: one clock per token, ahead of all its steps.
    await conn.execute("""
        CREATE TABLE old_clocks AS SELECT token, max(vclock) + 10 AS vclock FROM cyclone_fair_keys GROUP BY token;
        DROP TABLE cyclone_fair_keys;
        CREATE TABLE cyclone_fair_keys (token text PRIMARY KEY, vclock double precision NOT NULL);
        INSERT INTO cyclone_fair_keys SELECT * FROM old_clocks;
        DELETE FROM cyclone_migrations WHERE name = '0011_fair_clocks_per_kind.sql'""")
    assert "0011_fair_clocks_per_kind.sql" in await asyncio.to_thread(migrate, db_url)
    clocks = {(r["kind"], r["token"]): r["vclock"] for r in await fetch(conn, "SELECT * FROM cyclone_fair_keys")}
    old = {r["token"]: r["vclock"] for r in await fetch(conn, "SELECT * FROM old_clocks")}
    assert clocks == {("a", "t\x1fx"): old["t\x1fx"], ("b", "t\x1fx"): old["t\x1fx"]}
    waiting = await fetch(conn, "SELECT max(fair_at) AS f FROM cyclone_steps WHERE state = 'available'")
    [(_, new_step, _)] = await jobs(engine, "a", [{"tenant": "x"}])
    placed = await fetch_one(conn, "SELECT fair_at FROM cyclone_steps WHERE id = %s", new_step)
    assert placed["fair_at"] >= waiting[0]["f"]


# -- tidying ---------------------------------------------------------------------------------


async def test_tidy_removes_the_rows_of_idle_keys_and_keeps_those_in_use(engine: Engine, conn, db_url: str) -> None:
    """Per-user keys come and go: the lock rows, fair clocks and old starts of keys with nothing
    waiting go; a key with a waiting step, a bucket still refilling or a claim holding its row
    keeps its row, and a fair clock ahead of its kind's virtual time stays while steps of the
    kind wait (pair's); in a kind where nothing waits, every clock goes (r's)."""
    import psycopg
    await engine.set_limit(limit("u", max_running=1, kinds=["k"], key_path="user"))
    await engine.set_limit(limit("r", rate=1000, period=1.0, kinds=["paced"], key="all"))
    await jobs(engine, "k", [{"user": f"u{i}"} for i in range(20)] + [{"user": "busy"}] * 3 + [{"user": "pair"}] * 2)
    for _ in range(2):  # 22 steps at fair place 0, then busy's and pair's second at 1: k's virtual time is 1
        for lease in await claim(engine, "k", 50):
            await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
    await jobs(engine, "paced", list(range(3)))
    await conn.execute("INSERT INTO cyclone_limit_keys (limit_name, key, paced) VALUES ('r', 'all', now())")  # a full bucket
    assert len(await claim(engine, "paced", 3)) == 3  # paced's virtual time is 2
    await conn.execute("INSERT INTO cyclone_limit_starts (limit_name, key, at) VALUES ('r', 'all', now() - interval '1 hour')")
    await conn.execute("UPDATE cyclone_limit_keys SET paced = now() + interval '1 hour' WHERE limit_name = 'r'")

    async def rows(table: str, column: str) -> set[str]:
        return {r["k"] for r in await fetch(conn, f"SELECT {column} AS k FROM {table}")}
    assert len(await rows("cyclone_limit_keys", "key")) == 23
    assert len(await rows("cyclone_fair_keys", "token")) == 23
    async with await psycopg.AsyncConnection.connect(db_url) as other:  # a claim holding u0's row
        await other.execute("SELECT 1 FROM cyclone_limit_keys WHERE key = 'u0' FOR UPDATE")
        removed = await engine.tidy_limits()
    assert await rows("cyclone_limit_keys", "key") == {"u0", "busy", "all"}
    assert await rows("cyclone_fair_keys", "token") == {"u\x1fbusy", "u\x1fpair"}
    assert (await fetch_one(conn, "SELECT count(*) AS n FROM cyclone_limit_starts"))["n"] == 3  # in the window
    assert removed == 20 + 21 + 1
    # Claims go on as before: a tidied key's row and clock come back with its next step.
    await jobs(engine, "k", [{"user": "u5"}])
    assert sorted(x["input"]["user"] for x in await claim(engine, "k", 5)) == ["busy", "u5"]
    assert await rows("cyclone_limit_keys", "key") >= {"u5", "busy"}
    # Nothing waits anywhere now: every fair clock goes (a kind with no waiting steps places a
    # key's next step from its own virtual time, as for a fresh key).
    await engine.tidy_limits()
    assert await rows("cyclone_fair_keys", "token") == set()


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_running": 0, "rate": -1}, "limit.rate: must be from 1 to 1,000,000"),
    ({"max_running": -2}, "limit.max_running: must be from 1"),
    ({"max_running": 10**9}, "limit.max_running: must be from 1 to 1,000,000"),
    ({"rate": 5}, "limit.period: a rate needs a period"),
    ({"period": 1.0}, "limit.period: a rate needs a period and a period a rate"),
    ({"rate": 5, "period": 0.5}, "limit.period: must be from 1 second to 1 day"),
    ({"rate": 5, "period": 86401.0}, "limit.period: must be from 1 second to 1 day"),
    ({"strategy": "cancel_newest"}, "limit.strategy: cancel_newest needs max_running"),
    ({"strategy": "lifo"}, "limit.strategy: 'lifo' is not one of"),
    ({"scope": "runs", "kinds": ["k"]}, "limit.kinds: a limit of scope runs attaches to workflows"),
    ({"scope": "runs"}, "limit.workflows: a limit of scope runs names the workflows"),
    ({"workflows": ["w"]}, "limit.workflows: a limit of scope steps attaches to kinds"),
    ({"key_path": "input."}, "limit.key_path: 'input.' is not a field path"),
    ({"key": "a", "key_path": "x"}, "limit.key_path: give key or key_path, not both"),
    ({"weights": {"a": 0}}, "limit.weights['a']: must be from 1 to 1000"),
    ({"kinds": ["bad kind"]}, "limit.kinds[0]: 'bad kind' is not a valid kind"),
])
async def test_a_bad_limit_is_refused_naming_the_field(engine: Engine, conn, fields: dict, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        limit("bad", **fields)
    assert message in e.value.message
    assert await fetch(conn, "SELECT * FROM cyclone_limits") == []


async def test_a_bad_name_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="limit.name"):
        limit("no spaces")


async def test_a_submit_with_an_unknown_limit_or_a_missing_key_stores_nothing(engine: Engine, conn) -> None:
    with pytest.raises(InvalidArgument, match=r'node "k": limits\[0\]: unknown limit "nope"'):
        await engine.enqueue("k", input={}, options={"limits": [{"limit": "nope"}]})
    await engine.set_limit(limit("t", max_running=1, kinds=["k"], key_path="input.tenant"))
    with pytest.raises(InvalidArgument, match=r'limit "t" \(kind "k"\): key_path "input.tenant": the run input has no value'):
        await engine.enqueue("k", input={"other": 1})
    with pytest.raises(InvalidArgument, match=r'jobs\[1\]: .*key_path "input.tenant": the value there is a JSON object'):
        await jobs(engine, "k", [{"tenant": "a"}, {"tenant": {"x": 1}}])
    with pytest.raises(InvalidArgument, match=r"limits\[0\]: limit: 'bad name' is not a valid name"):
        definitions.normalize_job("k", {"limits": [{"limit": "bad name"}]})
    with pytest.raises(InvalidArgument, match=r"limits: only task nodes consume limits"):
        definitions.normalize_nodes([{"id": "s", "type": "sleep", "sleep": 1, "limits": [{"limit": "t"}]}])
    assert await fetch(conn, "SELECT * FROM cyclone_runs") == []


async def test_a_batch_gives_its_jobs_the_tokens_one_enqueue_would(engine: Engine, conn) -> None:
    """EnqueueMany works out the tokens of a batch's jobs set-based (cyclone__jobs_create); Enqueue
    one job at a time (cyclone__step_tokens). Both give each job the same tokens, in the same
    order, for keys from strings, numbers and booleans, constant keys, several limits on a kind
    and a node's own limits; and both refuse the same keys with the same message."""
    await engine.set_limit(limit("b", max_running=5, kinds=["k", "other"], key_path="tenant"))
    await engine.set_limit(limit("a", rate=10, period=1.0, kinds=["k"], key="all"))
    await engine.set_limit(limit("own", max_running=2, key_path="region"))
    inputs = [{"tenant": "x", "region": "eu"}, {"tenant": 7, "region": "us"}, {"tenant": True, "region": "eu"},
              {"tenant": "y" * 256, "region": "ap"}]
    own = {"limits": [{"limit": "own", "key_path": ["region"]}]}
    for kind, options in (("k", {}), ("other", {}), ("k", own), ("plain", {})):
        batch = [s for _, s, _ in await jobs(engine, kind, inputs, **options)]
        alone = [(await engine.enqueue(kind, input=i, options=options))[1] for i in inputs]
        tokens = {str(r["id"]): r["limit_keys"] for r in await fetch(
            conn, "SELECT id, limit_keys FROM cyclone_steps WHERE id = ANY (%s::uuid[])", batch + alone)}
        assert [tokens[s] for s in batch] == [tokens[s] for s in alone], (kind, options)
        if kind == "k" and not options:
            assert tokens[batch[1]] == ["a\x1fall", "b\x1f7"]
    assert tokens[alone[0]] is None  # "plain": no limit attaches to it
    for bad in ({"tenant": None}, {"tenant": [1]}, {"tenant": "z" * 257}):
        with pytest.raises(InvalidArgument) as one:
            await engine.enqueue("k", input=bad)
        with pytest.raises(InvalidArgument) as many:
            await jobs(engine, "k", [{"tenant": "x"}, bad])
        assert many.value.message == f"jobs[1]: {one.value.message}"


async def test_the_scope_of_a_limit_cannot_change(engine: Engine) -> None:
    await engine.set_limit(limit("s", max_running=1, kinds=["k"]))
    with pytest.raises(InvalidArgument, match='limit.scope: limit "s" exists with scope steps'):
        await engine.set_limit(limit("s", max_running=1, scope="runs", workflows=["w"]))


async def test_get_and_delete_of_an_unknown_limit_are_not_found(engine: Engine) -> None:
    with pytest.raises(NotFound):
        await engine.get_limit("nope")
    with pytest.raises(NotFound):
        await engine.delete_limit("nope")


async def test_limits_list_their_busiest_keys(engine: Engine) -> None:
    await engine.set_limit(limit("t", max_running=2, kinds=["k"], key_path="tenant"))
    await jobs(engine, "k", [{"tenant": t} for t in "aaaabbc"])
    await claim(engine, "k", 10)
    [row] = await engine.list_limits()
    assert [(k["key"], k["running"], k["waiting"]) for k in row["keys"]] == [("a", 2, 2), ("b", 2, 0), ("c", 1, 0)]
