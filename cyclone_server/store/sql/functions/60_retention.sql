-- Retention and purge: terminal runs stay until they are eligible and something deletes them.
--
-- A terminal run (completed, failed, cancelled) is eligible p_age after it finished, or its
-- own retention (the largest WithRetention of its nodes) after, when it has one. A paused run
-- is not terminal and is never deleted. A terminal child run stays until its parent run
-- completes or is deleted (deleting a run deletes its child runs, steps, edges and signals).

-- Delete at most p_limit eligible runs.
-- The retention sweep (p_sweep): a run with a retention of its own is eligible that long
-- after it finished, any other p_age after (p_age NULL: only runs with a retention).
-- PurgeTerminalRuns (not p_sweep): runs finished at least p_age ago, and never before their
-- own retention has passed ("eligible for purge d after the run finishes").
DROP FUNCTION IF EXISTS cyclone_runs_purge(interval, integer);
CREATE OR REPLACE FUNCTION cyclone_runs_purge(p_age interval, p_limit integer, p_sweep boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    WITH victims AS (
        SELECT r.id FROM cyclone_runs r
         WHERE r.state IN ('completed', 'failed', 'cancelled')
           AND r.finished_at <= now() - CASE WHEN p_sweep THEN COALESCE(r.retention, p_age)
                                             ELSE greatest(p_age, COALESCE(r.retention, p_age)) END
           AND (r.parent_run_id IS NULL
                OR EXISTS (SELECT 1 FROM cyclone_runs p WHERE p.id = r.parent_run_id AND p.state = 'completed'))
         ORDER BY r.finished_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM cyclone_runs r USING victims WHERE r.id = victims.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
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
