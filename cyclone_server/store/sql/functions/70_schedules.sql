-- Schedules: the fire of a fire time, a manual trigger, and the start of a buffered fire.
--
-- Fire times are computed in Python (schedule_spec.py: cron expressions and time zones
-- need a cron library); these functions take them as arguments and do everything else
-- in one transaction. Lock order: the schedule row, then runs (as everywhere: a run
-- before its steps). Nothing locks a run and then a schedule.

-- Start the schedule's target as a run of fire time p_fire_at: SubmitRun or Enqueue as the
-- API would (same functions), then the run is tagged with the schedule and fire time.
-- A fire time starts one run: every caller holds the schedule's row (FOR UPDATE), under which
-- a fire time that already has its run (a trigger at that very instant) returns that run.
-- (Since migration 0014 (schedule_name, schedule_fire_at) is an index, not a unique key: the
-- runs are partitioned by day.)
CREATE OR REPLACE FUNCTION cyclone__schedule_start(p_name text, p_target jsonb, p_fire_at timestamptz)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    rid uuid;
    deadline timestamptz := now() + make_interval(secs => (p_target ->> 'deadline_in')::float8);
    priority integer := COALESCE((p_target ->> 'priority')::integer, 0);
BEGIN
    SELECT id INTO rid FROM cyclone_runs WHERE schedule_name = p_name AND schedule_fire_at = p_fire_at;
    IF FOUND THEN
        RETURN rid;
    END IF;
    IF p_target ? 'job' THEN
        SELECT e.run_id INTO rid
          FROM cyclone_job_enqueue(p_target -> 'job', p_target -> 'input', priority, NULL, NULL, deadline, NULL) e;
    ELSE
        SELECT e.run_id INTO rid
          FROM cyclone_run_submit(p_target ->> 'workflow', COALESCE((p_target ->> 'version')::integer, 0),
                                  p_target -> 'input', priority, NULL, NULL, deadline) e;
    END IF;
    UPDATE cyclone_runs SET schedule_name = p_name, schedule_fire_at = p_fire_at WHERE id = rid;
    RETURN rid;
END $$;

-- CreateSchedule and UpdateSchedule: what a fire would refuse of the target (a limit it names
-- that does not exist, a limit's key its input lacks), refused now, with the error the fire
-- would raise. A dry run: the target is started in a subtransaction and undone.
CREATE OR REPLACE FUNCTION cyclone_schedule_target_check(p_target jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM cyclone__schedule_start(NULL, p_target, now());
        RAISE EXCEPTION 'dry run' USING ERRCODE = 'CY999';  -- (not CY000: a code ending in 000 catches its whole class)
    EXCEPTION WHEN SQLSTATE 'CY999' THEN
        NULL;  -- it would start: what it wrote is undone
    END;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION cyclone__schedule_active(p_name text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM cyclone_runs
                    WHERE schedule_name = p_name AND state IN ('running', 'paused'))
$$;

-- A fire time meets the overlap policy (the schedule row is locked by the caller):
-- 'started' (with the run), 'skipped' (counted in skips) or 'buffered'.
-- A buffered fire time is older than any new one: when its run could start (the previous
-- run ended and no release has started it yet), it starts first.
CREATE OR REPLACE FUNCTION cyclone__schedule_apply(p_name text, p_fire_at timestamptz, p_policy text)
RETURNS TABLE (outcome text, run_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    s cyclone_schedules;
    active boolean := cyclone__schedule_active(p_name);
    rid uuid;
BEGIN
    SELECT * INTO s FROM cyclone_schedules WHERE name = p_name;
    IF NOT active AND s.buffered_fire_at IS NOT NULL THEN
        BEGIN
            PERFORM cyclone__schedule_start(s.name, s.target, s.buffered_fire_at);
            UPDATE cyclone_schedules
               SET buffered_fire_at = NULL, fires = fires + 1,
                   last_fire_at = GREATEST(last_fire_at, s.buffered_fire_at)
             WHERE name = p_name;
            active := true;
        EXCEPTION WHEN SQLSTATE 'CY400' THEN  -- refused now (cyclone_schedule_fire): dropped, a miss
            UPDATE cyclone_schedules SET buffered_fire_at = NULL, misses = misses + 1 WHERE name = p_name;
        END;
        s.buffered_fire_at := NULL;
    END IF;
    IF active AND p_policy = 'skip' OR active AND p_policy = 'buffer_one' AND s.buffered_fire_at IS NOT NULL THEN
        UPDATE cyclone_schedules SET skips = skips + 1 WHERE name = p_name;
        RETURN QUERY SELECT 'skipped'::text, NULL::uuid;
        RETURN;
    ELSIF active AND p_policy = 'buffer_one' THEN
        UPDATE cyclone_schedules SET buffered_fire_at = p_fire_at WHERE name = p_name;
        RETURN QUERY SELECT 'buffered'::text, NULL::uuid;
        RETURN;
    ELSIF active AND p_policy = 'cancel_previous' THEN
        FOR rid IN SELECT r.id FROM cyclone_runs r
                    WHERE r.schedule_name = p_name AND r.state IN ('running', 'paused') ORDER BY r.id LOOP
            BEGIN
                PERFORM cyclone_run_cancel(rid);
            EXCEPTION WHEN SQLSTATE 'CY409' THEN
                NULL;  -- it ended between the look and the lock: nothing left to cancel
            END;
        END LOOP;
    END IF;
    rid := cyclone__schedule_start(p_name, s.target, p_fire_at);
    UPDATE cyclone_schedules
       SET fires = fires + 1, last_fire_at = GREATEST(last_fire_at, p_fire_at)
     WHERE name = p_name;
    RETURN QUERY SELECT 'started'::text, rid;
END $$;

-- The fire of one fire time, exactly once: the schedule must still expect p_expected as its
-- next fire time (compare-and-set; a server that lost the race gets 'lost' and changes
-- nothing). p_missed fire times from p_expected on were found too late (older than the
-- catch-up window) and are counted, not started; p_fire_at is the fire time to start now
-- (NULL: only the misses are recorded). The schedule moves on to p_next_fire_at, due at
-- p_next_due_at (its jitter drawn by the caller). A target the database refuses now (a limit
-- deleted since the schedule was made: CreateSchedule checks the rest) is 'refused', with
-- the refusal in `detail`: that fire time is counted in misses and the schedule moves on,
-- rather than failing again at every pass.
DROP FUNCTION IF EXISTS cyclone_schedule_fire(text, timestamptz, integer, timestamptz, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION cyclone_schedule_fire(
    p_name text, p_expected timestamptz, p_missed integer, p_fire_at timestamptz,
    p_next_fire_at timestamptz, p_next_due_at timestamptz)
RETURNS TABLE (outcome text, run_id uuid, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    s cyclone_schedules;
    o text;
    rid uuid;
BEGIN
    SELECT * INTO s FROM cyclone_schedules c
     WHERE c.name = p_name AND c.next_fire_at = p_expected AND NOT c.paused
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::uuid, NULL::text;
        RETURN;
    END IF;
    UPDATE cyclone_schedules
       SET next_fire_at = p_next_fire_at, next_due_at = p_next_due_at, misses = misses + p_missed
     WHERE name = p_name;
    IF p_fire_at IS NULL THEN
        RETURN QUERY SELECT 'missed'::text, NULL::uuid, NULL::text;
        RETURN;
    END IF;
    BEGIN
        SELECT a.outcome, a.run_id INTO o, rid FROM cyclone__schedule_apply(p_name, p_fire_at, s.overlap) a;
    EXCEPTION WHEN SQLSTATE 'CY400' THEN
        UPDATE cyclone_schedules SET misses = misses + 1 WHERE name = p_name;
        RETURN QUERY SELECT 'refused'::text, NULL::uuid, SQLERRM;
        RETURN;
    END;
    RETURN QUERY SELECT o, rid, NULL::text;
END $$;

-- Trigger now: the target starts with fire time now(), under the schedule's overlap policy
-- or p_policy. The next fire time does not move. A paused schedule may be triggered.
CREATE OR REPLACE FUNCTION cyclone_schedule_trigger(p_name text, p_policy text)
RETURNS TABLE (outcome text, run_id uuid, fire_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    s cyclone_schedules;
BEGIN
    SELECT * INTO s FROM cyclone_schedules c WHERE c.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schedule "%" not found', p_name USING ERRCODE = 'CY404';
    END IF;
    RETURN QUERY SELECT a.outcome, a.run_id, now()
                   FROM cyclone__schedule_apply(p_name, now(), COALESCE(p_policy, s.overlap)) a;
END $$;

-- buffer_one: start the buffered fire times whose schedule has no active run any more
-- (the scheduler calls this when runs end). Schedules another transaction holds are left
-- to the next call; a paused schedule keeps its buffered fire time until resumed.
CREATE OR REPLACE FUNCTION cyclone_schedules_release(p_limit integer)
RETURNS TABLE (name text, fire_at timestamptz, run_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    s cyclone_schedules;
    rid uuid;
BEGIN
    FOR s IN SELECT * FROM cyclone_schedules c
              WHERE c.buffered_fire_at IS NOT NULL AND NOT c.paused
              ORDER BY c.name LIMIT p_limit
                FOR UPDATE SKIP LOCKED LOOP
        CONTINUE WHEN cyclone__schedule_active(s.name);
        BEGIN
            rid := cyclone__schedule_start(s.name, s.target, s.buffered_fire_at);
        EXCEPTION WHEN SQLSTATE 'CY400' THEN  -- refused now (as cyclone_schedule_fire): dropped, a miss
            UPDATE cyclone_schedules c SET buffered_fire_at = NULL, misses = c.misses + 1 WHERE c.name = s.name;
            RETURN QUERY SELECT s.name, s.buffered_fire_at, NULL::uuid;  -- no run: the caller logs it
            CONTINUE;
        END;
        UPDATE cyclone_schedules c
           SET buffered_fire_at = NULL, fires = c.fires + 1,
               last_fire_at = GREATEST(c.last_fire_at, s.buffered_fire_at)
         WHERE c.name = s.name;
        RETURN QUERY SELECT s.name, s.buffered_fire_at, rid;
    END LOOP;
END $$;
