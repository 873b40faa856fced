"""The connection defaults that make a failover fast, and the pool backoff they patch in (store/failover.py)."""

from __future__ import annotations

import psycopg_pool.pool_async
from psycopg.conninfo import conninfo_to_dict

from cyclone_server.store import failover


def test_every_host_gets_a_connect_timeout_and_keepalives_unless_the_url_sets_them() -> None:
    url = "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
    got = conninfo_to_dict(failover.with_failover_defaults(url))
    assert got["host"] == "h1,h2" and got["port"] == "5432,5433" and got["target_session_attrs"] == "read-write"
    assert got["connect_timeout"] == "2" and got["keepalives"] == "1" and got["tcp_user_timeout"] == "10000"
    mine = conninfo_to_dict(failover.with_failover_defaults("postgresql://u@h/db?connect_timeout=9&keepalives=0"))
    assert (mine["connect_timeout"], mine["keepalives"]) == ("9", "0")


def test_the_pool_reconnects_at_most_a_second_apart() -> None:
    # psycopg_pool doubles its wait without a bound; the patch point must still exist.
    assert psycopg_pool.pool_async.AttemptWithBackoff is not None
    failover.install_capped_backoff()
    assert psycopg_pool.pool_async.AttemptWithBackoff is failover.CappedBackoff
    attempt = failover.CappedBackoff(timeout=3600)
    delays = []
    for now in range(12):
        attempt.update_delay(float(now))
        delays.append(attempt.delay)
    assert delays[0] <= 0.11 and max(delays) <= failover.RECONNECT_MAX_DELAY
    assert delays[-1] >= 0.9 * failover.RECONNECT_MAX_DELAY
