"""What lets a server ride out a Postgres failover: connection defaults and a capped reconnect backoff.

- Every connection the server opens gives up on a host that does not answer after
  CONNECT_TIMEOUT seconds, per host of a multi-host URL (libpq's default waits for the
  kernel, minutes), and uses TCP keepalives and a TCP user timeout, so that a dead primary
  is noticed in seconds on an idle or a busy connection. A value given in the URL wins.
- The pool tries again to connect at most RECONNECT_MAX_DELAY seconds after a failed
  attempt (psycopg_pool doubles its wait from 1 s without a bound: 1, 3, 7, 15, 31 s ...),
  so that work resumes within about a second of a new primary accepting writes.
- A call waits at most POOL_TIMEOUT seconds for a connection, then fails with Unavailable
  (UNAVAILABLE for a client, which its retry policy handles) instead of holding the caller.

psycopg_pool has no setting for its backoff: `install_capped_backoff` replaces the class it
uses (tests/unit/test_failover_defaults.py fails when a psycopg_pool upgrade moves it).
"""

from __future__ import annotations

import random
from typing import Any

import psycopg_pool.pool_async
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool.base import AttemptWithBackoff

CONNECT_TIMEOUT = 2  # seconds per host; libpq treats less than 2 as 2
POOL_TIMEOUT = 3.0  # seconds a call waits for a pooled connection
RECONNECT_MAX_DELAY = 1.0  # seconds between two attempts to connect, at most
DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT,
    "keepalives": 1,
    "keepalives_idle": 5,  # seconds idle before the first probe
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds unacknowledged data may wait (Linux)
}


def with_failover_defaults(url: str) -> str:
    """`url` (a URL or key=value string) with the connection defaults above, where it sets none.

    A Unix-socket connection ignores the TCP ones."""
    given = conninfo_to_dict(url)
    return make_conninfo(url, **{k: v for k, v in DEFAULTS.items() if k not in given})


class CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's reconnect backoff, starting at 0.1 s and doubling up to RECONNECT_MAX_DELAY."""

    INITIAL_DELAY = 0.1

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        if self.delay > RECONNECT_MAX_DELAY:
            self.delay = RECONNECT_MAX_DELAY * random.uniform(0.9, 1.0)


def install_capped_backoff() -> None:
    """Make every async pool of this process reconnect with CappedBackoff."""
    psycopg_pool.pool_async.AttemptWithBackoff = CappedBackoff  # type: ignore[misc]


__all__ = ["CONNECT_TIMEOUT", "POOL_TIMEOUT", "RECONNECT_MAX_DELAY", "DEFAULTS", "with_failover_defaults",
           "CappedBackoff", "install_capped_backoff"]
