"""Security headers on every HTTP answer, static files included.

Django's middleware never sees a static file (the dev server's `ASGIStaticFilesHandler` and
a production proxy serve them), so the Content-Security-Policy is added here, around the whole
ASGI HTTP application: one place, one policy (`settings.GEOSENSE_CSP`).
"""

from collections.abc import Awaitable, Callable, Mapping, Sequence

from django.conf import settings
from django.http.response import ResponseHeaders

# The scope's key under which an application that adds the headers itself (one whose
# `takes_answer_headers` is true: GeoSense's Django handler, geosense/handler.py) finds them, as a
# Django `ResponseHeaders` store holds them (lower-case name → (name, value)).
ANSWER_HEADERS = "geosense.answer_headers"


def csp_header(policy: Mapping[str, Sequence[str]]) -> str:
    """`directive source source; directive …` in the policy's order."""
    return "; ".join(" ".join([name, *sources]) for name, sources in policy.items())


def headers_added(send: Callable[[dict], Awaitable[None]], headers: list[tuple[bytes, bytes]]):
    """`send`, each of `headers` added to an answer's start that has no header of its name."""

    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            sent = list(message.get("headers") or [])
            present = {name.lower() for name, _ in sent}
            sent += [(n, v) for n, v in headers if n not in present]
            message = {**message, "headers": sent}
        await send(message)

    return send_with_headers


class SecurityHeadersMiddleware:
    """ASGI middleware: adds the CSP (and nosniff) to every HTTP answer that has none.

    An application that adds them itself (`takes_answer_headers`: GeoSense's Django handler,
    which sets them in each answer's headers before sending it) gets them in the scope
    (`ANSWER_HEADERS`) and the `send` as it is: wrapped, `send` was a Python call more for each
    message of an answer, a stream's every chunk."""

    def __init__(self, application) -> None:
        self.application = application
        self.headers = [
            (b"content-security-policy", csp_header(settings.GEOSENSE_CSP).encode()),
            (b"x-content-type-options", b"nosniff"),
        ]
        self.stored = None
        if getattr(application, "takes_answer_headers", False):
            made = ResponseHeaders(
                {n.decode("latin-1"): v.decode("latin-1") for n, v in self.headers}
            )
            self.stored = tuple(made._store.items())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        if self.stored is not None:
            return await self.application({**scope, ANSWER_HEADERS: self.stored}, receive, send)
        return await self.application(scope, receive, headers_added(send, self.headers))
