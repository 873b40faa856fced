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

-- The days of some ids: cyclone__days_span of the least and the greatest. A statement over
-- them by id = ANY prunes no day of history (an array parameter) unless it is bounded by these.
CREATE OR REPLACE FUNCTION cyclone__ids_span(p_ids uuid[], OUT lo uuid, OUT hi uuid)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT d.lo, d.hi INTO lo, hi
      FROM cyclone__days_span((SELECT x FROM unnest(p_ids) AS x ORDER BY x LIMIT 1),
                              (SELECT x FROM unnest(p_ids) AS x ORDER BY x DESC LIMIT 1)) d;
END $$;

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
-- of the same day (which goes too), or one cyclone_runs_purge would pick on its own. The
-- retention sweep asks, and drops the day, in four parts, so that it never takes a core from
-- the claims, nor stops them, for long: cyclone__history_day_next (two checks an index
-- answers), cyclone__history_day_read (the day's runs, a slice of its pages at a time, each
-- slice in its own transaction with a pause after it: Engine.drop_history_day),
-- cyclone_history_detach_part (checks again under the runs' lock what may have changed since
-- the read began, and detaches the day's partitions, one per transaction) and
-- cyclone_history_drop_detached (drops them, with no lock a claim waits for).
DROP FUNCTION IF EXISTS cyclone__history_day_due(cyclone_history_days, interval, boolean);

-- Whether the table named p_name is a partition (of a day not detached, nor dropped).
CREATE OR REPLACE FUNCTION cyclone__history_attached(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = to_regclass(p_name) AND c.relispartition)
$$;

-- The oldest day before today (UTC) after the one starting at p_after (NULL: from the first)
-- with no run running or paused and none ended within p_age: the days whose read may find
-- them due (cyclone__history_day_read). Both checks by index.
CREATE OR REPLACE FUNCTION cyclone__history_day_next(p_age interval, p_after uuid)
RETURNS SETOF cyclone_history_days LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    blocked boolean;
BEGIN
    FOR d IN SELECT * FROM cyclone_history_days x
              WHERE x.hi <= cyclone__day_uuid(now()) AND (p_after IS NULL OR x.lo > p_after) ORDER BY x.lo LOOP
        IF cyclone__history_attached('cyclone_runs_' || d.suffix) THEN  -- (else its runs went, its steps not yet)
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''running'', ''paused''))',
                           'cyclone_runs_' || d.suffix) INTO blocked;
            CONTINUE WHEN blocked;
            IF p_age IS NOT NULL THEN  -- the newest end first (cyclone_runs_finished)
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''completed'', ''failed'', ''cancelled'')'
                               ' AND r.finished_at > now() - $1)', 'cyclone_runs_' || d.suffix) USING p_age INTO blocked;
                CONTINUE WHEN blocked;
            END IF;
        END IF;
        RETURN NEXT d;
        RETURN;
    END LOOP;
END $$;

-- Read the runs of the day starting at p_lo in its pages [p_page, p_page + p_pages) (p_pages
-- NULL: to the end): how many there are, whether one of them must stay, and the page to read
-- from next (NULL: the read reached the table's end, as it is now). A slice of pages is read
-- in the table's order (a TID range scan), as cheaply per run as a whole scan. A day no
-- longer listed (another server dropped it) has a run that must stay, as far as its caller
-- knows; a day whose runs were dropped, and its steps or edges not yet, has none.
CREATE OR REPLACE FUNCTION cyclone__history_day_read(p_lo uuid, p_age interval, p_sweep boolean, p_page bigint,
                                                     p_pages bigint, OUT runs bigint, OUT blocked boolean,
                                                     OUT next_page bigint)
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    part text;
    pages bigint;
BEGIN
    SELECT * INTO d FROM cyclone_history_days x WHERE x.lo = p_lo;
    IF NOT FOUND THEN
        runs := 0;
        blocked := true;
        RETURN;
    END IF;
    part := 'cyclone_runs_' || d.suffix;
    IF NOT cyclone__history_attached(part) THEN  -- its runs went, its steps or edges not yet
        runs := 0;
        blocked := false;
        RETURN;
    END IF;
    pages := pg_relation_size(part::regclass) / current_setting('block_size')::bigint;
    next_page := CASE WHEN p_pages IS NULL OR p_page + p_pages >= pages THEN NULL ELSE p_page + p_pages END;
    EXECUTE format(
        'SELECT count(*), COALESCE(bool_or(NOT (r.state IN (''completed'', ''failed'', ''cancelled'')'
        '   AND cyclone__purge_due(r.finished_at, r.retention, $1, $2)'
        '   AND (r.parent_run_id IS NULL OR (r.parent_run_id >= $3 AND r.parent_run_id < $4)'
        '        OR cyclone__purge_alone(r.parent_run_id, $1, $2)))), false)'
        '  FROM %I r WHERE r.ctid >= $5 AND r.ctid < $6', part)
       USING p_age, p_sweep, d.lo, d.hi, format('(%s,0)', p_page)::tid,
             format('(%s,0)', COALESCE(next_page, 4294967294))::tid
       INTO runs, blocked;
END $$;

-- The retention sweep's last part: detach one table's partition of the day starting at
-- p_lo, whose runs a read that began at p_read_at found all due. The sweep calls it for
-- cyclone_runs, then cyclone_steps, then cyclone_step_deps, each in its own transaction, then
-- cyclone_history_drop_detached. Detaching takes the parent's ACCESS EXCLUSIVE lock, which
-- every claim and result waits for, and which waits for every transaction using the parent;
-- a transaction that held one parent's while it waited for another's would wait for claims
-- and results that wait for it (a claim locks steps, then runs) until its lock timeout. The
-- lock (the partition's too) is held only to check again, by index, and to detach: a change
-- of the catalog, milliseconds, and at most p_lock_wait more while it waits (each of up to
-- five tries, 50 ms apart). The detached table is dropped without it: deleting its files
-- takes longer, and nothing waits for it then.
--
-- Returns true when the partition is detached (now, or before); false when the lock was not
-- had, or another server makes or drops days now (try again later); NULL, for cyclone_runs,
-- when the day is no longer listed, or one of its runs went back to running or ended since
-- p_read_at (a Retry, and the retried run's end: the next sweep reads the day again). With
-- cyclone_runs' partition the day's runs are gone; its steps and edges, which nothing
-- reaches but by their runs, go next. Its signals, and the child runs of its runs made on
-- later days, are deleted afterwards by cyclone_history_tidy (the range is noted in
-- cyclone_history_dropped): between the two, such a child run is listed without its parent.
CREATE OR REPLACE FUNCTION cyclone_history_detach_part(p_lo uuid, p_table text, p_read_at timestamptz,
                                                       p_lock_wait interval DEFAULT '100 ms')
RETURNS boolean LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    part text;
    back boolean;
    wait text := current_setting('lock_timeout');
    locked boolean;
BEGIN
    IF p_table NOT IN ('cyclone_runs', 'cyclone_steps', 'cyclone_step_deps') THEN
        RAISE EXCEPTION 'not a table of history: %', p_table USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('cyclone.history', 0)) THEN
        RETURN false;
    END IF;
    SELECT * INTO d FROM cyclone_history_days x WHERE x.lo = p_lo;
    IF NOT FOUND THEN
        RETURN CASE WHEN p_table = 'cyclone_runs' THEN NULL ELSE true END;
    END IF;
    part := p_table || '_' || d.suffix;
    IF NOT cyclone__history_attached(part) THEN
        RETURN true;  -- detached before
    END IF;
    -- A few tries, 50 ms apart: the read before is what costs, not the wait. The partition's
    -- lock too (DETACH takes it): an autovacuum of the day, or another reader of it, would
    -- otherwise make the DETACH wait, holding the parent's, for as long as it runs.
    FOR attempt IN 1 .. 5 LOOP
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM p_lock_wait) * 1000)::bigint::text, true);
            EXECUTE format('LOCK TABLE ONLY %I, %I IN ACCESS EXCLUSIVE MODE', p_table, part);
            locked := true;
        EXCEPTION WHEN lock_not_available THEN
            locked := false;
        END;
        EXIT WHEN locked;
        PERFORM pg_sleep(0.05);
    END LOOP;
    PERFORM set_config('lock_timeout', wait, true);
    IF NOT locked THEN
        RETURN false;
    END IF;
    IF p_table = 'cyclone_runs' THEN
        -- What may have changed since the read began: a run retried (running again), or
        -- retried and ended again (it finished after the read began: too recently, maybe).
        -- Both by index. A Retry locks its run first: none is under way now.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''running'', ''paused''))'
                       ' OR EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''completed'', ''failed'', ''cancelled'')'
                       ' AND r.finished_at >= $1)', part, part)
           USING p_read_at INTO back;
        IF back THEN
            RETURN NULL;
        END IF;
        INSERT INTO cyclone_history_dropped (lo, hi) VALUES (d.lo, d.hi) ON CONFLICT (lo) DO NOTHING;
    END IF;
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', p_table, part);
    RETURN true;
END $$;

-- Drop the day's tables that are detached (cyclone_history_detach_part) and, once none of
-- its three is left attached or not, take the day off cyclone_history_days. A detached table
-- is reached by nothing but an autovacuum of it (which a DROP cancels, unless it prevents
-- wraparound): each DROP waits for its lock at most 1 s, and a table it does not get is left
-- to the next call. Returns whether the day is gone; false too when another server makes or
-- drops days now.
CREATE OR REPLACE FUNCTION cyclone_history_drop_detached(p_lo uuid)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    d cyclone_history_days;
    t text;
    left_behind boolean := false;
    wait text := current_setting('lock_timeout');
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('cyclone.history', 0)) THEN
        RETURN false;
    END IF;
    SELECT * INTO d FROM cyclone_history_days x WHERE x.lo = p_lo;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    FOREACH t IN ARRAY ARRAY['cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'] LOOP
        IF cyclone__history_attached(t || '_' || d.suffix) THEN
            left_behind := true;
        ELSE
            BEGIN
                PERFORM set_config('lock_timeout', '1000', true);
                EXECUTE format('DROP TABLE IF EXISTS %I', t || '_' || d.suffix);
            EXCEPTION WHEN lock_not_available THEN
                left_behind := true;
            END;
            PERFORM set_config('lock_timeout', wait, true);
        END IF;
    END LOOP;
    IF left_behind THEN
        RETURN false;
    END IF;
    DELETE FROM cyclone_history_days x WHERE x.lo = d.lo;
    RETURN true;
END $$;

-- The three parts in one call and one transaction, the day read whole without a pause and
-- its three partitions detached and dropped together: the oldest day before today whose
-- runs may all go (with cyclone_runs_purge's p_age and p_sweep). Returns how many runs went
-- with it (0: an empty day); -1 when a day may go but a lock was not had (nothing changed: try
-- again later); NULL when no day may go. For an operator at psql, on a quiet database: it
-- holds each parent's lock while it waits for the next one's, which claims and results,
-- locking them in another order, may hold. The retention sweep reads in paced slices and
-- detaches a partition per transaction (Engine.drop_history_day).
CREATE OR REPLACE FUNCTION cyclone_history_drop(p_age interval, p_sweep boolean DEFAULT true,
                                                p_lock_wait interval DEFAULT '100 ms')
RETURNS bigint LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    r record;
    read_at timestamptz;
    after uuid;
    t text;
    done boolean;
BEGIN
    LOOP
        SELECT * INTO d FROM cyclone__history_day_next(p_age, after);
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        after := d.lo;
        read_at := clock_timestamp();
        SELECT * INTO r FROM cyclone__history_day_read(d.lo, p_age, p_sweep, 0, NULL);
        CONTINUE WHEN r.blocked;
        BEGIN  -- all three detached, or none (the subtransaction is undone)
            FOREACH t IN ARRAY ARRAY['cyclone_runs', 'cyclone_steps', 'cyclone_step_deps'] LOOP
                done := cyclone_history_detach_part(d.lo, t, read_at, p_lock_wait);
                IF done IS NULL THEN
                    RETURN NULL;
                ELSIF NOT done THEN
                    RAISE EXCEPTION USING ERRCODE = 'lock_not_available';
                END IF;
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            RETURN -1;
        END;
        IF NOT cyclone_history_drop_detached(d.lo) THEN
            RAISE EXCEPTION 'the detached tables of day % could not be dropped', d.suffix
                USING ERRCODE = 'lock_not_available';
        END IF;
        RETURN r.runs;
    END LOOP;
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

-- Settled days (migration 0015): days that have ended and whose runs are all terminal. No
-- live step or run is in one, so the statements that look for live work by state (the
-- claim, flow control's probes, the sweeps) are bounded below by cyclone__live_floor, the
-- first day not settled: Postgres prunes the days before it when the statement starts, and
-- opens, locks and reads none of their indexes. A day made ahead, or kept from before
-- migration 0015, is not settled until a server finds it so (cyclone__history_day_settle).
-- Only Retry takes a run out of a terminal state; cyclone__run_reopen unsettles its day first.

-- The first id of the first day not settled (the nil uuid when every listed day is settled
-- or none is listed, which bounds nothing). A live step or run has an id at or after it.
CREATE OR REPLACE FUNCTION cyclone__live_floor() RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT d.lo FROM cyclone_history_days d WHERE NOT d.settled ORDER BY d.lo LIMIT 1),
                    '00000000-0000-0000-0000-000000000000')
$$;

-- The days that may be settled now: not settled, ended before p_until's day began (UTC).
CREATE OR REPLACE FUNCTION cyclone__history_days_unsettled(p_until timestamptz)
RETURNS SETOF uuid LANGUAGE sql STABLE AS $$
    SELECT d.lo FROM cyclone_history_days d
     WHERE NOT d.settled AND d.hi <= cyclone__day_uuid(p_until) ORDER BY d.lo
$$;

-- The advisory lock of one day's settling (cyclone__history_day_settle takes it alone, a
-- Retry shared: cyclone__history_unsettle).
CREATE OR REPLACE FUNCTION cyclone__history_day_key(p_lo uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('cyclone.history.settle:' || p_lo::text, 0)
$$;

-- Settle the day starting at p_lo if every run in it is terminal: true when it is settled
-- (now, or before); false when a run in it is running or paused, or the day has not ended;
-- NULL when a lock was not had at once (try again at the next pass). Checked under the day's
-- advisory lock, alone (a Retry of one of its runs holds it shared, from before it reopens
-- the run to its commit: cyclone__history_unsettle), and under the SHARE lock of the day's
-- runs, which waits for every transaction that inserted or changed one of them to end, so a
-- run made in a transaction still open is seen. That lock conflicts with every claim's and
-- result's (their generic plans lock every day's partition), so it is waited for at most
-- p_lock_wait, and held for one index probe; a day with a run seen live is refused before
-- it. Only a day that has ended is settled. A transaction may still insert into it: one that
-- made its runs' ids before the day ended (they carry their creation time) and inserts them
-- after this check; such an insert finds the day settled and unsettles it
-- (cyclone__history_made).
CREATE OR REPLACE FUNCTION cyclone__history_day_settle(p_lo uuid, p_lock_wait interval DEFAULT '100 ms')
RETURNS boolean LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    d cyclone_history_days;
    probe text;
    live boolean;
    wait text := current_setting('lock_timeout');
BEGIN
    IF NOT pg_try_advisory_xact_lock(cyclone__history_day_key(p_lo)) THEN
        RETURN NULL;  -- a Retry of one of its runs is under way, or another server settles it
    END IF;
    SELECT * INTO d FROM cyclone_history_days x WHERE x.lo = p_lo;
    IF NOT FOUND OR d.settled THEN  -- (not found: dropped)
        RETURN true;
    ELSIF d.hi > cyclone__day_uuid(now()) THEN
        RETURN false;  -- not ended
    END IF;
    IF cyclone__history_attached('cyclone_runs_' || d.suffix) THEN  -- (else its runs went with retention)
        probe := format('SELECT EXISTS (SELECT 1 FROM %I r WHERE r.state IN (''running'', ''paused''))',
                        'cyclone_runs_' || d.suffix);
        -- A run seen live now is enough to say no, without the lock (a day that holds a long
        -- run is looked at on every pass).
        EXECUTE probe INTO live;
        IF live THEN
            RETURN false;
        END IF;
        BEGIN
            PERFORM set_config('lock_timeout', greatest((extract(epoch FROM p_lock_wait) * 1000)::bigint, 1)::text, true);
            EXECUTE format('LOCK TABLE ONLY %I IN SHARE MODE', 'cyclone_runs_' || d.suffix);
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            PERFORM set_config('lock_timeout', wait, true);
            RETURN NULL;
        END;
        PERFORM set_config('lock_timeout', wait, true);
        EXECUTE probe INTO live;  -- again, now that no transaction writes the day's runs
        IF live THEN
            RETURN false;
        END IF;
    END IF;
    UPDATE cyclone_history_days x SET settled = true WHERE x.lo = d.lo;
    RETURN true;
END $$;

-- Before a run leaves a terminal state (cyclone__run_reopen): its day is not settled any
-- more, so the claim and the sweeps see its steps again. The day's advisory lock, held
-- shared to the commit, keeps cyclone__history_day_settle from checking the day meanwhile
-- (it would find the run still terminal); Retries share it, and the day's row is written
-- only when the day was settled. A settle holds the lock alone for at most its lock wait.
CREATE OR REPLACE FUNCTION cyclone__history_unsettle(p_run_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    day uuid := (SELECT d.lo FROM cyclone_history_days d WHERE d.lo <= p_run_id ORDER BY d.lo DESC LIMIT 1);
BEGIN
    IF day IS NOT NULL THEN
        PERFORM cyclone__history_day_unsettle(day);
    END IF;
END $$;

-- The day starting at p_lo not settled (any more), under its advisory lock, held shared to
-- the commit (cyclone__history_unsettle, cyclone__history_made).
CREATE OR REPLACE FUNCTION cyclone__history_day_unsettle(p_lo uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(cyclone__history_day_key(p_lo));
    UPDATE cyclone_history_days d SET settled = false WHERE d.lo = p_lo AND d.settled;
END $$;

-- After a transaction inserted runs (cyclone__run_create, cyclone__jobs_create): if a day its
-- runs may be in is settled (a settle that ran between the making of their ids, from the
-- transaction's start on, and their insert found it all ended), unsettle it. The insert came
-- after that settle's commit (its lock waited for the insert's, or the insert for its), so
-- this statement sees it. Days not settled, as today's always are at once: one probe of a few
-- rows.
CREATE OR REPLACE FUNCTION cyclone__history_made() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone__history_day_unsettle(d.lo) FROM cyclone_history_days d
      WHERE d.lo >= cyclone__day_uuid(now()) AND d.settled ORDER BY d.lo;
END $$;
