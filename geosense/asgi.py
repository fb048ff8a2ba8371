"""ASGI entry point: HTTP through Django, WebSocket through Channels, one Daphne process."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "geosense.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat.routing import websocket_urlpatterns  # noqa: E402
from geosense.accounts.middleware import (  # noqa: E402
    CookieSocketOriginValidator,
    SocketTokenAuthMiddleware,
)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AuthMiddlewareStack(
            SocketTokenAuthMiddleware(CookieSocketOriginValidator(URLRouter(websocket_urlpatterns)))
        ),
    }
)
