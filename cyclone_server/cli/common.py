"""What every operator command shares: the connection options, the client, argument types, output and exit codes.

Every command is one call of the public API (the raw stubs of cyclone_proto), so
whatever it shows, a script can get with grpcurl too. Exit codes: 0 success, 1 an RPC
failed (the status and message go to stderr), 2 bad arguments; `runs wait` also returns
3 when the run failed, 4 when it was cancelled, 5 when --timeout passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from cyclone_proto import admin_pb2_grpc, limits_pb2_grpc, runs_pb2_grpc, schedules_pb2_grpc, workflows_pb2_grpc

from cyclone_server.auth import SecurityConfigError, open_channel
from cyclone_server.listen import DEFAULT_PORT, split_host_port

from .show import as_json, console, print_lines
from .start import BadInput

DEFAULT_ADDRESS = "127.0.0.1:7233"
EXIT_OK, EXIT_RPC, EXIT_USAGE, EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT = 0, 1, 2, 3, 4, 5
RUN_STATES = ["running", "paused", "completed", "failed", "cancelled"]
POSITIONAL_HELP = {"run_id": "the run's id", "node": "the node's id in the workflow",
                   "workflow": "the name of a registered workflow", "kind": "the job's step kind (what workers serve)",
                   "file": "the definition: a JSON or YAML file, - for stdin", "name": "the workflow's name"}
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Client:
    """The stubs over one channel, with the per-call deadline."""

    def __init__(self, channel: grpc.aio.Channel, rpc_timeout: float) -> None:
        self.runs, self.timeout = runs_pb2_grpc.RunsStub(channel), rpc_timeout
        self.workflows, self.admin = workflows_pb2_grpc.WorkflowsStub(channel), admin_pb2_grpc.AdminStub(channel)
        self.schedules = schedules_pb2_grpc.SchedulesStub(channel)
        self.limits = limits_pb2_grpc.LimitsStub(channel)



Command = Callable[[Client, argparse.Namespace], Awaitable[int]]


def duration(text: str) -> float:
    """'90', '1.5s', '250ms', '5m', '1h30m', '7d' -> seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", text.strip())
    if not text.strip() or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 5m, 2h or 7d")
    return sum(float(n) * UNITS[u or "s"] for n, u in parts)


def age_arg(text: str) -> float:
    """'30d', '12h', '45m', '90s', '1h30m' -> seconds; a bare number is an error (30 what?)."""
    value = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write {value}d, {value}h, {value}m or {value}s")
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?(?:d|h|m|s))+", value):
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 30d, 12h, 45m or 90s")
    return duration(value)


def json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None


def pb_duration(seconds: float) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=int(seconds), nanos=int(round(seconds % 1 * 1e9)))


def show(a: argparse.Namespace, msg: Message | list[Message], *items: Any) -> int:
    """Print `msg` as JSON with --json, else the human `items` (lines or rich renderables)."""
    if a.json:
        print(as_json(msg))
    else:
        print_lines(console(), *items)
    return EXIT_OK


def runner(cmd: Callable[[Client, argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    async def go(a: argparse.Namespace) -> int:
        async with open_channel(a.address, token=a.token or None, tls=a.tls, ca_file=a.ca_file,
                                cert_file=a.client_cert, key_file=a.client_key) as channel:
            return await cmd(Client(channel, a.rpc_timeout), a)

    def run(a: argparse.Namespace) -> int:
        try:
            host, port = split_host_port(a.address, default_port=DEFAULT_PORT, what="--address")
            a.address = f"{host}:{port}"  # no port: the default one
            return asyncio.run(go(a))
        except (grpc.aio.AioRpcError, SecurityConfigError) as e:
            rpc_error = isinstance(e, grpc.aio.AioRpcError)
            print(f"cyclone: {e.code().name}: {e.details()}" if rpc_error else f"cyclone: {e}", file=sys.stderr)
            return EXIT_RPC
        except (BadInput, ValueError) as e:
            print(f"cyclone: {e}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            # The reader went away (`cyclone runs list | head`): stop quietly, as Unix tools do;
            # stdout goes to /dev/null so that the interpreter's last flush cannot complain.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
    return run



class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when it has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default in ([], "") or default is argparse.SUPPRESS
                or not action.option_strings):
            return text
        return f"{text} (default: {default:g})" if isinstance(default, float) else f"{text} (default: {default})"



def connection_options() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--address", default=env("CYCLONE_ADDRESS", DEFAULT_ADDRESS),
                   help=f"server HOST:PORT, or HOST for port {DEFAULT_PORT} (env CYCLONE_ADDRESS; default "
                        f"{DEFAULT_ADDRESS})")
    g.add_argument("--token", default=env("CYCLONE_TOKEN"), help="bearer token (env CYCLONE_TOKEN)")
    g.add_argument("--tls", action="store_true", default=env("CYCLONE_TLS", "") in ("1", "true", "yes"),
                   help="connect with TLS (implied by the file options; env CYCLONE_TLS=1)")
    g.add_argument("--ca-file", default=env("CYCLONE_CA_FILE"), help="CA to trust instead of the system roots "
                   "(env CYCLONE_CA_FILE)")
    g.add_argument("--client-cert", default=env("CYCLONE_CLIENT_CERT"), help="client certificate for mTLS "
                   "(env CYCLONE_CLIENT_CERT)")
    g.add_argument("--client-key", default=env("CYCLONE_CLIENT_KEY"), help="client key for mTLS "
                   "(env CYCLONE_CLIENT_KEY)")
    g.add_argument("--rpc-timeout", type=duration, default=30.0, help="deadline of each call (default 30s)")
    p.add_argument("--json", action="store_true", help="print JSON (the proto JSON mapping) instead of tables")
    return p




class Leaves:
    """Adds leaf commands that share the connection options and --json; each sets func=(args) -> exit code."""

    def __init__(self) -> None:
        self.parents = [connection_options()]

    def __call__(self, group: Any, name: str, cmd: Command, help: str, *positionals: str) -> argparse.ArgumentParser:
        """`positionals`: names from POSITIONAL_HELP, or 'name=its help'."""
        p = group.add_parser(name, parents=self.parents, help=help, description=help, formatter_class=HelpFormatter)
        p.set_defaults(func=runner(cmd))
        for positional in positionals:
            name, _, text = positional.partition("=")
            p.add_argument(name, help=text or POSITIONAL_HELP[name])
        return p


__all__ = ["Client", "Command", "Leaves", "HelpFormatter", "runner", "show", "duration", "age_arg", "json_arg",
           "pb_duration", "connection_options", "DEFAULT_ADDRESS", "RUN_STATES", "EXIT_OK", "EXIT_RPC", "EXIT_USAGE",
           "EXIT_FAILED", "EXIT_CANCELLED", "EXIT_TIMEOUT"]
