"""Who may use the console: tokens from the sign-in cookie or header, CSRF, and the security headers of every response."""

from __future__ import annotations

from urllib.parse import urlsplit

import grpc
from aiohttp import web

from cyclone_server import auth

TOKEN_COOKIE = "cyclone_token"
CSRF_COOKIE = "cyclone_csrf"
READ_METHOD = "/cyclone.v1.Runs/GetRun"  # a token that may call it may read the console
ACT_METHOD = "/cyclone.v1.Runs/CancelRun"  # a token that may call it (admin) may act
LIMITS_METHOD = "/cyclone.v1.Limits/ListLimits"  # a token that may call it may read the limits page
OPEN_PATHS = ("/login", "/healthz", "/metrics", "/static/")


class Access:
    """Who the request is, by the same token table as the gRPC port (None: no tokens configured)."""

    def __init__(self, tokens: auth.TokenAuthInterceptor | None) -> None:
        self.tokens = tokens

    @property
    def enabled(self) -> bool:
        return self.tokens is not None

    @staticmethod
    def token_of(request: web.Request) -> tuple[str | None, bool]:
        """(token, from_header)."""
        header = auth.bearer_token([("authorization", request.headers.get("Authorization", ""))])
        if header:
            return header, True
        return request.cookies.get(TOKEN_COOKIE) or None, False

    def refusal(self, token: str | None, method: str) -> tuple[int, str] | None:
        """None when `token` may call `method`, else (HTTP status, why)."""
        if self.tokens is None:
            return None
        answer = self.tokens.check(method, auth.bearer_metadata(token) if token else ())
        if answer is None:
            return None
        code, message = answer
        if code == grpc.StatusCode.PERMISSION_DENIED:
            needs = "admin" if method == ACT_METHOD else "submit or admin"
            return 403, f"this token may not do that: it needs the role {needs} ({message})"
        return 401, "sign in with a token" if token is None else "the token is not known to this server"


def same_origin(request: web.Request) -> bool:
    """False when the browser says the request comes from a page of another site."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser, or a same-origin request of an older browser: the CSRF token decides
    return urlsplit(origin).netloc == request.host


def is_https(request: web.Request) -> bool:
    """Whether the browser reached the console over HTTPS: directly, or through a TLS proxy that says so
    (X-Forwarded-Proto). A client that lies about it only keeps its own cookies off plain HTTP."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip() == "https"


def decorate(response: web.StreamResponse, request: web.Request, fresh_csrf: str) -> None:
    """The CSRF cookie (on a browser's first visit) and the security headers of every answer."""
    if fresh_csrf:
        response.set_cookie(CSRF_COOKIE, fresh_csrf, httponly=True, samesite="Strict", path="/",
                            secure=is_https(request))
    h = response.headers
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("X-Frame-Options", "DENY")
    h.setdefault("Referrer-Policy", "same-origin")
    h.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                           "script-src 'self'; frame-ancestors 'none'; form-action 'self'")


def safe_next(target: str | None) -> str:
    """A local path to go to after sign-in (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/runs"
    return target
