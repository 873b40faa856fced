"""The server's settings, declared once: each with its flag, environment variable, default and help.

`cyclone-server --help` is made from this table, and so is the table in
docs/operations.md (`python -m cyclone_server.settings` prints it; a unit test checks
that the docs hold the current one). A flag given on the command line wins over its
environment variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .engine import DEFAULT_MAX_PAYLOAD_BYTES
from .listen import split_host_port

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
            "(enables mTLS)", metavar="PATH", group="security", unset="no mTLS"),
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


def markdown() -> str:
    """The table of docs/operations.md ("Running a server")."""
    rows = ["| flag | env | default | what |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        flag = s.flag if s.switch else f"{s.flag} {s.metavar or 'VALUE'}"
        rows.append(f"| `{flag}` | `{s.env}` | {s.shown_default()} | {s.help.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())


__all__ = ["Setting", "SETTINGS", "add", "markdown", "positive", "non_negative", "positive_int", "listen",
           "DEFAULT_LISTEN", "DEFAULT_MAX_PAYLOAD_BYTES"]
