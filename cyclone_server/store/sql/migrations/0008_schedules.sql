-- Schedules: cron expressions and fixed intervals that start runs (Schedules service).
--
-- The schedule row is the authority on what fires next: next_fire_at is advanced by a
-- compare-and-set in the same transaction that creates the run of that fire time
-- (cyclone_schedule_fire), so a fire time starts at most one run whatever the number of
-- servers. The unique key on (schedule_name, schedule_fire_at) of cyclone_runs is the
-- second lock on that door.
CREATE TABLE cyclone_schedules (
    name             text        PRIMARY KEY,
    -- What a fire starts: {"workflow", "version", "input", "priority", "deadline_in"} or
    -- {"job": node, "input", "priority", "deadline_in"} (node as definitions.py defaults it).
    target           jsonb       NOT NULL,
    -- When: {"cron", "time_zone"} or {"every", "offset"} (seconds); read by schedule_spec.py.
    spec             jsonb       NOT NULL,
    -- The settings as the caller gave them: a repeated Create with the same ones is a no-op.
    settings_hash    text        NOT NULL,
    start_at         timestamptz,
    end_at           timestamptz,
    jitter           interval    NOT NULL DEFAULT '0',
    note             text        NOT NULL DEFAULT '',
    overlap          text        NOT NULL DEFAULT 'skip'
        CHECK (overlap IN ('skip', 'buffer_one', 'allow_all', 'cancel_previous')),
    -- Fire times found late by at most this much still start (each once); older ones are
    -- skipped and counted in misses.
    catchup_window   interval    NOT NULL DEFAULT '1 minute',
    paused           boolean     NOT NULL DEFAULT false,
    -- The next fire time (nominal), and when it is due: next_fire_at plus a random jitter
    -- drawn once, so every server agrees on it. NULL: no fire time left (past end_at).
    next_fire_at     timestamptz,
    next_due_at      timestamptz,
    -- buffer_one: a fire time that found the previous run active, started when it ends.
    buffered_fire_at timestamptz,
    last_fire_at     timestamptz,
    fires            bigint      NOT NULL DEFAULT 0,
    misses           bigint      NOT NULL DEFAULT 0,
    skips            bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- The scheduler's wake-up: the earliest due schedule that is not paused.
CREATE INDEX cyclone_schedules_due ON cyclone_schedules (next_due_at) WHERE NOT paused AND next_due_at IS NOT NULL;
CREATE INDEX cyclone_schedules_buffered ON cyclone_schedules (name) WHERE buffered_fire_at IS NOT NULL;

-- The schedule and fire time a run was started for (NULL for runs started otherwise).
-- Deleting a schedule keeps its runs, with the name.
ALTER TABLE cyclone_runs ADD COLUMN schedule_name text, ADD COLUMN schedule_fire_at timestamptz;
CREATE UNIQUE INDEX cyclone_runs_schedule_fire ON cyclone_runs (schedule_name, schedule_fire_at)
    WHERE schedule_name IS NOT NULL;
-- ListRuns filtered by schedule, newest first.
CREATE INDEX cyclone_runs_schedule ON cyclone_runs (schedule_name, created_at, id) WHERE schedule_name IS NOT NULL;
-- The overlap policies' question, "is a run of this schedule still active?" (state is
-- already indexed, so this predicate costs run updates nothing more).
CREATE INDEX cyclone_runs_schedule_active ON cyclone_runs (schedule_name)
    WHERE schedule_name IS NOT NULL AND state IN ('running', 'paused');
