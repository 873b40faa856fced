-- cyclone_children_start looks for pending child nodes whose dependencies are complete.
-- Without an index of its own it read all of cyclone_steps on every pass of the scanner.
-- Pending child nodes are few at any time, so this index stays small.
CREATE INDEX cyclone_steps_pending_child ON cyclone_steps (run_id, id)
    WHERE state = 'pending' AND type = 'child';
