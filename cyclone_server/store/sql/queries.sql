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
                                               %(idempotency_key)s, %(request_hash)s, %(deadline)s,
                                               p_trace_context => %(trace_context)s);

-- name: job_enqueue
SELECT run_id, step_id, created FROM cyclone_job_enqueue(%(node)s, %(input)s, %(priority)s,
                                                          %(idempotency_key)s, %(request_hash)s,
                                                          %(deadline)s, %(scheduled_at)s,
                                                          p_trace_context => %(trace_context)s);

-- name: jobs_enqueue
-- The ids as text: what the Enqueue responses carry.
SELECT idx, run_id::text AS run_id, step_id::text AS step_id, created FROM cyclone_jobs_enqueue(%(jobs)s::jsonb) ORDER BY idx;

-- name: steps_claim
SELECT * FROM cyclone_steps_claim(%(owner)s, %(kinds)s, %(limit)s, %(lease_ttl)s);

-- name: steps_claim_leases
SELECT * FROM cyclone_leases_claim_rated(%(owner)s, %(kinds)s, %(limit)s, %(lease_ttl)s);

-- name: limit_starts_pushed
SELECT cyclone_limit_starts_pushed(%(ids)s::uuid[]);

-- name: jobs_enqueue_claim
SELECT * FROM cyclone_jobs_enqueue_claim_rated(%(jobs)s::jsonb, %(owner)s, %(kinds)s, %(limit)s, %(lease_ttl)s);

-- name: results_apply
-- %(results)s is the batch as JSON text (Engine.apply_results writes it).
SELECT idx, status, ended_child_run, available
  FROM cyclone_results_apply(%(results)s::jsonb, %(max_output_bytes)s);

-- name: child_runs_settle
SELECT step_id, outcome, ended_child_run FROM cyclone_child_runs_settle(%(run_ids)s);

-- name: steps_next_due
SELECT cyclone_steps_next_due(%(kinds)s::text[]) AS seconds;

-- name: step_complete
SELECT cyclone_step_complete(%(step_id)s, %(generation)s, %(output)s, %(max_output_bytes)s) AS status;

-- name: step_fail
SELECT cyclone_step_fail(%(step_id)s, %(generation)s, %(message)s, %(permanent)s, %(retry_delay)s,
                         %(details)s) AS status;

-- name: step_snooze
SELECT cyclone_step_snooze(%(step_id)s, %(generation)s, %(delay)s) AS status;

-- name: leases_renew
SELECT step_id, lease_generation FROM cyclone_leases_renew(%(owner)s, %(step_ids)s, %(generations)s, %(lease_ttl)s);

-- name: ping
SELECT 1 AS one;

-- name: steps_lease_outcome
-- What a step holds of the lease it last had, to tell whether a result whose commit was in
-- doubt did commit (StepStore.in_doubt_statuses).
SELECT id, state, lease_generation, error_kind, reason, errors -> -1 AS last_error, output
  FROM cyclone_steps WHERE id = ANY(%(step_ids)s);

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

-- name: history_sweep_lock
SELECT pg_try_advisory_lock(hashtextextended('cyclone.history.sweep', 0)) AS locked;

-- name: history_sweep_unlock
SELECT pg_advisory_unlock(hashtextextended('cyclone.history.sweep', 0)) AS unlocked;

-- name: history_next
SELECT d.lo, clock_timestamp() AS read_at FROM cyclone__history_day_next(%(age)s, %(after)s) d;

-- name: history_read
SELECT runs, blocked, next_page FROM cyclone__history_day_read(%(lo)s, %(age)s, true, %(page)s, %(pages)s);

-- name: history_detach_part
SELECT cyclone_history_detach_part(%(lo)s, %(table)s, %(read_at)s) AS done;

-- name: history_drop_detached
SELECT cyclone_history_drop_detached(%(lo)s) AS gone;

-- name: history_tidy
SELECT cyclone_history_tidy(%(limit)s) AS deleted;

-- name: history_ensure
SELECT cyclone_history_ensure() AS made;

-- name: history_unsettled
SELECT d.lo FROM cyclone__history_days_unsettled(now()) AS d (lo);

-- name: history_settle
SELECT cyclone__history_day_settle(%(lo)s) AS settled;

-- name: history_days
-- The partitions of each of cyclone_runs, cyclone_steps and cyclone_step_deps: the days of
-- history, the days made ahead, and the first partition.
SELECT count(*)::integer AS days FROM cyclone_history_days;

-- name: history_live_days
-- The days the claim and the sweeps read (cyclone__live_floor): the first not settled on.
SELECT count(*)::integer AS days FROM cyclone_history_days WHERE lo >= cyclone__live_floor();

-- name: runs_purge_count
SELECT cyclone_runs_purge_count(%(age)s) AS eligible;

-- name: run_get
SELECT * FROM cyclone_runs WHERE id = %(run_id)s;

-- name: read_snapshot
-- First statement of a read transaction: every later statement of it sees one snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: runs_steps
-- The steps of some runs (a page of ListRuns, or one run), each run's in definition order.
-- held_by: why a limit holds an available step (cyclone__step_held).
SELECT s.*,
       ARRAY(SELECT p.node FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
              WHERE d.step_id = s.id ORDER BY p.node) AS deps,
       CASE WHEN s.state = 'available' AND s.limit_keys IS NOT NULL THEN cyclone__step_held(s) END AS held_by
  FROM cyclone_steps s WHERE s.run_id = ANY (%(run_ids)s) ORDER BY s.run_id, s.position, s.id;

-- name: runs_states
SELECT id, state FROM cyclone_runs WHERE id = ANY (%(run_ids)s);

-- name: runs_list
SELECT * FROM cyclone_runs
 WHERE (cardinality(%(states)s::text[]) = 0 OR state = ANY (%(states)s))
   AND (%(workflow)s::text IS NULL OR workflow_name = %(workflow)s)
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
   AND (%(id_min)s::uuid IS NULL OR id BETWEEN %(id_min)s AND %(id_max)s)
   AND (%(after_id)s::uuid IS NULL OR (created_at, id) < (%(after_created)s, %(after_id)s))
   AND (%(schedule)s::text IS NULL OR schedule_name = %(schedule)s)
   AND (%(schedule_fire_at)s::timestamptz IS NULL OR schedule_fire_at = %(schedule_fire_at)s)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: kinds_stats
-- The backlog of each kind with steps, and the live workers serving it (cyclone_workers).
SELECT v.kind, v.available, v.scheduled, v.running, v.oldest_available_age,
       COALESCE(w.workers, 0) AS workers, COALESCE(w.free_slots, 0) AS free_slots
  FROM cyclone_v_kinds v
  LEFT JOIN LATERAL (SELECT count(*) AS workers, sum(greatest(x.slots - x.leases_held, 0)) AS free_slots
                       FROM cyclone_workers x
                      WHERE x.kinds @> ARRAY[v.kind] AND x.expires_at > now()) w ON true
 ORDER BY v.kind;

-- name: workers_beat
SELECT cyclone_workers_beat(%(server_id)s, %(workers)s, %(grace)s, %(takeover)s) AS written;

-- name: workers_list
-- The live workers of every server, optionally only those serving one kind.
SELECT worker_id, server_id, sdk, kinds, slots, leases_held, connected_at, heartbeat_at, expires_at
  FROM cyclone_workers
 WHERE expires_at > now() AND (%(kind)s::text IS NULL OR kinds @> ARRAY[%(kind)s::text])
 ORDER BY worker_id;

-- name: runs_ended
-- Runs that ended after %(since)s and at least %(lag)s ago (a transaction that ended a run
-- may commit after its finished_at), by workflow and state, and that bound (`until`): the
-- next call's `since`. With `since` NULL, only the bound. An index range scan of
-- cyclone_runs_finished over the runs that ended since the last call.
WITH b AS (SELECT now() - %(lag)s::interval AS until)
SELECT r.workflow_name AS workflow, r.state, count(r.id) AS n, b.until
  FROM b
  LEFT JOIN cyclone_runs r
    ON r.state IN ('completed', 'failed', 'cancelled')
   AND r.finished_at > %(since)s::timestamptz AND r.finished_at <= b.until
 GROUP BY r.workflow_name, r.state, b.until;

-- Schedules (functions/70_schedules.sql; fire times come from schedule_spec.py).

-- name: schedule_target_check
SELECT cyclone_schedule_target_check(%(target)s) AS checked;

-- name: schedule_insert
-- A new schedule; nothing when the name is taken (the engine then compares settings_hash).
INSERT INTO cyclone_schedules AS c (name, target, spec, settings_hash, start_at, end_at, jitter, note, overlap,
                                    catchup_window, paused, next_fire_at, next_due_at)
VALUES (%(name)s, %(target)s, %(spec)s, %(settings_hash)s, %(start_at)s, %(end_at)s, %(jitter)s, %(note)s,
        %(overlap)s, %(catchup_window)s, %(paused)s, %(next_fire_at)s, %(next_due_at)s)
ON CONFLICT (name) DO NOTHING
RETURNING c.*;

-- name: schedule_update
-- New settings; the counters, the pause and a buffered fire time are kept.
UPDATE cyclone_schedules
   SET target = %(target)s, spec = %(spec)s, settings_hash = %(settings_hash)s, start_at = %(start_at)s,
       end_at = %(end_at)s, jitter = %(jitter)s, note = %(note)s, overlap = %(overlap)s,
       catchup_window = %(catchup_window)s, next_fire_at = %(next_fire_at)s, next_due_at = %(next_due_at)s,
       updated_at = now()
 WHERE name = %(name)s
RETURNING *;

-- name: schedule_get
SELECT * FROM cyclone_schedules WHERE name = %(name)s;

-- name: schedule_recent_runs
-- The latest runs of a schedule, newest first.
SELECT id, state, schedule_fire_at, created_at, finished_at FROM cyclone_runs
 WHERE schedule_name = %(name)s
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: schedules_list
SELECT * FROM cyclone_schedules
 WHERE name LIKE %(prefix)s || '%%' AND (%(after)s::text IS NULL OR name > %(after)s)
 ORDER BY name
 LIMIT %(limit)s;

-- name: schedule_pause
UPDATE cyclone_schedules SET paused = true, updated_at = now() WHERE name = %(name)s AND NOT paused RETURNING name;

-- name: schedule_resume
-- From paused only: the next fire time is computed anew from now (fire times that passed
-- while paused are neither started nor counted).
UPDATE cyclone_schedules
   SET paused = false, next_fire_at = %(next_fire_at)s, next_due_at = %(next_due_at)s, updated_at = now()
 WHERE name = %(name)s AND paused AND spec = %(spec)s
RETURNING name;

-- name: schedule_delete
DELETE FROM cyclone_schedules WHERE name = %(name)s RETURNING name;

-- name: schedules_changed
-- Wakes the schedulers of every server (notify.py): a schedule was made, changed or resumed.
SELECT pg_notify('cyclone_schedules', '');

-- name: schedules_due
-- The schedules whose next fire time is due, earliest first.
-- db_now: the scheduler decides with the database's clock, as the due check does.
SELECT name, spec, start_at, end_at, jitter, catchup_window, next_fire_at, next_due_at, now() AS db_now
  FROM cyclone_schedules
 WHERE NOT paused AND next_due_at <= now()
 ORDER BY next_due_at
 LIMIT %(limit)s;

-- name: schedules_next_due
-- Seconds until the earliest due time of a schedule that is not paused, and whether any
-- fire time is buffered (the scheduler then also wakes when runs end).
SELECT (SELECT extract(epoch FROM next_due_at - now())::float8 FROM cyclone_schedules
          WHERE NOT paused AND next_due_at IS NOT NULL ORDER BY next_due_at LIMIT 1) AS seconds,
       EXISTS (SELECT 1 FROM cyclone_schedules WHERE buffered_fire_at IS NOT NULL) AS buffered;

-- name: schedule_fire
SELECT outcome, run_id, detail FROM cyclone_schedule_fire(%(name)s, %(expected)s, %(missed)s, %(fire_at)s,
                                                           %(next_fire_at)s, %(next_due_at)s);

-- name: schedule_trigger
SELECT outcome, run_id, fire_at FROM cyclone_schedule_trigger(%(name)s, %(policy)s);

-- name: schedules_release
SELECT name, fire_at, run_id FROM cyclone_schedules_release(%(limit)s);

-- name: limit_set
SELECT cyclone_limit_set(%(limit)s::jsonb) AS created;

-- name: limit_delete
SELECT cyclone_limit_delete(%(name)s) AS deleted;

-- name: limits_tidy
SELECT cyclone_limits_tidy(%(limit)s) AS removed;

-- name: limits_list
SELECT name, max_running, rate, extract(epoch FROM period)::float8 AS period, strategy, scope, kinds,
       workflows, key_path, key_const, weights, created_at, updated_at
  FROM cyclone_limits WHERE %(name)s::text IS NULL OR name = %(name)s ORDER BY name;

-- name: limit_keys_stats
SELECT * FROM cyclone_limit_keys_stats(%(name)s, %(top)s);
