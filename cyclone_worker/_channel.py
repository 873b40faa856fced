"""Opens every channel to a Cyclone server (SDK worker and client, and the `cyclone` CLI): address, TLS, limits."""

from __future__ import annotations

import grpc

__all__ = ["open_channel", "auth_metadata"]

# No client keepalive pings: a server that allows fewer answers with GOAWAY (too_many_pings);
# the worker stream detects a dead connection with its own Ping/Pong instead.
_OPTIONS = [
    # After a server restart, reconnect within a second or two (gRPC's default backoff
    # grows to two minutes, which would leave workers and waiting clients idle).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def open_channel(address: str, *, tls: grpc.ChannelCredentials | None = None,
                 interceptors: list[grpc.aio.ClientInterceptor] | None = None) -> grpc.aio.Channel:
    """An aio channel to `address` (HOST:PORT): TLS when `tls` is given, else plaintext.

    Messages up to 64 MiB each way (a lease's payloads as protobuf Values can be several
    times their JSON size), and a reconnect within 2 s of a server coming back."""
    if tls is not None:
        return grpc.aio.secure_channel(address, tls, options=_OPTIONS, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=_OPTIONS, interceptors=interceptors)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying a bearer token (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
