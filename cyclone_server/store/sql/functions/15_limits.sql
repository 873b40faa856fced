-- Flow control (docs/flow-control.md): which limits a step consumes and under which key,
-- where it stands in its kind's fair order, what a limit's strategy does when a step
-- arrives, and which limited steps a claim may take. The claim itself is
-- cyclone__steps_claim (30_steps.sql); the tables are migration 0010's.
--
-- A token is "<limit name>\x1f<key>" (limit names never hold \x1f). Errors on bad input
-- are CY400 (INVALID_ARGUMENT) naming the limit and the field.

CREATE OR REPLACE FUNCTION cyclone__limit_token(p_limit text, p_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT p_limit || chr(31) || p_key $$;

CREATE OR REPLACE FUNCTION cyclone__token_limit(p_token text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT split_part(p_token, chr(31), 1) $$;

CREATE OR REPLACE FUNCTION cyclone__token_key(p_token text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT substr(p_token, strpos(p_token, chr(31)) + 1) $$;

-- The window a rate counts starts in: its period and 0.5% more (at most 50 ms). Starts are
-- counted on the database's clock: from the claim, and from the push of the lease to its
-- worker once the server has written it (cyclone_limit_starts_pushed). The worker sees
-- each a moment later still, and that moment varies by a few milliseconds: the margin
-- keeps the starts within the quota in any window of the workers' clocks too.
CREATE OR REPLACE FUNCTION cyclone__rate_window(p_period interval) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT p_period + least(p_period / 200, interval '50 milliseconds') $$;

-- Submits and SetLimit take turns: a submit works out its steps' tokens from the limits it
-- sees, and SetLimit's backfill cannot see the steps of a submit not yet committed. So every
-- submit and enqueue holds this lock shared from before it reads the limits until it
-- commits, and SetLimit holds it alone (cyclone__limits_settle_lock); submits never wait
-- for each other.
CREATE OR REPLACE FUNCTION cyclone__limits_read_lock() RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock_shared(hashtextextended('cyclone.limits', 0)) $$;

CREATE OR REPLACE FUNCTION cyclone__limits_settle_lock() RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(hashtextextended('cyclone.limits', 0)) $$;

-- The key a run input gives: the scalar at p_path (a string as itself, a number or a
-- boolean as its JSON text), or p_const when p_path is NULL. p_where names the declaration
-- in errors.
CREATE OR REPLACE FUNCTION cyclone__limit_key(p_input jsonb, p_path text[], p_const text, p_where text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb;
    k text;
BEGIN
    IF p_path IS NULL THEN
        RETURN COALESCE(p_const, '');
    END IF;
    v := p_input #> p_path;
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RAISE EXCEPTION '%: key_path "input.%": the run input has no value there', p_where,
            array_to_string(p_path, '.') USING ERRCODE = 'CY400';
    ELSIF jsonb_typeof(v) NOT IN ('string', 'number', 'boolean') THEN
        RAISE EXCEPTION '%: key_path "input.%": the value there is a JSON %, not a string, number or boolean',
            p_where, array_to_string(p_path, '.'), jsonb_typeof(v) USING ERRCODE = 'CY400';
    END IF;
    k := p_input #>> p_path;
    IF length(k) > 256 THEN
        RAISE EXCEPTION '%: key_path "input.%": the key is % characters, more than 256', p_where,
            array_to_string(p_path, '.'), length(k) USING ERRCODE = 'CY400';
    END IF;
    RETURN k;
END $$;

-- The tokens of the limits of scope 'runs' that name the workflow, for a run of it.
CREATE OR REPLACE FUNCTION cyclone__run_tokens(p_workflow text, p_input jsonb) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    toks text[];
BEGIN
    IF p_workflow IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(cyclone__limit_token(l.name, cyclone__limit_key(p_input, l.key_path, l.key_const,
                                                                        format('limit "%s"', l.name)))
                     ORDER BY l.name)
      INTO toks
      FROM cyclone_limits l
     WHERE l.workflows @> ARRAY[p_workflow] AND l.scope = 'runs';
    RETURN toks;
END $$;

-- The tokens of a task step: its node's own limits (in the order declared), then those
-- that name its kind (by name), then its run's (p_run_tokens). NULL when none. A node's
-- `limits` is [{"limit": name, "key": constant} or {"limit": name, "key_path": [...]}].
CREATE OR REPLACE FUNCTION cyclone__step_tokens(p_node jsonb, p_input jsonb, p_run_tokens text[])
RETURNS text[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    toks text[] := '{}';
    u record;
    l cyclone_limits;
    t text;
BEGIN
    IF p_node ->> 'type' IS DISTINCT FROM 'task' THEN
        RETURN NULL;
    END IF;
    FOR u IN SELECT e, (ord - 1)::integer AS i
               FROM jsonb_array_elements(COALESCE(p_node -> 'limits', '[]'::jsonb)) WITH ORDINALITY AS x (e, ord) LOOP
        SELECT * INTO l FROM cyclone_limits WHERE name = u.e ->> 'limit';
        IF NOT FOUND THEN
            RAISE EXCEPTION 'node "%": limits[%]: unknown limit "%" (create it with Limits.SetLimit first)',
                p_node ->> 'id', u.i, u.e ->> 'limit' USING ERRCODE = 'CY400';
        ELSIF l.scope <> 'steps' THEN
            RAISE EXCEPTION 'node "%": limits[%]: limit "%" caps whole runs: attach it to the workflow, not to a node',
                p_node ->> 'id', u.i, l.name USING ERRCODE = 'CY400';
        END IF;
        t := cyclone__limit_token(l.name, cyclone__limit_key(
                 p_input,
                 CASE WHEN u.e ? 'key_path' THEN ARRAY(SELECT jsonb_array_elements_text(u.e -> 'key_path')) END,
                 u.e ->> 'key', format('node "%s": limits[%s] (limit "%s")', p_node ->> 'id', u.i, l.name)));
        IF NOT t = ANY (toks) THEN
            toks := toks || t;
        END IF;
    END LOOP;
    FOR l IN SELECT * FROM cyclone_limits WHERE kinds @> ARRAY[p_node ->> 'kind'] AND scope = 'steps'
              ORDER BY name LOOP
        t := cyclone__limit_token(l.name, cyclone__limit_key(p_input, l.key_path, l.key_const,
                                                             format('limit "%s" (kind "%s")', l.name, p_node ->> 'kind')));
        IF NOT t = ANY (toks) THEN
            toks := toks || t;
        END IF;
    END LOOP;
    toks := toks || COALESCE(p_run_tokens, '{}');
    RETURN NULLIF(toks, '{}');
END $$;

-- Fair order. Each key of a limit has a virtual clock in each kind; a step of the key that
-- becomes due is placed at max(the key's clock, the kind's virtual time) and moves the key's
-- clock on by 1/weight; the kind's virtual time is the place of its last claimed step. So
-- keys that both have work alternate (a weight-3 key three steps for one), a key that has
-- been idle starts at the present and banks no credit, and FIFO holds within a key. The
-- first token of the step decides its key; a key busy in one kind is not pushed back in
-- another (each kind has its own clocks, as its own virtual time).
-- A key's weight in the fair order: its limit's weight for it, else 1.
CREATE OR REPLACE FUNCTION cyclone__key_weight(p_token text) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT (l.weights ->> cyclone__token_key(p_token))::float8
                       FROM cyclone_limits l WHERE l.name = cyclone__token_limit(p_token)), 1.0)
$$;

CREATE OR REPLACE FUNCTION cyclone__fair_at(p_token text, p_kind text) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    w double precision := cyclone__key_weight(p_token);
    vt double precision;
    v double precision;
BEGIN
    SELECT c.vt INTO vt FROM cyclone_fair_clocks c WHERE c.kind = p_kind;
    vt := COALESCE(vt, 0.0);
    INSERT INTO cyclone_fair_keys AS f (kind, token, vclock) VALUES (p_kind, p_token, vt + 1.0 / w)
        ON CONFLICT (kind, token) DO UPDATE SET vclock = greatest(f.vclock, vt) + 1.0 / w
    RETURNING f.vclock - 1.0 / w INTO v;
    RETURN v;
END $$;

-- Lock the clocks of these keys in these kinds (p_kinds[i], p_tokens[i]; creating those not
-- yet there) in (kind, token) order: a transaction that places steps of several keys takes
-- them in the order every other one does.
DROP FUNCTION IF EXISTS cyclone__fair_keys_lock(text[]);
CREATE OR REPLACE FUNCTION cyclone__fair_keys_lock(p_kinds text[], p_tokens text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- One pass in that order, each clock made or locked in its turn (an insert of the missing
    -- ones first, then a lock of the others, took a new clock before an older one sorted
    -- before it: against an EnqueueMany, which takes its clocks in one sorted pass, a deadlock).
    INSERT INTO cyclone_fair_keys AS f (kind, token, vclock)
    SELECT DISTINCT u.k, u.t, 0.0 FROM unnest(p_kinds, p_tokens) AS u (k, t) WHERE u.t IS NOT NULL ORDER BY 1, 2
    ON CONFLICT (kind, token) DO UPDATE SET vclock = f.vclock;
END $$;

-- Before limited task steps (p_step_ids) enter available together (a promotion of several,
-- one after the other, or a new run's root steps): lock what placing them and their
-- arrivals will lock, in the order every other transaction takes them: their fair clocks
-- (kind, first token), then, for a new run (p_run_tokens, its tokens), the keys of its
-- limits of runs that have a strategy, then the keys of the steps' limits that have one,
-- each set sorted (cyclone__limits_arrive takes a run's keys before its steps'). Entered one
-- by one, each step would take its clock, then its key, then the next step's clock: a clock
-- after a key, against an EnqueueMany that holds the clock and waits for the key.
-- (Two functions, not one with a default: a server of an earlier release that applies its
-- own one-argument version again, at a restart during an upgrade, replaces it and leaves no
-- two candidates for a one-argument call.)
CREATE OR REPLACE FUNCTION cyclone__arrivals_lock(p_step_ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cyclone__arrivals_lock(p_step_ids, NULL::text[]);
END $$;
DROP FUNCTION IF EXISTS cyclone__arrivals_lock(uuid[], text[]);  -- (a version with a default)
CREATE FUNCTION cyclone__arrivals_lock(p_step_ids uuid[], p_run_tokens text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    span_lo uuid;
    span_hi uuid;
BEGIN
    -- The steps' days (cyclone__ids_span): by id = ANY alone, which prunes no partition in a
    -- generic plan (a results batch's, a submit's), each statement would read every day's index.
    SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(p_step_ids) d;
    PERFORM cyclone__fair_keys_lock(
        ARRAY(SELECT s.kind FROM cyclone_steps s
               WHERE s.id = ANY (p_step_ids) AND s.id >= span_lo AND s.id < span_hi
                 AND s.type = 'task' AND s.limit_keys IS NOT NULL ORDER BY s.id),
        ARRAY(SELECT s.limit_keys[1] FROM cyclone_steps s
               WHERE s.id = ANY (p_step_ids) AND s.id >= span_lo AND s.id < span_hi
                 AND s.type = 'task' AND s.limit_keys IS NOT NULL ORDER BY s.id));
    IF EXISTS (SELECT 1 FROM cyclone_limits WHERE strategy <> 'queue') THEN
        -- The run's tokens of limits of runs, then the steps' tokens of limits of steps.
        FOR t IN SELECT x.t
                   FROM (SELECT 'runs' AS scope, u.t FROM unnest(p_run_tokens) AS u (t)
                         UNION
                         SELECT 'steps', u.t FROM cyclone_steps s CROSS JOIN unnest(s.limit_keys) AS u (t)
                          WHERE s.id = ANY (p_step_ids) AND s.id >= span_lo AND s.id < span_hi
                            AND s.type = 'task' AND s.limit_keys IS NOT NULL) x
                   JOIN cyclone_limits l ON l.name = cyclone__token_limit(x.t) AND l.scope = x.scope
                  WHERE l.strategy <> 'queue'
                  ORDER BY x.scope, x.t LOOP
            PERFORM cyclone__limit_key_lock(cyclone__token_limit(t), cyclone__token_key(t));
        END LOOP;
    END IF;
END $$;

-- A limited step entering available (or getting its tokens while available): its place in
-- the fair order if it is due now, else NULL until a claim finds it due (cyclone__limits_place_due).
CREATE OR REPLACE FUNCTION cyclone__fair_place() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scheduled_at > now() THEN
        NEW.fair_at := NULL;
    ELSE
        NEW.fair_at := cyclone__fair_at(NEW.limit_keys[1], NEW.kind);
    END IF;
    RETURN NEW;
END $$;

-- A limited step left running (a result, an expiry, a release, a timeout, a cancel): a slot
-- of its keys is free. Every server's dispatcher hears it, not only this one's.
CREATE OR REPLACE FUNCTION cyclone__slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cyclone_available', '');
    RETURN NULL;
END $$;

-- (An insert that placed its steps already, cyclone__jobs_create's, set fair_at itself.)
CREATE OR REPLACE TRIGGER cyclone_steps_fair_insert BEFORE INSERT ON cyclone_steps
    FOR EACH ROW WHEN (NEW.state = 'available' AND NEW.limit_keys IS NOT NULL AND NEW.fair_at IS NULL)
    EXECUTE FUNCTION cyclone__fair_place();
CREATE OR REPLACE TRIGGER cyclone_steps_fair_update BEFORE UPDATE OF state, limit_keys ON cyclone_steps
    FOR EACH ROW WHEN (NEW.state = 'available' AND NEW.limit_keys IS NOT NULL
                       AND (OLD.state <> 'available' OR OLD.limit_keys IS DISTINCT FROM NEW.limit_keys))
    EXECUTE FUNCTION cyclone__fair_place();
CREATE OR REPLACE TRIGGER cyclone_steps_slot_freed AFTER UPDATE OF state ON cyclone_steps
    FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running' AND NEW.limit_keys IS NOT NULL)
    EXECUTE FUNCTION cyclone__slot_freed();

-- Cancel a run because of a limit's strategy: like CancelRun (its running steps' handlers
-- are told the same way), with cancel_cause 'limit' and p_reason on every step it cancels.
CREATE OR REPLACE FUNCTION cyclone__run_cancel_limit(p_run_id uuid, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs;
BEGIN
    -- Without waiting: the caller holds a key's lock, and a transaction holding this run's
    -- lock (a result) may be waiting for that key (cyclone__step_enter). A run held so is
    -- left as it is: its step is being answered.
    SELECT * INTO r FROM cyclone_runs WHERE id = p_run_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND OR r.state NOT IN ('running', 'paused') THEN
        RETURN false;
    END IF;
    PERFORM cyclone__steps_cancel(r.id, NULL, 'limit', NULL);
    UPDATE cyclone_steps SET reason = p_reason
     WHERE run_id = r.id AND state = 'cancelled' AND cancel_cause = 'limit' AND reason IS NULL;
    PERFORM cyclone__run_end(r.id, 'cancelled');
    RETURN true;
END $$;

-- Lock a key of a limit for the rest of the transaction, creating its row when it has none.
CREATE OR REPLACE FUNCTION cyclone__limit_key_lock(p_limit text, p_key text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOOP  -- the tidy (cyclone_limits_tidy) may remove an idle key's row between the two
        INSERT INTO cyclone_limit_keys (limit_name, key) VALUES (p_limit, p_key) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM cyclone_limit_keys WHERE limit_name = p_limit AND key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
END $$;

-- Strategies, when steps arrive (become available for the first time: at submit or
-- enqueue, or when their dependencies complete) and when runs are created. For each token
-- whose limit's strategy is not 'queue', with the key locked (so claims and other arrivals
-- of the key wait):
--   cancel_newest: the key already has max_running running or waiting: this run is cancelled.
--   cancel_oldest: the key has more than max_running running or waiting with this one: the
--                  oldest of them (by creation) are cancelled, running ones included.
--   keep_newest:   every other waiting (not yet running) step or run of the key is cancelled.
-- A cancelled run's steps say which limit and key in `reason`. Steps arrive in the order of
-- p_step_ids; p_later are steps written in the same transaction that arrive after them (the
-- rest of an EnqueueMany): none of those counts yet. The run itself arrives (its limits of
-- runs act) only when it is new (p_new_run): not when a dependency or a retry makes one of
-- its steps available.
DROP FUNCTION IF EXISTS cyclone__limits_arrive(uuid, uuid[]);
DROP FUNCTION IF EXISTS cyclone__limits_arrive(uuid, uuid[], uuid[]);
CREATE OR REPLACE FUNCTION cyclone__limits_arrive(p_run_id uuid, p_step_ids uuid[], p_later uuid[] DEFAULT '{}',
                                                  p_new_run boolean DEFAULT true)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s record;
    later uuid[];
    l cyclone_limits;
    t text;
    k text;
    n bigint;
    victim uuid;
    rt text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM cyclone_limits WHERE strategy <> 'queue') THEN
        RETURN;
    END IF;
    -- Runs first: a limit of whole runs.
    IF p_new_run THEN
        SELECT ARRAY(SELECT x FROM unnest(r.limit_keys) AS x ORDER BY x) INTO rt FROM cyclone_runs r WHERE r.id = p_run_id;
    END IF;
    FOREACH t IN ARRAY COALESCE(rt, '{}') LOOP
        SELECT * INTO l FROM cyclone_limits WHERE name = cyclone__token_limit(t);
        CONTINUE WHEN NOT FOUND OR l.strategy = 'queue';
        k := cyclone__token_key(t);
        PERFORM cyclone__limit_key_lock(l.name, k);
        IF l.strategy = 'keep_newest' THEN
            FOR victim IN SELECT r.id FROM cyclone_runs r
                           WHERE r.state IN ('running', 'paused') AND r.limit_keys IS NOT NULL
                             AND r.limit_keys @> ARRAY[t] AND NOT r.limit_admitted AND r.id <> p_run_id
                           ORDER BY r.id LOOP
                PERFORM cyclone__run_cancel_limit(victim,
                    format('limit "%s" key "%s": keep_newest: a newer run of the key arrived', l.name, k));
            END LOOP;
            CONTINUE;
        END IF;
        SELECT count(*) INTO n FROM cyclone_runs r
         WHERE r.state IN ('running', 'paused') AND r.limit_keys IS NOT NULL AND r.limit_keys @> ARRAY[t];
        IF l.strategy = 'cancel_newest' AND n > l.max_running THEN
            PERFORM cyclone__run_cancel_limit(p_run_id,
                format('limit "%s" key "%s": cancel_newest: %s runs of the key already active (max_running %s)',
                       l.name, k, n - 1, l.max_running));
            RETURN;
        ELSIF l.strategy = 'cancel_oldest' AND n > l.max_running THEN
            FOR victim IN SELECT r.id FROM cyclone_runs r
                           WHERE r.state IN ('running', 'paused') AND r.limit_keys IS NOT NULL
                             AND r.limit_keys @> ARRAY[t] AND r.id <> p_run_id
                           ORDER BY r.created_at, r.id LIMIT n - l.max_running LOOP
                PERFORM cyclone__run_cancel_limit(victim,
                    format('limit "%s" key "%s": cancel_oldest: a newer run of the key arrived (max_running %s)',
                           l.name, k, l.max_running));
            END LOOP;
        END IF;
    END LOOP;

    FOR s IN SELECT x.id, x.run_id, x.limit_keys, a.ord FROM unnest(p_step_ids) WITH ORDINALITY AS a (id, ord)
               JOIN cyclone_steps x ON x.id = a.id
              WHERE x.state = 'available' AND x.limit_keys IS NOT NULL
              ORDER BY a.ord LOOP
        later := p_later || p_step_ids[s.ord + 1:];
        FOREACH t IN ARRAY ARRAY(SELECT x FROM unnest(s.limit_keys) AS x ORDER BY x) LOOP  -- keys in one order
            SELECT * INTO l FROM cyclone_limits WHERE name = cyclone__token_limit(t);
            CONTINUE WHEN NOT FOUND OR l.strategy = 'queue' OR l.scope <> 'steps';
            k := cyclone__token_key(t);
            PERFORM cyclone__limit_key_lock(l.name, k);
            EXIT WHEN NOT EXISTS (SELECT 1 FROM cyclone_steps WHERE id = s.id AND state = 'available');
            IF l.strategy = 'keep_newest' THEN
                FOR victim IN SELECT DISTINCT x.run_id FROM cyclone_steps x
                               WHERE x.state = 'available' AND x.limit_keys IS NOT NULL
                                 AND x.limit_keys @> ARRAY[t] AND x.id <> s.id AND x.run_id <> s.run_id
                                 AND NOT x.id = ANY (later) LOOP
                    PERFORM cyclone__run_cancel_limit(victim,
                        format('limit "%s" key "%s": keep_newest: a newer step of the key arrived', l.name, k));
                END LOOP;
                CONTINUE;
            END IF;
            SELECT (SELECT count(*) FROM cyclone_steps x
                     WHERE x.state = 'running' AND x.limit_keys IS NOT NULL AND x.limit_keys @> ARRAY[t])
                 + (SELECT count(*) FROM cyclone_steps x
                     WHERE x.state = 'available' AND x.limit_keys IS NOT NULL AND x.limit_keys @> ARRAY[t]
                       AND NOT x.id = ANY (later))
              INTO n;
            IF l.strategy = 'cancel_newest' AND n > l.max_running THEN
                PERFORM cyclone__run_cancel_limit(s.run_id,
                    format('limit "%s" key "%s": cancel_newest: %s steps of the key already running or waiting (max_running %s)',
                           l.name, k, n - 1, l.max_running));
                EXIT;
            ELSIF l.strategy = 'cancel_oldest' AND n > l.max_running THEN
                FOR victim IN SELECT o.run_id FROM (
                                  SELECT x.run_id, x.created_at, x.id FROM cyclone_steps x
                                   WHERE x.state IN ('running', 'available') AND x.limit_keys IS NOT NULL
                                     AND x.limit_keys @> ARRAY[t] AND x.id <> s.id AND x.run_id <> s.run_id
                                     AND NOT x.id = ANY (later)
                                   ORDER BY x.created_at, x.id LIMIT n - l.max_running) o LOOP
                    PERFORM cyclone__run_cancel_limit(victim,
                        format('limit "%s" key "%s": cancel_oldest: a newer step of the key arrived (max_running %s)',
                               l.name, k, l.max_running));
                END LOOP;
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- The slots taken under these tokens: running steps for tokens of limits of steps
-- (p_steps), admitted active runs for tokens of limits of runs (p_runs); a run's steps carry
-- its tokens too, so each scope counts its own rows only. One pass each through the GIN
-- indexes of tokens, grouped by token; tokens with none are left out.
CREATE OR REPLACE FUNCTION cyclone__limits_used(p_steps text[], p_runs text[])
RETURNS TABLE (t text, n integer)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT x.t, count(*)::integer
      FROM cyclone_steps s CROSS JOIN LATERAL unnest(s.limit_keys) AS x (t)
     WHERE cardinality(p_steps) > 0
       AND s.state = 'running' AND s.limit_keys IS NOT NULL AND s.limit_keys && p_steps
       AND x.t = ANY (p_steps)
     GROUP BY x.t
    UNION ALL
    SELECT x.t, count(*)::integer
      FROM cyclone_runs r CROSS JOIN LATERAL unnest(r.limit_keys) AS x (t)
     WHERE cardinality(p_runs) > 0
       AND r.limit_admitted AND r.state IN ('running', 'paused') AND r.limit_keys && p_runs
       AND x.t = ANY (p_runs)
     GROUP BY x.t;
END $$;

-- The head step of each key (first token) of these kinds, past the keys in p_skip, in the
-- fair order (kinds merged by distance from their own virtual time), at most p_limit: what a
-- claim looks at when the first steps of the fair order are all held, so that a free key's
-- step is never hidden behind a window of held ones (a key with a backlog at a higher
-- priority, or a heavy weight). A loose scan of cyclone_steps_claim_heads: one probe per key
-- of the kind with due steps.
CREATE OR REPLACE FUNCTION cyclone__limits_heads(p_kinds text[], p_skip text[], p_limit integer)
RETURNS TABLE (id uuid, run_id uuid, limit_keys text[], priority integer, fair_at double precision,
               scheduled_at timestamptz)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    RETURN QUERY WITH RECURSIVE walk (kind, tok) AS (
        SELECT k.kind, (SELECT s.limit_keys[1] FROM cyclone_steps s
                         WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
                           AND s.kind = k.kind AND s.id >= live_lo
                         ORDER BY s.limit_keys[1] LIMIT 1)
          FROM unnest(p_kinds) AS k (kind)
        UNION ALL
        SELECT w.kind, (SELECT s.limit_keys[1] FROM cyclone_steps s
                         WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
                           AND s.kind = w.kind AND s.limit_keys[1] > w.tok AND s.id >= live_lo
                         ORDER BY s.limit_keys[1] LIMIT 1)
          FROM walk w WHERE w.tok IS NOT NULL
    )
    SELECT h.id, h.run_id, h.limit_keys, h.priority, h.fair_at - COALESCE(v.vt, 0.0), h.scheduled_at
      FROM walk w
     CROSS JOIN LATERAL (
        SELECT s.id, s.run_id, s.limit_keys, s.priority, s.fair_at, s.scheduled_at FROM cyclone_steps s
         WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
           AND s.kind = w.kind AND s.limit_keys[1] = w.tok AND s.id >= live_lo
         ORDER BY s.priority, s.fair_at, s.id LIMIT 1) h
      LEFT JOIN cyclone_fair_clocks v ON v.kind = w.kind
     WHERE w.tok IS NOT NULL AND NOT w.tok = ANY (p_skip)
     ORDER BY h.priority, h.fair_at - COALESCE(v.vt, 0.0), h.id
     LIMIT p_limit;
END $$;


-- Due limited steps of these kinds not yet in the fair order (delayed by a backoff, a snooze
-- or scheduled_at): their places, under their keys' fair clocks; the claim calls this first.
-- The clocks are taken before the steps, as an arrival takes them: an arrival holds its key's
-- clock, then may cancel the key's waiting steps (keep_newest) and their runs' other steps.
-- With p_wait (the transaction holds no rows yet: nothing it holds can be what the holder
-- of a clock waits for) the claim waits for the clocks, in (kind, token) order. Without it
-- (a claim in the transaction of an Enqueue, which holds the clocks and keys of its jobs) it
-- takes only those free now (a missing one made under a short lock_timeout, in a
-- subtransaction), and the dispatcher's next claim places the others. A step another
-- transaction holds is left to a later claim.
CREATE OR REPLACE FUNCTION cyclone__limits_place_due(p_kinds text[], p_wait boolean) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    due uuid[];
    k text[];
    t text[];
    saved_lock_timeout text := current_setting('lock_timeout');
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    due := ARRAY(SELECT x.id FROM cyclone_steps x
                  WHERE x.state = 'available' AND x.limit_keys IS NOT NULL AND x.fair_at IS NULL
                    AND x.kind = ANY (p_kinds) AND x.scheduled_at <= now() AND x.id >= live_lo
                  ORDER BY x.scheduled_at LIMIT 1000);
    IF cardinality(due) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(s.kind), array_agg(s.limit_keys[1]) INTO k, t FROM cyclone_steps s WHERE s.id = ANY (due);
    IF p_wait THEN
        PERFORM cyclone__fair_keys_lock(k, t);
    ELSE
        BEGIN
            PERFORM set_config('lock_timeout', '20ms', true);
            INSERT INTO cyclone_fair_keys (kind, token, vclock)
            SELECT DISTINCT u.k, u.t, 0.0 FROM unnest(k, t) AS u (k, t) WHERE u.t IS NOT NULL ORDER BY 1, 2
            ON CONFLICT (kind, token) DO NOTHING;
            PERFORM set_config('lock_timeout', saved_lock_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- the subtransaction's rows and setting are undone; their steps wait
        END;
        SELECT array_agg(f.kind), array_agg(f.token) INTO k, t
          FROM (SELECT f.kind, f.token FROM cyclone_fair_keys f
                 WHERE (f.kind, f.token) IN (SELECT * FROM unnest(k, t))
                   FOR UPDATE OF f SKIP LOCKED) f;
    END IF;
    -- (Only under a clock locked above: a SetLimit since may have given a step other tokens.)
    UPDATE cyclone_steps s SET fair_at = cyclone__fair_at(s.limit_keys[1], s.kind)
     WHERE s.id = ANY (ARRAY(SELECT x.id FROM cyclone_steps x
                              WHERE x.id = ANY (due) AND x.state = 'available' AND x.fair_at IS NULL
                                AND (x.kind, x.limit_keys[1]) IN (SELECT * FROM unnest(k, t))
                                FOR UPDATE SKIP LOCKED));
END $$;

-- Whether a waiting (placed) limited step of these kinds has a first token other than
-- these: the keys of each kind in order (as cyclone__limits_heads walks them), up to the first
-- one not among them.
CREATE OR REPLACE FUNCTION cyclone__limits_other_keys(p_kinds text[], p_tokens text[]) RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    k text;
    t text;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    FOREACH k IN ARRAY p_kinds LOOP
        t := '';  -- before every token (none is empty)
        LOOP
            t := (SELECT s.limit_keys[1] FROM cyclone_steps s
                   WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL AND s.kind = k
                     AND s.limit_keys[1] > t AND s.id >= live_lo
                   ORDER BY s.limit_keys[1] LIMIT 1);
            EXIT WHEN t IS NULL;
            IF NOT t = ANY (p_tokens) THEN
                RETURN true;
            END IF;
        END LOOP;
    END LOOP;
    RETURN false;
END $$;

-- The limited steps of these kinds that a claim of up to p_limit steps may take now, in
-- fair order, with the key of every limit they consume locked until the claim commits
-- (keys another transaction holds are skipped, never waited for). A step is taken only
-- if, for each of its tokens whose limit still exists: the key has a free slot (running
-- steps, or admitted runs for a limit of runs, below max_running, counting those taken
-- here) and a start left in the rate's window. The caller records the starts and
-- admissions of those it claims (cyclone__limits_take).
--
-- The first p_limit * 4 + 64 due steps of the fair order are looked at: it interleaves the
-- keys, so the steps of keys at their limit are usually at most as many as those keys. They
-- are read and judged in chunks (p_limit + 16, then doubling), and only the keys of a chunk
-- are locked and counted, so a claim reads, locks and counts about the steps and keys it
-- takes. If that window is all held and there are more due steps (one key's backlog at a
-- higher priority, a heavy weight), the head step of each other key is judged too
-- (cyclone__limits_heads).
DROP FUNCTION IF EXISTS cyclone__limits_pick(text[], integer);  -- its rows gained the tokens judged
CREATE FUNCTION cyclone__limits_pick(p_kinds text[], p_limit integer)
RETURNS TABLE (id uuid, priority integer, scheduled_at timestamptz, tokens text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    c_ids uuid[];
    c_runs uuid[];
    c_toks text[];
    c_pri integer[];
    c_sched timestamptz[];
    e_ids uuid[];                -- the heads of the keys past the window
    e_runs uuid[];
    e_toks text[];
    e_pri integer[];
    e_sched timestamptz[];
    whole boolean := false;      -- the window held every due step
    any_runs boolean;            -- a token judged so far is of a limit of runs
    cap integer := p_limit * 4 + 64;  -- the window's size
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
    got integer := 0;
    want integer;
    w_ids uuid[];                -- a read of the window
    w_runs uuid[];
    w_toks text[];
    w_pri integer[];
    w_sched timestamptz[];
    w_kinds text[];
    w_fair double precision[];
    at_kinds text[] := '{}';     -- per kind, the last step of the window read so far
    at_pri integer[] := '{}';
    at_fair double precision[] := '{}';
    at_ids uuid[] := '{}';
    tk text[] := '{}';           -- the tokens judged so far, and per token:
    tk_scope text[] := '{}';     --   its limit's scope (NULL: no such limit: not limited)
    tk_locked boolean[] := '{}';
    tk_slots integer[] := '{}';  --   slots left (NULL: no max_running)
    tk_rate integer[] := '{}';   --   starts left in the window (NULL: no rate)
    nt text[];                   -- the tokens of a chunk not judged before, and theirs:
    n_scope text[];
    n_max integer[];
    n_rate integer[];
    n_locked boolean[];
    held text[];
    counted text[];
    counted_runs text[];
    missing text[];
    saved_lock_timeout text := current_setting('lock_timeout');
    cnt_t text[];
    cnt_n integer[];
    admitted uuid[] := '{}';
    chosen integer[] := '{}';
    st text[];
    t text;
    i integer;
    j integer;
    lo integer := 1;
    hi integer;
    chunk integer := p_limit + 16;  -- the first chunk: about the steps the claim takes
    ok boolean;
    clock timestamptz;
    firsts text[];               -- the first tokens of the window read so far
BEGIN

    -- The window: the first cap due steps of the fair order, read a chunk at a time as the
    -- chunks are judged (a claim that fills from its first chunk reads no more), each read
    -- continuing every kind from the last step of it read so far.
    LOOP
    WHILE cardinality(chosen) < p_limit LOOP
        IF lo > COALESCE(array_length(c_ids, 1), 0) THEN
            EXIT WHEN whole OR got >= cap;
            want := least(chunk, cap - got);
            IF w_ids IS NOT NULL THEN  -- where each kind's next read starts: after its last step read
                SELECT array_agg(x.kind), array_agg(x.pri), array_agg(x.fair), array_agg(x.id)
                  INTO at_kinds, at_pri, at_fair, at_ids
                  FROM (SELECT DISTINCT ON (u.kind) u.kind, u.pri, u.fair, u.id
                          FROM (SELECT * FROM unnest(at_kinds, at_pri, at_fair, at_ids)
                                UNION ALL
                                SELECT * FROM unnest(w_kinds, w_pri, w_fair, w_ids)) AS u (kind, pri, fair, id)
                         ORDER BY u.kind, u.pri DESC, u.fair DESC, u.id DESC) x;
            END IF;
            SELECT array_agg(c.id), array_agg(c.run_id), array_agg(array_to_string(c.limit_keys, chr(30))),
                   array_agg(c.priority), array_agg(c.scheduled_at), array_agg(c.kind), array_agg(c.raw)
              INTO w_ids, w_runs, w_toks, w_pri, w_sched, w_kinds, w_fair
              -- Each kind has its own virtual time: kinds are merged by how far each step stands
              -- from its kind's (fair_at - vt), so one kind's held backlog does not hide another's.
              -- (array_agg keeps the order of the sorted subquery.)
              FROM (SELECT w.id, w.run_id, w.limit_keys, w.priority, w.scheduled_at, k.kind, w.fair_at AS raw
                      FROM unnest(p_kinds) AS k (kind)
                      LEFT JOIN unnest(at_kinds, at_pri, at_fair, at_ids) AS a (kind, pri, fair, id)
                        ON a.kind = k.kind
                     CROSS JOIN LATERAL (
                        SELECT s.id, s.run_id, s.limit_keys, s.priority, s.fair_at, s.scheduled_at
                          FROM cyclone_steps s
                         WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
                           AND s.kind = k.kind AND s.id >= live_lo
                           AND (s.priority, s.fair_at, s.id)
                               > (COALESCE(a.pri, -2147483648), COALESCE(a.fair, '-Infinity'::float8),
                                  COALESCE(a.id, '00000000-0000-0000-0000-000000000000'::uuid))
                         ORDER BY s.priority, s.fair_at, s.id
                         LIMIT want) w
                      LEFT JOIN cyclone_fair_clocks v ON v.kind = k.kind
                     -- (then fair_at: the kind's own order, where fair_at - vt rounds equal)
                     ORDER BY w.priority, w.fair_at - COALESCE(v.vt, 0.0), w.fair_at, w.id
                     LIMIT want) c;
            got := got + COALESCE(cardinality(w_ids), 0);
            whole := COALESCE(cardinality(w_ids), 0) < want;  -- the window holds every due step
            EXIT WHEN w_ids IS NULL;
            c_ids := COALESCE(c_ids, '{}') || w_ids;
            c_runs := COALESCE(c_runs, '{}') || w_runs;
            c_toks := COALESCE(c_toks, '{}') || w_toks;
            c_pri := COALESCE(c_pri, '{}') || w_pri;
            c_sched := COALESCE(c_sched, '{}') || w_sched;
        END IF;
        hi := least(array_length(c_ids, 1), lo + chunk - 1);
        -- The chunk's new tokens: their limits, their keys locked (in one order; skipping
        -- those another claim or arrival holds), then (statements after the lock see every
        -- claim that committed before it) what they use.
        SELECT COALESCE(array_agg(u.t ORDER BY u.t), '{}') INTO nt
          FROM (SELECT DISTINCT x.t
                  FROM unnest(string_to_array(array_to_string(c_toks[lo:hi], chr(30)), chr(30))) AS x (t)
                 WHERE NOT x.t = ANY (tk)) u;
        IF cardinality(nt) > 0 THEN
        -- Every key is locked, also one of a limit that only orders its keys: a cap given to
        -- it meanwhile (SetLimit) must find this claim's steps counted by the next claim, and
        -- two claims then share the keys instead of reaching for the same steps.
        SELECT COALESCE(array_agg(cyclone__limit_token(k.limit_name, k.key)), '{}') INTO held
          FROM (SELECT kk.limit_name, kk.key FROM cyclone_limit_keys kk
                  JOIN unnest(nt) AS v (t)
                    ON kk.limit_name = cyclone__token_limit(v.t) AND kk.key = cyclone__token_key(v.t)
                 ORDER BY kk.limit_name, kk.key
                   FOR UPDATE OF kk SKIP LOCKED) k;
        -- A key's row is made by the first claim that meets it. Another claim making the same
        -- key's row meanwhile would make this one wait for its commit, and two such claims
        -- making several keys each in other orders (chunks differ with p_limit) could wait on
        -- each other. So new rows are made under a short lock_timeout, in a subtransaction:
        -- if one is being made by another claim, none of this chunk's new keys is locked now.
        -- (Keys of limits deleted meanwhile are not made: their steps are not limited.)
        IF cardinality(held) < cardinality(nt) THEN
            missing := ARRAY(SELECT u.t FROM unnest(nt) AS u (t)
                              WHERE NOT u.t = ANY (held)
                                AND EXISTS (SELECT 1 FROM cyclone_limits l WHERE l.name = cyclone__token_limit(u.t))
                                AND NOT EXISTS (SELECT 1 FROM cyclone_limit_keys k
                                                 WHERE k.limit_name = cyclone__token_limit(u.t)
                                                   AND k.key = cyclone__token_key(u.t))
                              ORDER BY u.t);
        ELSE
            missing := '{}';
        END IF;
        IF cardinality(missing) > 0 THEN
            BEGIN
                PERFORM set_config('lock_timeout', '20ms', true);
                WITH made AS (
                    INSERT INTO cyclone_limit_keys (limit_name, key)
                    SELECT cyclone__token_limit(u.t), cyclone__token_key(u.t) FROM unnest(missing) AS u (t)
                    ON CONFLICT DO NOTHING
                    RETURNING limit_name, key)
                SELECT held || COALESCE(array_agg(cyclone__limit_token(m.limit_name, m.key)), '{}') INTO held
                  FROM made m;
                PERFORM set_config('lock_timeout', saved_lock_timeout, true);
            EXCEPTION WHEN lock_not_available OR foreign_key_violation THEN
                -- (or a limit was deleted since the probe above)
                NULL;  -- the subtransaction's rows and setting are undone; its keys are skipped
            END;
        END IF;
        IF cardinality(held) = cardinality(nt) THEN  -- (held: a subset of nt, each once)
            n_locked := array_fill(true, ARRAY[cardinality(nt)]);
        ELSE
            n_locked := ARRAY(SELECT u.t = ANY (held) FROM unnest(nt) WITH ORDINALITY AS u (t, ord) ORDER BY u.ord);
        END IF;
        -- The limits, read once their keys are locked (each statement of this function takes a
        -- fresh snapshot: a SetLimit committed before the lock is seen).
        SELECT array_agg(l.scope ORDER BY u.ord), array_agg(l.max_running ORDER BY u.ord),
               array_agg(l.rate ORDER BY u.ord)
          INTO n_scope, n_max, n_rate
          FROM unnest(nt) WITH ORDINALITY AS u (t, ord)
          LEFT JOIN cyclone_limits l ON l.name = cyclone__token_limit(u.t);
        clock := clock_timestamp();
        -- The slots taken under the locked keys with a cap (cyclone__limits_used).
        counted := ARRAY(SELECT u.t FROM unnest(nt, n_locked, n_max, n_scope) AS u (t, locked, mx, scope)
                          WHERE u.locked AND u.mx IS NOT NULL AND u.scope = 'steps');
        counted_runs := ARRAY(SELECT u.t FROM unnest(nt, n_locked, n_max, n_scope) AS u (t, locked, mx, scope)
                               WHERE u.locked AND u.mx IS NOT NULL AND u.scope = 'runs');
        SELECT COALESCE(array_agg(c.t), '{}'), COALESCE(array_agg(c.n), '{}') INTO cnt_t, cnt_n
          FROM cyclone__limits_used(counted, counted_runs) c;
        tk_slots := tk_slots || ARRAY(
            SELECT CASE
                   WHEN n_scope[u.ord] IS NULL OR NOT n_locked[u.ord] OR n_max[u.ord] IS NULL THEN n_max[u.ord]
                   ELSE n_max[u.ord] - COALESCE(cnt_n[array_position(cnt_t, u.t)], 0)
                   END
              FROM unnest(nt) WITH ORDINALITY AS u (t, ord) ORDER BY u.ord);
        IF EXISTS (SELECT 1 FROM unnest(n_locked, n_rate) AS u (locked, rate) WHERE u.locked AND u.rate IS NOT NULL) THEN
            DELETE FROM cyclone_limit_starts d
             USING unnest(nt, n_locked, n_rate) AS u (t, locked, rate), cyclone_limits l
             WHERE u.locked AND u.rate IS NOT NULL AND l.name = cyclone__token_limit(u.t)
               AND d.limit_name = l.name AND d.key = cyclone__token_key(u.t)
               AND d.at <= clock - cyclone__rate_window(l.period);
            tk_rate := tk_rate || ARRAY(
                SELECT CASE
                       WHEN n_rate[u.ord] IS NULL OR NOT n_locked[u.ord] THEN n_rate[u.ord]
                       ELSE (SELECT cyclone__rate_left(l, cyclone__token_key(u.t), clock)
                               FROM cyclone_limits l WHERE l.name = cyclone__token_limit(u.t))
                       END
                  FROM unnest(nt) WITH ORDINALITY AS u (t, ord) ORDER BY u.ord);
        ELSE
            tk_rate := tk_rate || n_rate;
        END IF;
        tk := tk || nt;
        tk_scope := tk_scope || n_scope;
        tk_locked := tk_locked || n_locked;
        END IF;
        any_runs := 'runs' = ANY (tk_scope);
        IF any_runs THEN  -- the chunk's runs that hold their slot already
            admitted := admitted || ARRAY(SELECT r.id FROM cyclone_runs r
                                           WHERE r.id = ANY (c_runs[lo:hi]) AND r.limit_admitted
                                             AND NOT r.id = ANY (admitted));
        END IF;

        FOR i IN lo .. hi LOOP
            EXIT WHEN cardinality(chosen) >= p_limit;
            st := string_to_array(c_toks[i], chr(30));
            ok := true;
            FOREACH t IN ARRAY st LOOP
                j := array_position(tk, t);
                CONTINUE WHEN tk_scope[j] IS NULL;  -- its limit was deleted
                IF NOT tk_locked[j] THEN
                    ok := false;
                ELSIF tk_scope[j] = 'runs' AND c_runs[i] = ANY (admitted) THEN
                    CONTINUE;  -- the run holds its slot already
                ELSIF tk_slots[j] <= 0 OR tk_rate[j] <= 0 THEN
                    ok := false;
                END IF;
                EXIT WHEN NOT ok;
            END LOOP;
            CONTINUE WHEN NOT ok;
            FOREACH t IN ARRAY st LOOP
                j := array_position(tk, t);
                CONTINUE WHEN tk_scope[j] IS NULL OR (tk_scope[j] = 'runs' AND c_runs[i] = ANY (admitted));
                tk_slots[j] := tk_slots[j] - 1;
                tk_rate[j] := tk_rate[j] - 1;
            END LOOP;
            IF any_runs AND EXISTS (SELECT 1 FROM unnest(st) AS x (t) WHERE tk_scope[array_position(tk, x.t)] = 'runs') THEN
                admitted := admitted || c_runs[i];
            END IF;
            chosen := chosen || i;
        END LOOP;
        lo := hi + 1;
        chunk := chunk * 2;
        -- Every key of the window read so far (a step's first token: its place in the fair
        -- order) holds its steps: locked by another claim, or a limit of steps out of slots or
        -- starts. When those few keys' backlogs are the window (two steps or more a key) and no
        -- other key of these kinds has a waiting step, the rest of the window is their backlogs
        -- too, held: the claim ends here. A rate's backlog is looked at by every server each
        -- time a start comes due; without this, each look read and judged the whole window.
        IF lo > array_length(c_ids, 1) AND NOT whole THEN
            firsts := ARRAY(SELECT DISTINCT split_part(x.t, chr(30), 1) FROM unnest(c_toks) AS x (t) ORDER BY 1);
            IF cardinality(firsts) <= 4 AND cardinality(firsts) * 2 <= array_length(c_ids, 1)
               AND NOT EXISTS (SELECT 1 FROM unnest(firsts) AS f (t) CROSS JOIN LATERAL (SELECT array_position(tk, f.t) AS j) p
                                WHERE tk_scope[p.j] IS NULL  -- its limit was deleted: not limited
                                   OR (tk_locked[p.j] AND (tk_scope[p.j] = 'runs'  -- an admitted run's step may pass
                                       OR (COALESCE(tk_slots[p.j], 1) > 0 AND COALESCE(tk_rate[p.j], 1) > 0))))
               AND NOT cyclone__limits_other_keys(p_kinds, firsts) THEN
                whole := true;
                EXIT;
            END IF;
        END IF;
    END LOOP;
    -- The window was all judged and did not fill the claim, and there are more due steps than
    -- it held: the head step of every other key, in the fair order (cyclone__limits_heads).
    EXIT WHEN cardinality(chosen) >= p_limit OR whole OR c_ids IS NULL;
    whole := true;
    SELECT array_agg(h.id), array_agg(h.run_id), array_agg(array_to_string(h.limit_keys, chr(30))),
           array_agg(h.priority), array_agg(h.scheduled_at)
      INTO e_ids, e_runs, e_toks, e_pri, e_sched
      FROM cyclone__limits_heads(p_kinds,
                                 ARRAY(SELECT DISTINCT split_part(x.t, chr(30), 1) FROM unnest(c_toks) AS x (t)),
                                 NULL) h;
    EXIT WHEN e_ids IS NULL;
    c_ids := c_ids || e_ids;
    c_runs := c_runs || e_runs;
    c_toks := c_toks || e_toks;
    c_pri := c_pri || e_pri;
    c_sched := c_sched || e_sched;
    END LOOP;

    RETURN QUERY SELECT c_ids[x.i], c_pri[x.i], c_sched[x.i], c_toks[x.i] FROM unnest(chosen) AS x (i);
END $$;

-- The claim took these limited steps (now running; called after its UPDATE): their starts count against their rates,
-- their runs hold the slots of the limits of runs, and the kinds' virtual time moves on to
-- the furthest fair place taken (cyclone__fair_at). Runs once per claim.
CREATE OR REPLACE FUNCTION cyclone__limits_take(p_ids uuid[], p_owner text) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    clock timestamptz := clock_timestamp();
    m_runs uuid[];
    m_steps uuid[];
    m_toks text[];
    m_scope text[];
    m_rated boolean[];
    m_kinds text[];
    m_at double precision[];
    i integer;
    span_lo uuid;
    span_hi uuid;
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) = 0 THEN
        RETURN;
    END IF;
    -- The steps' days, and so their runs' (cyclone__ids_span): by id = ANY alone, which
    -- prunes no partition, each statement below would read every day's index.
    SELECT d.lo, d.hi INTO span_lo, span_hi FROM cyclone__ids_span(p_ids) d;
    -- Only the steps this claim's UPDATE took: running, leased to p_owner at this transaction's
    -- now(). A step the pick chose from a snapshot taken before another claim of its key
    -- committed is running too, but that claim's start, not this one's. Read once: per token
    -- of theirs, the step's run and its limit's scope (NULL: the limit was deleted); per kind,
    -- the furthest fair place taken.
    WITH mine AS MATERIALIZED (
        SELECT s.id, s.run_id, s.limit_keys, s.kind, s.fair_at FROM cyclone_steps s
         WHERE s.id = ANY (p_ids) AND s.id >= span_lo AND s.id < span_hi
           AND s.state = 'running' AND s.lease_owner = p_owner AND s.started_at = now()
    ), toks AS MATERIALIZED (
        SELECT m.id, m.run_id, x.t, l.scope, l.rate IS NOT NULL AS rated
          FROM mine m CROSS JOIN unnest(m.limit_keys) AS x (t)
          LEFT JOIN cyclone_limits l ON l.name = cyclone__token_limit(x.t)
    ), kinds AS MATERIALIZED (
        SELECT m.kind, max(m.fair_at) AS at FROM mine m WHERE m.fair_at IS NOT NULL GROUP BY m.kind
    )
    SELECT a.steps, a.runs, a.toks, a.scopes, a.rated, b.kinds, b.ats
      INTO m_steps, m_runs, m_toks, m_scope, m_rated, m_kinds, m_at
      FROM (SELECT array_agg(t.id) AS steps, array_agg(t.run_id) AS runs, array_agg(t.t) AS toks,
                   array_agg(t.scope) AS scopes,
                   array_agg(t.rated) AS rated FROM toks t) a,
           (SELECT array_agg(k.kind ORDER BY k.kind) AS kinds, array_agg(k.at ORDER BY k.kind) AS ats FROM kinds k) b;
    -- (Nothing to write when no token is of a limit of runs or with a rate. A run whose limit of
    -- runs was deleted is admitted all the same: a limit made again under its name counts it.)
    IF 'runs' = ANY (m_scope) OR true = ANY (m_rated) OR array_position(m_scope, NULL) IS NOT NULL THEN
        WITH newly AS (
            -- A run holds the slot of its limits of runs from its first step's start.
            UPDATE cyclone_runs r SET limit_admitted = true
             WHERE r.id = ANY (ARRAY(SELECT u.r FROM unnest(m_runs, m_scope) AS u (r, scope)
                                      WHERE u.scope = 'runs' OR u.scope IS NULL))
               AND r.id >= span_lo AND r.id < span_hi
               AND r.limit_keys IS NOT NULL AND NOT r.limit_admitted
            RETURNING r.id, r.limit_keys
        ), started AS (
            -- Each start names the step whose lease it is (cyclone_limit_starts_pushed).
            INSERT INTO cyclone_limit_starts (limit_name, key, at, step_id)
            SELECT l.name, cyclone__token_key(u.t), clock, u.step
              -- A step's start counts for its limits of steps; a run's admission for its limits of runs.
              FROM (SELECT u.t, u.step, 'steps' AS scope FROM unnest(m_toks, m_scope, m_steps) AS u (t, scope, step)
                     WHERE u.scope = 'steps'
                     UNION ALL
                    SELECT t, (SELECT x.step FROM unnest(m_runs, m_steps) AS x (run, step) WHERE x.run = n.id LIMIT 1),
                           'runs'
                      FROM newly n CROSS JOIN unnest(n.limit_keys) AS t) u
              JOIN cyclone_limits l ON l.name = cyclone__token_limit(u.t) AND l.rate IS NOT NULL AND l.scope = u.scope
            RETURNING limit_name, key)
        -- The keys' pace (cyclone__rate_left): their rows are locked by this claim (cyclone__limits_pick).
        UPDATE cyclone_limit_keys k
           SET paced = CASE WHEN k.paced IS NULL  -- a new bucket held one start (cyclone__rate_left)
                            THEN clock + (cyclone__rate_burst(l.rate) - 1) * cyclone__rate_pace(l)
                            ELSE greatest(k.paced, clock) END + g.n * cyclone__rate_pace(l)
          FROM (SELECT st.limit_name, st.key, count(*) AS n FROM started st GROUP BY st.limit_name, st.key) g
          JOIN cyclone_limits l ON l.name = g.limit_name
         WHERE k.limit_name = g.limit_name AND k.key = g.key;
    END IF;
    FOR i IN 1 .. COALESCE(cardinality(m_kinds), 0) LOOP
        INSERT INTO cyclone_fair_clocks (kind, vt) VALUES (m_kinds[i], m_at[i]) ON CONFLICT (kind) DO NOTHING;
        UPDATE cyclone_fair_clocks f SET vt = m_at[i]
         WHERE f.kind = (SELECT x.kind FROM cyclone_fair_clocks x WHERE x.kind = m_kinds[i] AND x.vt < m_at[i]
                            FOR UPDATE SKIP LOCKED);
    END LOOP;
END $$;

-- A start counts from its claim until its lease is pushed, then from the push: the server
-- calls this with the steps whose leases it has just written to their workers' streams (the
-- claim's `rated` rows). Between the claim and the push lie the claim's commit and the
-- server's own work, which a busy disk or a paused server stretch to tens of milliseconds
-- now and then: counted from the claim, such starts reached their workers beside the next
-- window's and a worker saw more than the quota in one second. Moving `at` later only
-- keeps a start in the window longer; a claim that counted it before the move counted it
-- all the same. Only a step's latest starts move (one per limit, all at one claim's clock),
-- all to one moment; an earlier one that was never pushed (its lease's worker went away
-- first) is marked pushed where it stands. A run's admission under a limit of runs is a
-- start of the step whose claim admitted it: a later lease of that step, which makes no
-- start of its own, moves it if it was never pushed (a stricter count, never a looser one).
-- Rows that another transaction holds (the pick's or the tidy's delete of a start older than
-- its window: a push later than a whole window) are left as they are. Returns how many
-- starts were moved.
CREATE OR REPLACE FUNCTION cyclone_limit_starts_pushed(p_ids uuid[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    pushed_at timestamptz := clock_timestamp();
    n integer;
BEGIN
    WITH mine AS (
        SELECT x.ctid AS row, x.at FROM cyclone_limit_starts x
         WHERE x.step_id = ANY (p_ids) AND NOT x.pushed
           FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE cyclone_limit_starts d
           SET at = CASE WHEN d.at = (SELECT max(y.at) FROM cyclone_limit_starts y
                                       WHERE y.step_id = d.step_id AND NOT y.pushed)
                         THEN greatest(d.at, pushed_at) ELSE d.at END,
               pushed = true
          FROM mine m
         WHERE d.ctid = m.row
        RETURNING d.at <> m.at AS moved
    )
    SELECT count(*) FILTER (WHERE moved) INTO n FROM moved;
    RETURN n;
END $$;

-- A rate's starts are spread over its window. Besides at most `rate` in any window, a key's
-- starts keep a pace of one per window / rate, with a burst of at most a twentieth of the
-- rate (rounded up, at least 2): a bucket of that many starts refilled at the rate
-- (cyclone_limit_keys.paced is when it is full again). A new bucket (a key's new row, or one
-- SetLimit reset: paced NULL) holds one start: a key's first claims are the slowest to reach
-- their workers (plans made, streams opened), and a first burst delivered late lands beside
-- the next window's starts. Bursts, even of a tenth of the quota,
-- claimed a window apart reach the workers tens of milliseconds apart under load, and so can
-- land more than the quota in one window of the workers' clocks; starts one by one, a pace
-- apart, cannot bunch by more than the delivery's jitter. The dispatchers wake for each start
-- (cyclone__rate_due); a claim that comes late finds the starts it missed in the bucket.
CREATE OR REPLACE FUNCTION cyclone__rate_burst(p_rate integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT greatest(2, ceil(p_rate / 20.0)::integer) $$;

CREATE OR REPLACE FUNCTION cyclone__rate_pace(p_limit cyclone_limits) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT cyclone__rate_window(p_limit.period) / p_limit.rate $$;

-- Starts left now for a key (in a claim, under the key's lock).
CREATE OR REPLACE FUNCTION cyclone__rate_left(p_limit cyclone_limits, p_key text, p_clock timestamptz)
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT least(
        p_limit.rate - (SELECT count(*) FROM cyclone_limit_starts d
                         WHERE d.limit_name = p_limit.name AND d.key = p_key
                           AND d.at > p_clock - cyclone__rate_window(p_limit.period)),
        cyclone__rate_burst(p_limit.rate) - COALESCE((
            SELECT CASE WHEN k.paced IS NULL THEN cyclone__rate_burst(p_limit.rate) - 1  -- a new bucket: one start
                        ELSE greatest(ceil(extract(epoch FROM k.paced - p_clock)
                                           / extract(epoch FROM cyclone__rate_pace(p_limit))), 0) END
              FROM cyclone_limit_keys k
             WHERE k.limit_name = p_limit.name AND k.key = p_key), 0))::integer);
END $$;

-- Seconds until a key has a start left (0: now): when the oldest start of a full window leaves
-- it, and when the bucket holds a start again, whichever is later.
CREATE OR REPLACE FUNCTION cyclone__rate_due(p_limit cyclone_limits, p_key text) RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT greatest(
               CASE WHEN count(d.at) < p_limit.rate THEN 0.0
                    ELSE extract(epoch FROM min(d.at) + w.span - w.now)::float8 END,
               COALESCE(extract(epoch FROM (SELECT k.paced FROM cyclone_limit_keys k
                                             WHERE k.limit_name = p_limit.name AND k.key = p_key)
                                           - (cyclone__rate_burst(p_limit.rate) - 1) * cyclone__rate_pace(p_limit)
                                           - w.now)::float8, 0.0),
               0.0)
      FROM (SELECT cyclone__rate_window(p_limit.period) AS span, clock_timestamp() AS now) w
      LEFT JOIN LATERAL (
        SELECT s.at FROM cyclone_limit_starts s
         WHERE s.limit_name = p_limit.name AND s.key = p_key AND s.at > w.now - w.span
         ORDER BY s.at DESC LIMIT p_limit.rate) d ON true
     GROUP BY w.span, w.now);
END $$;

-- The earliest time (seconds from now) at which one of these available limited steps may be
-- claimable, NULL if none is without a slot freeing first. A look without locks: a key with a
-- free slot and a start left is due now; a key out of starts when its oldest start leaves
-- the window; a key without a free slot never (its slot's release notifies). A step is due
-- when all its keys are; a key of a limit of runs does not hold a step whose run holds its
-- slot already (as in cyclone__limits_pick).
CREATE OR REPLACE FUNCTION cyclone__limits_due(p_ids uuid[]) RETURNS double precision
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN (WITH c AS (
        SELECT s.id, s.limit_keys,
               (SELECT r.limit_admitted FROM cyclone_runs r WHERE r.id = s.run_id) AS admitted
          FROM cyclone_steps s WHERE s.id = ANY (p_ids)
    ), toks AS MATERIALIZED (
        SELECT x.t, l AS lim
          FROM (SELECT DISTINCT u.tok AS t FROM c CROSS JOIN unnest(c.limit_keys) AS u (tok)) x
          LEFT JOIN cyclone_limits l ON l.name = cyclone__token_limit(x.t)
    ), used AS MATERIALIZED (  -- the slots taken under the tokens with a cap, once
        SELECT u.t, u.n FROM cyclone__limits_used(
            ARRAY(SELECT k.t FROM toks k WHERE (k.lim).scope = 'steps' AND (k.lim).max_running IS NOT NULL),
            ARRAY(SELECT k.t FROM toks k WHERE (k.lim).scope = 'runs' AND (k.lim).max_running IS NOT NULL)) u
    ), state AS MATERIALIZED (
        SELECT k.t, (k.lim).scope AS scope,
               CASE WHEN (k.lim).name IS NULL THEN 0.0
                    WHEN (k.lim).max_running IS NOT NULL AND (k.lim).max_running <= COALESCE(u.n, 0) THEN NULL
                    WHEN (k.lim).rate IS NOT NULL THEN cyclone__rate_due(k.lim, cyclone__token_key(k.t))
                    ELSE 0.0 END AS due
          FROM toks k LEFT JOIN used u ON u.t = k.t
    )
    SELECT min(m.due)
      FROM (SELECT max(d.due) AS due, bool_or(d.due IS NULL) AS never
              FROM (SELECT c.id, CASE WHEN st.scope = 'runs' AND c.admitted THEN 0.0 ELSE st.due END AS due
                      FROM c CROSS JOIN unnest(c.limit_keys) AS u (tok) JOIN state st ON st.t = u.tok) d
             GROUP BY d.id) m
     WHERE NOT m.never);
END $$;

-- Seconds until a limited step of these kinds may be claimable (NULL: none without a slot
-- freeing first, which wakes the dispatchers; 0 or less: now, if a claim can lock its
-- keys): the due steps a claim would see first (cyclone__limits_due), and if none of those
-- is claimable now, the head step of every key (cyclone__limits_heads) as the claim does.
-- Steps not yet due: when they become due.
CREATE OR REPLACE FUNCTION cyclone__limits_next_due(p_kinds text[]) RETURNS double precision
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    later timestamptz;
    best double precision;
    window_ids uuid[];
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    SELECT min(n.at) INTO later
      FROM unnest(p_kinds) AS k (kind)
     CROSS JOIN LATERAL (SELECT s.scheduled_at AS at FROM cyclone_steps s
                          WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NULL
                            AND s.kind = k.kind AND s.id >= live_lo
                          ORDER BY s.scheduled_at LIMIT 1) n;
    window_ids := ARRAY(
        SELECT w.id FROM unnest(p_kinds) AS k (kind)
         CROSS JOIN LATERAL (
            SELECT s.id FROM cyclone_steps s
             WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
               AND s.kind = k.kind AND s.id >= live_lo
             ORDER BY s.priority, s.fair_at, s.id LIMIT 64) w);
    best := cyclone__limits_due(window_ids);
    IF (best IS NULL OR best > 0.0) AND cardinality(window_ids) >= 64 THEN
        best := least(best, cyclone__limits_due(ARRAY(SELECT h.id FROM cyclone__limits_heads(p_kinds, '{}', NULL) h)));
    END IF;
    RETURN least(best, extract(epoch FROM later - now())::float8);
END $$;

-- Why an available step is not claimed, when a limit holds it: "limit tenants key acme:
-- 5/5 running", "limit api key global: 100/100 starts per 1 s, the next in 0.4 s" (the
-- empty key written ""), or NULL.
CREATE OR REPLACE FUNCTION cyclone__step_held(p_step cyclone_steps) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text;
    l cyclone_limits;
    k text;
    n bigint;
BEGIN
    IF p_step.state <> 'available' OR p_step.limit_keys IS NULL THEN
        RETURN NULL;
    END IF;
    FOREACH t IN ARRAY p_step.limit_keys LOOP
        SELECT * INTO l FROM cyclone_limits WHERE name = cyclone__token_limit(t);
        CONTINUE WHEN NOT FOUND;
        k := cyclone__token_key(t);
        IF l.max_running IS NOT NULL THEN
            IF l.scope = 'steps' THEN
                n := COALESCE((SELECT u.n FROM cyclone__limits_used(ARRAY[t], '{}') u), 0);
            ELSIF EXISTS (SELECT 1 FROM cyclone_runs r WHERE r.id = p_step.run_id AND r.limit_admitted) THEN
                n := 0;
            ELSE
                n := COALESCE((SELECT u.n FROM cyclone__limits_used('{}', ARRAY[t]) u), 0);
            END IF;
            IF n >= l.max_running THEN
                RETURN format('limit %s key %s: %s/%s %s', l.name, CASE WHEN k = '' THEN '""' ELSE k END, n,
                              l.max_running, CASE WHEN l.scope = 'steps' THEN 'running' ELSE 'runs active' END);
            END IF;
        END IF;
        IF l.rate IS NOT NULL THEN
            IF cyclone__rate_left(l, k, clock_timestamp()) <= 0 THEN
                SELECT count(*) INTO n FROM cyclone_limit_starts d
                 WHERE d.limit_name = l.name AND d.key = k AND d.at > clock_timestamp() - cyclone__rate_window(l.period);
                RETURN format('limit %s key %s: %s/%s starts per %s s%s, the next in %s s', l.name,
                              CASE WHEN k = '' THEN '""' ELSE k END, n, l.rate, trim_scale(extract(epoch FROM l.period)),
                              CASE WHEN n < l.rate
                                   THEN format(', paced at one per %s s', round(extract(epoch FROM cyclone__rate_pace(l))::numeric, 3))
                                   ELSE '' END,
                              round(greatest(cyclone__rate_due(l, k), 0)::numeric, CASE WHEN n < l.rate THEN 3 ELSE 1 END));
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- The key of limit p_limit for a run of input p_input, as SetLimit's backfill gives it: the
-- scalar at its key_path (cut to 256 characters; "" when there is none), else its key.
CREATE OR REPLACE FUNCTION cyclone__limit_backfill_key(p_limit cyclone_limits, p_input jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(CASE WHEN p_limit.key_path IS NULL THEN p_limit.key_const
                         WHEN jsonb_typeof(p_input #> p_limit.key_path) IN ('string', 'number', 'boolean')
                         THEN left(p_input #>> p_limit.key_path, 256) END, '')
$$;

-- Limits.SetLimit: create the limit or replace its fields (validated by the server:
-- limit_spec.py). Steps that are not terminal, of the kinds it now names, that do not yet
-- consume it, consume it from now on (the running ones count against it at once); so do
-- the active runs of the workflows it names, and their steps (a run with a step claimed
-- already holds its slot). A queued step whose input lacks key_path takes the key "".
-- Returns whether the limit was created.
CREATE OR REPLACE FUNCTION cyclone_limit_set(p jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    created boolean;
    l cyclone_limits;
    clock_kinds text[];
    clock_tokens text[];
BEGIN
    PERFORM cyclone__limits_settle_lock();  -- in-flight submits commit first; the backfill sees their steps
    IF EXISTS (SELECT 1 FROM cyclone_limits WHERE name = p ->> 'name' AND scope <> p ->> 'scope') THEN
        RAISE EXCEPTION 'limit.scope: limit "%" exists with scope %: a scope cannot change (delete the limit first)',
            p ->> 'name', (SELECT scope FROM cyclone_limits WHERE name = p ->> 'name') USING ERRCODE = 'CY400';
    END IF;
    INSERT INTO cyclone_limits AS x (name, max_running, rate, period, strategy, scope, kinds, workflows,
                                     key_path, key_const, weights)
    VALUES (p ->> 'name', (p ->> 'max_running')::integer, (p ->> 'rate')::integer,
            make_interval(secs => (p ->> 'period')::float8), p ->> 'strategy', p ->> 'scope',
            ARRAY(SELECT jsonb_array_elements_text(p -> 'kinds')),
            ARRAY(SELECT jsonb_array_elements_text(p -> 'workflows')),
            CASE WHEN jsonb_typeof(p -> 'key_path') = 'array'
                 THEN ARRAY(SELECT jsonb_array_elements_text(p -> 'key_path')) END,
            COALESCE(p ->> 'key_const', ''), COALESCE(p -> 'weights', '{}'))
    ON CONFLICT (name) DO UPDATE
       SET max_running = EXCLUDED.max_running, rate = EXCLUDED.rate, period = EXCLUDED.period,
           strategy = EXCLUDED.strategy, scope = EXCLUDED.scope, kinds = EXCLUDED.kinds,
           workflows = EXCLUDED.workflows, key_path = EXCLUDED.key_path, key_const = EXCLUDED.key_const,
           weights = EXCLUDED.weights, updated_at = now()
    RETURNING (xmax = 0), x.* INTO created, l.name, l.max_running, l.rate, l.period, l.strategy, l.scope,
              l.kinds, l.workflows, l.key_path, l.key_const, l.weights, l.created_at, l.updated_at;

    -- The keys' pace was kept at the old rate: their buckets start anew at the new one, with
    -- one start (cyclone__rate_left; the window still holds the quota). Before the backfill,
    -- so that this waits for claims holding the keys before it locks any step.
    UPDATE cyclone_limit_keys k SET paced = NULL WHERE k.limit_name = l.name AND k.paced IS NOT NULL;
    -- The backfill gives steps their tokens, and the due available ones their fair places
    -- (cyclone__fair_place) under their first token's clock, row by row in no order: the
    -- clocks are locked first, in (kind, token) order, as a claim and an arrival take them.
    IF l.scope = 'steps' AND cardinality(l.kinds) > 0 THEN
        SELECT array_agg(s.kind), array_agg(COALESCE(s.limit_keys[1],
                                                     cyclone__limit_token(l.name, cyclone__limit_backfill_key(l, r.input))))
          INTO clock_kinds, clock_tokens
          FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id
         WHERE s.kind = ANY (l.kinds) AND s.type = 'task' AND s.state = 'available' AND s.scheduled_at <= now()
           AND NOT EXISTS (SELECT 1 FROM unnest(COALESCE(s.limit_keys, '{}')) AS t
                            WHERE cyclone__token_limit(t) = l.name);
        PERFORM cyclone__fair_keys_lock(clock_kinds, clock_tokens);
        UPDATE cyclone_steps s
           SET limit_keys = COALESCE(s.limit_keys, '{}') || cyclone__limit_token(l.name, cyclone__limit_backfill_key(l, r.input))
          FROM cyclone_runs r
         WHERE r.id = s.run_id AND s.kind = ANY (l.kinds) AND s.type = 'task'
           AND s.state NOT IN ('completed', 'discarded', 'cancelled')
           AND NOT EXISTS (SELECT 1 FROM unnest(COALESCE(s.limit_keys, '{}')) AS t
                            WHERE cyclone__token_limit(t) = l.name);
    ELSIF l.scope = 'runs' THEN
        SELECT array_agg(s.kind), array_agg(COALESCE(s.limit_keys[1],
                                                     cyclone__limit_token(l.name, cyclone__limit_backfill_key(l, r.input))))
          INTO clock_kinds, clock_tokens
          FROM cyclone_runs r JOIN cyclone_steps s ON s.run_id = r.id
         WHERE r.workflow_name = ANY (l.workflows) AND r.state IN ('running', 'paused')
           AND NOT EXISTS (SELECT 1 FROM unnest(COALESCE(r.limit_keys, '{}')) AS t WHERE cyclone__token_limit(t) = l.name)
           AND s.type = 'task' AND s.state = 'available' AND s.scheduled_at <= now();
        PERFORM cyclone__fair_keys_lock(clock_kinds, clock_tokens);
        WITH runs AS (
            UPDATE cyclone_runs r
               SET limit_keys = COALESCE(r.limit_keys, '{}') || cyclone__limit_token(l.name, k.key),
                   limit_admitted = r.limit_admitted OR EXISTS (
                       SELECT 1 FROM cyclone_steps s WHERE s.run_id = r.id AND s.started_at IS NOT NULL)
              FROM (SELECT r2.id, cyclone__limit_backfill_key(l, r2.input) AS key
                      FROM cyclone_runs r2
                     WHERE r2.workflow_name = ANY (l.workflows) AND r2.state IN ('running', 'paused')) k
             WHERE r.id = k.id
               AND NOT EXISTS (SELECT 1 FROM unnest(COALESCE(r.limit_keys, '{}')) AS t
                                WHERE cyclone__token_limit(t) = l.name)
            RETURNING r.id, cyclone__limit_token(l.name, k.key) AS token)
        UPDATE cyclone_steps s SET limit_keys = COALESCE(s.limit_keys, '{}') || runs.token
          FROM runs
         WHERE s.run_id = runs.id AND s.type = 'task' AND s.state NOT IN ('completed', 'discarded', 'cancelled');
    END IF;
    PERFORM pg_notify('cyclone_available', '');  -- a raised limit may free held steps
    RETURN created;
END $$;

-- Limits.DeleteLimit. Steps that consumed it are no longer held by it. Returns whether it existed.
--
-- The delete locks the limit's row, then its cascade each key's row. A claim holds its keys'
-- rows and then, recording a start, waits for the limit's row (its foreign key); an arrival
-- may hold the limit's row (a key it made) and wait for another key. Either could deadlock
-- with the delete. So the delete never waits long: each attempt runs under a 50 ms
-- lock_timeout, in a subtransaction that gives back all it locked when a wait runs out, and
-- the delete tries again a moment later (about 20 s in all, within a client's usual 30 s
-- deadline, then lock_not_available:
-- UNAVAILABLE, nothing deleted). Claims and arrivals hold their locks for milliseconds.
CREATE OR REPLACE FUNCTION cyclone_limit_delete(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
    attempt integer := 0;
    existed boolean;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '50ms', true);
            DELETE FROM cyclone_limits WHERE name = p_name;
            existed := FOUND;
            -- Its fair clocks too, under the same timeout: a placement holds a clock, then
            -- takes a key of the limit (an arrival), which waits for the deleted row.
            DELETE FROM cyclone_fair_keys WHERE token LIKE replace(replace(p_name, '_', '\_'), '%', '\%') || chr(31) || '%';
            PERFORM set_config('lock_timeout', saved_lock_timeout, true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN  -- the subtransaction's locks and setting are undone
            attempt := attempt + 1;
            IF attempt >= 250 THEN
                RAISE;
            END IF;
        END;
        PERFORM pg_sleep(0.01 + 0.04 * random());
    END LOOP;
    IF NOT existed THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('cyclone_available', '');
    RETURN true;
END $$;

-- How the keys of the limits stand (Limits.GetLimit/ListLimits, /metrics, the console): per
-- key with running or waiting steps (or runs), the p_top busiest by running + waiting.
-- Reads every running and available step that has limits, and every active run with
-- limits of runs.
CREATE OR REPLACE FUNCTION cyclone_limit_keys_stats(p_name text, p_top integer)
RETURNS TABLE (limit_name text, key text, running bigint, waiting bigint, oldest_waiting_age interval,
               starts_in_window bigint)
LANGUAGE sql STABLE AS $$
    WITH steps AS (
        SELECT cyclone__token_limit(t) AS lname, cyclone__token_key(t) AS key,
               count(*) FILTER (WHERE s.state = 'running') AS running,
               count(*) FILTER (WHERE s.state = 'available') AS waiting,
               min(s.scheduled_at) FILTER (WHERE s.state = 'available' AND s.scheduled_at <= now()) AS oldest
          FROM cyclone_steps s CROSS JOIN unnest(s.limit_keys) AS t
         WHERE s.state IN ('running', 'available') AND s.limit_keys IS NOT NULL
           AND (p_name IS NULL OR cyclone__token_limit(t) = p_name)
         GROUP BY 1, 2
    ), runs AS (
        SELECT cyclone__token_limit(t) AS lname, cyclone__token_key(t) AS key,
               count(*) FILTER (WHERE r.limit_admitted) AS running,
               count(*) FILTER (WHERE NOT r.limit_admitted) AS waiting,
               min(r.created_at) FILTER (WHERE NOT r.limit_admitted) AS oldest
          FROM cyclone_runs r CROSS JOIN unnest(r.limit_keys) AS t
         WHERE r.state IN ('running', 'paused') AND r.limit_keys IS NOT NULL
           AND (p_name IS NULL OR cyclone__token_limit(t) = p_name)
         GROUP BY 1, 2
    ), ranked AS (
        SELECT x.*, row_number() OVER (PARTITION BY x.name ORDER BY x.running + x.waiting DESC, x.key) AS n
          FROM (SELECT l.name, st.key, st.running, st.waiting, st.oldest
                  FROM cyclone_limits l JOIN steps st ON st.lname = l.name AND l.scope = 'steps'
                UNION ALL
                SELECT l.name, ru.key, ru.running, ru.waiting, ru.oldest
                  FROM cyclone_limits l JOIN runs ru ON ru.lname = l.name AND l.scope = 'runs') x
    )
    SELECT k.name, k.key, k.running, k.waiting,
           COALESCE(greatest(now() - k.oldest, interval '0'), interval '0'),
           (SELECT count(*) FROM cyclone_limit_starts d JOIN cyclone_limits l ON l.name = d.limit_name
             WHERE d.limit_name = k.name AND d.key = k.key AND d.at > clock_timestamp() - cyclone__rate_window(l.period))
      FROM ranked k
     WHERE k.n <= p_top
     ORDER BY k.name, k.n
$$;

-- The rows flow control keeps per key, tidied (the servers' background work, every
-- LIMITS_TIDY_INTERVAL): starts that left their rate's window, the lock rows of keys with no
-- waiting step and a full bucket (cyclone__rate_left: `paced` passed), and the fair clocks of
-- keys with no step waiting in their kind, idle there (below). A claim creates again what it
-- needs; rows a claim holds are skipped. At most p_limit rows of each; returns how many went.
CREATE OR REPLACE FUNCTION cyclone_limits_tidy(p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    n integer;
    total integer := 0;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no available step)
BEGIN
    DELETE FROM cyclone_limit_starts d
     WHERE d.ctid = ANY (ARRAY(
        SELECT x.ctid FROM cyclone_limit_starts x
          LEFT JOIN cyclone_limits l ON l.name = x.limit_name
         WHERE l.name IS NULL OR l.rate IS NULL OR x.at <= clock_timestamp() - cyclone__rate_window(l.period)
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM cyclone_limit_keys k
     WHERE (k.limit_name, k.key) IN (
        SELECT x.limit_name, x.key FROM cyclone_limit_keys x
         WHERE (x.paced IS NULL OR x.paced <= clock_timestamp())
           AND NOT EXISTS (SELECT 1 FROM cyclone_steps s
                            WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.id >= live_lo
                              AND s.limit_keys @> ARRAY[cyclone__limit_token(x.limit_name, x.key)])
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    -- A key's clock in a kind, once no step of the key waits there, is idle when it is not
    -- ahead of the kind's virtual time (its next step would be placed there anyway), or when
    -- no limited step of the kind waits at all (its next steps are placed among the keys that
    -- arrive with them, from the kind's virtual time).
    DELETE FROM cyclone_fair_keys f
     WHERE (f.kind, f.token) IN (
        SELECT x.kind, x.token FROM cyclone_fair_keys x
          LEFT JOIN cyclone_fair_clocks c ON c.kind = x.kind
         WHERE NOT EXISTS (SELECT 1 FROM cyclone_steps s
                            WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.id >= live_lo
                              AND s.limit_keys @> ARRAY[x.token] AND s.kind = x.kind)
           AND (x.vclock <= COALESCE(c.vt, 0.0)
                OR NOT (EXISTS (SELECT 1 FROM cyclone_steps s
                                 WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
                                   AND s.kind = x.kind AND s.id >= live_lo)
                        OR EXISTS (SELECT 1 FROM cyclone_steps s
                                    WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NULL
                                      AND s.kind = x.kind AND s.id >= live_lo)))
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    RETURN total;
END $$;
