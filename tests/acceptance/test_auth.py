"""Auth over a real port: each role is let through or refused per RPC, unary and streaming; TLS, mTLS, certificate roles.

The server is a real grpc.aio server with the auth interceptor in front of servicers built
from the generated base classes, answering fixed responses (what is tested is the gate,
not the services), plus the real health and reflection services. Certificates are made
with the openssl CLI for each session.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from cyclone_server import auth
from cyclone_server.serve import settings
from cyclone_proto import (admin_pb2, admin_pb2_grpc, runs_pb2, runs_pb2_grpc, workers_pb2,
                                   workers_pb2_grpc, workflows_pb2, workflows_pb2_grpc)
from cyclone_proto import limits_pb2, limits_pb2_grpc, schedules_pb2, schedules_pb2_grpc

TOKENS = {"worker": "worker-token-0123456789", "submit": "submit-token-0123456789",
          "admin": "admin-token-01234567890", "both": "worker-and-submit-012345"}
TOKENS_TEXT = "\n".join([f"{TOKENS['worker']} worker", f"{TOKENS['submit']} submit", f"{TOKENS['admin']} admin",
                         f"{TOKENS['both']} worker,submit"])
SERVICES = ((runs_pb2, runs_pb2_grpc, "Runs"), (workflows_pb2, workflows_pb2_grpc, "Workflows"),
            (admin_pb2, admin_pb2_grpc, "Admin"), (schedules_pb2, schedules_pb2_grpc, "Schedules"),
            (limits_pb2, limits_pb2_grpc, "Limits"))

# Written out here rather than read from auth.METHOD_ROLES, so the test states the policy.
SUBMIT_RPCS = ["Runs/SubmitRun", "Runs/Enqueue", "Runs/EnqueueMany", "Runs/GetRun", "Runs/ListRuns", "Runs/WaitRun",
               "Runs/Signal", "Workflows/RegisterWorkflow", "Workflows/GetWorkflow", "Workflows/ListWorkflows",
               "Schedules/CreateSchedule", "Schedules/GetSchedule", "Schedules/ListSchedules",
               "Schedules/UpdateSchedule", "Schedules/TriggerSchedule", "Limits/GetLimit", "Limits/ListLimits"]
ADMIN_RPCS = ["Runs/CancelRun", "Runs/PauseRun", "Runs/ResumeRun", "Runs/RetryStep", "Runs/RetryAll",
              "Runs/PurgeTerminalRuns", "Admin/GetStats", "Admin/ListWorkers", "Schedules/PauseSchedule",
              "Schedules/ResumeSchedule", "Schedules/DeleteSchedule", "Limits/SetLimit", "Limits/DeleteLimit"]


def _fixed_servicer(pb2: Any, grpc_module: Any, service: str) -> Any:
    """A subclass of the generated base class whose every unary RPC returns an empty response."""
    methods = {}
    for m in pb2.DESCRIPTOR.services_by_name[service].methods:
        response = message_factory.GetMessageClass(m.output_type)

        async def handler(self: Any, request: Any, context: Any, _response: Any = response) -> Any:
            return _response()

        methods[m.name] = handler
    return type(f"Fixed{service}", (getattr(grpc_module, f"{service}Servicer"),), methods)()


class FixedWorkers(workers_pb2_grpc.WorkersServicer):
    """Answers the worker's Hello with a Welcome and ends the stream."""

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for message in request_iterator:
            yield workers_pb2.ServerMessage(welcome=workers_pb2.Welcome(server_id=message.hello.worker_id))
            return


async def _start(interceptors: list[Any], credentials: grpc.ServerCredentials | None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
    for pb2, grpc_module, service in SERVICES:
        getattr(grpc_module, f"add_{service}Servicer_to_server")(_fixed_servicer(pb2, grpc_module, service), server)
    workers_pb2_grpc.add_WorkersServicer_to_server(FixedWorkers(), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    reflection.enable_server_reflection(("cyclone.v1.Runs", reflection.SERVICE_NAME), server)
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def plain_server(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "tokens").write_text(TOKENS_TEXT)
    interceptors, credentials = auth.server_security(_server_args("--tokens-file", str(tmp_path / "tokens")))
    server, address = await _start(interceptors, credentials)
    yield address
    await server.stop(None)


def _server_args(*argv: str) -> Any:
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:0")
    settings.add(parser, groups=["security"])
    return parser.parse_args(list(argv))


def _request_class(method: str) -> Any:
    service, name = method.split("/")
    pb2 = {"Runs": runs_pb2, "Workflows": workflows_pb2, "Admin": admin_pb2, "Schedules": schedules_pb2,
           "Limits": limits_pb2}[service]
    return message_factory.GetMessageClass(pb2.DESCRIPTOR.services_by_name[service].methods_by_name[name].input_type)


async def _call(channel: grpc.aio.Channel, method: str) -> grpc.StatusCode:
    call = channel.unary_unary(f"/cyclone.v1.{method}", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    try:
        await call(_request_class(method)(), timeout=30)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as e:
        return e.code()


async def _connect(channel: grpc.aio.Channel, *, hello: bool = True) -> tuple[grpc.StatusCode, str]:
    """The stream's status and details, or OK and the Welcome's server id. Without `hello`,
    nothing is written: a refused stream ends as it starts, before any message. (Written
    after the server has ended the call, a message fails in grpc.aio's client, which then
    replaces the server's status with its own INTERNAL "Internal error from Core": about 1
    call in 200 on a loaded machine.)"""
    stub = workers_pb2_grpc.WorkersStub(channel)
    call = stub.Connect(timeout=30)
    if hello:
        await call.write(workers_pb2.WorkerMessage(hello=workers_pb2.Hello(worker_id="w1", kinds=["k"], slots=1)))
        async for message in call:
            return grpc.StatusCode.OK, message.welcome.server_id
    return await call.code(), await call.details() or ""


@pytest.mark.parametrize("role, allowed", [
    ("worker", set()),
    ("submit", set(SUBMIT_RPCS)),
    ("admin", set(SUBMIT_RPCS) | set(ADMIN_RPCS)),
    ("both", set(SUBMIT_RPCS)),
])
async def test_each_role_may_call_exactly_its_unary_rpcs(plain_server: str, role: str, allowed: set[str]) -> None:
    async with auth.open_channel(plain_server, token=TOKENS[role]) as channel:
        codes = {m: await _call(channel, m) for m in SUBMIT_RPCS + ADMIN_RPCS}
    assert {m for m, c in codes.items() if c == grpc.StatusCode.OK} == allowed
    assert {c for m, c in codes.items() if m not in allowed} <= {grpc.StatusCode.PERMISSION_DENIED}


async def test_worker_token_cannot_cancel_a_run(plain_server: str) -> None:
    async with auth.open_channel(plain_server, token=TOKENS["worker"]) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await runs_pb2_grpc.RunsStub(channel).CancelRun(runs_pb2.CancelRunRequest(run_id="x"), timeout=30)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "needs role admin" in (e.value.details() or "")


@pytest.mark.parametrize("role, expected", [
    ("worker", grpc.StatusCode.OK), ("both", grpc.StatusCode.OK),
    ("submit", grpc.StatusCode.PERMISSION_DENIED), ("admin", grpc.StatusCode.PERMISSION_DENIED)])
async def test_only_worker_tokens_open_the_worker_stream(plain_server: str, role: str,
                                                         expected: grpc.StatusCode) -> None:
    async with auth.open_channel(plain_server, token=TOKENS[role]) as channel:
        code, detail = await _connect(channel, hello=expected == grpc.StatusCode.OK)
    assert code == expected
    if expected == grpc.StatusCode.OK:
        assert detail == "w1"  # the servicer behind the gate answered the Hello
    else:
        assert "needs role worker" in detail


@pytest.mark.parametrize("token", [None, "not-a-known-token-0123456789"])
async def test_missing_or_unknown_token_is_unauthenticated(plain_server: str, token: str | None) -> None:
    async with auth.open_channel(plain_server, token=token) as channel:
        assert await _call(channel, "Runs/GetRun") == grpc.StatusCode.UNAUTHENTICATED
        assert (await _connect(channel, hello=False))[0] == grpc.StatusCode.UNAUTHENTICATED


async def test_health_and_reflection_need_no_token(plain_server: str) -> None:
    async with grpc.aio.insecure_channel(plain_server) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=30)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
    assert "cyclone.v1.Runs" in {s.name for s in reply.list_services_response.service}


# -- TLS and mTLS --------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# Client certificates of the test CA (certs), by file name: (subject CN, subject alternative names).
CLIENT_CERTS = {
    "client": ("cyclone-test-client", ""),
    "admin": ("cyclone-test-admin", ""),
    "san": ("cyclone-test-san", "DNS:Submitter.Cyclone.Test,URI:spiffe://cyclone.test/worker,IP:10.1.2.3"),
    "stranger": ("cyclone-test-stranger", "DNS:stranger.cyclone.test,email:stranger@cyclone.test"),
}
# Their roles (--tls-client-roles): "client" is a worker, "admin" an admin; "san" is known by two of
# its SANs only (DNS names match whatever their case), and so has worker and submit; "stranger" is
# not listed (its DNS name is, as a URI, which is another name).
CLIENT_ROLES_TEXT = """# identity                        roles
CN=cyclone-test-client            worker
cn=cyclone-test-admin             admin
DNS:submitter.cyclone.test        submit
URI:spiffe://cyclone.test/worker  worker
URI:stranger.cyclone.test         admin
"""


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and the client certificates of CLIENT_CERTS
    (NAME.pem, NAME.key), all signed by the CA."""
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=cyclone-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    clients = [(name, cn, (f"subjectAltName={sans}\n" if sans else "") + "extendedKeyUsage=clientAuth\n")
               for name, (cn, sans) in CLIENT_CERTS.items()]
    for name, cn, ext in (("server", "cyclone-test-server",
                           "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"), *clients):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    yield d


async def _health(channel: grpc.aio.Channel) -> grpc.StatusCode:
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as e:
        return e.code()


async def test_tls_with_tokens(certs: Path, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(TOKENS_TEXT)
    args = _server_args("--tokens-file", str(tmp_path / "tokens"), "--tls-cert", str(certs / "server.pem"),
                        "--tls-key", str(certs / "server.key"))
    server, address = await _start(*auth.server_security(args))
    try:
        # Token as call credentials, composed with the TLS channel credentials.
        async with auth.open_channel(address, token=TOKENS["admin"], ca_file=str(certs / "ca.pem")) as channel:
            assert await _call(channel, "Runs/CancelRun") == grpc.StatusCode.OK
        async with auth.open_channel(address, token=TOKENS["submit"], ca_file=str(certs / "ca.pem")) as channel:
            assert await _call(channel, "Runs/CancelRun") == grpc.StatusCode.PERMISSION_DENIED
            assert (await _connect(channel, hello=False))[0] == grpc.StatusCode.PERMISSION_DENIED
        async with auth.open_channel(address, ca_file=str(certs / "ca.pem")) as channel:
            assert await _call(channel, "Runs/GetRun") == grpc.StatusCode.UNAUTHENTICATED
        async with grpc.aio.insecure_channel(address) as channel:  # plaintext to a TLS port: no connection
            assert await _health(channel) == grpc.StatusCode.UNAVAILABLE
        async with auth.open_channel(address, tls=True) as channel:  # the test CA is not a system root
            assert await _health(channel) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


def _mtls_args(certs: Path, tmp_path: Path, *argv: str, roles: str | None = CLIENT_ROLES_TEXT) -> Any:
    """Server flags for mTLS with the test CA, the certificate roles `roles` (None: no such file) and `argv`."""
    extra = list(argv)
    if roles is not None:
        (tmp_path / "client-roles").write_text(roles)
        extra += ["--tls-client-roles", str(tmp_path / "client-roles")]
    return _server_args("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                        "--tls-client-ca", str(certs / "ca.pem"), *extra)


def _as(certs: Path, address: str, name: str, token: str | None = None) -> grpc.aio.Channel:
    """A channel presenting the client certificate `name` (and sending `token`)."""
    return auth.open_channel(address, token=token, ca_file=str(certs / "ca.pem"), cert_file=str(certs / f"{name}.pem"),
                             key_file=str(certs / f"{name}.key"))


async def _details(channel: grpc.aio.Channel, method: str) -> tuple[grpc.StatusCode, str]:
    call = channel.unary_unary(f"/cyclone.v1.{method}", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    try:
        await call(_request_class(method)(), timeout=30)
        return grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""


async def test_mtls_requires_a_client_certificate(certs: Path, tmp_path: Path) -> None:
    args = _mtls_args(certs, tmp_path, "--listen", "0.0.0.0:0")
    interceptors, credentials = auth.server_security(args)  # certificate roles count as auth on 0.0.0.0
    assert [type(i) for i in interceptors] == [auth.TokenAuthInterceptor] and credentials is not None
    server, address = await _start(interceptors, credentials)
    try:
        async with _as(certs, address, "admin") as channel:
            assert await _health(channel) == grpc.StatusCode.OK
            assert await _call(channel, "Runs/CancelRun") == grpc.StatusCode.OK
        async with auth.open_channel(address, ca_file=str(certs / "ca.pem")) as channel:  # no client certificate
            assert await _health(channel) == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(address) as channel:
            assert await _health(channel) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


def test_mtls_without_certificate_roles_or_tokens_is_refused(certs: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # It gave every certificate of the CA every role; now it names what to add.
    monkeypatch.delenv("CYCLONE_TOKENS", raising=False)
    with pytest.raises(auth.SecurityConfigError, match="--tls-client-ca .*needs --tls-client-roles PATH, or tokens"):
        auth.server_security(_mtls_args(certs, tmp_path, roles=None))
    (tmp_path / "tokens").write_text(TOKENS_TEXT)  # mTLS for the transport, tokens for the roles: as before
    interceptors, _ = auth.server_security(_mtls_args(certs, tmp_path, "--tokens-file", str(tmp_path / "tokens"),
                                                      roles=None))
    assert [type(i) for i in interceptors] == [auth.TokenAuthInterceptor]


@pytest.fixture
async def mtls_server(certs: Path, tmp_path: Path) -> AsyncIterator[str]:
    """A server with mTLS, CLIENT_ROLES_TEXT and the test tokens."""
    (tmp_path / "tokens").write_text(TOKENS_TEXT)
    server, address = await _start(*auth.server_security(
        _mtls_args(certs, tmp_path, "--tokens-file", str(tmp_path / "tokens"))))
    yield address
    await server.stop(None)


@pytest.mark.parametrize("name, allowed, stream", [
    ("client", set(), grpc.StatusCode.OK),
    ("admin", set(SUBMIT_RPCS) | set(ADMIN_RPCS), grpc.StatusCode.PERMISSION_DENIED),
    ("san", set(SUBMIT_RPCS), grpc.StatusCode.OK),  # DNS name -> submit, URI -> worker
])
async def test_each_certificate_may_call_exactly_the_rpcs_of_its_roles(
        certs: Path, mtls_server: str, name: str, allowed: set[str], stream: grpc.StatusCode) -> None:
    async with _as(certs, mtls_server, name) as channel:
        codes = {m: await _details(channel, m) for m in SUBMIT_RPCS + ADMIN_RPCS}
        assert {m for m, (c, _) in codes.items() if c == grpc.StatusCode.OK} == allowed
        for m, (code, details) in codes.items():
            if m not in allowed:
                assert code == grpc.StatusCode.PERMISSION_DENIED, (m, code, details)
                assert "needs role" in details and f"CN=cyclone-test-{name}" in details, details
        code, detail = await _connect(channel, hello=stream == grpc.StatusCode.OK)
        assert code == stream, detail
        if stream == grpc.StatusCode.OK:
            assert detail == "w1"  # the servicer behind the gate answered the Hello
        else:
            assert "needs role worker" in detail and "this client certificate" in detail


async def test_an_unlisted_certificate_of_the_ca_is_unauthenticated(certs: Path, mtls_server: str) -> None:
    async with _as(certs, mtls_server, "stranger") as channel:
        assert await _health(channel) == grpc.StatusCode.OK  # the TLS handshake passed: the CA signed it
        for method in ("Runs/GetRun", "Runs/CancelRun", "Admin/GetStats"):
            code, details = await _details(channel, method)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
            # Its names, as --tls-client-roles would write them; its DNS name is listed only as a URI.
            assert ("CN=cyclone-test-stranger, DNS:stranger.cyclone.test, email:stranger@cyclone.test" in details
                    and "--tls-client-roles" in details), details
        code, details = await _connect(channel, hello=False)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "CN=cyclone-test-stranger" in details


async def test_a_valid_token_decides_alone_over_mtls(certs: Path, mtls_server: str) -> None:
    async with _as(certs, mtls_server, "stranger", token=TOKENS["admin"]) as channel:
        assert await _call(channel, "Runs/CancelRun") == grpc.StatusCode.OK  # an unlisted certificate, a token
    async with _as(certs, mtls_server, "admin", token=TOKENS["worker"]) as channel:
        code, details = await _details(channel, "Runs/CancelRun")  # the token's roles, not the certificate's
        assert code == grpc.StatusCode.PERMISSION_DENIED and "this token has worker" in details, details
        assert (await _connect(channel))[0] == grpc.StatusCode.OK
    async with _as(certs, mtls_server, "client", token=TOKENS["submit"]) as channel:
        assert (await _connect(channel, hello=False))[0] == grpc.StatusCode.PERMISSION_DENIED
    # A token the server does not know leaves the call to the certificate, and the answer says so.
    async with _as(certs, mtls_server, "admin", token="not-a-known-token-0123456789") as channel:
        assert await _call(channel, "Runs/CancelRun") == grpc.StatusCode.OK
    async with _as(certs, mtls_server, "stranger", token="not-a-known-token-0123456789") as channel:
        code, details = await _details(channel, "Runs/GetRun")
        assert code == grpc.StatusCode.UNAUTHENTICATED and "the bearer token sent is not known" in details


async def test_a_refused_certificate_call_is_answered_before_its_message_is_read(certs: Path,
                                                                                 mtls_server: str) -> None:
    # The server reads messages of up to grpc's default 4 MiB: read, 8 MiB is RESOURCE_EXHAUSTED. A call
    # refused for its certificate is answered without reading it, as a call without a token is.
    big = runs_pb2.CancelRunRequest(run_id="x" * (8 << 20))
    for name, expected in (("stranger", grpc.StatusCode.UNAUTHENTICATED), ("client", grpc.StatusCode.PERMISSION_DENIED),
                           ("admin", grpc.StatusCode.RESOURCE_EXHAUSTED)):
        async with _as(certs, mtls_server, name) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await runs_pb2_grpc.RunsStub(channel).CancelRun(big, timeout=30)
        assert e.value.code() == expected, (name, e.value)
