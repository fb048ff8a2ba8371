"""Helpers for tests that drive turns through the HTTP API in the test's own event loop."""

import json
from dataclasses import dataclass
from typing import Any

from django.test import AsyncClient

from chat.models import Message
from chat.turns import turns_settle
from tests.wire_shapes import event_problem


@dataclass(frozen=True)
class Streamed:
    status: int
    events: list[tuple[str, dict[str, Any]]]
    body: dict[str, Any] | None = None

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def of(self, name: str) -> list[dict[str, Any]]:
        return [data for event, data in self.events if event == name]

    @property
    def text(self) -> str:
        return "".join(d["delta"] for d in self.of("text_delta"))

    @property
    def message(self) -> dict[str, Any]:
        (message,) = self.of("message")
        return message


def sse_parse(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """The events of a stream; each must have its shape in `geosense.wire`."""
    events = []
    for block in raw.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name is not None:
            problem = event_problem(name, data)
            assert problem is None, f"the stream sent a malformed event: {problem}"
            events.append((name, data))
    return events


async def post_stream(
    client: AsyncClient, path: str, body: dict[str, Any], *, token: str
) -> Streamed:
    """POST and read the whole event stream (or the 4xx JSON answer)."""
    response = await client.post(
        path,
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    if not response.streaming:
        return Streamed(status=response.status_code, events=[], body=json.loads(response.content))
    chunks = [chunk async for chunk in response.streaming_content]
    await turns_settle()
    raw = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks).decode()
    return Streamed(status=response.status_code, events=sse_parse(raw))


async def scripted_stream(client: AsyncClient, caller: Any, monkeypatch: Any, launch: Any):
    """POST a message to `caller`'s session with the turn's engine replaced by `launch` (a
    scripted turn emitting events to its listener): the answer's chunks as text, as they come."""
    import chat.api

    monkeypatch.setattr(chat.api, "turn_launch", launch)
    response = await client.post(
        caller.url("/message/stream"),
        data=json.dumps({"text": "hi"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {caller.token}"},
    )
    async for chunk in response.streaming_content:
        yield chunk if isinstance(chunk, str) else chunk.decode()


def history_is_valid(history: list[dict[str, Any]]) -> bool:
    """Every assistant tool call has exactly one tool result after it, and no result is orphaned."""
    expected: list[str] = []
    seen: list[str] = []
    for message in history:
        if message["role"] == "assistant":
            expected += [c["id"] for c in message.get("tool_calls") or []]
        elif message["role"] == "tool":
            seen.append(message["tool_call_id"])
    return sorted(expected) == sorted(seen) and len(set(seen)) == len(seen)


def stored_history_is_valid(session_id: Any) -> bool:
    history = []
    for m in (
        Message.objects.filter(session_id=session_id).exclude(role=Message.Role.NOTE).order_by("id")
    ):
        if m.role == Message.Role.ASSISTANT:
            history.append(
                {"role": "assistant", "tool_calls": [{"id": c["id"]} for c in m.tool_calls]}
            )
        elif m.role == Message.Role.TOOL:
            history.append({"role": "tool", "tool_call_id": m.tool_call_id})
    return history_is_valid(history)
