"""One worker stream (Workers/Connect): Hello, Welcome, then leases, acks, stops and pings until it ends.

The worker (`_worker.Worker`) keeps what must survive a reconnect (held leases, results not
yet acked); a Session only speaks the protocol of workers.proto on one stream. It raises
only CycloneClientError: `Disconnected` when a welcomed stream dies, so the worker
reconnects at once; a plain CycloneClientError when it could not get a Welcome.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import grpc

from ._errors import CycloneClientError
from ._leases import LeaseTable
from cyclone_proto import workers_pb2
from .values import from_duration

__all__ = ["Session", "Disconnected", "reconnectable", "FATAL_CODES"]

log = logging.getLogger("cyclone_worker")

# The server ends a stream with these when reconnecting cannot help (workers.proto).
FATAL_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                         grpc.StatusCode.PERMISSION_DENIED})
# When the server's Welcome leaves it out: a safe guess well inside the default lease TTL.
_DEFAULT_HEARTBEAT = 10.0


class Disconnected(CycloneClientError):
    """A stream that the server had welcomed ended; the worker reconnects."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        super().__init__(code, message)


def reconnectable(exc: BaseException) -> bool:
    """Whether a failure to get a Welcome is worth another try (tenacity's retry predicate)."""
    return (isinstance(exc, CycloneClientError) and not isinstance(exc, Disconnected)
            and exc.code not in FATAL_CODES)


class Owner(Protocol):
    """What a Session needs of its worker (`_worker.Worker` is one). Imports go one way:
    the worker uses the session and the lease table, the session the lease table."""

    worker_id: str
    address: str
    connect_timeout: float

    def hello(self) -> workers_pb2.Hello: ...

    def welcomed(self, session: Session, welcome: workers_pb2.Welcome) -> list[workers_pb2.StepResult]: ...


class Session:
    """Speaks the worker protocol on one stream on behalf of a Worker."""

    def __init__(self, worker: Owner, leases: LeaseTable, call: Any) -> None:
        self.worker = worker
        self.leases = leases
        self.call = call
        self._outbox: list[workers_pb2.WorkerMessage | workers_pb2.StepResult] = []
        self._kick = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._ended = asyncio.Event()

    async def run(self) -> None:
        """Returns normally only after `close()`; otherwise raises CycloneClientError."""
        w = self.worker
        writer: asyncio.Task[None] | None = None
        try:
            try:
                await self.call.write(workers_pb2.WorkerMessage(hello=w.hello()))
                first = await self._read(w.connect_timeout)
            except CycloneClientError:
                raise
            except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError, OSError) as e:
                raise _as_client_error(e) from None
            if first.WhichOneof("msg") != "welcome":
                raise CycloneClientError(grpc.StatusCode.UNAVAILABLE,
                                         f"expected Welcome, got {first.WhichOneof('msg')}")
            welcome = first.welcome
            heartbeat = from_duration(welcome.heartbeat_interval) or _DEFAULT_HEARTBEAT
            log.info("cyclone worker %s: connected to %s (server %s, heartbeat %.2fs, %d lost)",
                     w.worker_id, w.address, welcome.server_id, heartbeat, len(welcome.lost))
            writer = asyncio.create_task(self._write_loop(), name="cyclone-worker-writer")
            for result in w.welcomed(self, welcome):
                self.send_result(result)
            while True:
                try:
                    msg = await self._read(3 * heartbeat)
                except CycloneClientError as e:
                    if self._closing:
                        return
                    if e.code in FATAL_CODES:
                        raise
                    raise Disconnected(e.message, e.code) from None
                self._dispatch(msg)
        finally:
            if writer is not None:
                writer.cancel()
            self._ended.set()
            if not self.call.done():
                self.call.cancel()

    def _dispatch(self, msg: workers_pb2.ServerMessage) -> None:
        leases = self.leases
        kind = msg.WhichOneof("msg")
        if kind == "leases":
            leases.start_all(msg.leases.leases)
        elif kind == "acks":
            for ack in msg.acks.acks:
                leases.acked(ack)
        elif kind == "stop":
            for ref in msg.stop.leases:
                leases.stop(ref, msg.stop.reason or "stop")
        elif kind == "ping" and not self._closing:
            # Once closing, no pong: the half-close follows the hand-backs (zero-delay
            # snoozes), and a message in between would tell the server we are not stopping.
            self._send(workers_pb2.WorkerMessage(pong=workers_pb2.Pong(nonce=msg.ping.nonce)))
        # A message kind added by a newer server is ignored, as the protocol asks.

    async def _read(self, timeout: float) -> workers_pb2.ServerMessage:
        try:
            # asyncio.timeout, not wait_for: on Python 3.11, a cancel arriving as wait_for
            # times out comes back as a TimeoutError, and the worker's stop would be taken
            # for a lost stream and reconnected from, again and again.
            async with asyncio.timeout(timeout):
                msg = await self.call.read()
        except TimeoutError:
            raise CycloneClientError(grpc.StatusCode.UNAVAILABLE,
                                     f"the server sent nothing for {timeout:.1f}s") from None
        except grpc.RpcError as e:
            raise _as_client_error(e) from None
        if msg is grpc.aio.EOF:  # type: ignore[attr-defined]
            raise CycloneClientError(grpc.StatusCode.UNAVAILABLE, "the server ended the stream")
        return msg  # type: ignore[no-any-return]

    # -- writing --------------------------------------------------------------------------

    def send_result(self, result: workers_pb2.StepResult) -> None:
        """Queue a result; results queued together go out in one Results message."""
        self._send(result)

    def _send(self, item: workers_pb2.WorkerMessage | workers_pb2.StepResult) -> None:
        self._outbox.append(item)
        self._idle.clear()
        self._kick.set()

    async def _write_loop(self) -> None:
        # The only writer of the stream: grpc.aio allows one write at a time.
        try:
            while True:
                await self._kick.wait()
                self._kick.clear()
                items, self._outbox = self._outbox, []
                results = [i for i in items if isinstance(i, workers_pb2.StepResult)]
                for item in items:
                    if isinstance(item, workers_pb2.WorkerMessage):
                        await self.call.write(item)
                if results:
                    # Extended in place: Results(results=...) inside WorkerMessage(results=...)
                    # copied every result twice.
                    msg = workers_pb2.WorkerMessage()
                    msg.results.results.extend(results)
                    await self.call.write(msg)
                if not self._outbox:
                    self._idle.set()
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError, OSError) as e:
            # The reader sees the same broken stream (or stops hearing pings) and reconnects;
            # unacked results stay with the worker and go out again after the next Welcome.
            log.debug("cyclone worker: write failed: %s", e)

    async def close(self, timeout: float = 2.0) -> None:
        """Graceful end: flush queued messages, half-close, give the server `timeout` s to end the stream."""
        self._closing = True
        try:
            # asyncio.timeout, not wait_for, which can lose a cancel on Python 3.11 (see above).
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            # Bounded too: on a stream that is dying meanwhile, the half-close was seen to
            # wait forever, and with it the worker's stop.
            async with asyncio.timeout(timeout):
                await self.call.done_writing()
            async with asyncio.timeout(timeout):
                await self._ended.wait()
        except (TimeoutError, grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass


def _as_client_error(e: BaseException) -> CycloneClientError:
    if isinstance(e, grpc.aio.AioRpcError):
        return CycloneClientError.from_rpc(e)
    return CycloneClientError(grpc.StatusCode.UNAVAILABLE, f"{type(e).__name__}: {e}")
