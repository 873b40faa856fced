-- Every statement the engine runs, by name. The transitions themselves are SQL functions
-- (functions/*.sql); these call them, or read.

-- name: workflow_register
SELECT version, created, created_at FROM cyclone_workflow_register(%(name)s, %(definition)s);

-- name: workflow_get
SELECT name, version, definition, created_at FROM cyclone_workflows
 WHERE name = %(name)s AND (%(version)s = 0 OR version = %(version)s)
 ORDER BY version DESC LIMIT 1;

-- name: workflow_list
SELECT DISTINCT ON (name, CASE WHEN %(all_versions)s THEN version END)
       name, version, definition, created_at
  FROM cyclone_workflows
 WHERE name LIKE %(prefix)s || '%%'
 ORDER BY name, CASE WHEN %(all_versions)s THEN version END, version DESC;

-- name: run_submit
SELECT run_id, created FROM cyclone_run_submit(%(workflow)s, %(version)s, %(input)s, %(priority)s,
                                               %(idempotency_key)s, %(request_hash)s, %(deadline)s);

-- name: job_enqueue
SELECT run_id, step_id, created FROM cyclone_job_enqueue(%(node)s, %(input)s, %(priority)s,
                                                          %(idempotency_key)s, %(request_hash)s,
                                                          %(deadline)s, %(scheduled_at)s);

-- name: jobs_enqueue
SELECT idx, run_id, step_id, created FROM cyclone_jobs_enqueue(%(jobs)s) ORDER BY idx;

-- name: steps_claim
SELECT * FROM cyclone_steps_claim(%(owner)s, %(kinds)s, %(limit)s, %(lease_ttl)s);

-- name: results_apply
SELECT idx, step_id, lease_generation, status, ended_child_run
  FROM cyclone_results_apply(%(results)s, %(max_output_bytes)s);

-- name: child_runs_settle
SELECT step_id, outcome, ended_child_run FROM cyclone_child_runs_settle(%(run_ids)s);

-- name: steps_next_due
-- Seconds until the first available step of these kinds whose scheduled_at is still ahead
-- becomes claimable (NULL: none). From cyclone_steps_claim (kind, priority, scheduled_at):
-- per kind, a loose scan over its priorities, then one index probe per priority.
SELECT extract(epoch FROM min(n.at) - now())::float8 AS seconds
  FROM unnest(%(kinds)s::text[]) AS k (kind)
 CROSS JOIN LATERAL (
       WITH RECURSIVE p (priority) AS (
           (SELECT s.priority FROM cyclone_steps s
             WHERE s.kind = k.kind AND s.state = 'available' ORDER BY s.priority LIMIT 1)
           UNION ALL
           SELECT (SELECT s.priority FROM cyclone_steps s
                    WHERE s.kind = k.kind AND s.state = 'available' AND s.priority > p.priority
                    ORDER BY s.priority LIMIT 1)
             FROM p WHERE p.priority IS NOT NULL)
       SELECT (SELECT s.scheduled_at FROM cyclone_steps s
                WHERE s.kind = k.kind AND s.state = 'available' AND s.priority = p.priority
                  AND s.scheduled_at > now()
                ORDER BY s.scheduled_at LIMIT 1) AS at
         FROM p WHERE p.priority IS NOT NULL) n;

-- name: step_complete
SELECT cyclone_step_complete(%(step_id)s, %(generation)s, %(output)s, %(max_output_bytes)s) AS status;

-- name: step_fail
SELECT cyclone_step_fail(%(step_id)s, %(generation)s, %(message)s, %(permanent)s, %(retry_delay)s) AS status;

-- name: step_snooze
SELECT cyclone_step_snooze(%(step_id)s, %(generation)s, %(delay)s) AS status;

-- name: leases_renew
SELECT step_id, lease_generation FROM cyclone_leases_renew(%(owner)s, %(step_ids)s, %(generations)s, %(lease_ttl)s);

-- name: leases_release
SELECT step_id, outcome FROM cyclone_leases_release(%(owner)s, %(step_ids)s, %(generations)s);

-- name: leases_sweep
SELECT step_id, outcome FROM cyclone_leases_sweep(%(limit)s);

-- name: attempts_timeout
SELECT step_id, outcome FROM cyclone_attempts_timeout(%(limit)s);

-- name: timers_fire
SELECT step_id, outcome FROM cyclone_timers_fire(%(limit)s);

-- name: waits_expire
SELECT step_id, outcome FROM cyclone_waits_expire(%(limit)s);

-- name: deadlines_expire
SELECT run_id, outcome FROM cyclone_deadlines_expire(%(limit)s);

-- name: children_start
SELECT step_id, outcome FROM cyclone_children_start(%(limit)s);

-- name: children_settle
SELECT step_id, outcome FROM cyclone_children_settle(%(limit)s);

-- name: run_cancel
SELECT cyclone_run_cancel(%(run_id)s) AS applied;

-- name: run_pause
SELECT cyclone_run_pause(%(run_id)s) AS applied;

-- name: run_resume
SELECT cyclone_run_resume(%(run_id)s) AS applied;

-- name: run_retry
SELECT cyclone_run_retry(%(run_id)s, %(node)s, %(deadline)s) AS applied;

-- name: run_signal
SELECT signal_id, consumed_by FROM cyclone_run_signal(%(run_id)s, %(name)s, %(payload)s);

-- name: runs_purge
SELECT cyclone_runs_purge(%(age)s, %(limit)s, %(sweep)s) AS deleted;

-- name: run_get
SELECT * FROM cyclone_runs WHERE id = %(run_id)s;

-- name: read_snapshot
-- First statement of a read transaction: every later statement of it sees one snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: runs_steps
-- The steps of some runs (a page of ListRuns, or one run), each run's in definition order.
SELECT s.*,
       ARRAY(SELECT p.node FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
              WHERE d.step_id = s.id ORDER BY p.node) AS deps
  FROM cyclone_steps s WHERE s.run_id = ANY (%(run_ids)s) ORDER BY s.run_id, s.position, s.id;

-- name: runs_states
SELECT id, state FROM cyclone_runs WHERE id = ANY (%(run_ids)s);

-- name: runs_list
SELECT * FROM cyclone_runs
 WHERE (cardinality(%(states)s::text[]) = 0 OR state = ANY (%(states)s))
   AND (%(workflow)s::text IS NULL OR workflow_name = %(workflow)s)
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
   AND (%(after_id)s::uuid IS NULL OR (created_at, id) < (%(after_created)s, %(after_id)s))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: kinds_stats
SELECT kind, available, scheduled, running, oldest_available_age FROM cyclone_v_kinds ORDER BY kind;
