-- The shared rules of the state machine: promotion, run completion, fail-fast against
-- CancelBranch, cancellation, child runs and the signal mailbox.
--
-- Functions named cyclone__* are internal: each expects its caller to hold the lock of the
-- run it changes. Lock order, everywhere: a parent run before its child runs, a run before
-- its steps. A transaction that has to lock several unrelated runs takes them in run id
-- order and with SKIP LOCKED after the first, so transitions never deadlock.
--
-- Notifications: 'cyclone_available' when steps become claimable, 'cyclone_run_ended' when
-- a run ends. Their payloads are few, so Postgres folds them to one or two per transaction:
-- 'cyclone_run_ended' says 'top' when only top-level runs ended (no child run, nothing for
-- the parents' settler to do), and '' otherwise.

CREATE OR REPLACE FUNCTION cyclone_uuid7() RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ts  double precision := extract(epoch FROM clock_timestamp());
    ms  bigint := floor(ts * 1000);
    -- 12 bits of sub-millisecond time keep ids made in one transaction in creation order.
    sub integer := floor((ts * 1000 - floor(ts * 1000)) * 4096);
    b   bytea := uuid_send(gen_random_uuid());
BEGIN
    b := overlay(b PLACING substring(int8send(ms) FROM 3) FROM 1 FOR 6);
    b := set_byte(b, 6, 112 | (sub >> 8));
    b := set_byte(b, 7, sub & 255);
    RETURN encode(b, 'hex')::uuid;
END $$;

-- A step's id: its run's first 64 bits (the run's creation time, to a fraction of a
-- millisecond), then 64 random bits. A step then falls in its run's day of history
-- (migration 0014: both tables are partitioned by the time in their ids), and steps sort
-- in the order of their runs, as the claim's FIFO tie-break expects.
CREATE OR REPLACE FUNCTION cyclone__step_uuid(p_run uuid) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(substring(uuid_send(p_run) FROM 1 FOR 8) || substring(uuid_send(gen_random_uuid()) FROM 9 FOR 8),
                  'hex')::uuid
$$;

-- The uuid that starts the UTC day of p_at: its first 48 bits that day's first millisecond,
-- the rest zero, so every uuid7 made that day sorts at or after it (migration 0014 made it
-- first; the bounds of the days of history).
CREATE OR REPLACE FUNCTION cyclone__day_uuid(p_at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(substring(int8send((extract(epoch FROM date_trunc('day', p_at AT TIME ZONE 'UTC'))::bigint * 1000)) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

-- The delay after the n-th failed execution (docs/lifecycle.md, "Retries and backoff"): min(max, initial * 2^(n-1)), so the
-- first retry waits `initial`, with +-10% jitter that never takes it above `max`. In seconds
-- (float) until capped: initial * 2^40 as an interval overflows for initial >= ~2 h.
DROP FUNCTION IF EXISTS cyclone__backoff(interval, interval, integer);  -- its parameter was renamed
CREATE FUNCTION cyclone__backoff(p_initial interval, p_max interval, p_failed_attempt integer)
RETURNS interval LANGUAGE sql VOLATILE AS $$
    -- Jitter applies to the capped delay too (so retries capped at max still spread out),
    -- and the result is capped again.
    SELECT make_interval(secs => least(cap, least(cap, base) * (0.9 + random() * 0.2)))
      FROM (SELECT extract(epoch FROM p_max)::float8 AS cap,
                   extract(epoch FROM p_initial)::float8
                   * power(2::float8, least(greatest(p_failed_attempt - 1, 0), 40)) AS base) x
$$;

-- The state a step enters once all its deps are completed (or at submit when it has none).
CREATE OR REPLACE FUNCTION cyclone__entry_state(p_type text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_type WHEN 'task' THEN 'available'
                       WHEN 'sleep' THEN 'waiting_timer'
                       WHEN 'signal' THEN 'waiting_signal'
                       WHEN 'child' THEN 'waiting_child' END
$$;

-- A Cyclone server announces new work itself, coalesced across its transactions (its
-- connections set cyclone.announce = 'server'): NOTIFY serialises the commits of the
-- transactions that send it, which would halve the rate of Enqueue. Any other caller (a
-- worker's CompletionTx, psql) notifies here, once per transaction.
DROP FUNCTION IF EXISTS cyclone__notify_available();
CREATE FUNCTION cyclone__notify_available() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('cyclone.announce', true) IS DISTINCT FROM 'server' THEN
        PERFORM pg_notify('cyclone_available', '');
    END IF;
END $$;

-- The run's result: the outputs of its leaves (nodes nothing depends on), by node id.
CREATE OR REPLACE FUNCTION cyclone__run_result(p_run_id uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(jsonb_object_agg(s.node, COALESCE(s.output, 'null'::jsonb)), '{}'::jsonb)
      FROM cyclone_steps s
     WHERE s.run_id = p_run_id
       AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d WHERE d.dep_id = s.id OFFSET 0)  -- (a probe per step, never hashed)
$$;

-- Lock the run of a step. NULL when the step does not exist.
CREATE OR REPLACE FUNCTION cyclone__lock_run_of_step(p_step_id uuid) RETURNS cyclone_runs
LANGUAGE sql AS $$
    SELECT r.* FROM cyclone_runs r
     WHERE r.id = (SELECT s.run_id FROM cyclone_steps s WHERE s.id = p_step_id)
       FOR NO KEY UPDATE
$$;

CREATE OR REPLACE FUNCTION cyclone__lock_run(p_run_id uuid) RETURNS cyclone_runs
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs;
BEGIN
    SELECT * INTO r FROM cyclone_runs WHERE id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'CY404';
    END IF;
    RETURN r;
END $$;

-- Why a result for (step, generation) cannot be applied.
CREATE OR REPLACE FUNCTION cyclone__refusal(p_step_id uuid, p_generation bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT CASE WHEN s.lease_generation <> p_generation THEN 'stale' ELSE 'ended' END
                       FROM cyclone_steps s WHERE s.id = p_step_id), 'unknown')
$$;

-- End a run (completed, failed or cancelled).
CREATE OR REPLACE FUNCTION cyclone__run_end(p_run_id uuid, p_state text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    parent uuid;
    limited boolean;
BEGIN
    -- A run that held the slot of a limit of runs gives it back (a retried run takes it again
    -- with its next claim), and every server's dispatcher hears of it.
    UPDATE cyclone_runs
       SET state = p_state, finished_at = now(), updated_at = now(),
           paused_at = NULL, deadline_left = NULL, limit_admitted = false,
           result = CASE WHEN p_state = 'completed' THEN cyclone__run_result(id) END
     WHERE id = p_run_id
    RETURNING parent_run_id, limit_keys IS NOT NULL INTO parent, limited;
    PERFORM pg_notify('cyclone_run_ended', CASE WHEN parent IS NULL THEN 'top' ELSE '' END);
    IF limited THEN
        PERFORM pg_notify('cyclone_available', '');
    END IF;
END $$;

-- The run completes when nothing non-terminal remains (in a paused run too: a pause never
-- holds a finished run). Returns whether it completed.
CREATE OR REPLACE FUNCTION cyclone__run_settle(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM cyclone_runs WHERE id = p_run_id AND state IN ('running', 'paused'))
       AND NOT EXISTS (SELECT 1 FROM cyclone_steps
                        WHERE run_id = p_run_id
                          AND state NOT IN ('completed', 'discarded', 'cancelled')) THEN
        PERFORM cyclone__run_end(p_run_id, 'completed');
        RETURN true;
    END IF;
    RETURN false;
END $$;

-- Cancel a whole (child) run because its parent closed: its parent node was cancelled or
-- discarded, or the parent run failed or was cancelled. Recurses into its own child runs.
CREATE OR REPLACE FUNCTION cyclone__run_cancel_tree(p_run_id uuid, p_cause text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs;
BEGIN
    SELECT * INTO r FROM cyclone_runs WHERE id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND OR r.state NOT IN ('running', 'paused') THEN
        RETURN;
    END IF;
    PERFORM cyclone__steps_cancel(r.id, NULL, p_cause, NULL);
    PERFORM cyclone__run_end(r.id, 'cancelled');
END $$;

-- Cancel the non-terminal steps of a run among p_ids (all of them when p_ids is NULL), and
-- the active child run of each child node among them, in this same transaction.
CREATE OR REPLACE FUNCTION cyclone__steps_cancel(p_run_id uuid, p_ids uuid[], p_cause text, p_by uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer := 0;
    child uuid;
BEGIN
    FOR child IN
        WITH c AS (
            UPDATE cyclone_steps
               SET state = 'cancelled', cancel_cause = p_cause, cancelled_by = p_by,
                   finished_at = now(),
                   timer_left = NULL, max_wait_left = NULL
             WHERE run_id = p_run_id
               AND (p_ids IS NULL OR id = ANY (p_ids))
               AND state NOT IN ('completed', 'discarded', 'cancelled')
            RETURNING type, child_run_id
        )
        SELECT c.child_run_id FROM c
    LOOP
        n := n + 1;
        IF child IS NOT NULL THEN
            -- A child node's child run closes with it ('parent' marks why its steps ended).
            PERFORM cyclone__run_cancel_tree(child, 'parent');
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- What a discard does to its run: cancel only its branch when every node downstream of it
-- (transitively) declared CancelBranch, else fail fast: cancel every non-terminal step and
-- fail the run. A discarded node with no dependents is never contained.
-- p_force_fail: the run deadline, which fails the run whatever CancelBranch says.
CREATE OR REPLACE FUNCTION cyclone__discard_settle(p_run_id uuid, p_step_id uuid)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    downstream uuid[];
    lo uuid;
    hi uuid;
BEGIN
    -- The run's day (its steps are in it: a step's id starts with its run's), for the lookups
    -- by id = ANY below, which an array alone prunes to no day.
    SELECT d.lo, d.hi INTO lo, hi FROM cyclone__days_span(p_run_id, p_run_id) d;
    WITH RECURSIVE down (id) AS (
        SELECT d.step_id FROM cyclone_step_deps d WHERE d.dep_id = p_step_id
        UNION
        SELECT d.step_id FROM cyclone_step_deps d JOIN down ON d.dep_id = down.id
    )
    SELECT array_agg(id) INTO downstream FROM down;

    IF downstream IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cyclone_steps s
                        WHERE s.id = ANY (downstream) AND s.id >= lo AND s.id < hi
                          AND s.on_dep_failure <> 'cancel_branch') THEN
        PERFORM cyclone__steps_cancel(p_run_id, downstream, 'branch', p_step_id);
        PERFORM cyclone__run_settle(p_run_id);
        RETURN 'contained';
    END IF;

    PERFORM cyclone__steps_cancel(p_run_id, NULL, 'fail_fast', p_step_id);
    UPDATE cyclone_runs SET failed_by_step = p_step_id WHERE id = p_run_id;
    PERFORM cyclone__run_end(p_run_id, 'failed');
    RETURN 'failed';
END $$;

-- Discard a step (any non-terminal state; the caller checked which) and apply fail-fast.
CREATE OR REPLACE FUNCTION cyclone__step_discard(p_run_id uuid, p_step_id uuid, p_error_kind text,
                                                 p_reason text, p_message text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cyclone_steps
       SET state = 'discarded', error_kind = p_error_kind, reason = p_reason,
           errors = errors || jsonb_build_object('attempt', attempt, 'error_kind', p_error_kind,
                                                 'reason', p_reason, 'message', p_message, 'at', now()),
           finished_at = now(),
           timer_left = NULL, max_wait_left = NULL
     WHERE id = p_step_id;
    RETURN cyclone__discard_settle(p_run_id, p_step_id);
END $$;

-- A step completed (by its handler, its timer, a signal or its child run): promote what it
-- unblocked and complete the run when nothing is left.
CREATE OR REPLACE FUNCTION cyclone__after_complete(p_run_id uuid, p_step_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone__promote(p_run_id, p_step_id);
    PERFORM cyclone__run_settle(p_run_id);
END $$;

-- Complete a wait node (timer, signal or child) that is in p_from.
CREATE OR REPLACE FUNCTION cyclone__wait_complete(p_run_id uuid, p_step_id uuid, p_from text, p_output jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE cyclone_steps
       SET state = 'completed', output = COALESCE(p_output, 'null'::jsonb), finished_at = now(),
           timer_left = NULL, max_wait_left = NULL
     WHERE id = p_step_id AND state = p_from;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM cyclone__after_complete(p_run_id, p_step_id);
    RETURN true;
END $$;

-- Move each pending step whose deps are all completed into its entry state. Only in a
-- running run: in a paused run pending steps stay pending and Resume promotes them.
-- p_after limits the search to the dependents of one step that just completed.
DROP FUNCTION IF EXISTS cyclone__promote(uuid, uuid);
DROP FUNCTION IF EXISTS cyclone__promote(uuid, uuid, boolean);
CREATE FUNCTION cyclone__promote(p_run_id uuid, p_after uuid DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql
-- Its statements are cached as generic plans. One planned while cyclone_step_deps was
-- still empty would scan that table on every completion until the next ANALYZE; every
-- lookup here has an index, so scans are never the right plan. And jit off: on Postgres 15 to
-- 17 a disabled seqscan costs 1e10, past every JIT threshold, outside a results batch too.
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    sid uuid;
    ids uuid[];
    n integer := 0;
    lo uuid;
    hi uuid;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM cyclone_runs WHERE id = p_run_id AND state = 'running') THEN
        RETURN 0;
    END IF;
    SELECT d.lo, d.hi INTO lo, hi FROM cyclone__days_span(p_run_id, p_run_id) d;  -- (cyclone__discard_settle)
    -- Two statements, not one with "p_after IS NULL OR ...": a completion must start from
    -- the dependents of its step (cyclone_step_deps_dep), never walk the whole run. Not one
    -- UNION ALL either: its custom plan (one branch pruned) always looks cheaper than the
    -- generic one, so Postgres would plan it again on every completion.
    IF p_after IS NOT NULL THEN
        -- The dependents first, on their own: joined in one statement, the generic plan
        -- may start from the run's pending steps instead (which grows with the queue).
        SELECT array_agg(a.step_id) INTO ids FROM cyclone_step_deps a WHERE a.dep_id = p_after;
        IF ids IS NULL THEN
            RETURN 0;
        END IF;
        SELECT array_agg(s.id ORDER BY s.id) INTO ids
          FROM cyclone_steps s
         WHERE s.id = ANY (ids) AND s.id >= lo AND s.id < hi AND s.state = 'pending'
           AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = s.id AND d.step_id >= lo AND d.step_id < hi
                              AND p.id >= lo AND p.id < hi AND p.state <> 'completed' OFFSET 0);
    ELSE
        SELECT array_agg(s.id ORDER BY s.id) INTO ids
          FROM cyclone_steps s
         WHERE s.run_id = p_run_id AND s.state = 'pending'
           AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = s.id AND d.step_id >= lo AND d.step_id < hi
                              AND p.id >= lo AND p.id < hi AND p.state <> 'completed' OFFSET 0);
    END IF;
    IF cardinality(ids) > 1  -- entered one by one: what they lock, first, in one order
       AND EXISTS (SELECT 1 FROM cyclone_steps x WHERE x.id = ANY (ids) AND x.id >= lo AND x.id < hi
                      AND x.limit_keys IS NOT NULL) THEN
        PERFORM cyclone__arrivals_lock(ids);
    END IF;
    FOREACH sid IN ARRAY COALESCE(ids, '{}') LOOP
        PERFORM cyclone__step_enter(p_run_id, sid);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- pending -> available | waiting_timer | waiting_signal | waiting_child.
CREATE OR REPLACE FUNCTION cyclone__step_enter(p_run_id uuid, p_step_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    limited boolean;
BEGIN
    UPDATE cyclone_steps
       SET state = cyclone__entry_state(type),
           scheduled_at = CASE WHEN type = 'task' THEN now() ELSE scheduled_at END,
           wait_started_at = CASE WHEN type <> 'task' THEN now() END,
           timer_at = CASE WHEN type = 'sleep' THEN now() + sleep_for END,
           max_wait_at = CASE WHEN type <> 'task' THEN now() + max_wait END,
           timer_left = NULL, max_wait_left = NULL
     WHERE id = p_step_id AND state = 'pending'
    RETURNING type, limit_keys IS NOT NULL INTO t, limited;
    IF t = 'task' THEN
        IF limited THEN
            PERFORM cyclone__limits_arrive(p_run_id, ARRAY[p_step_id], '{}', false);
        END IF;
        PERFORM cyclone__notify_available();
    ELSIF t = 'signal' THEN
        PERFORM cyclone__signals_deliver(p_run_id);
    ELSIF t = 'child' THEN
        PERFORM cyclone__child_attach(p_run_id, p_step_id);
    END IF;
END $$;

-- Pair waiting signal nodes with unconsumed signals of their name: the node that started
-- waiting first takes the oldest signal (ties by node id). Each signal is consumed once.
CREATE OR REPLACE FUNCTION cyclone__signals_deliver(p_run_id uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer := 0;
    s record;
    sig cyclone_signals;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM cyclone_runs WHERE id = p_run_id AND state = 'running') THEN
        RETURN 0;
    END IF;
    LOOP
        SELECT st.id, st.signal_name INTO s
          FROM cyclone_steps st
         WHERE st.run_id = p_run_id AND st.state = 'waiting_signal'
           AND EXISTS (SELECT 1 FROM cyclone_signals g
                        WHERE g.run_id = p_run_id AND g.name = st.signal_name AND g.consumed_by IS NULL)
         ORDER BY st.wait_started_at, st.node
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        UPDATE cyclone_signals g
           SET consumed_by = s.id, consumed_at = now()
         WHERE g.id = (SELECT g2.id FROM cyclone_signals g2
                        WHERE g2.run_id = p_run_id AND g2.name = s.signal_name AND g2.consumed_by IS NULL
                        ORDER BY g2.created_at, g2.id LIMIT 1)
        RETURNING * INTO sig;
        PERFORM cyclone__wait_complete(p_run_id, s.id, 'waiting_signal', sig.payload);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- A child node entered waiting_child: insert its child run, graph and parent link, or reuse
-- the child run it already has (Retry): a completed one gives its result, a failed one is
-- reopened, a cancelled one is replaced by a new run.
CREATE OR REPLACE FUNCTION cyclone__child_attach(p_run_id uuid, p_step_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r  cyclone_runs;
    s  cyclone_steps;
    cr cyclone_runs;
    wf cyclone_workflows;
    child_input jsonb;
BEGIN
    SELECT * INTO r FROM cyclone_runs WHERE id = p_run_id;
    SELECT * INTO s FROM cyclone_steps WHERE id = p_step_id;
    IF s.child_run_id IS NOT NULL THEN
        SELECT * INTO cr FROM cyclone_runs WHERE id = s.child_run_id FOR NO KEY UPDATE;
        IF FOUND THEN
            IF cr.state = 'completed' THEN
                -- A retried node takes the result of its completed child run at once, in the
                -- Retry's transaction (docs/lifecycle.md, "Reopened child runs").
                PERFORM cyclone__wait_complete(p_run_id, p_step_id, 'waiting_child', cr.result);
                RETURN;
            ELSIF cr.state = 'failed' THEN
                PERFORM cyclone__run_reopen(cr.id, NULL, NULL);
                RETURN;
            ELSIF cr.state IN ('running', 'paused') THEN
                RETURN;
            END IF;
        END IF;
    END IF;

    IF r.depth >= 32 THEN
        PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'nesting_limit',
            format('child runs nest deeper than 32 levels (node %s)', s.node));
        RETURN;
    END IF;
    SELECT * INTO wf FROM cyclone_workflows WHERE name = s.child_workflow ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'child_workflow_missing',
            format('child workflow %s is not registered', s.child_workflow));
        RETURN;
    END IF;

    -- The child run's input: the parent run's input and the outputs of the node's parents.
    SELECT jsonb_build_object(
               'input', r.input,
               'parents', COALESCE(jsonb_object_agg(p.node, p.output), '{}'::jsonb))
      INTO child_input
      FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
     WHERE d.step_id = p_step_id;

    -- The child run joins its parent's trace. The database may refuse it for flow control (a
    -- limit that no longer exists, a limit's key its input lacks). Made with its parent run
    -- (a root node, in the submit's transaction: created_at is this transaction's now()), the
    -- refusal is the submit's, naming the node. Made later (when the node's dependencies
    -- complete, often in a worker's result for the one before), it discards the node, as a
    -- missing workflow does, and that transaction goes on. A subtransaction only where a
    -- refusal can come from: some limit exists, or the child's nodes name limits.
    IF NOT EXISTS (SELECT 1 FROM cyclone_limits)
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(wf.definition -> 'nodes') n
                        WHERE jsonb_typeof(n -> 'limits') = 'array') THEN
        cr := cyclone__run_create(wf.name, wf.version, wf.definition -> 'nodes', child_input, r.priority,
                                  NULL, NULL, NULL, NULL, r.id, p_step_id, r.depth + 1, r.trace_context);
    ELSE
        BEGIN
            cr := cyclone__run_create(wf.name, wf.version, wf.definition -> 'nodes', child_input, r.priority,
                                      NULL, NULL, NULL, NULL, r.id, p_step_id, r.depth + 1, r.trace_context);
        EXCEPTION WHEN SQLSTATE 'CY400' THEN
            IF r.created_at = now() THEN
                RAISE EXCEPTION 'node "%" (child workflow %): %', s.node, wf.name, SQLERRM USING ERRCODE = 'CY400';
            END IF;
            PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'child_run_refused',
                format('child run of workflow %s refused: %s', wf.name, SQLERRM));
            RETURN;
        END;
    END IF;
    UPDATE cyclone_steps SET child_run_id = cr.id WHERE id = p_step_id;
END $$;

-- Insert a run in state running with its steps and edges, all in the caller's transaction.
-- p_nodes holds fully defaulted node definitions (definitions.py).
-- p_trace_context: the W3C trace context to keep with the run (see migration 0007).
DROP FUNCTION IF EXISTS cyclone__run_create(text, integer, jsonb, jsonb, integer, text, text, timestamptz,
                                            timestamptz, uuid, uuid, integer);
CREATE OR REPLACE FUNCTION cyclone__run_create(
    p_workflow text, p_version integer, p_nodes jsonb, p_input jsonb, p_priority integer,
    p_idempotency_key text, p_request_hash text, p_deadline timestamptz, p_scheduled_at timestamptz,
    p_parent_run_id uuid, p_parent_step_id uuid, p_depth integer, p_trace_context jsonb DEFAULT NULL)
RETURNS cyclone_runs LANGUAGE plpgsql
-- One generic plan per statement for the session (cyclone_results_apply says why: planned per
-- call, the insert of the edges alone cost 3.5 ms with 30 days of history), made whatever
-- the tables held then: every lookup by index (enable_seqscan off), and so no JIT.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r cyclone_runs;
    sid uuid;
    any_available boolean;
    any_child boolean;
    limited boolean;
    run_tokens text[];
    root_kinds text[];
    root_tokens text[];
    arrived uuid[];
BEGIN
    PERFORM cyclone__limits_read_lock();  -- before the limits are read (15_limits.sql)
    limited := EXISTS (SELECT 1 FROM cyclone_limits)
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_nodes) n WHERE jsonb_typeof(n -> 'limits') = 'array');
    -- The limits the run and its steps consume, under their keys (docs/flow-control.md).
    IF limited THEN
        run_tokens := cyclone__run_tokens(p_workflow, COALESCE(p_input, 'null'::jsonb));
    END IF;
    INSERT INTO cyclone_runs (id, workflow_name, workflow_version, state, input, priority,
                              idempotency_key, request_hash, deadline_at, parent_run_id,
                              parent_step_id, depth, trace_context, retention, limit_keys)
    VALUES (cyclone_uuid7(), p_workflow, p_version, 'running', COALESCE(p_input, 'null'::jsonb),
            p_priority, p_idempotency_key, p_request_hash, p_deadline, p_parent_run_id,
            p_parent_step_id, p_depth, p_trace_context,
            (SELECT max(make_interval(secs => (n ->> 'retention')::float8))
               FROM jsonb_array_elements(p_nodes) n WHERE n ->> 'retention' IS NOT NULL),
            run_tokens)
    RETURNING * INTO r;

    -- Root task steps of several keys: their fair clocks are locked in (kind, token) order
    -- before the insert places them one by one in node order (cyclone__fair_place), and the
    -- keys of the run's and their strategies before they arrive (cyclone__arrivals_lock); a
    -- submit with the keys the other way round would deadlock with this one. (A child run
    -- made in the same transaction, below, takes its own clocks and keys after these: a
    -- submit of its workflow alone, racing this one on the same keys, can still deadlock.)
    IF limited AND jsonb_array_length(p_nodes) > 1 THEN
        SELECT array_agg(n ->> 'kind'), array_agg(x.tokens[1]) INTO root_kinds, root_tokens
          FROM jsonb_array_elements(p_nodes) n
         CROSS JOIN LATERAL (SELECT cyclone__step_tokens(n, COALESCE(p_input, 'null'::jsonb), run_tokens) AS tokens) x
         WHERE jsonb_array_length(n -> 'deps') = 0 AND n ->> 'type' = 'task' AND x.tokens IS NOT NULL;
        IF cardinality(root_kinds) > 1 THEN
            PERFORM cyclone__fair_keys_lock(root_kinds, root_tokens);
        END IF;
    END IF;

    -- What the new steps entered is taken from the insert itself: a query on the run's
    -- available steps would be planned against the claim index and walk the whole queue.
    WITH inserted AS (
    INSERT INTO cyclone_steps (
        id, run_id, node, position, kind, type, state, priority, scheduled_at, max_attempts, max_reclaims,
        attempt_timeout, backoff_initial, backoff_max, on_dep_failure, retention, sleep_for,
        signal_name, child_workflow, max_wait, wait_started_at, timer_at, max_wait_at, limit_keys)
    SELECT cyclone__step_uuid(r.id), r.id, n ->> 'id', ord - 1, n ->> 'kind', n ->> 'type',
           CASE WHEN ready THEN cyclone__entry_state(n ->> 'type') ELSE 'pending' END,
           COALESCE((n ->> 'priority')::integer, p_priority),
           COALESCE(p_scheduled_at, now()),
           (n ->> 'max_attempts')::integer,
           (n ->> 'max_reclaims')::integer,
           make_interval(secs => (n ->> 'attempt_timeout')::float8),
           make_interval(secs => (n ->> 'backoff_initial')::float8),
           make_interval(secs => (n ->> 'backoff_max')::float8),
           n ->> 'on_dep_failure',
           make_interval(secs => (n ->> 'retention')::float8),
           make_interval(secs => (n ->> 'sleep')::float8),
           n ->> 'signal',
           n ->> 'workflow',
           make_interval(secs => (n ->> 'max_wait')::float8),
           CASE WHEN ready AND n ->> 'type' <> 'task' THEN now() END,
           CASE WHEN ready AND n ->> 'type' = 'sleep' THEN now() + make_interval(secs => (n ->> 'sleep')::float8) END,
           CASE WHEN ready AND n ->> 'type' <> 'task' THEN now() + make_interval(secs => (n ->> 'max_wait')::float8) END,
           CASE WHEN limited THEN cyclone__step_tokens(n, COALESCE(p_input, 'null'::jsonb), run_tokens) END
      FROM jsonb_array_elements(p_nodes) WITH ORDINALITY AS t (n, ord)
     CROSS JOIN LATERAL (SELECT jsonb_array_length(n -> 'deps') = 0 AS ready) x
     ORDER BY ord
    RETURNING id, state, limit_keys)
    SELECT COALESCE(bool_or(state = 'available'), false), COALESCE(bool_or(state = 'waiting_child'), false),
           array_agg(id ORDER BY id) FILTER (WHERE state = 'available' AND limit_keys IS NOT NULL)
      INTO any_available, any_child, arrived
      FROM inserted;

    INSERT INTO cyclone_step_deps (run_id, step_id, dep_id)
    SELECT r.id, s.id, d.id
      FROM jsonb_array_elements(p_nodes) n
     CROSS JOIN LATERAL jsonb_array_elements_text(n -> 'deps') AS dep (node)
      JOIN cyclone_steps s ON s.run_id = r.id AND s.node = n ->> 'id'
      JOIN cyclone_steps d ON d.run_id = r.id AND d.node = dep.node;

    IF limited THEN  -- the limits' strategies (it may cancel this very run)
        IF cardinality(arrived) > 1 THEN
            PERFORM cyclone__arrivals_lock(arrived, run_tokens);
        END IF;
        PERFORM cyclone__limits_arrive(r.id, COALESCE(arrived, '{}'));
    END IF;
    IF any_available THEN
        PERFORM cyclone__notify_available();
    END IF;
    IF any_child AND EXISTS (SELECT 1 FROM cyclone_runs WHERE id = r.id AND state = 'running') THEN
        FOR sid IN SELECT id FROM cyclone_steps WHERE run_id = r.id AND state = 'waiting_child' ORDER BY id LOOP
            PERFORM cyclone__child_attach(r.id, sid);
        END LOOP;
    END IF;
    SELECT * INTO r FROM cyclone_runs WHERE id = r.id;
    PERFORM cyclone__history_made();  -- (its day may have been settled since its id was made)
    RETURN r;
END $$;
