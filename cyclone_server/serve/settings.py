"""The server's settings, declared once (each with its flag, environment variable, default and help), and the Settings they make.

`cyclone-server --help` is made from this table, and so is the table in
docs/operations.md (`python -m cyclone_server.serve.settings` prints it; a unit test checks
that the docs hold the current one). A flag given on the command line wins over its
environment variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from cyclone_server import auth

from cyclone_server.records import DEFAULT_MAX_PAYLOAD_BYTES
from cyclone_server.listen import split_host_port
from cyclone_worker._loop import EVENT_LOOPS, loop_factory

DEFAULT_LISTEN = "127.0.0.1:7233"
TRUE_WORDS = ("1", "true", "yes", "on")


def positive(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not > 0")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not >= 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return value


def listen(text: str) -> str:
    """HOST:PORT (IPv6 as [::1]:PORT), checked; returned as given."""
    try:
        split_host_port(text, what="listen address")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _one_of(convert: Callable[[str], Any], choices: Sequence[str]) -> Callable[[str], Any]:
    def checked(text: str) -> Any:
        value = convert(text)
        if value not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return value
    return checked


@dataclass(frozen=True)
class Setting:
    """One setting: `--flag VALUE` or the environment variable `env`."""

    flag: str
    env: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    switch: bool = False  # a flag without a value; its variable is on when 1, true, yes or on
    choices: Sequence[str] | None = None
    group: str = "server"
    unset: str = ""  # what no value means, for the docs ("required", "off")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser | Any, environ: Mapping[str, str]) -> None:
        text = f"{self.help} (env {self.env})"
        value = environ.get(self.env)
        if self.switch:
            parser.add_argument(self.flag, action="store_true", help=text,
                                default=(value or "").strip().lower() in TRUE_WORDS)
            return
        # argparse converts a string default with `type`, so a bad variable is reported like a bad flag;
        # it checks `choices` only on the command line, so the type checks them too.
        convert = self.type
        if self.choices is not None:
            convert = _one_of(self.type or str, self.choices)
        parser.add_argument(self.flag, type=convert, metavar=self.metavar, choices=self.choices, help=text,
                            default=value if value is not None else self.default)

    def shown_default(self) -> str:
        if self.switch:
            return "off"
        if self.default in (None, ""):
            return self.unset
        return f"`{self.default:g}`" if isinstance(self.default, float) else f"`{self.default}`"


SETTINGS: tuple[Setting, ...] = (
    Setting("--database-url", "CYCLONE_DATABASE_URL", "Postgres URL (a libpq URL or key=value string)",
            metavar="URL", unset="required"),
    Setting("--listen", "CYCLONE_LISTEN", "HOST:PORT to serve gRPC on; port 0 picks a free port",
            default=DEFAULT_LISTEN, type=listen, metavar="HOST:PORT"),
    Setting("--http-listen", "CYCLONE_HTTP_LISTEN", "serve the web console, /metrics and /healthz over HTTP on "
            "HOST:PORT (port 0 picks a free port)", type=listen, metavar="HOST:PORT", unset="off"),
    Setting("--lease-ttl", "CYCLONE_LEASE_TTL", "how long a worker's lease lasts without a renewal; the server "
            "renews the leases of connected workers every TTL/3", default=30.0, type=positive, metavar="SECONDS"),
    Setting("--sweep-interval", "CYCLONE_SWEEP_INTERVAL", "how often the recovery sweep (expired leases) and the "
            "wait scanners (timers, max_wait, deadlines, child runs) run", default=1.0, type=positive,
            metavar="SECONDS"),
    Setting("--retention-interval", "CYCLONE_RETENTION_INTERVAL", "run the retention sweep this often",
            type=positive, metavar="SECONDS", unset="off"),
    Setting("--retention-default-age", "CYCLONE_RETENTION_DEFAULT_AGE", "with the retention sweep: purge terminal "
            "runs without a retention of their own this long after they end", type=non_negative,
            metavar="SECONDS", unset="none"),
    Setting("--no-migrate", "CYCLONE_NO_MIGRATE", "do not apply migrations on start", switch=True),
    Setting("--server-id", "CYCLONE_SERVER_ID", "this server's id in lease owners and the workers registry",
            default="", metavar="ID", unset="HOSTNAME-PID"),
    Setting("--ready-file", "CYCLONE_READY_FILE", 'once serving, write {"address": "HOST:PORT", "pid": N} here '
            '(and "metrics_address", "http_address" for those ports)', metavar="PATH", unset="none"),
    Setting("--grace", "CYCLONE_GRACE", "on SIGTERM, how long running handlers may still report and calls in "
            "flight may finish", default=10.0, type=non_negative, metavar="SECONDS"),
    Setting("--max-payload-bytes", "CYCLONE_MAX_PAYLOAD_BYTES", "largest input, output or signal payload "
            "accepted (bytes of JSON)", default=DEFAULT_MAX_PAYLOAD_BYTES, type=positive_int, metavar="N"),
    Setting("--processes", "CYCLONE_PROCESSES", "run N server processes sharing the port (SO_REUSEPORT), one "
            "per core to use; with --metrics-listen HOST:PORT, process i serves metrics on PORT+i",
            default=1, type=positive_int, metavar="N"),
    Setting("--event-loop", "CYCLONE_EVENT_LOOP", "the event loop the server runs on: auto (uvloop when it is "
            "installed, as it is with the distribution on Linux and macOS; asyncio's own otherwise), uvloop, or "
            "asyncio", default="auto", metavar="LOOP", choices=EVENT_LOOPS),
    Setting("--metrics-listen", "CYCLONE_METRICS_LISTEN", "serve Prometheus metrics at http://HOST:PORT/metrics "
            "on a port of their own (the --http-listen port serves them too)", metavar="HOST:PORT", unset="off",
            group="metrics"),
    Setting("--tokens-file", "CYCLONE_TOKENS_FILE", "bearer tokens, one 'TOKEN ROLE[,ROLE]' per line or JSON "
            "{TOKEN: [ROLE]}; roles: worker, submit, admin (tokens may also be given in env CYCLONE_TOKENS)",
            metavar="PATH", group="security", unset="no tokens"),
    Setting("--tls-cert", "CYCLONE_TLS_CERT", "server certificate chain, PEM (enables TLS, on the HTTP port too)",
            metavar="PATH", group="security", unset="plaintext"),
    Setting("--tls-key", "CYCLONE_TLS_KEY", "server private key, PEM", metavar="PATH", group="security", unset="none"),
    Setting("--tls-client-ca", "CYCLONE_TLS_CLIENT_CA", "CA bundle that client certificates must chain to "
            "(enables mTLS; needs --tls-client-roles or tokens)", metavar="PATH", group="security", unset="no mTLS"),
    Setting("--tls-client-roles", "CYCLONE_TLS_CLIENT_ROLES", "roles of client certificates (mTLS), one "
            "'IDENTITY ROLE[,ROLE]' per line, IDENTITY being CN=NAME or a subject alternative name DNS:NAME, "
            "URI:URI, email:ADDRESS or IP:ADDRESS; a certificate not listed has no role", metavar="PATH",
            group="security", unset="no certificate roles"),
    Setting("--insecure-allow-no-auth", "CYCLONE_INSECURE_ALLOW_NO_AUTH", "serve without tokens or mTLS on a "
            "non-loopback address (only behind an authenticating proxy)", switch=True, group="security"),
    Setting("--log-level", "CYCLONE_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR", default="INFO", type=str.upper,
            metavar="LEVEL", choices=("DEBUG", "INFO", "WARNING", "ERROR"), group="logging"),
)

BY_FLAG = {s.flag: s for s in SETTINGS}


def add(parser: argparse.ArgumentParser, *, groups: Sequence[str] | None = None, flags: Sequence[str] = (),
        environ: Mapping[str, str] | None = None) -> None:
    """Add the settings of `groups` (all when None), or only those `flags`, to `parser`."""
    env = os.environ if environ is None else environ
    chosen = [BY_FLAG[f] for f in flags] if flags else [s for s in SETTINGS if groups is None or s.group in groups]
    sections: dict[str, Any] = {}
    for s in chosen:
        target: Any = parser
        if s.group == "security":  # its own section of --help
            target = sections.get(s.group) or sections.setdefault(s.group, parser.add_argument_group(s.group))
        s.add_to(target, env)


@dataclass
class Settings:
    """Everything a server process is configured with: the values of SETTINGS (its defaults
    are the table's), and what they make (the security interceptors and credentials)."""

    database_url: str
    listen: str = BY_FLAG["--listen"].default
    lease_ttl: float = BY_FLAG["--lease-ttl"].default
    sweep_interval: float = BY_FLAG["--sweep-interval"].default
    retention_interval: float | None = None
    retention_default_age: float | None = None
    migrate: bool = True
    server_id: str = ""
    ready_file: str | None = None
    grace: float = BY_FLAG["--grace"].default
    max_payload_bytes: int = BY_FLAG["--max-payload-bytes"].default
    event_loop: str = BY_FLAG["--event-loop"].default  # cyclone_worker._loop.EVENT_LOOPS
    # Share the port with other processes (SO_REUSEPORT): only for `--processes N`, whose
    # children bind one port together. Off otherwise, so that a stray process on the same
    # port cannot silently take half of the connections.
    reuse_port: bool = False
    # "HOST:PORT" for GET /metrics (Prometheus text); None: no metrics endpoint.
    metrics_listen: str | None = None
    # "HOST:PORT" for the web console, /metrics and /healthz over HTTP; None: no HTTP port.
    http_listen: str | None = None
    # (certificate chain, key) PEM files: the HTTP port serves HTTPS with them (--tls-cert/--tls-key).
    http_tls: tuple[str, str] | None = None
    # From auth.server_security: the auth interceptor (when tokens or certificate roles are
    # configured) and TLS / mTLS credentials (None: plaintext).
    interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)
    credentials: grpc.ServerCredentials | None = None

    def __post_init__(self) -> None:
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop {self.event_loop!r} is not one of {', '.join(EVENT_LOOPS)}")
        if not self.server_id:
            self.server_id = f"{socket.gethostname()}-{os.getpid()}"


class SettingsError(ValueError):
    """Settings that do not go together, or a security file that cannot be read."""


def from_args(args: argparse.Namespace) -> Settings:
    """The Settings of parsed server flags (`add`); SettingsError says what is wrong."""
    if not args.database_url:
        raise SettingsError("--database-url (or CYCLONE_DATABASE_URL) is required")
    if args.retention_default_age is not None and args.retention_interval is None:
        raise SettingsError("--retention-default-age needs --retention-interval (how often the retention sweep runs)")
    if args.metrics_listen:
        try:
            split_host_port(args.metrics_listen, default_host="0.0.0.0", what="listen address")
        except ValueError as e:
            raise SettingsError(f"--metrics-listen: {e}") from None
    try:
        loop_factory(args.event_loop)
    except ValueError as e:
        raise SettingsError(f"--event-loop: {e}") from None
    try:
        interceptors, credentials = auth.server_security(args)
    except (auth.SecurityConfigError, OSError) as e:
        raise SettingsError(str(e)) from None
    if args.http_listen:  # the console acts on runs: the gRPC port's rule, and only tokens authenticate it
        http_host = split_host_port(args.http_listen, what="--http-listen")[0]
        has_tokens = any(isinstance(i, auth.TokenAuthInterceptor) and i.has_tokens for i in interceptors)
        if interceptors and not has_tokens:  # certificate roles only: nobody could sign in to the console
            raise SettingsError(
                "--http-listen: the web console signs in with bearer tokens, and this server has none (client "
                "certificates authenticate gRPC calls only): give --tokens-file (or CYCLONE_TOKENS) with a token "
                "of role submit or admin for the console, or drop --http-listen.")
        if not (has_tokens or args.insecure_allow_no_auth or auth.is_loopback(http_host)):
            raise SettingsError(
                f"--http-listen: refusing to serve the web console on {http_host} without tokens: anyone who "
                "reaches that address could cancel runs. Give --tokens-file (or CYCLONE_TOKENS), listen on "
                "127.0.0.1, or pass --insecure-allow-no-auth if a proxy in front of it authenticates callers.")
    return Settings(
        database_url=args.database_url, listen=args.listen, lease_ttl=args.lease_ttl,
        sweep_interval=args.sweep_interval, retention_interval=args.retention_interval,
        retention_default_age=args.retention_default_age, migrate=not args.no_migrate,
        server_id=args.server_id, ready_file=args.ready_file, grace=args.grace,
        max_payload_bytes=args.max_payload_bytes, event_loop=args.event_loop, metrics_listen=args.metrics_listen,
        http_listen=args.http_listen,
        http_tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        interceptors=interceptors, credentials=credentials, reuse_port=getattr(args, "reuse_port", False),
    )


def markdown() -> str:
    """The table of docs/operations.md ("Running a server")."""
    rows = ["| flag | env | default | what |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        flag = s.flag if s.switch else f"{s.flag} {s.metavar or 'VALUE'}"
        rows.append(f"| `{flag}` | `{s.env}` | {s.shown_default()} | {s.help.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())


__all__ = ["Setting", "SETTINGS", "Settings", "SettingsError", "from_args", "add", "markdown", "positive", "non_negative", "positive_int", "listen",
           "DEFAULT_LISTEN", "DEFAULT_MAX_PAYLOAD_BYTES"]
