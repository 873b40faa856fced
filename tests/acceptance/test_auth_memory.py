"""Before a caller is authenticated, the server does not read what it sends: memory stays bounded.

A server with tokens gets 8 concurrent 256 MiB Enqueue calls without a token. The token
check refuses each on its metadata alone, before the request is read (auth._refusing), so
the server's peak memory grows by no more than the calls' flow-control windows, fixed at
4 MiB a call (cyclone_server/serve/app.py, WINDOW_OPTIONS; with gRPC's BDP probe growing
them, a loaded machine saw 183 MiB): the bound asserted here is 64 MiB over the peak before
the flood (twice the eight windows), documented in docs/operations.md ("Auth and TLS").
An admin call made during the flood is answered, and the resident memory is back within
that bound of where it was within seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from cyclone_proto import admin_pb2, admin_pb2_grpc, runs_pb2
from cyclone_server.convert import py_to_value

from test_auth import TOKENS
from test_auth_server import token_server, tokens_file  # noqa: F401  (fixtures)
from waits_helpers import until

MIB = 1 << 20
FLOOD, SIZE = 8, 256 * MIB
PEAK_BOUND = 64 * MIB  # docs/operations.md, "Auth and TLS"


def memory(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of `pid` in bytes: the peak resident memory since it started, and now."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024


async def test_unauthenticated_giant_requests_are_refused_unread(token_server: Any) -> None:
    pid = token_server.proc.pid
    body = runs_pb2.EnqueueRequest(kind="k", input=py_to_value("x" * SIZE)).SerializeToString()
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(token_server.address, options=options) as channel, \
            grpc.aio.insecure_channel(token_server.address) as admin_channel:
        admin = admin_pb2_grpc.AdminStub(admin_channel)
        admin_md = (("authorization", f"Bearer {TOKENS['admin']}"),)
        await admin.GetStats(admin_pb2.GetStatsRequest(), metadata=admin_md, timeout=30)
        peak_before, rss_before = memory(pid)
        enqueue = channel.unary_unary("/cyclone.v1.Runs/Enqueue", request_serializer=None,
                                      response_deserializer=runs_pb2.EnqueueResponse.FromString)
        calls = [enqueue(body, timeout=120) for _ in range(FLOOD)]
        # An operator's call during the flood is answered (no wall-clock bound: the machine is shared).
        await admin.GetStats(admin_pb2.GetStatsRequest(), metadata=admin_md, timeout=60)
        codes = []
        for call in calls:
            try:
                await call
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as e:
                codes.append(e.code())
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * FLOOD
    peak_after, _ = memory(pid)
    assert peak_after - peak_before < PEAK_BOUND, f"peak grew by {(peak_after - peak_before) / MIB:.0f} MiB"
    # Nothing of the flood stays: the resident memory comes back within the same bound. (Not to
    # the baseline itself: the allocator keeps freed arenas it cannot trim, up to what the flood's
    # windows used.)
    await until(lambda: memory(pid)[1] - rss_before < PEAK_BOUND,
                "the resident memory back within the bound of its baseline", 10)


async def test_a_giant_request_refused_for_its_size_is_freed_at_once(token_server: Any) -> None:
    # With a valid token the message is read and parsed, then refused (INVALID_ARGUMENT: over
    # the payload limit); nothing of it may stay behind waiting for the cyclic collector
    # (each such call kept about 800 MiB), nor in the allocator's arenas: glibc kept 300 to
    # 450 MiB of what the calls freed until the server gave it back (cyclone_server/memory.py).
    # The bound is half of one call's input, however many calls came.
    pid = token_server.proc.pid
    body = runs_pb2.EnqueueRequest(kind="k", input=py_to_value("x" * SIZE)).SerializeToString()
    options = [("grpc.max_send_message_length", -1)]
    submit_md = (("authorization", f"Bearer {TOKENS['submit']}"),)
    async with grpc.aio.insecure_channel(token_server.address, options=options) as channel:
        enqueue = channel.unary_unary("/cyclone.v1.Runs/Enqueue", request_serializer=None,
                                      response_deserializer=runs_pb2.EnqueueResponse.FromString)
        await admin_pb2_grpc.AdminStub(channel).GetStats(
            admin_pb2.GetStatsRequest(), metadata=(("authorization", f"Bearer {TOKENS['admin']}"),), timeout=30)
        _, rss_before = memory(pid)
        for _ in range(4):
            try:
                await enqueue(body, metadata=submit_md, timeout=120)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "input" in e.details(), e.details()
            else:
                raise AssertionError("a 256 MiB input was accepted")
    await until(lambda: memory(pid)[1] - rss_before < SIZE // 2, "the memory of the refused requests freed", 10)
