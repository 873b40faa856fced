-- A rate's start counts from when its lease is pushed to the worker.
--
-- A start was counted at its claim, on the database's clock. The lease reaches its worker
-- after the claim's commit and the server's push, and that delay varies: a claim that
-- waited for a busy disk or a server that paused pushed its leases tens of milliseconds
-- late, beside the starts of the next window, and a worker then saw more starts than the
-- quota in one second of its own clock. A start now names its step, and the server marks
-- it pushed when it has written the lease to the worker's stream, moving `at` to that
-- moment (cyclone_limit_starts_pushed). Rows of an earlier release keep their claim's time.
ALTER TABLE cyclone_limit_starts ADD COLUMN step_id uuid;
ALTER TABLE cyclone_limit_starts ADD COLUMN pushed boolean NOT NULL DEFAULT false;
CREATE INDEX cyclone_limit_starts_step ON cyclone_limit_starts (step_id) WHERE NOT pushed;
