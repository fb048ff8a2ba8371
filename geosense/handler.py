"""Django's ASGI handler without a thread per request (issue 15).

Django's `ASGIHandler` runs each request in an asgiref `ThreadSensitiveContext`: the request's
first thread-sensitive `sync_to_async` call (`request_started`'s receivers, before any
middleware) starts a thread of the request's own, which lives until the request ends, a
streamed turn's whole length, and asgiref starts one more to join it at the end. With 200 turns
in flight that was 200 idle threads, ~300 KiB of RSS each: most of the memory per turn.

Here a request's thread-sensitive work runs on a *lane* borrowed from a set the process keeps
(`RequestThreads`): one thread that runs the request's calls one at a time, as Django expects,
held by the request only while that thread has a database connection open for it (Django's
connections are per thread: the one thread-bound state a request keeps between its calls), and
given back as soon as it has none. A streamed turn whose request keeps no connection open holds
no thread while it streams, and lanes are reused rather than started per request.

The middleware chain is Django's `MIDDLEWARE`, each of Django's sync middlewares served by its
async-native twin (`ASYNC_TWINS`, geosense/middleware.py): the same behaviour without a thread hop
per step. `MIDDLEWARE` keeps Django's names, which Django's deploy checks look for.
"""

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext
from django.conf import settings
from django.core.handlers import asgi
from django.db import connections

# Django's middleware (its `MIDDLEWARE` name) → its async-native twin (geosense/middleware.py).
ASYNC_TWINS: dict[str, str] = {
    "django.middleware.security.SecurityMiddleware": "geosense.middleware.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware": "geosense.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware": "geosense.middleware.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware": "geosense.middleware.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware": (
        "geosense.middleware.AuthenticationMiddleware"
    ),
    "django.contrib.messages.middleware.MessageMiddleware": "geosense.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": (
        "geosense.middleware.XFrameOptionsMiddleware"
    ),
}

# Idle lanes kept for the next requests; a lane given back beyond this many ends its thread.
IDLE_LANES_KEPT = 8


def _holds_connection() -> bool:
    """Whether this thread has a database connection open (a request must come back to it)."""
    return any(conn.connection is not None for conn in connections.all(initialized_only=True))


class _Lanes:
    """The process's idle lanes: each a one-thread executor, most recently used first."""

    def __init__(self, *, keep: int) -> None:
        self._idle: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()
        self._keep = keep

    def take(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, lane: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(lane)
                return
        lane.shutdown(wait=False)


lanes = _Lanes(keep=IDLE_LANES_KEPT)


class RequestThreads(Executor):
    """The executor of one request's thread-sensitive calls: one at a time, on a lane taken
    when a call comes and no lane is held, kept while a call is queued or running or while the
    lane's thread has a connection open (the request's next calls must see it), given back
    otherwise. At the request's end (`end`), a lane still held closes its connections, as the
    request's own thread did by ending, and is given back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lane: ThreadPoolExecutor | None = None
        self._calls = 0
        self._ended = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._lane is None:
                self._lane = lanes.take()
            self._calls += 1
            return self._lane.submit(self._call, fn, *args, **kwargs)

    def _call(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            self._after_call()

    def _after_call(self) -> None:
        holds = _holds_connection()
        with self._lock:
            self._calls -= 1
            if self._calls or (holds and not self._ended):
                return
            lane, self._lane = self._lane, None
        if holds:
            connections.close_all()
        lanes.give_back(lane)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            if self._calls or self._lane is None:
                return
            self._calls += 1
            self._lane.submit(self._call, _nothing)


def _nothing() -> None:
    """A call that only runs the lane's release (`RequestThreads._after_call`)."""


class _RequestContext(ThreadSensitiveContext):
    """asgiref's per-request context, its thread-sensitive calls sent to `RequestThreads`.

    A task started by the request that outlives it (a turn whose client went away) and calls
    thread-sensitive code later gets a thread of its own from asgiref, as under Django's
    handler."""

    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()

    async def __aenter__(self):
        await super().__aenter__()
        if self.token is not None:
            SyncToAsync.context_to_thread_executor[self] = self.threads
        return self

    async def __aexit__(self, exc, value, tb):
        # Taken out first: asgiref would otherwise shut it down from a new thread.
        if SyncToAsync.context_to_thread_executor.pop(self, None) is self.threads:
            self.threads.end()
        await super().__aexit__(exc, value, tb)


class ASGIHandler(asgi.ASGIHandler):
    """Django's ASGI handler with per-request lanes and the async-native middleware chain."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        async with _RequestContext():
            await self.handle(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        """Django's chain, built with each middleware of `ASYNC_TWINS` replaced by its twin.

        `MIDDLEWARE` is read by Django's loader and by its system checks, which look for
        Django's own names (`check --deploy` skips the HSTS, SSL-redirect and cookie checks
        without them): the twins are swapped in for the loader alone, while the handler is
        built at start-up."""
        configured = settings.MIDDLEWARE
        settings.MIDDLEWARE = [ASYNC_TWINS.get(path, path) for path in configured]
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = configured


def asgi_application() -> ASGIHandler:
    """`django.core.asgi.get_asgi_application`, with this handler."""
    import django

    django.setup(set_prefix=False)
    return ASGIHandler()
