"""An agent backed by any OpenAI-compatible chat-completions server (streaming, tools).

The request goes through the `openai` SDK (authentication, retries of a failed connection
before the answer starts, HTTP errors); the streamed body is read line by line and handed to
`wire.sse_events` and `wire.ChunkParser`, because the servers people run stream in dialects the
SDK's own stream reader hides or rejects (docs/models.md, "How each server streams").

One client per configuration and event loop (`provider_client`), built off the loop (it loads
the CA bundle: ~50 ms of CPU) and closed at shutdown (`provider_clients_close`). The body is
built and serialised to JSON in a worker thread and sent as bytes: the SDK's own parameter
transform walks every message on the event loop (2 s for 4,000 messages, issue 15).

Three time-outs (docs/models.md): connecting (`connect_timeout`, each attempt), the first line
of the answer (`first_byte_timeout`, from the request's start, retries included) and any gap
between lines once the answer streams (`chunk_timeout`). Nothing is retried once a line has
arrived: a stall ends the turn, and the engine keeps the text already shown, cut off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import openai

from .base import AgentChunk, AgentContext, AgentError
from .wire import DONE, ChunkParser, SseError, Usage, chunk_decode, server_error_message, sse_events

logger = logging.getLogger(__name__)

MAX_RETRIES = 2  # connection failures and 5xx before the answer starts
# How long the body's end may take after `[DONE]` for the connection to be kept (`_body_end_read`).
BODY_END_SECONDS = 0.25
TOOL_CHOICE_MODES = ("auto", "none", "required")
# A refusal that names image input: OpenAI's "image_url is only supported by certain models",
# vLLM's "is not a multimodal model", llama.cpp's "image input is not supported … mmproj".
IMAGES_REFUSED_RE = re.compile(r"image|multimodal|vision|mmproj", re.IGNORECASE)
# (base URL, model) of the configurations whose server refused an image, for this process: their
# requests carry pictures as words from then on.
_images_refused: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class ProviderConfig:
    """Where and how to ask the model (the GEOSENSE_LLM_* settings, validated at start-up)."""

    base_url: str
    model: str = ""
    api_key: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    temperature: float | None = None
    max_tokens: int | None = None
    connect_timeout: float = 10.0
    first_byte_timeout: float = 60.0
    chunk_timeout: float = 30.0
    tool_choice: str | None = None
    vision: bool = True  # send pictures as image parts (GEOSENSE_LLM_VISION)


def chat_request(
    config: ProviderConfig, *, history: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """The body of one streamed chat-completions request.

    `tool_choice` "required" or a tool's name applies to the first step of a turn only (the
    history ends with the user's message): on every step it would forbid the final answer.
    """
    body: dict[str, Any] = {
        "model": config.model or "default",
        "messages": history,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = tools
        choice = config.tool_choice
        first_step = bool(history) and history[-1].get("role") == "user"
        if choice in ("auto", "none") or (choice == "required" and first_step):
            body["tool_choice"] = choice
        elif choice and choice not in TOOL_CHOICE_MODES and first_step:
            if any(t.get("function", {}).get("name") == choice for t in tools):
                body["tool_choice"] = {"type": "function", "function": {"name": choice}}
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.max_tokens is not None:
        body["max_tokens"] = config.max_tokens
    return body


def request_json(
    config: ProviderConfig,
    *,
    history: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    images: bool = True,
) -> bytes:
    """The request body as JSON bytes: O(history), so the agent runs it in a worker thread."""
    if not images:
        history = history_without_images(history)
    body = chat_request(config, history=history, tools=tools)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# --- the shared clients ----------------------------------------------------------------------

_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], asyncio.Future[openai.AsyncOpenAI]]
] = weakref.WeakKeyDictionary()


def _client_key(config: ProviderConfig) -> tuple[Any, ...]:
    """What the client itself holds: the model and sampling settings go in each body."""
    return (
        config.base_url,
        config.api_key,
        tuple(sorted(config.headers.items())),
        config.connect_timeout,
        config.first_byte_timeout,
        config.chunk_timeout,
    )


def _client_build(config: ProviderConfig) -> openai.AsyncOpenAI:
    """The SDK's client on its aiohttp transport (`openai[aiohttp]`): httpcore's pool checks
    every kept connection on every request (a `getpeername` and two dicts each), so with 100
    requests in flight a request cost 2.2 ms of CPU against 0.95 ms on aiohttp's pool and C
    HTTP parser (issue 15, docs/benchmarks.md).

    The transport's read time-out bounds every wait for bytes, the first and those between
    chunks alike, so it is the larger of the two: `_post` and `_lines_timed` enforce each of
    them (with the first-byte one the smaller, a pause mid-stream would otherwise end at it)."""
    timeout = httpx2.Timeout(
        connect=config.connect_timeout,
        read=max(config.first_byte_timeout, config.chunk_timeout),
        write=config.first_byte_timeout,
        pool=config.connect_timeout,
    )
    return openai.AsyncOpenAI(
        base_url=config.base_url,
        api_key=config.api_key or "not-needed",
        timeout=timeout,
        max_retries=MAX_RETRIES,
        default_headers=dict(config.headers),
        http_client=openai.DefaultAioHttpClient(timeout=timeout),
    )


async def provider_client(config: ProviderConfig) -> openai.AsyncOpenAI:
    """This loop's client for the configuration: built once, in a worker thread (concurrent
    first turns wait for the same build). Its connection pool is the loop's, hence per loop."""
    loop = asyncio.get_running_loop()
    building = _clients.setdefault(loop, {})
    key = _client_key(config)
    future = building.get(key)
    if future is None:
        future = building[key] = asyncio.ensure_future(asyncio.to_thread(_client_build, config))
    try:
        return await asyncio.shield(future)
    except Exception:
        if building.get(key) is future:
            del building[key]
        raise


async def provider_clients_close() -> None:
    """Close this loop's clients (their pooled connections); the next turn builds anew."""
    building = _clients.pop(asyncio.get_running_loop(), {})
    for future in building.values():
        if future.done() and not future.cancelled() and future.exception() is None:
            await future.result().close()


class OpenAIAgent:
    def __init__(self, config: ProviderConfig) -> None:
        if not config.base_url:
            raise AgentError("GEOSENSE_LLM_BASE_URL is not set.")
        self.config = config
        self.usage: Usage | None = None  # of the last request, when the server reported it

    async def stream(
        self,
        *,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        context: AgentContext,
    ) -> AsyncIterator[AgentChunk]:
        """Stream text and reasoning as they come; yield the tool calls once the stream ends.

        The model reads everything from `history` (the overview is in the system prompt, the
        contexts follow their message's text), so `context` is not used here."""
        parser = ChunkParser()
        done = False
        try:
            async with AsyncExitStack() as stack:
                response, deadline = await self._open(stack, history=history, tools=tools)
                lines = _lines_timed(response, first_by=deadline, gap=self.config.chunk_timeout)
                async for event in _events(lines):
                    if isinstance(event, SseError):
                        raise AgentError(server_error_message(event.error))
                    if event.data == DONE:
                        done = True
                        break
                    for item in parser.feed(chunk_decode(event.data)):
                        yield item
                if done:
                    await _body_end_read(lines)
        except (asyncio.CancelledError, AgentError):
            raise
        except openai.APIStatusError as exc:
            raise AgentError(_status_message(exc)) from exc
        except (openai.APITimeoutError, httpx2.TimeoutException, TimeoutError) as exc:
            if _connection_failed(exc):
                raise AgentError(
                    "The language model stream broke off (APIConnectionError)."
                ) from exc
            raise AgentError("The language model server did not answer in time.") from exc
        except (
            openai.APIError,
            httpx2.HTTPError,
            aiohttp.ClientError,
            OSError,
            UnicodeDecodeError,
        ) as exc:
            raise AgentError(
                f"The language model stream broke off ({type(exc).__name__})."
            ) from exc
        for item in parser.close(done=done):
            if isinstance(item, Usage):
                self.usage = item
            yield item
        if parser.finish_reason not in (None, "stop", "tool_calls", "function_call"):
            logger.warning("the model's answer ended with finish_reason=%s", parser.finish_reason)

    @property
    def accepts_images(self) -> bool:
        """Whether the history may carry pictures as image parts: GEOSENSE_LLM_VISION, unless
        this configuration's server refused an image before."""
        return self.config.vision and self._key not in _images_refused

    @property
    def _key(self) -> tuple[str, str]:
        return (self.config.base_url, self.config.model)

    async def _open(
        self,
        stack: AsyncExitStack,
        *,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> tuple[httpx2.Response, float]:
        """The streamed response and the deadline of its first line (the first-byte time-out
        from sending); a server that refuses the pictures (HTTP 400 naming image input) is
        asked once more with them in words, and is not sent pictures again."""
        client = await provider_client(self.config)
        body = await asyncio.to_thread(request_json, self.config, history=history, tools=tools)
        deadline = asyncio.get_running_loop().time() + self.config.first_byte_timeout
        try:
            return await _post(stack, client, body, deadline=deadline), deadline
        except openai.APIStatusError as exc:
            if not (
                exc.status_code in (400, 422)
                and has_images(history)
                and IMAGES_REFUSED_RE.search(_status_message(exc))
            ):
                raise
            _images_refused.add(self._key)
            logger.warning(
                "%s refused an image (%s); pictures go to %s as words from now on",
                self.config.base_url,
                _status_message(exc),
                self.config.model or "default",
            )
        body = await asyncio.to_thread(
            request_json, self.config, history=history, tools=tools, images=False
        )
        deadline = asyncio.get_running_loop().time() + self.config.first_byte_timeout
        return await _post(stack, client, body, deadline=deadline), deadline


async def _post(
    stack: AsyncExitStack, client: openai.AsyncOpenAI, body: bytes, *, deadline: float
) -> httpx2.Response:
    """Send the serialised body; the SDK retries a failed connection or a 5xx until the
    response starts, all within the first-byte deadline. The response is closed with `stack`."""
    async with asyncio.timeout_at(deadline):
        response = await client.post(
            "/chat/completions",
            cast_to=httpx2.Response,
            content=body,
            options={"headers": {"Content-Type": "application/json"}},
            stream=True,
        )
    stack.push_async_callback(response.aclose)
    return response


class StreamStalled(AgentError):
    """The answer had started and then nothing came for `chunk_timeout` seconds."""


async def _lines_timed(
    response: httpx2.Response, *, first_by: float, gap: float
) -> AsyncIterator[str]:
    """The body's lines; the first by the first-byte deadline, each next within `gap`
    seconds of the one before (a `TimeoutError`, or `StreamStalled` once one has come)."""
    lines = response.aiter_lines().__aiter__()
    loop = asyncio.get_running_loop()
    when, started = first_by, False
    while True:
        try:
            async with asyncio.timeout_at(when):
                line = await anext(lines)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if not started:
                raise
            raise StreamStalled(
                f"The language model server stopped answering mid-way (nothing for {gap:g} s)."
            ) from None
        started = True
        yield line
        when = loop.time() + gap


async def _body_end_read(lines: AsyncIterator[str]) -> None:
    """Read the body's end after `[DONE]` (servers send it right after), so that the response
    closes complete and its connection goes back to the pool: closed mid-body, the connection
    was dropped and every request opened a new one (a TCP connect, with TLS a handshake: ~5 %
    of the server's CPU at 200 users against the fake model, issue 15). A server that keeps
    the body open past `BODY_END_SECONDS` loses its connection, as before."""
    try:
        async with asyncio.timeout(BODY_END_SECONDS):
            async for _ in lines:
                pass
    except (TimeoutError, AgentError, httpx2.HTTPError, OSError):
        pass


def _connection_failed(exc: BaseException) -> bool:
    """Whether a time-out the SDK reports is a connection that failed at once (refused, no
    route): the aiohttp transport maps every failed connection to a connect time-out."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectorError):
            return not isinstance(cause.os_error, TimeoutError)
        cause = cause.__cause__
    return False


def has_images(history: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m.get("content"), list)
        and any(p.get("type") == "image_url" for p in m["content"])
        for m in history
    )


def history_without_images(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same history for a model that takes no images: each message's text parts alone
    (chat/history.py describes every picture in the text, so this is exactly the history it
    builds without images)."""
    out = []
    for message in history:
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(p.get("text", "") for p in content if p.get("type") == "text")
            message = {**message, "content": text}
        out.append(message)
    return out


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[Any]:
    """`wire.sse_events` over an async line stream, one line at a time."""
    pending: list[str] = []
    async for line in lines:
        if line:
            pending.append(line)
            continue
        for event in sse_events([*pending, ""]):
            yield event
        pending = []
    for event in sse_events(pending):
        yield event


def _status_message(exc: openai.APIStatusError) -> str:
    """HTTP errors keep the server's own explanation: it usually says what to change."""
    message = f"The language model server answered HTTP {exc.status_code}."
    body = exc.body
    detail = None
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            detail = error.get("message")
        elif isinstance(error, str):
            detail = error
    if isinstance(detail, str) and detail.strip():
        detail = " ".join(detail.split())
        message += " " + (detail if len(detail) <= 300 else detail[:300] + "…")
    return message
