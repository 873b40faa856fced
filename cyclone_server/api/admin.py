"""cyclone.v1.Admin: operator views of the backlog and the connected workers."""

from __future__ import annotations

import grpc

from cyclone_proto import admin_pb2, admin_pb2_grpc

from cyclone_server import convert, definitions
from cyclone_server.store.engine import Engine

from .common import rpc


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """cyclone.v1.Admin: operator views."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rpc
    async def GetStats(self, request: admin_pb2.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> admin_pb2.GetStatsResponse:
        rows = await self.engine.stats()
        return admin_pb2.GetStatsResponse(kinds=[convert.kind_stats_to_proto(r) for r in rows])

    @rpc
    async def ListWorkers(self, request: admin_pb2.ListWorkersRequest,
                          context: grpc.aio.ServicerContext) -> admin_pb2.ListWorkersResponse:
        if request.kind:
            definitions.validate_kind(request.kind, "kind")
        rows = await self.engine.list_workers(request.kind or None)
        return admin_pb2.ListWorkersResponse(workers=[convert.worker_to_proto(r) for r in rows])
