"""Bearer-token authentication for the HTTP API and the socket.

A request with `Authorization: Bearer <token>` is authenticated by the token alone and needs
no CSRF token (no cookie is involved, so no cross-site request can forge it). The trip that
reads the token also makes the view's first read (geosense/accounts/first_read.py).
"""

from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction
from channels.auth import AuthMiddleware
from channels.auth import get_user as channels_get_user
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import OperationalError
from django.http import HttpRequest, JsonResponse
from django.http.request import split_domain_port, validate_host
from django.utils.decorators import sync_and_async_middleware
from django.utils.http import is_same_domain

from geosense.dbpool import in_request_thread
from geosense.handler import request_resolved

from .first_read import first_read_keep, first_read_make, first_read_planned
from .services import api_token_authenticate, api_token_user


def _bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer` header."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def bearer_token(request: HttpRequest) -> str | None:
    """The request's bearer token, if it sends one: `BearerTokenMiddleware` then decides alone
    who the request is, or answers it itself. Read from `META`: `request.headers` would parse
    the name of every header the request has (~12 Python calls) for this one, which `META`
    holds as it came."""
    return _bearer(request.META.get("HTTP_AUTHORIZATION"))


def _token_user(raw: str, planned):
    """In the requests' pool: the token's user, and the view's first read made for them."""
    user = api_token_user(raw=raw)
    return user, first_read_make(user, planned)


def _apply(request: HttpRequest, user) -> None:
    request.user = user

    async def auser():
        return user

    request.auser = auser
    request._dont_enforce_csrf_checks = True


def _refused() -> JsonResponse:
    return JsonResponse({"error": "invalid bearer token"}, status=401)


def _busy() -> JsonResponse:
    """The token could not be read now (the database locked or unreachable): nothing was done,
    the request may be sent again, as a turn's claim answers then (chat/api.py)."""
    answer = JsonResponse(
        {"error": "the database is busy; please send the request again"}, status=503
    )
    answer["Retry-After"] = "1"
    return answer


# Where a bearer token is accepted: the JSON API, the map's vector tiles (reads only) and the
# socket (below). Never the admin or the pages, where a token would stand in for a login
# without CSRF.
TOKEN_SCOPE_PREFIXES = ("/api/", "/tiles/")


def _out_of_scope() -> JsonResponse:
    return JsonResponse(
        {"error": "a bearer token is accepted by /api/, /tiles/ and the socket only"},
        status=401,
    )


async def token_user_decide(request: HttpRequest) -> JsonResponse | None:
    """The async request step: a request with a bearer token gets the token's user (and the
    view's first read made for them), or is answered here (a bad token, out of its scope, the
    database busy); None for a request without one. Also the step of the middleware's async
    twin (geosense/middleware.py)."""
    raw = bearer_token(request)
    if raw is None:
        return None
    if not request.path.startswith(TOKEN_SCOPE_PREFIXES):
        return _out_of_scope()
    planned = first_read_planned(request_resolved(request))
    try:
        user, made = await in_request_thread(_token_user)(raw, planned)
    except OperationalError:
        return _busy()
    if user is None:
        return _refused()
    _apply(request, user)
    first_read_keep(request, made)
    return None


@sync_and_async_middleware
def BearerTokenMiddleware(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest):
            return await token_user_decide(request) or await get_response(request)

    else:

        def middleware(request: HttpRequest):
            raw = bearer_token(request)
            if raw is not None:
                if not request.path.startswith(TOKEN_SCOPE_PREFIXES):
                    return _out_of_scope()
                try:
                    user = api_token_user(raw=raw)
                except OperationalError:
                    return _busy()
                if user is None:
                    return _refused()
                _apply(request, user)
            return get_response(request)

    # For the layer before it (the authentication twin, geosense/middleware.py), through
    # Django's wrapper of each layer, which copies a layer's attributes (`functools.wraps`).
    middleware.decides_token_user = True
    return middleware


class _PoolAuthMiddleware(AuthMiddleware):
    """Channels' session authentication (the session row, then its user, checked against the
    session's hash) in one trip to the requests' pool instead of Channels' single
    `database_sync_to_async` thread, where every socket's calls queued one behind the other,
    each opening and closing its own connection. Not the engine's pool: there a handshake
    queued behind the turns' trips (seconds at 200 users, past Daphne's 5 s handshake time-out
    at 500), and a flood of upgrades (anyone can send them) held the turns back."""

    async def resolve_scope(self, scope):
        scope["user"]._wrapped = await in_request_thread(channels_get_user.func)(scope)


class SocketAuthMiddleware:
    """Channels middleware: who a socket is, before its handshake is answered.

    A bearer token on the upgrade request decides alone (one trip to the requests' pool: the
    token with its user); without one, the session cookie does (`_PoolAuthMiddleware`, one
    trip). Sets `scope["auth_by_token"]` so the origin check applies to cookie sockets only,
    and `scope["api_token"]` (id and expiry) so the socket closes when the token is revoked or
    expires.
    """

    def __init__(self, inner):
        self.inner = inner
        self.by_cookie = CookieMiddleware(SessionMiddleware(_PoolAuthMiddleware(inner)))

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        raw = _bearer(headers.get(b"authorization", b"").decode("latin-1"))
        if raw is None:
            return await self.by_cookie(scope, receive, send)
        token = await in_request_thread(api_token_authenticate)(raw=raw)
        scope = dict(
            scope,
            user=token.user if token else AnonymousUser(),
            auth_by_token=True,
            api_token=(token.pk, token.expires) if token else None,
        )
        return await self.inner(scope, receive, send)


class CookieSocketOriginValidator:
    """A cookie-authenticated socket must come from the app's own origin (scheme, host and
    port), or from one of `CSRF_TRUSTED_ORIGINS`: the rule Django's CSRF check applies to
    an unsafe request. A page on another port or scheme of the same host is another origin.

    Bearer-token sockets need no `Origin`: a cross-site page cannot attach a bearer token, only
    cookies. Anonymous sockets are accepted and closed with 4401 by the consumer (nothing is
    reachable before authentication).
    """

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        user = scope.get("user")
        if (
            scope.get("auth_by_token")
            or not getattr(user, "is_authenticated", False)
            or socket_origin_allowed(scope)
        ):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""


def _secure(scope) -> bool:
    if scope.get("scheme") in ("wss", "https"):
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, expected = proxy
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        return _header(scope, header).split(",")[0].strip() == expected
    return False


def _allowed_hosts() -> list[str]:
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return allowed


def socket_origin_allowed(scope) -> bool:
    """Whether the upgrade's `Origin` is the app's own origin or a trusted one."""
    origin = _header(scope, b"origin").lower().rstrip("/")
    host = _header(scope, b"host").lower()
    if not origin or origin == "null":
        return False
    secure = _secure(scope)
    domain, port = split_domain_port(host)
    if domain and validate_host(domain, _allowed_hosts()):
        default = "443" if secure else "80"
        netloc = domain if port in ("", default) else f"{domain}:{port}"
        if origin == f"{'https' if secure else 'http'}://{netloc}":
            return True
    return _trusted(origin)


def _trusted(origin: str) -> bool:
    parsed = urlsplit(origin)
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        trusted = trusted.lower().rstrip("/")
        if "*" not in trusted:
            if origin == trusted:
                return True
            continue
        scheme, _, pattern = trusted.partition("://")
        if parsed.scheme == scheme and is_same_domain(
            parsed.netloc, pattern[pattern.index("*") + 1 :]
        ):
            return True
    return False
