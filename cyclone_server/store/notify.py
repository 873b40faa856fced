"""Postgres LISTEN/NOTIFY for one server process: wakes the dispatcher and the child settler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

import psycopg
from tenacity import AsyncRetrying, wait_exponential

from cyclone_server.tasks import cancel_and_wait

from .failover import RECONNECT_MAX_DELAY, with_failover_defaults
from .faults import translated

log = logging.getLogger(__name__)

CHANNELS = ("cyclone_available", "cyclone_run_ended", "cyclone_schedules")


class Notifier:
    """One LISTEN connection per server process, on the channels of CHANNELS.

    The SQL functions pg_notify these channels with few payloads ('' mostly; 'top' on
    'cyclone_run_ended' when only top-level runs ended), so Postgres folds them to one or
    two notifications per channel per transaction. A notification is only a hint:
    whoever wakes must re-check the database. That is also why a re-established connection
    wakes everyone (notifications sent while it was down are lost).

    Example::

        notifier = Notifier(url)
        await notifier.start()
        notifier.subscribe("cyclone_available", dispatcher.wake)
        if await notifier.wait("cyclone_run_ended", timeout=5): ...
    """

    def __init__(self, conninfo: str, *, reconnect_initial: float = 0.1,
                 reconnect_max: float = RECONNECT_MAX_DELAY) -> None:
        self.conninfo = with_failover_defaults(conninfo)
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.reconnects = 0
        self._waiters: dict[str, set[asyncio.Future[None]]] = {c: set() for c in CHANNELS}
        self._callbacks: dict[str, list[tuple[Callable[[], None], Collection[str]]]] = {c: [] for c in CHANNELS}
        self._conn: psycopg.AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and LISTEN (raising if the database is unreachable now), then listen in the background."""
        self._conn = await self._connect()
        self._task = asyncio.create_task(self._run(), name="cyclone-notifier")

    async def stop(self) -> None:
        task, self._task = self._task, None  # (a second stop meanwhile finds nothing to stop)
        if task is not None:
            await cancel_and_wait([task])  # (cancelled again if a cancellation was lost)
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def wait(self, channel: str, timeout: float) -> bool:
        """True once a notification on `channel` arrives after the call began (or the LISTEN
        connection was re-established: re-check state), False on timeout."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[self._known(channel)]
        waiters.add(fut)
        try:
            async with asyncio.timeout(timeout):  # not wait_for: see cyclone_server/tasks.py
                await fut
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            waiters.discard(fut)

    def subscribe(self, channel: str, callback: Callable[[], None], *, skip: Collection[str] = ()) -> None:
        """Call `callback` (synchronously, on the event loop) for each notification on
        `channel`, but those whose payload is in `skip` (say 'top' on 'cyclone_run_ended':
        only top-level runs ended; or a server's own Engine.announce_token)."""
        self._callbacks[self._known(channel)].append((callback, frozenset(skip)))

    @staticmethod
    def _known(channel: str) -> str:
        if channel not in CHANNELS:
            raise ValueError(f"channel: {channel!r} is not one of {', '.join(CHANNELS)}")
        return channel

    async def _connect(self) -> psycopg.AsyncConnection:
        with translated():
            conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
            for channel in CHANNELS:
                await conn.execute(f"LISTEN {channel}")
        return conn

    def _fire(self, channel: str, payload: str = "") -> None:
        for fut in list(self._waiters[channel]):
            if not fut.done():
                fut.set_result(None)
        for callback, skip in self._callbacks[channel]:
            if payload in skip:
                continue
            try:
                callback()
            except Exception:  # one broken subscriber must not stop the others
                log.exception("notification callback for %s failed", channel)

    async def _run(self) -> None:
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    await self._reconnect()
                assert self._conn is not None
                await self._read(self._conn)
                reason = "closed"  # _read ends by raising: this is only a default
            except Exception as e:  # psycopg.Error mostly; whatever it is, listening must go on
                reason = str(e)
            log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", reason, self.reconnect_initial)
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
            await asyncio.sleep(self.reconnect_initial)

    async def _read(self, conn: psycopg.AsyncConnection) -> None:
        """Fire the notifications that arrive on `conn` until it breaks (raising) or closes.

        One reader on the socket for as long as the connection lives, which reads what has
        arrived and fires each notification in it. psycopg's `notifies()` makes a future, a
        timer and a reader for each notification it waits for: 130 µs of the server's CPU
        each on a slow machine, for a notification that every results batch ending runs
        sends (docs/benchmarks.md)."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        encoding = conn.info.encoding
        ended: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()  # raises once the connection broke or closed
                while (n := pgconn.notifies()) is not None:
                    channel = n.relname.decode(encoding)
                    if channel in self._waiters:
                        self._fire(channel, n.extra.decode(encoding))
            except Exception as e:
                if not ended.done():
                    ended.set_exception(e)

        fd = pgconn.socket
        loop.add_reader(fd, readable)
        try:
            readable()  # what libpq read in with LISTEN's replies wakes no reader on the socket
            await ended
        finally:
            loop.remove_reader(fd)

    async def _reconnect(self) -> None:
        """Connect again, retrying with exponential backoff (reconnect_initial doubling up to
        reconnect_max) for as long as it takes; then wake everyone (notifications sent while
        the connection was down are lost)."""
        async for attempt in AsyncRetrying(
                wait=wait_exponential(multiplier=self.reconnect_initial, min=self.reconnect_initial,
                                      max=self.reconnect_max),
                before_sleep=lambda state: log.warning(
                    "LISTEN reconnect failed (%s); trying again in %.1fs", state.outcome.exception(),  # type: ignore[union-attr]
                    state.next_action.sleep)):  # type: ignore[union-attr]
            with attempt:
                self._conn = await self._connect()
        self.reconnects += 1
        log.info("LISTEN connection re-established")
        for channel in CHANNELS:
            self._fire(channel)
