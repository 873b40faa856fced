-- Cyclone's schema: versioned workflow definitions, runs, steps, the dependency edges
-- between steps, and the per-run signal mailbox.
--
-- The transitions that move runs and steps between states live in ../functions/*.sql.
-- States are exactly the words of the lifecycle document.

CREATE TABLE cyclone_workflows (
    name       text        NOT NULL,
    version    integer     NOT NULL CHECK (version > 0),
    -- {"nodes": [...]}, every node with all its options filled in (see definitions.py),
    -- so that comparing two definitions is comparing two values.
    definition jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

-- A run of a workflow (or a standalone job: a one-node run with no workflow).
--
-- state:
--   running   inserted so by Submit/Enqueue; back from failed by Retry; from paused by Resume
--   paused    run.Pause of a running run; left by Resume, Cancel, or a step running at the
--             pause that completes the last node or fails the run
--   completed nothing non-terminal remains and no discard escaped CancelBranch
--   failed    a discard that CancelBranch did not contain, or the run deadline
--   cancelled client.Cancel
CREATE TABLE cyclone_runs (
    id                 uuid        PRIMARY KEY,
    workflow_name      text,
    workflow_version   integer,
    state              text        NOT NULL
        CHECK (state IN ('running', 'paused', 'completed', 'failed', 'cancelled')),
    input              jsonb       NOT NULL DEFAULT 'null',
    -- The leaves' outputs keyed by node id, once completed.
    result             jsonb,
    priority           integer     NOT NULL DEFAULT 0,
    idempotency_key    text        UNIQUE,
    -- Fingerprint of the request that used idempotency_key: a repeat must match it.
    request_hash       text,
    deadline_at        timestamptz,
    -- While paused, the deadline stops: what was left of it is kept here.
    deadline_left      interval,
    failed_by_deadline boolean     NOT NULL DEFAULT false,
    -- The discarded step whose uncontained discard failed the run.
    failed_by_step     uuid,
    parent_run_id      uuid        REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    parent_step_id     uuid,
    depth              integer     NOT NULL DEFAULT 0,
    -- The largest WithRetention of the run's nodes: purge-eligible that long after finishing.
    retention          interval,
    paused_at          timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz
);

CREATE INDEX cyclone_runs_state_created ON cyclone_runs (state, created_at);
CREATE INDEX cyclone_runs_created ON cyclone_runs (created_at, id);
CREATE INDEX cyclone_runs_workflow ON cyclone_runs (workflow_name, created_at);
CREATE INDEX cyclone_runs_parent ON cyclone_runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX cyclone_runs_deadline ON cyclone_runs (deadline_at) WHERE state = 'running' AND deadline_at IS NOT NULL;
CREATE INDEX cyclone_runs_finished ON cyclone_runs (finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled');

-- One row per node of a run.
--
-- state (who moves a step in, and out):
--   pending        submit, when a dep is not completed; retry of a child node or of a step
--                  cancelled by a reopened discard. Out: last dep completed (promotion), cancel
--   available      submit (no deps), promotion, retryable failure, snooze, reclaim, Resume,
--                  Retry. Out: claim, cancel, Pause
--   running        claim. Out: complete, fail, snooze, reclaim sweep, attempt timeout, cancel
--   waiting_timer  a sleep node ready to start. Out: timer due, max_wait, deadline, cancel, Pause
--   waiting_signal a signal node ready to start. Out: signal consumed, max_wait, deadline, cancel, Pause
--   waiting_child  a child node ready to start (its child run is inserted with it). Out: child run
--                  ended, max_wait, deadline, cancel, Pause
--   paused         Pause of the run (from available and the waits); a step of a paused run that
--                  fails, snoozes or is reclaimed. Out: Resume, cancel
--   completed, discarded, cancelled: terminal; only Retry reopens discarded and (some) cancelled
CREATE TABLE cyclone_steps (
    id               uuid        PRIMARY KEY,
    run_id           uuid        NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    node             text        NOT NULL,
    -- The node's index in the workflow definition: steps are listed in that order.
    position         integer     NOT NULL DEFAULT 0,
    kind             text        NOT NULL,
    type             text        NOT NULL CHECK (type IN ('task', 'child', 'sleep', 'signal')),
    state            text        NOT NULL CHECK (state IN (
        'pending', 'available', 'running', 'completed', 'discarded', 'cancelled',
        'waiting_signal', 'waiting_timer', 'waiting_child', 'paused')),
    priority         integer     NOT NULL DEFAULT 0,
    -- Not claimable before. Also the FIFO key: the time the step became claimable.
    scheduled_at     timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 1,
    max_attempts     integer     NOT NULL,
    reclaims         integer     NOT NULL DEFAULT 0,
    max_reclaims     integer     NOT NULL,
    snoozes          integer     NOT NULL DEFAULT 0,
    lease_expiry     timestamptz,
    lease_owner      text,
    -- Incremented by every claim; every result is fenced by it.
    lease_generation bigint      NOT NULL DEFAULT 0,
    attempt_timeout  interval    NOT NULL,
    attempt_deadline timestamptz,
    backoff_initial  interval    NOT NULL,
    backoff_max      interval    NOT NULL,
    on_dep_failure   text        NOT NULL DEFAULT 'fail_run'
        CHECK (on_dep_failure IN ('fail_run', 'cancel_branch')),
    retention        interval,
    sleep_for        interval,
    signal_name      text,
    child_workflow   text,
    child_run_id     uuid,
    max_wait         interval,
    -- When the step entered its wait state: the order in which signal nodes take signals.
    wait_started_at  timestamptz,
    timer_at         timestamptz,
    max_wait_at      timestamptz,
    -- While paused, the timers stop: what was left of them is kept here.
    timer_left       interval,
    max_wait_left    interval,
    output           jsonb,
    error_kind       text,
    reason           text,
    -- [{attempt, error_kind, message, at}], oldest first; kept across Retry.
    errors           jsonb       NOT NULL DEFAULT '[]',
    -- Why a cancelled step was cancelled, and by which discarded step (fail_fast, branch):
    -- Retry of that discard reopens exactly these.
    cancel_cause     text        CHECK (cancel_cause IN ('operator', 'fail_fast', 'branch', 'deadline', 'parent')),
    cancelled_by     uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    UNIQUE (run_id, node)
);

-- The non-terminal steps of a run: whether a run is finished (checked by every completion)
-- and what Pause, Resume and Cancel move, without walking the run's terminal steps.
CREATE INDEX cyclone_steps_active_run ON cyclone_steps (run_id)
    WHERE state NOT IN ('completed', 'discarded', 'cancelled');
-- Claims: per kind, priority then FIFO. Partial, so terminal rows cost it nothing.
CREATE INDEX cyclone_steps_claim ON cyclone_steps (kind, priority, scheduled_at, id)
    WHERE state = 'available';
-- cyclone_v_kinds: distinct kinds, counts and the oldest available, all from one small index.
CREATE INDEX cyclone_steps_active_kind ON cyclone_steps (kind, state, scheduled_at)
    WHERE state IN ('available', 'running');
CREATE INDEX cyclone_steps_lease_expiry ON cyclone_steps (lease_expiry) WHERE state = 'running';
CREATE INDEX cyclone_steps_attempt_deadline ON cyclone_steps (attempt_deadline) WHERE state = 'running';
CREATE INDEX cyclone_steps_timer ON cyclone_steps (timer_at) WHERE state = 'waiting_timer';
CREATE INDEX cyclone_steps_max_wait ON cyclone_steps (max_wait_at)
    WHERE state IN ('waiting_timer', 'waiting_signal', 'waiting_child') AND max_wait_at IS NOT NULL;
CREATE INDEX cyclone_steps_signal_wait ON cyclone_steps (run_id, signal_name, wait_started_at)
    WHERE state = 'waiting_signal';
CREATE INDEX cyclone_steps_child_wait ON cyclone_steps (child_run_id) WHERE state = 'waiting_child';

-- step_id depends on dep_id. Both steps belong to run_id.
CREATE TABLE cyclone_step_deps (
    run_id  uuid NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    step_id uuid NOT NULL,
    dep_id  uuid NOT NULL,
    PRIMARY KEY (step_id, dep_id)
);
CREATE INDEX cyclone_step_deps_dep ON cyclone_step_deps (dep_id);
CREATE INDEX cyclone_step_deps_run ON cyclone_step_deps (run_id);

-- The mailbox of a run: each signal is consumed at most once, oldest first.
CREATE TABLE cyclone_signals (
    id          uuid        PRIMARY KEY,
    run_id      uuid        NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL DEFAULT 'null',
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_by uuid,
    consumed_at timestamptz
);
CREATE INDEX cyclone_signals_unconsumed ON cyclone_signals (run_id, name, created_at, id)
    WHERE consumed_by IS NULL;
-- Deleting a run deletes its signals (the foreign key's cascade): without this index every
-- purged run would scan the whole mailbox table.
CREATE INDEX cyclone_signals_run ON cyclone_signals (run_id);

-- Per step kind: how many steps wait to be claimed, how many run, and how long the oldest
-- claimable one has waited (the primary backlog indicator). Every figure comes from
-- cyclone_steps_active_kind: the kinds by a loose index scan, the counts and the minimum by
-- range scans, so it stays cheap with a million available steps.
CREATE VIEW cyclone_v_kinds AS
WITH RECURSIVE kinds (kind) AS (
    (SELECT s.kind FROM cyclone_steps s
      WHERE s.state IN ('available', 'running') ORDER BY s.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT s.kind FROM cyclone_steps s
             WHERE s.state IN ('available', 'running') AND s.kind > k.kind
             ORDER BY s.kind LIMIT 1)
      FROM kinds k
     WHERE k.kind IS NOT NULL
)
SELECT k.kind,
       (SELECT count(*) FROM cyclone_steps s
         WHERE s.kind = k.kind AND s.state = 'available') AS available,
       (SELECT count(*) FROM cyclone_steps s
         WHERE s.kind = k.kind AND s.state = 'running') AS running,
       COALESCE(greatest(now() - (SELECT min(s.scheduled_at) FROM cyclone_steps s
                                   WHERE s.kind = k.kind AND s.state = 'available'
                                     AND s.scheduled_at <= now()), interval '0'),
                interval '0') AS oldest_available_age
  FROM kinds k
 WHERE k.kind IS NOT NULL;
