"""Who may call what: bearer tokens with roles, the server interceptor that checks them, TLS and mTLS.

Roles: `worker` (the worker stream), `submit` (workflows, submitting, reading, signalling),
`admin` (everything `submit` may, plus the operator actions and the Admin service). A
token may hold several roles (`tok123 worker,submit` for a worker process that also
registers its workflows). Health checks and reflection stay open so that load balancers
and Kubernetes probes need no token.

Wiring (server)::

    settings.add(parser, groups=["security"])   # cyclone_server/serve/settings.py
    interceptors, credentials = auth.server_security(args)   # raises SecurityConfigError
    server = grpc.aio.server(interceptors=interceptors, ...)
    if credentials: server.add_secure_port(listen, credentials) else: server.add_insecure_port(listen)

Wiring (client): `open_channel(address, token=..., ca_file=...)`.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from cyclone_worker._channel import open_channel as sdk_channel

from .listen import split_host_port

ROLES = frozenset({"worker", "submit", "admin"})
WORKER = frozenset({"worker"})
SUBMIT = frozenset({"submit", "admin"})
ADMIN = frozenset({"admin"})
OPEN = frozenset()  # no token needed

# Full method name -> roles allowed. A method of cyclone.v1 missing here (one added later)
# is admin-only until it is listed: new RPCs fail closed.
METHOD_ROLES: dict[str, frozenset[str]] = {
    "/cyclone.v1.Workers/Connect": WORKER,
    **{f"/cyclone.v1.Runs/{m}": SUBMIT for m in ("SubmitRun", "Enqueue", "EnqueueMany", "GetRun", "ListRuns",
                                                 "WaitRun", "Signal")},
    **{f"/cyclone.v1.Runs/{m}": ADMIN for m in ("CancelRun", "PauseRun", "ResumeRun", "RetryStep", "RetryAll",
                                                "PurgeTerminalRuns")},
    **{f"/cyclone.v1.Workflows/{m}": SUBMIT for m in ("RegisterWorkflow", "GetWorkflow", "ListWorkflows")},
    # A service that starts runs may own its schedules; pausing, resuming and deleting are operator actions,
    # and so is the overlap policy cancel_previous, which cancels runs (SchedulesServicer checks it per call).
    **{f"/cyclone.v1.Schedules/{m}": SUBMIT for m in ("CreateSchedule", "GetSchedule", "ListSchedules",
                                                      "UpdateSchedule", "TriggerSchedule")},
    **{f"/cyclone.v1.Schedules/{m}": ADMIN for m in ("PauseSchedule", "ResumeSchedule", "DeleteSchedule")},
}
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")
# RFC 6750 token68 characters; 16+ of them so that a typo'd or placeholder token is refused.
TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/-]{16,}=*$")
METADATA_KEY = "authorization"


class SecurityConfigError(ValueError):
    """The auth or TLS configuration is invalid or unsafe; the message says what to change."""


def roles_for(method: str) -> frozenset[str]:
    """The roles that may call `method` (a full name like /cyclone.v1.Runs/CancelRun); empty: open."""
    if method.startswith(OPEN_PREFIXES):
        return OPEN
    return METHOD_ROLES.get(method, ADMIN)


def _digest(token: str) -> bytes:
    # Tokens are looked up by hash, so the lookup's timing says nothing about a token's bytes.
    return hashlib.sha256(token.encode()).digest()


def _roles(value: Any, where: str) -> frozenset[str]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise SecurityConfigError(f"{where}: roles must be a non-empty list of {sorted(ROLES)}")
    roles = frozenset(str(n).strip() for n in names)
    unknown = roles - ROLES
    if unknown:
        raise SecurityConfigError(f"{where}: unknown role {sorted(unknown)[0]!r} (roles: {', '.join(sorted(ROLES))})")
    return roles


def _check_token(token: str, where: str) -> str:
    if not TOKEN_RE.match(token):
        raise SecurityConfigError(f"{where}: a token must be at least 16 characters of A-Z a-z 0-9 . _ ~ + / - "
                                  "(optionally ending in =)")
    return token


def parse_tokens(text: str, source: str = "tokens") -> dict[str, frozenset[str]]:
    """Parse `{"token": ["role", ...]}` JSON, or lines of `token role[,role]` (# comments; ; also ends a line)."""
    tokens: dict[str, frozenset[str]] = {}
    if text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SecurityConfigError(f"{source}: invalid JSON: {e}") from None
        if not isinstance(data, dict):
            raise SecurityConfigError(f"{source}: JSON tokens must be an object {{TOKEN: [ROLE, ...]}}")
        for n, (token, roles) in enumerate(data.items(), 1):
            where = f"{source}: entry {n}"  # never echo a token into a log
            tokens[_check_token(token, where)] = _roles(roles, where)
        return tokens
    for n, line in enumerate(re.split(r"[\n;]", text), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}: entry {n}"
        fields = line.split()
        if len(fields) != 2:
            raise SecurityConfigError(f"{where}: expected 'TOKEN ROLE[,ROLE]', got {len(fields)} fields")
        token = _check_token(fields[0], where)
        if token in tokens:
            raise SecurityConfigError(f"{where}: the same token is listed twice")
        tokens[token] = _roles(fields[1], where)
    return tokens


def load_tokens(tokens_file: str | os.PathLike[str] | None, env_value: str | None = None) -> dict[str, frozenset[str]]:
    """Tokens from the file and from the CYCLONE_TOKENS value; a token in both gets the union of its roles."""
    merged: dict[str, frozenset[str]] = {}
    sources: list[tuple[str, str]] = []
    if tokens_file:
        try:
            sources.append((Path(tokens_file).read_text(), str(tokens_file)))
        except OSError as e:
            raise SecurityConfigError(f"--tokens-file: cannot read {tokens_file}: {e.strerror}") from None
    if env_value:
        sources.append((env_value, "CYCLONE_TOKENS"))
    for text, source in sources:
        for token, roles in parse_tokens(text, source).items():
            merged[token] = merged.get(token, frozenset()) | roles
    return merged


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` entry, if any."""
    for key, value in metadata or ():
        if key.lower() == METADATA_KEY:
            scheme, _, token = (value.decode() if isinstance(value, bytes) else value).partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _refusing(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with `code` without reading its request.

    Whatever the method's shape, it is served as a stream (grpc reads a streamed request
    only when the handler asks for it, and the client cannot tell), and the bytes are never
    parsed: a refused caller costs the server no more than the flow-control window of the
    call, however big the message it sends."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED without a known bearer token, PERMISSION_DENIED when its roles may not call the RPC."""

    def __init__(self, tokens: Mapping[str, Iterable[str]]) -> None:
        self._roles = {_digest(t): frozenset(r) for t, r in tokens.items()}

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> tuple[grpc.StatusCode, str] | None:
        """None when the call may proceed, else the status and message to refuse it with."""
        allowed = roles_for(method)
        if not allowed:
            return None
        token = bearer_token(metadata)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token: send metadata 'authorization: Bearer TOKEN'"
        roles = self._roles.get(_digest(token))
        if roles is None:
            return grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token"
        if not roles & allowed:
            return (grpc.StatusCode.PERMISSION_DENIED,
                    f"{method} needs role {' or '.join(sorted(allowed))}; this token has {', '.join(sorted(roles))}")
        return None

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        refusal = self.check(handler_call_details.method, handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if refusal is None or handler is None:
            return handler
        return _refusing(*refusal)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def require_safe_listen(host: str, auth_enabled: bool, allow_insecure: bool) -> None:
    """Refuse to serve without auth on a non-loopback address unless explicitly allowed."""
    if auth_enabled or allow_insecure or is_loopback(host):
        return
    raise SecurityConfigError(
        f"refusing to listen on {host or '0.0.0.0'} without authentication: anyone who reaches that address could "
        "cancel runs and take work. Give --tokens-file (or CYCLONE_TOKENS) or --tls-client-ca (mTLS), listen on "
        "127.0.0.1, or pass --insecure-allow-no-auth if a proxy in front of the server authenticates callers.")


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"{flag}: cannot read {path}: {e.strerror}") from None


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None = None) -> grpc.ServerCredentials:
    """TLS with the server's certificate chain and key; with `client_ca_file`, mTLS (client certificates required)."""
    pair = [(_read(key_file, "--tls-key"), _read(cert_file, "--tls-cert"))]
    if client_ca_file:
        return grpc.ssl_server_credentials(pair, root_certificates=_read(client_ca_file, "--tls-client-ca"),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials(pair)



def _listen_host(listen: str | None) -> str | None:
    if not listen:
        return None
    return split_host_port(listen, default_port=0, what="--listen")[0]


def server_security(args: argparse.Namespace) -> tuple[list[grpc.aio.ServerInterceptor], grpc.ServerCredentials | None]:
    """(interceptors, credentials) for grpc.aio.server / add_secure_port; checks `args.listen` is safe."""
    tokens = load_tokens(args.tokens_file, os.environ.get("CYCLONE_TOKENS"))
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SecurityConfigError("--tls-cert and --tls-key must be given together")
    if args.tls_client_ca and not args.tls_cert:
        raise SecurityConfigError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    credentials = server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    host = _listen_host(getattr(args, "listen", None))
    if host is not None:
        require_safe_listen(host, bool(tokens) or bool(args.tls_client_ca), args.insecure_allow_no_auth)
    return ([TokenAuthInterceptor(tokens)] if tokens else []), credentials


# -- client side ---------------------------------------------------------------------------

def bearer_metadata(token: str) -> tuple[tuple[str, str]]:
    """Per-call metadata carrying `token`, e.g. `stub.GetRun(req, metadata=bearer_metadata(tok))`."""
    return ((METADATA_KEY, f"Bearer {token}"),)


def token_call_credentials(token: str) -> grpc.CallCredentials:
    """Call credentials sending `token` as a bearer token (gRPC sends them only over TLS or local channels)."""
    return grpc.access_token_call_credentials(token)


def channel_credentials(*, ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                        token: str | None = None) -> grpc.ChannelCredentials:
    """TLS channel credentials: trust `ca_file` (default: system roots), present a client certificate for mTLS,
    and send `token` on every call."""
    if bool(cert_file) != bool(key_file):
        raise SecurityConfigError("a client certificate needs both the certificate and the key file")
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "CA file") if ca_file else None,
        private_key=_read(key_file, "client key") if key_file else None,
        certificate_chain=_read(cert_file, "client certificate") if cert_file else None)
    return grpc.composite_channel_credentials(creds, token_call_credentials(token)) if token else creds


class _Bearer:
    def __init__(self, token: str) -> None:
        self._entry = bearer_metadata(token)[0]

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._entry)
        return details._replace(metadata=metadata)  # type: ignore[attr-defined]


# grpc.aio files each interceptor under the first call type it implements, so one class per type.
class _BearerUnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _BearerUnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _BearerStreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


class _BearerStreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


def bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding the bearer token to every call of a plaintext channel (where gRPC does not
    send call credentials): `grpc.aio.insecure_channel(address, interceptors=bearer_interceptors(token))`."""
    return [cls(token) for cls in (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)]


def open_channel(address: str, *, token: str | None = None, tls: bool = False, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to a Cyclone server, sending `token` on every call: TLS when `tls`
    or any file is given, plaintext otherwise. The SDK's one channel constructor makes it,
    with its message limits and reconnect backoff."""
    if tls or ca_file or cert_file or key_file:
        creds = channel_credentials(ca_file=ca_file, cert_file=cert_file, key_file=key_file, token=token)
        return sdk_channel(address, tls=creds)
    return sdk_channel(address, interceptors=bearer_interceptors(token) if token else None)


__all__ = ["ROLES", "METHOD_ROLES", "SecurityConfigError", "roles_for", "parse_tokens", "load_tokens",
           "TokenAuthInterceptor", "is_loopback", "require_safe_listen", "server_credentials",
           "server_security", "bearer_metadata", "token_call_credentials", "channel_credentials",
           "bearer_interceptors", "open_channel"]
