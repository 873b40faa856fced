"""Auth configuration without a server: token files, the RPC -> roles table, the listen check, the flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import pytest

from cyclone_server import auth
from cyclone_server.serve import settings
from cyclone_proto import admin_pb2, runs_pb2, schedules_pb2, workers_pb2, workflows_pb2

W = "w" * 20  # tokens of 20 characters
S = "s" * 20
A = "a" * 20


def test_parse_lines_with_comments_and_several_roles() -> None:
    text = f"# workers\n{W} worker\n\n{S} submit,worker  # both\n{A} admin\n"
    assert auth.parse_tokens(text) == {W: {"worker"}, S: {"submit", "worker"}, A: {"admin"}}


def test_parse_semicolons_end_entries_like_newlines() -> None:
    assert auth.parse_tokens(f"{W} worker;{A} admin") == {W: {"worker"}, A: {"admin"}}


def test_parse_json() -> None:
    assert auth.parse_tokens(f'{{"{W}": ["worker"], "{A}": "admin,submit"}}') == {
        W: {"worker"}, A: {"admin", "submit"}}


@pytest.mark.parametrize("text, error", [
    (f"{W} wizard", "entry 1: unknown role 'wizard'"),
    (f"{W}", "entry 1: expected 'TOKEN ROLE[,ROLE]', got 1 fields"),
    ("short admin", "entry 1: a token must be at least 16 characters"),
    (f"{W} worker\n{W} admin", "entry 2: the same token is listed twice"),
    ('{"x": ', "invalid JSON"),
    (f'{{"{W}": []}}', "entry 1: roles must be a non-empty list"),
    ('["a"]', "must be an object"),
])
def test_parse_errors_name_the_entry(text: str, error: str) -> None:
    with pytest.raises(auth.SecurityConfigError, match=error.replace("[", r"\[").replace("]", r"\]")) as e:
        auth.parse_tokens(text, "tokens.txt")
    assert "tokens.txt" in str(e.value)
    assert W not in str(e.value)  # a token never appears in an error message


def test_load_merges_file_and_env_roles(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"{W} worker\n")
    assert auth.load_tokens(f, f"{W} submit;{A} admin") == {W: {"worker", "submit"}, A: {"admin"}}
    with pytest.raises(auth.SecurityConfigError, match="--tokens-file: cannot read"):
        auth.load_tokens(tmp_path / "missing")


def _all_methods() -> list[str]:
    methods = []
    for module, service in ((runs_pb2, "Runs"), (workers_pb2, "Workers"), (workflows_pb2, "Workflows"),
                            (admin_pb2, "Admin"), (schedules_pb2, "Schedules")):
        for m in module.DESCRIPTOR.services_by_name[service].methods:
            methods.append(f"/cyclone.v1.{service}/{m.name}")
    return methods


def test_every_rpc_of_the_contract_has_an_explicit_role() -> None:
    unlisted = [m for m in _all_methods() if m not in auth.METHOD_ROLES and not m.startswith("/cyclone.v1.Admin/")]
    assert unlisted == []


@pytest.mark.parametrize("method, roles", [
    ("/cyclone.v1.Workers/Connect", {"worker"}),
    ("/cyclone.v1.Runs/SubmitRun", {"submit", "admin"}),
    ("/cyclone.v1.Runs/Enqueue", {"submit", "admin"}),
    ("/cyclone.v1.Runs/EnqueueMany", {"submit", "admin"}),
    ("/cyclone.v1.Runs/WaitRun", {"submit", "admin"}),
    ("/cyclone.v1.Runs/Signal", {"submit", "admin"}),
    ("/cyclone.v1.Workflows/RegisterWorkflow", {"submit", "admin"}),
    ("/cyclone.v1.Workflows/ListWorkflows", {"submit", "admin"}),
    ("/cyclone.v1.Runs/CancelRun", {"admin"}),
    ("/cyclone.v1.Runs/RetryAll", {"admin"}),
    ("/cyclone.v1.Runs/PurgeTerminalRuns", {"admin"}),
    ("/cyclone.v1.Admin/GetStats", {"admin"}),
    ("/cyclone.v1.Admin/ListWorkers", {"admin"}),
    ("/cyclone.v1.Runs/SomeFutureRpc", {"admin"}),  # fails closed
    ("/grpc.health.v1.Health/Check", set()),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", set()),
    ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", set()),
])
def test_role_table(method: str, roles: set[str]) -> None:
    assert auth.roles_for(method) == roles


def test_interceptor_check_codes() -> None:
    icpt = auth.TokenAuthInterceptor({W: {"worker"}, A: {"admin"}})
    bearer = lambda t: [("authorization", f"Bearer {t}")]  # noqa: E731
    assert icpt.check("/cyclone.v1.Runs/CancelRun", bearer(A)) is None
    assert icpt.check("/grpc.health.v1.Health/Check", None) is None
    code, msg = icpt.check("/cyclone.v1.Runs/CancelRun", bearer(W))  # type: ignore[misc]
    assert code == grpc.StatusCode.PERMISSION_DENIED and "needs role admin" in msg and "worker" in msg
    assert icpt.check("/cyclone.v1.Runs/CancelRun", None)[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]
    assert icpt.check("/cyclone.v1.Runs/CancelRun", bearer("x" * 20))[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]
    assert icpt.check("/cyclone.v1.Runs/CancelRun", [("authorization", A)])[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]
    assert icpt.check("/cyclone.v1.Runs/CancelRun", [("authorization", f"bearer  {A} ")]) is None


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("example.com", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback


def test_require_safe_listen() -> None:
    auth.require_safe_listen("127.0.0.1", auth_enabled=False, allow_insecure=False)
    auth.require_safe_listen("0.0.0.0", auth_enabled=True, allow_insecure=False)
    auth.require_safe_listen("0.0.0.0", auth_enabled=False, allow_insecure=True)
    with pytest.raises(auth.SecurityConfigError, match="refusing to listen on 0.0.0.0 without authentication.*"
                                                       "--insecure-allow-no-auth"):
        auth.require_safe_listen("0.0.0.0", auth_enabled=False, allow_insecure=False)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:7233")
    settings.add(parser, groups=["security"])
    return parser.parse_args(list(argv))


def test_server_security_from_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CYCLONE_TOKENS", raising=False)
    assert auth.server_security(_args()) == ([], None)
    with pytest.raises(auth.SecurityConfigError, match="refusing to listen on 0.0.0.0"):
        auth.server_security(_args("--listen", "0.0.0.0:7233"))
    assert auth.server_security(_args("--listen", "0.0.0.0:7233", "--insecure-allow-no-auth")) == ([], None)
    f = tmp_path / "tokens"
    f.write_text(f"{A} admin\n")
    interceptors, creds = auth.server_security(_args("--listen", "0.0.0.0:7233", "--tokens-file", str(f)))
    assert [type(i) for i in interceptors] == [auth.TokenAuthInterceptor] and creds is None
    monkeypatch.setenv("CYCLONE_TOKENS", f"{W} worker")
    interceptors, _ = auth.server_security(_args("--listen", "[::]:7233"))
    assert interceptors[0].check("/cyclone.v1.Workers/Connect", [("authorization", f"Bearer {W}")]) is None


def test_server_security_tls_flag_errors(tmp_path: Path) -> None:
    with pytest.raises(auth.SecurityConfigError, match="--tls-cert and --tls-key must be given together"):
        auth.server_security(_args("--tls-cert", "c.pem"))
    with pytest.raises(auth.SecurityConfigError, match="--tls-client-ca .* needs --tls-cert"):
        auth.server_security(_args("--tls-client-ca", "ca.pem"))
    with pytest.raises(auth.SecurityConfigError, match="--tls-key: cannot read"):
        auth.server_security(_args("--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")))


def test_flags_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CYCLONE_TOKENS_FILE", "/etc/cyclone/tokens")
    monkeypatch.setenv("CYCLONE_TLS_CLIENT_CA", "/etc/cyclone/ca.pem")
    monkeypatch.setenv("CYCLONE_INSECURE_ALLOW_NO_AUTH", "true")
    args = _args()
    assert (args.tokens_file, args.tls_client_ca, args.insecure_allow_no_auth) == (
        "/etc/cyclone/tokens", "/etc/cyclone/ca.pem", True)


def test_bearer_metadata() -> None:
    assert auth.bearer_metadata(A) == (("authorization", f"Bearer {A}"),)
    assert auth.bearer_token(auth.bearer_metadata(A)) == A
