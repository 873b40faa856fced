-- A run's rows without foreign keys.
--
-- Steps, their edges, signals and child runs referenced their run with ON DELETE CASCADE.
-- Postgres checks and cascades a foreign key row by row, in a trigger: inserting a step
-- locked its run's row again (FOR KEY SHARE), and deleting a run ran one query per
-- referencing table for that run, found rows or not. In a purge those triggers took three
-- quarters of the time (EXPLAIN ANALYZE of 20,000 runs: 345 of 479 ms), and an enqueue
-- paid for a check of a run it had just inserted.
--
-- What the keys guarded is held by the functions instead, which are the only writers:
-- a run's steps and edges are inserted with the run, in its transaction (cyclone__run_create,
-- cyclone__jobs_create); a signal only into a running or paused run, locked
-- (cyclone_run_signal); a child run only under a running parent's step. Runs are deleted
-- only by cyclone_runs_purge, which deletes each run with its child runs to any depth and
-- their steps, edges and signals, set by set (60_retention.sql). The indexes that served
-- the cascades (steps' (run_id, node), cyclone_step_deps_run, cyclone_signals_run,
-- cyclone_runs_parent) serve it.
ALTER TABLE cyclone_steps DROP CONSTRAINT IF EXISTS cyclone_steps_run_id_fkey;
ALTER TABLE cyclone_step_deps DROP CONSTRAINT IF EXISTS cyclone_step_deps_run_id_fkey;
ALTER TABLE cyclone_signals DROP CONSTRAINT IF EXISTS cyclone_signals_run_id_fkey;
ALTER TABLE cyclone_runs DROP CONSTRAINT IF EXISTS cyclone_runs_parent_run_id_fkey;
