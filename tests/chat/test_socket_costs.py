"""What a socket's connect costs the process (issue 15, 500 users connecting at once): its thread
hops, its trips to the database pool and the SQL statements it runs, from the upgrade to a bound
socket with its tools registered, for a bearer-token socket (a script, the load bench) and a
cookie socket (a page). 500 sockets connecting at once did this work once each on Channels'
single `database_sync_to_async` thread, opening and closing a SQLite connection for every call,
and their handshakes queued there past Daphne's 5 s time-out."""

import asyncio
import threading

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import ChatSession
from geosense.accounts.services import api_token_create
from geosense.asgi import application
from geosense.dbpool import in_db_thread
from tests.autobahn_socket import socket_opened
from tests.chat.costs import Costs
from tests.client_tools import LOCATION

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def someone(name: str) -> tuple[object, str, ChatSession]:
    user = get_user_model().objects.create_user(name, password="pw")
    return user, api_token_create(user=user), ChatSession.objects.create(user=user)


async def bind_and_register(ws: WebsocketCommunicator, session: ChatSession) -> None:
    await ws.send_json_to({"type": "session-bind", "session": str(session.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    await ws.send_json_to({"type": "client-tool-register", "tools": [LOCATION]})
    assert (await ws.receive_json_from())["type"] == "client-tool-registered"


async def connect_bind_register(
    headers: list[tuple[bytes, bytes]], session: ChatSession, costs: Costs
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A socket with `headers` connects, binds to `session` and registers location_get; the
    costs counted after the handshake and after the registration."""
    ws = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    assert (await ws.connect())[0]
    handshake = costs.snapshot()
    await bind_and_register(ws, session)
    connected = costs.snapshot()
    await ws.disconnect()
    return handshake, connected


async def test_a_token_socket_connects_binds_and_registers_in_three_pool_trips(monkeypatch):
    """The handshake is one trip (the token with its user), the bind one (the ownership
    check), the registration one; no hop besides them, none on Channels' own thread (where
    they queued behind every other socket's calls, each opening its own connection). The two
    reads go to the requests' pool, the registration (a write) to the engine's."""
    from channels.db import database_sync_to_async

    _, token, session = await database_sync_to_async(someone)("alice")
    costs = Costs(monkeypatch)
    handshake, connected = await connect_bind_register(
        [(b"authorization", f"Bearer {token}".encode())], session, costs
    )
    assert handshake[:2] == (1, 0), (handshake, costs.statements)
    # It was 4 hops on Channels' thread (the session user, the token, the bind, the
    # registration), none on the pool.
    assert connected[:2] == (3, 1), (connected, costs.statements)
    assert costs.request_trips == 2
    # The token with its user (and its once-a-minute `last_used`), the session, the
    # registration's read and write.
    assert connected[2] <= 6, "\n".join(costs.statements)


async def test_a_cookie_socket_handshake_is_one_pool_trip(monkeypatch):
    """The page's socket: the session and its user are read in one trip on the requests'
    pool."""
    from channels.db import database_sync_to_async

    def logged_in() -> tuple[str, ChatSession]:
        user, _, session = someone("bob")
        browser = Client()
        browser.force_login(user)
        return browser.cookies["sessionid"].value, session

    cookie, session = await database_sync_to_async(logged_in)()
    costs = Costs(monkeypatch)
    headers = [
        (b"cookie", f"sessionid={cookie}".encode()),
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
    ]
    handshake, connected = await connect_bind_register(headers, session, costs)
    assert handshake[:2] == (1, 0), (handshake, costs.statements)
    assert connected[:2] == (3, 1), (connected, costs.statements)
    assert costs.request_trips == 2


async def test_a_socket_connects_and_binds_while_the_engines_pool_is_busy():
    """A socket's handshake and bind are reads of the requests' pool: on the engine's they
    queued behind the turns' trips (at 200 users a socket opened during the load bound after
    3.7-4.5 s, and at 500 users Daphne's 5 s handshake time-out dropped 3 of 5)."""
    from channels.db import database_sync_to_async

    _, token, session = await database_sync_to_async(someone)("carol")
    release, started = threading.Event(), threading.Event()

    def turns_at_work() -> None:
        started.set()
        release.wait(10)

    busy = asyncio.ensure_future(in_db_thread(turns_at_work)())
    await asyncio.to_thread(started.wait, 10)
    try:
        ws = WebsocketCommunicator(
            application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
        )
        assert (await ws.connect(timeout=5))[0]
        await ws.send_json_to({"type": "session-bind", "session": str(session.pk)})
        assert (await ws.receive_json_from(timeout=5))["type"] == "session-bound"
    finally:
        release.set()
        await busy
    await ws.disconnect()


async def test_sockets_connecting_do_not_each_sweep_the_in_memory_layer(monkeypatch):
    """Channels' in-memory layer swept every channel and group membership of the process on
    each socket's first `receive` (and after every layer message): per socket, work that grew
    with the sockets. Within one sweep interval, ten sockets connecting sweep at most once."""
    from channels.db import database_sync_to_async
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    people = [await database_sync_to_async(someone)(f"p{i}") for i in range(10)]
    layer = get_channel_layer()
    monkeypatch.setattr(type(layer), "SWEEP_SECONDS", 3600, raising=False)
    sweeps = []
    sweep = InMemoryChannelLayer._clean_expired
    monkeypatch.setattr(
        InMemoryChannelLayer, "_clean_expired", lambda self: sweeps.append(1) or sweep(self)
    )
    sockets = []
    for _, token, _ in people:
        ws = WebsocketCommunicator(
            application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
        )
        assert (await ws.connect())[0]
        sockets.append(ws)
    for ws in sockets:
        await ws.disconnect()
    assert len(sweeps) <= 1, len(sweeps)


async def test_a_connection_does_not_pretty_print_autobahns_configuration(monkeypatch):
    """autobahn formatted its configuration for a debug line (not written) as each
    connection was made: ~0.3 ms of the event loop per socket."""
    import pprint

    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
    from twisted.internet.testing import StringTransport

    import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)

    formatted = []
    real = pprint.PrettyPrinter.pformat
    monkeypatch.setattr(
        pprint.PrettyPrinter, "pformat", lambda self, obj: formatted.append(1) or real(self, obj)
    )
    factory = WebSocketServerFactory()
    factory.protocol = WebSocketServerProtocol  # Daphne's is one of these
    protocol = factory.buildProtocol(("127.0.0.1", 1))
    protocol.makeConnection(StringTransport())
    assert protocol.state == protocol.STATE_CONNECTING
    assert formatted == []


async def test_a_frame_is_handled_without_a_task_or_a_wait_of_its_own(monkeypatch):
    """Channels' dispatch loop wrapped every `receive()` in a new task and waited for it with
    `asyncio.wait` (two more loop rounds before the handler ran, issue 15 item 8): the socket
    awaits the page's frames itself, and its channel-layer messages in one task for its life."""
    from channels.db import database_sync_to_async

    _, token, _ = await database_sync_to_async(someone)("carol")
    ws = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert (await ws.connect())[0]
    loop = asyncio.get_running_loop()
    created, waits = [], []
    factory = loop.get_task_factory()

    def counted_task(loop, coro, **kwargs):
        created.append(coro)
        if factory is not None:
            return factory(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    real_wait = asyncio.wait
    monkeypatch.setattr(asyncio, "wait", lambda *a, **kw: waits.append(1) or real_wait(*a, **kw))
    loop.set_task_factory(counted_task)
    try:
        for _ in range(10):  # answered by the socket itself: an unknown correlation id
            await ws.send_json_to(
                {"type": "client-tool-result", "correlationId": "nobody", "result": {}}
            )
            assert (await ws.receive_json_from())["status"] == 404
    finally:
        loop.set_task_factory(factory)
    await ws.disconnect()
    assert (created, waits) == ([], [])


async def test_a_frame_to_the_page_is_handed_to_daphne_in_one_step(monkeypatch):
    """Channels' `send_json` went through `encode_json` and `send` twice (three coroutines)
    for every frame to the page; the socket hands its frames to Daphne directly."""
    from channels.consumer import AsyncConsumer
    from channels.db import database_sync_to_async

    _, token, session = await database_sync_to_async(someone)("dave")
    through_channels = []
    real = AsyncConsumer.send
    monkeypatch.setattr(
        AsyncConsumer, "send", lambda self, m: through_channels.append(m["type"]) or real(self, m)
    )
    ws = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert (await ws.connect())[0]
    await bind_and_register(ws, session)
    await ws.disconnect()
    assert through_channels == ["websocket.accept"]


async def test_a_frame_sent_or_received_builds_no_debug_text(monkeypatch):
    """autobahn named the method and coloured the values of a debug line (not written) for
    every frame it sent or received: `inspect` and `click.style`, ~10 µs a frame."""
    from autobahn import util

    import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)

    styled = []
    monkeypatch.setattr(util, "hl", lambda text, **style: styled.append(text) or str(text))
    protocol, transport = socket_opened()
    assert protocol.state == protocol.STATE_OPEN
    received = []
    protocol.onMessage = lambda payload, binary: received.append(payload)
    styled.clear()  # the connection's own lines (once per socket) are not counted
    protocol.sendMessage(b'{"type": "event"}')
    page = b'{"type": "session-bind"}'
    protocol.dataReceived(bytes([0x81, 0x80 | len(page)]) + bytes(4) + page)  # masked by zeros

    assert transport.value().endswith(b'{"type": "event"}')
    assert received == [page]
    assert styled == []


async def test_a_frame_wakes_the_socket_without_the_coroutines_above_its_consumer(caller):
    """Daphne runs a socket's application (the protocol router, the authentication middleware,
    the URL router, Channels' `app`, the consumer's `__call__`) as one task: each frame the page
    sends woke each of them before the consumer's loop, a Python call each. The loop runs in a task
    of its own, which a frame wakes alone. 189 Python calls before, then 183, for a frame
    answered at once (an answer to an unknown call: an error frame), the test socket included;
    177 now that a text frame goes to `receive` without Channels' `dispatch` and
    `websocket_receive`, and the handlers' lock is taken without `async with`."""
    from tests.chat.costs import python_calls
    from tests.chat.test_consumer_turns import tab

    ws = await tab(caller)
    frame = {"type": "client-tool-result", "correlationId": "nobody", "result": {}}

    async def exchange() -> None:
        await ws.send_json_to(frame)
        assert (await ws.receive_json_from())["status"] == 404

    calls = min([await python_calls(exchange()) for _ in range(5)])
    await ws.disconnect()
    assert calls <= 178, calls  # 177 or 178 measured
