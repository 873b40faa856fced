-- The workers registry (table cyclone_workers, migration 0006): written by the server that
-- holds each worker's stream, read by Admin.ListWorkers and GetStats.

-- One server's heartbeat: upsert the rows of the streams it holds, each now live for
-- p_grace more, and delete every expired row (of any server: a crashed server's workers go
-- with the next heartbeat of any other). p_workers is a JSON array of {"worker_id",
-- "conn_id", "sdk", "kinds", "slots", "leases_held", "connected_at"}. A row another stream
-- of the same worker took over (a reconnect elsewhere) is left alone, unless p_takeover
-- (the new stream's Hello). Returns how many rows it wrote.
CREATE OR REPLACE FUNCTION cyclone_workers_beat(p_server_id text, p_workers jsonb, p_grace interval,
                                                p_takeover boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    written integer;
BEGIN
    DELETE FROM cyclone_workers WHERE expires_at <= now();
    INSERT INTO cyclone_workers AS w (worker_id, conn_id, server_id, sdk, kinds, slots, leases_held,
                                      connected_at, heartbeat_at, expires_at)
    SELECT e ->> 'worker_id', (e ->> 'conn_id')::uuid, p_server_id, COALESCE(e ->> 'sdk', ''),
           ARRAY(SELECT jsonb_array_elements_text(e -> 'kinds')), (e ->> 'slots')::integer,
           COALESCE((e ->> 'leases_held')::integer, 0), (e ->> 'connected_at')::timestamptz,
           now(), now() + p_grace
      FROM jsonb_array_elements(p_workers) e
     ORDER BY e ->> 'worker_id'  -- a fixed lock order between servers
    ON CONFLICT (worker_id) DO UPDATE
       SET conn_id = EXCLUDED.conn_id, server_id = EXCLUDED.server_id, sdk = EXCLUDED.sdk,
           kinds = EXCLUDED.kinds, slots = EXCLUDED.slots, leases_held = EXCLUDED.leases_held,
           connected_at = EXCLUDED.connected_at, heartbeat_at = now(), expires_at = EXCLUDED.expires_at
     WHERE p_takeover OR w.conn_id = EXCLUDED.conn_id OR w.expires_at <= now();
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END $$;
