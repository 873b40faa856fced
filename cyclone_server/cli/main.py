"""Command line: `cyclone-server` (the control plane) and `cyclone` (server, migrate, dev, and the operator commands)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Sequence


from . import limits, runs, schedules, workers
from .common import HelpFormatter, Leaves
from .dev import DEV_HTTP_LISTEN, dev_metrics_listen, run_dev
from cyclone_server.serve import settings as declared
from cyclone_server.serve.app import CycloneServer
from cyclone_server.serve.settings import Settings
from cyclone_server.errors import CycloneError
from cyclone_worker._loop import run as run_on

DEFAULT_LISTEN = declared.DEFAULT_LISTEN
DISTRIBUTION = "cyclone-workflows"  # the name on PyPI (`cyclone` there is an unrelated web server)


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """Every server setting (cyclone_server/serve/settings.py: flag, environment variable, default, help)."""
    declared.add(p)
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set by --processes


def add_log_flag(p: argparse.ArgumentParser) -> None:
    declared.add(p, flags=["--log-level"])



def _settings(args: argparse.Namespace, p: argparse.ArgumentParser) -> Settings:
    try:
        return declared.from_args(args)
    except declared.SettingsError as e:
        p.error(str(e))
        raise  # p.error exits


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
    server's CPU under load (docs/benchmarks.md). So the start-up heap is
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
            from cyclone_server.serve.processes import run_processes
            return run_processes(argv, processes=args.processes, database_url=settings.database_url,
                                 listen=settings.listen, migrate_first=settings.migrate,
                                 ready_file=settings.ready_file, metrics_listen=settings.metrics_listen,
                                 server_id=settings.server_id)
        collect_less()
        run_on(CycloneServer(settings).serve_forever(), settings.event_loop)
    except KeyboardInterrupt:  # a second Ctrl-C cut the graceful stop short
        return 130
    except (OSError, RuntimeError, CycloneError) as e:
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
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=version_text())
    add_server_flags(p)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    setup_logging(args.log_level)
    return run_server(_settings(args, p), args, raw)


def main(argv: Sequence[str] | None = None) -> int:
    """`cyclone server|migrate|dev|runs|workflows|stats|schedules|workers|limits`."""
    p = argparse.ArgumentParser(prog="cyclone", description="Cyclone: a durable workflow engine on Postgres.")
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)
    add_server_flags(sub.add_parser("server", help="run the gRPC control plane (same as cyclone-server)",
                                    formatter_class=HelpFormatter))
    mig = sub.add_parser("migrate", help="apply the schema migrations and exit", formatter_class=HelpFormatter)
    mig.add_argument("--database-url", default=os.environ.get("CYCLONE_DATABASE_URL"),
                     help="Postgres URL (env CYCLONE_DATABASE_URL); required")
    add_log_flag(mig)
    dev = sub.add_parser("dev", help="embedded Postgres + server + demo worker, for trying Cyclone out",
                         formatter_class=HelpFormatter)
    dev.add_argument("--data-dir", default=".cyclone/pg", help="where the embedded Postgres keeps its data")
    dev.add_argument("--listen", type=declared.listen, default=DEFAULT_LISTEN, help="HOST:PORT to serve gRPC on")
    dev.add_argument("--no-worker", action="store_true", help="do not start the demo worker")
    dev.add_argument("--http-listen", type=declared.listen, default=DEV_HTTP_LISTEN, metavar="HOST:PORT",
                     help=f"the web console (default {DEV_HTTP_LISTEN})")
    dev.add_argument("--metrics-listen", type=dev_metrics_listen, default=None, metavar="HOST:PORT",
                     help="also serve Prometheus metrics on a port of their own (default: only at the web "
                          "console's /metrics)")
    add_log_flag(dev)
    leaves = Leaves()
    for group in (runs, schedules, workers, limits):
        group.register(sub, leaves)
    args = p.parse_args(argv)
    if getattr(args, "func", None) is not None:  # runs, workflows, stats: gRPC clients, no logging set-up
        return args.func(args)
    setup_logging(args.log_level)
    if args.command == "server":
        raw = list(sys.argv[1:] if argv is None else argv)
        return run_server(_settings(args, sub.choices["server"]), args, raw[raw.index("server") + 1:])
    if args.command == "migrate":
        if not args.database_url:
            mig.error("--database-url (or CYCLONE_DATABASE_URL) is required")
        from cyclone_server.store.migrate import migrate
        applied = migrate(args.database_url)
        print("applied: " + ", ".join(applied) if applied else "schema is up to date")
        return 0
    return run_dev(args.data_dir, args.listen, worker=not args.no_worker, http_listen=args.http_listen,
                   metrics_listen=args.metrics_listen)
