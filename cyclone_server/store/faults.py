"""How errors of Postgres and of the driver become Cyclone's own errors, so that no package above the store sees psycopg.

- A SQLSTATE that a SQL function raises on purpose (CY400, ...) becomes its error of
  SQLSTATE_ERRORS, with the function's message.
- A lost or unreachable connection (SQLSTATE class 08, or none: the client's own), a pool
  that has none to give, a server shutting down or refusing connections (57P01-57P03,
  53300), a standby or demoted primary answering a write (25006, read-only, during a
  failover), a deadlock or serialization failure (class 40), a lock wait that ran out
  (55P03: DeleteLimit's, when claims held its keys for 20 s) becomes `Unavailable`: the
  statement may be tried again; for a commit, its fate is unknown. Other operational
  errors (out of memory, a program limit) are `DatabaseError`: trying again would not help.
- A value Postgres (or psycopg, before sending it) cannot take (DataError) becomes
  `InvalidArgument`: it is the caller's input.
- Anything else becomes `DatabaseError` (INTERNAL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg_pool import PoolTimeout

from cyclone_server.errors import SQLSTATE_ERRORS, CycloneError, DatabaseError, InvalidArgument, Unavailable


def translate(e: psycopg.Error | PoolTimeout) -> CycloneError:
    """The CycloneError that stands for `e` (the driver's error stays its __cause__)."""
    if isinstance(e, PoolTimeout):
        return Unavailable()
    message = e.diag.message_primary or str(e)
    cls = SQLSTATE_ERRORS.get(e.sqlstate or "")
    if cls is not None:
        return cls(message)
    if _retryable(e):
        return Unavailable()
    if isinstance(e, psycopg.DataError):
        return InvalidArgument(f"invalid value: {message}")
    return DatabaseError(message)


RETRYABLE_CLASSES = ("08", "40")
RETRYABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "25006", "55P03"})


def _retryable(e: psycopg.Error) -> bool:
    state = e.sqlstate
    if state is None:  # raised by the client: the connection broke, or never was
        return isinstance(e, psycopg.OperationalError)
    return state[:2] in RETRYABLE_CLASSES or state in RETRYABLE_STATES


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise a database error inside the block as its CycloneError (`translate`)."""
    try:
        yield
    except (psycopg.Error, PoolTimeout) as e:
        raise translate(e) from e


__all__ = ["translate", "translated"]
