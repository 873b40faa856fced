-- cyclone_v_kinds counted as available the steps waiting for a future scheduled_at (a
-- backoff, a snooze, Enqueue's scheduled_at): they are not backlog (docs/lifecycle.md, "Backlog
-- and scheduled"). Now `available` counts only the steps claimable now (scheduled_at reached, as
-- cyclone_steps_claim asks) and `scheduled` the others. The kinds listed are unchanged
-- (those with available or running steps, scheduled ones included).
-- Still all from cyclone_steps_active_kind (kind, state, scheduled_at), with the same scans.
CREATE OR REPLACE VIEW cyclone_v_kinds AS
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
       a.available,
       (SELECT count(*) FROM cyclone_steps s
         WHERE s.kind = k.kind AND s.state = 'running') AS running,
       COALESCE(greatest(now() - (SELECT min(s.scheduled_at) FROM cyclone_steps s
                                   WHERE s.kind = k.kind AND s.state = 'available'
                                     AND s.scheduled_at <= now()), interval '0'),
                interval '0') AS oldest_available_age,
       -- A new column goes last: CREATE OR REPLACE VIEW keeps the existing ones in place.
       a.scheduled
  FROM kinds k
 CROSS JOIN LATERAL (
       -- One scan of the kind's available range counts both sides of now(), as the view
       -- counted all of it before: splitting it costs nothing.
       SELECT count(*) FILTER (WHERE s.scheduled_at <= now()) AS available,
              count(*) FILTER (WHERE s.scheduled_at > now()) AS scheduled
         FROM cyclone_steps s
        WHERE s.kind = k.kind AND s.state = 'available') a
 WHERE k.kind IS NOT NULL;
