-- Flow control: concurrency limits per key, rate limits per key, fair dispatch across keys
-- (docs/flow-control.md; the claim is cyclone_steps_claim, the rules are in
-- functions/15_limits.sql).
--
-- A limit is a named row of cyclone_limits. A step consumes a limit under a key: the
-- pair is a token, "<limit name>\x1f<key>", and a step's tokens (limit_keys) are worked out
-- once, when its run is submitted or its job enqueued, from the node's own limits, the
-- limits that name its kind, and the limits that name its run's workflow (scope 'runs').
-- A step without tokens (limit_keys NULL) is claimed exactly as before.
--
-- No counter is kept anywhere: a slot is a running step (or, for a limit of whole runs, an
-- admitted active run), so every path that ends a lease frees its slot by changing the
-- step's state, exactly once. A start against a rate is a row of cyclone_limit_starts.
CREATE TABLE cyclone_limits (
    name        text        PRIMARY KEY,
    -- At most this many running steps (scope 'steps') or admitted runs (scope 'runs') per key.
    max_running integer     CHECK (max_running > 0),
    -- At most `rate` starts (claims) per key in any window of `period`.
    rate        integer     CHECK (rate > 0),
    period      interval    CHECK (period > interval '0'),
    strategy    text        NOT NULL DEFAULT 'queue'
        CHECK (strategy IN ('queue', 'cancel_newest', 'cancel_oldest', 'keep_newest')),
    scope       text        NOT NULL DEFAULT 'steps' CHECK (scope IN ('steps', 'runs')),
    -- Every task step of these kinds consumes the limit (scope 'steps').
    kinds       text[]      NOT NULL DEFAULT '{}',
    -- Every run of these workflows consumes the limit (scope 'runs').
    workflows   text[]      NOT NULL DEFAULT '{}',
    -- The key of the steps and runs that kinds and workflows attach: a field path into
    -- the run input, or the constant key_const when key_path is NULL.
    key_path    text[],
    key_const   text        NOT NULL DEFAULT '',
    -- Fair-dispatch weight per key (1 when absent).
    weights     jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (period IS NULL))
);
CREATE INDEX cyclone_limits_kinds ON cyclone_limits USING gin (kinds);
CREATE INDEX cyclone_limits_workflows ON cyclone_limits USING gin (workflows);

-- One row per (limit, key) that a claim has met: the row the claims of that key lock, so
-- that the check and the claim of one key are serialized across every server. `paced`: for
-- a limit with a rate, when the key's starts will have caught up with the rate (the pace
-- that spreads them over the window; NULL: never started).
CREATE TABLE cyclone_limit_keys (
    limit_name text NOT NULL REFERENCES cyclone_limits (name) ON DELETE CASCADE ON UPDATE CASCADE,
    key        text NOT NULL,
    paced      timestamptz,
    PRIMARY KEY (limit_name, key)
);

-- The starts of the last period, per key of a limit with a rate.
CREATE TABLE cyclone_limit_starts (
    limit_name text        NOT NULL REFERENCES cyclone_limits (name) ON DELETE CASCADE ON UPDATE CASCADE,
    key        text        NOT NULL,
    at         timestamptz NOT NULL
);
CREATE INDEX cyclone_limit_starts_key ON cyclone_limit_starts (limit_name, key, at);

-- Fair dispatch: each key's virtual clock (where its next step is placed in the fair order),
-- and each kind's virtual time (the fair position of its last claimed step).
CREATE TABLE cyclone_fair_keys (
    token  text             PRIMARY KEY,
    vclock double precision NOT NULL
);
CREATE TABLE cyclone_fair_clocks (
    kind text             PRIMARY KEY,
    vt   double precision NOT NULL
);

ALTER TABLE cyclone_steps ADD COLUMN limit_keys text[];
-- The step's place in its kind's fair order while it is available and due (NULL: not yet due).
ALTER TABLE cyclone_steps ADD COLUMN fair_at double precision;
-- The tokens of the run's limits of scope 'runs', and whether the run holds their slot
-- (from the claim of its first step until it ends).
ALTER TABLE cyclone_runs ADD COLUMN limit_keys text[];
ALTER TABLE cyclone_runs ADD COLUMN limit_admitted boolean NOT NULL DEFAULT false;
ALTER TABLE cyclone_steps DROP CONSTRAINT cyclone_steps_cancel_cause_check;
ALTER TABLE cyclone_steps ADD CONSTRAINT cyclone_steps_cancel_cause_check
    CHECK (cancel_cause IN ('operator', 'fail_fast', 'branch', 'deadline', 'parent', 'limit'));

-- The claim index now holds only the steps without limits, so a kind whose steps wait for
-- a limit costs the others nothing. Steps with limits have their own: due ones in fair
-- order, the others by the time they become due.
CREATE INDEX cyclone_steps_claim_free ON cyclone_steps (kind, priority, scheduled_at, id)
    WHERE state = 'available' AND limit_keys IS NULL;
DROP INDEX cyclone_steps_claim;
CREATE INDEX cyclone_steps_claim_fair ON cyclone_steps (kind, priority, fair_at, id)
    WHERE state = 'available' AND limit_keys IS NOT NULL AND fair_at IS NOT NULL;
-- The same steps by their first token (the key that places them): a claim whose window of the
-- fair order is all held walks it key by key, one head step each (cyclone__limits_heads).
CREATE INDEX cyclone_steps_claim_heads ON cyclone_steps (kind, (limit_keys[1]), priority, fair_at, id)
    WHERE state = 'available' AND limit_keys IS NOT NULL AND fair_at IS NOT NULL;
CREATE INDEX cyclone_steps_claim_later ON cyclone_steps (kind, scheduled_at)
    WHERE state = 'available' AND limit_keys IS NOT NULL AND fair_at IS NULL;
-- Per token: the running steps (the slots taken) and the waiting ones.
CREATE INDEX cyclone_steps_limit_running ON cyclone_steps USING gin (limit_keys)
    WHERE state = 'running' AND limit_keys IS NOT NULL;
CREATE INDEX cyclone_steps_limit_waiting ON cyclone_steps USING gin (limit_keys)
    WHERE state = 'available' AND limit_keys IS NOT NULL;
-- Per token: the active runs, and those holding a slot.
CREATE INDEX cyclone_runs_limit_active ON cyclone_runs USING gin (limit_keys)
    WHERE state IN ('running', 'paused') AND limit_keys IS NOT NULL;
CREATE INDEX cyclone_runs_limit_admitted ON cyclone_runs USING gin (limit_keys)
    WHERE limit_admitted AND state IN ('running', 'paused');

-- The kinds view counts both claim indexes.
CREATE OR REPLACE VIEW cyclone_v_kinds AS
WITH RECURSIVE free (kind) AS (
    (SELECT s.kind FROM cyclone_steps s WHERE s.state = 'available' AND s.limit_keys IS NULL
      ORDER BY s.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT s.kind FROM cyclone_steps s
             WHERE s.state = 'available' AND s.limit_keys IS NULL AND s.kind > k.kind
             ORDER BY s.kind LIMIT 1)
      FROM free k
     WHERE k.kind IS NOT NULL
), limited (kind) AS (
    (SELECT s.kind FROM cyclone_steps s
      WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
      ORDER BY s.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT s.kind FROM cyclone_steps s
             WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NOT NULL
               AND s.kind > k.kind
             ORDER BY s.kind LIMIT 1)
      FROM limited k
     WHERE k.kind IS NOT NULL
), later (kind) AS (
    (SELECT s.kind FROM cyclone_steps s
      WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NULL
      ORDER BY s.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT s.kind FROM cyclone_steps s
             WHERE s.state = 'available' AND s.limit_keys IS NOT NULL AND s.fair_at IS NULL
               AND s.kind > k.kind
             ORDER BY s.kind LIMIT 1)
      FROM later k
     WHERE k.kind IS NOT NULL
), busy AS (
    SELECT s.kind, count(*) AS running FROM cyclone_steps s WHERE s.state = 'running' GROUP BY s.kind
), listed AS (
    SELECT k.kind FROM free k WHERE k.kind IS NOT NULL
    UNION
    SELECT k.kind FROM limited k WHERE k.kind IS NOT NULL
    UNION
    SELECT k.kind FROM later k WHERE k.kind IS NOT NULL
    UNION
    SELECT b.kind FROM busy b
)
SELECT l.kind,
       a.available + f.available + d.available AS available,
       COALESCE(b.running, 0) AS running,
       COALESCE(greatest(now() - least(a.oldest, f.oldest, d.oldest), interval '0'), interval '0')
           AS oldest_available_age,
       a.scheduled + d.scheduled AS scheduled
  FROM listed l
  LEFT JOIN busy b ON b.kind = l.kind
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE s.scheduled_at <= now()) AS available,
              count(*) FILTER (WHERE s.scheduled_at > now()) AS scheduled,
              min(s.scheduled_at) FILTER (WHERE s.scheduled_at <= now()) AS oldest
         FROM cyclone_steps s
        WHERE s.kind = l.kind AND s.state = 'available' AND s.limit_keys IS NULL) a
 CROSS JOIN LATERAL (
       SELECT count(*) AS available, min(s.scheduled_at) AS oldest
         FROM cyclone_steps s
        WHERE s.kind = l.kind AND s.state = 'available' AND s.limit_keys IS NOT NULL
          AND s.fair_at IS NOT NULL) f
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE s.scheduled_at <= now()) AS available,
              count(*) FILTER (WHERE s.scheduled_at > now()) AS scheduled,
              min(s.scheduled_at) FILTER (WHERE s.scheduled_at <= now()) AS oldest
         FROM cyclone_steps s
        WHERE s.kind = l.kind AND s.state = 'available' AND s.limit_keys IS NOT NULL
          AND s.fair_at IS NULL) d;
