-- The life of a task step under a lease: claim, complete, fail, snooze, renew, and the
-- recovery sweep. Every result is fenced by (state = 'running', lease_generation).
--
-- Result statuses: 'applied' (and, more precisely, 'retried', 'discarded', 'snoozed',
-- 'output_too_large'), or a refusal: 'stale' (another generation holds or held the step),
-- 'ended' (the step already left running under this generation), 'unknown' (no such step),
-- 'busy' (a batch could not lock the run without waiting: apply the result again alone).
--
-- Plans: a fenced statement that finds its step by id compares the state with
-- `(SELECT 'running'::text)`, not with the literal. With the literal, the planner may scan
-- a partial index of running steps (cyclone_steps_running) instead
-- of probing the primary key, as it does whenever the last ANALYZE saw no step running;
-- every result then walks every running step. The sub-select's value is unknown when the
-- plan is made, so no partial index of running steps qualifies.

-- available -> running, for up to p_limit steps of the given kinds, priority then FIFO.
-- The claim writes exactly what the document lists; the attempt does not change.
-- `waited` is how long each step was claimable before this claim (its queue wait; the dispatch
-- latency adds the claim, its commit and the push, which the dispatcher times).
-- `trace_context` is the run's, for the lease.
--
-- Plans: the dispatcher runs this on every pass, often for one or two steps, so planning
-- it each time would cost more than running it (about 0.5 ms against 0.2). PL/pgSQL keeps
-- the statement's plan for the session, and force_generic_plan makes that plan once,
-- without looking at p_limit: so it must not depend on how many steps are claimed or on
-- the statistics of the moment (one made while the tables were small). Every step is
-- therefore reached by index, whatever the planner guesses: picked through
-- cyclone_steps_claim_free (migration 0010; cyclone__limits_pick for steps with limits), updated by primary key (= ANY of the picked ids; `(SELECT
-- 'available'::text)` so that no partial index of available steps qualifies, see "Plans"
-- above), and its run and parents looked up by id each (OFFSET 0: joined, they could be
-- hashed from a scan of the whole table).
-- JIT: a generic plan costs LIMIT p_limit at a tenth of the available steps, so with a large
-- backlog (about 375,000 steps and more) its estimated cost passes jit_above_cost, and a
-- Postgres built with LLVM (Debian's, PGDG's) compiled the plan anew on every call: about
-- 19 ms of JIT for 1.5 ms of work, a burst drained at a quarter of the rate. The claim
-- touches at most p_limit rows by index: jit = off, for every caller.
-- `rated`: whether the step's start counts against a rate; the dispatcher reports such a
-- lease once written to its worker (cyclone_limit_starts_pushed). cyclone_steps_claim, below,
-- is this claim without it.
DROP FUNCTION IF EXISTS cyclone_steps_claim(text, text[], integer, interval);
CREATE OR REPLACE FUNCTION cyclone__steps_claim(p_owner text, p_kinds text[], p_limit integer,
                                                p_lease_ttl interval)
RETURNS TABLE (step_id uuid, run_id uuid, node text, kind text, priority integer, attempt integer,
               max_attempts integer, reclaims integer, snoozes integer, lease_generation bigint,
               lease_expiry timestamptz, attempt_deadline timestamptz, waited double precision,
               input jsonb, parents jsonb, trace_context jsonb, rated boolean)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    ids uuid[];
    limited uuid[];
    judged text[];
    picked uuid[];
    admitting uuid[];
    span_lo uuid;
    span_hi uuid;
    live_lo uuid := cyclone__live_floor();  -- no claimable step is in a day before (settled days)
BEGIN
    -- Due limited steps not yet placed in the fair order, first: this may wait for their
    -- clocks, which it must not do holding rows (cyclone__limits_place_due).
    PERFORM cyclone__limits_place_due(p_kinds, pg_current_xact_id_if_assigned() IS NULL);
    -- Per kind, so each kind's scan walks the index in order; the outer ORDER BY merges
    -- them. Rows locked here and not claimed are released at commit.
    ids := ARRAY(
        SELECT c.id
          FROM unnest(p_kinds) AS k (kind)
         CROSS JOIN LATERAL (
            SELECT s.id, s.priority, s.scheduled_at FROM cyclone_steps s
             WHERE s.state = 'available' AND s.limit_keys IS NULL AND s.kind = k.kind
               AND s.scheduled_at <= now() AND s.id >= live_lo
             ORDER BY s.priority, s.scheduled_at, s.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) c
         ORDER BY c.priority, c.scheduled_at, c.id
         LIMIT p_limit);
    -- Steps with limits (docs/flow-control.md) have indexes of their own: the ones a claim may
    -- take (their keys locked until commit) join the others, in order of priority, then of the
    -- time they became claimable. The pick finds none at the cost of two empty index probes
    -- (about 10 us more than a probe of its own here, which costs as much as the pick's first
    -- reads when there are limited steps: the fair order's first entries, often dead).
    SELECT COALESCE(array_agg(p.id), '{}'), COALESCE(array_agg(p.tokens), '{}') INTO limited, judged
      FROM cyclone__limits_pick(p_kinds, p_limit) AS p;
    IF cardinality(limited) > 0 THEN
        -- The picked steps' rows without waiting: a step that an arrival is cancelling (its
        -- key's strategy) is held by it, and the arrival may then wait for a key this claim
        -- holds. Such a step is left out. So is one whose start would admit its run under a
        -- limit of runs (cyclone__limits_take) while another transaction holds the run: a
        -- cancel of the run (CancelRun, a strategy) holds it and then cancels its steps.
        -- (Each statement over these steps by id = ANY within their days, and their runs', which
        -- are the same: an array prunes no day of history.)
        SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(limited) d;
        picked := ARRAY(SELECT x.id FROM cyclone_steps x WHERE x.id = ANY (limited) AND x.id >= span_lo AND x.id < span_hi
                           FOR UPDATE SKIP LOCKED);
        IF EXISTS (SELECT 1 FROM cyclone_steps x JOIN cyclone_runs r ON r.id = x.run_id
                    WHERE x.id = ANY (picked) AND x.id >= span_lo AND x.id < span_hi
                      AND r.id >= span_lo AND r.id < span_hi
                      AND r.limit_keys IS NOT NULL AND NOT r.limit_admitted) THEN
            admitting := ARRAY(SELECT r.id FROM cyclone_runs r
                                WHERE r.id IN (SELECT x.run_id FROM cyclone_steps x
                                                WHERE x.id = ANY (picked) AND x.id >= span_lo AND x.id < span_hi)
                                  AND r.id >= span_lo AND r.id < span_hi
                                  AND r.limit_keys IS NOT NULL AND NOT r.limit_admitted
                                  FOR NO KEY UPDATE SKIP LOCKED);
            picked := ARRAY(SELECT x.id FROM cyclone_steps x JOIN cyclone_runs r ON r.id = x.run_id
                             WHERE x.id = ANY (picked) AND x.id >= span_lo AND x.id < span_hi
                               AND r.id >= span_lo AND r.id < span_hi
                               AND (r.id = ANY (admitting) OR r.limit_keys IS NULL OR r.limit_admitted));
        END IF;
    END IF;
    IF cardinality(ids) = 0 THEN
        ids := COALESCE(picked, '{}');  -- at most p_limit; the UPDATE below takes them in any order
    ELSIF cardinality(picked) > 0 THEN
        SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(ids || picked) d;
        ids := ARRAY(SELECT s.id FROM cyclone_steps s WHERE s.id = ANY (ids || picked) AND s.id >= span_lo AND s.id < span_hi
                      ORDER BY s.priority, s.scheduled_at, s.id LIMIT p_limit);
    END IF;
    IF cardinality(ids) = 0 THEN
        RETURN;  -- (the statements below would find nothing, and open every day's partitions)
    END IF;
    -- The days the claimed steps are in (cyclone__ids_span): the update reads those alone.
    SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(ids) d;

    RETURN QUERY
    WITH claimed AS (
        UPDATE cyclone_steps s
           SET state = 'running', lease_expiry = now() + p_lease_ttl, lease_owner = p_owner,
               lease_generation = s.lease_generation + 1, started_at = now(),
               attempt_deadline = now() + s.attempt_timeout
         WHERE s.id = ANY (ids) AND s.state = (SELECT 'available'::text)
           AND s.id >= span_lo AND s.id < span_hi
           -- a limited step only with the tokens its limits were judged by (a limit created
           -- or attached meanwhile, SetLimit's backfill, leaves it for the next claim)
           AND (s.limit_keys IS NULL
                OR array_to_string(s.limit_keys, chr(30)) = judged[array_position(limited, s.id)])
        RETURNING s.*
    )
    SELECT c.id, c.run_id, c.node, c.kind, c.priority, c.attempt, c.max_attempts, c.reclaims, c.snoozes,
           c.lease_generation, c.lease_expiry, c.attempt_deadline,
           greatest(extract(epoch FROM now() - c.scheduled_at), 0)::double precision, r.input,
           COALESCE((SELECT jsonb_object_agg(p.node, p.output)
                       FROM cyclone_step_deps d
                      CROSS JOIN LATERAL (SELECT p.node, p.output FROM cyclone_steps p
                                           WHERE p.id = d.dep_id AND p.id >= span_lo AND p.id < span_hi OFFSET 0) p
                      WHERE d.step_id = c.id AND d.step_id >= span_lo AND d.step_id < span_hi), '{}'::jsonb),
           r.trace_context,
           -- (a probe of cyclone_limits by name per token, whatever the plan: as a join, a
           -- review saw a plan kept from when the table was small read every limit)
           CASE WHEN c.limit_keys IS NULL THEN false
                ELSE EXISTS (SELECT 1 FROM unnest(c.limit_keys) AS x (t)
                              WHERE (SELECT l.rate FROM cyclone_limits l
                                      WHERE l.name = cyclone__token_limit(x.t)) IS NOT NULL) END
      FROM claimed c
     CROSS JOIN LATERAL (SELECT r.input, r.trace_context FROM cyclone_runs r
                          WHERE r.id = c.run_id AND r.id >= span_lo AND r.id < span_hi OFFSET 0) r
     ORDER BY c.priority, c.scheduled_at, c.id;
    IF cardinality(limited) > 0 THEN  -- the starts and admissions of the limited steps claimed
        PERFORM cyclone__limits_take(ARRAY(SELECT x FROM unnest(ids) AS x WHERE x = ANY (limited)), p_owner);
    END IF;
END $$;

-- The claim's rows without `rated`, as they were before migration 0013's release (a server of
-- that release calls it, prepared, through cyclone_leases_claim below).
CREATE FUNCTION cyclone_steps_claim(p_owner text, p_kinds text[], p_limit integer, p_lease_ttl interval)
RETURNS TABLE (step_id uuid, run_id uuid, node text, kind text, priority integer, attempt integer,
               max_attempts integer, reclaims integer, snoozes integer, lease_generation bigint,
               lease_expiry timestamptz, attempt_deadline timestamptz, waited double precision,
               input jsonb, parents jsonb, trace_context jsonb)
LANGUAGE sql
SET jit = off
AS $$
    SELECT c.step_id, c.run_id, c.node, c.kind, c.priority, c.attempt, c.max_attempts, c.reclaims, c.snoozes,
           c.lease_generation, c.lease_expiry, c.attempt_deadline, c.waited, c.input, c.parents, c.trace_context
      FROM cyclone__steps_claim(p_owner, p_kinds, p_limit, p_lease_ttl) AS c
$$;

-- The dispatcher's claim: cyclone__steps_claim's rows as a Lease carries them (ids as text,
-- times as microseconds since the epoch, payloads as JSON text, parents NULL when the node
-- has none), so that the server converts nothing it only passes on; and `rated`, which the
-- Lease does not carry (the server reports those leases once written: cyclone_limit_starts_pushed).
CREATE OR REPLACE FUNCTION cyclone_leases_claim_rated(p_owner text, p_kinds text[], p_limit integer,
                                                      p_lease_ttl interval)
RETURNS TABLE (step_id text, run_id text, node text, kind text, attempt integer, max_attempts integer,
               reclaims integer, snoozes integer, lease_generation bigint, lease_expiry_us bigint,
               attempt_deadline_us bigint, waited double precision, input text, parents text,
               trace_context jsonb, rated boolean)
LANGUAGE sql AS $$
    SELECT c.step_id::text, c.run_id::text, c.node, c.kind, c.attempt, c.max_attempts, c.reclaims, c.snoozes,
           c.lease_generation, (extract(epoch FROM c.lease_expiry) * 1000000)::bigint,
           (extract(epoch FROM c.attempt_deadline) * 1000000)::bigint, c.waited, c.input::text,
           CASE WHEN c.parents = '{}'::jsonb THEN NULL ELSE c.parents::text END, c.trace_context, c.rated
      FROM cyclone__steps_claim(p_owner, p_kinds, p_limit, p_lease_ttl) AS c
$$;

-- Enqueue, then claim in the same transaction for a worker that waits for these kinds (the
-- server's Enqueue when such a worker has free slots): one commit instead of two, and the
-- lease goes out as the call returns. The claim is the dispatcher's, in priority then FIFO
-- order, so an older step of these kinds is claimed before a job enqueued here. Rows:
-- each job's as cyclone_jobs_enqueue returns it (idx set, the lease columns NULL), then
-- each claimed step's as cyclone_leases_claim_rated returns it (idx NULL).
CREATE OR REPLACE FUNCTION cyclone_jobs_enqueue_claim_rated(p_jobs jsonb, p_owner text, p_kinds text[],
                                                            p_limit integer, p_lease_ttl interval)
RETURNS TABLE (idx integer, created boolean, step_id text, run_id text, node text, kind text, attempt integer,
               max_attempts integer, reclaims integer, snoozes integer, lease_generation bigint,
               lease_expiry_us bigint, attempt_deadline_us bigint, waited double precision, input text,
               parents text, trace_context jsonb, rated boolean)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT e.idx, e.created, e.step_id::text, e.run_id::text, NULL::text, NULL::text, NULL::integer,
               NULL::integer, NULL::integer, NULL::integer, NULL::bigint, NULL::bigint, NULL::bigint,
               NULL::double precision, NULL::text, NULL::text, NULL::jsonb, NULL::boolean
          FROM cyclone_jobs_enqueue(p_jobs) AS e;
    RETURN QUERY
        SELECT NULL::integer, NULL::boolean, l.*
          FROM cyclone_leases_claim_rated(p_owner, p_kinds, p_limit, p_lease_ttl) AS l;
END $$;

-- The two above without `rated`, as servers of the release before it call them: their rows
-- keep their type, so that such a server still running during a rolling upgrade (its
-- statements prepared) claims on (docs/operations.md, migration 0013).
CREATE OR REPLACE FUNCTION cyclone_leases_claim(p_owner text, p_kinds text[], p_limit integer,
                                                p_lease_ttl interval)
RETURNS TABLE (step_id text, run_id text, node text, kind text, attempt integer, max_attempts integer,
               reclaims integer, snoozes integer, lease_generation bigint, lease_expiry_us bigint,
               attempt_deadline_us bigint, waited double precision, input text, parents text,
               trace_context jsonb)
LANGUAGE sql AS $$
    SELECT c.step_id, c.run_id, c.node, c.kind, c.attempt, c.max_attempts, c.reclaims, c.snoozes,
           c.lease_generation, c.lease_expiry_us, c.attempt_deadline_us, c.waited, c.input, c.parents,
           c.trace_context
      FROM cyclone_leases_claim_rated(p_owner, p_kinds, p_limit, p_lease_ttl) AS c
$$;

CREATE OR REPLACE FUNCTION cyclone_jobs_enqueue_claim(p_jobs jsonb, p_owner text, p_kinds text[],
                                                      p_limit integer, p_lease_ttl interval)
RETURNS TABLE (idx integer, created boolean, step_id text, run_id text, node text, kind text, attempt integer,
               max_attempts integer, reclaims integer, snoozes integer, lease_generation bigint,
               lease_expiry_us bigint, attempt_deadline_us bigint, waited double precision, input text,
               parents text, trace_context jsonb)
LANGUAGE sql AS $$
    SELECT c.idx, c.created, c.step_id, c.run_id, c.node, c.kind, c.attempt, c.max_attempts, c.reclaims,
           c.snoozes, c.lease_generation, c.lease_expiry_us, c.attempt_deadline_us, c.waited, c.input,
           c.parents, c.trace_context
      FROM cyclone_jobs_enqueue_claim_rated(p_jobs, p_owner, p_kinds, p_limit, p_lease_ttl) AS c
$$;

-- Seconds until the first available step of these kinds becomes claimable (NULL: none; 0
-- or less: one is claimable now); the dispatcher asks after a claim that got fewer rows than
-- it asked for. A step claimable now is one that claim did not take: another transaction
-- held its lock (a concurrent claim, which locks up to its limit of steps of each of its
-- kinds and lets go, unannounced, of those beyond its limit in all; an Enqueue's claim;
-- a run action), or it became due after the claim began. The dispatcher then looks again
-- soon (MIN_DUE_WAIT, doubling while the lock lasts), not at the next wake-up.
-- From cyclone_steps_claim_free (kind, priority, scheduled_at): per kind, a loose scan over its
-- priorities, then one index probe per priority. In a function for its plan, kept as the
-- claim's is: as a statement of its own it was planned again on every pass (its custom
-- plan always looks cheaper), which cost five times what running it does.
CREATE OR REPLACE FUNCTION cyclone_steps_next_due(p_kinds text[]) RETURNS double precision
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off  -- as cyclone__steps_claim: a generic plan's cost says nothing of its work
AS $$
DECLARE
    seconds double precision;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    SELECT extract(epoch FROM min(n.at) - now())::float8 INTO seconds
      FROM unnest(p_kinds) AS k (kind)
     CROSS JOIN LATERAL (
           WITH RECURSIVE p (priority) AS (
               (SELECT s.priority FROM cyclone_steps s
                 WHERE s.kind = k.kind AND s.state = 'available' AND s.limit_keys IS NULL AND s.id >= live_lo
                 ORDER BY s.priority LIMIT 1)
               UNION ALL
               SELECT (SELECT s.priority FROM cyclone_steps s
                        WHERE s.kind = k.kind AND s.state = 'available' AND s.limit_keys IS NULL AND s.id >= live_lo
                          AND s.priority > p.priority
                        ORDER BY s.priority LIMIT 1)
                 FROM p WHERE p.priority IS NOT NULL)
           SELECT (SELECT s.scheduled_at FROM cyclone_steps s
                    WHERE s.kind = k.kind AND s.state = 'available' AND s.limit_keys IS NULL AND s.id >= live_lo
                      AND s.priority = p.priority
                    ORDER BY s.scheduled_at LIMIT 1) AS at
             FROM p WHERE p.priority IS NOT NULL) n;
    -- Steps with limits: when a limit lets one be claimed (cyclone__limits_next_due).
    -- (First, one probe per kind and index for any: each the first entry in the index's order,
    -- or a generic plan may take the first row of another index of the steps and filter.)
    IF EXISTS (SELECT 1 FROM unnest(p_kinds) AS k (kind)
                CROSS JOIN LATERAL (
                      (SELECT 1 FROM cyclone_steps s
                        WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.id >= live_lo
                          AND s.fair_at IS NOT NULL AND s.kind = k.kind
                        ORDER BY s.priority, s.fair_at LIMIT 1)
                      UNION ALL
                      (SELECT 1 FROM cyclone_steps s
                        WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.id >= live_lo
                          AND s.fair_at IS NULL AND s.kind = k.kind
                        ORDER BY s.scheduled_at LIMIT 1)) x) THEN
        seconds := least(seconds, cyclone__limits_next_due(p_kinds));
    END IF;
    RETURN seconds;
END $$;

-- running -> completed (the caller holds the run lock). The output is stored with the step;
-- downstream steps whose last dep this was are promoted; the run completes when nothing
-- non-terminal remains. An output over the size limit discards the step instead: nothing is
-- ever stored truncated.
-- p_output_bytes: the size of the output as compact JSON, when the caller measured it
-- (the server does); otherwise the size of its jsonb text, which counts a space after
-- every ',' and ':' and so errs on the large side.
DROP FUNCTION IF EXISTS cyclone__step_complete(uuid, uuid, bigint, jsonb, integer);
CREATE OR REPLACE FUNCTION cyclone__step_complete(p_run_id uuid, p_step_id uuid, p_generation bigint,
                                                  p_output jsonb, p_max_output_bytes integer,
                                                  p_output_bytes integer DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    size integer;
BEGIN
    p_output := COALESCE(p_output, 'null'::jsonb);
    size := COALESCE(p_output_bytes, octet_length(p_output::text));
    IF size > p_max_output_bytes THEN
        PERFORM 1 FROM cyclone_steps
          WHERE id = p_step_id AND state = (SELECT 'running'::text) AND lease_generation = p_generation FOR UPDATE;
        IF NOT FOUND THEN
            RETURN cyclone__refusal(p_step_id, p_generation);
        END IF;
        PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'output_too_large',
            format('output is %s bytes, over the limit of %s bytes', size, p_max_output_bytes));
        RETURN 'output_too_large';
    END IF;
    UPDATE cyclone_steps
       SET state = 'completed', output = p_output, finished_at = now()
     WHERE id = p_step_id AND state = (SELECT 'running'::text) AND lease_generation = p_generation;
    IF NOT FOUND THEN
        RETURN cyclone__refusal(p_step_id, p_generation);
    END IF;
    PERFORM cyclone__after_complete(p_run_id, p_step_id);
    RETURN 'applied';
END $$;

-- A failed execution (the caller holds the run lock and the step is running under the
-- lease). Permanent, or the last attempt: discarded (permanent | max_attempts | timeout),
-- attempt unchanged, then fail-fast. Otherwise attempt + 1 and back to available after the
-- backoff (to paused in a paused run: available and then paused, in this transaction).
-- p_details (Failed.details, e.g. a traceback) goes in the attempt's error entry when given.
DROP FUNCTION IF EXISTS cyclone__step_failed(uuid, uuid, text, boolean, interval, text);
CREATE OR REPLACE FUNCTION cyclone__step_failed(p_run_id uuid, p_step_id uuid, p_message text,
                                                p_permanent boolean, p_retry_delay interval,
                                                p_error_kind text, p_details text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s cyclone_steps;
    run_state text;
BEGIN
    SELECT * INTO s FROM cyclone_steps WHERE id = p_step_id;
    IF p_permanent OR s.attempt >= s.max_attempts THEN
        PERFORM cyclone__step_discard(p_run_id, p_step_id,
            CASE WHEN p_permanent THEN 'permanent' WHEN p_error_kind = 'timeout' THEN 'timeout'
                 ELSE 'max_attempts' END, NULL, p_message);
        IF p_details IS NOT NULL THEN  -- the entry the discard just appended
            UPDATE cyclone_steps SET errors = jsonb_set(errors, '{-1,details}', to_jsonb(p_details))
             WHERE id = p_step_id;
        END IF;
        RETURN 'discarded';
    END IF;
    SELECT state INTO run_state FROM cyclone_runs WHERE id = p_run_id;
    UPDATE cyclone_steps
       SET state = CASE WHEN run_state = 'paused' THEN 'paused' ELSE 'available' END,
           errors = errors || jsonb_strip_nulls(jsonb_build_object('attempt', attempt, 'error_kind', p_error_kind,
                                                                   'message', p_message, 'at', now(),
                                                                   'details', p_details)),
           -- The backoff of the attempt that just failed: the first retry waits backoff_initial.
           scheduled_at = now() + COALESCE(p_retry_delay,
                                           cyclone__backoff(backoff_initial, backoff_max, attempt)),
           attempt = attempt + 1,
           -- A retried attempt timeout shows on the step (error_kind = "timeout": docs/lifecycle.md, "Run deadline and attempt timeout").
           error_kind = CASE WHEN p_error_kind = 'timeout' THEN 'timeout' ELSE error_kind END,
           attempt_deadline = NULL
     WHERE id = p_step_id;
    IF run_state <> 'paused' THEN
        PERFORM cyclone__notify_available();
    END IF;
    RETURN 'retried';
END $$;

-- running -> available after p_delay, attempt unchanged, snoozes + 1.
CREATE OR REPLACE FUNCTION cyclone__step_snooze(p_run_id uuid, p_step_id uuid, p_generation bigint,
                                                p_delay interval)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    run_state text;
BEGIN
    SELECT state INTO run_state FROM cyclone_runs WHERE id = p_run_id;
    UPDATE cyclone_steps
       SET state = CASE WHEN run_state = 'paused' THEN 'paused' ELSE 'available' END,
           scheduled_at = now() + greatest(COALESCE(p_delay, interval '0'), interval '0'),
           snoozes = snoozes + 1,
           attempt_deadline = NULL
     WHERE id = p_step_id AND state = (SELECT 'running'::text) AND lease_generation = p_generation;
    IF NOT FOUND THEN
        RETURN cyclone__refusal(p_step_id, p_generation);
    END IF;
    IF run_state <> 'paused' THEN
        PERFORM cyclone__notify_available();
    END IF;
    RETURN 'snoozed';
END $$;

DROP FUNCTION IF EXISTS cyclone__step_fail(uuid, uuid, bigint, text, boolean, interval);
CREATE OR REPLACE FUNCTION cyclone__step_fail(p_run_id uuid, p_step_id uuid, p_generation bigint,
                                              p_message text, p_permanent boolean,
                                              p_retry_delay interval, p_details text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM cyclone_steps
      WHERE id = p_step_id AND state = (SELECT 'running'::text) AND lease_generation = p_generation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN cyclone__refusal(p_step_id, p_generation);
    END IF;
    RETURN cyclone__step_failed(p_run_id, p_step_id, COALESCE(p_message, ''), COALESCE(p_permanent, false),
                                p_retry_delay, 'error', p_details);
END $$;

-- Public, one result each, for a worker's own transaction (CompletionTx) and for tests.
-- Each locks the step's run first, then applies the fenced transition.
CREATE OR REPLACE FUNCTION cyclone_step_complete(p_step_id uuid, p_generation bigint, p_output jsonb,
                                                 p_max_output_bytes integer DEFAULT 1048576)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run_of_step(p_step_id);
BEGIN
    IF r.id IS NULL THEN
        RETURN 'unknown';
    END IF;
    RETURN cyclone__step_complete(r.id, p_step_id, p_generation, p_output, p_max_output_bytes);
END $$;

DROP FUNCTION IF EXISTS cyclone_step_fail(uuid, bigint, text, boolean, interval);
CREATE OR REPLACE FUNCTION cyclone_step_fail(p_step_id uuid, p_generation bigint, p_message text,
                                             p_permanent boolean DEFAULT false,
                                             p_retry_delay interval DEFAULT NULL,
                                             p_details text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run_of_step(p_step_id);
BEGIN
    IF r.id IS NULL THEN
        RETURN 'unknown';
    END IF;
    RETURN cyclone__step_fail(r.id, p_step_id, p_generation, p_message, p_permanent, p_retry_delay, p_details);
END $$;

CREATE OR REPLACE FUNCTION cyclone_step_snooze(p_step_id uuid, p_generation bigint, p_delay interval)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run_of_step(p_step_id);
BEGIN
    IF r.id IS NULL THEN
        RETURN 'unknown';
    END IF;
    RETURN cyclone__step_snooze(r.id, p_step_id, p_generation, p_delay);
END $$;

-- Many results in one transaction (group commit). p_results is a JSON array of
-- {"step_id", "generation", "outcome": "completed"|"failed"|"snoozed", "output",
--  "output_bytes" (compact JSON size), "message", "permanent", "retry_delay_ms", "details", "delay_ms"}.
-- One row per element, `idx` its 1-based position: two answers to one lease each get their
-- own status (the first applied, the later ones 'ended').
--
-- The runs of the batch are locked first, in id order: the first waiting, the others
-- without (SKIP LOCKED). A result whose run is busy comes back as 'busy' for the caller to
-- apply again; so the batch never waits holding a lock, and transitions never deadlock.
--
-- Then the common case, a completion that ends a standalone job (its run's only step), is
-- applied set-based: one UPDATE of the steps and one of their runs for the whole batch,
-- with the same guards and effects as the per-result path (cyclone__step_complete:
-- running under this generation, output stored, run completed with {node: output}).
--
-- Then the completions of steps of larger runs (DAGs, child runs), set-based too, for the
-- runs all of whose results in the batch are completions (one answer per lease, output
-- within the limit): one UPDATE of their steps (fenced as above), the promotions of the
-- pending steps they unblocked (task nodes in one UPDATE, wait nodes through
-- cyclone__step_enter), and one UPDATE that completes the runs left with nothing
-- non-terminal. The effects are those of cyclone__step_complete applied to each result in
-- turn: the same steps complete, promote and end the same runs.
--
-- Every other result (failures, snoozes, oversized outputs, a lease answered twice, and
-- every result of a run that has one of those in the batch) goes through the per-result
-- functions, in input order within its run.
--
-- `ended_child_run`: set when this result ended a child run, whose parent node the caller
-- settles in a new transaction once this one committed (cyclone_child_runs_settle).
-- `available`: true when applying the result may have made a step claimable, now or at a
-- later time (a promotion, a retry, a snooze), for the caller to announce new work; false
-- for a job's completion and a refusal. A server announces new work itself (its sessions
-- skip cyclone__notify_available), so a drain of jobs announces nothing.
--
-- Plans: the session keeps one plan per statement, often made while the tables were small
-- (a new database, a queue that fills in the minute before autovacuum analyzes it). Made
-- then, a join from the batch to the steps or the runs was hashed from a scan of the whole
-- table, or the runs were found through cyclone_runs_state_created: once the tables had
-- grown, every batch read every running run (15,000 buffers for 46 results). So every row
-- is found by primary key whatever the statistics: looked up one by one (LATERAL ...
-- OFFSET 0, with the run's and the step's states compared outside, so that no index on a
-- state qualifies), then updated from the rows found (the batch's few, by primary key) or
-- by primary key = ANY of their ids. The runs are locked by this batch first, so a state
-- read in a statement still holds when that statement updates the run.
-- test_result_batches_planned_on_small_tables_reach_their_rows_by_index checks the plans.
DROP FUNCTION IF EXISTS cyclone_results_apply(jsonb, integer);
CREATE FUNCTION cyclone_results_apply(p_results jsonb, p_max_output_bytes integer DEFAULT 1048576)
RETURNS TABLE (idx integer, step_id uuid, lease_generation bigint, status text, ended_child_run uuid,
               available boolean)
LANGUAGE plpgsql
SET enable_seqscan = off  -- as cyclone__steps_claim; it holds for the functions it calls
SET jit = off  -- as cyclone__steps_claim: on Postgres 15 to 17 a disabled seqscan costs 1e10, past every JIT threshold
-- One plan per statement for the session, as the claim's (and for the functions it calls): on
-- the days of history, a custom plan, pruned at planning, always looks cheaper than the
-- generic one, so each statement was planned again on every batch, reading every day's
-- partitions and indexes (about 1 ms a statement with 30 days); the generic plan prunes them
-- as it starts.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    x record;
    arrivals uuid[];
    runs uuid[];
    locked uuid[];
    plain uuid[];
    plain_first boolean;
    fast integer[];
    fast_steps uuid[];
    fast_gens bigint[];
    dag integer[];
    dag_steps uuid[];
    dag_runs uuid[];
    dag_children uuid[];
    reported uuid;
    cands uuid[];
    tasks uuid[];
    waits uuid[];
    wait_runs uuid[];
    promoted boolean := false;
    n integer;
    children boolean;
    span_lo uuid;
    span_hi uuid;
    f_sids uuid[];
    f_gens bigint[];
    f_outs jsonb[];
    f_idx integer[];
    f_runs uuid[];
    f_results jsonb[];
    g_sids uuid[];
    g_gens bigint[];
    g_outs jsonb[];
    g_idx integer[];
BEGIN
    -- The days the batch's steps are in, and so their runs (cyclone__days_span): the
    -- statements below over many steps or runs read those days alone.
    SELECT d.lo, d.hi INTO span_lo, span_hi
      FROM cyclone__days_span((SELECT (e ->> 'step_id')::uuid FROM jsonb_array_elements(p_results) e ORDER BY 1 LIMIT 1),
                              (SELECT (e ->> 'step_id')::uuid FROM jsonb_array_elements(p_results) e
                                ORDER BY 1 DESC LIMIT 1)) d;
    SELECT array_agg(DISTINCT s.run_id ORDER BY s.run_id) INTO runs
      FROM jsonb_array_elements(p_results) e
     CROSS JOIN LATERAL (SELECT s.run_id FROM cyclone_steps s WHERE s.id = (e ->> 'step_id')::uuid
                            AND s.id >= span_lo AND s.id < span_hi OFFSET 0) s;
    IF runs IS NOT NULL THEN
        -- `plain`: the locked runs a job's completion may end: standalone jobs (no workflow,
        -- so one node: only cyclone__jobs_create and cyclone_job_enqueue make them, one step
        -- each), running or paused, top-level; read from the row as locked, so their state
        -- holds until commit.
        SELECT r.state IN ('running', 'paused') AND r.parent_run_id IS NULL AND r.workflow_name IS NULL
          INTO plain_first
          FROM cyclone_runs r WHERE r.id = runs[1] FOR NO KEY UPDATE;
        SELECT runs[1:1] || COALESCE(array_agg(l.id), '{}'), COALESCE(array_agg(l.id) FILTER (WHERE l.plain), '{}')
          INTO locked, plain
          FROM (SELECT r.id, r.state IN ('running', 'paused') AND r.parent_run_id IS NULL
                       AND r.workflow_name IS NULL AS plain
                  FROM cyclone_runs r WHERE r.id = ANY (runs[2:]) AND r.id >= span_lo AND r.id < span_hi
                 ORDER BY r.id
                   FOR NO KEY UPDATE SKIP LOCKED) l;
        IF plain_first THEN
            plain := runs[1:1] || plain;
        END IF;
    END IF;

    -- (SELECT 'running'::text): see "Plans" at the top of this file. The jobs' steps running
    -- under the result's generation, in the `plain` runs (locked above: a job's run has no
    -- other step); then those steps' runs end. Each statement reaches its rows by primary key
    -- = ANY of an array, within the batch's days (no join: on the days of history, a join was
    -- planned on small tables as a scan of a whole day), and takes each row's values from the
    -- arrays by position.
    SELECT array_agg(c.sid ORDER BY c.i), array_agg(c.gen ORDER BY c.i), array_agg(c.output ORDER BY c.i),
           array_agg(c.i ORDER BY c.i)
      INTO f_sids, f_gens, f_outs, f_idx
      FROM (SELECT e.ord::integer AS i, (e.v ->> 'step_id')::uuid AS sid, (e.v ->> 'generation')::bigint AS gen,
                   COALESCE(e.v -> 'output', 'null'::jsonb) AS output,
                   count(*) OVER (PARTITION BY e.v ->> 'step_id') AS answers
              FROM jsonb_array_elements(p_results) WITH ORDINALITY AS e (v, ord)
             WHERE e.v ->> 'outcome' = 'completed' AND (e.v ->> 'output_bytes')::integer <= p_max_output_bytes) c
     WHERE c.answers = 1;
    IF f_sids IS NOT NULL AND cardinality(plain) > 0 THEN
        WITH done AS (
            UPDATE cyclone_steps s
               SET state = 'completed', output = f_outs[array_position(f_sids, s.id)], finished_at = now()
             WHERE s.id = ANY (f_sids) AND s.id >= span_lo AND s.id < span_hi
               AND s.state = (SELECT 'running'::text) AND s.lease_generation = f_gens[array_position(f_sids, s.id)]
               AND s.run_id = ANY (plain)
            RETURNING s.id, s.run_id, jsonb_build_object(s.node, s.output) AS result
        )
        SELECT array_agg(f_idx[array_position(f_sids, d.id)]), array_agg(d.id),
               array_agg(f_gens[array_position(f_sids, d.id)]), array_agg(d.run_id), array_agg(d.result)
          INTO fast, fast_steps, fast_gens, f_runs, f_results
          FROM done d;
        IF fast IS NOT NULL THEN
            UPDATE cyclone_runs r
               SET state = 'completed', finished_at = now(), updated_at = now(),
                   paused_at = NULL, deadline_left = NULL, result = f_results[array_position(f_runs, r.id)]
             WHERE r.id = ANY (f_runs) AND r.id >= span_lo AND r.id < span_hi;
        END IF;
    END IF;
    IF fast IS NOT NULL THEN
        PERFORM pg_notify('cyclone_run_ended', 'top');  -- `plain` holds top-level runs only
        -- The jobs completed here, in one go; the loop at the end answers the rest.
        RETURN QUERY
            SELECT u.i, u.sid, u.gen, 'applied'::text, NULL::uuid, false
              FROM unnest(fast, fast_steps, fast_gens) AS u (i, sid, gen)
             ORDER BY u.i;
        IF cardinality(fast) = jsonb_array_length(p_results) THEN
            -- Every result was one (a drain of jobs): the statements below would find
            -- nothing, and cost their reads all the same.
            RETURN;
        END IF;
    END IF;

    -- The completions of larger runs, for the runs whose every result here is one.
    WITH e AS MATERIALIZED (
        SELECT e.ord::integer AS i, (e.v ->> 'step_id')::uuid AS sid, (e.v ->> 'generation')::bigint AS gen,
               e.v, count(*) OVER (PARTITION BY e.v ->> 'step_id') AS answers
          FROM jsonb_array_elements(p_results) WITH ORDINALITY AS e (v, ord)
         WHERE NOT e.ord::integer = ANY (COALESCE(fast, '{}'))
    ), j AS MATERIALIZED (
        SELECT e.*, s.run_id
          FROM e CROSS JOIN LATERAL (SELECT s.run_id FROM cyclone_steps s
                                      WHERE s.id = e.sid AND s.id >= span_lo AND s.id < span_hi OFFSET 0) s
         WHERE s.run_id = ANY (locked)
    ), whole AS MATERIALIZED (
        -- Locked by this batch, so their state holds until commit.
        SELECT w.run_id
          FROM (SELECT j.run_id FROM j GROUP BY j.run_id
                HAVING bool_and(j.answers = 1 AND j.v ->> 'outcome' = 'completed'
                                AND (j.v ->> 'output_bytes')::integer <= p_max_output_bytes)) w
         CROSS JOIN LATERAL (SELECT r.state FROM cyclone_runs r
                              WHERE r.id = w.run_id AND r.id >= span_lo AND r.id < span_hi OFFSET 0) r
         WHERE r.state IN ('running', 'paused')
    )
    SELECT array_agg(j.sid), array_agg(j.gen), array_agg(COALESCE(j.v -> 'output', 'null'::jsonb)), array_agg(j.i)
      INTO g_sids, g_gens, g_outs, g_idx
      FROM j JOIN whole ON whole.run_id = j.run_id;
    IF g_sids IS NOT NULL THEN  -- (by primary key = ANY, as above)
        WITH done AS (
            UPDATE cyclone_steps s
               SET state = 'completed', output = g_outs[array_position(g_sids, s.id)], finished_at = now()
             WHERE s.id = ANY (g_sids) AND s.id >= span_lo AND s.id < span_hi
               AND s.state = (SELECT 'running'::text) AND s.lease_generation = g_gens[array_position(g_sids, s.id)]
            RETURNING s.id, s.run_id
        )
        SELECT array_agg(g_idx[array_position(g_sids, d.id)]), array_agg(d.id), array_agg(DISTINCT d.run_id)
          INTO dag, dag_steps, dag_runs
          FROM done d;
    END IF;
    IF dag IS NOT NULL THEN
        -- Promotion (cyclone__promote after each of them): the pending dependents of the
        -- completed steps whose deps are all completed now, in runs that are running (a
        -- paused run keeps them pending until Resume). The dependents first, on their own,
        -- as cyclone__promote does, so the plan starts from cyclone_step_deps_dep. The lookups
        -- by id from here on stay within the batch's days too (a run's steps and edges are in
        -- its day). One by dep_id or run_id reads every day's index: bounded by an id range,
        -- a generic plan made on small tables may read the whole range through the primary
        -- key instead (seen in CI with a lower bound alone).
        SELECT array_agg(DISTINCT a.step_id) INTO cands
          FROM unnest(dag_steps) AS u (id)
         CROSS JOIN LATERAL (SELECT a.step_id FROM cyclone_step_deps a WHERE a.dep_id = u.id OFFSET 0) a;
        IF cands IS NOT NULL THEN
            SELECT array_agg(s.id) FILTER (WHERE s.type = 'task'),
                   array_agg(s.id ORDER BY s.run_id, s.id) FILTER (WHERE s.type <> 'task'),
                   array_agg(s.run_id ORDER BY s.run_id, s.id) FILTER (WHERE s.type <> 'task')
              INTO tasks, waits, wait_runs
              FROM unnest(cands) AS c (id)
             CROSS JOIN LATERAL (SELECT s.id, s.run_id, s.type, s.state FROM cyclone_steps s
                                  WHERE s.id = c.id AND s.id >= span_lo AND s.id < span_hi OFFSET 0) s
             CROSS JOIN LATERAL (SELECT r.state FROM cyclone_runs r
                                  WHERE r.id = s.run_id AND r.id >= span_lo AND r.id < span_hi OFFSET 0) r
             WHERE s.state = 'pending' AND r.state = 'running'
               AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d
                                CROSS JOIN LATERAL (SELECT p.state FROM cyclone_steps p
                                                     WHERE p.id = d.dep_id AND p.id >= span_lo AND p.id < span_hi
                                                    OFFSET 0) p
                                WHERE d.step_id = s.id AND d.step_id >= span_lo AND d.step_id < span_hi
                                  AND p.state <> 'completed'
                               OFFSET 0);  -- (a probe per candidate: unjoined, so never hashed over every edge)
            promoted := tasks IS NOT NULL OR waits IS NOT NULL;
            IF tasks IS NOT NULL THEN
                -- Their fair clocks and strategies' keys first, in one order (cyclone__arrivals_lock).
                IF EXISTS (SELECT 1 FROM cyclone_steps s WHERE s.id = ANY (tasks) AND s.id >= span_lo AND s.id < span_hi
                              AND s.limit_keys IS NOT NULL) THEN
                    PERFORM cyclone__arrivals_lock(tasks);
                END IF;
                -- What cyclone__step_enter does to a task node.
                UPDATE cyclone_steps
                   SET state = 'available', scheduled_at = now(), wait_started_at = NULL, timer_at = NULL,
                       max_wait_at = NULL, timer_left = NULL, max_wait_left = NULL
                 WHERE id = ANY (tasks) AND state = (SELECT 'pending'::text) AND id >= span_lo AND id < span_hi;
                -- Each limited one arrives for its limits' strategies (cyclone__limits_arrive, as
                -- cyclone__step_enter calls it) in one order, those after it not counted yet.
                IF EXISTS (SELECT 1 FROM cyclone_limits WHERE strategy <> 'queue') THEN
                    arrivals := ARRAY(SELECT s.id FROM cyclone_steps s
                                       WHERE s.id = ANY (tasks) AND s.id >= span_lo AND s.id < span_hi
                                         AND s.limit_keys IS NOT NULL ORDER BY s.run_id, s.id);
                    FOR n IN 1 .. cardinality(arrivals) LOOP
                        PERFORM cyclone__limits_arrive((SELECT s.run_id FROM cyclone_steps s WHERE s.id = arrivals[n]),
                                                       ARRAY[arrivals[n]], arrivals[n + 1:], false);
                    END LOOP;
                END IF;
                PERFORM cyclone__notify_available();
            END IF;
            FOR n IN 1 .. COALESCE(cardinality(waits), 0) LOOP
                PERFORM cyclone__step_enter(wait_runs[n], waits[n]);
            END LOOP;
        END IF;
        -- cyclone__run_settle for each affected run: completed once nothing non-terminal
        -- remains (a separate statement, so that it sees the completions above).
        -- The runs are locked by this batch: their state holds until commit.
        WITH ended AS (
            UPDATE cyclone_runs r
               SET state = 'completed', finished_at = now(), updated_at = now(),
                   paused_at = NULL, deadline_left = NULL, result = cyclone__run_result(r.id)
             WHERE r.id >= span_lo AND r.id < span_hi AND r.id = ANY (ARRAY(
                       SELECT u.id FROM unnest(dag_runs) AS u (id)
                        CROSS JOIN LATERAL (SELECT r.state FROM cyclone_runs r
                                             WHERE r.id = u.id AND r.id >= span_lo AND r.id < span_hi OFFSET 0) r
                        WHERE r.state IN ('running', 'paused')
                          AND NOT EXISTS (SELECT 1 FROM cyclone_steps s WHERE s.run_id = u.id
                                             AND s.state NOT IN ('completed', 'discarded', 'cancelled')
                                          OFFSET 0)))
            RETURNING r.parent_run_id
        )
        SELECT count(*), bool_or(parent_run_id IS NOT NULL) INTO n, children FROM ended;
        IF n > 0 THEN
            PERFORM pg_notify('cyclone_run_ended', CASE WHEN children THEN '' ELSE 'top' END);
        END IF;
        -- The child runs that ended here (here or in a wait node's promotion), for the caller
        -- to settle their parent nodes.
        SELECT array_agg(u.id) INTO dag_children
          FROM unnest(dag_runs) AS u (id)
         CROSS JOIN LATERAL (SELECT r.state, r.parent_run_id FROM cyclone_runs r
                              WHERE r.id = u.id AND r.id >= span_lo AND r.id < span_hi OFFSET 0) r
         WHERE r.parent_run_id IS NOT NULL AND r.state IN ('completed', 'failed', 'cancelled');
    END IF;

    -- Every result not answered above, one by one.
    FOR x IN
        SELECT e.ord::integer AS i, (e.v ->> 'step_id')::uuid AS sid, (e.v ->> 'generation')::bigint AS gen,
               e.v AS e, s.run_id
          FROM jsonb_array_elements(p_results) WITH ORDINALITY AS e (v, ord)
          LEFT JOIN LATERAL (SELECT s.run_id FROM cyclone_steps s
                              WHERE s.id = (e.v ->> 'step_id')::uuid AND s.id >= span_lo AND s.id < span_hi
                             OFFSET 0) s ON true
         WHERE NOT e.ord::integer = ANY (COALESCE(fast, '{}'))
         ORDER BY s.run_id NULLS FIRST, e.ord
    LOOP
        idx := x.i;
        step_id := x.sid;
        lease_generation := x.gen;
        ended_child_run := NULL;
        available := false;
        IF x.i = ANY (COALESCE(dag, '{}')) THEN
            status := 'applied';
            available := promoted;
            IF x.run_id = ANY (COALESCE(dag_children, '{}')) AND x.run_id IS DISTINCT FROM reported THEN
                ended_child_run := x.run_id;  -- once per run
                reported := x.run_id;
            END IF;
        ELSIF x.run_id IS NULL THEN
            status := 'unknown';
        ELSIF NOT x.run_id = ANY (locked) THEN
            status := 'busy';
        ELSE
            available := true;  -- a retry, a snooze, or a completion that promoted: maybe
            status := CASE x.e ->> 'outcome'
                WHEN 'completed' THEN
                    cyclone__step_complete(x.run_id, x.sid, x.gen, x.e -> 'output', p_max_output_bytes,
                                           (x.e ->> 'output_bytes')::integer)
                WHEN 'failed' THEN
                    cyclone__step_fail(x.run_id, x.sid, x.gen, x.e ->> 'message',
                                       COALESCE((x.e ->> 'permanent')::boolean, false),
                                       make_interval(secs => (x.e ->> 'retry_delay_ms')::float8 / 1000),
                                       x.e ->> 'details')
                WHEN 'snoozed' THEN
                    cyclone__step_snooze(x.run_id, x.sid, x.gen,
                                         make_interval(secs => COALESCE((x.e ->> 'delay_ms')::float8, 0) / 1000))
                ELSE 'invalid' END;
            IF status IN ('applied', 'discarded', 'output_too_large') THEN
                SELECT r.id INTO ended_child_run FROM cyclone_runs r
                 WHERE r.id = x.run_id AND r.parent_run_id IS NOT NULL
                   AND r.state IN ('completed', 'failed', 'cancelled');
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- Extend the leases a worker holds, in one statement. Returns the leases that are lost: no
-- longer running under that generation (cancelled, reclaimed, ended), so the worker is told
-- to stop those handlers. Rows locked by a transition in progress are skipped this round.
CREATE OR REPLACE FUNCTION cyclone_leases_renew(p_owner text, p_step_ids uuid[], p_generations bigint[],
                                                p_lease_ttl interval)
RETURNS TABLE (step_id uuid, lease_generation bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    span_lo uuid;
    span_hi uuid;
BEGIN
    -- The days of the held steps (cyclone__ids_span): every lookup below stays within them.
    -- A function of SQL, planned at every call, opened every day's partitions and indexes.
    SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(p_step_ids) d;
    -- Each step by primary key, whatever the plan was made on (see cyclone_results_apply's
    -- "Plans"): joined, the held leases were hashed from a scan of the whole table.
    RETURN QUERY
    WITH held AS MATERIALIZED (
        SELECT h.id, h.gen FROM unnest(p_step_ids, p_generations) AS h (id, gen)
    ), renewable AS MATERIALIZED (
        SELECT s.id
          FROM held h
         CROSS JOIN LATERAL (SELECT s.id FROM cyclone_steps s
                              WHERE s.id = h.id AND s.id >= span_lo AND s.id < span_hi
                                AND s.state = (SELECT 'running'::text)
                                AND s.lease_generation = h.gen AND s.lease_owner = p_owner
                                FOR NO KEY UPDATE OF s SKIP LOCKED) s
    ), renewed AS (
        UPDATE cyclone_steps s SET lease_expiry = now() + p_lease_ttl
         WHERE s.id = ANY (ARRAY(SELECT renewable.id FROM renewable))
           AND s.id >= span_lo AND s.id < span_hi
        RETURNING s.id
    )
    SELECT h.id, h.gen FROM held h
     WHERE NOT EXISTS (SELECT 1 FROM cyclone_steps s
                        WHERE s.id = h.id AND s.id >= span_lo AND s.id < span_hi
                          AND s.state = (SELECT 'running'::text) AND s.lease_generation = h.gen
                       OFFSET 0);
END $$;

-- running -> available (same attempt, no backoff, reclaims + 1; to paused in a paused run),
-- or, when the step was already reclaimed max_reclaims times, discarded with error_kind
-- reclaim_limit (then fail-fast applies). The caller holds the run lock and the step's row.
CREATE OR REPLACE FUNCTION cyclone__lease_reclaim(p_run_state text, s cyclone_steps, p_why text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF s.reclaims >= s.max_reclaims THEN
        PERFORM cyclone__step_discard(s.run_id, s.id, 'reclaim_limit', NULL,
            format('lease of %s %s after %s reclaims', s.lease_owner, p_why, s.reclaims));
        RETURN 'discarded';
    END IF;
    UPDATE cyclone_steps
       SET state = CASE WHEN p_run_state = 'paused' THEN 'paused' ELSE 'available' END,
           reclaims = reclaims + 1, scheduled_at = now(),
           attempt_deadline = NULL
     WHERE id = s.id;
    IF p_run_state <> 'paused' THEN
        PERFORM cyclone__notify_available();
    END IF;
    RETURN 'reclaimed';
END $$;

-- Recovery sweep: every running step whose lease expired is reclaimed (cyclone__lease_reclaim).
-- Safe with several servers sweeping at once: each step is guarded by its generation, each
-- run is taken without waiting.
CREATE OR REPLACE FUNCTION cyclone_leases_sweep(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    s cyclone_steps;
    run_state text;
    live_lo uuid := cyclone__live_floor();
BEGIN
    FOR c IN
        -- least(...) < now(): the range of cyclone_steps_running (migration 0009) that holds
        -- every expired lease, whatever the attempt deadline.
        SELECT x.id, x.run_id, x.lease_generation AS gen FROM cyclone_steps x
         WHERE x.state = 'running' AND least(x.lease_expiry, x.attempt_deadline) < now()
           AND x.lease_expiry < now() AND x.id >= live_lo
         ORDER BY x.run_id, x.id LIMIT p_limit
    LOOP
        SELECT r.state INTO run_state FROM cyclone_runs r WHERE r.id = c.run_id FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO s FROM cyclone_steps x
         WHERE x.id = c.id AND x.state = 'running' AND x.lease_generation = c.gen AND x.lease_expiry < now()
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        step_id := s.id;
        outcome := cyclone__lease_reclaim(run_state, s, 'expired');
        RETURN NEXT;
    END LOOP;
END $$;

-- The leases of a worker whose stream the server ended for silence: nobody can answer them
-- any more, so they are reclaimed now instead of at their expiry. Only the leases still
-- running under that owner and generation (a result that came first wins). Runs are taken
-- in id order, the first waiting, the others without: what this skips, the sweep reclaims
-- at expiry. Returns the leases reclaimed or discarded.
CREATE OR REPLACE FUNCTION cyclone_leases_release(p_owner text, p_step_ids uuid[], p_generations bigint[])
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    s cyclone_steps;
    run_state text;
    first boolean := true;
BEGIN
    FOR c IN
        SELECT x.id, x.run_id, x.lease_generation AS gen FROM cyclone_steps x
          JOIN unnest(p_step_ids, p_generations) AS h (id, gen) ON h.id = x.id AND h.gen = x.lease_generation
         WHERE x.state = 'running' AND x.lease_owner = p_owner
         ORDER BY x.run_id, x.id
    LOOP
        IF first THEN
            SELECT r.state INTO run_state FROM cyclone_runs r WHERE r.id = c.run_id FOR NO KEY UPDATE;
        ELSE
            SELECT r.state INTO run_state FROM cyclone_runs r WHERE r.id = c.run_id
               FOR NO KEY UPDATE SKIP LOCKED;
        END IF;
        first := false;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO s FROM cyclone_steps x
         WHERE x.id = c.id AND x.state = 'running' AND x.lease_generation = c.gen AND x.lease_owner = p_owner
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        step_id := s.id;
        outcome := cyclone__lease_reclaim(run_state, s, 'was released (its worker went silent)');
        RETURN NEXT;
    END LOOP;
END $$;

-- A running step past its attempt timeout fails that attempt with error_kind 'timeout'
-- (retryable; on the last attempt the step is discarded with error_kind 'timeout'). Its
-- handler learns it at the next lease renewal.
CREATE OR REPLACE FUNCTION cyclone_attempts_timeout(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    live_lo uuid := cyclone__live_floor();
BEGIN
    FOR c IN
        -- As in cyclone_leases_sweep: the range of cyclone_steps_running, then the deadline.
        SELECT x.id, x.run_id, x.lease_generation AS gen, x.attempt_timeout FROM cyclone_steps x
         WHERE x.state = 'running' AND least(x.lease_expiry, x.attempt_deadline) < now()
           AND x.attempt_deadline < now() AND x.id >= live_lo
         ORDER BY x.run_id, x.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        PERFORM 1 FROM cyclone_steps x
          WHERE x.id = c.id AND x.state = 'running' AND x.lease_generation = c.gen
            AND x.attempt_deadline < now()
            FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        step_id := c.id;
        outcome := cyclone__step_failed(c.run_id, c.id, format('attempt timed out after %s', c.attempt_timeout),
                                        false, NULL, 'timeout');
        RETURN NEXT;
    END LOOP;
END $$;
