"""Security headers on every HTTP answer, static files included.

Django's middleware never sees a static file (the dev server's `ASGIStaticFilesHandler` and
a production proxy serve them), so the Content-Security-Policy is added here, around the whole
ASGI HTTP application: one place, one policy (`settings.GEOSENSE_CSP`).
"""

from collections.abc import Mapping, Sequence

from django.conf import settings


def csp_header(policy: Mapping[str, Sequence[str]]) -> str:
    """`directive source source; directive …` in the policy's order."""
    return "; ".join(" ".join([name, *sources]) for name, sources in policy.items())


class SecurityHeadersMiddleware:
    """ASGI middleware: adds the CSP (and nosniff) to every HTTP answer that has none."""

    def __init__(self, application) -> None:
        self.application = application
        self.headers = [
            (b"content-security-policy", csp_header(settings.GEOSENSE_CSP).encode()),
            (b"x-content-type-options", b"nosniff"),
        ]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.application(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in self.headers if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        return await self.application(scope, receive, send_with_headers)
