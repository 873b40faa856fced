"""Fuzz of every unary RPC, from the request descriptors: no answer is ever INTERNAL or UNKNOWN.

Each example sends one generated request (random and valid-looking ids, NUL characters,
huge and odd strings, extreme numbers, out-of-range durations and timestamps, deeply
nested JSON), or its bytes mangled; then a real SDK worker must complete a canary job,
so the server is still serving. One server for the module; bounded in examples.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyclone_server.convert import py_to_value
from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2, workflows_pb2_grpc

from fuzz_helpers import KNOWN_IDS, fuzz_server, messages, mutations  # noqa: F401  (fuzz_server: a fixture)
from rpc_descriptors import Rpc, unary_rpcs

RPCS = unary_rpcs()
FORBIDDEN = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
CALL_TIMEOUT = 20.0
WAIT_TIMEOUT = 1.0  # a WaitRun on a live run may wait as long as it was asked: DEADLINE_EXCEEDED is fine


@pytest.fixture(scope="module")
def seeded(fuzz_server: Any) -> Any:
    """Workflows, runs and steps for valid-looking ids to name."""
    with grpc.insecure_channel(fuzz_server.address) as channel:
        wf, runs = workflows_pb2_grpc.WorkflowsStub(channel), runs_pb2_grpc.RunsStub(channel)
        N = types_pb2.Node
        wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="fz", nodes=[
            N(id="a", kind="fz-job"), N(id="go", type=types_pb2.NODE_TYPE_SIGNAL, signal="go", deps=["a"])]))
        wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="fz-wait", nodes=[
            N(id="sig", type=types_pb2.NODE_TYPE_SIGNAL, signal="go")]))
        for name in ("fz", "fz-wait"):
            run_id = runs.SubmitRun(runs_pb2.SubmitRunRequest(workflow=name, input=py_to_value({"n": 1}))).run_id
            KNOWN_IDS.append(run_id)
            KNOWN_IDS.extend(s.id for s in runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id)).steps)
        job = runs.Enqueue(runs_pb2.EnqueueRequest(kind="fz-job"))
        KNOWN_IDS.extend([job.run_id, job.step_id])
    return fuzz_server


def call(channel: grpc.Channel, rpc: Rpc, request: Any, *, raw: bool) -> grpc.StatusCode:
    stub = channel.unary_unary(rpc.path, request_serializer=None if raw else rpc.request.SerializeToString,
                               response_deserializer=rpc.response.FromString)
    try:
        stub(request, timeout=WAIT_TIMEOUT if rpc.name == "WaitRun" else CALL_TIMEOUT)
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc.name == "WaitRun":
            return code
        assert code not in FORBIDDEN and code != grpc.StatusCode.DEADLINE_EXCEEDED, \
            f"{rpc.name}: {code.name} {e.details()}\nrequest: {request!r:.2000}"
        return code
    return grpc.StatusCode.OK


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_unary_rpcs_never_answer_internal_or_unknown(seeded: Any, data: st.DataObject) -> None:
    rpc = data.draw(st.sampled_from(RPCS), label="rpc")
    request = data.draw(messages(rpc.request), label="request")
    with grpc.insecure_channel(seeded.address, options=[("grpc.max_send_message_length", -1)]) as channel:
        if data.draw(st.integers(1, 10), label="mangle") == 10:  # one in ten, roughly
            call(channel, rpc, data.draw(mutations(), label="mutation")(request.SerializeToString()), raw=True)
        else:
            call(channel, rpc, request, raw=False)
    seeded.canary.check()
