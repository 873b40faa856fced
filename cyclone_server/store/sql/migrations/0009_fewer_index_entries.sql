-- Fewer index entries per transition.
--
-- No update of a step can be HOT: `state` is in the predicate of most of cyclone_steps'
-- partial indexes, and a HOT update needs every indexed column (predicates included) to
-- stay the same. So each transition writes one entry into every index whose predicate
-- holds for the new row version, and the indexes a transition touches are its cost. A
-- claim (available -> running) wrote 6: the primary key, (run_id, node), active_run,
-- active_kind, lease_expiry and attempt_deadline; a lease renewal the same 6.
--
-- 1. One index of running steps instead of two. The recovery sweep (lease expired) and the
--    attempt timeout (attempt_deadline passed) both look for running steps whose earlier
--    time has passed, so both range-scan an index on least(lease_expiry, attempt_deadline)
--    and check their own column on the rows it finds (cyclone_leases_sweep,
--    cyclone_attempts_timeout). While a step runs both columns are set (the claim sets them).
--    It also carries the kind, so cyclone_v_kinds counts running steps from it.
-- 2. No active_kind index: the claim index (kind, priority, scheduled_at, id) of available
--    steps gives cyclone_v_kinds its kinds (a loose scan), its counts and the oldest
--    available step (one range scan per kind, as the counts already were), and the
--    dispatcher's next due time (a loose scan over the kind's priorities). Steps entering
--    or leaving `available` no longer write it.
-- 3. cyclone_runs_workflow only for runs of a workflow: standalone jobs (workflow_name NULL)
--    wrote an entry into it when enqueued and again when they ended. The list filter
--    `workflow_name = x` implies the predicate.
--
-- A claim now writes 4 entries, a renewal 4, an enqueued step 4, and a job's run 3 when
-- created and 4 when it ends (bench/rowcost.py counts them).
--
-- Each new index is built before the one it replaces is dropped. Building one reads its
-- whole table and blocks writes to it meanwhile (seconds for a million rows). The index of
-- running steps holds only the running steps, so it stays small.
CREATE INDEX cyclone_steps_running ON cyclone_steps (least(lease_expiry, attempt_deadline)) INCLUDE (kind)
    WHERE state = 'running';
DROP INDEX cyclone_steps_lease_expiry;
DROP INDEX cyclone_steps_attempt_deadline;

CREATE OR REPLACE VIEW cyclone_v_kinds AS
WITH RECURSIVE kinds (kind) AS (
    (SELECT s.kind FROM cyclone_steps s WHERE s.state = 'available' ORDER BY s.kind LIMIT 1)
    UNION ALL
    SELECT (SELECT s.kind FROM cyclone_steps s
             WHERE s.state = 'available' AND s.kind > k.kind
             ORDER BY s.kind LIMIT 1)
      FROM kinds k
     WHERE k.kind IS NOT NULL
), busy AS (
    SELECT s.kind, count(*) AS running FROM cyclone_steps s WHERE s.state = 'running' GROUP BY s.kind
), listed AS (
    SELECT k.kind FROM kinds k WHERE k.kind IS NOT NULL
    UNION
    SELECT b.kind FROM busy b
)
SELECT l.kind,
       a.available,
       COALESCE(b.running, 0) AS running,
       COALESCE(greatest(now() - a.oldest, interval '0'), interval '0') AS oldest_available_age,
       a.scheduled
  FROM listed l
  LEFT JOIN busy b ON b.kind = l.kind
 CROSS JOIN LATERAL (
       -- One scan of the kind's available range: both counts and the oldest claimable.
       SELECT count(*) FILTER (WHERE s.scheduled_at <= now()) AS available,
              count(*) FILTER (WHERE s.scheduled_at > now()) AS scheduled,
              min(s.scheduled_at) FILTER (WHERE s.scheduled_at <= now()) AS oldest
         FROM cyclone_steps s
        WHERE s.kind = l.kind AND s.state = 'available') a;

DROP INDEX cyclone_steps_active_kind;

CREATE INDEX cyclone_runs_workflow_named ON cyclone_runs (workflow_name, created_at)
    WHERE workflow_name IS NOT NULL;
DROP INDEX cyclone_runs_workflow;
