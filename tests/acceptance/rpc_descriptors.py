"""Cyclone's RPCs and the fields of their requests, read from the proto descriptors.

Tests that walk these (bad input, fuzz) cover a new RPC or field without being edited.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from cyclone_server.serve.app import SERVICE_NAMES

DURATION, TIMESTAMP = "google.protobuf.Duration", "google.protobuf.Timestamp"
# JSON payloads: generated as values, not walked as messages.
JSON_TYPES = ("google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue")


@dataclass(frozen=True)
class Rpc:
    """One unary RPC: `await rpc.call(channel, request)` (or raw bytes with `raw=True`)."""

    service: str
    name: str
    request: type[Message]
    response: type[Message]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def callable(self, channel: grpc.aio.Channel, *, raw: bool = False) -> Any:
        return channel.unary_unary(self.path, request_serializer=None if raw else self.request.SerializeToString,
                                   response_deserializer=self.response.FromString)


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def unary_rpcs() -> list[Rpc]:
    """Every unary RPC of the services the server registers."""
    pool = descriptor_pool.Default()
    rpcs = []
    for name in SERVICE_NAMES:
        for m in pool.FindServiceByName(name).methods:
            if not (m.client_streaming or m.server_streaming):
                rpcs.append(Rpc(name, m.name, message_class(m.input_type), message_class(m.output_type)))
    return rpcs


def time_fields(descriptor: Descriptor, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """(field path, DURATION | TIMESTAMP) of every Duration and Timestamp in a message, nested ones too."""
    for f in descriptor.fields:
        if f.type != FieldDescriptor.TYPE_MESSAGE or f.message_type.full_name in JSON_TYPES:
            continue
        if f.message_type.full_name in (DURATION, TIMESTAMP):
            yield (*path, f.name), f.message_type.full_name
        elif len(path) < 5:  # no message of ours nests deeper; this bounds a recursive one
            yield from time_fields(f.message_type, (*path, f.name))


def field_at(msg: Message, path: tuple[str, ...]) -> Message:
    """The message at `path` in `msg`, created as needed (the first element of a repeated field)."""
    for name in path:
        field = msg.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            container = getattr(msg, name)
            msg = container[0] if len(container) else container.add()
        else:
            msg = getattr(msg, name)
    return msg
