"""The session socket `/ws/chat/`: authentication, binding, registration, frames, live events,
and client-tool calls made by the engine's side (`client_tool_request`) through the socket."""

import asyncio
import json
import sys
import time
import weakref
from dataclasses import dataclass

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from chat import consumers
from chat import events as events_module
from chat.events import session_group
from chat.models import ChatSession, ClientToolRegistration
from chat.selectors import client_toolset_of_session
from geosense import wire
from geosense.accounts.services import api_token_create
from geosense.asgi import application
from tests.client_tools import FOCUS, LOCATION
from tests.security.attacks import heavy_declaration
from tools import client as client_module
from tools.client import WENT_AWAY, client_tool_request


@dataclass
class Person:
    user: object
    token: str
    session: ChatSession


@pytest.fixture(autouse=True)
def fresh_layer(monkeypatch):
    """An empty in-memory layer per test, and full inbound budgets (user ids repeat from test
    to test)."""
    async_to_sync(get_channel_layer().flush)()
    monkeypatch.setattr("chat.consumers._inbound", weakref.WeakValueDictionary())


def person(name: str) -> Person:
    user = get_user_model().objects.create_user(name, password="pw")
    return Person(user, api_token_create(user=user), ChatSession.objects.create(user=user))


@pytest.fixture
def alice(transactional_db) -> Person:
    return person("alice")


@pytest.fixture
def bob(transactional_db) -> Person:
    return person("bob")


def socket(token: str | None = None, headers=()) -> WebsocketCommunicator:
    auth = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return WebsocketCommunicator(application, "/ws/chat/", headers=[*auth, *headers])


async def connected(who: Person) -> WebsocketCommunicator:
    ws = socket(who.token)
    ok, _ = await ws.connect()
    assert ok
    return ws


async def bound(who: Person, session: ChatSession | None = None) -> WebsocketCommunicator:
    ws = await connected(who)
    await ws.send_json_to({"type": "session-bind", "session": str((session or who.session).pk)})
    assert await ws.receive_json_from() == {
        "type": "session-bound",
        "session": str((session or who.session).pk),
    }
    return ws


async def registered(who: Person, tools: list[dict]) -> WebsocketCommunicator:
    ws = await bound(who)
    await ws.send_json_to({"type": "client-tool-register", "tools": tools})
    answer = await ws.receive_json_from()
    assert answer == {"type": "client-tool-registered", "tools": [t["name"] for t in tools]}
    return ws


toolset_of = database_sync_to_async(client_toolset_of_session)


async def request(session: ChatSession, name: str, arguments: dict, wait: float = 5.0):
    """What the engine does for a served blocking call: find the socket, invoke, await."""
    toolset = await toolset_of(session_id=session.pk)
    return await client_tool_request(
        channel_name=toolset.channel_name,
        tool=toolset.tools[name],
        arguments=arguments,
        timeout=wait,
    )


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_anonymous_socket_is_accepted_then_closed_with_4401():
    ws = socket(headers=[(b"origin", b"http://localhost:8000")])
    ok, _ = await ws.connect()
    assert ok
    assert await ws.receive_output() == {"type": "websocket.close", "code": 4401}
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_unknown_bearer_token_is_closed_with_4401():
    ws = socket("gs_not-a-token")
    ok, _ = await ws.connect()
    assert ok
    assert await ws.receive_output() == {"type": "websocket.close", "code": 4401}
    await ws.disconnect()


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def cookie_socket(who: Person, origin: bytes | None, host: bytes = b"localhost:8000"):
    cookie = await database_sync_to_async(cookie_for)(who.user)
    headers = [(b"cookie", cookie), (b"host", host)] + ([(b"origin", origin)] if origin else [])
    return socket(headers=headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_cookie_socket_from_an_allowed_origin_is_accepted(alice):
    ws = await cookie_socket(alice, b"http://localhost:8000")
    ok, _ = await ws.connect()
    assert ok
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "origin",
    [
        b"http://evil.example",
        None,
        b"null",
        # the same host on another port or scheme is another origin (issue 12, item 5)
        b"http://localhost:1234",
        b"https://localhost:8000",
        b"http://localhost",
        b"http://127.0.0.1:8000",
        b"http://localhost:8000.evil.example",
    ],
)
async def test_cookie_socket_from_another_or_no_origin_is_refused(alice, origin):
    ws = await cookie_socket(alice, origin)
    ok, _ = await ws.connect()
    assert not ok
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_host_not_allowed_is_refused_even_from_its_own_origin(alice):
    ws = await cookie_socket(alice, b"http://evil.example", host=b"evil.example")
    assert not (await ws.connect())[0]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_trusted_origin_and_a_tls_proxy_are_accepted(alice, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.geosense.example"]
    ws = await cookie_socket(alice, b"https://maps.geosense.example")
    assert (await ws.connect())[0]
    await ws.disconnect()
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    cookie = await database_sync_to_async(cookie_for)(alice.user)
    ws = socket(
        headers=[
            (b"cookie", cookie),
            (b"host", b"localhost"),
            (b"x-forwarded-proto", b"https"),
            (b"origin", b"https://localhost"),
        ]
    )
    assert (await ws.connect())[0]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_bearer_socket_needs_no_origin_and_ignores_a_foreign_one(alice):
    ws = socket(alice.token, headers=[(b"origin", b"http://evil.example")])
    ok, _ = await ws.connect()
    assert ok
    await ws.disconnect()


# --- binding and live events ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_bind_answers_session_bound_with_the_session_id(alice):
    ws = await bound(alice)
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("session", ["bob", "00000000-0000-0000-0000-000000000000", "nonsense"])
async def test_bind_to_another_users_or_an_unknown_session_answers_404(alice, bob, session):
    ws = await connected(alice)
    session_id = str(bob.session.pk) if session == "bob" else session
    await ws.send_json_to({"type": "session-bind", "session": session_id})
    assert await ws.receive_json_from() == {
        "type": "error",
        "status": 404,
        "error": "session not found",
    }
    await ws.send_json_to({"type": "client-tool-register", "tools": [LOCATION]})
    assert (await ws.receive_json_from())["status"] == 403
    await ws.disconnect()


async def emit(session: ChatSession, event: wire.TurnEvent) -> None:
    await get_channel_layer().group_send(session_group(session.pk), wire.turn_event_message(event))


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_turn_events_of_the_bound_session_reach_every_bound_socket(alice):
    first, second = await bound(alice), await bound(alice)
    await emit(alice.session, wire.text_delta("Hello"))
    for ws in (first, second):
        assert await ws.receive_json_from() == {
            "type": "event",
            "event": "text_delta",
            "data": {"delta": "Hello"},
        }
    await first.disconnect()
    await second.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_unbound_socket_hears_no_turn_events(alice):
    ws = await connected(alice)
    await emit(alice.session, wire.text_delta("Hello"))
    assert await ws.receive_nothing()
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_rebind_switches_the_session_whose_events_arrive(alice):
    other = await database_sync_to_async(ChatSession.objects.create)(user=alice.user)
    ws = await bound(alice)
    await ws.send_json_to({"type": "session-bind", "session": str(other.pk)})
    assert await ws.receive_json_from() == {"type": "session-bound", "session": str(other.pk)}
    await emit(alice.session, wire.text_delta("old"))
    await emit(other, wire.text_delta("new"))
    assert (await ws.receive_json_from())["data"] == {"delta": "new"}
    assert await ws.receive_nothing()
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_refused_rebind_keeps_the_current_binding(alice, bob):
    ws = await bound(alice)
    await ws.send_json_to({"type": "session-bind", "session": str(bob.session.pk)})
    assert (await ws.receive_json_from())["status"] == 404
    await emit(alice.session, wire.error("still here"))
    assert (await ws.receive_json_from())["data"] == {"message": "still here"}
    await ws.disconnect()


# --- invalid frames ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("frame", "status", "error"),
    [
        ("{not json", 400, "the frame is not valid JSON"),
        ("[1, 2]", 400, "a frame must be a JSON object with a string type"),
        ('{"session": "x"}', 400, "a frame must be a JSON object with a string type"),
        ('{"type": 7}', 400, "a frame must be a JSON object with a string type"),
        ('{"type": "turn-start"}', 400, "unknown frame type 'turn-start'"),
        ('{"type": "client-tool-register"}', 403, "requires a bound session"),
        (
            '{"type": "client-tool-result", "result": {}}',
            400,
            "client-tool-result needs a correlationId and exactly one of result or error",
        ),
        (
            '{"type": "client-tool-result", "correlationId": "c", "result": {}, "error": "x"}',
            400,
            "client-tool-result needs a correlationId and exactly one of result or error",
        ),
        (
            '{"type": "client-tool-result", "correlationId": "c", "result": [1]}',
            400,
            "result must be a JSON object",
        ),
        (
            '{"type": "client-tool-result", "correlationId": "c", "error": 5}',
            400,
            "error must be a string",
        ),
        ('{"type": "x", "pad": "' + "a" * 100_000 + '"}', 413, "a frame may not exceed 80 KiB"),
        ("[" * 20_000 + "]" * 20_000, 400, "the frame nests too deeply"),
        # Half an emoji stored in a declaration failed every turn of the session (the model's
        # request could not be encoded), in a result the turn (the result's insert).
        (
            '{"type": "client-tool-register", "tools": [{"name": "t", "description": "\\ud83d"}]}',
            400,
            "the frame holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)",
        ),
        (
            '{"type": "client-tool-result", "correlationId": "c", "result": {"a": "\\udc00"}}',
            400,
            "the frame holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)",
        ),
    ],
)
async def test_an_invalid_frame_answers_an_error_and_the_socket_stays_usable(
    alice, frame, status, error
):
    ws = await connected(alice)
    await ws.send_to(text_data=frame)
    assert await ws.receive_json_from() == {"type": "error", "status": status, "error": error}
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_answer_holding_half_an_emoji_is_refused_and_its_call_answered(alice):
    """Refused before its handler, the answer left its call waiting out the time-out."""
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}, wait=30))
    invoke = await ws.receive_json_from()
    correlation_id = invoke["correlationId"]
    frame = {"type": "client-tool-result", "correlationId": correlation_id, "result": {"a": 1}}
    await ws.send_to(text_data=json.dumps(frame).replace("1}", '"\\udc00"}'))
    refused = await ws.receive_json_from()
    assert refused["status"] == 400 and refused["correlationId"] == correlation_id
    answer = await asyncio.wait_for(call, 5)
    assert not answer.ok and "unpaired UTF-16 surrogate" in answer.error
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_binary_frame_answers_an_error(alice):
    ws = await connected(alice)
    await ws.send_to(bytes_data=b"\x00\x01")
    assert await ws.receive_json_from() == {
        "type": "error",
        "status": 400,
        "error": "frames must be JSON text",
    }
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_session_bind_without_a_session_answers_404(alice):
    ws = await connected(alice)
    await ws.send_json_to({"type": "session-bind"})
    assert (await ws.receive_json_from())["status"] == 404
    await ws.disconnect()


# --- registration -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_register_on_an_unbound_socket_answers_exactly_403(alice):
    ws = await connected(alice)
    await ws.send_json_to({"type": "client-tool-register", "tools": [LOCATION]})
    assert await ws.receive_json_from() == {
        "type": "error",
        "status": 403,
        "error": "requires a bound session",
    }
    assert await ws.receive_nothing()
    await ws.disconnect()


def variant(base: dict, **changes) -> dict:
    tool = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is None:
            tool.pop(key, None)
        else:
            tool[key] = value
    return tool


def _nested(levels: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


REFUSALS = [
    (variant(LOCATION, kind="sometimes"), "location_get", "kind must be 'blocking' or 'one-way'"),
    (variant(LOCATION, name="where am i"), "where am i", "the name must be 1 to 64"),
    (variant(LOCATION, name="x" * 65), "x" * 64, "the name must be 1 to 64"),
    (variant(LOCATION, name="measure"), "measure", "belongs to a backend tool"),
    (
        variant(LOCATION, arguments={"type": "object", "properties": {"a": {"type": "nope"}}}),
        "location_get",
        "arguments is not a valid JSON Schema",
    ),
    (
        variant(LOCATION, arguments=[1]),
        "location_get",
        "arguments must be a JSON Schema object",
    ),
    (
        variant(
            LOCATION,
            result={
                "type": "object",
                "properties": {
                    "a": {"type": "array", "items": {"type": "string", "pattern": "^x"}}
                },
            },
        ),
        "location_get",
        "result uses 'pattern' at /properties/a/items/pattern",
    ),
    (
        variant(FOCUS, arguments={"type": "object", "patternProperties": {"^i": {}}}),
        "map_focus",
        "arguments uses 'patternProperties'",
    ),
    (variant(LOCATION, result=None), "location_get", "a blocking tool needs a result schema"),
    (
        variant(FOCUS, serve=True),
        "map_focus",
        "a one-way tool is not answered, so it cannot be served",
    ),
    (variant(FOCUS, result={"type": "object"}), "map_focus", "a one-way tool has no result"),
    (variant(LOCATION, serve="yes"), "location_get", "serve must be true or false"),
    (variant(LOCATION, description=None), "location_get", "a description is required"),
    (variant(LOCATION, description="x" * 1025), "location_get", "longer than 1024"),
    (variant(LOCATION, arguments={"type": "string"}), "location_get", '"type": "object"'),
    (variant(LOCATION, colour="blue"), "location_get", "unknown field 'colour'"),
    (variant(LOCATION, title=["Location"]), "location_get", "title must be one line"),
    (variant(FOCUS, summary="{nope}"), "map_focus", "'nope' is not one of the tool's arguments"),
    ("location_get", "tools[0]", "a tool declaration must be a JSON object"),
    (variant(LOCATION, result=_nested(200)), "location_get", "nests deeper than 32 levels"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(("tool", "name", "reason"), REFUSALS)
async def test_a_refused_tool_answers_400_naming_it_and_the_valid_ones_register(
    alice, tool, name, reason
):
    ws = await bound(alice)
    await ws.send_json_to({"type": "client-tool-register", "tools": [tool, FOCUS]})
    refusal = await ws.receive_json_from()
    assert refusal["type"] == "error"
    assert refusal["status"] == 400
    assert refusal["tool"] == name
    assert refusal["error"].startswith(f"{name}: ")
    assert reason in refusal["error"]
    if name != "map_focus":
        assert await ws.receive_json_from() == {
            "type": "client-tool-registered",
            "tools": ["map_focus"],
        }
        toolset = await toolset_of(session_id=alice.session.pk)
        assert list(toolset.tools) == ["map_focus"]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_name_declared_twice_is_refused_the_second_time(alice):
    ws = await bound(alice)
    await ws.send_json_to({"type": "client-tool-register", "tools": [FOCUS, FOCUS]})
    assert await ws.receive_json_from() == {
        "type": "error",
        "status": 400,
        "error": "map_focus: the name is declared twice",
        "tool": "map_focus",
    }
    assert (await ws.receive_json_from())["tools"] == ["map_focus"]
    await ws.disconnect()


async def refused_whole(who: Person, tools: list) -> dict:
    """Register `tools` in one frame that is refused whole; the answer, once nothing is stored."""
    ws = await bound(who)
    await ws.send_json_to({"type": "client-tool-register", "tools": tools})
    answer = await ws.receive_json_from()
    assert await toolset_of(session_id=who.session.pk) is None
    await ws.disconnect()
    return answer


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_more_than_32_tools_are_refused_whole(alice):
    many = [variant(FOCUS, name=f"tool_{i}") for i in range(33)]
    assert await refused_whole(alice, many) == {
        "type": "error",
        "status": 400,
        "error": "a socket may register at most 32 tools",
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_registrations_beyond_a_burst_of_five_are_refused_with_429(alice):
    ws = await bound(alice)
    for _ in range(5):
        await ws.send_json_to({"type": "client-tool-register", "tools": [FOCUS]})
        assert (await ws.receive_json_from())["type"] == "client-tool-registered"
    await ws.send_json_to({"type": "client-tool-register", "tools": [LOCATION]})
    refusal = await ws.receive_json_from()
    assert refusal["status"] == 429
    assert refusal["error"].startswith("too many registrations on this socket; try again in")
    assert list((await toolset_of(session_id=alice.session.pk)).tools) == ["map_focus"]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_declarations_too_costly_to_check_register_nothing(alice, monkeypatch):
    monkeypatch.setattr("chat.consumers.REGISTRATION_BUDGET_SECONDS", 0.001)
    heavy = [heavy_declaration(f"heavy_{i}") for i in range(4)]
    assert await refused_whole(alice, heavy) == {
        "type": "error",
        "status": 400,
        "error": "the declarations could not be checked within 0.001 s; nothing was registered",
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_user_sending_more_than_the_inbound_budget_is_slowed_down(alice):
    ws = await connected(alice)
    pad = json.dumps({"type": "noise", "pad": "x" * 70_000})
    statuses = []
    for _ in range(9):  # nine of 70 KiB: over the 512 KiB burst
        await ws.send_to(text_data=pad)
        statuses.append((await ws.receive_json_from())["status"])
    assert statuses[:7] == [400] * 7  # parsed: an unknown frame type
    assert statuses[-1] == 429
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_flood_of_tiny_frames_gives_the_event_loop_back_and_is_metered(alice, monkeypatch):
    """Queued frames are handled with no suspension of their own (the review of 6862d5a):
    another task must run between them, and a 1-byte frame still costs the meter a floor."""
    monkeypatch.setattr("chat.consumers.FRAMES_SLICE_SECONDS", 0.0, raising=False)
    monkeypatch.setattr("chat.consumers.INBOUND_BYTES_PER_SECOND", 0)  # no refill meanwhile
    ws = await connected(alice)
    for _ in range(200):
        await ws.send_to(text_data="x")
    replies_seen = []
    while len(replies_seen) < 1000 and ws.output_queue.qsize() < 200:
        await asyncio.sleep(0)
        replies_seen.append(ws.output_queue.qsize())
    assert any(0 < n < 200 for n in replies_seen)  # this task ran between the frames
    statuses = [(await ws.receive_json_from())["status"] for _ in range(200)]
    assert statuses == [400] * 200
    bucket = consumers._inbound[alice.user.pk]
    assert bucket.tokens == consumers.INBOUND_BURST_BYTES - 200 * consumers.INBOUND_FRAME_MIN_BYTES
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_frame_after_a_pause_takes_no_extra_round_of_the_loop(alice, monkeypatch):
    """A page's occasional frame (a client tool's answer, once a turn) is handled without
    giving the loop a round of its own afterwards: only time spent handling frames counts
    towards `FRAMES_SLICE_SECONDS`, not the wait for them (a round resumes the socket's whole
    stack of coroutines, ~20 Python calls)."""
    ws = await connected(alice)
    rounds_given = []
    sleep = asyncio.sleep

    async def counted_sleep(delay, *args, **kwargs):
        if sys._getframe(1).f_code.co_filename == consumers.__file__:
            rounds_given.append(delay)
        return await sleep(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", counted_sleep)
    for _ in range(3):
        await sleep(consumers.FRAMES_SLICE_SECONDS * 2)
        await ws.send_to(text_data=json.dumps({"type": "noise"}))
        assert (await ws.receive_json_from())["status"] == 400
    assert rounds_given == []
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_socket_ended_by_a_handlers_error_leaves_nothing_behind(alice, monkeypatch):
    """An error in a handler ends the socket without `disconnect` (as in Channels): its direct
    deliveries must go too, or an invoke of this process would wait on a dead socket; its
    tools stayed registered (the next turn offered a dead tab's tools) and a call it held
    waited out its time-out."""
    before = set(client_module._attached)
    ws = await registered(alice, [LOCATION])
    (channel,) = set(client_module._attached) - before
    assert channel in events_module._local[session_group(alice.session.pk)]
    call = asyncio.create_task(request(alice.session, "location_get", {}, wait=30))
    assert (await ws.receive_json_from())["type"] == "client-tool-invoke"

    async def broken(self, frame):
        raise RuntimeError("a bug in a handler")

    monkeypatch.setitem(consumers.ChatConsumer.handlers, wire.SESSION_BIND, broken)
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    with pytest.raises(RuntimeError):
        await ws.receive_output()
    assert channel not in client_module._attached
    assert session_group(alice.session.pk) not in events_module._local
    answer = await asyncio.wait_for(call, 5)
    assert answer.error == WENT_AWAY
    assert not await ClientToolRegistration.objects.filter(session=alice.session).aexists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_page_frame_waiting_on_a_failing_layer_handler_is_not_handled(alice, monkeypatch):
    """Handlers run one at a time: a page frame that waited for the lock while a layer
    message's handler failed was started, then cancelled at its first await, half done."""
    before = set(client_module._attached)
    ws = await registered(alice, [LOCATION])
    (channel,) = set(client_module._attached) - before
    entered, release, handled = asyncio.Event(), asyncio.Event(), []

    async def failing(self, message):
        entered.set()
        await release.wait()
        raise RuntimeError("a bug in a layer handler")

    async def recorded(self, frame):
        handled.append(frame)

    monkeypatch.setattr(consumers.ChatConsumer, "test_failing", failing, raising=False)
    monkeypatch.setitem(consumers.ChatConsumer.handlers, wire.SESSION_BIND, recorded)
    await get_channel_layer().send(channel, {"type": "test.failing"})
    await asyncio.wait_for(entered.wait(), 5)
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    await asyncio.sleep(0.05)  # the frame is read and waits for the handler's lock
    release.set()
    with pytest.raises(RuntimeError):
        await ws.receive_output()
    assert handled == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_registrations_belong_to_the_socket_and_come_back_after_a_reconnect(alice):
    ws = await registered(alice, [LOCATION, FOCUS])
    toolset = await toolset_of(session_id=alice.session.pk)
    assert set(toolset.tools) == {"location_get", "map_focus"}
    assert toolset.tools["location_get"].serve is True
    await ws.disconnect()
    assert await toolset_of(session_id=alice.session.pk) is None

    again = await registered(alice, [LOCATION])
    toolset = await toolset_of(session_id=alice.session.pk)
    assert list(toolset.tools) == ["location_get"]
    await again.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_registering_again_replaces_the_sockets_tools(alice):
    ws = await registered(alice, [LOCATION, FOCUS])
    await ws.send_json_to({"type": "client-tool-register", "tools": [FOCUS]})
    assert (await ws.receive_json_from())["tools"] == ["map_focus"]
    toolset = await toolset_of(session_id=alice.session.pk)
    assert list(toolset.tools) == ["map_focus"]
    count = await database_sync_to_async(ClientToolRegistration.objects.count)()
    assert count == 1
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_rebind_moves_the_sockets_tools_to_the_new_session(alice):
    other = await database_sync_to_async(ChatSession.objects.create)(user=alice.user)
    ws = await registered(alice, [LOCATION])
    await ws.send_json_to({"type": "session-bind", "session": str(other.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    assert await toolset_of(session_id=alice.session.pk) is None
    assert list((await toolset_of(session_id=other.pk)).tools) == ["location_get"]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_newest_registration_of_a_session_is_the_one_offered(alice):
    older = await registered(alice, [LOCATION])
    newer = await registered(alice, [FOCUS])
    assert list((await toolset_of(session_id=alice.session.pk)).tools) == ["map_focus"]
    await newer.disconnect()
    assert list((await toolset_of(session_id=alice.session.pk)).tools) == ["location_get"]
    await older.disconnect()


# --- client-tool calls through the socket -----------------------------------------------------


async def invoked(ws: WebsocketCommunicator) -> dict:
    frame = await ws.receive_json_from(timeout=3)
    assert frame["type"] == "client-tool-invoke"
    return frame


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_served_blocking_call_reaches_the_page_and_its_result_the_engine(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}))
    frame = await invoked(ws)
    assert frame["name"] == "location_get"
    assert frame["arguments"] == {}
    assert isinstance(frame["correlationId"], str)
    result = {"status": "GRANTED", "accuracy": 12.5}
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": frame["correlationId"], "result": result}
    )
    answer = await call
    assert answer.ok
    assert answer.result == result
    assert answer.error is None
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_error_answer_becomes_a_readable_refusal(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}))
    frame = await invoked(ws)
    await ws.send_json_to(
        {
            "type": "client-tool-result",
            "correlationId": frame["correlationId"],
            "error": "The user chose not to share.",
        }
    )
    answer = await call
    assert not answer.ok
    assert answer.error == "The client refused: The user chose not to share."
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("pad", "problem"),
    [
        ("x" * 70_000, "the value is larger than 64 KiB"),
        # A short frame, so not measured by its length alone: its brackets give it away.
        (_nested(40), "the value nests deeper than 32 levels"),
    ],
    ids=["large", "deep"],
)
async def test_a_result_too_large_to_check_is_refused_before_it_reaches_the_engine(
    alice, pad, problem
):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}))
    frame = await invoked(ws)
    result = {"status": "GRANTED", "pad": pad}
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": frame["correlationId"], "result": result}
    )
    refusal = await ws.receive_json_from()
    assert (refusal["status"], refusal["error"]) == (413, problem)
    answer = await call
    assert not answer.ok
    assert answer.error == f"The client's answer was refused: {problem}."
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_result_breaking_the_schema_becomes_a_readable_refusal(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}))
    frame = await invoked(ws)
    await ws.send_json_to(
        {
            "type": "client-tool-result",
            "correlationId": frame["correlationId"],
            "result": {"accuracy": "far"},
        }
    )
    answer = await call
    assert not answer.ok
    assert answer.result is None
    assert "does not match the result schema of location_get" in answer.error
    assert "'status' is a required property" in answer.error
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_unanswered_call_times_out_and_a_late_answer_is_refused(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}, wait=0.2))
    frame = await invoked(ws)
    answer = await call
    assert not answer.ok
    assert answer.error == "No answer from the client within 0.2 seconds."
    assert await ws.receive_json_from() == {
        "type": "client-tool-cancelled",
        "correlationId": frame["correlationId"],
    }
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": frame["correlationId"], "result": {}}
    )
    assert await ws.receive_json_from() == {
        "type": "error",
        "status": 404,
        "error": "unknown correlation id",
        "correlationId": frame["correlationId"],
    }
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_socket_closing_while_a_call_is_pending_answers_at_once(alice):
    ws = await registered(alice, [LOCATION])
    started = time.monotonic()
    call = asyncio.create_task(request(alice.session, "location_get", {}, wait=10))
    await invoked(ws)
    await ws.disconnect()
    answer = await call
    assert time.monotonic() - started < 1
    assert not answer.ok
    assert answer.error == "The client went away before answering."


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_duplicate_answer_is_ignored_with_an_error_frame(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}))
    frame = await invoked(ws)
    first = {"type": "client-tool-result", "correlationId": frame["correlationId"]}
    await ws.send_json_to({**first, "result": {"status": "GRANTED"}})
    await ws.send_json_to({**first, "result": {"status": "DECLINED"}})
    assert (await call).result == {"status": "GRANTED"}
    refusal = await ws.receive_json_from()
    assert refusal["status"] == 404
    assert refusal["error"] == "unknown correlation id"
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_unknown_correlation_id_is_ignored_with_an_error_frame(alice):
    ws = await registered(alice, [LOCATION])
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": "nobody-asked", "result": {}}
    )
    assert (await ws.receive_json_from())["error"] == "unknown correlation id"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_concurrent_calls_are_answered_by_their_own_correlation_ids(alice):
    ws = await registered(alice, [LOCATION])
    calls = [asyncio.create_task(request(alice.session, "location_get", {})) for _ in range(3)]
    frames = [await invoked(ws) for _ in calls]
    for index, frame in reversed(list(enumerate(frames))):
        await ws.send_json_to(
            {
                "type": "client-tool-result",
                "correlationId": frame["correlationId"],
                "result": {"status": "GRANTED", "accuracy": index},
            }
        )
    answers = await asyncio.gather(*calls)
    assert sorted(a.result["accuracy"] for a in answers) == [0, 1, 2]
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_cancelled_call_is_withdrawn_from_the_page(alice):
    ws = await registered(alice, [LOCATION])
    call = asyncio.create_task(request(alice.session, "location_get", {}, wait=10))
    frame = await invoked(ws)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await ws.receive_json_from() == {
        "type": "client-tool-cancelled",
        "correlationId": frame["correlationId"],
    }
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_deletion_and_a_restore_reach_every_open_socket(alice, bob):
    from geosense.annotations.models import AnnotationRevision
    from geosense.annotations.services import (
        annotation_create,
        annotations_restore,
        annotations_soft_delete,
    )
    from tests.annotations.shapes import point

    tree = await database_sync_to_async(annotation_create)(
        category="tree", geometry=point(-118.52, 34.15)
    )
    alices, bobs = await bound(alice), await connected(bob)  # bound or not, every page hears

    await database_sync_to_async(annotations_soft_delete)(ids=[tree.pk])
    deleted = await database_sync_to_async(AnnotationRevision.current)()
    for ws in (alices, bobs):
        assert await ws.receive_json_from() == {"type": "annotations-changed", "revision": deleted}

    await database_sync_to_async(annotations_restore)(ids=[tree.pk])
    restored = await database_sync_to_async(AnnotationRevision.current)()
    assert restored != deleted
    for ws in (alices, bobs):
        assert await ws.receive_json_from() == {
            "type": "annotations-changed",
            "revision": restored,
        }
    await database_sync_to_async(annotations_soft_delete)(ids=[tree.pk + 1000])  # none: silent
    assert await alices.receive_nothing(timeout=0.2)
    await alices.disconnect()
    await bobs.disconnect()


# --- the dispatch loop ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_layer_message_waits_for_the_frame_being_handled(alice, monkeypatch):
    """The page's frames and the channel layer's messages are handled one at a time, as in
    Channels' own loop: an event that arrives while a bind awaits the database follows it."""
    import chat.consumers

    release = asyncio.Event()
    real = chat.consumers._session_of_user

    async def slow_lookup(**kwargs):
        await release.wait()
        return await real(**kwargs)

    ws = await bound(alice)
    monkeypatch.setattr(chat.consumers, "_session_of_user", slow_lookup)
    await ws.send_json_to({"type": "session-bind", "session": str(alice.session.pk)})
    await asyncio.sleep(0.05)
    await emit(alice.session, wire.text_delta("after the bind"))
    assert await ws.receive_nothing(timeout=0.1)
    release.set()
    assert (await ws.receive_json_from())["type"] == "session-bound"
    assert (await ws.receive_json_from())["data"] == {"delta": "after the bind"}
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_layer_message_without_a_handler_ends_the_socket_with_its_error(alice):
    """As in Channels' loop, a handler's error (here on the layer's side) ends the socket."""
    ws = await bound(alice)
    await get_channel_layer().group_send(session_group(alice.session.pk), {"type": "no.such"})
    with pytest.raises(ValueError, match=r"no handler for message type no\.such"):
        await ws.receive_output()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_closed_socket_leaves_no_task_behind(alice):
    before = asyncio.all_tasks()
    ws = await bound(alice)
    # Its application (Daphne's task for it), its loop of frames, its layer messages.
    assert len(asyncio.all_tasks() - before) == 3
    await ws.disconnect()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()


# What `ChatConsumer._serve` does for a page's text frame in place of Channels' dispatch: the
# handler `get_handler_name` names for "websocket.receive" is `websocket_receive`, which calls
# `receive(text_data=...)` for a text frame. A Channels release that changes either changes
# what a page's frame goes through: read it again, then update these.
CHANNELS_SOURCES = {
    "AsyncWebsocketConsumer.websocket_receive": "165d159d99adfd8a",
    "get_handler_name": "c88c7b7d8763fb61",
}


def test_a_text_frames_way_is_the_one_channels_dispatch_would_take():
    from channels.consumer import get_handler_name
    from channels.generic.websocket import AsyncWebsocketConsumer

    from tests.source_pins import source_digests

    originals = {
        "AsyncWebsocketConsumer.websocket_receive": AsyncWebsocketConsumer.websocket_receive,
        "get_handler_name": get_handler_name,
    }
    assert source_digests(originals) == CHANNELS_SOURCES
    assert get_handler_name({"type": "websocket.receive"}) == "websocket_receive"
