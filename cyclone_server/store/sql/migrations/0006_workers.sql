-- The connected workers of every server of this database (Admin.ListWorkers, and the
-- workers per kind of GetStats): the server that holds a worker's stream writes its row at
-- Hello and refreshes it every heartbeat (cyclone_workers_beat). A row whose expires_at
-- passed is no longer listed: its worker disconnected, or its server stopped refreshing it
-- (crashed, or lost the database), longer ago than the grace (the server's lease TTL).
-- Not a source of truth for any transition: leases are fenced by the steps' rows alone.
CREATE TABLE cyclone_workers (
    -- Hello.worker_id: unique among workers; a reconnect (to any server) takes the row over.
    worker_id    text        PRIMARY KEY,
    -- One stream: a heartbeat of an older stream of this worker no longer touches the row.
    conn_id      uuid        NOT NULL,
    server_id    text        NOT NULL,
    sdk          text        NOT NULL DEFAULT '',
    kinds        text[]      NOT NULL,
    slots        integer     NOT NULL,
    leases_held  integer     NOT NULL DEFAULT 0,
    connected_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- GetStats joins the workers of each kind.
CREATE INDEX cyclone_workers_kinds ON cyclone_workers USING gin (kinds);
