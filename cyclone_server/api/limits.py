"""cyclone.v1.Limits: create, change, read and delete the named limits of flow control
(docs/flow-control.md). The rules are limit_spec.py's (the request) and 15_limits.sql's (what a
limit does)."""

from __future__ import annotations

import grpc

from cyclone_proto import limits_pb2, limits_pb2_grpc

from cyclone_server import convert, definitions, limit_spec
from cyclone_server.store.engine import Engine

from .common import required, rpc


class LimitsServicer(limits_pb2_grpc.LimitsServicer):
    """cyclone.v1.Limits."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rpc
    async def SetLimit(self, request: limits_pb2.SetLimitRequest,
                       context: grpc.aio.ServicerContext) -> limits_pb2.Limit:
        if not request.HasField("limit"):
            required("", "limit")
        limit = limit_spec.normalize_limit(convert.limit_of(request.limit))
        row, _ = await self.engine.set_limit(limit)
        return convert.limit_to_proto(row, row["keys"])

    @rpc
    async def GetLimit(self, request: limits_pb2.GetLimitRequest,
                       context: grpc.aio.ServicerContext) -> limits_pb2.Limit:
        row = await self.engine.get_limit(definitions.validate_name(required(request.name, "name")))
        return convert.limit_to_proto(row, row["keys"])

    @rpc
    async def ListLimits(self, request: limits_pb2.ListLimitsRequest,
                         context: grpc.aio.ServicerContext) -> limits_pb2.ListLimitsResponse:
        rows = await self.engine.list_limits()
        return limits_pb2.ListLimitsResponse(limits=[convert.limit_to_proto(r, r["keys"]) for r in rows])

    @rpc
    async def DeleteLimit(self, request: limits_pb2.DeleteLimitRequest,
                          context: grpc.aio.ServicerContext) -> limits_pb2.DeleteLimitResponse:
        await self.engine.delete_limit(definitions.validate_name(required(request.name, "name")))
        return limits_pb2.DeleteLimitResponse()
