"""Opens the gRPC channel that the client and the worker share in shape: address, TLS, bearer token."""

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


def open_channel(address: str, *, tls: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """An aio channel to `address` (HOST:PORT): TLS when `tls` is given, else plaintext."""
    if tls is not None:
        return grpc.aio.secure_channel(address, tls, options=_OPTIONS)
    return grpc.aio.insecure_channel(address, options=_OPTIONS)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying a bearer token (none without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
