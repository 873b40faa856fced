-- Days of history: the partitions of cyclone_runs, cyclone_steps and cyclone_step_deps
-- (migration 0014), made ahead of time and dropped whole once every run in them may go.
--
-- cyclone_history_days lists the days: [lo, hi) of ids, and the suffix of the three
-- partitions' names (cyclone_runs_<suffix>, ...); the first partition, of every id before
-- the day migration 0014 chose, has lo = the nil uuid and the suffix 'first'. Changes to the
-- list are made under one advisory lock, so several servers may call these at once.

-- The ids of the days that hold p_first to p_last (p_first <= p_last): from the start of the
-- first's day to the end of the last's, the bounds of their partitions. A step and its run
-- are always in one day (their partition: the first one holds both for rows made before
-- migration 0014), so the steps and runs of a batch of steps are within the span of their
-- ids. A statement over many steps by id (= ANY of an array) reads every day's index, as
-- Postgres prunes no partition for an array it is given; with `id >= lo AND id < hi` it
-- prunes the days outside at the statement's start.
CREATE OR REPLACE FUNCTION cyclone__days_span(p_first uuid, p_last uuid, OUT lo uuid, OUT hi uuid)
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT d.lo FROM cyclone_history_days d WHERE d.lo <= p_first ORDER BY d.lo DESC LIMIT 1),
                    '00000000-0000-0000-0000-000000000000'),
           COALESCE((SELECT d.hi FROM cyclone_history_days d WHERE d.lo <= p_last ORDER BY d.lo DESC LIMIT 1),
                    'ffffffff-ffff-ffff-ffff-ffffffffffff')
$$;

-- A uuid's UTC day: the day of the millisecond in its first 48 bits.
CREATE OR REPLACE FUNCTION cyclone__uuid_day(p_id uuid) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
    SELECT (to_timestamp((('x' || substr(replace(p_id::text, '-', ''), 1, 12))::bit(48)::bigint) / 1000.0)
            AT TIME ZONE 'UTC')::date
$$;

-- Make one day: the three tables of ids [p_lo, p_hi) (p_lo NULL: every id before p_hi, the
-- first partition), empty, attached to their parents and listed in cyclone_history_days. The
-- tables take the parents' columns, constraints and indexes, and the storage settings
-- (autovacuum's, migration 0004) of the partitions named p_like_suffix, when given. Attaching
-- an empty table takes the parent's SHARE UPDATE EXCLUSIVE lock, which no claim, result or
-- submit waits for. The caller holds the 'cyclone.history' advisory lock.
CREATE OR REPLACE FUNCTION cyclone__history_day_make(p_lo uuid, p_hi uuid, p_suffix text, p_like_suffix text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t text;
    opts text[];
BEGIN
    FOREACH t IN ARRAY ARRAY['cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                       t || '_' || p_suffix, t);
        SELECT c.reloptions INTO opts FROM pg_class c WHERE c.oid = to_regclass(t || '_' || p_like_suffix);
        IF opts IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I SET (%s)', t || '_' || p_suffix, array_to_string(opts, ', '));
        END IF;
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%L)', t, t || '_' || p_suffix,
                       COALESCE(quote_literal(p_lo), 'MINVALUE'), p_hi);
    END LOOP;
    INSERT INTO cyclone_history_days (lo, hi, suffix)
    VALUES (COALESCE(p_lo, '00000000-0000-0000-0000-000000000000'), p_hi, p_suffix);
END $$;

-- Make the days from the end of the last one to p_days_ahead days after today (UTC), each
-- like the day before (cyclone__history_day_make). Returns how many days it made.
CREATE OR REPLACE FUNCTION cyclone_history_ensure(p_days_ahead integer DEFAULT 2)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    goal uuid := cyclone__day_uuid(now() + make_interval(days => p_days_ahead + 1));
    last cyclone_history_days;
    day date;
    made integer := 0;
BEGIN
    IF (SELECT d.hi FROM cyclone_history_days d ORDER BY d.hi DESC LIMIT 1) >= goal THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('cyclone.history', 0));
    LOOP
        SELECT * INTO last FROM cyclone_history_days d ORDER BY d.hi DESC LIMIT 1;
        EXIT WHEN last.hi >= goal;
        day := cyclone__uuid_day(last.hi);
        PERFORM cyclone__history_day_make(last.hi, cyclone__day_uuid((day + 1)::timestamp AT TIME ZONE 'UTC'),
                                          to_char(day, 'YYYYMMDD'), last.suffix);
        made := made + 1;
    END LOOP;
    RETURN made;
END $$;

-- Whether every run of a day may go now, as cyclone_runs_purge would pick it or take it with
-- its parent (60_retention.sql): terminal, old enough, and either top-level, a child of a run
-- of the same day (which goes too), or one cyclone_runs_purge would pick on its own. Reads the
-- whole day once (cheap checks by index first); returns the number of its runs, or NULL when
-- one of them must stay.
CREATE OR REPLACE FUNCTION cyclone__history_day_due(p_day cyclone_history_days, p_age interval, p_sweep boolean)
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    part text := 'cyclone_runs_' || p_day.suffix;
    n bigint;
    blocked boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''running'', ''paused''))', part)
       INTO blocked;
    IF blocked THEN
        RETURN NULL;
    END IF;
    IF p_age IS NOT NULL THEN  -- the newest end first (cyclone_runs_finished)
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''completed'', ''failed'', ''cancelled'')'
                       ' AND r.finished_at > now() - $1)', part) USING p_age INTO blocked;
        IF blocked THEN
            RETURN NULL;
        END IF;
    END IF;
    EXECUTE format(
        'SELECT count(*), bool_or(NOT (r.state IN (''completed'', ''failed'', ''cancelled'')'
        '   AND cyclone__purge_due(r.finished_at, r.retention, $1, $2)'
        '   AND (r.parent_run_id IS NULL OR (r.parent_run_id >= $3 AND r.parent_run_id < $4)'
        '        OR cyclone__purge_alone(r.parent_run_id, $1, $2))))'
        '  FROM %I r', part)
       USING p_age, p_sweep, p_day.lo, p_day.hi INTO n, blocked;
    IF blocked THEN
        RETURN NULL;
    END IF;
    RETURN n;
END $$;

-- The retention sweep's first part: drop the oldest day before today (UTC) whose runs may all
-- go (cyclone__history_day_due, with cyclone_runs_purge's p_age and p_sweep), as whole
-- partitions: its runs, steps and edges. Returns how many runs went with it (0: an empty day);
-- -1 when a day may go but its lock was not had in five tries (try again later); NULL
-- when no day may go.
--
-- Dropping a partition takes its parent's ACCESS EXCLUSIVE lock, which every claim and
-- result waits for, and which waits for every transaction using the parent. The day is read
-- before (no lock but the readers'), so the lock is held only to check again, by index, that
-- no run went back to running meanwhile, or ended since the read began (a Retry, and the
-- retried run's end), and to drop the tables: milliseconds, and
-- at most p_lock_wait more while it waits (each of up to five tries, 50 ms apart). The day's
-- signals, and the child runs of its runs made on later days, are deleted afterwards by
-- cyclone_history_tidy (the range is noted in cyclone_history_dropped): between the two, such
-- a child run is listed without its parent.
CREATE OR REPLACE FUNCTION cyclone_history_drop(p_age interval, p_sweep boolean DEFAULT true,
                                                p_lock_wait interval DEFAULT '100 ms')
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    n bigint;
    back boolean;
    t text;
    wait text;
    locked boolean;
    read_at timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('cyclone.history', 0)) THEN
        RETURN -1;  -- another server makes or drops days now
    END IF;
    FOR d IN SELECT * FROM cyclone_history_days x WHERE x.hi <= cyclone__day_uuid(now()) ORDER BY x.lo LOOP
        read_at := clock_timestamp();
        n := cyclone__history_day_due(d, p_age, p_sweep);
        CONTINUE WHEN n IS NULL;
        -- A few tries, 50 ms apart: the read above is what costs, not the wait.
        wait := current_setting('lock_timeout');
        FOR attempt IN 1 .. 5 LOOP
            BEGIN
                PERFORM set_config('lock_timeout', (extract(epoch FROM p_lock_wait) * 1000)::bigint::text, true);
                LOCK TABLE ONLY cyclone_runs, cyclone_steps, cyclone_step_deps IN ACCESS EXCLUSIVE MODE;
                locked := true;
            EXCEPTION WHEN lock_not_available THEN
                locked := false;
            END;
            EXIT WHEN locked;
            PERFORM pg_sleep(0.05);
        END LOOP;
        PERFORM set_config('lock_timeout', wait, true);
        IF NOT locked THEN
            RETURN -1;
        END IF;
        -- What may have changed since the read: a run retried (running again), or retried and
        -- ended again (it finished after the read began: too recently, maybe). Both by index.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''running'', ''paused''))'
                       ' OR EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''completed'', ''failed'', ''cancelled'')'
                       ' AND r.finished_at >= $1)', 'cyclone_runs_' || d.suffix, 'cyclone_runs_' || d.suffix)
           USING read_at INTO back;
        IF back THEN  -- the next sweep reads the day again
            RETURN NULL;
        END IF;
        FOREACH t IN ARRAY ARRAY['cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'] LOOP
            EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', t, t || '_' || d.suffix);
            EXECUTE format('DROP TABLE %I', t || '_' || d.suffix);
        END LOOP;
        DELETE FROM cyclone_history_days x WHERE x.lo = d.lo;
        INSERT INTO cyclone_history_dropped (lo, hi) VALUES (d.lo, d.hi) ON CONFLICT (lo) DO NOTHING;
        RETURN n;
    END LOOP;
    RETURN NULL;
END $$;

-- After cyclone_history_drop: delete at most p_limit of the dropped days' signals and of the
-- child runs of their runs (made on later days; each with its own rows and child runs, by
-- migration 0012's trigger). A dropped day whose ranges are empty leaves the list. Returns
-- how many rows it deleted.
CREATE OR REPLACE FUNCTION cyclone_history_tidy(p_limit integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    d cyclone_history_dropped;
    n bigint := 0;
    k bigint;
BEGIN
    FOR d IN SELECT * FROM cyclone_history_dropped x ORDER BY x.lo LOOP
        DELETE FROM cyclone_signals s
         WHERE s.id IN (SELECT x.id FROM cyclone_signals x WHERE x.run_id >= d.lo AND x.run_id < d.hi
                         LIMIT p_limit - n);
        GET DIAGNOSTICS k = ROW_COUNT;
        n := n + k;
        EXIT WHEN n >= p_limit;
        DELETE FROM cyclone_runs r
         WHERE r.id IN (SELECT x.id FROM cyclone_runs x
                         WHERE x.parent_run_id >= d.lo AND x.parent_run_id < d.hi
                         LIMIT p_limit - n FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS k = ROW_COUNT;
        n := n + k;
        EXIT WHEN n >= p_limit;
        DELETE FROM cyclone_history_dropped x
         WHERE x.lo = d.lo
           AND NOT EXISTS (SELECT 1 FROM cyclone_signals s WHERE s.run_id >= d.lo AND s.run_id < d.hi)
           AND NOT EXISTS (SELECT 1 FROM cyclone_runs r WHERE r.parent_run_id >= d.lo AND r.parent_run_id < d.hi);
    END LOOP;
    RETURN n;
END $$;
