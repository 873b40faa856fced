-- Retention and purge: terminal runs stay until they are eligible and something deletes them.
--
-- A terminal run (completed, failed, cancelled) is eligible p_age after it finished, or its
-- own retention (the largest WithRetention of its nodes) after, when it has one. A paused run
-- is not terminal and is never deleted. A terminal child run stays until its parent run
-- completes or is deleted (deleting a run deletes its child runs, steps, edges and signals).

-- Delete at most p_limit eligible runs, each with its child runs to any depth and their steps,
-- edges and signals (no foreign key cascades them: migration 0012). Returns how many eligible
-- runs it deleted, their child runs not counted.
-- The retention sweep (p_sweep): a run with a retention of its own is eligible that long
-- after it finished, any other p_age after (p_age NULL: only runs with a retention).
-- PurgeTerminalRuns (not p_sweep): runs finished at least p_age ago, and never before their
-- own retention has passed ("eligible for purge d after the run finishes").
-- The eligible runs are locked (SKIP LOCKED: a run another purge or a Retry holds is left to
-- the next batch), then their child runs; the rows of the trees are deleted one table at a
-- time, each through an index on the run's id. Without JIT: the estimate of a large batch's
-- search passes jit_optimize_above_cost, and compiling it took half of a 20,000-run batch.
DROP FUNCTION IF EXISTS cyclone_runs_purge(interval, integer);
CREATE OR REPLACE FUNCTION cyclone_runs_purge(p_age interval, p_limit integer, p_sweep boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    victims uuid[];
    level uuid[];
    doomed uuid[];
BEGIN
    SELECT array_agg(v.id) INTO victims FROM (
        SELECT r.id FROM cyclone_runs r
         WHERE r.state IN ('completed', 'failed', 'cancelled')
           AND r.finished_at <= now() - CASE WHEN p_sweep THEN COALESCE(r.retention, p_age)
                                             ELSE greatest(p_age, COALESCE(r.retention, p_age)) END
           AND (r.parent_run_id IS NULL
                OR EXISTS (SELECT 1 FROM cyclone_runs p WHERE p.id = r.parent_run_id AND p.state = 'completed'))
         ORDER BY r.finished_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED) v;
    IF victims IS NULL THEN
        RETURN 0;
    END IF;
    -- Their trees, level by level, each child run locked before its own children are read:
    -- a child run is only made under a run locked by the one who makes it (child_attach, a
    -- Retry), so none can appear under a locked run before this transaction ends.
    doomed := victims;
    level := victims;
    LOOP
        SELECT array_agg(c.id) INTO level FROM (
            SELECT c.id FROM unnest(level) AS p (id) JOIN cyclone_runs c ON c.parent_run_id = p.id
             ORDER BY c.id FOR UPDATE OF c) c;
        EXIT WHEN level IS NULL;
        doomed := doomed || level;
    END LOOP;
    DELETE FROM cyclone_signals g USING unnest(doomed) AS d (id) WHERE g.run_id = d.id;
    DELETE FROM cyclone_step_deps e USING unnest(doomed) AS d (id) WHERE e.run_id = d.id;
    DELETE FROM cyclone_steps s USING unnest(doomed) AS d (id) WHERE s.run_id = d.id;
    DELETE FROM cyclone_runs r USING unnest(doomed) AS d (id) WHERE r.id = d.id;
    RETURN cardinality(victims);
END $$;

-- How many runs PurgeTerminalRuns with this p_age would delete now, all batches together
-- (its dry run): the predicate of cyclone_runs_purge without p_sweep, kept next to it.
CREATE OR REPLACE FUNCTION cyclone_runs_purge_count(p_age interval)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM cyclone_runs r
     WHERE r.state IN ('completed', 'failed', 'cancelled')
       AND r.finished_at <= now() - greatest(p_age, COALESCE(r.retention, p_age))
       AND (r.parent_run_id IS NULL
            OR EXISTS (SELECT 1 FROM cyclone_runs p WHERE p.id = r.parent_run_id AND p.state = 'completed'))
$$;
