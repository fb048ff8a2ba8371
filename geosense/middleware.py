"""Async-native twins of Django's sync middlewares, for the ASGI handler (geosense/handler.py).

Under ASGI, Django's `MiddlewareMixin` runs every `process_request` and `process_response` in
the request's thread (`sync_to_async`): two thread hops per middleware and request, although
these steps only read the request and set headers or cookies. Each twin below runs Django's own
methods, unchanged, on the event loop; a step that may reach the database (a session to save,
messages to store in it, the session-held CSRF secret, the CSRF failure view reading the user)
still runs in the request's thread, as Django runs it. `request.auser()` loads the session and
its user in one trip to the requests' database pool (`geosense.dbpool.in_request_thread`)
instead of the async ORM's hops to the request's thread, whose connection would then keep a
thread for the whole request; the same trip makes the view's first read
(geosense/accounts/first_read.py).

What a middleware hangs on the request and that points back at it (the message storage,
django-htmx's details) reaches it through a weak proxy: a strong reference made a cycle, and
each request (~50 objects: its headers, body, session, user, match) waited for the garbage
collector instead of going when its handler let go of it.

Consecutive twins are one layer of the chain (`TwinsRun`): one coroutine runs their steps, in
place of a coroutine per twin and Django's exception wrapper around each, every one resumed at
each wait of the view. GeoSense's own two middlewares (jsonapi's, the bearer token's) have twins
too, so the run is the whole chain.

Sync requests (Django's test client, `manage.py` commands) use Django's classes as they are.
"""

import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import middleware as auth_middleware
from django.contrib.messages import middleware as messages_middleware
from django.contrib.messages.storage import default_storage
from django.contrib.sessions import middleware as sessions_middleware
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase, ResponseHeaders
from django.middleware import clickjacking, common, csrf, security
from django.utils.functional import SimpleLazyObject, empty
from django_htmx import middleware as htmx_middleware

from geosense.accounts.first_read import first_read_keep, first_read_make, first_read_planned
from geosense.accounts.middleware import bearer_token, token_user_decide
from geosense.dbpool import in_request_thread
from geosense.jsonapi import answer_as_json

# A twin's `response_needs_thread`'s answer where its response step would leave the answer as it
# is: the run does not call it. (Its own object: no setting's value can be taken for it.)
NOTHING_TO_DO = object()


class AsyncNative:
    """A twin: Django's `MiddlewareMixin.__acall__`, each step on the loop unless it says it needs
    the request's thread (`request_needs_thread`, `response_needs_thread`: None when it never
    does; the response's may also answer `NOTHING_TO_DO`: the step is then not called);
    a request step may be a coroutine function (awaited on the loop). Only the ASGI handler
    loads the twins, async.

    In the chain, consecutive twins are one layer (`TwinsRun`, made by the handler's loader,
    geosense/handler.py `_converted`), without Django's `convert_exception_to_response` around
    each: the run converts their exceptions as that wrapper did. Called alone, a twin is a run
    of one."""

    sync_capable = False
    async_capable = True

    request_needs_thread: Callable[[HttpRequest], bool] | None = None
    response_needs_thread: Callable[[HttpRequest, HttpResponseBase], object] | None = None

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return await TwinsRun((self,), self.get_response)(request)


async def _exception_answer(request: HttpRequest, exc: Exception) -> HttpResponseBase:
    """Django's `convert_exception_to_response`'s answer to a layer's exception."""
    return await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)


class TwinsRun:
    """Consecutive twins of the chain (outermost first) as one layer: their request steps in
    order, then the next layer (`get_response`), then their response steps in reverse, as the
    nested twins ran them, a response from a request step going back through the response
    steps of that twin and those before it. An exception is answered where the twin whose step
    raised it would have answered it (`response_for_exception`), and that answer goes through
    the response steps of the twins before it; the next layer's, by the innermost twin, whose
    response step is then skipped.

    Nested, each twin was a coroutine of its own, called and then resumed at every wait of the
    layers inside it (the bearer token's trip, each of the view's); the run is one coroutine,
    its steps read once, when the chain is built."""

    def __init__(self, layers: tuple[AsyncNative, ...], get_response) -> None:
        self.layers = layers
        self.get_response = get_response
        self._steps = tuple(
            (
                getattr(layer, "process_request", None),
                layer.request_needs_thread,
                iscoroutinefunction(getattr(layer, "process_request", None)),
                getattr(layer, "process_response", None),
                layer.response_needs_thread,
            )
            for layer in layers
        )
        markcoroutinefunction(self)

    @property
    def decides_token_user(self) -> bool:
        """The first twin's word (`BearerTokenMiddleware`'s), for the layer before the run."""
        return getattr(self.layers[0], "decides_token_user", False)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        entered = 0  # the twins whose response steps run
        for step, needs_thread, waits, _, _ in self._steps:
            if step is not None:
                try:
                    if needs_thread is not None and needs_thread(request):
                        response = await sync_to_async(step, thread_sensitive=True)(request)
                    elif waits:
                        response = await step(request)
                    else:
                        response = step(request)
                except Exception as exc:
                    response = await _exception_answer(request, exc)
                    break
            entered += 1
            if response:
                break
        else:
            try:
                response = await self.get_response(request)
            except Exception as exc:
                response = await _exception_answer(request, exc)
                entered -= 1
        for _, _, _, step, needs_thread in reversed(self._steps[:entered]):
            if step is None:
                continue
            try:
                needs = needs_thread is not None and needs_thread(request, response)
                if needs is NOTHING_TO_DO:
                    continue
                if needs:
                    response = await sync_to_async(step, thread_sensitive=True)(request, response)
                else:
                    response = step(request, response)
            except Exception as exc:
                response = await _exception_answer(request, exc)
        return response


def twins_joined(twin: AsyncNative) -> TwinsRun:
    """`twin` as the chain's layer: joined to the run of twins after it, if it is one."""
    inner = twin.get_response
    if type(inner) is TwinsRun:
        return TwinsRun((twin, *inner.layers), inner.get_response)
    return TwinsRun((twin,), inner)


class SecurityMiddleware(AsyncNative, security.SecurityMiddleware):
    """Django's headers of every answer (nosniff, the referrer and opener policies: each set
    unless the answer has it, from settings read as the middleware is made) are made once, by
    Django's own step on an empty answer, and set in one go: Django's three `setdefault`s
    checked and encoded each name and value again for every answer (~17 Python calls). A
    secure request where HSTS is on, or headers that are not Django's, take Django's step."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        blank = HttpResponse()
        del blank["Content-Type"]
        super().process_response(HttpRequest(), blank)  # not secure: no HSTS
        self._every_answer = tuple(blank.headers._store.items())

    def process_response(self, request: HttpRequest, response: HttpResponseBase):
        headers = response.headers
        if type(headers) is not ResponseHeaders or (self.sts_seconds and request.is_secure()):
            return super().process_response(request, response)
        # The store: lower-case name → (name, value), as `ResponseHeaders.__setitem__` writes.
        store = headers._store
        for key, pair in self._every_answer:
            if key not in store:
                store[key] = pair
        return response


class CommonMiddleware(AsyncNative, common.CommonMiddleware):
    pass


class XFrameOptionsMiddleware(AsyncNative, clickjacking.XFrameOptionsMiddleware):
    """Django's step, its header (`get_xframe_options_value`'s, read for every answer) set in
    the answer's store as Django made it for the same value before, without Django's read
    through the headers' mapping and its checks and encoding of the name and value (~6 Python
    calls an answer)."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        self._made: tuple[object, tuple[str, str] | None] = (None, None)

    def process_response(self, request: HttpRequest, response: HttpResponseBase):
        headers = response.headers
        if type(headers) is not ResponseHeaders:
            return super().process_response(request, response)
        store = headers._store
        if "x-frame-options" in store or getattr(response, "xframe_options_exempt", False):
            return response
        value = self.get_xframe_options_value(request, response)
        made, pair = self._made
        if pair is None or type(value) is not str or value != made:
            made_headers = ResponseHeaders({"X-Frame-Options": value})
            pair = made_headers._store["x-frame-options"]
            self._made = (value, pair)
        store["x-frame-options"] = pair
        return response


def _lazy(func: Callable[[], Any]) -> SimpleLazyObject:
    """`SimpleLazyObject(func)`: the same object, its two entries (`_setupfunc`, `_wrapped`) set
    in its `__dict__` directly, where its `__init__`, `LazyObject.__init__` and the proxy's
    `__setattr__` and two `__getattribute__`s set them (5 Python calls, for each of the
    session's, the messages' and the user's lazy object a request)."""
    lazy = object.__new__(SimpleLazyObject)
    state = object.__getattribute__(lazy, "__dict__")
    state["_setupfunc"] = func
    state["_wrapped"] = empty
    return lazy


def _unmade(lazy: Any) -> bool:
    """Whether `lazy` is a `SimpleLazyObject` not made yet (read without its proxy's Python
    `__getattribute__`)."""
    return isinstance(lazy, SimpleLazyObject) and object.__getattribute__(lazy, "_wrapped") is empty


class SessionMiddleware(AsyncNative, sessions_middleware.SessionMiddleware):
    """The session is read lazily (by whoever reads it); the answer saves it when modified.

    Without a session cookie, the (empty) store itself is made when first used: an API request
    by token never does, and Django made one for each (~10 Python calls, the serializer's import
    looked up); an unmade store was never accessed nor modified, so Django's answer would have
    left the response as it is."""

    def process_request(self, request: HttpRequest) -> None:
        if settings.SESSION_COOKIE_NAME in request.COOKIES:
            super().process_request(request)
        else:
            request.session = _lazy(self.SessionStore)

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> object:
        session = getattr(request, "session", None)
        if session is None or _unmade(session):
            return NOTHING_TO_DO  # `process_response` would leave the answer as it is
        return session.modified or settings.SESSION_SAVE_EVERY_REQUEST


class MessageMiddleware(AsyncNative, messages_middleware.MessageMiddleware):
    """The storage is made when a message is first read or added (an API request never does:
    Django made two storages and a signer for each, ~15 µs); messages are stored only when some
    were read or added (the session may hold them), in the request's thread."""

    def process_request(self, request: HttpRequest) -> None:
        request._messages = _lazy(partial(default_storage, weakref.proxy(request)))

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> object:
        storage = getattr(request, "_messages", None)
        if storage is None or _unmade(storage):
            return NOTHING_TO_DO  # `process_response` would leave the answer as it is
        return bool(storage.used or storage.added_new)


class HtmxMiddleware(AsyncNative, htmx_middleware.HtmxMiddleware):
    """django-htmx's `request.htmx`, holding the request through a weak proxy."""

    def process_request(self, request: HttpRequest) -> None:
        request.htmx = htmx_middleware.HtmxDetails(weakref.proxy(request))


class ApiJsonErrorsMiddleware(AsyncNative):
    """geosense.jsonapi's middleware (API errors answered in JSON) as a twin."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def process_response(self, request: HttpRequest, response: HttpResponseBase):
        return answer_as_json(request, response)


class BearerTokenMiddleware(AsyncNative):
    """geosense.accounts.middleware's bearer-token authentication as a twin: its request step
    (`token_user_decide`) awaited in the run."""

    # For the authentication twin before it (`AuthenticationMiddleware`).
    decides_token_user = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    process_request = staticmethod(token_user_decide)


def _session_user(request: HttpRequest, planned):
    """In the requests' pool: the session's user, and the view's first read made for them."""
    user = auth.get_user(request)
    return user, first_read_make(user, planned)


async def _auser(request: HttpRequest):
    """Django's `request.auser()`: the session's user, its session hash verified
    (`auth.get_user`), in one trip to the requests' database pool, with the first read of the
    view once it is resolved (`request.resolver_match`)."""
    if not hasattr(request, "_acached_user"):
        planned = first_read_planned(getattr(request, "resolver_match", None))
        user, made = await in_request_thread(_session_user)(request, planned)
        request._acached_user = user
        first_read_keep(request, made)
    return request._acached_user


class AuthenticationMiddleware(AsyncNative, auth_middleware.AuthenticationMiddleware):
    """Django's lazy `request.user` and `request.auser()`, holding the request through a weak
    proxy (Django's closures over the request made a cycle of each cookie request).

    A request with a bearer token gets neither when `BearerTokenMiddleware` is the next layer
    (it says so: `decides_token_user`): it sets the token's user in their place or answers the
    request itself, so Django's were made for nothing (~12 Python calls)."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        self.token_user_next = getattr(get_response, "decides_token_user", False)

    def process_request(self, request: HttpRequest) -> None:
        if self.token_user_next and bearer_token(request) is not None:
            return
        super().process_request(request)  # Django's check that sessions come first
        weak = weakref.proxy(request)
        request.user = _lazy(partial(auth_middleware.get_user, weak))
        request.auser = partial(_auser, weak)


class _Rejected(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CsrfViewMiddleware(AsyncNative, csrf.CsrfViewMiddleware):
    """Django's check on the loop (it reads the cookie, headers and body); a rejection's
    answer, the failure view (`CSRF_FAILURE_VIEW`, which reads the user), in the request's
    thread. With `CSRF_USE_SESSIONS` the secret is the session's: read and written there too."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        if self.async_mode:
            # The handler takes `process_view` as the view hook: a coroutine is awaited on the
            # loop, a plain method would be run in the request's thread.
            self.process_view = self._aprocess_view

    def request_needs_thread(self, request: HttpRequest) -> bool:
        return settings.CSRF_USE_SESSIONS

    def response_needs_thread(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        return settings.CSRF_USE_SESSIONS

    async def _aprocess_view(self, request, callback, callback_args, callback_kwargs):
        try:
            return super().process_view(request, callback, callback_args, callback_kwargs)
        except _Rejected as rejected:
            reject = super()._reject
            return await sync_to_async(reject, thread_sensitive=True)(request, rejected.reason)

    def _reject(self, request: HttpRequest, reason: str):
        if self.async_mode:
            raise _Rejected(reason)
        return super()._reject(request, reason)
