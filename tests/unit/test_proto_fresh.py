"""The committed generated code matches proto/ and exposes the public services."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
GEN_SCRIPT = ROOT / "scripts" / "gen_proto.py"
# Every file of proto/: a new one is checked (fresh, importable, commented) without a change here.
PROTO_NAMES = sorted(p.stem for p in (ROOT / "proto" / "cyclone" / "v1").glob("*.proto"))

# The services and RPCs of docs/lifecycle.md, "Public names": renaming or dropping one breaks
# every worker and client in every language.
SERVICES = {
    "Workflows": {"RegisterWorkflow", "GetWorkflow", "ListWorkflows"},
    "Runs": {
        "SubmitRun",
        "Enqueue",
        "EnqueueMany",  # beside the lifecycle's own names: one call and one commit for many jobs
        "GetRun",
        "ListRuns",
        "WaitRun",
        "CancelRun",
        "PauseRun",
        "ResumeRun",
        "RetryStep",
        "RetryAll",
        "Signal",
        "PurgeTerminalRuns",
    },
    "Workers": {"Connect"},
    "Admin": {"GetStats", "ListWorkers"},
    "Schedules": {"CreateSchedule", "GetSchedule", "ListSchedules", "UpdateSchedule", "PauseSchedule",
                  "ResumeSchedule", "DeleteSchedule", "TriggerSchedule"},
    "Limits": {"SetLimit", "GetLimit", "ListLimits", "DeleteLimit"},
}


def test_every_proto_file_is_checked() -> None:
    assert {"types", "workflows", "runs", "workers", "admin", "schedules", "limits"} <= set(PROTO_NAMES)


def test_generated_code_is_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(GEN_SCRIPT), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        "generated code is stale or the generator failed; run "
        f"`python scripts/gen_proto.py`:\n{done.stdout}{done.stderr}"
    )


def test_generator_refuses_other_grpcio_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", GEN_SCRIPT)
    assert spec and spec.loader
    gen_proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_proto)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "1.0.0")
    with pytest.raises(SystemExit, match="grpcio-tools==1.85.1 is required, found 1.0.0"):
        gen_proto.check_tool_version()


@pytest.mark.parametrize("name", PROTO_NAMES)
def test_generated_modules_import(name: str) -> None:
    pb2 = importlib.import_module(f"cyclone_proto.{name}_pb2")
    importlib.import_module(f"cyclone_proto.{name}_pb2_grpc")
    assert pb2.DESCRIPTOR.package == "cyclone.v1"
    assert pb2.DESCRIPTOR.name == f"cyclone/v1/{name}.proto"


def test_services_and_rpcs() -> None:
    found: dict[str, set[str]] = {}
    for name in PROTO_NAMES:
        pb2 = importlib.import_module(f"cyclone_proto.{name}_pb2")
        for service in pb2.DESCRIPTOR.services_by_name.values():
            found[service.full_name] = {method.name for method in service.methods}
    assert found == {f"cyclone.v1.{s}": rpcs for s, rpcs in SERVICES.items()}


def test_connect_is_bidirectional() -> None:
    from cyclone_proto import workers_pb2

    connect = workers_pb2.DESCRIPTOR.services_by_name["Workers"].methods_by_name["Connect"]
    assert connect.client_streaming and connect.server_streaming
    assert connect.input_type.full_name == "cyclone.v1.WorkerMessage"
    assert connect.output_type.full_name == "cyclone.v1.ServerMessage"


def test_every_element_is_commented(tmp_path: Path) -> None:
    """The comments are the protocol reference for other languages: none may be missing."""
    from grpc_tools import protoc

    out = tmp_path / "cyclone.binpb"
    rc = protoc.main(
        [
            "protoc",
            f"--proto_path={ROOT / 'proto'}",
            f"--proto_path={_well_known_include()}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *(f"cyclone/v1/{name}.proto" for name in PROTO_NAMES),
        ]
    )
    assert rc == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file

    missing = []
    for file in files:
        commented = {
            tuple(loc.path)
            for loc in file.source_code_info.location
            if loc.leading_comments.strip()
        }
        missing += [f"{file.name}: {what}" for path, what in _elements(file) if path not in commented]
    assert not missing, "uncommented:\n" + "\n".join(missing)


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


Element = tuple[tuple[int, ...], str]


def _elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[Element]:
    """(source path, label) of every message, field, enum, value, service and RPC.

    Source paths follow descriptor.proto's field numbers: FileDescriptorProto
    message_type = 4, enum_type = 5, service = 6; DescriptorProto field = 2,
    nested_type = 3, enum_type = 4; EnumDescriptorProto value = 2;
    ServiceDescriptorProto method = 2.
    """

    def message(msg: descriptor_pb2.DescriptorProto, path: tuple[int, ...], prefix: str) -> Iterator[Element]:
        name = f"{prefix}{msg.name}"
        yield path, f"message {name}"
        for i, field in enumerate(msg.field):
            yield (*path, 2, i), f"field {name}.{field.name}"
        for i, nested in enumerate(msg.nested_type):
            if not nested.options.map_entry:
                yield from message(nested, (*path, 3, i), f"{name}.")
        for i, nested_enum in enumerate(msg.enum_type):
            yield from enum(nested_enum, (*path, 4, i), f"{name}.")

    def enum(en: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], prefix: str) -> Iterator[Element]:
        yield path, f"enum {prefix}{en.name}"
        for i, value in enumerate(en.value):
            yield (*path, 2, i), f"enum value {value.name}"

    for i, msg in enumerate(file.message_type):
        yield from message(msg, (4, i), "")
    for i, en in enumerate(file.enum_type):
        yield from enum(en, (5, i), "")
    for i, service in enumerate(file.service):
        yield (6, i), f"service {service.name}"
        for j, method in enumerate(service.method):
            yield (6, i, 2, j), f"rpc {service.name}.{method.name}"
