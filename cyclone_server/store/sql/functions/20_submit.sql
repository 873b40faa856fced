-- Workflow registration and the two ways a run begins: SubmitRun and Enqueue.

-- Store a definition (already validated and defaulted by definitions.py) under a name. The
-- same definition as the latest version is a no-op; a changed one becomes a new version.
CREATE OR REPLACE FUNCTION cyclone_workflow_register(p_name text, p_definition jsonb)
RETURNS TABLE (version integer, created boolean, created_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    latest cyclone_workflows;
    missing record;
BEGIN
    -- One registration of a name at a time, so versions are dense and no-ops are exact.
    PERFORM pg_advisory_xact_lock(hashtextextended('cyclone.workflow:' || p_name, 0));

    -- Named like definitions.py names a node: its index and its id.
    SELECT ord - 1 AS idx, n ->> 'id' AS node, n ->> 'workflow' AS workflow INTO missing
      FROM jsonb_array_elements(p_definition -> 'nodes') WITH ORDINALITY AS t (n, ord)
     WHERE n ->> 'type' = 'child'
       AND NOT EXISTS (SELECT 1 FROM cyclone_workflows w WHERE w.name = n ->> 'workflow')
     ORDER BY ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'nodes[%] (id "%"): workflow: child workflow "%" is not registered',
            missing.idx, missing.node, missing.workflow USING ERRCODE = 'CY400';
    END IF;

    SELECT * INTO latest FROM cyclone_workflows w WHERE w.name = p_name ORDER BY w.version DESC LIMIT 1;
    IF FOUND AND latest.definition = p_definition THEN
        RETURN QUERY SELECT latest.version, false, latest.created_at;
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO cyclone_workflows AS w (name, version, definition)
        VALUES (p_name, COALESCE(latest.version, 0) + 1, p_definition)
        RETURNING w.version, true, w.created_at;
END $$;

-- The (new) -> running transition of a run and (new) -> pending | available | waiting_* of
-- its steps, in one transaction. With an idempotency key, a repeat of the same request
-- (same p_request_hash) returns the existing run; a different request is refused.
-- p_trace_context (in every function here): the submitter's W3C trace context, or NULL.
DROP FUNCTION IF EXISTS cyclone__run_begin(text, integer, jsonb, jsonb, integer, text, text, timestamptz,
                                           timestamptz);
CREATE OR REPLACE FUNCTION cyclone__run_begin(
    p_workflow text, p_version integer, p_nodes jsonb, p_input jsonb, p_priority integer,
    p_idempotency_key text, p_request_hash text, p_deadline timestamptz, p_scheduled_at timestamptz,
    p_trace_context jsonb DEFAULT NULL)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    existing cyclone_runs;
    r cyclone_runs;
BEGIN
    IF p_idempotency_key IS NOT NULL THEN
        -- Serialise requests with the same key; the loser sees the winner's committed run.
        PERFORM pg_advisory_xact_lock(hashtextextended('cyclone.idempotency:' || p_idempotency_key, 0));
        SELECT * INTO existing FROM cyclone_runs WHERE idempotency_key = p_idempotency_key;
        IF FOUND THEN
            IF existing.request_hash IS DISTINCT FROM p_request_hash THEN
                RAISE EXCEPTION 'idempotency_key "%" was already used by a different request (run %)',
                    p_idempotency_key, existing.id USING ERRCODE = 'CY410';
            END IF;
            RETURN QUERY SELECT existing.id, false;
            RETURN;
        END IF;
    END IF;
    r := cyclone__run_create(p_workflow, p_version, p_nodes, p_input, p_priority, p_idempotency_key,
                             p_request_hash, p_deadline, p_scheduled_at, NULL, NULL, 0, p_trace_context);
    RETURN QUERY SELECT r.id, true;
END $$;

-- SubmitRun: a run of a registered workflow (p_version 0 or NULL: the latest version).
DROP FUNCTION IF EXISTS cyclone_run_submit(text, integer, jsonb, integer, text, text, timestamptz);
CREATE OR REPLACE FUNCTION cyclone_run_submit(
    p_workflow text, p_version integer, p_input jsonb, p_priority integer,
    p_idempotency_key text, p_request_hash text, p_deadline timestamptz, p_trace_context jsonb DEFAULT NULL)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    wf cyclone_workflows;
BEGIN
    SELECT * INTO wf FROM cyclone_workflows w
     WHERE w.name = p_workflow AND (COALESCE(p_version, 0) = 0 OR w.version = p_version)
     ORDER BY w.version DESC LIMIT 1;
    IF NOT FOUND THEN
        IF COALESCE(p_version, 0) = 0 THEN
            RAISE EXCEPTION 'workflow "%" is not registered', p_workflow USING ERRCODE = 'CY404';
        END IF;
        RAISE EXCEPTION 'workflow "%" has no version %', p_workflow, p_version USING ERRCODE = 'CY404';
    END IF;
    RETURN QUERY SELECT * FROM cyclone__run_begin(wf.name, wf.version, wf.definition -> 'nodes', p_input,
                                                  p_priority, p_idempotency_key, p_request_hash,
                                                  p_deadline, NULL, p_trace_context);
END $$;

-- Enqueue: a standalone job, that is a one-node run with no workflow. p_node is the
-- defaulted definition of its single node.
DROP FUNCTION IF EXISTS cyclone_job_enqueue(jsonb, jsonb, integer, text, text, timestamptz, timestamptz);
CREATE OR REPLACE FUNCTION cyclone_job_enqueue(
    p_node jsonb, p_input jsonb, p_priority integer, p_idempotency_key text,
    p_request_hash text, p_deadline timestamptz, p_scheduled_at timestamptz,
    p_trace_context jsonb DEFAULT NULL)
RETURNS TABLE (run_id uuid, step_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
BEGIN
    SELECT * INTO b FROM cyclone__run_begin(NULL, NULL, jsonb_build_array(p_node), p_input, p_priority,
                                            p_idempotency_key, p_request_hash, p_deadline,
                                            p_scheduled_at, p_trace_context);
    RETURN QUERY SELECT b.run_id, s.id, b.created FROM cyclone_steps s WHERE s.run_id = b.run_id;
END $$;

-- Standalone jobs without idempotency keys, set-based: every run in one INSERT, every step
-- in another, the same rows cyclone__run_create writes for a one-node run whose node is a
-- task (a run 'running'; its step 'available' from scheduled_at, or now). Ids are made in
-- array order, as the loop below makes them (a step's from its run's: cyclone__step_uuid).
-- Called by cyclone_jobs_enqueue only when every job qualifies. PL/pgSQL, one statement: its plan is kept from call to call
-- (as a SQL function it was planned at every call, about a tenth of a 100-job call's time).
CREATE OR REPLACE FUNCTION cyclone__jobs_create(p_jobs jsonb)
RETURNS TABLE (idx integer, run_id uuid, step_id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lim AS MATERIALIZED (
        -- The limits of steps, one row per kind they attach to. A job whose node names limits
        -- of its own gets its tokens from cyclone__step_tokens; any other (what Enqueue makes)
        -- has the tokens of its kind's limits, by name, worked out here as cyclone__step_tokens
        -- would (a key cyclone__limit_key would refuse is left to it, to raise its error).
        SELECT DISTINCT k.kind, l.name, l.key_path, l.key_const
          FROM cyclone_limits l CROSS JOIN unnest(l.kinds) AS k (kind) WHERE l.scope = 'steps'
    ), lk AS MATERIALIZED (
        SELECT COALESCE(array_agg(DISTINCT l.kind), '{}') AS kinds FROM lim l
    ), j AS MATERIALIZED (
        SELECT x.*, cyclone__step_uuid(x.rid) AS sid,
               CASE WHEN jsonb_typeof(x.n -> 'limits') = 'array'
                    THEN cyclone__step_tokens(x.n, x.input, NULL)
                    WHEN x.n ->> 'kind' = ANY (lk.kinds)
                    THEN (SELECT array_agg(cyclone__limit_token(l.name, CASE
                                   WHEN l.key_path IS NULL THEN COALESCE(l.key_const, '')
                                   WHEN jsonb_typeof(x.input #> l.key_path) IN ('string', 'number', 'boolean')
                                        AND length(x.input #>> l.key_path) <= 256 THEN x.input #>> l.key_path
                                   ELSE cyclone__limit_key(x.input, l.key_path, l.key_const,
                                                           format('limit "%s" (kind "%s")', l.name, x.n ->> 'kind'))
                                   END) ORDER BY l.name)
                            FROM lim l WHERE l.kind = x.n ->> 'kind')
               END AS toks
          FROM (SELECT (t.ord - 1)::integer AS i, t.e -> 'node' AS n, t.e, COALESCE(t.e -> 'input', 'null'::jsonb) AS input,
                       cyclone_uuid7() AS rid
                  FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS t (e, ord)
                 ORDER BY t.ord) x
         CROSS JOIN lk
         ORDER BY x.i),
    -- The jobs due now with limits are placed in the fair order here, a key at a time, as the
    -- insert trigger would place them one by one (cyclone__fair_at): n steps of a key in a kind
    -- take the places greatest(its clock there, the kind's virtual time) + 0, 1, ..., n - 1 /
    -- weight, and the clock moves on by n / weight; the clocks are locked in one order (by kind,
    -- then token), as cyclone__fair_keys_lock takes them.
    due AS MATERIALIZED (
        SELECT j.i, j.toks[1] AS tok, j.n ->> 'kind' AS kind,
               row_number() OVER (PARTITION BY j.n ->> 'kind', j.toks[1] ORDER BY j.i) AS k
          FROM j
         WHERE j.toks IS NOT NULL AND COALESCE((j.e ->> 'scheduled_at')::timestamptz, now()) <= now()
    ), keys AS MATERIALIZED (
        SELECT g.kind, g.tok, g.n, cyclone__key_weight(g.tok) AS w,
               COALESCE((SELECT c.vt FROM cyclone_fair_clocks c WHERE c.kind = g.kind), 0.0) AS vt
          FROM (SELECT d.kind, d.tok, count(*)::float8 AS n FROM due d GROUP BY d.kind, d.tok) g
    ), clocks AS (
        INSERT INTO cyclone_fair_keys AS f (kind, token, vclock)
        SELECT k.kind, k.tok, k.vt + k.n / k.w FROM keys k ORDER BY k.kind, k.tok
            ON CONFLICT (kind, token) DO UPDATE
           SET vclock = greatest(f.vclock + (SELECT k.n / k.w FROM keys k WHERE k.kind = f.kind AND k.tok = f.token),
                                 EXCLUDED.vclock)
        RETURNING f.kind, f.token, f.vclock
    ), placed AS (
        SELECT d.i, c.vclock - k.n / k.w + (d.k - 1) / k.w AS fair_at
          FROM due d JOIN keys k ON k.kind = d.kind AND k.tok = d.tok
          JOIN clocks c ON c.kind = d.kind AND c.token = d.tok
    ),
    runs AS (
        INSERT INTO cyclone_runs (id, workflow_name, workflow_version, state, input, priority,
                                  idempotency_key, request_hash, deadline_at, parent_run_id,
                                  parent_step_id, depth, trace_context, retention)
        SELECT j.rid, NULL, NULL, 'running', j.input,
               COALESCE((j.e ->> 'priority')::integer, 0), NULL, j.e ->> 'request_hash',
               (j.e ->> 'deadline')::timestamptz, NULL, NULL, 0, NULLIF(j.e -> 'trace_context', 'null'),
               make_interval(secs => (j.n ->> 'retention')::float8)
          FROM j ORDER BY j.i),
    steps AS (
        INSERT INTO cyclone_steps (
            id, run_id, node, position, kind, type, state, priority, scheduled_at, max_attempts, max_reclaims,
            attempt_timeout, backoff_initial, backoff_max, on_dep_failure, retention, sleep_for,
            signal_name, child_workflow, max_wait, limit_keys, fair_at)
        SELECT j.sid, j.rid, j.n ->> 'id', 0, j.n ->> 'kind', 'task', 'available',
               COALESCE((j.n ->> 'priority')::integer, (j.e ->> 'priority')::integer, 0),
               COALESCE((j.e ->> 'scheduled_at')::timestamptz, now()),
               (j.n ->> 'max_attempts')::integer,
               (j.n ->> 'max_reclaims')::integer,
               make_interval(secs => (j.n ->> 'attempt_timeout')::float8),
               make_interval(secs => (j.n ->> 'backoff_initial')::float8),
               make_interval(secs => (j.n ->> 'backoff_max')::float8),
               j.n ->> 'on_dep_failure',
               make_interval(secs => (j.n ->> 'retention')::float8),
               make_interval(secs => (j.n ->> 'sleep')::float8),
               j.n ->> 'signal',
               j.n ->> 'workflow',
               make_interval(secs => (j.n ->> 'max_wait')::float8),
               j.toks, p.fair_at
          FROM j LEFT JOIN placed p ON p.i = j.i
         ORDER BY j.i)
    SELECT j.i, j.rid, j.sid FROM j ORDER BY j.i;
    PERFORM cyclone__history_made();  -- (their day may have been settled since their ids were made)
END $$;

-- EnqueueMany: standalone jobs in one transaction, in array order, all or none. Each
-- element of p_jobs is {node, input, priority, idempotency_key, request_hash, deadline,
-- scheduled_at, trace_context} as cyclone_job_enqueue takes them. An error names the job by its index
-- ("jobs[3]: ...") and keeps its SQLSTATE, detail and hint.
--
-- Jobs without idempotency keys whose node is a task with no dependencies (what Enqueue
-- makes) are written set-based by cyclone__jobs_create; any other batch, or one that
-- fails there, goes job by job, which names the job that failed.
CREATE OR REPLACE FUNCTION cyclone_jobs_enqueue(p_jobs jsonb)
RETURNS TABLE (idx integer, run_id uuid, step_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    j record;
    cur integer;
    msg text;
    code text;
    detail text;
    hint text;
    idxs integer[];
    run_ids uuid[];
    step_ids uuid[];
BEGIN
    PERFORM cyclone__limits_read_lock();  -- before the limits are read (15_limits.sql)
    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_jobs) AS e
                    WHERE e ->> 'idempotency_key' IS NOT NULL
                       OR e -> 'node' ->> 'type' IS DISTINCT FROM 'task'
                       OR e -> 'node' -> 'deps' IS DISTINCT FROM '[]'::jsonb) THEN
        BEGIN
            SELECT array_agg(c.idx ORDER BY c.idx), array_agg(c.run_id ORDER BY c.idx),
                   array_agg(c.step_id ORDER BY c.idx)
              INTO idxs, run_ids, step_ids
              FROM cyclone__jobs_create(p_jobs) AS c;
        EXCEPTION WHEN OTHERS THEN
            idxs := NULL;  -- rolled back: the loop below finds the job and names it
        END;
        IF idxs IS NOT NULL THEN
            -- The limits' strategies, job by job in array order (they may cancel these jobs),
            -- their keys locked all first, in one order: job by job, two calls with keys in
            -- other orders would deadlock.
            IF EXISTS (SELECT 1 FROM cyclone_limits WHERE strategy <> 'queue') THEN
                IF cardinality(step_ids) > 1 THEN
                    PERFORM cyclone__arrivals_lock(step_ids);
                END IF;
                PERFORM cyclone__limits_arrive(u.r, ARRAY[u.s], step_ids[u.n + 1:])
                   FROM unnest(idxs, run_ids, step_ids) WITH ORDINALITY AS u (i, r, s, n) ORDER BY u.n;
            END IF;
            PERFORM cyclone__notify_available();
            RETURN QUERY SELECT u.i, u.r, u.s, true FROM unnest(idxs, run_ids, step_ids) AS u (i, r, s);
            RETURN;
        END IF;
    END IF;

    -- The idempotency keys' locks (cyclone__run_begin takes them again, which is free),
    -- all first and in one order: taken job by job, two calls with the same keys in
    -- different orders would deadlock.
    PERFORM pg_advisory_xact_lock(k.h)
       FROM (SELECT DISTINCT hashtextextended('cyclone.idempotency:' || (e ->> 'idempotency_key'), 0) AS h
               FROM jsonb_array_elements(p_jobs) AS e
              WHERE e ->> 'idempotency_key' IS NOT NULL) AS k
      ORDER BY k.h;
    BEGIN
        FOR j IN SELECT (t.ord - 1)::integer AS i, t.e
                   FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS t (e, ord)
                  ORDER BY t.ord LOOP
            cur := j.i;
            RETURN QUERY SELECT j.i, e.run_id, e.step_id, e.created
                           FROM cyclone_job_enqueue(j.e -> 'node', j.e -> 'input',
                                                    COALESCE((j.e ->> 'priority')::integer, 0),
                                                    j.e ->> 'idempotency_key', j.e ->> 'request_hash',
                                                    (j.e ->> 'deadline')::timestamptz,
                                                    (j.e ->> 'scheduled_at')::timestamptz,
                                                    NULLIF(j.e -> 'trace_context', 'null')) AS e;
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, code = RETURNED_SQLSTATE,
                                detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
        IF cur IS NULL THEN  -- before the first job: nothing to name
            RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = code, DETAIL = detail, HINT = hint;
        END IF;
        RAISE EXCEPTION USING MESSAGE = format('jobs[%s]: %s', cur, msg), ERRCODE = code,
                              DETAIL = detail, HINT = hint;
    END;
END $$;
