"""The session socket (`/ws/chat/`): one per browser tab, bound to one chat session.

It relays the bound session's live turn events to the page and carries client-tool calls
between the turn engine (any process, through the channel layer) and the page. Frames are
described in docs/protocol.md; validation and storage live in tools/client.py.
"""

import contextlib
import json
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chat.events import session_group
from chat.models import ChatSession
from tools.client import (
    CLIENT_ERROR_MAX_CHARS,
    CLIENT_TOOL_ANSWER,
    TOOLS_PER_SOCKET_MAX,
    WENT_AWAY,
    ClientTool,
    ClientToolRefused,
    client_tool_declare,
    client_tools_register,
    client_tools_unregister,
)

FRAME_MAX_CHARS = 256 * 1024
CLOSE_UNAUTHENTICATED = 4401


def _backend_names() -> frozenset[str]:
    # Imported late: the backend registry pulls in the annotations services.
    from tools.registry import backend_tool_names

    return backend_tool_names()


@database_sync_to_async
def _session_of_user(*, user, session: object) -> ChatSession | None:
    try:
        session_id = uuid.UUID(str(session))
    except ValueError:
        return None
    return ChatSession.objects.filter(pk=session_id, user=user).first()


@database_sync_to_async
def _register(*, channel_name: str, session_id, tools: list[ClientTool]) -> None:
    client_tools_register(channel_name=channel_name, session_id=session_id, tools=tools)


@database_sync_to_async
def _unregister(*, channel_name: str) -> None:
    client_tools_unregister(channel_name=channel_name)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """Dispatches each client frame on its `type`; group and layer messages by their name."""

    async def connect(self) -> None:
        self.session_id: uuid.UUID | None = None
        self.tools: list[ClientTool] = []
        # correlation id → the engine's reply channel, for calls the page has not answered
        self.calls: dict[str, str] = {}
        user = self.scope.get("user")
        self.authenticated = bool(user is not None and user.is_authenticated)
        # Accept, then close with a code the page can read (a refused handshake has none).
        await self.accept()
        if not self.authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        calls, self.calls = getattr(self, "calls", {}), {}
        for correlation_id, reply_to in calls.items():
            # Answered at once: the engine must not sit out its time-out for a closed tab.
            with contextlib.suppress(Exception):
                await self.channel_layer.send(
                    reply_to,
                    {
                        "type": CLIENT_TOOL_ANSWER,
                        "correlation_id": correlation_id,
                        "failure": WENT_AWAY,
                    },
                )
        if getattr(self, "session_id", None) is not None:
            await self.channel_layer.group_discard(
                session_group(self.session_id), self.channel_name
            )
            if self.tools:
                await _unregister(channel_name=self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self.authenticated:
            return None
        if text_data is None:
            return await self.error(400, "frames must be JSON text")
        if len(text_data) > FRAME_MAX_CHARS:
            return await self.error(413, f"a frame may not exceed {FRAME_MAX_CHARS // 1024} KiB")
        try:
            frame = json.loads(text_data)
        except ValueError:
            return await self.error(400, "the frame is not valid JSON")
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            return await self.error(400, "a frame must be a JSON object with a string type")
        handler = self.handlers.get(frame["type"])
        if handler is None:
            return await self.error(400, f"unknown frame type {frame['type'][:64]!r}")
        await handler(self, frame)

    async def error(self, status: int, error: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "status": status, "error": error, **extra})

    # --- client frames ----------------------------------------------------------------------

    async def session_bind(self, frame: dict) -> None:
        session = await _session_of_user(user=self.scope["user"], session=frame.get("session"))
        if session is None:
            # An unknown id and another user's session answer alike: nothing leaks.
            return await self.error(404, "session not found")
        if self.session_id != session.pk:
            if self.session_id is not None:
                await self.channel_layer.group_discard(
                    session_group(self.session_id), self.channel_name
                )
            await self.channel_layer.group_add(session_group(session.pk), self.channel_name)
            self.session_id = session.pk
            if self.tools:
                # The tools belong to the tab, not the session: they follow it to the new one.
                await _register(
                    channel_name=self.channel_name, session_id=session.pk, tools=self.tools
                )
        await self.send_json({"type": "session-bound", "session": str(session.pk)})

    async def client_tool_register(self, frame: dict) -> None:
        if self.session_id is None:
            return await self.error(403, "requires a bound session")
        declared = frame.get("tools")
        if not isinstance(declared, list):
            return await self.error(400, "client-tool-register needs a list of tools")
        if len(declared) > TOOLS_PER_SOCKET_MAX:
            return await self.error(
                400, f"a socket may register at most {TOOLS_PER_SOCKET_MAX} tools"
            )
        backend_names = _backend_names()
        tools: dict[str, ClientTool] = {}
        for index, raw in enumerate(declared):
            try:
                tool = client_tool_declare(raw, backend_names=backend_names)
                if tool.name in tools:
                    raise ClientToolRefused(name=tool.name, reason="the name is declared twice")
            except ClientToolRefused as exc:
                name = exc.name or f"tools[{index}]"
                await self.error(400, f"{name}: {exc.reason}", tool=name)
                continue
            tools[tool.name] = tool
        self.tools = list(tools.values())
        await _register(
            channel_name=self.channel_name, session_id=self.session_id, tools=self.tools
        )
        await self.send_json({"type": "client-tool-registered", "tools": list(tools)})

    async def client_tool_result(self, frame: dict) -> None:
        correlation_id = frame.get("correlationId")
        has_result, has_error = "result" in frame, "error" in frame
        if not isinstance(correlation_id, str) or has_result == has_error:
            return await self.error(
                400, "client-tool-result needs a correlationId and exactly one of result or error"
            )
        if has_result and not isinstance(frame["result"], dict):
            return await self.error(400, "result must be a JSON object")
        if has_error and not isinstance(frame["error"], str):
            return await self.error(400, "error must be a string")
        reply_to = self.calls.pop(correlation_id, None)
        if reply_to is None:
            return await self.error(
                404, "unknown correlation id", correlationId=correlation_id[:64]
            )
        answer: dict[str, Any] = {"type": CLIENT_TOOL_ANSWER, "correlation_id": correlation_id}
        if has_result:
            answer["result"] = frame["result"]
        else:
            answer["error"] = frame["error"][:CLIENT_ERROR_MAX_CHARS]
        await self.channel_layer.send(reply_to, answer)

    handlers = {
        "session-bind": session_bind,
        "client-tool-register": client_tool_register,
        "client-tool-result": client_tool_result,
    }

    # --- channel-layer messages -------------------------------------------------------------

    async def turn_event(self, message: dict) -> None:
        await self.send_json({"type": "event", "event": message["event"], "data": message["data"]})

    async def client_tool_invoke(self, message: dict) -> None:
        self.calls[message["correlation_id"]] = message["reply_to"]
        await self.send_json(
            {
                "type": "client-tool-invoke",
                "correlationId": message["correlation_id"],
                "name": message["name"],
                "arguments": message["arguments"],
            }
        )

    async def client_tool_forget(self, message: dict) -> None:
        """The engine stopped waiting (time-out, cancelled turn): the page may drop its card."""
        if self.calls.pop(message["correlation_id"], None) is not None:
            await self.send_json(
                {"type": "client-tool-cancelled", "correlationId": message["correlation_id"]}
            )
