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

Django sends `request_started` and `request_finished` (the response's close) through a thread
hop each, for their sync receivers. Django's own need none here (`_signal_send`): two look after
the connections of the thread that serves the request, and a request's lane holds none when it is
taken and closes its own when the request ends (`RequestThreads.end`), so they have nothing to
do; the other two only reset what the request's context holds. Any other sync receiver still
runs as Django runs it, in the request's thread.
"""

import asyncio
import io
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from asgiref.local import _CVar
from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.cache import caches, close_caches
from django.core.exceptions import RequestAborted
from django.core.handlers import asgi, base
from django.core.handlers.base import reset_urlconf
from django.core.handlers.exception import convert_exception_to_response
from django.db import close_old_connections, connections, reset_queries
from django.dispatch import Signal
from django.http import HttpRequest
from django.http.response import HttpResponseBase, ResponseHeaders
from django.urls import (
    Resolver404,
    ResolverMatch,
    get_resolver,
    get_script_prefix,
    get_urlconf,
    set_script_prefix,
    set_urlconf,
)
from django.urls import base as urls_base
from django.utils.log import log_response

from geosense.headers import ANSWER_HEADERS, headers_added

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
    "django_htmx.middleware.HtmxMiddleware": "geosense.middleware.HtmxMiddleware",
    # Ours, sync and async functions: their async twins join the run of twins (`_converted`).
    "geosense.jsonapi.ApiJsonErrorsMiddleware": "geosense.middleware.ApiJsonErrorsMiddleware",
    "geosense.accounts.middleware.BearerTokenMiddleware": (
        "geosense.middleware.BearerTokenMiddleware"
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


# Django's receivers of `request_started` and `request_finished` that need no thread here:
# those of the request thread's connections (a lane holds none when it is taken, and closes its
# own at the request's end), and those of the request's context alone, run on the loop.
_LANES_DO_THEIRS = frozenset({close_old_connections, reset_queries})
_CONTEXT_ONLY = frozenset({close_caches, reset_urlconf})
_DJANGOS_OWN = _LANES_DO_THEIRS | _CONTEXT_ONLY


# `_sync_receivers_known`'s answers, by signal and sender, with the signal's receivers they were
# read from.
_receivers_read: dict[tuple[Signal, type], tuple[list, tuple[Callable, ...] | None]] = {}


def _sync_receivers_known(signal: Signal, sender: type) -> tuple[Callable, ...] | None:
    """The signal's receivers to run on the loop, if every receiver is one of Django's above;
    None if any other is connected (or any async one). (Set operations and `filter`, not a
    generator step a receiver: twice a request.)

    Read again only when the signal's receivers changed since the last read for the sender (a
    receiver connected, disconnected or gone: Django's `receivers` list then differs, or its
    dead ones wait to be cleared): Django's `_live_receivers` read them for each request, three
    Python calls a signal."""
    read = _receivers_read.get((signal, sender))
    if read is not None and not signal._dead_receivers and read[0] == signal.receivers:
        return read[1]
    receivers = list(signal.receivers)  # before the read: a change meanwhile is read next time
    sync_receivers, async_receivers = signal._live_receivers(sender)
    if async_receivers or not _DJANGOS_OWN.issuperset(sync_receivers):
        known = None
    else:
        known = tuple(filter(_CONTEXT_ONLY.__contains__, sync_receivers))
    _receivers_read[signal, sender] = (receivers, known)
    return known


def _holds_nothing(local) -> bool:
    """Whether asgiref's `local` holds no value in this context as this thread reads it (its
    context's storage unset or empty, or another thread's, which asgiref reads as empty), in
    one Python call: reading a name it does not hold is four (`Local.__getattr__`,
    `_CVar.__getattr__`, `_storage`, an empty `_Storage` made) and an exception raised and
    caught. False where it cannot tell (a thread-critical `Local`)."""
    cvar = vars(local).get("_storage")
    if type(cvar) is not _CVar:
        return False
    storage = cvar._data.get(None)
    return storage is None or not storage.data or storage.thread_id != threading.get_ident()


# Django's context-only receivers (above) and where the `Local` each only acts on is (its holder
# and name, read at each request: `override_settings(CACHES=...)` makes `caches` a new `Local`,
# review 32-b L1): with nothing in it, the receiver has nothing to do (`close_caches` closes the
# caches made in the context: none; `reset_urlconf` takes the request's URLconf away: none).
_ACTS_ON_ALONE = {close_caches: (caches, "_connections"), reset_urlconf: (urls_base, "_urlconfs")}


async def _signal_send(signal: Signal, sender: type, **named: Any) -> None:
    """`signal.asend`, without its thread hop when only Django's own receivers listen, and
    without the call of one that has nothing to do (`_ACTS_ON_ALONE`)."""
    receivers = _sync_receivers_known(signal, sender)
    if receivers is None:
        await signal.asend(sender=sender, **named)
        return
    for receiver in receivers:
        acts_on = _ACTS_ON_ALONE.get(receiver)
        if acts_on is None or not _holds_nothing(getattr(*acts_on)):
            receiver(signal=signal, sender=sender, **named)


def _closes_on_loop(response: HttpResponseBase) -> bool:
    """Whether closing the response needs no thread: its closers are requests' own (the body
    stream and any uploaded files, as Django's handler closes the body on the loop itself),
    and only Django's own receivers hear `request_finished`."""
    for closer in response._resource_closers:
        owner = getattr(closer, "__self__", None)
        if not isinstance(owner, HttpRequest) or closer.__func__ is not type(owner).close:
            return False
    return _sync_receivers_known(signals.request_finished, response._handler_class) is not None


async def _response_close(response: HttpResponseBase) -> None:
    """`response.close()` (its closers, then `request_finished`), on the loop when it needs no
    thread (`_closes_on_loop`), else in the request's thread as Django runs it."""
    if not _closes_on_loop(response):
        await sync_to_async(response.close)()
        return
    for closer in response._resource_closers:
        try:
            closer()
        except Exception:  # as Django's close: a closer's failure does not stop the others
            pass
    response._resource_closers.clear()
    response.closed = True
    await _signal_send(signals.request_finished, response._handler_class)


# Django's URL prefix and URLconf of a request are asgiref `Local`s: a value set is a storage of
# the request's context, which every trip of the request, and of the turn its view starts (a task
# made in that context), copies to the database thread and back (asgiref's `_restore_context`
# re-homes each to the thread: two Python calls a value each way, ~55 a turn for the two). Each
# is left unset where it would be set to what an unset one reads as.


def _script_prefix_set(prefix: str) -> None:
    """`set_script_prefix`, unless the request's context reads that prefix already (an unset
    one reads "/", the prefix of a request with no `root_path` and no `FORCE_SCRIPT_NAME`: told
    by `_holds_nothing`, where the read of an unset one is five Python calls)."""
    prefix_read = prefix if prefix.endswith("/") else f"{prefix}/"
    if prefix_read == "/" and _holds_nothing(urls_base._prefixes):
        return
    if prefix_read != get_script_prefix():
        set_script_prefix(prefix)


def _default_urlconf_set() -> None:
    """Django's `set_urlconf(settings.ROOT_URLCONF)` at a request's start, unless the request's
    context holds no URLconf (`_holds_nothing`, or `get_urlconf`): every reader takes none as
    `ROOT_URLCONF` (`get_resolver(None)`, `reverse`, `resolve`, the error views'
    `get_resolver(get_urlconf())`)."""
    if not _holds_nothing(urls_base._urlconfs) and get_urlconf() is not None:
        set_urlconf(settings.ROOT_URLCONF)


def response_headers_from_store(response: HttpResponseBase, added: tuple = ()) -> bool:
    """Have Django's `send_response` read the answer's headers from their store, where they are
    kept as the pairs it sends, in order: it reads them through `response.items()`,
    `Mapping`'s view over `ResponseHeaders` (its iterator, a generator step and a `__getitem__`
    a header: ~25 Python calls an answer). Set on the response for its sending only (the
    handler takes it off after), and only where `items` and the headers are Django's own
    (whether they are is returned). `added` (store pairs: the security headers' ASGI
    middleware's, geosense/headers.py) are set first, each unless the answer has its name."""
    if type(response).items is not HttpResponseBase.items:
        return False
    headers = response.headers
    if type(headers) is not ResponseHeaders:
        return False
    store = headers._store
    for key, pair in added:
        if key not in store:
            store[key] = pair
    response.items = store.values
    return True


def _headers_sent(send: Callable, added: tuple) -> Callable:
    """`send`, adding `added` (store pairs) to an answer whose headers are not in Django's
    store (`response_headers_from_store` said no) as the security headers' middleware does."""
    return headers_added(send, [(n.encode("latin-1"), v.encode("latin-1")) for _, (n, v) in added])


# Matches made, by resolver and path, handed out again as copies (`_resolved`). How many are kept:
# past that, they are all let go and made again as requests come.
MATCHES_KEPT = 1024
_matches: dict[tuple[object, str], ResolverMatch] = {}


def _resolved(resolver, path: str) -> ResolverMatch:
    """`resolver.resolve(path)` (Resolver404 when no URL matches), a match made before for the
    same resolver and path handed out again as a copy of its own (its lists and dicts too, as
    a middleware's `process_view` may change the view's arguments in place).

    A turn's stream posts to a few paths (a session's) again and again, and Django's resolve
    walked the URLconf's patterns for each request: the includes tried in order, a match and
    a `ResolverMatch` at each level (30 Python calls a request). A match depends on the
    resolver and the path alone (the URLconf has no locale-prefixed patterns, whose match
    would depend on the language: tests/test_handler.py); a changed URLconf is a resolver of
    its own (Django's `clear_url_caches`), so an old match is never handed out for it."""
    match = _matches.get((resolver, path))
    if match is None:
        match = resolver.resolve(path)
        if len(_matches) >= MATCHES_KEPT:
            _matches.clear()
        _matches[resolver, path] = match
    copy = object.__new__(type(match))
    state = copy.__dict__
    state.update(match.__dict__)
    for name, value in state.items():
        if type(value) is dict or type(value) is list:
            state[name] = value.copy()
    return copy


def request_resolved(request: HttpRequest) -> ResolverMatch | None:
    """The request's view, as Django's `resolve_request` finds it, for a middleware that must
    know it before the handler resolves it (the bearer token's trip makes the view's first read,
    geosense/accounts/first_read.py); None when no URL matches. The handler takes this match
    instead of resolving the same path again."""
    urlconf = getattr(request, "urlconf", None)
    try:
        match = _resolved(get_resolver(urlconf), request.path_info)
    except Resolver404:
        return None
    request._resolved = (request.path_info, urlconf, match)
    return match


async def _first_done(tasks: list[asyncio.Task], loop: asyncio.AbstractEventLoop) -> None:
    """`asyncio.wait(tasks, return_when=FIRST_COMPLETED)` for the handler's two tasks (on
    `loop`, the running one), without its checks of the arguments (an ABC's `isinstance` a
    task), its sets and its callback's removal: 9 Python calls a request less. A cancelled wait
    leaves the tasks running, as `asyncio.wait` does."""
    first = loop.create_future()

    def done(task: asyncio.Task) -> None:
        if not first.done():
            first.set_result(None)

    for task in tasks:
        task.add_done_callback(done)
    try:
        await first
    finally:
        for task in tasks:
            task.remove_done_callback(done)


def _first_again(first: dict, receive: Callable) -> Callable:
    """`receive`, its first message `first` (already received) handed out again."""
    pending = [first]

    async def receive_again() -> dict:
        if pending:
            return pending.pop()
        return await receive()

    return receive_again


def _converted(get_response: Callable) -> Callable:
    """Django's `convert_exception_to_response` for the loader, but a twin (a layer whose
    `__call__` is `AsyncNative`'s) is joined to the twins after it into one layer that converts
    their exceptions as the wrapper would (`TwinsRun`, geosense/middleware.py); a subclass with a
    `__call__` of its own is wrapped (review 29-b L1: an inherited flag would have let one that
    re-raises through unconverted)."""
    from geosense.middleware import AsyncNative, twins_joined  # needs Django set up

    if type(get_response).__call__ is AsyncNative.__call__:
        return twins_joined(get_response)
    return convert_exception_to_response(get_response)


class ASGIHandler(asgi.ASGIHandler):
    """Django's ASGI handler with per-request lanes, the async-native middleware chain and
    Django's request signals without thread hops when only Django's own receivers listen.

    It adds the headers the scope names (`ANSWER_HEADERS`: the security headers' ASGI
    middleware's, geosense/headers.py) to each answer's headers before sending it."""

    takes_answer_headers = True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        async with _RequestContext():
            await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send):
        """Django 5.2's `ASGIHandler.handle`, its signals sent by `_signal_send` and the
        response closed by `_response_close`."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        _script_prefix_set(asgi.get_script_prefix(scope))
        await _signal_send(signals.request_started, self.__class__, scope=scope)
        added = scope.get(ANSWER_HEADERS, ())
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            if not response_headers_from_store(error_response, added) and added:
                send = _headers_sent(send, added)
            await self.send_response(error_response, send)
            error_response.__dict__.pop("items", None)
            await _response_close(error_response)
            return

        async def process_request(request, send):
            response = await self.run_get_response(request)
            if not response_headers_from_store(response, added) and added:
                send = _headers_sent(send, added)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away during send_response
            finally:
                response.__dict__.pop("items", None)
            return response

        # The disconnect listener first: it cancels the view if the client goes away. The tasks
        # made by the loop itself: `asyncio.create_task` looks the loop up again for each (its
        # pid checked by a `getpid` system call) and names it (two Python calls a task).
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self.listen_for_disconnect(receive)),
            loop.create_task(process_request(request, send)),
        ]
        await _first_done(tasks, loop)
        for task in tasks:
            if task.done():
                # Read, not raised: the client's going away (the usual end of a stream) raised
                # here would hold this frame in its traceback, and the frame the task that holds
                # the error: a cycle keeping the whole request for the garbage collector.
                error = None if task.cancelled() else task.exception()
                if error is None or isinstance(error, RequestAborted):
                    continue
                if isinstance(error, AssertionError):
                    body_file.close()
                task.result()
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await _signal_send(signals.request_finished, self.__class__)
        else:
            await _response_close(response)
        body_file.close()

    async def read_body(self, receive):
        """Django's, a body that comes whole in the request's first message and that Django's
        spooled file would keep in memory (not past `FILE_UPLOAD_MAX_MEMORY_SIZE`) held in a
        `BytesIO`, which that file is until it rolls over to disk: every API request's body, read
        without `tempfile`'s Python methods (its making, write, seeks, reads and closes: ~12
        Python calls a request). Anything else (a body in parts, a larger one, a disconnect)
        takes Django's own path, the first message handed to it again."""
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body = message.get("body", b"")
            limit = settings.FILE_UPLOAD_MAX_MEMORY_SIZE
            if not limit or len(body) <= limit:
                return io.BytesIO(body)
        return await super().read_body(_first_again(message, receive))

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """Django 5.2's, its URLconf set by `_default_urlconf_set`."""
        _default_urlconf_set()
        response = await self._middleware_chain(request)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            await sync_to_async(log_response, thread_sensitive=False)(
                "%s: %s",
                response.reason_phrase,
                request.path,
                response=response,
                request=request,
            )
        return response

    async def send_response(self, response: HttpResponseBase, send: Callable) -> None:
        """Django 5.2's, a streamed answer's every part (an SSE stream's every chunk) handed to
        `send` in this coroutine: split by `chunk_bytes` only where it is longer than a chunk
        (Django's called it for each, a Python call), and the stream's iterator closed as
        `aclosing` closes it, its `aclose` awaited however the loop ends (`aclosing`'s making,
        `__aenter__` and `__aexit__`: three Python calls an answer). An answer not streamed is
        Django's."""
        if not response.streaming:
            await super().send_response(response, send)
            return
        response_headers = []
        for header, value in response.items():
            if isinstance(header, str):
                header = header.encode("ascii")
            if isinstance(value, str):
                value = value.encode("latin1")
            response_headers.append((bytes(header), bytes(value)))
        for c in response.cookies.values():
            response_headers.append((b"Set-Cookie", c.output(header="").encode("ascii").strip()))
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response_headers,
            }
        )
        content = aiter(response)
        try:
            async for part in content:
                if len(part) <= self.chunk_size:
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                    continue
                for chunk, _ in self.chunk_bytes(part):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await content.aclose()
        await send({"type": "http.response.body"})

    @classmethod
    def chunk_bytes(cls, data):
        """Django's, a body no longer than a chunk handed on whole without its generator (two
        Python calls): an answer that is not streamed, and a stream's part longer than a
        chunk (`send_response` sends a shorter part as it is)."""
        if len(data) <= cls.chunk_size:
            return ((data, True),)
        return super().chunk_bytes(data)

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """Django's, with the match `request_resolved` made for the same path and URLconf."""
        resolved = getattr(request, "_resolved", None)
        urlconf = getattr(request, "urlconf", None)
        if resolved is None or resolved[:2] != (request.path_info, urlconf):
            return super().resolve_request(request)
        if hasattr(request, "urlconf"):
            set_urlconf(urlconf)
        request.resolver_match = resolved[2]
        return resolved[2]

    def load_middleware(self, is_async: bool = False) -> None:
        """Django's chain, built with each middleware of `ASYNC_TWINS` replaced by its twin, and
        consecutive twins joined into one layer (`TwinsRun`, geosense/middleware.py) that
        converts their exceptions without Django's exception-to-response wrapper around each.

        `MIDDLEWARE` is read by Django's loader and by its system checks, which look for
        Django's own names (`check --deploy` skips the HSTS, SSL-redirect and cookie checks
        without them): the twins are swapped in for the loader alone, while the handler is
        built at start-up."""
        configured = settings.MIDDLEWARE
        settings.MIDDLEWARE = [ASYNC_TWINS.get(path, path) for path in configured]
        base.convert_exception_to_response = _converted
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = configured
            base.convert_exception_to_response = convert_exception_to_response


def asgi_application() -> ASGIHandler:
    """`django.core.asgi.get_asgi_application`, with this handler."""
    import django

    django.setup(set_prefix=False)
    return ASGIHandler()
