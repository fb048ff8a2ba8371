"""The session socket (`/ws/chat/`): one per browser tab, bound to one chat session.

It relays the bound session's live turn events to the page and carries client-tool calls
between the turn engine (any process, through the channel layer) and the page. Frames and
channel-layer messages are defined in `geosense.wire` and described for users in
docs/protocol.md; declarations are validated by `tools.client`, stored by `chat.services`.
"""

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
import weakref
from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.utils import timezone

from chat import outage, selectors, services
from chat.events import session_group, session_socket_attach, session_socket_detach
from chat.models import ChatSession
from geosense import wire
from geosense.dbpool import in_db_thread, in_request_thread
from geosense.throttle import TokenBucket
from tools.client import (
    CLIENT_ERROR_MAX_CHARS,
    TOOLS_PER_SOCKET_MAX,
    WENT_AWAY,
    ClientTool,
    client_socket_attach,
    client_socket_detach,
    client_tool_answer_send,
    client_tools_declare,
)
from tools.registry import backend_tool_names
from tools.schemas import (
    CheckTooCostly,
    checked_inline,
    checked_off_loop,
    text_within_bounds,
    value_bounds_problem,
)

# The largest answer a page may send (tools.schemas.VALUE_MAX_BYTES) and its envelope.
FRAME_MAX_CHARS = 80 * 1024
CLOSE_UNAUTHENTICATED = wire.CLOSE_UNAUTHENTICATED
# Parsing a frame holds the event loop (json.loads holds the GIL wherever it runs), so what
# one user's sockets may send in this process is metered before parsing: a page sends a few
# KiB a minute; a hostile one gets 128 KiB/s, a few milliseconds of parsing a second.
INBOUND_BURST_BYTES = 512 * 1024
INBOUND_BYTES_PER_SECOND = 128 * 1024
# A frame costs its handling whatever its length (a parse, a reply built and sent: tens of µs),
# so the meter charges at least this much for one: a flood of 1-byte frames is metered too.
INBOUND_FRAME_MIN_BYTES = 64
# Frames already queued are handled without the loop suspending (Daphne's queue, a free lock
# and its sends all return at once), so one socket gives the loop back once it has spent this
# much handling frames since it last did: a flood of cheap frames cannot hold every other
# user's work. Only handling counts, not the wait for a frame: a page's occasional frame (a
# client tool's answer, once a turn) ends with no extra round of the loop, whose resumption
# of the socket's whole stack of coroutines cost ~20 Python calls.
FRAMES_SLICE_SECONDS = 0.002
# A page registers once per bind (load, reconnect, session switch): a burst of 5, then one
# every 2 s, is far above what a person causes and caps what a hostile page can make us check.
REGISTRATIONS_BURST = 5
REGISTRATIONS_PER_SECOND = 0.5
REGISTRATION_BUDGET_SECONDS = 0.5

# user id → the inbound bucket shared by that user's sockets in this process
_inbound: "weakref.WeakValueDictionary[int, TokenBucket]" = weakref.WeakValueDictionary()
# `disconnect`s run for sockets that a handler's error ended (held until they finish).
_tidying: set[asyncio.Task] = set()
CLOSE_INTERNAL_ERROR = 1011  # RFC 6455's "unexpected condition"

logger = logging.getLogger(__name__)


def _inbound_bucket(user_id: int) -> TokenBucket:
    bucket = _inbound.get(user_id)
    if bucket is None:
        bucket = TokenBucket(burst=INBOUND_BURST_BYTES, rate=INBOUND_BYTES_PER_SECOND)
        _inbound[user_id] = bucket
    return bucket


async def _bounds_problem(value: object, *, size: int) -> str | None:
    try:
        return await checked_inline(value_bounds_problem, value, size=size)
    except CheckTooCostly:
        return "the answer could not be measured in time"


# The socket's ORM work runs on the database pools (`geosense.dbpool`): on Channels'
# `database_sync_to_async` thread, 500 sockets connecting at once queued one behind the other,
# each call opening and closing its own connection (issue 15). Its read of the session it binds
# goes to the requests' pool, as a request's reads do (on the engine's it queued behind the
# turns' trips); its registrations, writes, to the engine's, where they take turns with the
# turns' trips (`dbpool._Pool`).


async def _session_of_user(*, user, session: object) -> ChatSession | None:
    return await in_request_thread(selectors.session_of_user)(session_id=str(session), user=user)


async def _register(*, channel_name: str, session_id, tools: list[ClientTool]) -> None:
    await in_db_thread(services.client_tools_register)(
        channel_name=channel_name, session_id=session_id, tools=tools
    )


async def _unregister(*, channel_name: str) -> None:
    await in_db_thread(services.client_tools_unregister)(channel_name=channel_name)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """Dispatches each client frame on its `type`; group and layer messages by their name."""

    async def __call__(self, scope, receive, send) -> None:
        """Channels' `AsyncConsumer.__call__` with a leaner dispatch loop (`_serve`).

        A channel layer that cannot give the socket its channel (Redis is down) refuses it
        with `CLOSE_LIVE_LOST`, a code the page reads, instead of an HTTP 500 on the upgrade."""
        self.scope = scope
        self.base_send = send
        try:
            self.channel_layer = get_channel_layer(self.channel_layer_alias)
            self.channel_name = await self.channel_layer.new_channel()
        except Exception as exc:
            outage.layer_failed(exc)
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.accept"})
                await send({"type": "websocket.close", "code": wire.CLOSE_LIVE_LOST})
            return
        self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        try:
            with contextlib.suppress(StopConsumer):
                # A task of its own: Daphne's task for the socket holds the coroutines above
                # this one (the routers, the authentication middleware, Channels' `app`), and
                # every frame that woke `_serve` in it resumed each of them, a Python call each.
                # Awaited here, it is cancelled with Daphne's task and its errors come out here.
                await asyncio.ensure_future(self._serve(receive))
        except BaseException:
            self._tidy_after_error()
            raise
        finally:
            self._process_forget()

    def _tidy_after_error(self) -> None:
        """A handler's error (or Daphne giving up on the socket) ends it without `disconnect`:
        its registrations, the calls it holds and its groups would outlive it. `disconnect`
        runs in a task of its own, out of reach of this task's cancellation."""

        async def tidy() -> None:
            try:
                await self.disconnect(CLOSE_INTERNAL_ERROR)
            except Exception:
                logger.warning("could not tidy up after a socket's error", exc_info=True)

        task = asyncio.ensure_future(tidy())
        _tidying.add(task)
        task.add_done_callback(_tidying.discard)

    async def _serve(self, receive) -> None:
        """Dispatch the page's frames and the channel layer's messages, one handler at a time.

        Channels' `await_many_dispatch` wraps every `receive()` in a task of its own and waits
        for it with `asyncio.wait`: per frame a task, a wait and two more loop rounds before
        its handler runs (issue 15, item 8). Here this task awaits the page's frames itself
        and one long-lived task awaits the layer's messages; a lock keeps their handlers from
        interleaving, as Channels' loop did, and after `FRAMES_SLICE_SECONDS` spent handling
        frames the loop gets a turn. A handler's error, on either side, ends the socket
        as it did there (a page frame that waited for the lock meanwhile is not handled); so
        does the disconnect (`StopConsumer`), and the layer's task is cancelled either way.

        A page's text frame goes to `receive` as Channels' `dispatch` would send it (through
        `get_handler_name` and `websocket_receive`), and the lock is taken and given back by
        its own methods, not `async with`: five Python calls fewer a frame (issue 15). The
        Channels sources that way stands in for are pinned in tests/chat/test_consumer.py."""
        self.handling = handling = asyncio.Lock()
        layer_messages = asyncio.ensure_future(self._layer_messages())
        serving = asyncio.current_task()

        def failed(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                serving.cancel()

        layer_messages.add_done_callback(failed)
        busy = 0.0  # seconds spent handling frames since the loop last got a turn
        try:
            while True:
                message = await receive()
                began = time.monotonic()  # `loop.time()`'s clock, without its call
                await handling.acquire()
                try:
                    if layer_messages.done():  # its handler failed while this frame waited
                        raise layer_messages.exception()
                    if message["type"] == "websocket.receive" and message.get("text") is not None:
                        await self.receive(text_data=message["text"])  # `dispatch`'s way
                    else:
                        await self.dispatch(message)
                finally:
                    handling.release()
                busy += time.monotonic() - began
                if busy >= FRAMES_SLICE_SECONDS:
                    await asyncio.sleep(0)  # others' ready work runs before the next frame
                    busy = 0.0
        except asyncio.CancelledError:
            if layer_messages.done() and not layer_messages.cancelled():
                raise layer_messages.exception() from None
            raise
        finally:
            layer_messages.remove_done_callback(failed)
            if not layer_messages.done():
                layer_messages.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await layer_messages

    async def _layer_messages(self) -> None:
        while True:
            message = await self.channel_receive()
            async with self.handling:
                await self.dispatch(message)

    async def dispatch(self, message: dict) -> None:
        """Channels' dispatch without its thread hop: it closes stale database connections in
        a worker thread before every handler (twice per client-tool call); every ORM call of
        this consumer goes through the database pool, which looks after its connections."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.session_id: uuid.UUID | None = None
        self.tools: list[ClientTool] = []
        # correlation id → the engine's reply channel, for calls the page has not answered
        self.calls: dict[str, str] = {}
        self.registrations = TokenBucket(burst=REGISTRATIONS_BURST, rate=REGISTRATIONS_PER_SECOND)
        user = self.scope.get("user")
        self.authenticated = bool(user is not None and user.is_authenticated)
        self.auth_groups: list[str] = []
        if self.authenticated:
            self.inbound = _inbound_bucket(user.pk)
            # Closed at once when the user is deactivated or the token revoked or expired.
            self.auth_groups.append(wire.auth_group_of_user(user.pk))
            token = self.scope.get("api_token")
            if token:
                token_id, expires = token
                self.auth_groups.append(wire.auth_group_of_token(token_id))
                self.expiry = asyncio.get_running_loop().call_later(
                    max(0.0, (expires - timezone.now()).total_seconds()),
                    lambda: asyncio.ensure_future(self.auth_revoked(wire.auth_revoked_message())),
                )
            # Every page hears of writes to annotations (its map reloads what changed).
            self.auth_groups.append(wire.ANNOTATIONS_GROUP)
            live = await self._layer_call(
                *(self.channel_layer.group_add(g, self.channel_name) for g in self.auth_groups)
            )
        # Accept, then close with a code the page can read (a refused handshake has none).
        await self.accept()
        if not self.authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not live:
            await self.close(code=wire.CLOSE_LIVE_LOST)
            return
        outage.socket_watch(self.channel_name, self._live_lost)
        # Invokes from turns of this process come straight here, not through the layer.
        client_socket_attach(
            self.channel_name, invoke=self.client_tool_invoke, forget=self.client_tool_forget
        )

    async def _layer_call(self, *operations) -> bool:
        """Run these channel-layer operations in turn; False (and the outage noted, once) if
        the layer failed."""
        try:
            for operation in operations:
                await operation
        except Exception as exc:
            for operation in operations:
                operation.close()  # the ones never awaited
            outage.layer_failed(exc)
            return False
        outage.layer_ok()
        return True

    async def _live_lost(self) -> None:
        await self.close(code=wire.CLOSE_LIVE_LOST)

    def _process_forget(self) -> None:
        """Drop what this process holds for the socket: its direct deliveries (invokes, the
        session's events), its outage watch and its expiry timer. Idempotent; run by
        `disconnect` and when the socket ends, however it ends (a handler's error skips
        `disconnect`: an invoke would then go to a dead socket and wait out its time-out)."""
        client_socket_detach(self.channel_name)
        outage.socket_unwatch(self.channel_name)
        if getattr(self, "expiry", None) is not None:
            self.expiry.cancel()
        session_id = getattr(self, "session_id", None)
        if session_id is not None:
            session_socket_detach(session_id, self.channel_name)

    async def disconnect(self, code: int) -> None:
        self._process_forget()
        session_id = getattr(self, "session_id", None)
        if session_id is not None:
            if self.tools:
                # Before the calls are answered: the turn they resume must not offer this
                # closed tab's tools again (nor write while this delete runs).
                await _unregister(channel_name=self.channel_name)
        calls, self.calls = getattr(self, "calls", {}), {}
        for correlation_id, reply_to in calls.items():
            # Answered at once: the engine must not sit out its time-out for a closed tab.
            with contextlib.suppress(Exception):
                await client_tool_answer_send(
                    reply_to,
                    wire.client_tool_failure_message(
                        correlation_id=correlation_id, failure=WENT_AWAY
                    ),
                )
        # During an outage these fail like everything else: the layer forgets dead channels.
        groups = list(getattr(self, "auth_groups", []))
        if session_id is not None:
            groups.append(session_group(session_id))
        await self._layer_call(
            *(self.channel_layer.group_discard(group, self.channel_name) for group in groups)
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self.authenticated:
            return None
        if text_data is None:
            return await self.error(400, "frames must be JSON text")
        if len(text_data) > FRAME_MAX_CHARS:
            return await self.error(413, f"a frame may not exceed {FRAME_MAX_CHARS // 1024} KiB")
        if not self.inbound.take(max(len(text_data), INBOUND_FRAME_MIN_BYTES)):
            return await self.error(429, "too much data from this user's sockets; slow down")
        try:
            frame = json.loads(text_data)
        except ValueError:
            return await self.error(400, "the frame is not valid JSON")
        except RecursionError:
            return await self.error(400, "the frame nests too deeply")
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            return await self.error(400, "a frame must be a JSON object with a string type")
        if frame["type"] != wire.CLIENT_TOOL_RESULT and wire.holds_unpaired_surrogate(
            text_data, frame
        ):  # as the HTTP API refuses it (a result's call is answered: `client_tool_result`)
            return await self.error(400, f"the frame {wire.UNPAIRED_SURROGATE}")
        handler = self.handlers.get(frame["type"])
        if handler is None:
            return await self.error(400, f"unknown frame type {frame['type'][:64]!r}")
        self.frame_text = text_data  # an answer's checks are skipped or inline when it is small
        try:
            await handler(self, frame)
        except wire.FrameInvalid as exc:
            await self.error(400, str(exc))

    async def send_json(self, content: dict) -> None:
        """One frame to the page, handed to Daphne directly: Channels' `send_json` goes through
        three coroutines of its own (`encode_json`, and `send` twice) on every frame."""
        await self.base_send({"type": "websocket.send", "text": wire.json_text(content)})

    async def send_text(self, text: str) -> None:
        """A frame already encoded: a turn event of this process, as `chat.events` encodes it
        once for the SSE stream and every socket of the session (`wire.event_frame_text`)."""
        await self.base_send({"type": "websocket.send", "text": text})

    async def error(self, status: int, error: str, **extra: Any) -> None:
        await self.send_json(wire.error_frame(status, error, **extra))

    # --- client frames ----------------------------------------------------------------------

    async def session_bind(self, frame: dict) -> None:
        session = await _session_of_user(user=self.scope["user"], session=frame.get("session"))
        if session is None:
            # An unknown id and another user's session answer alike: nothing leaks.
            return await self.error(404, "session not found")
        if self.session_id != session.pk:
            if self.session_id is not None:
                session_socket_detach(self.session_id, self.channel_name)
                await self._layer_call(
                    self.channel_layer.group_discard(
                        session_group(self.session_id), self.channel_name
                    )
                )
            if not await self._layer_call(
                self.channel_layer.group_add(session_group(session.pk), self.channel_name)
            ):
                return await self._live_lost()
            session_socket_attach(session.pk, self.channel_name, self.send_text)
            self.session_id = session.pk
            if self.tools:
                # The tools belong to the tab, not the session: they follow it to the new one.
                await _register(
                    channel_name=self.channel_name, session_id=session.pk, tools=self.tools
                )
        await self.send_json(wire.session_bound_frame(session.pk))

    async def client_tool_register(self, frame: dict) -> None:
        if self.session_id is None:
            return await self.error(403, "requires a bound session")
        declared = wire.client_tool_register_parse(frame)["tools"]
        if len(declared) > TOOLS_PER_SOCKET_MAX:
            return await self.error(
                400, f"a socket may register at most {TOOLS_PER_SOCKET_MAX} tools"
            )
        if not self.registrations.take():
            wait = self.registrations.wait_seconds()
            return await self.error(
                429, f"too many registrations on this socket; try again in {wait:.1f} s"
            )
        try:
            checked = await checked_off_loop(
                client_tools_declare,
                declared,
                backend_names=backend_tool_names(),
                budget=REGISTRATION_BUDGET_SECONDS,
            )
        except CheckTooCostly:
            return await self.error(
                400,
                f"the declarations could not be checked within {REGISTRATION_BUDGET_SECONDS:g} s; "
                "nothing was registered",
            )
        for refused in checked.refused:
            await self.error(400, f"{refused.name}: {refused.reason}", tool=refused.name)
        self.tools = checked.tools
        await _register(
            channel_name=self.channel_name, session_id=self.session_id, tools=self.tools
        )
        await self.send_json(wire.client_tool_registered_frame([t.name for t in self.tools]))

    async def client_tool_result(self, frame: dict) -> None:
        result = wire.client_tool_result_parse(frame)
        correlation_id = result["correlationId"]
        reply_to = self.calls.pop(correlation_id, None)
        if wire.holds_unpaired_surrogate(self.frame_text, frame):
            # Refused, and its call answered at once: stored, it failed the turn.
            known = {"correlation_id": correlation_id[:64]} if reply_to is not None else {}
            await self.error(400, f"the frame {wire.UNPAIRED_SURROGATE}", **known)
            if reply_to is not None:
                failure = f"The client's answer was refused: it {wire.UNPAIRED_SURROGATE}."
                await client_tool_answer_send(
                    reply_to,
                    wire.client_tool_failure_message(
                        correlation_id=correlation_id, failure=failure
                    ),
                )
            return
        if reply_to is None:
            return await self.error(
                404, "unknown correlation id", correlation_id=correlation_id[:64]
            )
        answer = wire.client_tool_answer_message(
            result, error_max_chars=CLIENT_ERROR_MAX_CHARS, size=len(self.frame_text)
        )
        if "result" in answer and not text_within_bounds(self.frame_text):
            # Bounded (by its frame's text alone when that is short) before it is copied onto
            # the channel layer; the engine checks only the schema.
            problem = await _bounds_problem(answer["result"], size=len(self.frame_text))
            if problem:
                await self.error(413, problem, correlation_id=correlation_id[:64])
                answer = wire.client_tool_failure_message(
                    correlation_id=correlation_id,
                    failure=f"The client's answer was refused: {problem}.",
                )
        await client_tool_answer_send(reply_to, answer)

    handlers = {
        wire.SESSION_BIND: session_bind,
        wire.CLIENT_TOOL_REGISTER: client_tool_register,
        wire.CLIENT_TOOL_RESULT: client_tool_result,
    }

    # --- channel-layer messages (geosense.wire): one method per message type ----------------

    async def turn_event(self, message: wire.TurnEventMessage) -> None:
        if self.channel_name in message.get("delivered", ()):
            return  # handed over directly by a turn of this process (chat/events.py)
        await self.send_json(wire.event_frame(message))

    async def client_tool_invoke(self, message: wire.ClientToolInvokeMessage) -> None:
        self.calls[message["correlation_id"]] = message["reply_to"]
        await self.send_json(wire.client_tool_invoke_frame(message))

    async def auth_revoked(self, message: wire.AuthRevokedMessage) -> None:
        """The token was revoked or expired, or the user deactivated: nothing more is heard."""
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def annotations_changed(self, message: wire.AnnotationsChangedMessage) -> None:
        await self.send_json(wire.annotations_changed_frame(message))

    async def client_tool_forget(self, message: wire.ClientToolForgetMessage) -> None:
        """The engine stopped waiting (time-out, cancelled turn): the page may drop its card."""
        if self.calls.pop(message["correlation_id"], None) is not None:
            await self.send_json(wire.client_tool_cancelled_frame(message["correlation_id"]))
