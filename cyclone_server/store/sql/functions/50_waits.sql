-- The wait scanners: timers that are due, max_wait limits, run deadlines, and child runs
-- that ended. None of them reads a paused step or a paused run. Each takes the runs it
-- changes without waiting (SKIP LOCKED), so several servers can scan at once; what a scan
-- skips, the next one finds.

-- End a waiting child node whose child run ended. The transaction that ended the child run
-- did not touch the parent; this one (a later transaction) locks the parent run first.
CREATE OR REPLACE FUNCTION cyclone__child_settle(p_run_id uuid, p_step_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    cr cyclone_runs;
BEGIN
    SELECT c.* INTO cr FROM cyclone_steps s JOIN cyclone_runs c ON c.id = s.child_run_id
     WHERE s.id = p_step_id AND s.state = 'waiting_child';
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF cr.state = 'completed' THEN
        PERFORM cyclone__wait_complete(p_run_id, p_step_id, 'waiting_child', cr.result);
        RETURN 'completed';
    ELSIF cr.state = 'failed' THEN
        PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'child_failed',
                                      format('child run %s failed', cr.id));
        RETURN 'discarded';
    ELSIF cr.state = 'cancelled' THEN
        PERFORM cyclone__step_discard(p_run_id, p_step_id, 'permanent', 'child_cancelled',
                                      format('child run %s was cancelled', cr.id));
        RETURN 'discarded';
    END IF;
    RETURN NULL;
END $$;

-- waiting_child -> completed | discarded, for every child run that ended (also those whose
-- parent's transaction never came, after a crash between the two commits).
CREATE OR REPLACE FUNCTION cyclone_children_settle(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no live step or run)
BEGIN
    FOR c IN
        -- (a child run is made after its parent run: in the parent's day or later)
        SELECT s.id, s.run_id FROM cyclone_steps s JOIN cyclone_runs cr ON cr.id = s.child_run_id
         WHERE s.state = 'waiting_child' AND cr.state IN ('completed', 'failed', 'cancelled') AND s.id >= live_lo
           AND cr.id >= live_lo
         ORDER BY s.run_id, s.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running'
            FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        step_id := c.id;
        outcome := cyclone__child_settle(c.run_id, c.id);
        CONTINUE WHEN outcome IS NULL;
        RETURN NEXT;
    END LOOP;
END $$;

-- The same for the given child runs, right after the transaction that ended them committed
-- (a worker's result, Cancel, Signal, ...): the action's caller sees the parent node settled
-- when its call returns, rather than after the scanner's pass. The first parent run is
-- locked waiting, the others without (the scanner finds what this skips). Returns each
-- settled node, and `ended_child_run` when settling it ended a child run in turn.
CREATE OR REPLACE FUNCTION cyclone_child_runs_settle(p_child_run_ids uuid[])
RETURNS TABLE (step_id uuid, outcome text, ended_child_run uuid)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    first boolean := true;
BEGIN
    FOR c IN
        SELECT s.id, s.run_id FROM cyclone_steps s
         WHERE s.child_run_id = ANY (p_child_run_ids) AND s.state = 'waiting_child'
         ORDER BY s.run_id, s.id
    LOOP
        IF first THEN
            PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running' FOR NO KEY UPDATE;
        ELSE
            PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running'
                FOR NO KEY UPDATE SKIP LOCKED;
        END IF;
        first := false;
        CONTINUE WHEN NOT FOUND;
        step_id := c.id;
        outcome := cyclone__child_settle(c.run_id, c.id);
        CONTINUE WHEN outcome IS NULL;
        ended_child_run := (SELECT r.id FROM cyclone_runs r
                             WHERE r.id = c.run_id AND r.parent_run_id IS NOT NULL
                               AND r.state IN ('completed', 'failed', 'cancelled'));
        RETURN NEXT;
    END LOOP;
END $$;

-- pending -> waiting_child for a child node whose deps are complete in a running run. Retry
-- and Resume start such nodes in their own transactions; this scanner is the safety net for
-- rows written by an older version (which left retried child nodes pending for it).
CREATE OR REPLACE FUNCTION cyclone_children_start(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no live step or run)
BEGIN
    FOR c IN
        SELECT s.id, s.run_id FROM cyclone_steps s
         WHERE s.state = 'pending' AND s.type = 'child' AND s.id >= live_lo
           AND NOT EXISTS (SELECT 1 FROM cyclone_step_deps d JOIN cyclone_steps p ON p.id = d.dep_id
                            WHERE d.step_id = s.id AND p.state <> 'completed'
                              AND d.step_id >= live_lo AND p.id >= live_lo)  -- (the run's day)
         ORDER BY s.run_id, s.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running'
            FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        PERFORM cyclone__step_enter(c.run_id, c.id);
        step_id := c.id;
        outcome := (SELECT state FROM cyclone_steps WHERE id = c.id);
        RETURN NEXT;
    END LOOP;
END $$;

-- waiting_timer -> completed when due, with {"fired_at": ...}.
CREATE OR REPLACE FUNCTION cyclone_timers_fire(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no live step or run)
BEGIN
    FOR c IN
        SELECT s.id, s.run_id FROM cyclone_steps s
         WHERE s.state = 'waiting_timer' AND s.timer_at <= now() AND s.id >= live_lo
         ORDER BY s.run_id, s.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running'
            FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM cyclone_steps s
                                   WHERE s.id = c.id AND s.state = 'waiting_timer' AND s.timer_at <= now());
        step_id := c.id;
        PERFORM cyclone__wait_complete(c.run_id, c.id, 'waiting_timer',
                                       jsonb_build_object('fired_at', now()));
        outcome := 'completed';
        RETURN NEXT;
    END LOOP;
END $$;

-- waiting_timer | waiting_signal | waiting_child -> discarded (permanent, reason max_wait)
-- when the node's max_wait elapsed. A child node's child run is cancelled with it.
CREATE OR REPLACE FUNCTION cyclone_waits_expire(p_limit integer DEFAULT 500)
RETURNS TABLE (step_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no live step or run)
BEGIN
    FOR c IN
        SELECT s.id, s.run_id, s.node, s.max_wait FROM cyclone_steps s
         WHERE s.state IN ('waiting_timer', 'waiting_signal', 'waiting_child') AND s.max_wait_at <= now()
           AND s.id >= live_lo
         ORDER BY s.run_id, s.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.run_id AND r.state = 'running'
            FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM cyclone_steps s
                                   WHERE s.id = c.id AND s.max_wait_at <= now()
                                     AND s.state IN ('waiting_timer', 'waiting_signal', 'waiting_child'));
        PERFORM cyclone__run_cancel_tree(child_run_id, 'parent')
           FROM cyclone_steps WHERE id = c.id AND child_run_id IS NOT NULL;
        step_id := c.id;
        outcome := cyclone__step_discard(c.run_id, c.id, 'permanent', 'max_wait',
                                         format('node %s waited longer than max_wait %s', c.node, c.max_wait));
        RETURN NEXT;
    END LOOP;
END $$;

-- A running run past its deadline fails, whatever CancelBranch says: its waiting nodes are
-- discarded (permanent, reason deadline) with their child runs, every other non-terminal
-- step is cancelled. A paused run's deadline is stopped, so paused runs are not read.
CREATE OR REPLACE FUNCTION cyclone_deadlines_expire(p_limit integer DEFAULT 500)
RETURNS TABLE (run_id uuid, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    w record;
    live_lo uuid := cyclone__live_floor();  -- (settled days hold no live run)
BEGIN
    FOR c IN
        SELECT r.id FROM cyclone_runs r
         WHERE r.state = 'running' AND r.deadline_at <= now() AND r.id >= live_lo
         ORDER BY r.id LIMIT p_limit
    LOOP
        PERFORM 1 FROM cyclone_runs r WHERE r.id = c.id AND r.state = 'running' AND r.deadline_at <= now()
            FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        FOR w IN
            UPDATE cyclone_steps
               SET state = 'discarded', error_kind = 'permanent', reason = 'deadline',
                   errors = errors || jsonb_build_object('attempt', attempt, 'error_kind', 'permanent',
                                                         'reason', 'deadline',
                                                         'message', 'the run deadline passed', 'at', now()),
                   finished_at = now()
             WHERE cyclone_steps.run_id = c.id
               AND state IN ('waiting_timer', 'waiting_signal', 'waiting_child')
            RETURNING child_run_id
        LOOP
            IF w.child_run_id IS NOT NULL THEN
                PERFORM cyclone__run_cancel_tree(w.child_run_id, 'parent');
            END IF;
        END LOOP;
        PERFORM cyclone__steps_cancel(c.id, NULL, 'deadline', NULL);
        UPDATE cyclone_runs SET failed_by_deadline = true WHERE id = c.id;
        PERFORM cyclone__run_end(c.id, 'failed');
        run_id := c.id;
        outcome := 'failed';
        RETURN NEXT;
    END LOOP;
END $$;
