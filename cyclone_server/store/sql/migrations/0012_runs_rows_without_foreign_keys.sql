-- A run's rows without foreign keys: deleting runs cascades once per statement.
--
-- Steps, their edges, signals and child runs referenced their run with ON DELETE CASCADE.
-- Postgres checks and cascades a foreign key row by row, in a trigger: inserting a step
-- locked its run's row again (FOR KEY SHARE), and deleting a run ran one query per
-- referencing table for that run, found rows or not. In a purge those triggers took three
-- quarters of the time (EXPLAIN ANALYZE of 20,000 runs: 345 of 479 ms), and an enqueue
-- paid for a check of a run it had just inserted.
--
-- The cascade is now one trigger per DELETE statement on cyclone_runs: it deletes the
-- signals, edges and steps of every run the statement deleted, set by set through the
-- indexes on run_id, then their child runs, which fires it again for those (to any depth;
-- runs nest at most 32 levels). Whatever deletes runs (the purge, an operator's DELETE, a
-- server of an earlier release that purges through the cascade) leaves nothing behind.
-- What the keys checked on insert is held by the functions, the only writers: a run's
-- steps and edges are inserted with the run, in its transaction (cyclone__run_create,
-- cyclone__jobs_create); a signal only into a running or paused run, locked
-- (cyclone_run_signal); a child run only under a running parent, locked by its maker.
ALTER TABLE cyclone_steps DROP CONSTRAINT IF EXISTS cyclone_steps_run_id_fkey;
ALTER TABLE cyclone_step_deps DROP CONSTRAINT IF EXISTS cyclone_step_deps_run_id_fkey;
ALTER TABLE cyclone_signals DROP CONSTRAINT IF EXISTS cyclone_signals_run_id_fkey;
ALTER TABLE cyclone_runs DROP CONSTRAINT IF EXISTS cyclone_runs_parent_run_id_fkey;

-- Each delete probes an index on run_id (parent_run_id) for the ids the statement deleted,
-- whatever their number: the plans are kept by the connection from the first firing, and a
-- join planned for that one's rows (a hash join over the whole steps table after a purge of
-- thousands of runs) would be used for every later firing, of a few.
CREATE FUNCTION cyclone__runs_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
BEGIN
    ids := ARRAY(SELECT d.id FROM gone d);
    IF cardinality(ids) = 0 THEN  -- (a statement fires it with no row too)
        RETURN NULL;
    END IF;
    DELETE FROM cyclone_signals WHERE run_id = ANY (ids);
    DELETE FROM cyclone_step_deps WHERE run_id = ANY (ids);
    DELETE FROM cyclone_steps WHERE run_id = ANY (ids);
    DELETE FROM cyclone_runs WHERE parent_run_id = ANY (ids);
    RETURN NULL;
END $$;

CREATE TRIGGER cyclone_runs_deleted AFTER DELETE ON cyclone_runs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION cyclone__runs_deleted();
