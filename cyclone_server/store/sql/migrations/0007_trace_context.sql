-- The W3C trace context a run was submitted under ({"traceparent": ..., "tracestate": ...}),
-- passed on with every lease of the run so that workers' spans join the submitter's trace.
-- NULL: the run has none. A child run inherits its parent run's. Nullable with no default,
-- so adding it rewrites no row.
ALTER TABLE cyclone_runs ADD COLUMN trace_context jsonb;
