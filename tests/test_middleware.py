"""The middleware chain under the ASGI application (geosense/middleware.py, the twins of Django's
sync middlewares, and geosense/accounts/middleware.py): what a request costs the event loop in
the chain, and answers equal to those of Django's own chain, middleware by middleware as
`MIDDLEWARE` lists them (Django's `ASGIHandler`, each sync middleware in a thread)."""

import asyncio
import gc
import re
import sys
import threading
from collections import Counter

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.middleware import clickjacking, security
from django.utils.deprecation import MiddlewareMixin
from django.utils.functional import SimpleLazyObject

import chat.api
from geosense import middleware
from geosense.accounts.middleware import BearerTokenMiddleware
from geosense.asgi import django_asgi_app
from geosense.wire import TurnEvent
from tests.test_handler import Browser, _scope, someone

pytestmark = pytest.mark.django_db(transaction=True)

# Where a middleware's code lives: Django's and django-htmx's middlewares, the adapter every
# layer is wrapped in, and ours.
_MIDDLEWARE_FILES = (
    "/django/middleware/",
    "/django/contrib/sessions/middleware.py",
    "/django/contrib/auth/middleware.py",
    "/django/contrib/messages/middleware.py",
    "/django/utils/deprecation.py",
    "/django/core/handlers/exception.py",
    "/django_htmx/middleware.py",
    "/geosense/middleware.py",
    "/geosense/jsonapi.py",
    "/geosense/accounts/middleware.py",
)


def _layer(frame) -> str | None:
    """The middleware whose code runs this frame or one of its callers, if any."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("/django/core/handlers/base.py"):
            return None  # the handler's own work (the view's, below the chain)
        if any(part in code.co_filename for part in _MIDDLEWARE_FILES):
            owner = frame.f_locals.get("self")
            return type(owner).__name__ if owner is not None else code.co_qualname
        frame = frame.f_back
    return None


async def chain_calls(scope: dict, body: bytes) -> Counter:
    """The Python calls made on the event loop by the middleware chain for one request through
    the ASGI application (the calls of its layers and of what they call), by layer."""
    loop_thread = threading.current_thread()
    calls: Counter = Counter()

    def count(frame, event, arg):
        if event == "call" and threading.current_thread() is loop_thread:
            layer = _layer(frame)
            if layer is not None:
                calls[layer] += 1

    app = ApplicationCommunicator(django_asgi_app, scope)
    await app.send_input({"type": "http.request", "body": body})
    gc.disable()  # a collection's finalizers would count in whichever layer runs then
    sys.setprofile(count)
    try:
        assert (await app.receive_output(10))["type"] == "http.response.start"
        while (await app.receive_output(10)).get("more_body"):
            pass
        await app.wait(5)
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


@pytest.fixture
def quick_turns(monkeypatch):
    """Turns that end at once: `turn_start`, `turn_end`, nothing else stored or read."""

    def launch(prepared, *, listener):
        async def run():
            for event in (
                TurnEvent("turn_start", {"session": "s", "turn": 1}),
                TurnEvent("turn_end", {}),
            ):
                await asyncio.sleep(0)
                listener(event)

        return asyncio.create_task(run())

    async def prepare(**kwargs):
        return None

    monkeypatch.setattr(chat.api, "turn_launch", launch)
    monkeypatch.setattr(chat.api, "turn_prepare", prepare)


def _stream_scope(session, headers: dict[str, str]) -> dict:
    return _scope(
        "POST",
        f"/api/sessions/{session.pk}/message/stream",
        {"Content-Type": "application/json", **headers},
    )


# What the chain costs a streamed message by bearer token (its own calls and Django's code it
# runs), before and after each change:
# 289 (each twin through Django's `MiddlewareMixin.__call__`, `__acall__` and a helper a step),
# 261 (the twins called as the chain's layers, their steps inline),
# 249 (the bearer token read from `META`, not `request.headers`),
# 216 (no lazy user, nor an empty session store, made for nothing; messages' storage checked once),
# 169 (no `convert_exception_to_response` coroutine around the six `AsyncNative` twins, which
# convert their own exceptions: called, and resumed at each of the view's waits),
# 154 (the ten layers one run of twins, `TwinsRun`: one coroutine, resumed once at each wait),
# 124 (the security and frame twins' headers set in the answer's store as Django made them),
# 95 (the bearer token's URL match a copy of the one Django made for the path, `_resolved`),
# 87 (the session's and the messages' lazy objects made without their `__init__`s, `_lazy`),
# 83 (their response steps not called where they have nothing to do: `response_needs_thread`
# answers `NOTHING_TO_DO`).
STREAM_BY_TOKEN_CALLS = 83


@pytest.mark.asyncio
async def test_a_streamed_message_by_token_costs_the_chain_few_python_calls(quick_turns):
    _, token, session = await database_sync_to_async(someone)("alice")
    scope = _stream_scope(session, {"Authorization": f"Bearer {token}"})
    await chain_calls(scope, b'{"text": "hello"}')  # imports and caches made once

    calls = await chain_calls(scope, b'{"text": "hello"}')

    assert sum(calls.values()) <= STREAM_BY_TOKEN_CALLS, calls


@pytest.mark.asyncio
async def test_a_wait_of_the_view_resumes_the_chain_once_not_each_layer(monkeypatch, quick_turns):
    """Every wait of the view (its trips to the database, its checks off the loop) resumed each
    layer of the chain on its way back: each twin's coroutine and each Django exception wrapper,
    15 coroutines for a streamed message. The twins are one run now: 2 (the run and Django's
    wrapper around the view)."""
    _, token, session = await database_sync_to_async(someone)("alice")
    scope = _stream_scope(session, {"Authorization": f"Bearer {token}"})
    waits = 5

    async def prepare(**kwargs):
        for _ in range(waits):
            await asyncio.sleep(0)

    await chain_calls(scope, b'{"text": "hello"}')  # imports and caches made once
    without = sum((await chain_calls(scope, b'{"text": "hello"}')).values())
    monkeypatch.setattr(chat.api, "turn_prepare", prepare)
    with_waits = sum((await chain_calls(scope, b'{"text": "hello"}')).values())

    assert with_waits - without == 2 * waits


async def _answer(app, scope: dict, body: bytes) -> tuple:
    """Status, headers and body of one request through `app` (a stream's first chunk only),
    each cookie's value and CSRF token masked: they differ each time; and a cookie's `expires`
    date, a second later when the second turned between the two answers (its `Max-Age` stays)."""
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": body})
    start = await communicator.receive_output(10)
    first = await communicator.receive_output(10)
    while first.get("more_body") and not first.get("body"):
        first = await communicator.receive_output(10)
    headers = []
    for name, value in start["headers"]:
        name, value = name.decode().lower(), value.decode()
        if name == "set-cookie":
            cookie, _, attributes = value.partition(";")
            attributes = re.sub(r"expires=[^;]*", "expires=…", attributes)
            value = f"{cookie.partition('=')[0]}=…;{attributes}"
        headers.append((name, value))
    await communicator.wait(5)
    body = re.sub(rb"\b[A-Za-z0-9]{64}\b", b"\xe2\x80\xa6", first.get("body", b""))
    return start["status"], sorted(headers), body


@pytest.mark.asyncio
async def test_each_answer_is_djangos_own_chains(quick_turns):
    """Every kind of request the API and the pages take answers as through Django's own chain
    (status, headers, cookies set or deleted, body): bearer tokens (good, bad, out of their
    scope, with a session cookie beside), cookie writes with and without their CSRF token,
    anonymous ones, pages, the login form, an unknown path."""
    _, token, session = await database_sync_to_async(someone)("alice")
    browser = Browser()
    assert (await browser.login("alice")).status == 302
    cookies = "; ".join(f"{k}={v}" for k, v in browser.jar.items())
    csrf = {"Cookie": cookies, "X-CSRFToken": browser.jar["csrftoken"]}
    bearer = {"Authorization": f"Bearer {token}"}
    as_json = {"Content-Type": "application/json"}
    stream = f"/api/sessions/{session.pk}/message/stream"
    requests = [
        ("POST", stream, {**bearer, **as_json}, b'{"text": "hi"}'),
        ("POST", stream, {**bearer, **as_json, "Cookie": cookies}, b'{"text": "hi"}'),
        ("POST", stream, {**bearer, **as_json, "Cookie": "sessionid=short"}, b'{"text": "hi"}'),
        ("POST", stream, {**bearer, **as_json}, b'{"text": ""}'),
        ("POST", stream, {"Authorization": "Bearer gs_nope", **as_json}, b'{"text": "hi"}'),
        ("POST", stream, {"Authorization": "Bearer ", "Cookie": cookies, **as_json}, b"{}"),
        ("POST", stream, {**csrf, **as_json}, b'{"text": "hi"}'),
        ("POST", stream, {"Cookie": cookies, **as_json}, b'{"text": "hi"}'),
        ("POST", stream, as_json, b'{"text": "hi"}'),
        ("GET", "/api/sessions", bearer, b""),
        ("GET", "/api/sessions", {"Cookie": cookies}, b""),
        ("GET", "/api/sessions/", bearer, b""),
        ("GET", "/api/nowhere", bearer, b""),
        ("GET", "/chat/", bearer, b""),
        ("GET", "/chat/", {}, b""),
        ("GET", "/accounts/login/", {}, b""),
        ("GET", "/accounts/login/", {"HX-Request": "true"}, b""),
        ("POST", "/accounts/login/", {"Content-Type": "application/x-www-form-urlencoded"}, b"a=b"),
        # a twin's own step raising (CommonMiddleware's host check): its 400, through the
        # outer layers' response steps
        ("GET", "/chat/", {"Host": "evil.example"}, b""),
        ("POST", stream, {**bearer, **as_json, "Host": "evil.example"}, b'{"text": "hi"}'),
    ]
    djangos = DjangoASGIHandler()
    for method, path, headers, body in requests:
        ours = await _answer(django_asgi_app, _scope(method, path, headers), body)
        theirs = await _answer(djangos, _scope(method, path, headers), body)
        assert ours == theirs, (method, path, headers)


def test_a_bearer_request_has_its_user_set_by_the_token_alone_only_where_it_comes_next():
    """The authentication twin leaves a request with a bearer token's user to
    `BearerTokenMiddleware` only when that is the next layer: in another chain (a settings
    variant without it, or with a layer between them) the request gets Django's lazy user, as
    it did from Django's own middleware."""
    auth = settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    assert settings.MIDDLEWARE[auth + 1] == "geosense.accounts.middleware.BearerTokenMiddleware"

    async def view(request):
        return HttpResponse()

    def request_by_token():
        request = HttpRequest()
        request.META["HTTP_AUTHORIZATION"] = "Bearer gs_some"
        request.session = SimpleLazyObject(dict)
        return request

    elsewhere = request_by_token()
    middleware.AuthenticationMiddleware(convert_exception_to_response(view)).process_request(
        elsewhere
    )
    assert hasattr(elsewhere, "user") and hasattr(elsewhere, "auser")

    before_the_token = request_by_token()
    token_next = convert_exception_to_response(BearerTokenMiddleware(view))
    middleware.AuthenticationMiddleware(token_next).process_request(before_the_token)
    assert not hasattr(before_the_token, "user")


def test_only_a_twins_own_call_goes_without_djangos_exception_wrapper():
    """The handler joins a layer whose `__call__` is the twins' to the run of twins after it
    (which converts their exceptions); a subclass with a `__call__` of its own may not, and is
    wrapped by Django (review 29-b L1: an inherited flag let it through unwrapped)."""
    from geosense.handler import _converted
    from geosense.middleware import CommonMiddleware, SessionMiddleware, TwinsRun

    async def view(request):
        return HttpResponse()

    class Reraising(SessionMiddleware):
        async def __call__(self, request):
            return await self.get_response(request)

    twin, own = SessionMiddleware(view), Reraising(view)
    assert type(_converted(twin)) is TwinsRun and _converted(twin).layers == (twin,)
    assert type(_converted(own)) is not TwinsRun
    inner = CommonMiddleware(_converted(own))
    outer = SessionMiddleware(_converted(inner))
    assert _converted(outer).layers == (outer, inner)
    assert _converted(outer).get_response is inner.get_response


class _Step(MiddlewareMixin):
    """A middleware that logs its steps, and raises in the one `failing` names, or answers
    in its request step when `answering`."""

    failing: tuple[str, str] | None = None
    answering: str | None = None
    log: list[str] = []

    def process_request(self, request):
        self.log.append(f"{self.name} request")
        if self.failing == (self.name, "request"):
            raise ValueError(self.name)
        if self.answering == self.name:
            return HttpResponse(f"answered by {self.name}")
        return None

    def process_response(self, request, response):
        self.log.append(f"{self.name} response {response.status_code}")
        if self.failing == (self.name, "response"):
            raise ValueError(self.name)
        response[f"X-{self.name}"] = "1"
        return response


def _steps(name: str, *, twin: bool) -> type:
    bases = (middleware.AsyncNative, _Step) if twin else (_Step,)
    return type(f"{name}{'Twin' if twin else ''}", bases, {"name": name})


@pytest.mark.parametrize(
    "failing, answering",
    [
        (None, None),
        (("a", "request"), None),
        (("b", "request"), None),
        (("c", "request"), None),
        (("a", "response"), None),
        (("b", "response"), None),
        (("c", "response"), None),
        (("view", ""), None),
        (None, "b"),
        (("a", "response"), "c"),
    ],
)
@pytest.mark.asyncio
async def test_a_run_of_twins_answers_and_steps_as_nested_layers_do(
    monkeypatch, failing, answering
):
    """Three layers as Django nests them (each `MiddlewareMixin`, each in Django's exception
    wrapper) and as one run of twins: the same steps in the same order, the same answer, for a
    step or the view raising and a request step answering."""
    from geosense.handler import _converted

    monkeypatch.setattr(_Step, "failing", failing)
    monkeypatch.setattr(_Step, "answering", answering)

    async def view(request):
        _Step.log.append("view")
        if failing == ("view", ""):
            raise ValueError("view")
        return HttpResponse("viewed")

    results = []
    for twin, wrap in ((False, convert_exception_to_response), (True, _converted)):
        handler = convert_exception_to_response(view)
        for name in ("c", "b", "a"):
            handler = wrap(_steps(name, twin=twin)(handler))
        assert not twin or len(handler.layers) == 3
        _Step.log = []
        request = HttpRequest()
        request.method, request.path = "GET", "/x"
        answer = await handler(request)
        results.append(
            (list(_Step.log), answer.status_code, answer.content, sorted(answer.items()))
        )

    assert results[0] == results[1]


def test_the_served_chain_is_one_run_of_twins_in_middlewares_order():
    """The application's chain: every middleware of `MIDDLEWARE` a twin, all in one run, in
    `MIDDLEWARE`'s order; the authentication twin leaves a token request's user to the bearer
    token's twin, the next layer (as it did through Django's wrapper, which copied its word)."""
    chain = django_asgi_app._middleware_chain

    assert type(chain) is middleware.TwinsRun
    assert [layer.__class__.__name__ for layer in chain.layers] == [
        path.rpartition(".")[2] for path in settings.MIDDLEWARE
    ]
    authentication = chain.layers[
        settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware")
    ]
    assert authentication.token_user_next


_HEADER_ANSWERS = {
    "none": lambda: HttpResponse(),
    "stream": lambda: StreamingHttpResponse(iter([b"x"]), content_type="text/event-stream"),
    "theirs set": lambda: HttpResponse(
        headers={
            "x-content-type-options": "other",
            "REFERRER-POLICY": "origin",
            "Cross-Origin-Opener-Policy": "unsafe-none",
            "x-frame-options": "SAMEORIGIN",
        }
    ),
    "exempt": lambda: _exempt(HttpResponse()),
}


def _exempt(response: HttpResponse) -> HttpResponse:
    response.xframe_options_exempt = True
    return response


@pytest.mark.parametrize(
    "configured",
    [
        {},
        {"SECURE_CONTENT_TYPE_NOSNIFF": False, "SECURE_CROSS_ORIGIN_OPENER_POLICY": None},
        {"SECURE_REFERRER_POLICY": ["no-referrer", " origin"], "X_FRAME_OPTIONS": "sameorigin"},
        {"SECURE_REFERRER_POLICY": None, "SECURE_HSTS_SECONDS": 60, "SECURE_HSTS_PRELOAD": True},
        {"SECURE_HSTS_SECONDS": 60, "SECURE_PROXY_SSL_HEADER": ("HTTP_X_PROTO", "https")},
    ],
    ids=["defaults", "off", "listed", "hsts", "hsts secure"],
)
@pytest.mark.parametrize("answer", list(_HEADER_ANSWERS))
def test_the_security_and_frame_twins_set_djangos_headers(configured, answer, settings):
    """The security and frame twins set their headers in the answer's store at once, made
    when the twin is (the frame's for each value read): the headers, their order and their
    values are those of Django's own steps, for every settings variant and answer."""
    for name, value in configured.items():
        setattr(settings, name, value)
    request = HttpRequest()
    request.META["HTTP_X_PROTO"] = "https"

    def view(request):
        return HttpResponse()

    ours, theirs = _HEADER_ANSWERS[answer](), _HEADER_ANSWERS[answer]()
    for twin, djangos in [
        (middleware.XFrameOptionsMiddleware, clickjacking.XFrameOptionsMiddleware),
        (middleware.SecurityMiddleware, security.SecurityMiddleware),
    ]:
        ours = twin(view).process_response(request, ours)
        theirs = djangos(view).process_response(request, theirs)

    assert list(ours.items()) == list(theirs.items())


def test_the_security_and_frame_twins_set_their_headers_in_few_python_calls():
    """Django's steps set each header through `setdefault` or `get` (with the mapping's
    `__contains__` or `get` and `__getitem__`), then `__setitem__` and two
    `_convert_to_charset`s: 30 Python calls an answer for four headers, 4 now."""

    def view(request):
        return HttpResponse()

    twins = [middleware.XFrameOptionsMiddleware(view), middleware.SecurityMiddleware(view)]
    request = HttpRequest()
    twins[0].process_response(request, HttpResponse())  # the frame's header made once
    response = HttpResponse()

    def steps():
        for twin in twins:
            twin.process_response(request, response)

    calls: list[str] = []

    def count(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(count)
    try:
        steps()
    finally:
        sys.setprofile(None)

    assert len(response.headers) == 5
    assert calls[1:] == [
        "XFrameOptionsMiddleware.process_response",
        "XFrameOptionsMiddleware.get_xframe_options_value",
        "LazyObject.__getattribute__",  # the setting, read for every answer as Django does
        "SecurityMiddleware.process_response",
    ]


# What `middleware._lazy` stands in for: `SimpleLazyObject`'s making, as Django 5.2 makes it.
LAZY_SOURCES = {
    "SimpleLazyObject.__init__": "567fd1341c927577",
    "LazyObject.__init__": "7452dc4fee3b7c62",
    "LazyObject.__setattr__": "def29f5cf64d61e1",
}


def test_a_lazy_object_is_made_as_django_makes_it():
    from django.utils.functional import LazyObject

    from tests.source_pins import source_digests

    made: list[int] = []
    ours, djangos = middleware._lazy(lambda: made.append(1) or "x"), SimpleLazyObject(dict)

    assert type(ours) is type(djangos)
    assert vars(ours).keys() == vars(djangos).keys()
    assert middleware._unmade(ours) and made == []
    assert ours.upper() == "X" and made == [1]
    assert not middleware._unmade(ours)
    assert (
        source_digests(
            {
                "SimpleLazyObject.__init__": SimpleLazyObject.__init__,
                "LazyObject.__init__": LazyObject.__init__,
                "LazyObject.__setattr__": LazyObject.__setattr__,
            }
        )
        == LAZY_SOURCES
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer, steps",
    [(middleware.NOTHING_TO_DO, []), (False, ["loop"]), (None, ["loop"]), (True, ["thread"])],
)
async def test_a_response_step_with_nothing_to_do_is_not_called(answer, steps):
    """Only the run's own `NOTHING_TO_DO` skips a response step: any other answer a twin gives
    (a setting's value, falsy or not) runs it, on the loop or in the request's thread."""
    ran: list[str] = []

    class Twin(middleware.AsyncNative):
        def __init__(self, get_response) -> None:
            self.get_response = get_response

        def response_needs_thread(self, request, response):
            return answer

        def process_response(self, request, response):
            on_loop = threading.current_thread() is threading.main_thread()
            ran.append("loop" if on_loop else "thread")
            return response

    async def view(request):
        return HttpResponse()

    await middleware.TwinsRun((Twin(view),), view)(HttpRequest())

    assert ran == steps
