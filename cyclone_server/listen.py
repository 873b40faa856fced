"""HOST:PORT addresses: the one parser (listen flags and client addresses), and who holds a busy port.

Written by hand: the standard library has no HOST:PORT parser (urllib.parse wants a scheme),
and finding a port's holder needs only /proc on Linux (psutil would be a dependency for
one error message).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

DEFAULT_PORT = 7233


def split_host_port(text: str, *, default_port: int | None = None, default_host: str | None = None,
                    what: str = "address") -> tuple[str, int]:
    """'HOST:PORT', '[v6]:PORT' (or 'HOST' when `default_port` is given, ':PORT' when
    `default_host` is) -> (host, port).

    The host is returned as written (IPv6 keeps its brackets, as gRPC wants them; `bare_host`
    takes them off for sockets); ValueError names `what` and the value.

        split_host_port("127.0.0.1:7233")                      # ("127.0.0.1", 7233)
        split_host_port("localhost", default_port=7233)        # ("localhost", 7233)
        split_host_port(":9464", default_host="0.0.0.0")       # ("0.0.0.0", 9464)
    """
    value = text.strip()
    if default_host is not None and value.startswith(":"):
        value = default_host + value
    host, sep, port = value.rpartition(":")
    if default_port is not None and (":" not in value or value.startswith("[") and value.endswith("]")):
        host, port = value, str(default_port)  # no port: 'host' or '[::1]'
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


def bare_host(host: str) -> str:
    """'[::1]' -> '::1', for socket calls; other hosts as they are."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def port_in_use(host: str, port: int) -> bool:
    """True when binding HOST:PORT fails with EADDRINUSE (as gRPC's bind would); port 0 never is."""
    if port == 0:
        return False
    host = bare_host(host) or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # the server reports an unknown host itself
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def port_holder(port: int) -> str:
    """'pid 1234 (python -m cyclone_server ...)' for the process listening on TCP `port`, or ''.

    Reads /proc (Linux); elsewhere, or when the holder is another user's process, ''.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return ""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"pid {pid} ({cmd.strip()[:120]})"
        except OSError:
            continue
    return ""


def busy_message(listen: str, flag: str = "--listen") -> str:
    """One line for a port already in use: what holds it and how to pick another."""
    host, port = split_host_port(listen, what=flag)
    holder = port_holder(port)
    by = f" by {holder}" if holder else ""
    return f"{listen} is already in use{by}; pick another address with {flag} HOST:PORT"


__all__ = ["DEFAULT_PORT", "split_host_port", "bare_host", "port_in_use", "port_holder", "busy_message"]
