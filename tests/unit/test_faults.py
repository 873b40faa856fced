"""How database errors become Cyclone's (store/faults.py): what may be tried again is Unavailable, nothing else is."""

from __future__ import annotations

import psycopg
import psycopg.errors as pe
import pytest
from psycopg_pool import PoolClosed, PoolTimeout

from cyclone_server.errors import DatabaseError, InvalidArgument, NotFound, Unavailable
from cyclone_server.store.faults import translate


@pytest.mark.parametrize(("error", "becomes"), [
    (psycopg.OperationalError("connection lost"), Unavailable),  # the client's own: no SQLSTATE
    (PoolTimeout(), Unavailable),
    (PoolClosed(), Unavailable),
    (pe.DeadlockDetected(), Unavailable),
    (pe.SerializationFailure(), Unavailable),
    (pe.LockNotAvailable(), Unavailable),  # a lock wait that ran out (DeleteLimit's)
    (pe.AdminShutdown(), Unavailable),
    (pe.CannotConnectNow(), Unavailable),
    (pe.TooManyConnections(), Unavailable),
    (pe.ReadOnlySqlTransaction(), Unavailable),  # a standby or demoted primary, mid-failover
    (pe.OutOfMemory(), DatabaseError),  # trying again would not help
    (pe.ProgramLimitExceeded(), DatabaseError),
    (pe.UniqueViolation(), DatabaseError),
    (pe.DataException(), InvalidArgument),
])
def test_what_may_be_tried_again_is_unavailable(error: Exception, becomes: type) -> None:
    assert type(translate(error)) is becomes


def test_a_sqlstate_a_function_raises_on_purpose_keeps_its_message() -> None:
    class Raised(psycopg.Error):
        sqlstate = "CY404"

    assert type(translate(Raised("no such run"))) is NotFound
