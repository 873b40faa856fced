"""Wraps every gRPC method handler the server registers, whatever its service.

- A request that does not parse (malformed bytes, a string that is not UTF-8, a payload
  nested deeper than protobuf decodes) is INVALID_ARGUMENT, not grpcio's UNKNOWN; on a
  stream it ends the stream with INVALID_ARGUMENT.
- Error details are kept short enough for a status header.
- `CallGate`: at a graceful stop every unary call gets an answer, never a CANCELLED.

Usage: services register on `Registrar(server, gate)` instead of on the server.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import grpc

from cyclone_server import memory
from cyclone_server.convert import MAX_JSON_DEPTH

log = logging.getLogger("cyclone.api")

# Status details travel in a header, which gRPC clients refuse beyond 16 KiB (the client
# then sees RESOURCE_EXHAUSTED instead of the error); messages may quote the caller's input.
MAX_DETAILS = 1000


def status_details(message: str) -> str:
    """An error message short enough for a status header: quoted input is cut, not the whole answer."""
    return message if len(message) <= MAX_DETAILS else message[:MAX_DETAILS] + f"... ({len(message)} characters)"


SHUTTING_DOWN = "the server is shutting down; try again (another server, or this one restarted)"


class Unparsable:
    """Stands in for a request message that did not parse, until its handler can answer it."""

    __slots__ = ("message", "size")

    def __init__(self, error: Exception, size: int = 0) -> None:
        self.size = size  # of the bytes that did not parse
        reason = str(error) or type(error).__name__
        # The decoder's recursion limit (upb says "Exceeded upb_DecodeOptions_MaxDepth"): a
        # payload nested too deep, which the caller can fix knowing the limit.
        hint = (f"; JSON payloads may nest at most {MAX_JSON_DEPTH} levels of arrays and objects"
                if "depth" in reason.lower() else "")
        self.message = f"request: not a valid protobuf message ({reason}){hint}"


class _Large:
    """A unary request of memory.LARGE_REQUEST_BYTES or more, until its handler has its context."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


def _tolerant(deserialize: Callable[[bytes], Any] | None, *, mark_large: bool = False) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            message = deserialize(raw)
        except Exception as e:  # any failure to parse is the caller's bytes, not our bug
            return Unparsable(e, len(raw))
        # The size of what came is known here and nowhere later (ByteSize() would serialize
        # the message again).
        return _Large(message) if mark_large and len(raw) >= memory.LARGE_REQUEST_BYTES else message

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

    grpc's server.stop(grace) cuts the calls still running when its grace ends, and what
    the client then sees depends on timing (CANCELLED, which no client retries, or
    UNAVAILABLE). Once `close()` starts, a new call is UNAVAILABLE at once; calls in
    flight may finish until the grace period ends, and those still running then are
    answered UNAVAILABLE here, before server.stop runs.
    """

    def __init__(self) -> None:
        self.closing = False
        self._last_call = float("-inf")  # the loop's time of the last call that reached the gate
        self._calls: set[asyncio.Task[Any]] = set()
        self._cutting = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def call(self, behavior: Callable[[Any, Any], Awaitable[Any]], request: Any,
                   context: grpc.aio.ServicerContext) -> Any:
        self._last_call = asyncio.get_running_loop().time()
        if self.closing:  # the status is set, not raised as AbortError (see api/common.rpc)
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(SHUTTING_DOWN)
            return None
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

    async def quiet(self, seconds: float, within: float) -> None:
        """Wait until no call has reached the gate for `seconds` (for `within` seconds at most).

        grpc's server.stop cancels the calls it has accepted but not yet handed to a handler
        (they wait while the event loop is busy), and their clients see CANCELLED. Once calls
        stop coming (each is answered UNAVAILABLE meanwhile), none is left waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while (wait := min(self._last_call + seconds, deadline) - loop.time()) > 0:
            await asyncio.sleep(wait)


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
        replace["request_deserializer"] = _tolerant(h.request_deserializer, mark_large=True)

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Large):  # once the call is done, its memory goes back
                memory.release_after(context)
                request = request.message
            elif isinstance(request, Unparsable):
                if request.size >= memory.LARGE_REQUEST_BYTES:
                    memory.release_after(context)
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
