"""Auth configuration without a server: token and certificate-role files, the role table, the listen check, the flags."""

from __future__ import annotations

import argparse
import contextvars
from pathlib import Path

import grpc
import pytest

from cyclone_server import auth
from cyclone_server.serve import settings
from cyclone_proto import admin_pb2, limits_pb2, runs_pb2, schedules_pb2, workers_pb2, workflows_pb2

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


# -- certificate roles (--tls-client-roles) ------------------------------------------------

def test_parse_certificate_roles() -> None:
    text = ("# identity               roles\n"
            "CN=worker-1  worker  # the subject's common name\n"
            "CN=Ops Team admin\n"          # a common name may hold spaces
            "cn=lower-prefix submit\n"     # the forms' case does not matter
            "DNS:Jobs.Example.COM submit,worker\n"
            "URI:spiffe://cluster/ns/jobs/sa/runner submit\n"
            "email:ops@example.com admin\n"
            "IP:10.0.0.7 worker\n"
            "IP:0:0::1 admin\n\n")
    assert auth.parse_certificate_roles(text) == {
        "CN=worker-1": {"worker"}, "CN=Ops Team": {"admin"}, "CN=lower-prefix": {"submit"},
        "DNS:jobs.example.com": {"submit", "worker"},  # DNS names are case-insensitive: kept in lower case
        "URI:spiffe://cluster/ns/jobs/sa/runner": {"submit"}, "email:ops@example.com": {"admin"},
        "IP:10.0.0.7": {"worker"}, "IP:::1": {"admin"}}  # addresses in their short form, as grpc gives them
    assert auth.parse_certificate_roles("# nothing\n\n") == {}


@pytest.mark.parametrize("text, error", [
    ("CN=a wizard", "line 1: unknown role 'wizard'"),
    ("# roles\n\nCN=a", "line 3: expected 'IDENTITY ROLE[,ROLE]' (such as 'CN=worker-1 worker'), got 'CN=a'"),
    ("O=Example admin", "line 1: unknown identity 'O=Example': write CN=NAME (the subject's common name) or a "
                        "subject alternative name DNS:NAME, URI:URI, email:ADDRESS or IP:ADDRESS"),
    ("IP Address:10.0.0.1 admin", "line 1: unknown identity 'IP Address:10.0.0.1'"),  # openssl's way of printing it
    ("worker-1 worker", "line 1: unknown identity 'worker-1'"),
    ("CN= worker", "line 1: CN= needs a name after it"),
    ("IP:10.0.0.300 admin", "line 1: IP:10.0.0.300: not an IP address"),
    ("DNS:a b admin", "line 1: DNS:'a b': a DNS name has no spaces"),
    ("CN=a worker, submit", "line 1: write the roles without spaces, as ROLE,ROLE"),
    ("CN=a worker,", "line 1: unknown role ''"),
    ("CN=a worker\nCN=b admin\nCN=a admin", "line 3: CN=a is listed twice (first on line 1)"),
    ("DNS:x.example worker\nDNS:X.Example admin", "line 2: DNS:x.example is listed twice (first on line 1)"),
    ("IP:::1 worker\nIP:0::1 admin", "line 2: IP:::1 is listed twice"),
])
def test_certificate_roles_errors_name_the_file_and_line(text: str, error: str) -> None:
    with pytest.raises(auth.SecurityConfigError) as e:
        auth.parse_certificate_roles(text, "/etc/cyclone/client-roles")
    assert str(e.value).startswith("/etc/cyclone/client-roles: line ")
    assert error in str(e.value)


def test_load_certificate_roles(tmp_path: Path) -> None:
    f = tmp_path / "client-roles"
    f.write_text("CN=worker-1 worker\n")
    assert auth.load_certificate_roles(f) == {"CN=worker-1": {"worker"}}
    with pytest.raises(auth.SecurityConfigError, match="--tls-client-roles: cannot read .*missing"):
        auth.load_certificate_roles(tmp_path / "missing")
    f.write_text("# nobody yet\n")  # it would refuse every certificate
    with pytest.raises(auth.SecurityConfigError, match=f"--tls-client-roles: {f} names no certificate"):
        auth.load_certificate_roles(f)


# What grpc's servicer context gives for a client certificate (its auth_context(), as seen with
# openssl-made certificates): the typed SAN properties, beside an untyped list of them all.
AUTH_CONTEXT = {
    "x509_common_name": [b"cyclone client"], "x509_subject": [b"CN=cyclone client,O=Org"],
    "peer_dns": [b"Worker.Example.com"], "peer_uri": [b"spiffe://cyclone/worker"], "peer_email": [b"ops@example.com"],
    "peer_ip": [b"10.0.0.1", b"::1"], "transport_security_type": [b"ssl"],
    "x509_subject_alternative_name": [b"Worker.Example.com", b"spiffe://cyclone/worker", b"ops@example.com",
                                      b"10.0.0.1", b"::1"],
}


def test_certificate_identities_from_the_auth_context() -> None:
    assert auth.certificate_identities(AUTH_CONTEXT) == [
        "CN=cyclone client", "DNS:worker.example.com", "URI:spiffe://cyclone/worker", "email:ops@example.com",
        "IP:10.0.0.1", "IP:::1"]
    assert auth.certificate_identities({"transport_security_type": [b"ssl"]}) == []


def test_a_certificate_has_the_roles_of_all_its_listed_names() -> None:
    icpt = auth.TokenAuthInterceptor({}, {"DNS:worker.example.com": {"worker"}, "IP:::1": {"submit"},
                                          "URI:worker.example.com": {"admin"}})
    cert = icpt.certificate(AUTH_CONTEXT)
    assert cert.roles == {"worker", "submit"} and cert.names[0] == "CN=cyclone client"
    assert icpt.certificate({"peer_uri": [b"Worker.Example.com"]}).roles == set()  # a URI is not a DNS name


def test_check_while_serving_a_call_let_through_by_its_certificate() -> None:
    # What the schedules' role check (check(CancelRun, metadata) inside CreateSchedule) sees: the roles
    # of the call's certificate, unless the call sent a valid token.
    icpt = auth.TokenAuthInterceptor({W: {"worker"}}, {"CN=cyclone client": {"submit"}})
    cancel, bearer = "/cyclone.v1.Runs/CancelRun", [("authorization", f"Bearer {W}")]
    assert icpt.check(cancel, None)[0] == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[index]  # outside a call

    def in_call(metadata: list[tuple[str, str]] | None, method: str = cancel) -> tuple[grpc.StatusCode, str] | None:
        auth._CALL_CERTIFICATE.set(icpt.certificate(AUTH_CONTEXT))
        return icpt.check(method, metadata)

    code, msg = contextvars.copy_context().run(in_call, None)  # type: ignore[misc]
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "this client certificate (CN=cyclone client, DNS:worker.example.com," in msg and "has submit" in msg
    assert contextvars.copy_context().run(in_call, None, "/cyclone.v1.Runs/GetRun") is None
    code, msg = contextvars.copy_context().run(in_call, bearer)  # type: ignore[misc]
    assert "this token has worker" in msg  # a valid token decides alone


def _all_methods() -> list[str]:
    methods = []
    for module, service in ((runs_pb2, "Runs"), (workers_pb2, "Workers"), (workflows_pb2, "Workflows"),
                            (admin_pb2, "Admin"), (schedules_pb2, "Schedules"), (limits_pb2, "Limits")):
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


def test_server_security_with_certificate_roles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CYCLONE_TOKENS", raising=False)
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("PEM")  # read here; grpc parses them when the port is bound
    roles = tmp_path / "client-roles"
    roles.write_text("CN=ops admin\n")
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    mtls = [*tls, "--tls-client-ca", str(tmp_path / "ca.pem")]
    with pytest.raises(auth.SecurityConfigError, match=r"--tls-client-ca \(mTLS\) needs --tls-client-roles PATH, "
                                                       r"or tokens: .*CN=NAME.*--tokens-file or CYCLONE_TOKENS"):
        auth.server_security(_args(*mtls))  # it gave every certificate every role
    with pytest.raises(auth.SecurityConfigError, match="--tls-client-roles needs --tls-client-ca"):
        auth.server_security(_args(*tls, "--tls-client-roles", str(roles)))
    interceptors, creds = auth.server_security(_args("--listen", "0.0.0.0:7233", *mtls,
                                                     "--tls-client-roles", str(roles)))
    assert [type(i) for i in interceptors] == [auth.TokenAuthInterceptor] and creds is not None
    assert not interceptors[0].has_tokens
    monkeypatch.setenv("CYCLONE_TOKENS", f"{A} admin")  # mTLS for the transport, tokens for the roles
    interceptors, _ = auth.server_security(_args(*mtls))
    assert interceptors[0].has_tokens


def test_the_console_needs_tokens_beside_certificate_roles(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CYCLONE_TOKENS", raising=False)
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("PEM")
    (tmp_path / "client-roles").write_text("CN=ops admin\n")
    parser = argparse.ArgumentParser()
    settings.add(parser, environ={})
    argv = ["--database-url", "postgresql://db", "--tls-cert", str(tmp_path / "c.pem"), "--tls-key",
            str(tmp_path / "k.pem"), "--tls-client-ca", str(tmp_path / "ca.pem"), "--tls-client-roles",
            str(tmp_path / "client-roles")]
    assert settings.from_args(parser.parse_args(argv)).interceptors
    with pytest.raises(settings.SettingsError, match="--http-listen: the web console signs in with bearer tokens"):
        settings.from_args(parser.parse_args([*argv, "--http-listen", "127.0.0.1:0"]))
    monkeypatch.setenv("CYCLONE_TOKENS", f"{A} admin")
    assert settings.from_args(parser.parse_args([*argv, "--http-listen", "127.0.0.1:0"])).http_listen


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
    monkeypatch.setenv("CYCLONE_TLS_CLIENT_ROLES", "/etc/cyclone/client-roles")
    monkeypatch.setenv("CYCLONE_INSECURE_ALLOW_NO_AUTH", "true")
    args = _args()
    assert (args.tokens_file, args.tls_client_ca, args.tls_client_roles, args.insecure_allow_no_auth) == (
        "/etc/cyclone/tokens", "/etc/cyclone/ca.pem", "/etc/cyclone/client-roles", True)


def test_bearer_metadata() -> None:
    assert auth.bearer_metadata(A) == (("authorization", f"Bearer {A}"),)
    assert auth.bearer_token(auth.bearer_metadata(A)) == A
