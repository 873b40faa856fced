-- Retention and purge: terminal runs stay until they are eligible and something deletes them.
--
-- A terminal run (completed, failed, cancelled) is eligible p_age after it finished, or its
-- own retention (the largest WithRetention of its nodes) after, when it has one. A paused run
-- is not terminal and is never deleted. A terminal child run stays until its parent run
-- completes or is deleted (deleting a run deletes its child runs, steps, edges and signals).

-- Whether a terminal run that finished at p_finished, with its own p_retention, is old
-- enough now. The retention sweep (p_sweep): a run with a retention of its own is eligible
-- that long after it finished, any other p_age after (p_age NULL: only runs with a
-- retention). PurgeTerminalRuns (not p_sweep): runs finished at least p_age ago, and never
-- before their own retention has passed ("eligible for purge d after the run finishes").
-- (Plain arguments, no subquery: Postgres inlines it into the queries below.)
CREATE OR REPLACE FUNCTION cyclone__purge_due(p_finished timestamptz, p_retention interval, p_age interval,
                                              p_sweep boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT COALESCE(p_finished <= now() - CASE WHEN p_sweep THEN COALESCE(p_retention, p_age)
                                               ELSE greatest(p_age, COALESCE(p_retention, p_age)) END, false)
$$;

-- Whether a child run of p_parent may be picked on its own: its parent has completed (until
-- then, a retry of the parent's node could reuse it) and is not eligible itself (its
-- child runs go with it). The parents are read by scalar subqueries, an index probe each:
-- an EXISTS may be planned as a hash of every completed run, built at each call.
CREATE OR REPLACE FUNCTION cyclone__purge_alone(p_parent uuid, p_age interval, p_sweep boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT p.state = 'completed'
                            AND NOT (cyclone__purge_due(p.finished_at, p.retention, p_age, p_sweep)
                                     AND (p.parent_run_id IS NULL
                                          OR COALESCE((SELECT g.state FROM cyclone_runs g
                                                        WHERE g.id = p.parent_run_id) = 'completed', false)))
                       FROM cyclone_runs p WHERE p.id = p_parent), false)
$$;

-- Delete at most p_limit of the runs a purge picks (below), oldest finished first, each
-- with its child runs to any depth and the steps, edges and signals of all of them; returns
-- how many it picked (their child runs not counted). Runs another transaction holds locked
-- (a Retry) are left to the next call (SKIP LOCKED). Without JIT: the estimate of a large
-- batch's search passes jit_optimize_above_cost, and compiling it took half of a 20,000-run
-- batch.
DROP FUNCTION IF EXISTS cyclone_runs_purge(interval, integer);
CREATE OR REPLACE FUNCTION cyclone_runs_purge(p_age interval, p_limit integer, p_sweep boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    n bigint;
BEGIN
    -- Purges take turns (each call is short): two at once could pick runs of one tree, one
    -- locking its top and deleting down to a run the other picked, while the other deletes
    -- down to one the first picked (a child run whose parent waits longer sits between).
    PERFORM pg_advisory_xact_lock(hashtextextended('cyclone.purge', 0));
    -- A terminal run is eligible when it is old enough and, if a child run, its parent has
    -- completed. The purge picks the eligible runs whose parent is not eligible itself: a
    -- run's child runs go with it (migration 0012's trigger deletes them and their rows).
    WITH victims AS (
        SELECT r.id FROM cyclone_runs r
         WHERE r.state IN ('completed', 'failed', 'cancelled')
           AND cyclone__purge_due(r.finished_at, r.retention, p_age, p_sweep)
           AND (r.parent_run_id IS NULL OR cyclone__purge_alone(r.parent_run_id, p_age, p_sweep))
         ORDER BY r.finished_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM cyclone_runs r USING victims WHERE r.id = victims.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- How many runs PurgeTerminalRuns with this p_age would pick now, all calls together (its
-- dry run): cyclone_runs_purge's predicate without p_sweep.
CREATE OR REPLACE FUNCTION cyclone_runs_purge_count(p_age interval)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM cyclone_runs r
     WHERE r.state IN ('completed', 'failed', 'cancelled')
       AND cyclone__purge_due(r.finished_at, r.retention, p_age, false)
       AND (r.parent_run_id IS NULL OR cyclone__purge_alone(r.parent_run_id, p_age, false))
$$;
