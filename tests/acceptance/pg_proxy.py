"""A TCP proxy in front of the test Postgres, to make it fail on cue: cut, swallow an answer, or never answer.

It runs in a thread with its own event loop, so servers in other processes reach Postgres
through it on 127.0.0.1:PORT (it forwards to the test server's TCP port or Unix socket).

    with PgProxy(db_url) as proxy:
        url = proxy.url          # the same database, through the proxy
        proxy.cut()              # every connection closed, new ones closed at once
        proxy.restore()
        proxy.swallow_answer_to(b"cyclone_results_apply")  # once: the statement runs, its answer is lost

`SilentHost` accepts connections and never answers (a hung postmaster, a proxy in front of
a dead backend).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class _Loop:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()
        return self.run(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class PgProxy:
    def __init__(self, db_url: str) -> None:
        self.params = conninfo_to_dict(db_url)
        host = str(self.params.get("host") or "127.0.0.1")
        port = int(self.params.get("port") or 5432)
        self._target = ("unix", f"{host}/.s.PGSQL.{port}") if host.startswith("/") else ("tcp", (host, port))
        self._cut = False
        self._swallow: bytes | None = None
        self.swallowed = 0
        self._pipes: set[asyncio.StreamWriter] = set()
        self._bg = _Loop()
        self._server = self._bg.run(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """The database's URL through the proxy."""
        params = {k: v for k, v in self.params.items() if k not in ("host", "port", "hostaddr")}
        return make_conninfo(**params, host="127.0.0.1", port=str(self.port))

    def cut(self) -> None:
        """Close every connection, and close new ones as they come (the primary is gone)."""
        def cut() -> None:
            self._cut = True
            for writer in list(self._pipes):
                writer.transport.abort()
        self._bg.call(cut)

    def restore(self) -> None:
        self._bg.call(lambda: setattr(self, "_cut", False))

    def swallow_answer_to(self, marker: bytes) -> None:
        """The next statement whose bytes hold `marker` reaches Postgres and runs; its answer
        never reaches the client, whose connection is closed instead (the commit in doubt)."""
        self._bg.call(lambda: setattr(self, "_swallow", marker))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        kind, address = self._target
        if kind == "unix":
            up_reader, up_writer = await asyncio.open_unix_connection(address)
        else:
            up_reader, up_writer = await asyncio.open_connection(*address)
        self._pipes.update((writer, up_writer))
        doomed = asyncio.Event()

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, to_server: bool) -> None:
            try:
                while data := await src.read(65536):
                    if to_server and self._swallow is not None and self._swallow in data:
                        self._swallow = None
                        doomed.set()
                    elif not to_server and doomed.is_set():
                        self.swallowed += 1
                        break  # the answer is dropped: both sides are closed below
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (writer, up_writer):
                    w.transport.abort()

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        finally:
            self._pipes.difference_update((writer, up_writer))

    def close(self) -> None:
        self.cut()
        self._bg.call(self._server.close)
        self._bg.close()

    def __enter__(self) -> PgProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentHost:
    """Accepts TCP connections on 127.0.0.1 and never answers (nor closes them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # the kernel completes handshakes into the backlog: accepted, never read
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> SilentHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
