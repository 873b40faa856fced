"""The Workflows and Admin gRPC services, and what every servicer shares: input checks and error mapping.

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
import psycopg
import psycopg.errors
import psycopg_pool

from cyclone_proto import admin_pb2, admin_pb2_grpc, workflows_pb2, workflows_pb2_grpc

from . import convert, definitions
from .engine import Engine, parse_id
from .errors import CycloneError, InvalidArgument
from .handlers import status_details

log = logging.getLogger("cyclone.api")

MAX_DEADLINE_IN = 100 * 366 * 86400.0  # no run needs more than a century; far more overflows datetime
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def rpc(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Maps errors of one RPC handler to gRPC statuses."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await fn(self, request, context)
        except CycloneError as e:
            await context.abort(e.status, status_details(e.message))
        except psycopg.DataError as e:
            # A value Postgres (or psycopg, before sending it) cannot take that no check above
            # caught: still the caller's input.
            log.warning("%s: data exception: %s", fn.__name__, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                status_details(f"invalid value: {e.diag.message_primary or e}"))
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as e:
            # The database is down or unreachable: the client may retry, here or elsewhere.
            log.warning("%s: database unavailable: %s", fn.__name__, e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "database unavailable, try again")
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__}: internal error (see the server log)")
        raise AssertionError("unreachable: context.abort raises")

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


# -- services ------------------------------------------------------------------------


class WorkflowsServicer(workflows_pb2_grpc.WorkflowsServicer):
    """cyclone.v1.Workflows: register and read definitions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rpc
    async def RegisterWorkflow(self, request: workflows_pb2.RegisterWorkflowRequest,
                               context: grpc.aio.ServicerContext) -> workflows_pb2.RegisterWorkflowResponse:
        required(request.name, "name")
        nodes = [convert.node_to_dict(n, i) for i, n in enumerate(request.nodes)]
        row = await self.engine.register_workflow(request.name, nodes)
        return workflows_pb2.RegisterWorkflowResponse(workflow=convert.workflow_to_proto(row), created=row["created"])

    @rpc
    async def GetWorkflow(self, request: workflows_pb2.GetWorkflowRequest,
                          context: grpc.aio.ServicerContext) -> Any:
        definitions.validate_name(required(request.name, "name"))
        non_negative(request.version, "version")
        return convert.workflow_to_proto(await self.engine.get_workflow(request.name, request.version))

    @rpc
    async def ListWorkflows(self, request: workflows_pb2.ListWorkflowsRequest,
                            context: grpc.aio.ServicerContext) -> workflows_pb2.ListWorkflowsResponse:
        rows = await self.engine.list_workflows(plain_text(request.name_prefix, "name_prefix"), request.all_versions)
        return workflows_pb2.ListWorkflowsResponse(workflows=[convert.workflow_to_proto(r) for r in rows])


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """cyclone.v1.Admin: operator views."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rpc
    async def GetStats(self, request: admin_pb2.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> admin_pb2.GetStatsResponse:
        rows = await self.engine.stats()
        return admin_pb2.GetStatsResponse(kinds=[convert.kind_stats_to_proto(r) for r in rows])

    @rpc
    async def ListWorkers(self, request: admin_pb2.ListWorkersRequest,
                          context: grpc.aio.ServicerContext) -> admin_pb2.ListWorkersResponse:
        if request.kind:
            definitions.validate_kind(request.kind, "kind")
        rows = await self.engine.list_workers(request.kind or None)
        return admin_pb2.ListWorkersResponse(workers=[convert.worker_to_proto(r) for r in rows])
