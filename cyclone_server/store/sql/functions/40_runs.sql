-- Operator and service actions on a run: Cancel, Pause, Resume, Retry / RetryAll, Signal.
-- Each returns whether it changed anything: an action on a run already in the state it asks
-- for changes nothing; an action the state forbids raises CY409 (FAILED_PRECONDITION).

-- running | paused -> cancelled; every non-terminal step cancelled, and the active child
-- runs of its child nodes with them, in one transaction.
CREATE OR REPLACE FUNCTION cyclone_run_cancel(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run(p_run_id);
BEGIN
    IF r.state = 'cancelled' THEN
        RETURN false;
    ELSIF r.state NOT IN ('running', 'paused') THEN
        RAISE EXCEPTION 'run % is %: only a running or paused run can be cancelled', r.id, r.state
            USING ERRCODE = 'CY409';
    END IF;
    PERFORM cyclone__steps_cancel(r.id, NULL, 'operator', NULL);
    PERFORM cyclone__run_end(r.id, 'cancelled');
    RETURN true;
END $$;

-- running -> paused. Available steps and the waits move to paused; the timers, max_wait and
-- the run deadline keep the time they had left. Running steps go on under their lease.
CREATE OR REPLACE FUNCTION cyclone_run_pause(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run(p_run_id);
BEGIN
    IF r.state = 'paused' THEN
        RETURN false;
    ELSIF r.state <> 'running' THEN
        RAISE EXCEPTION 'run % is %: only a running run can be paused', r.id, r.state
            USING ERRCODE = 'CY409';
    END IF;
    UPDATE cyclone_steps
       SET state = 'paused',
           timer_left = CASE WHEN state = 'waiting_timer' THEN greatest(timer_at - now(), interval '0') END,
           max_wait_left = CASE WHEN max_wait_at IS NOT NULL AND state <> 'available'
                                THEN greatest(max_wait_at - now(), interval '0') END
     WHERE run_id = r.id AND state IN ('available', 'waiting_signal', 'waiting_timer', 'waiting_child');
    UPDATE cyclone_runs
       SET state = 'paused', paused_at = now(), updated_at = now(),
           -- greatest() skips NULLs: without the CASE a run with no deadline would keep
           -- 0 s left and fail by "deadline" at Resume.
           deadline_left = CASE WHEN deadline_at IS NOT NULL THEN greatest(deadline_at - now(), interval '0') END
     WHERE id = r.id;
    RETURN true;
END $$;

-- paused -> running. Each paused step goes back to the state of its kind with the time its
-- timers had left; pending steps whose deps completed during the pause are promoted;
-- signals stored during the pause are delivered; child runs that ended during the pause
-- end their nodes.
CREATE OR REPLACE FUNCTION cyclone_run_resume(p_run_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run(p_run_id);
    sid uuid;
BEGIN
    IF r.state <> 'paused' THEN
        RAISE EXCEPTION 'run % is %: only a paused run can be resumed', r.id, r.state
            USING ERRCODE = 'CY409';
    END IF;
    UPDATE cyclone_runs
       SET state = 'running', paused_at = NULL, updated_at = now(),
           deadline_at = CASE WHEN deadline_left IS NOT NULL THEN now() + deadline_left ELSE deadline_at END,
           deadline_left = NULL
     WHERE id = r.id;
    UPDATE cyclone_steps
       SET state = cyclone__entry_state(type),
           timer_at = CASE WHEN timer_left IS NOT NULL THEN now() + timer_left ELSE timer_at END,
           max_wait_at = CASE WHEN max_wait_left IS NOT NULL THEN now() + max_wait_left ELSE max_wait_at END,
           timer_left = NULL, max_wait_left = NULL
     WHERE run_id = r.id AND state = 'paused';
    IF EXISTS (SELECT 1 FROM cyclone_steps WHERE run_id = r.id AND state = 'available') THEN
        PERFORM cyclone__notify_available();
    END IF;
    FOR sid IN
        SELECT s.id FROM cyclone_steps s JOIN cyclone_runs c ON c.id = s.child_run_id
         WHERE s.run_id = r.id AND s.state = 'waiting_child'
           AND c.state IN ('completed', 'failed', 'cancelled')
         ORDER BY s.id
    LOOP
        PERFORM cyclone__child_settle(r.id, sid);
    END LOOP;
    PERFORM cyclone__signals_deliver(r.id);
    PERFORM cyclone__promote(r.id);
    RETURN true;
END $$;

-- Reopen discarded steps (p_node: that one; NULL: all of them) of a running, paused or
-- failed run. A reopened node gets a fresh attempt budget (attempt 1, reclaims 0; its error
-- history stays). The steps that the reopened discards cancelled (fail-fast, branch) reopen
-- with their attempt and reclaims; so do the steps a run deadline cancelled, when the run is
-- retried with a new deadline. Steps cancelled by an operator never reopen. A failed run
-- returns to running; in a paused run the reopened steps go to paused.
CREATE OR REPLACE FUNCTION cyclone__run_reopen(p_run_id uuid, p_node text, p_deadline timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs;
    s cyclone_steps;
    targets uuid[];
    reopened uuid[];
    recancelled integer;
BEGIN
    -- Its day first: a run may leave a terminal state below (65_history.sql, settled days).
    PERFORM cyclone__history_unsettle(p_run_id);
    SELECT * INTO r FROM cyclone_runs WHERE id = p_run_id;
    IF r.state NOT IN ('running', 'paused', 'failed') THEN
        RAISE EXCEPTION 'run % is %: only a running, paused or failed run can be retried', r.id, r.state
            USING ERRCODE = 'CY409';
    END IF;
    IF r.state = 'failed' AND r.failed_by_deadline AND p_deadline IS NULL THEN
        RAISE EXCEPTION 'run % failed by its deadline: retry it with a new deadline', r.id
            USING ERRCODE = 'CY409';
    END IF;

    IF p_node IS NOT NULL THEN
        SELECT * INTO s FROM cyclone_steps WHERE run_id = r.id AND node = p_node;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'node "%" not found in run %', p_node, r.id USING ERRCODE = 'CY404';
        ELSIF s.state <> 'discarded' THEN
            RAISE EXCEPTION 'node "%" is %: only a discarded step can be retried', p_node, s.state
                USING ERRCODE = 'CY409';
        END IF;
        targets := ARRAY[s.id];
        -- Reopening a contained discard of a failed run would leave the discard that failed
        -- it in place: the run could then complete past an uncontained failure.
        IF r.state = 'failed' AND NOT r.failed_by_deadline AND r.failed_by_step IS DISTINCT FROM s.id THEN
            RAISE EXCEPTION 'run % failed because node "%" was discarded: retry that node, or retry all',
                r.id, (SELECT node FROM cyclone_steps WHERE id = r.failed_by_step) USING ERRCODE = 'CY409';
        END IF;
    ELSE
        SELECT array_agg(id) INTO targets FROM cyclone_steps WHERE run_id = r.id AND state = 'discarded';
    END IF;
    IF r.state = 'failed' AND r.failed_by_deadline THEN
        -- Undo the whole deadline failure: every wait it discarded, every step it cancelled.
        SELECT array_agg(DISTINCT id) INTO targets FROM cyclone_steps
         WHERE run_id = r.id
           AND (id = ANY (COALESCE(targets, '{}')) OR (state = 'discarded' AND reason = 'deadline'));
    END IF;
    IF targets IS NULL AND NOT (r.state = 'failed' AND r.failed_by_deadline) THEN
        RAISE EXCEPTION 'run % has no discarded step to retry', r.id USING ERRCODE = 'CY409';
    END IF;

    WITH re AS (
        UPDATE cyclone_steps
           SET state = 'pending',
               attempt = CASE WHEN state = 'discarded' THEN 1 ELSE attempt END,
               reclaims = CASE WHEN state = 'discarded' THEN 0 ELSE reclaims END,
               error_kind = NULL, reason = NULL, cancel_cause = NULL, cancelled_by = NULL,
               finished_at = NULL, attempt_deadline = NULL,
               wait_started_at = NULL, timer_at = NULL, max_wait_at = NULL
         WHERE run_id = r.id
           AND ((state = 'discarded' AND id = ANY (COALESCE(targets, '{}')))
                OR (state = 'cancelled' AND cancel_cause IN ('fail_fast', 'branch')
                    AND cancelled_by = ANY (COALESCE(targets, '{}')))
                OR (state = 'cancelled' AND cancel_cause = 'deadline' AND r.failed_by_deadline))
        RETURNING id
    )
    SELECT array_agg(id) INTO reopened FROM re;

    -- A reopened step that still depends on a discard left in place (another contained
    -- discard: retried alone, this one does not reopen it) stays cancelled by that branch,
    -- and so do its own reopened dependents.
    LOOP
        WITH again AS (
            UPDATE cyclone_steps st
               SET state = 'cancelled', cancel_cause = 'branch', finished_at = now(),
                   cancelled_by = (SELECT CASE WHEN p.state = 'discarded' THEN p.id ELSE p.cancelled_by END
                                     FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                                    WHERE d.step_id = st.id AND p.state IN ('discarded', 'cancelled')
                                    ORDER BY p.id LIMIT 1)
             WHERE st.id = ANY (COALESCE(reopened, '{}')) AND st.state = 'pending'
               AND EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = st.id AND p.state IN ('discarded', 'cancelled'))
            RETURNING 1
        )
        SELECT count(*) INTO recancelled FROM again;
        EXIT WHEN recancelled = 0;
    END LOOP;

    UPDATE cyclone_runs
       SET state = CASE WHEN state = 'failed' THEN 'running' ELSE state END,
           finished_at = NULL, result = NULL, failed_by_step = NULL, failed_by_deadline = false,
           deadline_at = COALESCE(p_deadline, deadline_at),
           deadline_left = CASE WHEN state = 'paused' AND p_deadline IS NOT NULL
                                THEN greatest(p_deadline - now(), interval '0') ELSE deadline_left END,
           updated_at = now()
     WHERE id = r.id
    RETURNING * INTO r;

    IF r.state = 'running' THEN
        -- Reopened child nodes start waiting on their child runs in this transaction too:
        -- a failed child run is reopened, a completed one gives its result, a cancelled one
        -- is replaced (cyclone__child_attach).
        PERFORM cyclone__promote(r.id);
    ELSE
        -- Paused: a reopened task or wait whose deps are done waits in paused, with its full
        -- timers; a child node stays pending, and Resume promotes it.
        UPDATE cyclone_steps st
           SET state = 'paused', scheduled_at = now(),
               wait_started_at = CASE WHEN st.type <> 'task' THEN now() END,
               timer_left = st.sleep_for, max_wait_left = st.max_wait
         WHERE st.id = ANY (COALESCE(reopened, '{}')) AND st.type <> 'child'
           AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = st.id AND p.state <> 'completed');
    END IF;
    RETURN true;
END $$;

-- A child run may run again only while its parent node still waits for it: once that node
-- ended (discarded, cancelled), the child run belongs to a closed node, and the Retry of that
-- node is what reopens it (docs/lifecycle.md, "Reopened child runs"). The parent run is locked first (lock order), so
-- the parent's scanner cannot end the node between this check and the reopen.
CREATE OR REPLACE FUNCTION cyclone_run_retry(p_run_id uuid, p_node text, p_deadline timestamptz DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    parent_id uuid := (SELECT parent_run_id FROM cyclone_runs WHERE id = p_run_id);
    r cyclone_runs;
    pn cyclone_steps;
BEGIN
    IF parent_id IS NOT NULL THEN
        PERFORM 1 FROM cyclone_runs WHERE id = parent_id FOR NO KEY UPDATE;
    END IF;
    r := cyclone__lock_run(p_run_id);
    IF parent_id IS NOT NULL AND r.state IN ('running', 'paused', 'failed') THEN
        SELECT * INTO pn FROM cyclone_steps WHERE id = r.parent_step_id;
        IF pn.child_run_id IS DISTINCT FROM r.id OR pn.state NOT IN ('waiting_child', 'paused') THEN
            RAISE EXCEPTION 'run % is the child run of node "%" of run %, which is %: retry that node instead',
                r.id, pn.node, parent_id, COALESCE(pn.state, 'deleted') USING ERRCODE = 'CY409';
        END IF;
    END IF;
    RETURN cyclone__run_reopen(p_run_id, p_node, p_deadline);
END $$;

-- Write a signal to the run's mailbox (a running or paused run). In a running run a waiting
-- signal node takes it at once; in a paused run it waits for Resume.
CREATE OR REPLACE FUNCTION cyclone_run_signal(p_run_id uuid, p_name text, p_payload jsonb)
RETURNS TABLE (signal_id uuid, consumed_by uuid)
LANGUAGE plpgsql AS $$
DECLARE
    r cyclone_runs := cyclone__lock_run(p_run_id);
    sid uuid;
BEGIN
    IF r.state NOT IN ('running', 'paused') THEN
        RAISE EXCEPTION 'run % is %: only a running or paused run takes signals', r.id, r.state
            USING ERRCODE = 'CY409';
    END IF;
    INSERT INTO cyclone_signals (id, run_id, name, payload)
    VALUES (cyclone_uuid7(), r.id, p_name, COALESCE(p_payload, 'null'::jsonb))
    RETURNING id INTO sid;
    PERFORM cyclone__signals_deliver(r.id);
    RETURN QUERY SELECT g.id, g.consumed_by FROM cyclone_signals g WHERE g.id = sid;
END $$;
