"""ASGI entry point: HTTP through Django, WebSocket through Channels, one Daphne process."""

import asyncio
import gc
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "geosense.settings")

from geosense.handler import asgi_application

# Django's handler without a thread per request, its middleware async-native (handler.py).
django_asgi_app = asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from chat.routing import websocket_urlpatterns  # noqa: E402
from geosense.accounts.middleware import (  # noqa: E402
    CookieSocketOriginValidator,
    SocketAuthMiddleware,
)
from geosense.headers import SecurityHeadersMiddleware  # noqa: E402

# Daphne serves no static files by itself: the dev server (and the live test server) let
# Django's staticfiles serve them; a production deployment puts them behind its proxy.
http_application = SecurityHeadersMiddleware(
    ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app
)

from django.db import connections  # noqa: E402

from chat.processes import process_start  # noqa: E402

# Announce this process and free what dead ones held (their turn claims and sockets): after a
# crash and a restart, sessions take new turns at once (chat/processes.py).
process_start()
# That ran in the main thread, which serves no request: its connection would stay open (idle) for
# the life of the process, past CONN_MAX_AGE = 0.
connections.close_all()

from geosense.sqlite_wal import sqlite_wal_keep  # noqa: E402

# With SQLite, a connection that keeps the WAL from being deleted, and a thread that writes it
# to disk as it grows, so that a checkpoint's fsync does not stall the turns (sqlite_wal.py).
sqlite_wal_keep()

from django.urls import get_resolver  # noqa: E402

from chat.agents import agent_code_import  # noqa: E402

# Before serving, not on the event loop of the first request or turn: the URLconf (every view
# module) and the configured agent's code (the openai agent's aiohttp, ~0.25 s of CPU).
get_resolver().url_patterns  # noqa: B018
agent_code_import()

from geosense.daphne_hooks import daphne_hooks_install  # noqa: E402

# Daphne's, Twisted's and autobahn's work for a connection, an answer and a frame, with fewer
# Python calls, and Daphne's listen backlog (geosense/daphne_hooks.py).
daphne_hooks_install()

application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": SocketAuthMiddleware(
            CookieSocketOriginValidator(URLRouter(websocket_urlpatterns))
        ),
    }
)


def _close_agents_at_shutdown() -> None:
    """Under Daphne, close the model servers' clients (their pooled connections) before the
    reactor stops; Daphne has no ASGI lifespan."""
    daphne_server = sys.modules.get("daphne.server")
    if daphne_server is None:
        return
    from twisted.internet import defer, reactor

    from chat.agents import agents_close

    def close() -> defer.Deferred:
        loop = daphne_server.twisted_loop
        return defer.Deferred.fromFuture(asyncio.ensure_future(agents_close(), loop=loop))

    reactor.addSystemEventTrigger("before", "shutdown", close)


_close_agents_at_shutdown()

# What start-up made (modules, classes, Django's registries, the URLconf, ~110,000 objects) lives
# as long as the process, yet every full collection walked it: at 200 users about half of the
# collector's work, pauses of the whole process up to ~250 ms of CPU. Frozen, a collection walks
# only what serving made. Before the index's warm-up starts: what its thread builds is the
# collector's to walk (a rebuilt index leaves the old one to it).
gc.collect()
gc.freeze()
# And a young collection once 50,000 objects more were made than freed, not CPython's 700: at
# 200 users a turn's objects (its requests, events, rows) mostly die by their counts before
# that, and what the passes kept (in-flight turns) no longer filled the middle and full
# generations, whose passes walk it again (the collector's CPU in a server's first 16 s at 200
# users: 0.74 to 0.88 s before, 0.28 to 0.30 s after, ~3 % of the process's; docs/benchmarks.md).
# The middle and full generations keep their thresholds: cycles are still collected, ten and a
# hundred young passes apart.
YOUNG_COLLECTION_THRESHOLD = 50_000  # net allocations between two young passes
gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])

from geosense.annotations.spatial import spatial_backend  # noqa: E402

# With PostGIS no process builds the index: the database answers (annotations/spatial.py).
if settings.GEOSENSE_INDEX_WARM and spatial_backend() == "index":
    from geosense.annotations.index import spatial_index_warm
    from geosense.annotations.tiles import tiles_warm

    spatial_index_warm(also=tiles_warm)
