-- Autovacuum thresholds of the queue tables: by dead rows, not by a share of the table.
--
-- Every step is updated at least twice (claimed, then ended) and its run once, so these
-- tables make dead rows as fast as they do work. Autovacuum's default waits for 20% of
-- the table to be dead: with a million committed steps, that is 200,000 dead rows, and
-- the entries they leave in the partial claim index (cyclone_steps_claim) sit at its head,
-- where every claim walks over them. A fixed threshold keeps a vacuum coming every few
-- seconds of a busy queue, whatever the table's size; the insert threshold does the same
-- for a table that only grows (a backlog being loaded), so its visibility map stays fresh.
ALTER TABLE cyclone_steps SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 20000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 50000,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE cyclone_runs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 20000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 50000,
    autovacuum_analyze_scale_factor = 0.02
);
