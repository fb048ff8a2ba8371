"""Bearer-token authentication for the HTTP API and the socket.

A request with `Authorization: Bearer <token>` is authenticated by the token alone and needs
no CSRF token (no cookie is involved, so no cross-site request can forge it).
"""

from asgiref.sync import iscoroutinefunction, sync_to_async
from channels.db import database_sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, JsonResponse
from django.utils.decorators import sync_and_async_middleware

from .services import api_token_user


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _apply(request: HttpRequest, user) -> None:
    request.user = user

    async def auser():
        return user

    request.auser = auser
    request._dont_enforce_csrf_checks = True


def _refused() -> JsonResponse:
    return JsonResponse({"error": "invalid bearer token"}, status=401)


@sync_and_async_middleware
def BearerTokenMiddleware(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest):
            raw = _bearer(request.headers.get("Authorization"))
            if raw is not None:
                user = await sync_to_async(api_token_user)(raw=raw)
                if user is None:
                    return _refused()
                _apply(request, user)
            return await get_response(request)

    else:

        def middleware(request: HttpRequest):
            raw = _bearer(request.headers.get("Authorization"))
            if raw is not None:
                user = api_token_user(raw=raw)
                if user is None:
                    return _refused()
                _apply(request, user)
            return get_response(request)

    return middleware


class SocketTokenAuthMiddleware:
    """Channels middleware: a bearer token on the upgrade request sets `scope["user"]`.

    Sets `scope["auth_by_token"]` so the origin check applies to cookie sockets only.
    """

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers") or [])
            raw = _bearer(headers.get(b"authorization", b"").decode("latin-1"))
            if raw is not None:
                user = await database_sync_to_async(api_token_user)(raw=raw)
                scope = dict(scope, user=user or AnonymousUser(), auth_by_token=True)
        return await self.inner(scope, receive, send)


class CookieSocketOriginValidator(OriginValidator):
    """Checks `Origin` against ALLOWED_HOSTS, but only for cookie-authenticated sockets.

    A bearer-token client (a script) sends no `Origin`, and needs none: a cross-site page
    cannot attach a bearer token, only cookies.
    """

    def __init__(self, application):
        super().__init__(application, settings.ALLOWED_HOSTS)

    async def __call__(self, scope, receive, send):
        user = scope.get("user")
        if scope.get("auth_by_token") or not getattr(user, "is_authenticated", False):
            # Token sockets need no Origin; anonymous ones are accepted and closed with 4401
            # by the consumer (nothing is reachable before authentication).
            return await self.application(scope, receive, send)
        return await super().__call__(scope, receive, send)

    def validate_origin(self, parsed_origin) -> bool:
        # The same rule as channels' AllowedHostsOriginValidator.
        return parsed_origin is not None and is_same_domain_allowed(parsed_origin.hostname)


def is_same_domain_allowed(host: str | None) -> bool:
    from django.http.request import validate_host

    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return host is not None and validate_host(host, allowed)
