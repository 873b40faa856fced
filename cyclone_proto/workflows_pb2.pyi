from cyclone_proto import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterWorkflowRequest(_message.Message):
    __slots__ = ("name", "nodes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    nodes: _containers.RepeatedCompositeFieldContainer[_types_pb2.Node]
    def __init__(self, name: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[_types_pb2.Node, _Mapping]]] = ...) -> None: ...

class RegisterWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "created")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    workflow: _types_pb2.Workflow
    created: bool
    def __init__(self, workflow: _Optional[_Union[_types_pb2.Workflow, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("name_prefix", "all_versions")
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ALL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    name_prefix: str
    all_versions: bool
    def __init__(self, name_prefix: _Optional[str] = ..., all_versions: _Optional[bool] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows",)
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[_types_pb2.Workflow]
    def __init__(self, workflows: _Optional[_Iterable[_Union[_types_pb2.Workflow, _Mapping]]] = ...) -> None: ...
