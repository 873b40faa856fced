-- History in day partitions: runs, steps and their edges partitioned by the time in their ids.
--
-- Terminal runs stayed in the tables the queue works in until the retention purge deleted
-- them row by row: a day of a busy queue (a million runs) took the purge seconds of one of
-- the machine's cores and its writes, beside the drain (docs/benchmarks.md, history.py).
-- cyclone_runs (by id), cyclone_steps (by id) and cyclone_step_deps (by step_id) are now
-- partitioned by RANGE of those uuid7 ids, one partition per UTC day of their first 48 bits
-- (the creation time in milliseconds), the same bounds for the three. A step's id carries
-- its run's first 64 bits (cyclone__step_uuid), so a run, its steps and their edges always
-- fall in one day: a day whose runs are all eligible for purge goes as whole partitions
-- (cyclone_history_drop), not row by row. cyclone_history_days lists the days; servers make
-- the coming days ahead (cyclone_history_ensure). Signals stay in one table: a dropped
-- day's signals and child runs of later days are deleted after it, by the range of its ids.
--
-- A unique index of a partitioned table must hold the partition key, so three keys are no
-- longer unique indexes, and what kept them unique does so alone:
-- - idempotency_key: every writer takes the key's advisory lock, then looks it up
--   (cyclone__run_begin, cyclone_jobs_enqueue), and inserts only if it found none;
-- - (schedule_name, schedule_fire_at): the compare-and-set of the schedule's next fire time,
--   in the transaction that makes the run (cyclone_schedule_fire), under the schedule's row;
-- - (run_id, node): a run's steps are inserted once, by the function that makes the run,
--   from a definition whose node ids are unique (definitions.py).
--
-- The tables as they were become the first partition, of every id before a bound at least a
-- day ahead. Attaching a table as a partition reads it all, under the lock the statement
-- holds, unless a valid CHECK constraint already proves its bound; and the unique indexes'
-- plain replacements must exist to be kept. So before this file runs (in its own
-- transaction, like every migration), the migrator adds those constraints NOT VALID and
-- validates them, and builds the plain indexes CONCURRENTLY: writes go on meanwhile
-- (migrate.py, _PREPARE). This file then only renames, attaches and drops: a short lock.
-- On a database without them (SQL applied by hand) it reads the tables under the lock.

-- The uuid that starts the UTC day of p_at: its first 48 bits that day's first millisecond,
-- the rest zero, so every uuid7 made that day sorts at or after it. (10_core.sql keeps it.)
CREATE OR REPLACE FUNCTION cyclone__day_uuid(p_at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(substring(int8send((extract(epoch FROM date_trunc('day', p_at AT TIME ZONE 'UTC'))::bigint * 1000)) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

DO $$
DECLARE
    bound uuid;
    found uuid;
    t record;
    v record;
    views text[] := '{}';
    f regprocedure;
    n integer;
BEGIN
    -- The three tables' locks first, in one order, waiting at most 5 s (tried again at the
    -- next start): taken one by one below, the first would be held while waiting for the
    -- next, and every call that touches runs would wait with it.
    SET LOCAL lock_timeout = '5s';
    LOCK TABLE cyclone_runs, cyclone_steps, cyclone_step_deps IN ACCESS EXCLUSIVE MODE;
    RESET lock_timeout;
    -- The views over these tables are bound to them: made again over the new parents below.
    FOR v IN SELECT DISTINCT c.oid::regclass::text AS name, pg_get_viewdef(c.oid) AS def
               FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class c ON c.oid = r.ev_class
              WHERE d.refobjid IN ('cyclone_runs'::regclass, 'cyclone_steps'::regclass, 'cyclone_step_deps'::regclass)
                AND c.relkind = 'v' LOOP
        views := views || format('CREATE OR REPLACE VIEW %s AS %s', v.name, v.def);
        EXECUTE format('DROP VIEW %s', v.name);
    END LOOP;
    -- Functions taking or returning these tables' row types: the function files make them
    -- again, over the new parents' types (all function files are applied again, below).
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.prorettype IN (SELECT reltype FROM pg_class WHERE relname IN ('cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'))
                 OR p.proargtypes::oid[] && ARRAY(SELECT reltype FROM pg_class
                                                   WHERE relname IN ('cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'))::oid[] LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
    DROP TRIGGER IF EXISTS cyclone_runs_deleted ON cyclone_runs;
    DROP TRIGGER IF EXISTS cyclone_steps_fair_insert ON cyclone_steps;
    DROP TRIGGER IF EXISTS cyclone_steps_fair_update ON cyclone_steps;
    DROP TRIGGER IF EXISTS cyclone_steps_slot_freed ON cyclone_steps;

    -- The bound: the one the prepared constraints hold, when all three hold the same one.
    FOR t IN SELECT * FROM (VALUES ('cyclone_runs'), ('cyclone_steps'), ('cyclone_step_deps')) x (name) LOOP
        SELECT substring(pg_get_constraintdef(c.oid) FROM '''([0-9a-f-]{36})''')::uuid INTO found
          FROM pg_constraint c
         WHERE c.conrelid = t.name::regclass AND c.conname = t.name || '_before_partitions' AND c.convalidated;
        IF found IS NULL OR (bound IS NOT NULL AND found <> bound) THEN
            bound := NULL;
            EXIT;
        END IF;
        bound := found;
    END LOOP;
    IF bound IS NULL OR bound < cyclone__day_uuid(now() + interval '1 hour') THEN
        -- Not prepared (or prepared long ago): the next day but one, read under the lock.
        bound := cyclone__day_uuid(now() + interval '2 days');
    END IF;

    -- The plain replacements of the unique keys (built beforehand when prepared).
    CREATE INDEX IF NOT EXISTS cyclone_runs_idempotency_any ON cyclone_runs (idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX IF NOT EXISTS cyclone_runs_schedule_fire_any ON cyclone_runs (schedule_name, schedule_fire_at)
        WHERE schedule_name IS NOT NULL;
    CREATE INDEX IF NOT EXISTS cyclone_steps_run_node ON cyclone_steps (run_id, node);
    DROP INDEX cyclone_runs_idempotency_key;
    DROP INDEX cyclone_runs_schedule_fire;
    ALTER TABLE cyclone_steps DROP CONSTRAINT cyclone_steps_run_id_node_key;

    -- The tables become the first partitions; their indexes keep their definitions, under
    -- names of the partition, and are attached to the parents' indexes of the same names.
    FOR t IN SELECT * FROM (VALUES ('cyclone_runs', 'id'), ('cyclone_steps', 'id'), ('cyclone_step_deps', 'step_id')) x (name, key) LOOP
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t.name, t.name || '_first');
        FOR v IN SELECT i.indexrelid::regclass::text AS name FROM pg_index i
                  WHERE i.indrelid = (t.name || '_first')::regclass LOOP
            EXECUTE format('ALTER INDEX %I RENAME TO %I', v.name, 'first_' || v.name);
        END LOOP;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE) '
                       'PARTITION BY RANGE (%I)', t.name, t.name || '_first', t.key);
        -- (the prepared bound constraint is not copied: it is the first partition's alone)
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS %I', t.name, t.name || '_before_partitions');
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       t.name, t.name || '_first', bound);
        -- (its work done: the partition's bound says the same)
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS %I', t.name || '_first', t.name || '_before_partitions');
        -- Each index of the first partition made again on the parent: Postgres attaches the
        -- partition's own, which matches, instead of building one.
        FOR v IN SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def,
                        i.indisprimary AS pk
                   FROM pg_index i WHERE i.indrelid = (t.name || '_first')::regclass LOOP
            IF v.pk THEN
                EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', t.name, t.name || '_pkey',
                               (SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
                                 WHERE c.conindid = v.name::regclass AND c.contype = 'p'));
            ELSE
                EXECUTE regexp_replace(
                    replace(v.def, ' ONLY ', ' '),
                    '^CREATE (UNIQUE )?INDEX first_(\S+) ON (public\.)?' || t.name || '_first ',
                    'CREATE \1INDEX \2 ON ' || t.name || ' ');
            END IF;
        END LOOP;
    END LOOP;

    SELECT count(*) INTO n FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid IN ('cyclone_runs_first'::regclass, 'cyclone_steps_first'::regclass, 'cyclone_step_deps_first'::regclass)
       AND NOT c.relispartition;
    IF n > 0 THEN
        RAISE EXCEPTION 'history partitions: % index(es) of the first partitions were not attached to their parents', n;
    END IF;

    CREATE TRIGGER cyclone_runs_deleted AFTER DELETE ON cyclone_runs
        REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION cyclone__runs_deleted();
    FOR n IN 1 .. coalesce(array_length(views, 1), 0) LOOP
        EXECUTE views[n];
    END LOOP;

    CREATE TABLE cyclone_history_days (
        lo     uuid PRIMARY KEY,  -- the nil uuid for the first partition (MINVALUE)
        hi     uuid NOT NULL,
        suffix text NOT NULL UNIQUE
    );
    INSERT INTO cyclone_history_days VALUES ('00000000-0000-0000-0000-000000000000', bound, 'first');
    -- Ranges of dropped days whose signals and child runs in later days are still to delete.
    CREATE TABLE cyclone_history_dropped (lo uuid PRIMARY KEY, hi uuid NOT NULL);

    -- Every function file is applied again: some were dropped above with the row types.
    DELETE FROM cyclone_migrations WHERE name LIKE 'functions/%';
END $$;
