"""A scripted OpenAI-compatible chat-completions server for tests.

It speaks the wire format of `POST /v1/chat/completions` (streaming Server-Sent Events and
plain JSON) and `GET /v1/models`, so the real `openai` client and the app's openai agent run
against it unchanged. Tests queue responses; each request takes the next one (the default text
when the queue is empty) and every request body is recorded, so a test can check the history
the model was fed. It runs in a thread of the test process and on a loopback port, which a
live Daphne process reaches through `GEOSENSE_LLM_BASE_URL`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-model"
DEFAULT_TEXT = "This is the fake model's default answer."


@dataclass(frozen=True)
class Text:
    """Assistant text, streamed as `chunks` content deltas of about equal size."""

    text: str
    chunks: int = 1


@dataclass(frozen=True)
class ToolCalls:
    """Tool calls `(id, name, arguments)`; each call's JSON arguments arrive in several chunks,
    and the calls carry distinct `index` values as parallel calls do."""

    calls: tuple[tuple[str, str, dict[str, Any] | str], ...]
    argument_chunks: int = 3


@dataclass(frozen=True)
class Pause:
    """Wait before the next step (a slow model, or a stall mid-stream). A response that starts
    with a pause sends nothing before it, not even its headers (a model that has not begun)."""

    seconds: float


@dataclass(frozen=True)
class BreakOff:
    """Close the connection here, without a finish reason and without `data: [DONE]`."""


@dataclass(frozen=True)
class Status:
    """Answer with this HTTP error status and an OpenAI-style JSON error body instead."""

    code: int
    message: str = "the fake model failed"


@dataclass(frozen=True)
class Raw:
    """A recorded stream body, sent byte for byte (one write per event), then the end of the
    body: the dialect fixtures of tests/fakes/dialects/ replay real servers' streams this way."""

    body: bytes


Step = Text | ToolCalls | Pause | BreakOff | Status | Raw


@dataclass
class Response:
    steps: tuple[Step, ...]


def _split(text: str, parts: int) -> list[str]:
    parts = max(1, min(parts, len(text) or 1))
    size, extra = divmod(len(text), parts)
    pieces, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


@dataclass
class FakeOpenAI:
    """The server plus its script. Start once per test session; `reset()` between tests."""

    default_text: str = DEFAULT_TEXT
    # What the usage chunk of each streamed answer reports: (prompt, completion) tokens.
    usage: tuple[int, int] = (1, 1)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(
        default_factory=list
    )  # of each request, names lower-cased
    _queue: deque[Response] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> FakeOpenAI:
        self._server = FakeHTTPServer(("127.0.0.1", 0), _handler_for(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.headers.clear()
            self.default_text = DEFAULT_TEXT
            self.usage = (1, 1)

    @property
    def base_url(self) -> str:
        """What the openai client takes as `base_url` (it appends `/chat/completions`)."""
        assert self._server is not None, "the fake server is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # --- the script ------------------------------------------------------------------------
    def reply(self, *steps: Step) -> None:
        """Queue one response made of these steps, for the next request."""
        with self._lock:
            self._queue.append(Response(steps=steps))

    def reply_text(self, text: str, *, chunks: int = 1) -> None:
        self.reply(Text(text, chunks))

    def reply_tool_calls(
        self,
        calls: list[tuple[str, str, dict[str, Any] | str]],
        *,
        text: str = "",
        argument_chunks: int = 3,
    ) -> None:
        """Queue a response that calls tools (optionally after some text). Arguments given as
        a string are sent verbatim, so a test can feed the app malformed JSON."""
        steps: list[Step] = [Text(text)] if text else []
        steps.append(ToolCalls(tuple(calls), argument_chunks))
        self.reply(*steps)

    def fail(self, status: int = 500, *, message: str = "the fake model failed") -> None:
        self.reply(Status(status, message))

    def break_off(
        self, *, after_chunks: int = 2, text: str = "This answer is cut off mid-way"
    ) -> None:
        """Queue a stream that sends `after_chunks` text chunks and then drops the connection."""
        pieces = _split(text, after_chunks + 1)
        self.reply(Text("".join(pieces[:after_chunks]), after_chunks), BreakOff())

    def next_response(
        self, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Response:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers or {})
            if self._queue:
                return self._queue.popleft()
            return Response(steps=(Text(self.default_text),))

    @property
    def pending(self) -> int:
        """Responses queued and not yet taken by a request."""
        with self._lock:
            return len(self._queue)


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        owner = fake

    return Handler


class FakeHTTPServer(ThreadingHTTPServer):
    """A thread per connection, and a listen backlog of a real model server's (uvicorn's, which
    vLLM serves on: 2048) rather than socketserver's 5: an engine opening its connections
    together (bench/load.py: 200 turns begin at once, ~100 connections in aiohttp's pool) had
    all but a few of their SYNs dropped, each connecting again after TCP's 1 s
    retransmission, which the bench measured as the turns' latency."""

    daemon_threads = True
    request_queue_size = 2048


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Each event is written as it is made, as model servers stream (uvicorn, Go's net/http and
    # Node set TCP_NODELAY): with Nagle's algorithm on a kept-alive connection, every small
    # write after the first waited for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    owner: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test output is for the tests."""

    # --- routes ----------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            self._json(HTTPStatus.NOT_FOUND, _error("not found", "invalid_request_error"))
            return
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "geosense-tests"}
        self._json(HTTPStatus.OK, {"object": "list", "data": [model]})

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client closed a kept-alive connection: nothing to answer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(HTTPStatus.NOT_FOUND, _error("not found", "invalid_request_error"))
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._json(HTTPStatus.BAD_REQUEST, _error("body is not JSON", "invalid_request_error"))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        response = self.owner.next_response(body, headers)
        while response.steps and isinstance(response.steps[0], Pause):
            time.sleep(response.steps[0].seconds)
            response = Response(steps=response.steps[1:])
        for step in response.steps:
            if isinstance(step, Status):
                self._json(step.code, _error(step.message, "server_error"))
                return
        try:
            if len(response.steps) == 1 and isinstance(response.steps[0], Raw):
                self._raw(response.steps[0])
            elif body.get("stream"):
                self._stream(body, response)
            else:
                self._complete(body, response)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-answer (a cancelled turn): nothing left to tell it.
            self.close_connection = True

    # --- answers ---------------------------------------------------------------------------
    def _stream(self, body: dict[str, Any], response: Response) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = _ChunkMaker(model=body.get("model") or MODEL)
        self._event(chunk.make({"role": "assistant", "content": ""}))
        finish = "stop"
        for step in response.steps:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
            elif isinstance(step, BreakOff):
                self._break()
                return
            elif isinstance(step, Text):
                for piece in _split(step.text, step.chunks):
                    self._event(chunk.make({"content": piece}))
            elif isinstance(step, ToolCalls):
                finish = "tool_calls"
                for index, (call_id, name, arguments) in enumerate(step.calls):
                    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                    head = {"index": index, "id": call_id, "type": "function"}
                    head["function"] = {"name": name, "arguments": ""}
                    self._event(chunk.make({"tool_calls": [head]}))
                    for piece in _split(text, step.argument_chunks):
                        part = {"index": index, "function": {"arguments": piece}}
                        self._event(chunk.make({"tool_calls": [part]}))
        self._event(chunk.make({}, finish_reason=finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event(chunk.usage(*self.owner.usage))
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _raw(self, step: Raw) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in re.findall(rb".*?\n\n|.+\Z", step.body, re.S):
            self._write_chunk(event)
        self._write_chunk(b"")

    def _complete(self, body: dict[str, Any], response: Response) -> None:
        content, tool_calls = "", []
        for step in response.steps:
            if isinstance(step, Pause):
                time.sleep(step.seconds)
            elif isinstance(step, BreakOff):
                self._break()
                return
            elif isinstance(step, Text):
                content += step.text
            elif isinstance(step, ToolCalls):
                for call_id, name, arguments in step.calls:
                    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                    function = {"name": name, "arguments": text}
                    tool_calls.append({"id": call_id, "type": "function", "function": function})
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "logprobs": None}
        choice["finish_reason"] = "tool_calls" if tool_calls else "stop"
        self._json(
            HTTPStatus.OK,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL,
                "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    # --- wire helpers ----------------------------------------------------------------------
    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _event(self, payload: dict[str, Any]) -> None:
        self._write_chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _break(self) -> None:
        """Drop the connection inside the chunked body: the client sees an incomplete read."""
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


@dataclass
class _ChunkMaker:
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: f"chatcmpl-fake-{time.monotonic_ns()}")

    def _base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    def make(self, delta: dict[str, Any], *, finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base(), "choices": [choice]}

    def usage(self, prompt: int = 1, completion: int = 1) -> dict[str, Any]:
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return {**self._base(), "choices": [], "usage": usage}
