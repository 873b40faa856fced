"""The Workflows and Admin gRPC services, and what every servicer shares: input checks and error mapping.

A servicer converts messages (convert.py) and errors, nothing else: the rules live in the
engine and its SQL functions. `rpc` is the one place where a CycloneError becomes its
gRPC status, and where anything unexpected becomes INTERNAL with the traceback logged.
`Registrar` wraps every method handler the server registers: a request that does not
parse is INVALID_ARGUMENT (not grpcio's UNKNOWN), and a graceful stop answers every unary
call (`CallGate`) instead of cancelling it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn, TypeVar

import grpc
import psycopg
import psycopg.errors
import psycopg_pool

from cyclone_worker._proto import admin_pb2, admin_pb2_grpc, workflows_pb2, workflows_pb2_grpc

from . import convert, definitions
from .engine import Engine, parse_id
from .errors import CycloneError, InvalidArgument

log = logging.getLogger("cyclone.api")

MAX_DEADLINE_IN = 100 * 366 * 86400.0  # no run needs more than a century; far more overflows datetime
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


# Status details travel in a header, which gRPC clients refuse beyond 16 KiB (the client
# then sees RESOURCE_EXHAUSTED instead of the error); messages may quote the caller's input.
MAX_DETAILS = 1000


def status_details(message: str) -> str:
    """An error message short enough for a status header: quoted input is cut, not the whole answer."""
    return message if len(message) <= MAX_DETAILS else message[:MAX_DETAILS] + f"... ({len(message)} characters)"


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


# -- the wire: requests that do not parse, and a graceful stop --------------------------

SHUTTING_DOWN = "the server is shutting down; try again (another server, or this one restarted)"


class Unparsable:
    """Stands in for a request message that did not parse, until its handler can answer it."""

    __slots__ = ("message",)

    def __init__(self, error: Exception) -> None:
        reason = str(error) or type(error).__name__
        # A decoder's depth limit is the one way a well-formed request fails to parse.
        hint = (f"; JSON payloads may nest at most {convert.MAX_JSON_DEPTH} levels of arrays and objects"
                if "depth" in reason.lower() else "")
        self.message = f"request: not a valid protobuf message ({reason}){hint}"


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as e:  # any failure to parse is the caller's bytes, not our bug
            return Unparsable(e)

    return parse


class _StrictContext:
    """A stream's context whose read() ends the call with INVALID_ARGUMENT on a message that
    does not parse, and whose abort() keeps the details short enough for a status header."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", *args: Any, **kwargs: Any) -> NoReturn:
        await self._context.abort(code, status_details(details), *args, **kwargs)
        raise AssertionError("unreachable: context.abort raises")

    async def read(self) -> Any:
        msg = await self._context.read()
        if isinstance(msg, Unparsable):  # a protocol violation: the stream ends
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.message)
        return msg


async def _strict_iterator(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for msg in requests:
        if isinstance(msg, Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.message)
        yield msg


class CallGate:
    """The unary calls in flight, so that a graceful stop answers each of them.

    grpc's server.stop(grace) answers calls still running at the end CANCELLED, which no
    client retries. Once `close()` starts, a new call is UNAVAILABLE at once; calls in
    flight may finish until the grace period ends, and those still running then are cut
    short with UNAVAILABLE.
    """

    def __init__(self) -> None:
        self.closing = False
        self._calls: set[asyncio.Task[Any]] = set()
        self._cutting = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def call(self, behavior: Callable[[Any, Any], Awaitable[Any]], request: Any,
                   context: grpc.aio.ServicerContext) -> Any:
        if self.closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        # grpc.aio runs each call in a task of its own, so cutting the call is cancelling it.
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        self._idle.clear()
        try:
            return await behavior(request, context)
        except asyncio.CancelledError:
            if not self._cutting:
                raise
            task.uncancel()
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        finally:
            self._calls.discard(task)
            if not self._calls:
                self._idle.set()

    async def close(self, grace: float) -> None:
        """Refuse new calls; wait up to `grace` seconds for those in flight, then cut the rest short."""
        self.closing = True
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
            return
        except TimeoutError:
            pass
        log.warning("%d calls still running after the grace period; answering them UNAVAILABLE", len(self._calls))
        self._cutting = True
        for task in list(self._calls):
            task.cancel()
        try:
            async with asyncio.timeout(1.0):
                await self._idle.wait()
        except TimeoutError:
            log.warning("%d calls did not end when cut short", len(self._calls))


def _strict_handler(handler: grpc.RpcMethodHandler, gate: CallGate | None) -> grpc.RpcMethodHandler:
    """`handler` with a tolerant deserializer and behaviors that answer what did not parse (and pass `gate`)."""
    h: Any = handler
    behavior = h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        # A sync behavior (grpc runs it in a thread pool), such as the health service's List.
        if h.request_streaming:  # none of ours: left as grpc has it
            return handler
        name = "unary_stream" if h.response_streaming else "unary_unary"
        return h._replace(request_deserializer=_tolerant(h.request_deserializer), **{name: _checked_sync(behavior)})
    replace: dict[str, Any] = {"request_deserializer": _tolerant(h.request_deserializer)}
    if h.unary_unary is not None:
        inner = h.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Unparsable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            if gate is not None:
                return await gate.call(inner, request, context)
            return await inner(request, context)

        replace["unary_unary"] = unary_unary
    elif h.unary_stream is not None:
        replace["unary_stream"] = _checked_request(h.unary_stream)
    elif h.stream_unary is not None:
        replace["stream_unary"] = _checked_stream(h.stream_unary)
    elif h.stream_stream is not None:
        replace["stream_stream"] = _checked_stream(h.stream_stream)
    return h._replace(**replace)


def _checked_request(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """A server-streaming behavior (a coroutine or an async generator) refusing an Unparsable request."""
    if inspect.isasyncgenfunction(behavior):
        async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Unparsable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            async for response in behavior(request, context):
                yield response
        return gen

    async def coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)
    return coro


def _checked_sync(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """A sync behavior (a function or a generator) refusing an Unparsable request."""
    if inspect.isgeneratorfunction(behavior):
        def gen(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if isinstance(request, Unparsable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            yield from behavior(request, context)
        return gen

    def func(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Unparsable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return behavior(request, context)
    return func


def _checked_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    """A client-streaming behavior whose reads (context.read() or the iterator) refuse an Unparsable message."""
    if inspect.isasyncgenfunction(behavior):
        async def gen(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in behavior(_strict_iterator(requests, context), _StrictContext(context)):
                yield response
        return gen

    async def coro(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await behavior(_strict_iterator(requests, context), _StrictContext(context))
    return coro


class _StrictGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, gate: CallGate | None) -> None:
        self._inner = inner
        self._gate = gate
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            found = self._inner.service(handler_call_details)
            if found is None:  # not cached: a caller could name any number of methods
                return None
            wrapped = self._wrapped[method] = _strict_handler(found, self._gate)
        return wrapped


class Registrar:
    """Stands in for the grpc.aio.Server while services register, wrapping each method handler.

    Example::

        gate = CallGate()
        runs_pb2_grpc.add_RunsServicer_to_server(servicer, Registrar(server, gate))
        health_pb2_grpc.add_HealthServicer_to_server(health, Registrar(server))  # not gated
        ...
        await gate.close(grace)  # at shutdown, before server.stop()
    """

    def __init__(self, server: grpc.aio.Server, gate: CallGate | None = None) -> None:
        self._server = server
        self._gate = gate

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers([_StrictGenericHandler(h, self._gate) for h in handlers])

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _strict_handler(h, self._gate) for name, h in handlers.items()})


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
