"""What the scale tests use to talk to the Daphne processes: the HTTP API (JSON and SSE, with a
bearer token) and session sockets, as an API client and a browser tab would."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import websockets

from tests.chat.helpers import Streamed, sse_parse

TIMEOUT = 30


@dataclass(frozen=True)
class Api:
    """The HTTP API of one user, against whichever process a call names by its base URL."""

    token: str

    def request(
        self, base: str, method: str, path: str, body: dict | None = None
    ) -> tuple[int, Any]:
        request = urllib.request.Request(
            base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                raw = response.read().decode()
                if response.headers.get_content_type() == "text/event-stream":
                    return response.status, raw
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode()
            try:
                return exc.code, json.loads(raw or "null")
            except ValueError:  # a server error page, not the API's JSON
                return exc.code, {"error": raw[:2000]}

    def stream(self, base: str, path: str, body: dict) -> Streamed:
        """POST and read the whole event stream (or the 4xx JSON answer)."""
        status, answer = self.request(base, "POST", path, body)
        if isinstance(answer, str):
            return Streamed(status=status, events=sse_parse(answer))
        return Streamed(status=status, events=[], body=answer)

    def session_create(self, base: str, *, allow_backend_tools: bool = False) -> str:
        status, session = self.request(base, "POST", "/api/sessions", {"title": "scale"})
        assert status == 201, session
        if allow_backend_tools:
            status, _ = self.request(
                base, "PATCH", f"/api/sessions/{session['id']}", {"allow_backend_tools": True}
            )
            assert status == 200
        return session["id"]

    def say(self, base: str, session: str, text: str) -> Streamed:
        return self.stream(base, f"/api/sessions/{session}/message/stream", {"text": text})

    def resume(self, base: str, session: str, body: dict) -> Streamed:
        return self.stream(base, f"/api/sessions/{session}/message/resume/stream", body)

    def messages(self, base: str, session: str) -> list[dict]:
        status, data = self.request(base, "GET", f"/api/sessions/{session}")
        assert status == 200, data
        return data["messages"]


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws/chat/"


@dataclass
class Tab:
    """A session socket, as a browser tab holds one."""

    ws: Any

    async def frame(self) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout=TIMEOUT))

    async def until(self, done: Callable[[dict], bool]) -> list[dict]:
        """Frames up to and including the first one `done` accepts."""
        seen = []
        while True:
            seen.append(await self.frame())
            if done(seen[-1]):
                return seen

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def answer(self, invoke: dict, result: dict) -> None:
        await self.send(
            {
                "type": "client-tool-result",
                "correlationId": invoke["correlationId"],
                "result": result,
            }
        )


@asynccontextmanager
async def tab(
    base: str, api: Api, session: str, tools: list[dict] | None = None
) -> AsyncIterator[Tab]:
    """A socket to the process at `base`, bound to `session`, with `tools` registered."""
    async with websockets.connect(
        ws_url(base), additional_headers={"Authorization": f"Bearer {api.token}"}
    ) as ws:
        opened = Tab(ws)
        await opened.send({"type": "session-bind", "session": session})
        assert await opened.frame() == {"type": "session-bound", "session": session}
        if tools:
            await opened.send({"type": "client-tool-register", "tools": tools})
            registered = await opened.frame()
            assert registered["type"] == "client-tool-registered", registered
        yield opened


def is_invoke(frame: dict) -> bool:
    return frame["type"] == "client-tool-invoke"


def is_turn_end(frame: dict) -> bool:
    return frame.get("event") == "turn_end"


def events_of(frames: list[dict]) -> list[str]:
    return [f["event"] for f in frames if f["type"] == "event"]
