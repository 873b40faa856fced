"""What every gRPC servicer shares: the error mapping and the input checks.

A servicer converts messages (convert.py) and errors, nothing else: the rules live in the
engine and its SQL functions. `rpc` is the one place where a CycloneError becomes its
gRPC status, and where anything unexpected becomes INTERNAL with the traceback logged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import grpc

from cyclone_server import convert
from cyclone_server.records import parse_id
from cyclone_server.errors import CycloneError, DatabaseError, InvalidArgument, Unavailable
from .handlers import status_details

log = logging.getLogger("cyclone.api")

MAX_DEADLINE_IN = 100 * 366 * 86400.0  # no run needs more than a century; far more overflows datetime
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def rpc(fn: Handler[Req, Resp]) -> Handler[Req, Resp | None]:
    """Maps errors of one RPC handler to gRPC statuses.

    The status is set on the context and the handler returns, rather than raising
    context.abort's AbortError: grpc keeps that exception on the call, and its traceback
    would hold the frames that hold the request, in a reference cycle that only the cyclic
    collector frees (a refused 256 MiB request stayed in memory). After a large request the
    allocator is asked to give the memory it freed back (handlers.py, memory.release_after)."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp | None:
        try:
            return await fn(self, request, context)
        except Unavailable as e:
            # The database is down or unreachable: the client may retry, here or elsewhere.
            log.warning("%s: database unavailable: %s", fn.__name__, e.__cause__ or e)
            code, details = e.status, e.message
        except DatabaseError:
            log.exception("%s failed", fn.__name__)
            code, details = grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error (see the server log)"
        except CycloneError as e:
            code, details = e.status, status_details(e.message)
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("%s failed", fn.__name__)
            code, details = grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error (see the server log)"
        context.set_code(code)
        context.set_details(details)
        return None

    return handler


# -- input checks shared by the services ---------------------------------------------


def required(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field}: required")
    return value


def plain_text(value: str, field: str, max_len: int = 256) -> str:
    """A free-form string stored or matched in Postgres: bounded, and without U+0000 (which text cannot hold)."""
    if len(value) > max_len:
        raise InvalidArgument(f"{field}: {len(value)} characters, more than the limit of {max_len}")
    if "\x00" in value:
        raise InvalidArgument(f"{field}: contains the character U+0000")
    return value


def required_id(value: str, field: str) -> str:
    """A run or step id: present and well-formed."""
    return str(parse_id(required(value, field), field))


def non_negative(value: int, field: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{field}: must be >= 0, got {value}")
    return value


def deadline_of(request: Any, *, field: str = "deadline", field_in: str = "deadline_in") -> datetime | None:
    """An absolute deadline from a request's deadline / deadline_in pair (at most one, in the future)."""
    absolute = convert.timestamp_dt(request, field)
    relative = convert.duration_seconds(request, field_in, positive=True, maximum=MAX_DEADLINE_IN)
    if absolute is None and relative is None:
        return None
    if absolute is not None and relative is not None:
        raise InvalidArgument(f"{field}, {field_in}: give at most one of them")
    now = datetime.now(timezone.utc)
    if relative is not None:
        return now + timedelta(seconds=relative)
    if absolute is not None and absolute <= now:
        raise InvalidArgument(f"{field}: {absolute.isoformat()} is not in the future")
    return absolute


__all__ = ["rpc", "required", "plain_text", "required_id", "non_negative", "deadline_of", "MAX_DEADLINE_IN"]
