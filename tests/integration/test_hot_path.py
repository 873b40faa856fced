"""The throughput work's invariants (migration 0009, the set-based results path):

- a claim writes index entries only into the primary key, (run_id, node), active_run and
  the index of running steps, and the sweeps find their steps through that index;
- result batches of DAG steps are applied set-based with the guarantees of the per-result
  path: fencing, refusals, the lock order against a concurrent cancel, promotions, runs
  ending, and the child runs they end reported for their parent nodes.
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from engine_helpers import (Row, claim_one, fetch, fetch_one, history_from, log_plans, nested_plans, partition_parents,
                            plan_nodes, run_row, start, states, step, task, wide_nodes)

from cyclone_server.records import Job, Result

from cyclone_server.store.engine import Engine
from cyclone_server.store.queries import Q

pytestmark = pytest.mark.statemachine


async def test_a_running_step_has_entries_in_four_indexes_only(engine: Engine, conn) -> None:
    """A claim is never a HOT update (`state` is in the partial indexes' predicates), so it
    writes an entry into every index whose predicate holds for the running row: four."""
    await engine.enqueue("job")
    lease = await claim_one(engine, "job")
    indexes = await fetch(conn, "SELECT c.relname AS name, pg_get_expr(i.indpred, i.indrelid) AS pred "
                                "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                                "WHERE i.indrelid = 'cyclone_steps'::regclass")
    holding = set()
    for ix in indexes:
        where = ix["pred"] or "true"
        if (await fetch_one(conn, f"SELECT count(*) AS n FROM cyclone_steps WHERE id = %s AND ({where})",
                            lease["step_id"]))["n"]:
            holding.add(ix["name"])
    assert holding == {"cyclone_steps_pkey", "cyclone_steps_run_node", "cyclone_steps_active_run",
                       "cyclone_steps_running"}


async def test_sweeps_find_their_steps_through_the_running_index(engine: Engine, conn) -> None:
    # 20,000 finished steps the sweeps must not read, then three running ones: a lease
    # expired, an attempt deadline passed, and one with neither.
    await conn.execute("INSERT INTO cyclone_runs (id, state) VALUES ('00000000-0000-7000-8000-000000000001', "
                       "'completed')")
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims,
                                   attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), '00000000-0000-7000-8000-000000000001', 'n' || i, 'old', 'task',
               'completed', 25, 5, '600s', '1s', '600s'
          FROM generate_series(1, 20000) i""")
    ids = {}
    for kind in ("expired", "overdue", "fine"):
        await engine.enqueue(kind)
        ids[kind] = (await claim_one(engine, kind, ttl=60))["step_id"]
    await conn.execute("UPDATE cyclone_steps SET lease_expiry = now() - interval '1s' WHERE id = %s",
                       (ids["expired"],))
    await conn.execute("UPDATE cyclone_steps SET attempt_deadline = now() - interval '1s' WHERE id = %s",
                       (ids["overdue"],))
    await conn.execute("ANALYZE cyclone_steps")
    async with conn.transaction():
        swept = await fetch(conn, "SELECT step_id, outcome FROM cyclone_leases_sweep(500)")
        timed_out = await fetch(conn, "SELECT step_id, outcome FROM cyclone_attempts_timeout(500)")
        # This transaction's own scan counters: no sequential scan of the steps table, and
        # the index of running steps was read by both functions.
        # (summed over the days of history, the partitions of migration 0014, but for the days to
        # come: an empty table's plan is a sequential scan, of nothing)
        seq = await fetch_one(conn, "SELECT COALESCE(sum(t.seq_scan), 0) AS seq_scan FROM pg_stat_xact_user_tables t "
                                    "WHERE pg_relation_size(t.relid) > 0 "
                                    "AND t.relid IN (SELECT relid FROM pg_partition_tree('cyclone_steps'))")
        idx = await fetch_one(conn, "SELECT sum(pg_stat_get_xact_numscans(p.relid)) AS idx_scan "
                                    "FROM pg_partition_tree('cyclone_steps_running') p")
    assert [(r["step_id"], r["outcome"]) for r in swept] == [(ids["expired"], "reclaimed")]
    assert [(r["step_id"], r["outcome"]) for r in timed_out] == [(ids["overdue"], "retried")]
    assert seq["seq_scan"] == 0
    assert idx["idx_scan"] >= 2
    rows = {r["kind"]: r["state"] for r in await fetch(conn, "SELECT kind, state FROM cyclone_steps "
                                                             "WHERE kind IN ('expired', 'overdue', 'fine')")}
    assert rows == {"expired": "available", "overdue": "available", "fine": "running"}


DIAMOND = [task("root"), *(task(f"m{i}", "root") for i in range(4)), task("join", *(f"m{i}" for i in range(4)))]


async def claim_all(engine: Engine, kinds: list[str]) -> list[dict]:
    return await engine.claim("w1", kinds, limit=100, lease_ttl=30)


async def test_a_dag_batch_promotes_and_ends_the_run_like_one_result_at_a_time(engine: Engine, conn) -> None:
    run_ids = [await start(engine, DIAMOND, input={"n": i}) for i in range(3)]
    roots = await claim_all(engine, ["root"])
    statuses = await engine.apply_results([Result(str(r["step_id"]), r["lease_generation"], "completed",
                                                  output={"root": str(r["run_id"])}) for r in roots])
    assert [s for _, _, s in statuses] == ["applied"] * 3
    for run_id in run_ids:
        assert await states(conn, run_id) == {"root": "completed", "m0": "available", "m1": "available",
                                              "m2": "available", "m3": "available", "join": "pending"}
    middles = await claim_all(engine, [f"m{i}" for i in range(4)])
    assert len(middles) == 12
    # All twelve in one batch, and a repeat of a root's result (its lease ended): the join
    # of each run is promoted once, after its last middle step.
    batch = [Result(str(m["step_id"]), m["lease_generation"], "completed", output=m["node"]) for m in middles]
    batch.append(Result(str(roots[0]["step_id"]), roots[0]["lease_generation"], "completed", output=0))
    statuses = [s for _, _, s in await engine.apply_results(batch)]
    assert statuses == ["applied"] * 12 + ["ended"]
    joins = await claim_all(engine, ["join"])
    assert len(joins) == 3 and all(j["parents"] == {f"m{i}": f"m{i}" for i in range(4)} for j in joins)
    statuses = [s for _, _, s in await engine.apply_results(
        [Result(str(j["step_id"]), j["lease_generation"], "completed", output={"j": 1}) for j in joins])]
    assert statuses == ["applied"] * 3
    for run_id in run_ids:
        run = await run_row(conn, run_id)
        assert (run["state"], run["result"]) == ("completed", {"join": {"j": 1}})


async def test_a_dag_batch_in_a_paused_run_promotes_nothing_until_resume(engine: Engine, conn) -> None:
    run_id = await start(engine, DIAMOND)
    root = await claim_one(engine, "root")
    assert await engine.pause_run(run_id)
    [(_, _, status)] = await engine.apply_results([Result(str(root["step_id"]), root["lease_generation"],
                                                          "completed", output=1)])
    assert status == "applied"
    assert (await states(conn, run_id))["m0"] == "pending"
    assert await engine.resume_run(run_id)
    assert (await states(conn, run_id))["m0"] == "available"


async def test_a_dag_batch_racing_a_cancel_keeps_the_lock_order(engine: Engine, conn, db_url: str) -> None:
    """The batch locks its runs in id order, the first waiting and the others not: a run
    whose cancel is in progress comes back busy, and once the cancel committed its results
    are refused (the steps were cancelled under the same lease generation: ended)."""
    first = await start(engine, DIAMOND, name="a")
    second = await start(engine, DIAMOND, name="b")
    if first > second:
        first, second = second, first
    roots = await claim_all(engine, ["root"])
    assert len(roots) == 2
    by_run = {str(r["run_id"]): r for r in roots}
    results = [Result(str(by_run[rid]["step_id"]), by_run[rid]["lease_generation"], "completed", output=rid)
               for rid in (first, second)]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as canceller:
        async with canceller.transaction():
            await canceller.execute("SELECT cyclone_run_cancel(%s)", (second,))
            # The cancel holds `second`: the batch applies `first` and finds `second` busy,
            # then waits for it alone (Engine.apply_results applies busy results again).
            applying = asyncio.ensure_future(engine.apply_results(results))
            deadline = asyncio.get_running_loop().time() + 30
            while (await step(conn, first, "root"))["state"] != "completed":
                assert asyncio.get_running_loop().time() < deadline, "the first run was not applied"
                await asyncio.sleep(0.02)
            assert not applying.done()
        statuses = [s for _, _, s in await asyncio.wait_for(applying, 30)]
    assert statuses == ["applied", "ended"]
    assert (await run_row(conn, second))["state"] == "cancelled"
    assert set((await states(conn, second)).values()) == {"cancelled"}
    assert (await states(conn, first))["m0"] == "available"


async def test_a_dag_batch_that_ends_a_child_run_settles_its_parent_node(engine: Engine, conn) -> None:
    await engine.register_workflow("sub", [task("c1"), task("c2", "c1")])
    run_id = await start(engine, [task("kid", type="child", workflow="sub"), task("after", "kid")])
    c1 = await claim_one(engine, "c1")
    assert [s for _, _, s in await engine.apply_results(
        [Result(str(c1["step_id"]), c1["lease_generation"], "completed", output=1)])] == ["applied"]
    assert (await step(conn, run_id, "kid"))["state"] == "waiting_child"
    c2 = await claim_one(engine, "c2")
    assert [s for _, _, s in await engine.apply_results(
        [Result(str(c2["step_id"]), c2["lease_generation"], "completed", output=2)])] == ["applied"]
    # Settled by apply_results itself (ended_child_run), not by the scanner.
    kid = await step(conn, run_id, "kid")
    assert (kid["state"], kid["output"]) == ("completed", {"c2": 2})
    assert (await step(conn, run_id, "after"))["state"] == "available"


async def test_next_due_reads_the_claim_index_per_priority(engine: Engine, conn) -> None:
    """The dispatcher's next due time (cyclone_steps_next_due) comes from the claim index: a
    loose scan over the kind's priorities, then one probe each, whatever the backlog's size.
    A step claimable now makes it 0 (a claim came up short though one was there: another
    transaction held its lock)."""
    await conn.execute("INSERT INTO cyclone_runs (id, state) VALUES ('00000000-0000-7000-8000-000000000001', "
                       "'running')")
    # 30,000 claimable steps of k in three priorities, and two per priority due later, of k and of f.
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, priority, scheduled_at, max_attempts,
                                   max_reclaims, attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), '00000000-0000-7000-8000-000000000001', 'n' || i, 'k', 'task', 'available',
               i % 3, now() - interval '1 min', 25, 5, '600s', '1s', '600s'
          FROM generate_series(1, 30000) i""")
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, priority, scheduled_at, max_attempts,
                                   max_reclaims, attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), '00000000-0000-7000-8000-000000000001', 'later' || k || p || '.' || h, k, 'task',
               'available', p, now() + make_interval(hours => h + p), 25, 5, '600s', '1s', '600s'
          FROM generate_series(0, 2) p, generate_series(1, 2) h, unnest(ARRAY['k', 'f']) k""")
    await conn.execute("ANALYZE cyclone_steps")
    assert await engine.next_due(["k", "other"]) == 0.0  # claimable now
    due = await engine.next_due(["f", "other"])
    assert due is not None and 3500 < due <= 3600  # the earliest: priority 0, in one hour
    plans = [plan for text, plan in await nested_plans(conn, Q["steps_next_due"].replace("%(kinds)s", "%s"),
                                                       ["k", "other"]) if "WITH RECURSIVE" in text]
    assert len(plans) == 1, plans
    nodes = plan_nodes(plans[0])
    assert all(n["Node Type"] != "Seq Scan" for n in nodes), nodes
    parents = await partition_parents(conn)
    assert {parents[n["Index Name"]] for n in nodes if n.get("Index Name")} == {"cyclone_steps_claim_free"}


async def test_the_claims_plan_made_once_reaches_each_step_by_index(engine: Engine, conn) -> None:
    """The claim's statement is planned once per session, before the limit is known and
    maybe while the tables are small (cyclone_steps_claim, force_generic_plan); that plan
    still reads only the steps it claims, their runs and their parents, by index, when the
    backlog has grown to 30,000 steps since."""
    await engine.enqueue("k")
    first = await fetch(conn, "SELECT step_id FROM cyclone_steps_claim('w', ARRAY['k'], 1, '30 s')")
    assert len(first) == 1  # the plan is made now, with one step in the table
    await conn.execute("INSERT INTO cyclone_runs (id, state) VALUES ('00000000-0000-7000-8000-000000000001', "
                       "'running')")
    await conn.execute("""
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, scheduled_at, max_attempts,
                                   max_reclaims, attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), '00000000-0000-7000-8000-000000000001', 'n' || i, 'k', 'task', 'available',
               now() - make_interval(secs => 30000 - i), 25, 5, '600s', '1s', '600s'
          FROM generate_series(1, 30000) i""")
    plans = await nested_plans(conn, "SELECT node FROM cyclone_steps_claim('w', ARRAY['k'], 5, '30 s')",
                               analyze=True)
    # Its statements: the pick of steps without limits, of those with limits (none here), the update.
    claim = [plan for text, plan in plans if "WITH claimed" in text or "ids := ARRAY" in text
             or "FROM cyclone__limits_pick(p_kinds" in text]
    assert len(claim) == 3, plans
    for plan in claim:
        nodes = plan_nodes(plan)
        assert all(n["Node Type"] not in ("Seq Scan", "Hash Join", "Merge Join") for n in nodes), nodes
        # No node reads more rows than the claim takes (a scan of the backlog would read 30,000).
        assert max(n["Actual Rows"] * n["Actual Loops"] for n in nodes) <= 5, nodes
    assert [p for text, p in plans if "WITH claimed" in text][0]["Actual Rows"] == 5
    claimed = await fetch(conn, "SELECT node FROM cyclone_steps WHERE state = 'running' AND node LIKE 'n%%' "
                                "ORDER BY node")
    assert [r["node"] for r in claimed] == ["n1", "n2", "n3", "n4", "n5"]  # the oldest, in FIFO order


async def test_result_batches_planned_on_small_tables_reach_their_rows_by_index(engine: Engine, conn) -> None:
    """cyclone_results_apply's statements are planned while the tables are small (a new
    database, the first minutes of a server) and the session keeps those plans until the
    next ANALYZE. After the tables have grown to 30,000 runs and steps, they still read
    only the batch's steps, their runs and their dependents, by index."""
    await engine.register_workflow("pair", [task("a"), task("b", "a")])

    def batch(results: list[tuple[Row, int]]) -> str:
        return json.dumps([{"step_id": str(lease["step_id"]), "generation": lease["lease_generation"],
                            "outcome": "completed", "output": out, "output_bytes": len(str(out))}
                           for lease, out in results])

    apply = "SELECT status FROM cyclone_results_apply(%s::jsonb)"
    for _ in range(8):  # past plancache's five custom plans: then the session keeps one plan per statement
        # A job and a node of a DAG run in one batch (both set-based paths), then the DAG's
        # last node alone, which ends its run.
        await engine.enqueue("job")
        await engine.submit_run("pair")
        first = [(await claim_one(engine, "job"), 1), (await claim_one(engine, "a"), 2)]
        assert [r["status"] for r in await fetch(conn, apply, batch(first))] == ["applied"] * 2
        assert [r["status"] for r in await fetch(conn, apply, batch([(await claim_one(engine, "b"), 3)]))] == [
            "applied"]
    await conn.execute("""
        WITH r AS (INSERT INTO cyclone_runs (id, state) SELECT cyclone_uuid7(), 'running'
                     FROM generate_series(1, 30000) RETURNING id)
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims,
                                   attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone_uuid7(), r.id, 'n', 'elsewhere', 'task', 'available', 25, 5, '600s', '1s', '600s' FROM r""")

    job = (await engine.enqueue("job"))[0]
    run_id, _ = await engine.submit_run("pair")
    plans = await nested_plans(conn, apply, batch([(await claim_one(engine, "job"), 1),
                                                   (await claim_one(engine, "a"), 2)]), analyze=True)
    assert (await run_row(conn, job))["state"] == "completed"
    assert (await states(conn, run_id)) == {"a": "completed", "b": "available"}
    plans += await nested_plans(conn, apply, batch([(await claim_one(engine, "b"), 3)]), analyze=True)
    assert (await run_row(conn, run_id))["state"] == "completed"
    # A scan of either table reads 30,000 rows. By index, a node reads the rows of the batch
    # (a bitmap index scan counts the entries of their dead versions too): a few dozen at most.
    wide = wide_nodes(plans, 50)
    assert wide == {}, "\n".join(f"{t}: {v}" for t, v in wide.items())


async def test_the_hot_paths_plans_made_on_small_tables_reach_their_rows_by_index(db_url: str) -> None:
    """One server session makes the plans of its hot statements while the tables are small
    (enqueue, submit, claim, renew, release, results, the next due time, the scanners) and
    keeps them. Once the tables hold
    30,000 more runs and steps, available and running, those plans still read only the rows
    of the call, by index."""
    one = await Engine.open(db_url, min_size=1, max_size=1)  # one session: every call shares its plans
    try:
        await one.register_workflow("pair", [task("a"), task("b", "a")])

        async def work() -> None:
            await one.enqueue_many([Job("job"), Job("job")])
            await one.submit_run("pair")
            held = [(lease.step_id, lease.lease_generation)
                    for lease in await one.claim_leases("w1", ["job", "a"], 10, 30.0)]
            assert len(held) == 3
            assert await one.renew("w1", held, 30.0) == []
            assert [o for _, o in await one.release("w1", held[:1])] == ["reclaimed"]
            assert [s for _, _, s in await one.apply_results(
                [Result(sid, gen, "completed", output=1) for sid, gen in held[1:]])] == ["applied"] * 2
            rest = await one.claim_leases("w1", ["job", "a", "b"], 10, 30.0)
            assert [s for _, _, s in await one.apply_results(
                [Result(lease.step_id, lease.lease_generation, "completed", output=2) for lease in rest])] == [
                "applied"] * len(rest)
            await one.next_due(["job", "a", "b"])
            assert set((await one.sweep()).values()) <= {0}  # the scanners, every second on a server

        for _ in range(8):  # past plancache's five custom plans
            await work()
        async with one.pool.connection() as c:
            await c.execute("""
                WITH r AS (INSERT INTO cyclone_runs (id, state) SELECT cyclone_uuid7(), 'running'
                             FROM generate_series(1, 30000) RETURNING id)
                INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, lease_owner, lease_expiry,
                                           lease_generation, max_attempts, max_reclaims, attempt_timeout,
                                           backoff_initial, backoff_max)
                SELECT cyclone_uuid7(), r.id, 'n', 'elsewhere', 'task',
                       CASE WHEN random() < 0.5 THEN 'available' ELSE 'running' END, 'w2', now() + interval '1 h',
                       1, 25, 5, '600s', '1s', '600s' FROM r""")
            plans, _ = await log_plans(c, analyze=True)
        await work()  # on the same session, its plans logged
    finally:
        await one.close()
    # A scan of either table reads 15,000 to 30,000 rows; by index, a node reads the rows of
    # the call (a bitmap index scan counts the entries of their dead versions too).
    assert len(plans) > 20
    wide = wide_nodes(plans, 50)
    assert wide == {}, "\n".join(f"{t}: {v}" for t, v in wide.items())


JIT_OFF = ("cyclone__steps_claim", "cyclone_steps_claim", "cyclone_steps_next_due", "cyclone_results_apply", "cyclone__limits_pick",
           "cyclone__limits_take", "cyclone__limits_next_due", "cyclone__run_create", "cyclone__promote")


async def test_the_hot_functions_never_jit_compile(engine: Engine, conn) -> None:
    # Their generic plans' estimated costs grow with the backlog and pass jit_above_cost
    # (a million available steps costs about 270,000); a Postgres built with LLVM then
    # compiled the claim on every call (19 ms of JIT for 1.5 ms of work). Checked on the
    # functions' settings everywhere, and where this server can JIT (Debian's Postgres 15
    # in CI), on the claim itself with JIT forced for every statement.
    for name in JIT_OFF:
        config = (await fetch_one(conn, "SELECT proconfig FROM pg_proc WHERE proname = %s", name))["proconfig"]
        assert "jit=off" in config, (name, config)
    # And every function that turns seqscans off: a seqscan it cannot avoid is costed at
    # 10^10 on Postgres 15 to 17, past every JIT threshold, whatever the tables hold.
    unguarded = await fetch(conn, "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'cyclone%%' "
                                  "AND proconfig && ARRAY['enable_seqscan=off', 'enable_seqscan=false', 'enable_seqscan=0'] "
                                  "AND NOT proconfig && ARRAY['jit=off', 'jit=false', 'jit=0']")
    assert unguarded == [], unguarded
    if not (await fetch_one(conn, "SELECT pg_jit_available() AS on"))["on"]:
        return
    await start(engine, [task("a")])
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                    "SET auto_explain.log_level = notice", "SET jit = on", "SET jit_above_cost = 0"):
        await conn.execute(setting)
    await conn.execute("SELECT sum(x) FROM generate_series(1, 10) x")
    assert any("JIT:" in n for n in notices), "auto_explain shows no JIT even for a plain statement"
    notices.clear()
    await conn.execute(Q["steps_claim_leases"], {"owner": "w", "kinds": ["a"], "limit": 10, "lease_ttl": "30 s"})
    # The claim's own statement (the caller's statement around it JIT-compiles here, under
    # jit_above_cost = 0; with the default threshold its cost is far below it).
    claims = [n for n in notices if "WITH claimed AS" in n or "ids := ARRAY" in n]
    assert claims and not any("JIT:" in n for n in claims), "\n\n".join(notices)


PKEYS = {"cyclone_runs_pkey", "cyclone_steps_pkey", "cyclone_step_deps_pkey"}


async def test_results_look_rows_up_by_id_in_no_day_of_history_before_their_runs(engine: Engine, conn) -> None:
    """Every run's steps and edges are in its day of history (migration 0014: a step's id
    starts with its run's). With a month of history before today, a DAG's results look their
    steps, edges and runs up by id (primary keys) in no day before their runs' (today's):
    set-based (promotions, the run's end and its result) and one at a time (a lease answered
    twice goes through cyclone__step_complete, a permanent failure through fail-fast). Under
    the batch's generic plans, by id = ANY alone, which prunes no partition, they would read
    every day's primary key. (A lookup
    by run_id or dep_id still reads every day's index: bounded by an id range, a plan made on
    small tables could read the range through the primary key.)"""
    await history_from(conn, 30)
    parents = await partition_parents(conn)
    table_of = {r["ix"]: r["tab"] for r in await fetch(conn, "SELECT indexrelid::regclass::text AS ix, "
                                                             "indrelid::regclass::text AS tab FROM pg_index")}
    run_ids = [await start(engine, DIAMOND, input={"n": i}) for i in range(4)]
    days = await fetch(conn, "SELECT d.suffix, d.lo <= %s::uuid AND %s::uuid < d.hi AS today, d.hi <= %s::uuid AS past "
                             "FROM cyclone_history_days d", min(run_ids), max(run_ids), min(run_ids))
    today = [d["suffix"] for d in days if d["today"]]  # (two when the runs straddle midnight, UTC)
    before = {f"{t}_{d['suffix']}" for d in days if d["past"] for t in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps")}
    assert len(before) == 3 * 31  # the first partition and 30 days
    apply = "SELECT status FROM cyclone_results_apply(%s::jsonb)"

    def batch(leases: list[Row], twice: str, fail: str) -> str:
        items = []
        for lease in leases:
            item = {"step_id": str(lease["step_id"]), "generation": lease["lease_generation"],
                    "outcome": "completed", "output": lease["node"], "output_bytes": 8}
            if str(lease["run_id"]) == fail:
                item = {**item, "outcome": "failed", "message": "no", "permanent": True}
            items += [item, item] if str(lease["run_id"]) == twice else [item]
        return json.dumps(items)

    read: set[str] = set()
    for kinds in (["root"], [f"m{i}" for i in range(4)], ["join"]):
        leases = await claim_all(engine, kinds)
        plans = await nested_plans(conn, apply, batch(leases, twice=run_ids[1], fail=run_ids[3]), analyze=True)
        for _, plan in plans:
            for n in plan_nodes(plan):
                name = n.get("Index Name")
                if name and parents.get(name) in PKEYS and n.get("Actual Loops", 0) > 0:
                    read.add(table_of[name])
    assert {(await run_row(conn, r))["state"] for r in run_ids[:3]} == {"completed"}
    assert (await run_row(conn, run_ids[1]))["result"] == {"join": "join"}
    assert (await run_row(conn, run_ids[3]))["state"] == "failed"
    assert {f"{t}_{d}" for d in today for t in ("cyclone_steps", "cyclone_step_deps", "cyclone_runs")} & read
    assert read & before == set(), sorted(read & before)


async def test_failures_and_snoozes_planned_on_small_tables_reach_their_rows_by_index(engine: Engine, conn) -> None:
    """cyclone_results_apply keeps one generic plan per statement for the session, also for
    the per-result functions it calls (a retry, fail-fast, a snooze, a lease answered twice),
    made while the tables were small. Once the tables hold 30,000 more runs and steps, those
    plans still read only the rows of the batch, by index."""
    await engine.register_workflow("pair", [task("a"), task("b", "a")])
    apply = "SELECT status FROM cyclone_results_apply(%s::jsonb) ORDER BY idx"

    async def batch() -> list[str]:
        await engine.enqueue("retried")
        await engine.enqueue("snoozed")
        await engine.enqueue("twice")
        await engine.submit_run("pair")
        items = [
            {"step_id": str((await claim_one(engine, "retried"))["step_id"]), "outcome": "failed",
             "message": "again", "retry_delay_ms": 0},
            {"step_id": str((await claim_one(engine, "snoozed"))["step_id"]), "outcome": "snoozed", "delay_ms": 0},
            {"step_id": str((await claim_one(engine, "a"))["step_id"]), "outcome": "failed", "message": "no",
             "permanent": True},
        ]
        twice = await claim_one(engine, "twice")
        items += [{"step_id": str(twice["step_id"]), "outcome": "completed", "output": 1, "output_bytes": 1}] * 2
        for item in items:
            item["generation"] = 1
        return [r["status"] for r in await fetch(conn, apply, json.dumps(items))]

    expected = ["retried", "snoozed", "discarded", "applied", "ended"]
    for _ in range(8):  # past plancache's five custom plans (the function forces generic ones anyway)
        assert await batch() == expected
        await conn.execute("UPDATE cyclone_steps SET state = 'completed' WHERE state IN ('available', 'pending')")
    await conn.execute("""
        WITH r AS (INSERT INTO cyclone_runs (id, state) SELECT cyclone_uuid7(), 'running'
                     FROM generate_series(1, 30000) RETURNING id)
        INSERT INTO cyclone_steps (id, run_id, node, kind, type, state, max_attempts, max_reclaims,
                                   attempt_timeout, backoff_initial, backoff_max)
        SELECT cyclone__step_uuid(r.id), r.id, 'n', 'elsewhere', 'task', 'available', 25, 5, '600s', '1s', '600s'
          FROM r""")
    plans, keep = await log_plans(conn, analyze=True)
    try:
        assert await batch() == expected
    finally:
        await conn.execute("RESET auto_explain.log_min_duration")
        conn.remove_notice_handler(keep)
    assert any("cancel_cause = p_cause" in text for text, _ in plans)  # fail-fast cancelled the run's steps
    wide = wide_nodes(plans, 50)
    assert wide == {}, "\n".join(f"{t}: {v}" for t, v in wide.items())


async def test_a_renewal_reads_no_day_of_history_outside_its_leases(engine: Engine, conn) -> None:
    """A worker's lease renewal (cyclone_leases_renew) updates its steps by id = ANY, which
    prunes no partition: bounded by the leases' own ids, it reads their day alone, not a
    month of history before it. It still renews every lease it holds and names the lost one."""
    await history_from(conn, 30)
    parents = await partition_parents(conn)
    table_of = {r["ix"]: r["tab"] for r in await fetch(conn, "SELECT indexrelid::regclass::text AS ix, "
                                                             "indrelid::regclass::text AS tab FROM pg_index")}
    for _ in range(5):
        await engine.enqueue("job")
    leases = await engine.claim("w1", ["job"], limit=10, lease_ttl=5)
    assert len(leases) == 5
    lost = leases[0]
    await conn.execute("UPDATE cyclone_steps SET lease_generation = lease_generation + 1 WHERE id = %s",
                       (lost["step_id"],))
    # (the days from the first lease's to the last's: two when they straddle midnight, UTC)
    days = await fetch(conn, "SELECT d.suffix FROM cyclone_history_days d WHERE d.hi > %s::uuid AND d.lo <= %s::uuid",
                       min(str(x["step_id"]) for x in leases), max(str(x["step_id"]) for x in leases))
    own = {f"cyclone_steps_{d['suffix']}" for d in days}
    renew = ("SELECT step_id, lease_generation FROM cyclone_leases_renew('w1', %s::uuid[], %s::bigint[], "
             "interval '1 hour')")
    args = ([x["step_id"] for x in leases], [x["lease_generation"] for x in leases])
    plans = await nested_plans(conn, renew, *args, analyze=True)
    # (the plans logged, the renewal is made again: it renews the same leases and names the lost one)
    assert [(r["step_id"], r["lease_generation"]) for r in await fetch(conn, renew, *args)] == [
        (lost["step_id"], lost["lease_generation"])]
    rows = await fetch(conn, "SELECT id, lease_expiry > now() + interval '30 min' AS renewed FROM cyclone_steps "
                             "WHERE id = ANY (%s::uuid[])", [x["step_id"] for x in leases])
    assert {r["id"]: r["renewed"] for r in rows} == {x["step_id"]: x is not lost for x in leases}
    read = {table_of.get(name, name) for _, plan in plans for n in plan_nodes(plan)
            if (name := n.get("Index Name") or n.get("Relation Name")) and n.get("Actual Loops", 0) > 0}
    assert read and {t for t in read if t in parents} <= own, sorted({t for t in read if t in parents} - own)
