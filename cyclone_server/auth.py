"""Who may call what: bearer tokens with roles, the server interceptor that checks them, TLS and mTLS.

Roles: `worker` (the worker stream), `submit` (workflows, submitting, reading, signalling),
`admin` (everything `submit` may, plus the operator actions and the Admin service). A
token may hold several roles (`tok123 worker,submit` for a worker process that also
registers its workflows). Health checks and reflection stay open so that load balancers
and Kubernetes probes need no token.

Over mTLS, a caller without a valid token is known by its client certificate: the
`--tls-client-roles` file maps certificate names (`CN=name`, or a subject alternative
name `DNS:`, `URI:`, `email:`, `IP:`) to roles, and a certificate it does not name has
none. A valid token decides alone. mTLS without that file and without tokens is refused
at start, so that no certificate of the CA silently gets every role.

Wiring (server)::

    settings.add(parser, groups=["security"])   # cyclone_server/serve/settings.py
    interceptors, credentials = auth.server_security(args)   # raises SecurityConfigError
    server = grpc.aio.server(interceptors=interceptors, ...)
    if credentials: server.add_secure_port(listen, credentials) else: server.add_insecure_port(listen)

Wiring (client): `open_channel(address, token=..., ca_file=...)`.
"""

from __future__ import annotations

import argparse
import contextvars
import hashlib
import inspect
import ipaddress
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
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
    # Limits hold back every tenant's work: reading them is for services, changing them for operators.
    **{f"/cyclone.v1.Limits/{m}": SUBMIT for m in ("GetLimit", "ListLimits")},
    **{f"/cyclone.v1.Limits/{m}": ADMIN for m in ("SetLimit", "DeleteLimit")},
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


# -- client certificates (mTLS) -----------------------------------------------------------

# The forms of IDENTITY in --tls-client-roles, and the property of grpc's auth context that
# holds those names of the (verified) client certificate. grpc's x509_subject_alternative_name
# lists every SAN without its type, so the typed properties are used: DNS:x is not URI:x.
IDENTITY_FORMS = {"CN=": "x509_common_name", "DNS:": "peer_dns", "URI:": "peer_uri", "email:": "peer_email",
                  "IP:": "peer_ip"}
IDENTITY_HELP = ("CN=NAME (the subject's common name) or a subject alternative name DNS:NAME, URI:URI, "
                 "email:ADDRESS or IP:ADDRESS")


def certificate_identity(form: str, value: str) -> str:
    """`form` + `value` as --tls-client-roles writes it and matches it: DNS names in lower case (they are
    case-insensitive), IP addresses in their short form; ValueError when `value` cannot be such a name."""
    if not value:
        raise ValueError(f"{form} needs a name after it")
    if form != "CN=" and any(c.isspace() for c in value):
        raise ValueError(f"{form}{value!r}: a {form[:-1]} name has no spaces")
    if form == "DNS:":
        value = value.lower()
    elif form == "IP:":
        try:
            value = str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{form}{value}: not an IP address") from None
    return form + value


def parse_certificate_roles(text: str, source: str = "client roles") -> dict[str, frozenset[str]]:
    """Parse lines of `IDENTITY ROLE[,ROLE]` (# comments) into {identity: roles}. IDENTITY is CN=NAME
    (the one form that may hold spaces) or a SAN as DNS:NAME, URI:URI, email:ADDRESS or IP:ADDRESS."""
    found: dict[str, tuple[int, frozenset[str]]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}: line {n}"
        fields = line.rsplit(None, 1)
        if len(fields) != 2:
            raise SecurityConfigError(f"{where}: expected 'IDENTITY ROLE[,ROLE]' (such as 'CN=worker-1 worker'), "
                                      f"got {line!r}")
        written, roles = fields[0].rstrip(), _roles(fields[1], where)
        if written.endswith(","):
            raise SecurityConfigError(f"{where}: write the roles without spaces, as ROLE,ROLE")
        form = next((f for f in IDENTITY_FORMS if written[:len(f)].lower() == f.lower()), None)
        if form is None:
            raise SecurityConfigError(f"{where}: unknown identity {written!r}: write {IDENTITY_HELP}")
        try:
            identity = certificate_identity(form, written[len(form):])
        except ValueError as e:
            raise SecurityConfigError(f"{where}: {e}") from None
        if identity in found:
            raise SecurityConfigError(f"{where}: {identity} is listed twice (first on line {found[identity][0]})")
        found[identity] = (n, roles)
    return {identity: roles for identity, (_, roles) in found.items()}


def load_certificate_roles(path: str | os.PathLike[str]) -> dict[str, frozenset[str]]:
    """The --tls-client-roles file; a file naming no certificate is an error (it would refuse them all)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SecurityConfigError(f"--tls-client-roles: cannot read {path}: {e.strerror}") from None
    roles = parse_certificate_roles(text, str(path))
    if not roles:
        raise SecurityConfigError(f"--tls-client-roles: {path} names no certificate (lines 'IDENTITY ROLE[,ROLE]')")
    return roles


def certificate_identities(auth_context: Mapping[str, Iterable[bytes]]) -> list[str]:
    """The names of the caller's client certificate, as --tls-client-roles writes them (CN=..., DNS:..., ...)."""
    names = []
    for form, prop in IDENTITY_FORMS.items():
        for raw in auth_context.get(prop, ()):
            try:
                names.append(certificate_identity(form, raw.decode("utf-8", "replace")))
            except ValueError:
                continue  # not a name a line could hold
    return names


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


@dataclass(frozen=True)
class _Certificate:
    """The client certificate of the call being served, once the interceptor let it through."""

    names: tuple[str, ...]
    roles: frozenset[str]


# Set by the certificate gate in the call's own task (grpc.aio serves each call in a task of its
# own), so that check() made while serving that call knows its certificate; unset anywhere else.
_CALL_CERTIFICATE: contextvars.ContextVar[_Certificate | None] = contextvars.ContextVar(
    "cyclone_call_certificate", default=None)


def _needs(method: str, allowed: frozenset[str], who: str, roles: frozenset[str]) -> tuple[grpc.StatusCode, str]:
    return (grpc.StatusCode.PERMISSION_DENIED,
            f"{method} needs role {' or '.join(sorted(allowed))}; {who} has {', '.join(sorted(roles)) or 'no role'}")


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED without a known bearer token, PERMISSION_DENIED when its roles may not call the RPC.

    With `certificates` ({identity: roles}, parse_certificate_roles), a call without a valid
    token is judged by its client certificate instead: UNAUTHENTICATED when no name of the
    certificate is listed, PERMISSION_DENIED when the roles of the names listed (together)
    may not call the RPC. grpc's interceptor sees only the method and the metadata, so such
    a call is served by a gate that reads the certificate from the servicer context first:
    a stream handler that reads nothing of the request before the certificate is accepted."""

    def __init__(self, tokens: Mapping[str, Iterable[str]],
                 certificates: Mapping[str, Iterable[str]] | None = None) -> None:
        self._roles = {_digest(t): frozenset(r) for t, r in tokens.items()}
        self._certificates = None if certificates is None else {i: frozenset(r) for i, r in certificates.items()}

    @property
    def has_tokens(self) -> bool:
        return bool(self._roles)

    def _token_roles(self, token: str | None) -> frozenset[str] | None:
        return None if token is None else self._roles.get(_digest(token))

    def certificate(self, auth_context: Mapping[str, Iterable[bytes]]) -> _Certificate:
        """The names of a client certificate and the roles they are given (none: not listed)."""
        names = tuple(certificate_identities(auth_context))
        roles = frozenset().union(*((self._certificates or {}).get(n, frozenset()) for n in names))
        return _Certificate(names, roles)

    @staticmethod
    def _judge(method: str, allowed: frozenset[str], cert: _Certificate,
               token: str | None) -> tuple[grpc.StatusCode, str] | None:
        names = ", ".join(cert.names) or "no common name nor subject alternative name"
        unknown = "; the bearer token sent is not known" if token is not None else ""
        if not cert.roles:
            return (grpc.StatusCode.UNAUTHENTICATED, f"the client certificate ({names}) has no role: list one of its "
                    f"names in --tls-client-roles, or send a bearer token{unknown}")
        if not cert.roles & allowed:
            code, message = _needs(method, allowed, f"this client certificate ({names})", cert.roles)
            return code, message + unknown
        return None

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> tuple[grpc.StatusCode, str] | None:
        """None when the call may proceed, else the status and message to refuse it with. A valid token
        decides; without one, while serving a call let through by its certificate, the certificate does."""
        allowed = roles_for(method)
        if not allowed:
            return None
        token = bearer_token(metadata)
        roles = self._token_roles(token)
        if roles is not None:
            return None if roles & allowed else _needs(method, allowed, "this token", roles)
        cert = _CALL_CERTIFICATE.get()
        if cert is not None and self._certificates is not None:
            return self._judge(method, allowed, cert, token)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token: send metadata 'authorization: Bearer TOKEN'"
        return grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token"

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        metadata = handler_call_details.invocation_metadata  # type: ignore[attr-defined]
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        token = bearer_token(metadata)
        if self._certificates is not None and roles_for(method) and self._token_roles(token) is None:
            return self._certificate_gate(handler, method, token)
        refusal = self.check(method, metadata)
        return handler if refusal is None else _refusing(*refusal)

    def _certificate_gate(self, handler: grpc.RpcMethodHandler, method: str,
                          token: str | None) -> grpc.RpcMethodHandler:
        """`handler` behind a check of the client certificate. It is served as a stream whatever its shape
        (as _refusing is), so that a refused call's message is never read; an accepted call is then
        served as its own shape would be (_serve)."""
        h: Any = handler
        behavior = h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return _refusing(grpc.StatusCode.UNIMPLEMENTED, f"{method} cannot be served to a client certificate")
        allowed = roles_for(method)

        async def gate(requests: Any, context: grpc.aio.ServicerContext) -> None:
            cert = self.certificate(context.auth_context())
            refusal = self._judge(method, allowed, cert, token)
            if refusal is not None:  # a status set, not an AbortError raised (see api/common.rpc)
                context.set_code(refusal[0])
                context.set_details(refusal[1])
                return
            _CALL_CERTIFICATE.set(cert)
            await _serve(h, behavior, requests, context)

        return grpc.stream_stream_rpc_method_handler(gate, request_deserializer=h.request_deserializer,
                                                     response_serializer=h.response_serializer)


async def _serve(h: Any, behavior: Callable[..., Any], requests: Any, context: grpc.aio.ServicerContext) -> None:
    """Serve a call of `h`'s shape from a stream handler: read its one request (the stream itself when it
    streams), and write what the behavior returns or yields, as grpc's own unary paths would."""
    if h.request_streaming:
        request = requests
    else:
        request = await context.read()
        if request is grpc.aio.EOF:  # the client went away before sending it (grpc's unary path returns too)
            return
    if inspect.isasyncgenfunction(behavior):
        async for response in behavior(request, context):
            await context.write(response)
        return
    response = await behavior(request, context)
    # A unary response is sent unless the behavior set a status of failure (grpc drops it then).
    if not h.response_streaming and response is not None and context.code() in (None, grpc.StatusCode.OK):
        await context.write(response)


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
        "cancel runs and take work. Give --tokens-file (or CYCLONE_TOKENS) or --tls-client-ca with "
        "--tls-client-roles (mTLS), listen on 127.0.0.1, or pass --insecure-allow-no-auth if a proxy in front of "
        "the server authenticates callers.")


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
    certificates = None
    if args.tls_client_roles:
        if not args.tls_client_ca:
            raise SecurityConfigError("--tls-client-roles needs --tls-client-ca (mTLS): without it no client "
                                      "presents a certificate")
        certificates = load_certificate_roles(args.tls_client_roles)
    elif args.tls_client_ca and not tokens:
        raise SecurityConfigError(
            "--tls-client-ca (mTLS) needs --tls-client-roles PATH, or tokens: a client certificate has no role "
            "unless a --tls-client-roles file gives it some (lines 'IDENTITY ROLE[,ROLE]', IDENTITY being "
            f"{IDENTITY_HELP}); callers may also send tokens (--tokens-file or CYCLONE_TOKENS)")
    credentials = server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    host = _listen_host(getattr(args, "listen", None))
    if host is not None:
        require_safe_listen(host, bool(tokens) or bool(certificates), args.insecure_allow_no_auth)
    return ([TokenAuthInterceptor(tokens, certificates)] if tokens or certificates else []), credentials


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
           "IDENTITY_FORMS", "certificate_identity", "parse_certificate_roles", "load_certificate_roles",
           "certificate_identities", "TokenAuthInterceptor", "is_loopback", "require_safe_listen", "server_credentials",
           "server_security", "bearer_metadata", "token_call_credentials", "channel_credentials",
           "bearer_interceptors", "open_channel"]
