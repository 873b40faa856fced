-- Settled days of history: days whose runs are all terminal, which the queue's scans skip.
--
-- Every day of history is a partition of cyclone_runs, cyclone_steps and cyclone_step_deps
-- (migration 0014), and a database that keeps its days gains one a day. The claim, flow
-- control's probes and the sweeps look for live work (available, running or waiting steps;
-- running runs) by state, through a partial index of each day: every day's index was opened,
-- locked and read on every call, a claim that found nothing read them all, and the cost grew
-- with the days kept (docs/operations.md, "What the days cost").
--
-- A day is settled once it has ended and every run in it is terminal, checked under a lock
-- that no writer of the day's runs holds (cyclone__history_day_settle). Only Retry takes a
-- run out of a terminal state (docs/lifecycle.md), and it unsettles the run's day first, in
-- its own transaction (cyclone__history_unsettle). So no live step or run is ever in a
-- settled day, and those scans are bounded below by the first day not settled
-- (cyclone__live_floor): Postgres prunes the days before it when a call starts, opening and
-- reading none of them. New days, and the days of a database migrated to this, start not
-- settled: the servers settle them (Engine.settle_history).
ALTER TABLE cyclone_history_days ADD COLUMN settled boolean NOT NULL DEFAULT false;
CREATE INDEX cyclone_history_days_live ON cyclone_history_days (lo) WHERE NOT settled;
