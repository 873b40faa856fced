-- The uniqueness of idempotency keys, kept by a partial index of the runs that have one.
--
-- The UNIQUE constraint's index held an entry for every run, NULL keys included, and since
-- every change of a run's state makes a new row version (never a HOT update: `state` is
-- indexed), each submit and each run ending wrote an entry into it for nothing. Most runs
-- have no key. The lookup by key (cyclone__run_begin) uses the partial index as it did the
-- full one. The new index is built before the constraint goes, so keys stay unique
-- throughout; building it blocks writes to cyclone_runs for as long as it takes.
CREATE UNIQUE INDEX cyclone_runs_idempotency_key ON cyclone_runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
ALTER TABLE cyclone_runs DROP CONSTRAINT cyclone_runs_idempotency_key_key;
