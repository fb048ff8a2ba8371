"""An agent backed by any OpenAI-compatible chat-completions server (streaming, tools).

The request goes out on aiohttp directly: the `openai` SDK's request building (its options
models, httpx's request, header and URL objects, its decoding layers over the transport) cost
about 0.95 ms of CPU a request against 0.4 ms for aiohttp alone (issue 15: the event loop is
the ceiling of a process). What the SDK did for us is kept here, by its rules: the bearer key,
retries before the answer starts (`_post`), HTTP errors with the server's own words
(`_status_message`). The body is read as bytes and framed by `wire.SseDecoder`, then parsed
by `wire.ChunkParser`, because the servers people run stream in dialects a strict reader
rejects (docs/models.md, "How each server streams").

One client per configuration and event loop (`provider_client`: an `aiohttp.ClientSession`
and its connection pool), closed at shutdown (`provider_clients_close`). The body is
serialised on the loop whatever its length: orjson holds the GIL, so a worker thread running it
would hold the loop up as long and add its hop (~60 Python calls on the loop, a hand-over of
the GIL); the history window's budget bounds the body, and orjson writes even 4,000 distinct messages
(1.9 MB) in ~1.7 ms (issue 15 allows the loop 5 ms).

Three time-outs (docs/models.md): connecting (`connect_timeout`, each attempt), the first
bytes of the answer (`first_byte_timeout`, from the request's start, retries included) and any
gap in the body once the answer streams (`chunk_timeout`). Nothing is retried once the body
has begun: a stall ends the turn, and the engine keeps the text already shown, cut off.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import logging
import math
import random
import re
import time
import urllib.parse
import urllib.request
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp
import orjson

from .base import AgentChunk, AgentContext, AgentError
from .wire import ChunkParser, SseDecoder, SseEvent, Usage

logger = logging.getLogger(__name__)

# Retries of a request whose answer has not started: a failed connection, or HTTP 408, 409,
# 429 or 5xx (unless the server says `x-should-retry: false`), as the openai SDK retries.
MAX_RETRIES = 2
RETRY_DELAY_SECONDS = 0.5  # doubled at each retry, up to RETRY_DELAY_MAX, less up to a quarter
RETRY_DELAY_MAX = 8.0
RETRY_AFTER_MAX = 120.0  # a server asking to wait longer is not retried
RETRIED_STATUSES = frozenset({408, 409, 429})
# How long the body's end may take after `[DONE]` for the connection to be kept (`_body_end_read`).
BODY_END_SECONDS = 0.25
ERROR_BODY_BYTES = 64 * 1024  # what is read of an HTTP error's body for its message
CONNECTIONS_MAX = 1000  # as the SDK's pool: a process's requests in flight never queue here
KEEPALIVE_SECONDS = 5.0
USER_AGENT = f"GeoSense aiohttp/{aiohttp.__version__}"
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
    api_key: str = field(default="", repr=False)  # secrets: never in a log line or a repr
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    temperature: float | None = None
    max_tokens: int | None = None
    connect_timeout: float = 10.0
    first_byte_timeout: float = 60.0
    chunk_timeout: float = 30.0
    tool_choice: str | None = None
    vision: bool = True  # send pictures as image parts (GEOSENSE_LLM_VISION)

    @functools.cached_property
    def client_key(self) -> tuple[Any, ...]:
        """What the client itself holds (the model and sampling settings go in each body),
        made once: the configuration is kept from turn to turn (`agent_configured`)."""
        return (
            self.base_url,
            self.api_key,
            tuple(sorted(self.headers.items())),
            self.connect_timeout,
            self.first_byte_timeout,
            self.chunk_timeout,
        )


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
    """The request body as JSON bytes (UTF-8, compact), made on the loop (the module's
    docstring says why). What orjson refuses (an integer past 64 bits in a client tool's
    schema) `json` writes, in ASCII (escapes, so that even a lone surrogate it might meet is
    written, not raised)."""
    if not images:
        history = history_without_images(history)
    body = chat_request(config, history=history, tools=tools)
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


# --- the shared clients ----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelClient:
    """A configuration's connection pool (its headers, time-outs and proxy set once) and the
    address its requests go to."""

    session: aiohttp.ClientSession
    url: str
    proxy: str | None  # the environment's for `url`, passed per request (older aiohttp has no
    # session-wide proxy)


_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], ModelClient]
] = weakref.WeakKeyDictionary()


def _client_build(config: ProviderConfig) -> ModelClient:
    """The session for a configuration: cheap to build (aiohttp made its TLS context when it was
    imported, at the process's start), so it is built on the loop it belongs to.

    aiohttp's own time-outs bound the connection only (`connect_timeout`, each attempt);
    `_post` and `_EventReader` hold the first-byte and between-chunk ones. No cookies (a model
    API sets none, and a jar is looked at on every request); a proxy named by the environment
    (`HTTPS_PROXY`, `NO_PROXY`, as httpx read them) is looked up here once, not per request."""
    url = config.base_url.rstrip("/") + "/chat/completions"
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=CONNECTIONS_MAX, keepalive_timeout=KEEPALIVE_SECONDS),
        headers=_headers(config),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout, sock_connect=config.connect_timeout
        ),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    return ModelClient(session=session, url=url, proxy=_environment_proxy(url))


def _headers(config: ProviderConfig) -> dict[str, str]:
    """Every request's headers: the key as a bearer token (a placeholder without one, which
    servers that check nothing accept), then the configured headers, which replace a default
    of the same name in any case (`{"authorization": …}` or Azure's `api-key`)."""
    headers = {
        "Authorization": f"Bearer {config.api_key or 'not-needed'}",
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": USER_AGENT,
    }
    for name, value in config.headers.items():
        for default in [d for d in headers if d.lower() == name.lower()]:
            del headers[default]
        headers[name] = value
    return headers


def _environment_proxy(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


def provider_client(config: ProviderConfig) -> ModelClient:
    """This loop's client for the configuration, built at its first request. Its connection
    pool belongs to the loop, hence one per loop."""
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    key = config.client_key
    client = clients.get(key)
    if client is None:
        client = clients[key] = _client_build(config)
    return client


async def provider_clients_close() -> None:
    """Close this loop's clients (their pooled connections); the next turn builds anew."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.session.close()


# --- one request -----------------------------------------------------------------------------
class StatusError(Exception):
    """The server answered an HTTP error; `body` is its JSON, if it was JSON."""

    def __init__(self, status: int, body: object, headers: Mapping[str, str]) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers

    @property
    def message(self) -> str:
        return _status_message(self.status, self.body)


class StreamStalled(AgentError):
    """The answer had started and then nothing came for `chunk_timeout` seconds."""


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
        try:
            response, deadline = await self._open(history=history, tools=tools)
            reader = _EventReader(response, first_by=deadline, gap=self.config.chunk_timeout)
            try:
                while not parser.done and (events := await reader.read()) is not None:
                    for item in parser.feed_events(events):
                        yield item
                if parser.done:
                    await _body_end_read(response)
            finally:
                response.release()
        except (asyncio.CancelledError, AgentError):
            raise
        except StatusError as exc:
            raise AgentError(exc.message) from exc
        except TimeoutError as exc:
            raise AgentError("The language model server did not answer in time.") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AgentError(
                f"The language model stream broke off ({type(exc).__name__})."
            ) from exc
        for item in parser.close(done=parser.done):
            if isinstance(item, Usage):
                self.usage = item
            yield item
        if parser.finish_reason not in (None, "stop", "tool_calls", "function_call"):
            logger.warning("the model's answer ended with finish_reason=%s", parser.finish_reason)

    @property
    def accepts_images(self) -> bool:
        """Whether the history may carry pictures as image parts: GEOSENSE_LLM_VISION, unless
        this configuration's server refused an image before."""
        return self.config.vision and (not _images_refused or self._key not in _images_refused)

    @property
    def _key(self) -> tuple[str, str]:
        return (self.config.base_url, self.config.model)

    async def _open(
        self, *, history: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[aiohttp.ClientResponse, float]:
        """The streamed response and the deadline of its first bytes (the first-byte time-out
        from sending); a server that refuses the pictures (HTTP 400 or 422 naming image input)
        is asked once more with them in words, and is not sent pictures again."""
        client = provider_client(self.config)
        body = request_json(self.config, history=history, tools=tools)
        deadline = asyncio.get_running_loop().time() + self.config.first_byte_timeout
        try:
            return await _post(client, body, deadline=deadline), deadline
        except StatusError as exc:
            if not (
                exc.status in (400, 422)
                and has_images(history)
                and IMAGES_REFUSED_RE.search(exc.message)
            ):
                raise
            _images_refused.add(self._key)
            logger.warning(
                "%s refused an image (%s); pictures go to %s as words from now on",
                self.config.base_url,
                exc.message,
                self.config.model or "default",
            )
        body = request_json(self.config, history=history, tools=tools, images=False)
        deadline = asyncio.get_running_loop().time() + self.config.first_byte_timeout
        return await _post(client, body, deadline=deadline), deadline


async def _post(client: ModelClient, body: bytes, *, deadline: float) -> aiohttp.ClientResponse:
    """Send the body until the answer starts, within the first-byte deadline: a failed
    connection, and HTTP 408, 409, 429 and 5xx, are tried again up to MAX_RETRIES times after
    `_retry_delay` (the openai SDK's rules). A wait that would end past the deadline is not
    begun: the last failure is the answer (a rate limit's own words rather than a time-out)."""
    loop = asyncio.get_running_loop()
    retries_taken = 0
    while True:
        failure: Exception
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                response = await client.session.post(client.url, data=body, proxy=client.proxy)
                if response.status < 400:
                    return response
                failure = await _status_error(response)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if timeout.expired():
                raise TimeoutError from exc
            failure = exc
        if isinstance(failure, StatusError) and not _should_retry(failure):
            raise failure
        delay = _retry_delay(retries_taken, failure)
        if retries_taken == MAX_RETRIES or loop.time() + delay >= deadline:
            _give_up(failure)
        logger.info("retrying the model request in %.2f s (%s)", delay, _failure_name(failure))
        await asyncio.sleep(delay)
        retries_taken += 1


async def _status_error(response: aiohttp.ClientResponse) -> StatusError:
    """The error of an HTTP error answer, its body read (up to ERROR_BODY_BYTES) for the
    server's words; the response is released (its connection kept when the body was whole)."""
    data = b""
    try:
        while len(data) < ERROR_BODY_BYTES and (piece := await response.content.readany()):
            data += piece
    except (aiohttp.ClientError, OSError):
        data = b""  # a body that broke off: the status alone
    finally:
        response.release()
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        body = None
    return StatusError(response.status, body, response.headers)


def _should_retry(error: StatusError) -> bool:
    retry_after = _retry_after(error.headers)
    if retry_after is not None and retry_after > RETRY_AFTER_MAX:
        return False
    said = error.headers.get("x-should-retry")
    if said in ("true", "false"):
        return said == "true"
    return error.status in RETRIED_STATUSES or error.status >= 500


def _retry_delay(retries_taken: int, failure: Exception) -> float:
    """The server's `retry-after-ms` or `Retry-After` (seconds or an HTTP date) when it is
    between 0 and RETRY_AFTER_MAX; else 0.5 s doubled at each retry, at most 8 s, less a random
    quarter at most (jitter, so that failed requests do not all come back at once)."""
    if isinstance(failure, StatusError):
        retry_after = _retry_after(failure.headers)
        if retry_after is not None and 0 < retry_after <= RETRY_AFTER_MAX:
            return retry_after
    delay = min(RETRY_DELAY_SECONDS * 2.0**retries_taken, RETRY_DELAY_MAX)
    return delay * (1 - 0.25 * random.random())


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait before trying again, if it says (None if it does not)."""
    for name, unit in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / unit
        except ValueError:
            continue
        if not math.isnan(seconds):  # "inf" asks for longer than any wait: not retried
            return seconds
    try:
        when = email.utils.parsedate_to_datetime(headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


def _give_up(failure: Exception) -> NoReturn:
    """Raise the last failure of a request as the agent reports it: the server's HTTP error,
    a time-out (connecting), or any other failed connection as the stream that broke off."""
    if isinstance(failure, StatusError):
        raise failure
    if isinstance(failure, TimeoutError) or isinstance(
        getattr(failure, "os_error", None), TimeoutError
    ):
        raise TimeoutError from failure
    raise AgentError("The language model stream broke off (APIConnectionError).") from failure


def _failure_name(failure: Exception) -> str:
    return f"HTTP {failure.status}" if isinstance(failure, StatusError) else type(failure).__name__


class _EventReader:
    """The body's events as its bytes arrive: `read()` gives those of the next piece read (a
    list, maybe empty), then those the body's end completes, then None. The first piece comes
    by the first-byte deadline, each next within `gap` seconds of the wait for it (else a
    `TimeoutError`, or `StreamStalled` once one has come).

    What is buffered already is taken without a timer, and the wait is begun without first
    asking for nothing: the stream's count of the bytes it was fed (`total_bytes`) against
    those taken says which (an empty `read_nowait` is four of aiohttp's Python calls, and most
    reads after the first piece find nothing buffered)."""

    def __init__(self, response: aiohttp.ClientResponse, *, first_by: float, gap: float) -> None:
        self._content = response.content
        self._decoder = SseDecoder()
        self._first_by = first_by
        self._gap = gap
        self._taken = 0  # bytes of the body read so far
        self._ended = False

    async def read(self) -> list[SseEvent] | None:
        if self._ended:
            return None
        content = self._content
        if content.total_bytes != self._taken:
            chunk = content.read_nowait()
        else:
            started = self._taken > 0
            try:
                async with (
                    asyncio.timeout(self._gap) if started else asyncio.timeout_at(self._first_by)
                ):
                    chunk = await content.readany()
            except TimeoutError:
                if not started:
                    raise
                raise StreamStalled(
                    "The language model server stopped answering mid-way "
                    f"(nothing for {self._gap:g} s)."
                ) from None
        if not chunk:
            self._ended = True
            return self._decoder.close()
        self._taken += len(chunk)
        return self._decoder.feed(chunk)


async def _body_end_read(response: aiohttp.ClientResponse) -> None:
    """Read the body's end after `[DONE]` (servers send it right after), so that the response
    closes complete and its connection goes back to the pool: closed mid-body, the connection
    is dropped and every request opens a new one (a TCP connect, with TLS a handshake: ~5 % of
    the server's CPU at 200 users against the fake model, issue 15). A server that keeps the
    body open past `BODY_END_SECONDS` loses its connection. The end has usually arrived with
    `[DONE]` already: then nothing is read and no timer is set."""
    content = response.content
    if content.at_eof():
        return
    try:
        async with asyncio.timeout(BODY_END_SECONDS):
            while await content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass


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


def _status_message(status: int, body: object) -> str:
    """HTTP errors keep the server's own explanation: it usually says what to change."""
    message = f"The language model server answered HTTP {status}."
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
