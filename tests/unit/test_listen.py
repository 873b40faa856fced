"""The one HOST:PORT parser (listen flags, metrics, auth, client addresses) and the busy-port message."""

from __future__ import annotations

import socket

import pytest

from cyclone_server import listen
from cyclone_server.auth import _listen_host


@pytest.mark.parametrize("text, want", [
    ("127.0.0.1:7233", ("127.0.0.1", 7233)), ("[::1]:80", ("[::1]", 80)), ("0.0.0.0:0", ("0.0.0.0", 0)),
    ("example.org:65535", ("example.org", 65535)),
])
def test_host_and_port(text: str, want: tuple[str, int]) -> None:
    assert listen.split_host_port(text) == want


@pytest.mark.parametrize("bad", ["7233", "host", ":80", "host:", "host:x", "host:65536", ""])
def test_malformed_addresses_name_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match=f"^--listen {bad!r} is not HOST:PORT$"):
        listen.split_host_port(bad, what="--listen")


def test_a_client_address_without_a_port_means_the_default_port() -> None:
    assert listen.split_host_port("localhost", default_port=7233) == ("localhost", 7233)
    assert listen.split_host_port("[::1]", default_port=7233) == ("[::1]", 7233)
    assert listen.split_host_port("10.0.0.5:9000", default_port=7233) == ("10.0.0.5", 9000)


def test_metrics_and_auth_read_addresses_with_the_same_parser() -> None:
    every = {"default_host": "0.0.0.0"}  # how --metrics-listen reads ':PORT': every interface
    assert listen.split_host_port(":9464", **every) == ("0.0.0.0", 9464)
    assert listen.split_host_port("[::1]:9464", **every) == ("[::1]", 9464)
    assert listen.bare_host("[::1]") == "::1"
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        listen.split_host_port("9464", **every)
    assert _listen_host("[::1]:7233") == "[::1]" and _listen_host("localhost") == "localhost"


def test_a_busy_port_is_one_line_naming_its_holder() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert listen.port_in_use("127.0.0.1", port)
        message = listen.busy_message(f"127.0.0.1:{port}")
    assert message.startswith(f"127.0.0.1:{port} is already in use by pid ")
    assert message.endswith("; pick another address with --listen HOST:PORT") and "\n" not in message
    assert not listen.port_in_use("127.0.0.1", 0)
