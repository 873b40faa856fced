"""The worker stream: per-worker connections, dispatch of leases, and the result committer."""
