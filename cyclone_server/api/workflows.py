"""cyclone.v1.Workflows: register and read workflow definitions."""

from __future__ import annotations

from typing import Any

import grpc

from cyclone_proto import workflows_pb2, workflows_pb2_grpc

from cyclone_server import convert, definitions
from cyclone_server.store.engine import Engine

from .common import non_negative, plain_text, required, rpc


class WorkflowsServicer(workflows_pb2_grpc.WorkflowsServicer):
    """cyclone.v1.Workflows: register and read definitions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @rpc
    async def RegisterWorkflow(self, request: workflows_pb2.RegisterWorkflowRequest,
                               context: grpc.aio.ServicerContext) -> workflows_pb2.RegisterWorkflowResponse:
        required(request.name, "name")
        nodes = [convert.node_to_dict(n, i) for i, n in enumerate(request.nodes)]
        row = await self.engine.register_workflow(request.name, nodes)
        return workflows_pb2.RegisterWorkflowResponse(workflow=convert.workflow_to_proto(row), created=row["created"])

    @rpc
    async def GetWorkflow(self, request: workflows_pb2.GetWorkflowRequest,
                          context: grpc.aio.ServicerContext) -> Any:
        definitions.validate_name(required(request.name, "name"))
        non_negative(request.version, "version")
        return convert.workflow_to_proto(await self.engine.get_workflow(request.name, request.version))

    @rpc
    async def ListWorkflows(self, request: workflows_pb2.ListWorkflowsRequest,
                            context: grpc.aio.ServicerContext) -> workflows_pb2.ListWorkflowsResponse:
        rows = await self.engine.list_workflows(plain_text(request.name_prefix, "name_prefix"), request.all_versions)
        return workflows_pb2.ListWorkflowsResponse(workflows=[convert.workflow_to_proto(r) for r in rows])
