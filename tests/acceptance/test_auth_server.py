"""Auth on the real `cyclone-server`: roles on real RPCs, the SDK and the CLI with tokens, TLS, mTLS, and binding rules.

Each server is the real process started with `--tokens-file` (and the TLS flags); every
call does real work on the test's database, and a refused call is checked to have
changed nothing. Certificates come from test_auth's session fixture (openssl CLI).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cyclone_server.store.engine import Engine
from cyclone_worker import Client, Context, CycloneClientError, Reconnect, Worker, Workflow
from test_auth import CLIENT_ROLES_TEXT, TOKENS, TOKENS_TEXT, certs  # noqa: F401  (certs: the session fixture)

DEADLINE = 60.0
CLI = "import sys; from cyclone_server.cli.main import main; sys.exit(main(sys.argv[1:]))"
OK = "OK"
SUBMIT_ACTIONS = {"register", "get_workflow", "list_workflows", "submit", "enqueue", "get", "list", "wait", "signal"}
ADMIN_ACTIONS = {"cancel", "pause", "resume", "retry", "retry_all", "purge", "stats"}
# A refused stream can reach the client while it still writes its Hello; grpcio then reports
# INTERNAL (grpc/grpc#36066), which the SDK treats as transient and reconnects: the auth
# status follows on a later attempt and stops the worker for good.
QUICK = Reconnect(initial=0.05, maximum=0.2)


def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(TOKENS_TEXT)
    return str(path)


def loopback(address: str) -> str:
    """A server bound to 0.0.0.0 is reached on 127.0.0.1 (the address its certificate names)."""
    return "127.0.0.1:" + address.rsplit(":", 1)[1]


def cli(address: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    return subprocess.run([sys.executable, "-c", CLI, *args, "--address", address], capture_output=True, text=True,
                          timeout=120, env={**base, **(env or {})})


async def health(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.StatusCode:
    channel = (grpc.aio.secure_channel(address, credentials) if credentials is not None
               else grpc.aio.insecure_channel(address))
    async with channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            return e.code()


async def code_of(call: Awaitable[Any]) -> str:
    try:
        await call
        return OK
    except CycloneClientError as e:
        return e.code.name


class Runs:
    """Runs in the states an action needs, made with the admin token and the engine (as a worker would)."""

    def __init__(self, admin: Client, engine: Engine) -> None:
        self.admin = admin
        self.engine = engine

    async def running(self) -> str:
        return await self.admin.submit("base")

    async def paused(self) -> str:
        run_id = await self.running()
        await self.admin.pause(run_id)
        return run_id

    async def failed(self) -> str:
        """A failed run whose node "a" is discarded (of a kind of its own, so the claim takes that very step)."""
        kind = f"failing_{os.urandom(4).hex()}"
        await self.admin.register(Workflow(kind).task("a", kind=kind))
        run_id = await self.admin.submit(kind)
        deadline = time.monotonic() + DEADLINE
        while not (leases := await self.engine.claim("auth-test", [kind], 1, lease_ttl=60)):
            assert time.monotonic() < deadline, f"no step of kind {kind} became claimable"
            await asyncio.sleep(0.05)
        await self.engine.fail(str(leases[0]["step_id"]), leases[0]["lease_generation"], "boom", permanent=True)
        assert (await self.admin.get(run_id)).state == "failed"
        return run_id


async def attempt(action: str, client: Client, runs: Runs) -> tuple[str, str | None]:
    """(status of `action` by `client`, run id it acted on, if any)."""
    run_id: str | None = None
    if action in ("get", "wait", "signal", "cancel", "pause"):
        run_id = await runs.running()
    elif action == "resume":
        run_id = await runs.paused()
    elif action in ("retry", "retry_all"):
        run_id = await runs.failed()
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "register": lambda: client.register(Workflow(f"wf_{os.urandom(4).hex()}").task("a")),
        "get_workflow": lambda: client.get_workflow("base"),
        "list_workflows": lambda: client.list_workflows(),
        "submit": lambda: client.submit("base"),
        "enqueue": lambda: client.enqueue("job"),
        "get": lambda: client.get(run_id),
        "list": lambda: client.list(),
        "wait": lambda: client.wait(run_id, timeout=0.1),
        "signal": lambda: client.signal(run_id, "go"),
        "cancel": lambda: client.cancel(run_id),
        "pause": lambda: client.pause(run_id),
        "resume": lambda: client.resume(run_id),
        "retry": lambda: client.retry(run_id, "a"),
        "retry_all": lambda: client.retry_all(run_id),
        "purge": lambda: client.purge(3600),
        "stats": lambda: client.stats(),
    }
    return await code_of(calls[action]()), run_id


@pytest.fixture
def token_server(start_server: Callable[..., Any], db_url: str, tmp_path: Path) -> Any:
    return start_server(db_url, extra_args=["--tokens-file", tokens_file(tmp_path)])


@pytest.mark.parametrize("role, allowed", [
    ("worker", set()), ("submit", SUBMIT_ACTIONS), ("admin", SUBMIT_ACTIONS | ADMIN_ACTIONS)])
async def test_each_role_on_real_rpcs(token_server: Any, engine: Engine, role: str, allowed: set[str]) -> None:
    async with Client(token_server.address, token=TOKENS["admin"]) as admin, \
            Client(token_server.address, token=TOKENS[role]) as client:
        await admin.register(Workflow("base").task("a"))
        runs = Runs(admin, engine)
        before = (await admin.get(await runs.running())).state  # the admin token works: the state is readable
        assert before == "running"
        for action in sorted(SUBMIT_ACTIONS | ADMIN_ACTIONS):
            code, run_id = await attempt(action, client, runs)
            assert code == (OK if action in allowed else "PERMISSION_DENIED"), f"{role} {action}: {code}"
            if run_id is not None and action in ADMIN_ACTIONS:
                state = (await admin.get(run_id)).state
                changed = {"cancel": "cancelled", "pause": "paused", "resume": "running", "retry": "running",
                           "retry_all": "running"}[action]
                unchanged = {"resume": "paused", "retry": "failed", "retry_all": "failed"}.get(action, "running")
                assert state == (changed if action in allowed else unchanged), f"{role} {action}: run is {state}"


async def test_no_or_unknown_token_is_unauthenticated(token_server: Any) -> None:
    for token in (None, "not-a-known-token-0123456789"):
        async with Client(token_server.address, token=token) as client:
            assert await code_of(client.list_workflows()) == "UNAUTHENTICATED"
            assert await code_of(client.stats()) == "UNAUTHENTICATED"
        worker = Worker(token_server.address, token=token, reconnect=QUICK)
        worker.register("a", lambda ctx: None)
        with pytest.raises(CycloneClientError) as e:
            async with worker:
                pass
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert await health(token_server.address) == grpc.StatusCode.OK  # probes need no token


@pytest.mark.parametrize("role, expected", [("worker", None), ("submit", "PERMISSION_DENIED"),
                                            ("admin", "PERMISSION_DENIED")])
async def test_only_a_worker_token_connects_an_sdk_worker(token_server: Any, role: str, expected: str | None) -> None:
    worker = Worker(token_server.address, token=TOKENS[role], reconnect=QUICK, grace=2.0)

    @worker.handler("a")
    async def a(ctx: Context) -> dict[str, Any]:
        return {"by": role}

    async with Client(token_server.address, token=TOKENS["submit"]) as client:
        await client.register(Workflow("base").task("a"))
        run_id = await client.submit("base")
        if expected is None:
            async with worker:
                assert await client.result(run_id, timeout=DEADLINE) == {"a": {"by": "worker"}}
            return
        with pytest.raises(CycloneClientError) as e:
            async with worker:
                pass
        assert e.value.code.name == expected and "needs role worker" in e.value.message, e.value.message
        assert (await client.get(run_id)).steps[0].lease_generation == 0  # nothing was leased


async def test_cli_with_token(token_server: Any) -> None:
    async with Client(token_server.address, token=TOKENS["submit"]) as client:
        await client.register(Workflow("base").task("a"))
        run_id = await client.submit("base")
        refused = cli(token_server.address, "runs", "cancel", run_id, "--token", TOKENS["submit"])
        assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr, refused.stderr
        missing = cli(token_server.address, "runs", "get", run_id)
        assert missing.returncode == 1 and "UNAUTHENTICATED" in missing.stderr, missing.stderr
        read = cli(token_server.address, "runs", "get", run_id, "--json", env={"CYCLONE_TOKEN": TOKENS["submit"]})
        assert read.returncode == 0 and run_id in read.stdout, read.stderr
        assert (await client.get(run_id)).state == "running"
        done = cli(token_server.address, "runs", "cancel", run_id, "--token", TOKENS["admin"])
        assert done.returncode == 0, done.stderr
        assert (await client.get(run_id)).state == "cancelled"
    stats = cli(token_server.address, "stats", "--token", TOKENS["worker"])
    assert stats.returncode == 1 and "PERMISSION_DENIED" in stats.stderr


async def test_tls_with_tokens(start_server: Callable[..., Any], db_url: str, tmp_path: Path,
                               certs: Path) -> None:  # noqa: F811
    srv = start_server(db_url, extra_args=["--tokens-file", tokens_file(tmp_path), "--tls-cert",
                                           str(certs / "server.pem"), "--tls-key", str(certs / "server.key")])
    tls = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    worker = Worker(srv.address, token=TOKENS["worker"], tls=tls, reconnect=None, grace=2.0)
    worker.register("a", lambda ctx: {"over": "tls"})
    async with Client(srv.address, token=TOKENS["submit"], tls=tls) as client:
        await client.register(Workflow("base").task("a"))
        run_id = await client.submit("base")
        assert await code_of(client.cancel(run_id)) == "PERMISSION_DENIED"
        async with worker:
            assert await client.result(run_id, timeout=DEADLINE) == {"a": {"over": "tls"}}
    async with Client(srv.address, tls=tls) as anonymous:
        assert await code_of(anonymous.list()) == "UNAUTHENTICATED"
    assert await health(srv.address, tls) == grpc.StatusCode.OK
    assert await health(srv.address) == grpc.StatusCode.UNAVAILABLE  # plaintext to the TLS port
    stats = cli(srv.address, "stats", "--ca-file", str(certs / "ca.pem"), "--token", TOKENS["admin"])
    assert stats.returncode == 0, stats.stderr
    plain = cli(srv.address, "stats", "--token", TOKENS["admin"], "--rpc-timeout", "3s")
    assert plain.returncode == 1


def mtls(certs: Path, name: str) -> grpc.ChannelCredentials:
    """Channel credentials presenting the client certificate `name` of test_auth.CLIENT_CERTS."""
    return grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes(), (certs / f"{name}.key").read_bytes(),
                                        (certs / f"{name}.pem").read_bytes())


def mtls_flags(certs: Path, tmp_path: Path) -> list[str]:
    """mTLS with the test CA, and the certificate roles of test_auth.CLIENT_ROLES_TEXT."""
    roles = tmp_path / "client-roles"
    roles.write_text(CLIENT_ROLES_TEXT)
    return ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
            "--tls-client-ca", str(certs / "ca.pem"), "--tls-client-roles", str(roles)]


async def test_mtls_certificate_roles_on_all_interfaces(start_server: Callable[..., Any], db_url: str, certs: Path,
                                                        tmp_path: Path) -> None:  # noqa: F811
    # Certificate "client" is a worker, "admin" an admin, "san" a submitter (by its DNS name) and a
    # worker (by its URI); "stranger", signed by the same CA, is not listed.
    srv = start_server(db_url, extra_args=["--listen", "0.0.0.0:0", *mtls_flags(certs, tmp_path)])
    address = loopback(srv.address)
    worker = Worker(address, tls=mtls(certs, "client"), reconnect=None, grace=2.0)
    worker.register("a", lambda ctx: {"over": "mtls"})
    async with Client(address, tls=mtls(certs, "admin")) as admin, \
            Client(address, tls=mtls(certs, "san")) as submitter, \
            Client(address, tls=mtls(certs, "client")) as as_worker, \
            Client(address, tls=mtls(certs, "stranger")) as stranger, worker:
        await submitter.register(Workflow("base").task("a"))
        await admin.register(Workflow("unserved").task("b"))  # no worker takes b: the run waits to be cancelled
        run_id = await submitter.submit("base")
        assert await submitter.result(run_id, timeout=DEADLINE) == {"a": {"over": "mtls"}}
        waiting = await submitter.submit("unserved")
        assert await code_of(as_worker.cancel(waiting)) == "PERMISSION_DENIED"
        assert await code_of(submitter.cancel(waiting)) == "PERMISSION_DENIED"
        assert await code_of(as_worker.list()) == "PERMISSION_DENIED"
        assert await code_of(stranger.list()) == "UNAUTHENTICATED"
        assert await code_of(stranger.cancel(waiting)) == "UNAUTHENTICATED"
        assert (await admin.get(waiting)).state == "running"
        assert (await admin.cancel(waiting)).state == "cancelled"
        await admin.stats()  # the Admin service: admin only
    for name, expected, says in (("stranger", "UNAUTHENTICATED", "(CN=cyclone-test-stranger, "),
                                 ("admin", "PERMISSION_DENIED", "needs role worker")):
        refused = Worker(address, tls=mtls(certs, name), reconnect=QUICK)
        refused.register("a", lambda ctx: None)
        with pytest.raises(CycloneClientError) as e:
            async with refused:
                pass
        assert e.value.code.name == expected and says in e.value.message, e.value.message
    ca = (certs / "ca.pem").read_bytes()
    assert await health(address, grpc.ssl_channel_credentials(ca)) == grpc.StatusCode.UNAVAILABLE  # no client cert
    assert await health(address) == grpc.StatusCode.UNAVAILABLE
    tls = ["--ca-file", str(certs / "ca.pem")]
    listed = cli(address, "runs", "list", *tls, "--client-cert", str(certs / "admin.pem"),
                 "--client-key", str(certs / "admin.key"))
    assert listed.returncode == 0 and run_id in listed.stdout, listed.stderr
    refused = cli(address, "stats", *tls, "--client-cert", str(certs / "san.pem"), "--client-key",
                  str(certs / "san.key"))
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr, refused.stderr


def test_mtls_without_certificate_roles_or_tokens_refuses_to_start(db_url: str, certs: Path) -> None:  # noqa: F811
    # mTLS alone gave every certificate of the CA every role; the server now says what to add.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    proc = subprocess.run([sys.executable, "-m", "cyclone_server", "--database-url", db_url, "--listen", "127.0.0.1:0",
                           "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                           "--tls-client-ca", str(certs / "ca.pem")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "--tls-client-ca (mTLS) needs --tls-client-roles PATH, or tokens" in proc.stderr, proc.stderr
    assert "--tokens-file" in proc.stderr


async def test_tokens_and_certificate_roles_together(start_server: Callable[..., Any], db_url: str, certs: Path,
                                                     tmp_path: Path) -> None:  # noqa: F811
    """A valid token decides alone; without one the certificate does, for the schedules' role check too."""
    from cyclone_proto import runs_pb2, schedules_pb2, schedules_pb2_grpc

    P = schedules_pb2
    srv = start_server(db_url, extra_args=["--tokens-file", tokens_file(tmp_path), *mtls_flags(certs, tmp_path)])
    async with Client(srv.address, tls=mtls(certs, "stranger"), token=TOKENS["admin"]) as stranger_with_token, \
            Client(srv.address, tls=mtls(certs, "admin"), token=TOKENS["submit"]) as admin_with_submit_token:
        await stranger_with_token.register(Workflow("base").task("a"))
        run_id = await admin_with_submit_token.submit("base")
        assert await code_of(admin_with_submit_token.cancel(run_id)) == "PERMISSION_DENIED"  # the token's roles
        assert (await stranger_with_token.cancel(run_id)).state == "cancelled"

    def create(name: str) -> P.CreateScheduleRequest:
        return P.CreateScheduleRequest(name=name, paused=True, settings=P.ScheduleSettings(
            job=runs_pb2.EnqueueRequest(kind="nightly"), cron=P.CronSpec(expression="0 3 * * *"),
            overlap=P.OVERLAP_POLICY_CANCEL_PREVIOUS))

    # cancel_previous cancels runs: it needs the role admin, of the certificate when no token is sent.
    for name, token, expected in (("san", None, grpc.StatusCode.PERMISSION_DENIED), ("admin", None, None),
                                  ("client", TOKENS["admin"], None),
                                  ("admin", TOKENS["submit"], grpc.StatusCode.PERMISSION_DENIED)):
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        async with grpc.aio.secure_channel(srv.address, mtls(certs, name)) as channel:
            call = schedules_pb2_grpc.SchedulesStub(channel).CreateSchedule(
                create(f"by_{name}_{'token' if token else 'cert'}"), metadata=metadata, timeout=30)
            if expected is None:
                assert (await call).created
                continue
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == expected and "cancel_previous" in (e.value.details() or ""), e.value


def test_refuses_all_interfaces_without_auth(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYCLONE_")}
    proc = subprocess.run([sys.executable, "-m", "cyclone_server", "--database-url", db_url, "--listen", "0.0.0.0:0"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert "refusing to listen on 0.0.0.0 without authentication" in proc.stderr
    assert "--insecure-allow-no-auth" in proc.stderr


async def test_all_interfaces_with_insecure_flag_or_env_tokens(start_server: Callable[..., Any], db_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    open_srv = start_server(db_url, extra_args=["--listen", "0.0.0.0:0", "--insecure-allow-no-auth"])
    async with Client(loopback(open_srv.address)) as client:
        assert await client.list_workflows() == []  # no auth at all
    monkeypatch.setenv("CYCLONE_TOKENS", f"{TOKENS['admin']} admin")  # the server process inherits it
    guarded = start_server(db_url, extra_args=["--listen", "0.0.0.0:0"])
    async with Client(loopback(guarded.address)) as client:
        assert await code_of(client.stats()) == "UNAUTHENTICATED"
    async with Client(loopback(guarded.address), token=TOKENS["admin"]) as client:
        assert await client.stats() == []


async def test_the_overlap_policy_cancel_previous_needs_the_admin_role(token_server: Any) -> None:
    """A schedule's cancel_previous cancels runs, as CancelRun does: a submit token may neither set
    it (CreateSchedule, UpdateSchedule) nor trigger under it; every refusal changes nothing."""
    from cyclone_proto import runs_pb2, runs_pb2_grpc, schedules_pb2, schedules_pb2_grpc, types_pb2

    P = schedules_pb2
    as_admin = (("authorization", f"Bearer {TOKENS['admin']}"),)
    as_submit = (("authorization", f"Bearer {TOKENS['submit']}"),)

    def settings(overlap: int) -> schedules_pb2.ScheduleSettings:
        return P.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="nightly"), cron=P.CronSpec(expression="0 3 * * *"),
                                  overlap=overlap)

    async def denied(call: Awaitable[Any]) -> str:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value
        return e.value.details()

    async with grpc.aio.insecure_channel(token_server.address) as ch:
        sched, runs = schedules_pb2_grpc.SchedulesStub(ch), runs_pb2_grpc.RunsStub(ch)
        # Paused: no fire time of its own during the test (a trigger still starts a run).
        await sched.CreateSchedule(P.CreateScheduleRequest(name="nightly", settings=settings(P.OVERLAP_POLICY_SKIP),
                                                           paused=True), metadata=as_submit)
        first = await sched.TriggerSchedule(P.TriggerScheduleRequest(name="nightly"), metadata=as_submit)
        assert first.outcome == P.FIRE_OUTCOME_STARTED  # no worker: the run stays active

        async def state(run_id: str) -> int:
            return (await runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id), metadata=as_admin)).state

        # A submit token may not set cancel_previous, nor trigger with it.
        assert "cancel_previous" in await denied(sched.CreateSchedule(P.CreateScheduleRequest(
            name="other", settings=settings(P.OVERLAP_POLICY_CANCEL_PREVIOUS)), metadata=as_submit))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await sched.GetSchedule(P.GetScheduleRequest(name="other"), metadata=as_admin)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        await denied(sched.UpdateSchedule(P.UpdateScheduleRequest(
            name="nightly", settings=settings(P.OVERLAP_POLICY_CANCEL_PREVIOUS)), metadata=as_submit))
        await denied(sched.TriggerSchedule(P.TriggerScheduleRequest(
            name="nightly", overlap=P.OVERLAP_POLICY_CANCEL_PREVIOUS), metadata=as_submit))
        got = await sched.GetSchedule(P.GetScheduleRequest(name="nightly"), metadata=as_admin)
        assert (got.settings.overlap, got.fires) == (P.OVERLAP_POLICY_SKIP, 1)
        assert await state(first.run_id) == types_pb2.RUN_STATE_RUNNING

        # Set by an admin, the schedule's own cancel_previous still needs one to trigger under it...
        await sched.UpdateSchedule(P.UpdateScheduleRequest(
            name="nightly", settings=settings(P.OVERLAP_POLICY_CANCEL_PREVIOUS)), metadata=as_admin)
        await denied(sched.TriggerSchedule(P.TriggerScheduleRequest(name="nightly"), metadata=as_submit))
        assert await state(first.run_id) == types_pb2.RUN_STATE_RUNNING
        # ...while a trigger that names a policy that cancels nothing stays open to submit.
        skipped = await sched.TriggerSchedule(P.TriggerScheduleRequest(
            name="nightly", overlap=P.OVERLAP_POLICY_SKIP), metadata=as_submit)
        assert skipped.outcome == P.FIRE_OUTCOME_SKIPPED
        # The admin's trigger cancels the active run and starts the next.
        second = await sched.TriggerSchedule(P.TriggerScheduleRequest(name="nightly"), metadata=as_admin)
        assert second.outcome == P.FIRE_OUTCOME_STARTED and second.run_id != first.run_id
        assert await state(first.run_id) == types_pb2.RUN_STATE_CANCELLED
