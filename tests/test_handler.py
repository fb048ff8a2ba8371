"""The ASGI application's request path (geosense/handler.py, geosense/middleware.py): a request
holds no thread of its own while it streams, makes no thread hop besides its trips to the
database pool (not even Django's two around the request while only Django's own receivers
listen), and behaves as Django's own chain did: sessions, login, CSRF on cookie writes, bearer tokens,
messages, the security headers, the admin.

Each request goes through `geosense.asgi.application`, as under Daphne (Django's test clients
build a handler of their own)."""

import asyncio
import contextvars
import functools
import gc
import hashlib
import inspect
import json
import re
import sys
import tempfile
import threading
import uuid
import weakref
from http.cookies import SimpleCookie

import pytest
from asgiref.local import _Storage
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.core.exceptions import RequestAborted
from django.core.handlers import asgi
from django.core.handlers.base import BaseHandler
from django.core.signals import request_finished, request_started
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import get_resolver, get_script_prefix, get_urlconf, reverse, set_urlconf

import chat.api
from chat.models import ChatSession
from geosense import handler as handler_module
from geosense.accounts.services import api_token_create
from geosense.asgi import application
from geosense.handler import ASGIHandler, response_headers_from_store
from geosense.wire import TurnEvent
from tests.chat.costs import Costs, python_calls_of

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

HELD = 12


def someone(name: str, *, staff: bool = False) -> tuple[object, str, ChatSession]:
    user = get_user_model().objects.create_user(
        name, password=f"pw-{name}-long-enough", is_staff=staff, is_superuser=staff
    )
    return user, api_token_create(user=user), ChatSession.objects.create(user=user)


def _scope(method: str, path: str, headers: dict[str, str]) -> dict:
    path, _, query = path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


class Answer:
    def __init__(self, start: dict, body: bytes) -> None:
        self.status = start["status"]
        self.headers = [(k.decode().lower(), v.decode()) for k, v in start["headers"]]
        self.body = body

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def cookies(self) -> dict[str, str]:
        jar = SimpleCookie()
        for k, v in self.headers:
            if k == "set-cookie":
                jar.load(v)
        return {name: morsel.value for name, morsel in jar.items()}

    def json(self) -> dict:
        return json.loads(self.body)


async def call(method: str, path: str, *, headers=None, body: bytes = b"") -> Answer:
    """One request through the application, answered in full."""
    app = ApplicationCommunicator(application, _scope(method, path, headers or {}))
    await app.send_input({"type": "http.request", "body": body})
    start = await app.receive_output(10)
    chunks = []
    while True:
        message = await app.receive_output(10)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await app.wait(5)
    return Answer(start, b"".join(chunks))


class Browser:
    """A cookie jar over `call`, sending the CSRF token as the page does (`X-CSRFToken`)."""

    def __init__(self) -> None:
        self.jar: dict[str, str] = {}

    async def request(self, method: str, path: str, *, body=b"", csrf=True, **headers) -> Answer:
        sent = dict(headers)
        if self.jar:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        if csrf and "csrftoken" in self.jar:
            sent["X-CSRFToken"] = self.jar["csrftoken"]
        answer = await call(method, path, headers=sent, body=body)
        self.jar.update(answer.cookies())
        self.jar = {k: v for k, v in self.jar.items() if v}
        return answer

    async def login(self, username: str) -> Answer:
        await self.request("GET", "/accounts/login/")
        form = f"username={username}&password=pw-{username}-long-enough&next=/chat/"
        return await self.request(
            "POST",
            "/accounts/login/",
            body=form.encode(),
            **{"Content-Type": "application/x-www-form-urlencoded"},
        )


@pytest.fixture
def held_turns(monkeypatch):
    """Turns that run until the test lets them go: the stream sends `: ok`, then waits."""
    release = asyncio.Event()

    def launch(prepared, *, listener):
        async def held():
            await release.wait()
            listener(TurnEvent("turn_end", {}))

        return asyncio.create_task(held())

    monkeypatch.setattr(chat.api, "turn_launch", launch)
    yield release
    release.set()


async def _stream_start(token: str, session: ChatSession) -> ApplicationCommunicator:
    app = ApplicationCommunicator(
        application,
        _scope(
            "POST",
            f"/api/sessions/{session.pk}/message/stream",
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        ),
    )
    await app.send_input({"type": "http.request", "body": b'{"text": "hello"}'})
    start = await app.receive_output(10)
    assert start["status"] == 200, start
    assert (await app.receive_output(10))["body"] == b": ok\n\n"
    return app


async def _stream_end(app: ApplicationCommunicator) -> None:
    while (await app.receive_output(10)).get("more_body"):
        pass
    await app.wait(5)


async def _threads_settled() -> int:
    """The process's threads, once lanes given back beyond those kept have ended."""
    counts = []
    for _ in range(20):
        counts.append(threading.active_count())
        if counts[-3:] == [counts[-1]] * 3:
            break
        await asyncio.sleep(0.05)
    return counts[-1]


async def test_streamed_turns_in_flight_hold_no_thread_each(held_turns):
    """Django's handler started a thread per request that lived as long as the request: with
    HELD more streams in flight the process had HELD more threads (~300 KiB of RSS each)."""
    people = [await database_sync_to_async(someone)(f"user{i}") for i in range(2 * HELD)]
    streams = [await _stream_start(token, session) for _, token, session in people[:HELD]]
    with_some = await _threads_settled()
    streams += [await _stream_start(token, session) for _, token, session in people[HELD:]]
    with_twice = await _threads_settled()

    assert with_twice - with_some <= 2, (with_some, with_twice)
    held_turns.set()
    for app in streams:
        await _stream_end(app)


async def test_a_streamed_request_hops_only_to_the_pool(held_turns, monkeypatch):
    """Besides its trips to the database pool, a streamed request makes no thread hop. Django's
    `request_started` and the response's close made one each (for receivers of Django's own
    that need no thread here), each of Django's sync middlewares two (CSRF three), and each
    ORM call of the view one."""
    _, token, session = await database_sync_to_async(someone)("alice")
    costs = Costs(monkeypatch)
    app = await _stream_start(token, session)
    held_turns.set()
    await _stream_end(app)

    pools = costs.trips + costs.request_trips
    assert costs.hops == pools, (costs.hops, pools)


def _cycles_collected() -> list:
    """What a full collection finds now: objects kept only by reference cycles."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)


@pytest.mark.parametrize("goes_away", ["mid-stream", "after the end"])
async def test_a_stream_whose_client_goes_away_leaves_no_cycle_of_the_handlers(
    held_turns, goes_away
):
    """The client going away (the disconnect listener's `RequestAborted`, the usual end of a
    stream under Daphne) was raised again in the handler's frame: the frame held the task and
    the task the error, a cycle that kept the whole request (its Django request and response,
    Daphne's request, the tasks) until a full collection. At 200 users each full collection
    found ~46,000 such objects and paused the process up to 200 ms of CPU; after, ~600."""
    _, token, session = await database_sync_to_async(someone)("alice")
    gc.collect()
    gc.disable()
    try:
        app = await _stream_start(token, session)
        if goes_away == "after the end":
            held_turns.set()
            while (await app.receive_output(10)).get("more_body"):
                pass
        await app.send_input({"type": "http.disconnect"})
        await app.wait(5)
        del app
        held_turns.set()
        await asyncio.sleep(0.05)  # the held turn ends
        kept = _cycles_collected()
    finally:
        gc.enable()
    handlers = [
        o
        for o in kept
        if isinstance(o, RequestAborted | asyncio.Task)
        or (inspect.isframe(o) and o.f_code.co_name in {"handle", "listen_for_disconnect"})
    ]
    assert not handlers, handlers


@pytest.fixture
def requests_made(monkeypatch) -> list[weakref.ref]:
    """A weak reference to each request the handler makes: once the application has returned,
    a request that lives on is kept by a cycle (the collector's to free), not by the handler."""
    made: list[weakref.ref] = []
    create = ASGIHandler.create_request

    def create_request(self, scope, body_file):
        request, error_response = create(self, scope, body_file)
        if request is not None:
            made.append(weakref.ref(request))
        return request, error_response

    monkeypatch.setattr(ASGIHandler, "create_request", create_request)
    return made


async def test_a_streamed_request_by_token_leaves_nothing_for_the_collector(
    held_turns, requests_made
):
    """Once its stream ends, a request goes with its last reference: the message storage and
    django-htmx's details held the request that held them, a cycle that kept each request
    (~50 objects: headers, body, session, user, the URL's match) for the garbage collector."""
    _, token, session = await database_sync_to_async(someone)("alice")
    gc.collect()
    gc.disable()
    try:
        app = await _stream_start(token, session)
        held_turns.set()
        await _stream_end(app)  # the application has returned: nothing of its holds the request
        del app
        assert [request() for request in requests_made] == [None]
    finally:
        gc.enable()


async def test_an_api_request_by_cookie_leaves_nothing_for_the_collector(requests_made):
    """Django's lazy `request.user` and `request.auser` closed over the request they hang on:
    each cookie request (a page's API calls, each of the map's tiles) stayed for the garbage
    collector (47 objects for a session's GET)."""
    _, _, session = await database_sync_to_async(someone)("alice")
    browser = Browser()
    await browser.login("alice")
    await browser.request("GET", f"/api/sessions/{session.pk}")
    requests_made.clear()
    gc.collect()
    gc.disable()
    try:
        answer = await browser.request("GET", f"/api/sessions/{session.pk}")
        assert answer.status == 200
        assert [request() for request in requests_made] == [None]
    finally:
        gc.enable()


async def test_a_streamed_request_reads_its_token_and_its_session_in_one_trip(
    held_turns, monkeypatch
):
    """The bearer token and the session the URL names (which must be the token user's) are
    read in one trip to the requests' pool: they were two, each ~23 µs of the loop, a thread's
    work and the GIL handed over and back."""
    _, token, session = await database_sync_to_async(someone)("alice")
    costs = Costs(monkeypatch)
    app = await _stream_start(token, session)
    held_turns.set()
    await _stream_end(app)

    assert costs.request_trips == 1


async def test_a_streamed_request_reads_its_cookie_user_and_its_session_in_one_trip(
    held_turns, monkeypatch
):
    _, _, session = await database_sync_to_async(someone)("alice")
    browser = Browser()
    assert (await browser.login("alice")).status == 302
    costs = Costs(monkeypatch)
    app = ApplicationCommunicator(
        application,
        _scope(
            "POST",
            f"/api/sessions/{session.pk}/message/stream",
            {
                "Cookie": "; ".join(f"{k}={v}" for k, v in browser.jar.items()),
                "X-CSRFToken": browser.jar["csrftoken"],
                "Content-Type": "application/json",
            },
        ),
    )
    await app.send_input({"type": "http.request", "body": b'{"text": "hi"}'})
    assert (await app.receive_output(10))["status"] == 200
    held_turns.set()
    await _stream_end(app)

    assert costs.request_trips == 1


async def test_a_session_read_with_a_token_or_a_cookie_is_its_owners_alone(monkeypatch):
    """Read in the user's trip, another user's session still answers 404 on each of the
    session's views, and a refused token reads nothing."""
    _, _, theirs = await database_sync_to_async(someone)("bob")
    _, token, _ = await database_sync_to_async(someone)("alice")
    browser = Browser()
    await browser.login("alice")
    json_body = {"Content-Type": "application/json"}
    base = f"/api/sessions/{theirs.pk}"
    for method, path in (
        ("GET", ""),
        ("PATCH", ""),
        ("POST", "/message/stream"),
        ("POST", "/message/resume/stream"),
        ("POST", "/stop"),
        ("POST", "/find-similar"),
        ("GET", "/artifacts/a1"),
    ):
        body = b'{"text": "hi", "title": "mine"}'
        by_token = await call(
            method, base + path, body=body, headers={"Authorization": f"Bearer {token}"}
        )
        by_cookie = await browser.request(method, base + path, body=body, **json_body)
        for answer in (by_token, by_cookie):
            assert (answer.status, answer.json()) == (404, {"error": "session not found"}), path

    costs = Costs(monkeypatch)
    refused = await call("GET", base, headers={"Authorization": "Bearer gs_nope"})
    assert (refused.status, refused.json()) == (401, {"error": "invalid bearer token"})
    assert costs.statements == [costs.statements[0]]  # the token's read alone
    assert await ChatSession.objects.filter(pk=theirs.pk, title="").aexists()


async def test_a_failed_session_read_in_the_tokens_trip_fails_the_view_as_its_own_did(
    monkeypatch,
):
    """The view meets the session read's error where it would have read it (a 500 in JSON),
    not the token's answer to a busy database (503)."""
    from django.db import OperationalError

    from chat import selectors

    _, token, session = await database_sync_to_async(someone)("alice")

    def locked(*args):
        raise OperationalError("database table is locked: chat_chatsession")

    monkeypatch.setattr(selectors._SESSION_OF_USER, "rows", locked)
    answer = await call(
        "GET", f"/api/sessions/{session.pk}", headers={"Authorization": f"Bearer {token}"}
    )
    assert (answer.status, answer.json()) == (500, {"error": "internal server error"})


async def test_a_streams_chunks_go_out_without_a_charset_lookup_each(held_turns, monkeypatch):
    """A text chunk had Django's response look up its charset (its Content-Type header, a
    regex, the settings) before encoding it: once per chunk of every turn."""
    _, token, session = await database_sync_to_async(someone)("alice")
    looked_up = []
    charset = HttpResponseBase.charset

    def counted(response):
        looked_up.append(response)
        return charset.fget(response)

    monkeypatch.setattr(HttpResponseBase, "charset", property(counted, charset.fset))
    app = await _stream_start(token, session)
    held_turns.set()
    assert (await app.receive_output(10))["body"] == b"event: turn_end\ndata: {}\n\n"
    await _stream_end(app)

    assert looked_up == []


async def test_a_streams_chunks_go_out_without_djangos_wrapping_generators(held_turns):
    """Django's streamed response handed each part on through two async generators of its own
    (`__aiter__` and `streaming_content`'s wrapper) and `make_bytes`: three Python calls a
    chunk of every turn, for parts that are bytes already."""
    _, token, session = await database_sync_to_async(someone)("alice")
    app = await _stream_start(token, session)
    calls = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("django/http/response.py"):
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        held_turns.set()
        assert (await app.receive_output(10))["body"] == b"event: turn_end\ndata: {}\n\n"
        assert (await app.receive_output(10)) == {"type": "http.response.body"}
    finally:
        sys.setprofile(None)
    await app.wait(5)

    assert calls == [], calls


async def test_a_receiver_of_the_apps_own_hears_each_request_begin_and_end_in_a_thread():
    """Only Django's own receivers of the request signals skip the thread hop: another one is
    run as Django runs it, off the event loop."""
    heard = []

    def receiver(signal, **kwargs):
        heard.append((signal, threading.current_thread() is threading.main_thread()))

    request_started.connect(receiver)
    request_finished.connect(receiver)
    try:
        answer = await call("GET", "/api/sessions")
    finally:
        request_started.disconnect(receiver)
        request_finished.disconnect(receiver)

    assert answer.status == 401
    assert heard == [(request_started, False), (request_finished, False)]


async def test_djangos_own_receivers_are_told_apart_without_a_python_step_each():
    """Which of a request's begin and end receivers are Django's own was read by a generator
    step a receiver and a list comprehension, twice a request."""
    steps = []

    def count(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.endswith("geosense/handler.py"):
            steps.append(code.co_name)

    sys.setprofile(count)
    try:
        answer = await call("GET", "/api/sessions")
    finally:
        sys.setprofile(None)

    assert answer.status == 401
    assert "_sync_receivers_known" in steps
    assert "<genexpr>" not in steps and "<listcomp>" not in steps


async def test_djangos_own_receivers_are_read_again_only_when_the_signals_receivers_change():
    """Django's `_live_receivers` read a signal's receivers for every request, three Python
    calls a signal, twice a request; they are read again when a receiver is connected,
    disconnected or gone."""
    from django.core.handlers.base import reset_urlconf

    sender = handler_module.ASGIHandler
    signal = request_finished
    djangos = handler_module._sync_receivers_known(signal, sender)
    assert python_calls_of(handler_module._sync_receivers_known, signal, sender) == 1
    assert reset_urlconf in djangos

    def other(**kwargs):
        pass

    signal.connect(other)
    assert handler_module._sync_receivers_known(signal, sender) is None
    signal.disconnect(other)
    assert handler_module._sync_receivers_known(signal, sender) == djangos

    class Listener:
        def heard(self, **kwargs):
            pass

    listener = Listener()
    signal.connect(listener.heard)  # held weakly
    assert handler_module._sync_receivers_known(signal, sender) is None
    del listener
    gc.collect()
    assert handler_module._sync_receivers_known(signal, sender) == djangos


async def test_a_cookie_session_streams_with_its_csrf_token_and_is_refused_without(held_turns):
    _, _, session = await database_sync_to_async(someone)("alice")
    browser = Browser()
    assert (await browser.login("alice")).status == 302
    path = f"/api/sessions/{session.pk}/message/stream"
    json_body = {"Content-Type": "application/json"}

    refused = await browser.request("POST", path, body=b'{"text": "hi"}', csrf=False, **json_body)
    assert refused.status == 403
    assert refused.json()["error"].startswith("CSRF check failed")

    created = await browser.request("POST", "/api/sessions", body=b"{}", **json_body)
    assert created.status == 201

    app = ApplicationCommunicator(
        application,
        _scope(
            "POST",
            path,
            {
                "Cookie": "; ".join(f"{k}={v}" for k, v in browser.jar.items()),
                "X-CSRFToken": browser.jar["csrftoken"],
                **json_body,
            },
        ),
    )
    await app.send_input({"type": "http.request", "body": b'{"text": "hi"}'})
    assert (await app.receive_output(10))["status"] == 200
    held_turns.set()
    await _stream_end(app)


async def test_an_anonymous_write_answers_401_and_a_bad_token_401():
    anonymous = await call(
        "POST", "/api/sessions", body=b"{}", headers={"Content-Type": "application/json"}
    )
    assert (anonymous.status, anonymous.json()) == (401, {"error": "authentication required"})
    bad = await call("GET", "/api/sessions", headers={"Authorization": "Bearer nope"})
    assert (bad.status, bad.json()) == (401, {"error": "invalid bearer token"})
    page = await call("GET", "/chat/", headers={"Authorization": "Bearer nope"})
    assert page.status == 401


async def test_a_token_needs_no_csrf_and_a_logout_ends_the_session():
    _, token, _ = await database_sync_to_async(someone)("alice")
    created = await call(
        "POST",
        "/api/sessions",
        body=b'{"title": "t"}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert created.status == 201

    browser = Browser()
    await browser.login("alice")
    assert (await browser.request("GET", "/chat/")).status in (200, 302)
    assert (await browser.request("POST", "/accounts/logout/")).status == 302
    after = await browser.request("GET", "/chat/")
    assert after.status == 302 and after.header("location").startswith("/accounts/login/")


async def test_pages_keep_their_headers_and_the_login_its_csrf():
    login_page = await call("GET", "/accounts/login/")
    assert login_page.status == 200
    assert login_page.header("x-frame-options") == "DENY"
    assert login_page.header("referrer-policy") == "same-origin"
    assert login_page.header("x-content-type-options") == "nosniff"
    assert "csrftoken" in login_page.cookies()
    assert "cookie" in (login_page.header("vary") or "").lower()

    forged = await call(
        "POST",
        "/accounts/login/",
        body=b"username=a&password=b",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert forged.status == 403


async def test_the_admin_and_its_messages_work():
    """A sync view (the admin's) still runs in a thread of its request, session and messages
    included: a change saved shows its message on the next page."""
    user, _, _ = await database_sync_to_async(someone)("root", staff=True)
    browser = Browser()
    assert (await browser.login("root")).status == 302
    index = await browser.request("GET", "/admin/")
    assert index.status == 200

    change = f"/admin/auth/user/{user.pk}/change/"
    page = await browser.request("GET", change)
    assert page.status == 200
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.body).group(1)
    form = (
        f"csrfmiddlewaretoken={token.decode()}&username=root&first_name=Ro&last_name="
        f"&email=&is_active=on&is_staff=on&is_superuser=on&date_joined_0=2026-01-01"
        f"&date_joined_1=00:00:00&initial-date_joined_0=2026-01-01"
        f"&initial-date_joined_1=00:00:00&_save=Save"
    )
    saved = await browser.request(
        "POST",
        change,
        body=form.encode(),
        **{"Content-Type": "application/x-www-form-urlencoded", "Referer": change},
    )
    assert saved.status == 302, saved.body[:2000]
    listing = await browser.request("GET", saved.header("location"))
    assert b"was changed successfully" in listing.body


def _stream_answer(parts: list[bytes]) -> chat.api._EventStream:
    async def follow():
        for part in parts:
            yield part

    response = chat.api._EventStream(follow(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response.set_cookie("seen", "1")
    return response


async def _messages_sent(send_response, response) -> list[dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await send_response(response, send)
    return sent


def _ours(response: HttpResponseBase) -> HttpResponseBase:
    """The response as the handler's `process_request` hands it to `send_response`."""
    response_headers_from_store(response)
    return response


@pytest.mark.parametrize("part", [b"event: x\ndata: {}\n\n", b"", b"x" * (2**16 + 5)])
async def test_an_answer_goes_out_as_djangos_handler_sends_it(part):
    handler = ASGIHandler.__new__(ASGIHandler)
    ours = await _messages_sent(handler.send_response, _ours(_stream_answer([part, part])))
    djangos = await _messages_sent(
        functools.partial(asgi.ASGIHandler.send_response, handler), _stream_answer([part, part])
    )

    assert ours == djangos
    assert ours[0]["headers"][:3] == [
        (b"Content-Type", b"text/event-stream"),
        (b"Cache-Control", b"no-cache"),
        (b"X-Accel-Buffering", b"no"),
    ]


async def test_an_answers_headers_and_chunks_go_out_without_djangos_per_header_and_part_calls():
    """Django read an answer's headers through `Mapping`'s view of `ResponseHeaders` (a
    generator step, the view's iterator and a `__getitem__` a header) and handed each part of a
    stream through `chunk_bytes`'s generator (two Python calls a part; then `chunk_bytes` alone,
    one), its iterator closed through `aclosing` (three)."""
    handler = ASGIHandler.__new__(ASGIHandler)
    calls: list[str] = []
    where = ("django/utils/", "django/core/handlers/", "/contextlib.py", "geosense/handler.py")

    def count(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and any(part in name for part in where):
            calls.append(frame.f_code.co_name)

    response = _ours(_stream_answer([b"a", b"b", b"c"]))
    sys.setprofile(count)
    try:
        sent = await _messages_sent(handler.send_response, response)
    finally:
        sys.setprofile(None)

    assert [message.get("body") for message in sent] == [None, b"a", b"b", b"c", None]
    assert calls == ["send_response"]


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
async def test_a_streams_iterator_is_closed_however_its_sending_ends(ending):
    """As Django's `aclosing`: the stream's `aclose` is awaited when a send is cancelled (the
    client gone) or fails, and the stream's own `finally` runs."""
    closed = []

    async def follow():
        try:
            yield b"a"
            yield b"b"
        finally:
            closed.append(True)

    response = chat.api._EventStream(follow(), content_type="text/event-stream")
    response_headers_from_store(response)

    async def send(message):
        if message.get("body") == b"a":
            raise asyncio.CancelledError() if ending == "cancelled" else OSError("gone")

    with pytest.raises(asyncio.CancelledError if ending == "cancelled" else OSError):
        await ASGIHandler.__new__(ASGIHandler).send_response(response, send)
    assert closed == [True]


async def test_djangos_send_response_is_the_one_the_handlers_stands_in_for():
    """`ASGIHandler.send_response` is Django 5.2's for a streamed answer, its parts sent without
    `chunk_bytes` and `aclosing`: a change of Django's means reading the handler's against it."""
    source = inspect.getsource(asgi.ASGIHandler.send_response)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == "77eda2b08689b44e"


async def test_every_answer_hands_django_its_headers_from_their_store(held_turns, monkeypatch):
    _, token, session = await database_sync_to_async(someone)("alice")
    items = HttpResponseBase.items
    read: list[HttpResponseBase] = []
    monkeypatch.setattr(
        HttpResponseBase, "items", lambda response: read.append(response) or items(response)
    )

    listing = await call("GET", "/api/sessions", headers={"Authorization": f"Bearer {token}"})
    app = await _stream_start(token, session)
    held_turns.set()
    await _stream_end(app)

    assert listing.status == 200 and listing.header("content-type") == "application/json"
    assert read == []


async def test_the_handler_waits_for_its_view_or_the_clients_leaving_with_little_of_asyncios_work():
    """The handler runs the view beside a listener for the client's leaving and waits for the
    first of the two to end: `asyncio.wait` checked its arguments (an ABC's `isinstance` a
    task), built sets and a callback of its own: 9 Python calls a request more on the loop."""
    await call("GET", "/no-such-page/")  # warm
    # asyncio's work done by the handler itself (its tasks do the view's); the wake-up of the
    # handler's task, from a callback of the loop's, is not counted
    waiting = []
    own = {"handle", "_first_done"}

    def count(frame, event, arg):
        code = frame.f_code
        ours = code.co_filename == handler_module.__file__
        if event != "call" or not (
            (ours and code.co_name in own) or "/asyncio/" in code.co_filename
        ):
            return
        caller = frame.f_back
        while caller is not None and "/asyncio/" in caller.f_code.co_filename:
            caller = caller.f_back
        if caller is not None and caller.f_code.co_filename == handler_module.__file__:
            if caller.f_code.co_name in own and code.co_name != "handle":
                waiting.append(code.co_name)

    sys.setprofile(count)
    try:
        answer = await call("GET", "/no-such-page/")
    finally:
        sys.setprofile(None)

    assert answer.status == 404
    # the two tasks made (10 each), the listener's cancellation (5), and the wait: 38 before;
    # the tasks made by `asyncio.create_task` (and `_set_task_name`, each) until the loop made
    # them itself: 6, 2 now (`_first_done` called and resumed)
    assert len(waiting) <= 2, waiting


async def test_a_turns_stream_is_resolved_without_trying_other_urls_first():
    """Django tries the URL patterns in order, and each include that does not match raises and
    catches a `Resolver404`: a turn's stream (most of a process's requests) was tried against
    the admin's, the accounts', the annotations' and the tiles' includes first, 66 Python calls;
    the API's includes come first now, the turns' first of them."""
    resolver = get_resolver()
    for tail, name in (
        ("message/stream", "api-message-stream"),
        ("message/resume/stream", "api-resume-stream"),
    ):
        path = f"/api/sessions/{uuid.uuid4()}/{tail}"
        assert resolver.resolve(path).url_name == name
        assert python_calls_of(resolver.resolve, path) <= 35


def _request_to(path: str) -> HttpRequest:
    request = HttpRequest()
    request.path = request.path_info = path
    return request


_MATCH_FIELDS = (
    "func", "args", "kwargs", "url_name", "app_names", "namespaces", "route", "tried",
    "captured_kwargs", "extra_kwargs", "app_name", "namespace", "view_name", "_func_path",
)  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        f"/api/sessions/{uuid.UUID(int=1)}/message/stream",
        "/api/sessions",
        f"/api/sessions/{uuid.UUID(int=1)}/artifacts/a1",
        "/chat/",
        "/admin/auth/user/",
        "/accounts/login/",
    ],
)
async def test_a_requests_view_is_the_match_djangos_resolve_makes_each_time(path):
    """A path's match is made once and handed out again, to each request a copy of its own:
    the same as Django's resolve makes for the path, however often asked, and a view's
    arguments changed in place for one request are not the next one's."""
    djangos = get_resolver().resolve(path)
    for _ in range(3):
        request = _request_to(path)
        match = handler_module.request_resolved(request)
        assert type(match) is type(djangos)
        assert {f: getattr(match, f) for f in _MATCH_FIELDS} == {
            f: getattr(djangos, f) for f in _MATCH_FIELDS
        }
        assert request._resolved == (path, None, match)
        match.kwargs["changed"] = True
        match.app_names.append("changed")


async def test_a_path_no_url_matches_is_not_kept():
    handler_module._matches.clear()
    assert handler_module.request_resolved(_request_to("/nowhere/at/all")) is None
    assert handler_module._matches == {}


async def test_the_matches_kept_are_bounded_and_a_new_urlconf_gets_its_own(monkeypatch, settings):
    monkeypatch.setattr(handler_module, "MATCHES_KEPT", 3)
    handler_module._matches.clear()
    paths = [f"/api/sessions/{uuid.UUID(int=n)}/stop" for n in range(4)]
    for path in paths:
        handler_module.request_resolved(_request_to(path))
    assert len(handler_module._matches) == 1  # let go at 3, then the fourth made

    settings.ROOT_URLCONF = "geosense.accounts.urls"  # Django clears its URL caches
    assert handler_module.request_resolved(_request_to(paths[-1])) is None


async def test_the_urlconf_has_no_locale_prefixed_patterns():
    """A match is kept by resolver and path: a locale-prefixed pattern's would depend on the
    language too."""
    from django.urls import URLResolver
    from django.urls.resolvers import LocalePrefixPattern

    def patterns(resolver):
        for pattern in resolver.url_patterns:
            if isinstance(pattern, URLResolver):
                assert not isinstance(pattern.pattern, LocalePrefixPattern)
                yield pattern
                yield from patterns(pattern)

    assert list(patterns(get_resolver())) != []


async def test_a_turns_stream_is_resolved_again_in_few_python_calls():
    """Django's resolve of a turn's stream walked the URLconf's patterns for each request (the
    includes tried, a match and a `ResolverMatch` at each level): 33 Python calls with the
    resolver's lookup; a path's match is made once and copied for the next requests."""
    path = f"/api/sessions/{uuid.uuid4()}/message/stream"
    handler_module.request_resolved(_request_to(path))

    assert python_calls_of(handler_module.request_resolved, _request_to(path)) <= 4


@pytest.mark.parametrize(
    "root_path, prefix, storages", [("", "/", 0), ("/app", "/app/", 1)], ids=["root", "under"]
)
async def test_a_turn_carries_no_url_state_of_its_request_into_its_trips(
    monkeypatch, root_path, prefix, storages
):
    """Django set the request's URL prefix and URLconf, two asgiref `Local`s, for every request:
    each a storage of the request's context, which the turn its view starts inherits, and which
    every trip of the request or the turn copied to the database thread and back, re-homing it
    each way (`_restore_context`: ~55 Python calls a turn). Neither is set where it would be
    set to what an unset one reads as; a request under a `root_path` still has its prefix."""
    seen: list = []

    def launch(prepared, *, listener):
        async def turn():
            context = contextvars.copy_context().values()
            seen.append(sum(isinstance(value, _Storage) for value in context))
            seen.append((get_script_prefix(), get_urlconf(), reverse("chat")))
            listener(TurnEvent("turn_end", {}))

        return asyncio.create_task(turn())

    monkeypatch.setattr(chat.api, "turn_launch", launch)
    _, token, session = await database_sync_to_async(someone)("alice")
    scope = _scope(
        "POST",
        f"/api/sessions/{session.pk}/message/stream",
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    app = ApplicationCommunicator(application, {**scope, "root_path": root_path})
    await app.send_input({"type": "http.request", "body": b'{"text": "hello"}'})
    assert (await app.receive_output(10))["status"] == 200
    await _stream_end(app)

    assert seen == [storages, (prefix, None, f"{prefix}chat/")]


async def test_a_request_whose_context_holds_another_urlconf_gets_djangos(monkeypatch):
    """Where the request's context holds a URLconf (set before the request, not by Django's
    handler), the request still gets `ROOT_URLCONF`, as Django sets it."""
    set_urlconf("geosense.elsewhere")
    try:
        seen = []

        async def chain(request):
            seen.append(get_urlconf())
            return HttpResponse()

        handler = ASGIHandler()
        monkeypatch.setattr(handler, "_middleware_chain", chain)
        request = HttpRequest()
        request.path = "/"
        await handler.get_response_async(request)
    finally:
        set_urlconf(None)

    assert seen == ["geosense.urls"]


def _in_a_context_of_its_own(action):
    """`action()`'s result, run in a copy of an empty context (a request's task's, made by
    Daphne from a loop whose context holds no `Local`)."""
    return contextvars.Context().run(action)


async def test_an_unset_local_is_told_apart_in_one_python_call():
    """A read of what an asgiref `Local` does not hold: `Local.__getattr__`, `_CVar.__getattr__`,
    `_storage` and an empty `_Storage` made, and an `AttributeError` raised and caught."""
    from asgiref.local import Local

    local = Local()

    def states():
        unset = handler_module._holds_nothing(local)
        local.value = 1
        held = handler_module._holds_nothing(local)
        elsewhere = []
        worker = threading.Thread(
            target=lambda: elsewhere.append(handler_module._holds_nothing(local)),
            # a thread started with this context (asgiref reads another thread's as empty)
        )
        contextvars.copy_context().run(worker.start)
        worker.join()
        del local.value
        return unset, held, elsewhere, handler_module._holds_nothing(local)

    assert _in_a_context_of_its_own(states) == (True, False, [True], True)
    assert (
        _in_a_context_of_its_own(lambda: python_calls_of(handler_module._holds_nothing, local)) == 1
    )
    assert handler_module._holds_nothing(Local(thread_critical=True)) is False


async def test_djangos_receivers_with_nothing_to_do_at_a_requests_end_are_not_called():
    """`close_caches` (its cache handler's `close_all`, `all`, `__iter__`, a list comprehension
    and a `Local` read a cache: 9 Python calls) and `reset_urlconf` (`set_urlconf` and a `Local`
    read: 6), where the request's context holds no cache and no URLconf; each still runs where
    it does."""
    from django.core.cache import caches

    sender = handler_module.ASGIHandler

    def send():
        try:
            handler_module._signal_send(request_finished, sender).send(None)
        except StopIteration:
            return
        raise AssertionError("the receivers waited")

    send()  # the signal's receivers read
    # `send`, `_signal_send`, `_sync_receivers_known` and `_holds_nothing` twice (18 before)
    assert _in_a_context_of_its_own(lambda: python_calls_of(send)) <= 5

    closed = []

    def with_a_cache_and_an_urlconf():
        cache = caches["default"]
        cache.close = lambda **kwargs: closed.append(cache)
        set_urlconf("geosense.elsewhere")
        send()
        return get_urlconf()

    assert _in_a_context_of_its_own(with_a_cache_and_an_urlconf) is None
    assert len(closed) == 1


# What `_holds_nothing` reads as asgiref reads it (a `Local`'s storage, of this thread or not),
# and what the receivers it lets go uncalled do, as asgiref 3 and Django 5.2 have them.
LOCAL_SOURCES = {
    "_CVar._storage": "37bfde39a7ef0ef3",
    "_CVar.__getattr__": "3f17578ef129fb79",
    "_DefaultLocal.__getattr__": "e68327aa9746ab2d",
    "close_caches": "abe7badf0640b146",
    "BaseConnectionHandler.all": "025dd23cb80fcc62",
    "reset_urlconf": "7ad5ce3f320f5c51",
    "set_urlconf": "a800ca3136841f64",
    "get_script_prefix": "30a3ba3e12d19455",  # an unset prefix reads "/"
    "get_urlconf": "ed086b65a99620d7",  # an unset URLconf reads None
}


async def test_what_an_empty_local_lets_go_is_what_it_was_written_for():
    from asgiref.local import _CVar, _DefaultLocal
    from django.core.cache import close_caches
    from django.core.handlers.base import reset_urlconf
    from django.utils.connection import BaseConnectionHandler

    from tests.source_pins import source_digests

    originals = {
        "_CVar._storage": _CVar._storage,
        "_CVar.__getattr__": _CVar.__getattr__,
        "_DefaultLocal.__getattr__": _DefaultLocal.__getattr__,
        "close_caches": close_caches,
        "BaseConnectionHandler.all": BaseConnectionHandler.all,
        "reset_urlconf": reset_urlconf,
        "set_urlconf": set_urlconf,
        "get_script_prefix": get_script_prefix,
        "get_urlconf": get_urlconf,
    }
    assert source_digests(originals) == LOCAL_SOURCES


async def test_an_unset_prefix_and_urlconf_are_left_unset_in_few_python_calls():
    """Each was read (`get_script_prefix`, `get_urlconf`: a `Local` read of a name it does not
    hold, five Python calls) at every request's start: 13 Python calls, 5 now."""

    def start():
        handler_module._script_prefix_set("")
        handler_module._default_urlconf_set()

    def started():
        start()
        return get_script_prefix(), get_urlconf()

    assert _in_a_context_of_its_own(started) == ("/", None)
    assert _in_a_context_of_its_own(lambda: python_calls_of(start)) <= 5


async def test_djangos_get_response_async_is_the_one_the_handlers_stands_in_for():
    """`ASGIHandler.get_response_async` is Django 5.2's with its URLconf set only where needed:
    a change of Django's means reading the handler's against it."""
    source = inspect.getsource(BaseHandler.get_response_async)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == "ad82c920df0cebbb"


@pytest.fixture
def spooled(monkeypatch) -> list:
    """The spooled files Django's `read_body` makes, as they are made."""
    made: list = []
    spooled_file = tempfile.SpooledTemporaryFile

    def making(*args, **kwargs):
        made.append(spooled_file(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(asgi.tempfile, "SpooledTemporaryFile", making)
    return made


async def _session_made(token: str, parts: list[bytes]) -> dict:
    """`POST /api/sessions` by token, its body sent in `parts` (one message each)."""
    scope = _scope(
        "POST",
        "/api/sessions",
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    app = ApplicationCommunicator(application, scope)
    for index, part in enumerate(parts):
        more = index < len(parts) - 1
        await app.send_input({"type": "http.request", "body": part, "more_body": more})
    start = await app.receive_output(10)
    body = (await app.receive_output(10))["body"]
    await app.wait(5)
    assert start["status"] == 201, body
    return json.loads(body)


async def test_a_body_that_comes_whole_is_read_without_a_spooled_file(spooled):
    """Django spooled every request's body into a `tempfile.SpooledTemporaryFile`, in memory up
    to `FILE_UPLOAD_MAX_MEMORY_SIZE`: ~12 Python calls of `tempfile` a request. A body that
    comes whole in the first message and fits is a `BytesIO`, what that file holds it in."""
    _, token, _session = await database_sync_to_async(someone)("alice")

    made = await _session_made(token, [b'{"title": "whole"}'])

    assert made["title"] == "whole"
    assert spooled == []


async def test_a_body_in_parts_or_past_the_memory_limit_is_spooled_as_django_spools_it(
    spooled, settings
):
    _, token, _session = await database_sync_to_async(someone)("alice")

    in_parts = await _session_made(token, [b'{"title": ', b'"in parts"}'])
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 8
    large = await _session_made(token, [b'{"title": "past the limit"}'])

    assert (in_parts["title"], large["title"]) == ("in parts", "past the limit")
    assert [file._rolled for file in spooled] == [False, True]


@pytest.mark.parametrize("parts", [1, 2])
async def test_a_body_past_the_data_limit_is_refused_whole_or_in_parts(settings, parts):
    """The body's limit holds on the `BytesIO` a whole body is read into as on Django's spooled
    file (review 30-a L5): past `DATA_UPLOAD_MAX_MEMORY_SIZE` (no Content-Length said), a body
    is refused whether it comes whole or in parts."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 20
    _, token, _session = await database_sync_to_async(someone)("alice")
    body = json.dumps({"title": "x" * 40}).encode()
    scope = _scope(
        "POST",
        "/api/sessions",
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    app = ApplicationCommunicator(application, scope)
    chunks = [body] if parts == 1 else [body[:10], body[10:]]
    for index, chunk in enumerate(chunks):
        more = index < len(chunks) - 1
        await app.send_input({"type": "http.request", "body": chunk, "more_body": more})
    start = await app.receive_output(10)
    await app.receive_output(10)
    await app.wait(5)

    assert start["status"] == 413


async def test_a_client_gone_before_its_body_gets_no_answer(spooled):
    app = ApplicationCommunicator(application, _scope("POST", "/api/sessions", {}))
    await app.send_input({"type": "http.disconnect"})
    await app.wait(5)

    assert await app.receive_nothing()
    assert [file.closed for file in spooled] == [True]


async def test_a_streams_messages_go_out_without_the_security_headers_send_wrapper(held_turns):
    """The security headers' ASGI middleware (geosense/headers.py) wrapped `send`: a Python
    call more for each message of every answer, a stream's every chunk. The handler sets them
    in the answer's headers, once each."""
    from geosense.asgi import django_asgi_app
    from geosense.headers import SecurityHeadersMiddleware

    _, token, session = await database_sync_to_async(someone)("alice")
    app = ApplicationCommunicator(
        SecurityHeadersMiddleware(django_asgi_app),  # as served with DEBUG off (geosense/asgi.py)
        _scope(
            "POST",
            f"/api/sessions/{session.pk}/message/stream",
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        ),
    )
    calls = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("geosense/headers.py"):
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        await app.send_input({"type": "http.request", "body": b'{"text": "hello"}'})
        start = await app.receive_output(10)
        assert (await app.receive_output(10))["body"] == b": ok\n\n"
        held_turns.set()
        await _stream_end(app)
    finally:
        sys.setprofile(None)

    names = [name.lower() for name, _ in start["headers"]]
    assert names.count(b"content-security-policy") == names.count(b"x-content-type-options") == 1
    assert set(calls) == {"__call__"}  # called, and resumed once the answer ends


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/api/sessions", b""),
        ("GET", "/nowhere", b""),
        ("GET", "/accounts/login/", b""),
        ("POST", "/api/sessions", b"x" * 3_000_000),  # past the body limit: Django's 400
    ],
)
async def test_the_security_headers_are_those_the_middlewares_send_wrapper_adds(method, path, body):
    """The headers the handler sets from the scope are those the middleware's wrapped `send`
    adds to the same answer (an application that does not take them)."""
    from geosense.asgi import django_asgi_app
    from geosense.headers import SecurityHeadersMiddleware

    async def not_taking(scope, receive, send):
        return await django_asgi_app(scope, receive, send)

    answers = []
    for app in (SecurityHeadersMiddleware(django_asgi_app), SecurityHeadersMiddleware(not_taking)):
        communicator = ApplicationCommunicator(app, _scope(method, path, {}))
        await communicator.send_input({"type": "http.request", "body": body})
        start = await communicator.receive_output(10)
        while (await communicator.receive_output(10)).get("more_body"):
            pass
        headers = [(n, b"" if n == b"Set-Cookie" else v) for n, v in start["headers"]]
        answers.append((start["status"], sorted(headers)))  # a new CSRF token each time

    assert answers[0] == answers[1]
    assert b"content-security-policy" in dict(answers[0][1])


def _request_finished_sent() -> None:
    """`_signal_send(request_finished)` as the handler sends it at a request's end (Django's own
    receivers only: no thread hop, so the coroutine ends at its first step)."""
    with pytest.raises(StopIteration):
        handler_module._signal_send(request_finished, handler_module.ASGIHandler).send(None)


@pytest.mark.parametrize("override_ended", [False, True])
def test_a_cache_made_in_a_request_is_closed_at_its_end_after_caches_are_overridden(
    override_ended,
):
    """`override_settings(CACHES=...)` gives `caches` a new `Local` (Django's `setting_changed`
    receiver), during the override and after it: the request's end still finds the cache the
    request made there and closes it (the `Local` was read once at import: review 32-b L1)."""
    from django.core.cache import caches
    from django.test import override_settings

    locmem = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    closed = []

    def in_request():
        cache = caches["default"]
        cache.close = lambda **kwargs: closed.append(cache)
        _request_finished_sent()

    with override_settings(CACHES=locmem):
        if not override_ended:
            contextvars.Context().run(in_request)
    if override_ended:
        contextvars.Context().run(in_request)
    assert len(closed) == 1
