"""Client tools: tools a browser tab declares on its session socket and answers itself.

A declaration is validated once, when the page registers it (`client_tool_declare`); the chat
core stores it per socket (`chat.models.ClientToolRegistration`), so every process can see
which socket of a session holds which tools. A blocking call crosses processes through the
channel layer: `client_tool_request` sends `client.tool.invoke` to the socket's channel and
waits for the `client.tool.answer` that the consumer sends back (docs/architecture.md, "Client
tools across processes"; the messages are defined in `geosense.wire`). Whatever happens, the
caller gets a `ClientAnswer`, never an exception: a refusal, a time-out or a socket that went
away are readable text for the model.
"""

import asyncio
import functools
import itertools
import json
import logging
import os
import re
import uuid
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from geosense.annotations.classes import class_plural
from geosense.annotations.selectors import annotations_missing
from geosense.wire import (
    CLIENT_TOOL_ANSWER,
    ClientToolAnswerMessage,
    ClientToolDeclaration,
    ClientToolKind,
    client_tool_declaration,
    client_tool_forget_message,
    client_tool_invoke_message,
)
from tools.registry import openai_function_spec
from tools.schemas import (
    SCHEMA_MAX_DEPTH,
    SchemaRefused,
    json_depth_exceeds,
    schema_check,
    schema_validator,
    size_within_bounds,
    validation_problem,
)
from tools.wording import ids_text, listing, missing_text, sentence

logger = logging.getLogger(__name__)

# OpenAI-compatible function names; the same rule keeps names safe in HTML ids and logs.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DESCRIPTION_MAX_CHARS = 1024
DECLARATION_MAX_BYTES = 16 * 1024
TOOLS_PER_SOCKET_MAX = 32
CLIENT_ERROR_MAX_CHARS = 1000
DECLARATION_FIELDS = frozenset(
    {"kind", "name", "description", "arguments", "result", "serve", "title", "summary"}
)
TITLE_MAX_CHARS = 80
SUMMARY_MAX_CHARS = 200

WENT_AWAY = "The client went away before answering."
UNREACHABLE = "The client could not be reached; its answer is unknown."


@dataclass(frozen=True)
class ClientTool:
    """A tool of the page. `description` is for the model; `title` and the `summary` template
    are for a person, as for backend tools (`summary_fill` reads the template)."""

    kind: ClientToolKind
    name: str
    description: str
    arguments: dict
    result: dict | None  # blocking only
    # Blocking only: True → the page answers by itself; False → the reader answers through a
    # card and the call becomes the turn's pending decision.
    serve: bool
    title: str = ""
    summary: str = ""

    def declaration(self) -> ClientToolDeclaration:
        """The declaration as registered (stored per socket, read back by every process)."""
        return client_tool_declaration(
            kind=self.kind,
            name=self.name,
            description=self.description,
            arguments=self.arguments,
            result=self.result,
            serve=self.serve,
            title=self.title,
            summary=self.summary,
        )

    @classmethod
    def from_declaration(cls, data: ClientToolDeclaration) -> "ClientTool":
        return cls(
            kind=data["kind"],
            name=data["name"],
            description=data["description"],
            arguments=data["arguments"],
            result=data.get("result"),
            serve=bool(data.get("serve", False)),
            title=data.get("title", ""),
            summary=data.get("summary", ""),
        )

    # Worded once per tool: a call reads it for its event and again for its stored result.
    @functools.cached_property
    def title_text(self) -> str:
        """The declared title, or the name in words for a page that declares none."""
        return self.title or sentence(" ".join(self.name.replace("-", "_").split("_")))

    def summary_of(self, arguments: dict) -> str:
        """The call's summary; none (without filling the template's parts) when the page
        declared none, as most do."""
        return summary_fill(self.summary, arguments) if self.summary else ""

    # Compiled once per tool: looking a validator up by its schema's text costs a canonical
    # JSON dump of the schema on every call (a served call checks both).
    @functools.cached_property
    def arguments_validator(self) -> Any:
        return schema_validator(self.arguments)

    @functools.cached_property
    def result_validator(self) -> Any:
        return schema_validator(self.result) if self.result is not None else None

    def openai_spec(self) -> dict:
        return openai_function_spec(
            name=self.name, description=self.description, parameters=self.arguments
        )

    async def arguments_problem(self, arguments: dict, *, size: int | None = None) -> str | None:
        """Why the model's arguments do not match the declaration, or None (checked within a
        deadline: the schema is the browser's, the arguments the model's; on the loop when
        `size`, the length of the arguments' JSON text, is small, else in the schema threads;
        the caps measured only when that text is not short enough to be within them).
        Arguments the summary shows as annotation ids (`{ids:ids}`) must not name deleted
        annotations: a page is never asked to show one (unknown ids are the page's to skip)."""
        problem = await validation_problem(
            schema=self.arguments,
            value=arguments,
            size=size,
            bounded=size is not None and size_within_bounds(size),
            validator=self.arguments_validator,
        )
        if problem:
            return problem
        ids = _annotation_ids(self.summary, arguments)
        if not ids:
            return None
        deleted, _ = await sync_to_async(annotations_missing)(ids=ids)
        return missing_text(deleted, []).rstrip(".") or None


class ClientToolRefused(ValueError):
    """A declaration the server will not register; `reason` is written for the page's author."""

    def __init__(self, *, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}" if name else reason)
        self.name = name
        self.reason = reason


def client_tool_declare(raw: object, *, backend_names: Collection[str]) -> ClientTool:
    """Validate one declaration from a `client-tool-register` frame.

    `ClientToolRefused.name` is the declared name when it is a string (even an invalid one),
    else "" (the caller then names the tool by its position).
    """
    if not isinstance(raw, Mapping):
        raise ClientToolRefused(name="", reason="a tool declaration must be a JSON object")
    name = raw.get("name")
    label = name[:64] if isinstance(name, str) else ""

    def refuse(reason: str) -> ClientToolRefused:
        return ClientToolRefused(name=label, reason=reason)

    if json_depth_exceeds(raw, SCHEMA_MAX_DEPTH + 1):
        raise refuse(f"the declaration nests deeper than {SCHEMA_MAX_DEPTH} levels")
    if len(json.dumps(raw, separators=(",", ":"))) > DECLARATION_MAX_BYTES:
        raise refuse(f"the declaration is larger than {DECLARATION_MAX_BYTES // 1024} KiB")
    unknown = sorted(set(raw) - DECLARATION_FIELDS)
    if unknown:
        raise refuse(f"unknown field {unknown[0]!r}")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise refuse("the name must be 1 to 64 letters, digits, underscores or hyphens")
    if name in backend_names:
        raise refuse("the name belongs to a backend tool; a client tool may not shadow it")
    kind = raw.get("kind")
    if kind not in ("blocking", "one-way"):
        raise refuse("kind must be 'blocking' or 'one-way'")
    description = raw.get("description")
    if not isinstance(description, str) or not description.strip():
        raise refuse("a description is required")
    if len(description) > DESCRIPTION_MAX_CHARS:
        raise refuse(f"the description is longer than {DESCRIPTION_MAX_CHARS} characters")
    serve = raw.get("serve", False)
    if not isinstance(serve, bool):
        raise refuse("serve must be true or false")
    title, summary = raw.get("title", ""), raw.get("summary", "")
    if not isinstance(title, str) or len(title) > TITLE_MAX_CHARS or "\n" in title:
        raise refuse(f"title must be one line of at most {TITLE_MAX_CHARS} characters")
    if not isinstance(summary, str) or len(summary) > SUMMARY_MAX_CHARS or "\n" in summary:
        raise refuse(f"summary must be one line of at most {SUMMARY_MAX_CHARS} characters")
    arguments = raw.get("arguments")
    try:
        schema_check(arguments, what="arguments", client=True)
        if arguments.get("type") != "object":
            raise SchemaRefused('arguments must describe an object ("type": "object")')
        result = raw.get("result")
        if kind == "one-way":
            if serve:
                raise SchemaRefused("a one-way tool is not answered, so it cannot be served")
            if result is not None:
                raise SchemaRefused("a one-way tool has no result")
        else:
            if result is None:
                raise SchemaRefused("a blocking tool needs a result schema")
            schema_check(result, what="result", client=True)
    except SchemaRefused as exc:
        raise refuse(str(exc)) from None
    problem = summary_problem(summary, arguments=arguments)
    if problem:
        raise refuse(problem)
    return ClientTool(
        kind=kind,
        name=name,
        description=description,
        arguments=dict(arguments),
        result=dict(result) if result is not None else None,
        serve=serve if kind == "blocking" else False,
        title=title.strip(),
        summary=summary.strip(),
    )


# --- the summary template -------------------------------------------------------------------
# `{name}` is an argument in words (a list as "a, b and c", true/false as yes/no), `{name:ids}`
# annotation ids ("#3, #4 and #5"), `{name:class}` a class name ("solar panels"); a `[…]` part
# is left out when an argument inside it is missing or empty. docs/protocol.md shows examples.

_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_-]{1,64})(?::(ids|class))?\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
VALUE_MAX_CHARS = 120


def _annotation_ids(template: str, arguments: Mapping) -> list[int]:
    """The integers of the arguments a summary template shows as ids (`{name:ids}`)."""
    found: list[int] = []
    for match in _PLACEHOLDER.finditer(template or ""):
        if match.group(2) != "ids":
            continue
        value = arguments.get(match.group(1))
        values = value if isinstance(value, list) else [value]
        found.extend(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return found


def summary_problem(template: str, *, arguments: Mapping) -> str | None:
    """Why a summary template cannot be used with these arguments, or None."""
    properties = arguments.get("properties") if isinstance(arguments, Mapping) else None
    names = set(properties) if isinstance(properties, Mapping) else set()
    for match in re.finditer(r"\{[^{}]*\}", template):
        placeholder = _PLACEHOLDER.fullmatch(match.group())
        if placeholder is None:
            return f"summary: {match.group()} is not {{argument}}, {{argument:ids}} or {{argument:class}}"
        if placeholder[1] not in names:
            return f"summary: {placeholder[1]!r} is not one of the tool's arguments"
    return None


def _words(value: object, form: str | None) -> str:
    if value is None or value == "" or value == []:
        return ""
    if form == "ids":
        items = value if isinstance(value, list) else [value]
        return ids_text(items)
    if isinstance(value, list):
        if form == "class":
            return listing(class_plural(str(v)) for v in value[:8])
        shown = [_words(v, None) for v in value[:8]]
        more = f" and {len(value) - 8:,} more" if len(value) > 8 else ""
        return (", ".join(shown) + more) if more else listing(shown)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ""
    text = " ".join(str(value).split())
    if form == "class":
        text = class_plural(text)
    return text if len(text) <= VALUE_MAX_CHARS else text[: VALUE_MAX_CHARS - 1] + "…"


def summary_fill(template: str, arguments: Mapping) -> str:
    """A call's summary: the template with the arguments in words (see above); each part of
    the template is filled once, so a value that looks like a placeholder stays text."""

    def fill(text: str) -> tuple[str, bool]:
        complete = True

        def one(match: re.Match) -> str:
            nonlocal complete
            words = _words(arguments.get(match[1]), match[2])
            complete = complete and bool(words)
            return words

        return _PLACEHOLDER.sub(one, text), complete

    parts, at = [], 0
    for optional in _OPTIONAL.finditer(template):
        parts.append(fill(template[at : optional.start()])[0])
        text, complete = fill(optional[1])
        parts.append(text if complete else "")
        at = optional.end()
    parts.append(fill(template[at:])[0])
    return " ".join("".join(parts).split())


@dataclass(frozen=True)
class Declared:
    """What one `client-tool-register` frame declared: the tools kept and the ones refused."""

    tools: list[ClientTool]
    refused: list[ClientToolRefused]


def client_tools_declare(declared: Sequence[object], *, backend_names: Collection[str]) -> Declared:
    """Validate a frame's declarations (the tools keep their order; a repeated name is refused).

    Costly: run it through `tools.schemas.checked_off_loop`, never on the event loop.
    `ClientToolRefused.name` is the tool's name, or `tools[i]` when it has none.
    """
    tools: dict[str, ClientTool] = {}
    refused: list[ClientToolRefused] = []
    for index, raw in enumerate(declared):
        try:
            tool = client_tool_declare(raw, backend_names=backend_names)
            if tool.name in tools:
                raise ClientToolRefused(name=tool.name, reason="the name is declared twice")
        except ClientToolRefused as exc:
            refused.append(ClientToolRefused(name=exc.name or f"tools[{index}]", reason=exc.reason))
            continue
        tools[tool.name] = tool
    return Declared(tools=list(tools.values()), refused=refused)


@dataclass(frozen=True)
class ClientToolset:
    """The tools one socket of a session offers, and the channel that reaches it.

    `elsewhere`: the socket is held by another process (reached through the channel layer);
    when False it is this process's, and a socket of this process that is no longer attached
    here (`client_socket_attach`) has gone: a call to it fails at once.
    """

    channel_name: str
    tools: dict[str, ClientTool]
    elsewhere: bool = True
    # The id of the process holding the socket, when known (chat.processes).
    process: object = None


@dataclass(frozen=True)
class ClientAnswer:
    ok: bool
    result: dict | None  # when ok
    error: str | None  # readable text for the model when not ok


# --- same-process delivery -------------------------------------------------------------------
# A socket and the turn that calls its tool usually share a process: the invoke, the answer
# and the forget are then handed over on the event loop, not published through the channel
# layer (a Redis round trip each way). The messages are the same `geosense.wire` dicts.

Deliver = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class _Attached:
    loop: asyncio.AbstractEventLoop
    invoke: Deliver
    forget: Deliver


_attached: dict[str, _Attached] = {}


def client_socket_attach(channel_name: str, *, invoke: Deliver, forget: Deliver) -> None:
    """A socket of this process takes its invokes and forgets directly (until detached)."""
    _attached[channel_name] = _Attached(
        loop=asyncio.get_running_loop(), invoke=invoke, forget=forget
    )


def client_socket_detach(channel_name: str) -> None:
    _attached.pop(channel_name, None)


def _attached_here(channel_name: str, loop: asyncio.AbstractEventLoop) -> _Attached | None:
    attached = _attached.get(channel_name)
    if attached is None or attached.loop is not loop:
        return None
    return attached


async def client_tool_answer_send(reply_to: str, message: dict) -> None:
    """Send a socket's answer (or failure) to the engine that waits for it: directly when the
    engine waits in this process, else through the channel layer."""
    replies = _replies_by_loop.get(asyncio.get_running_loop())
    if replies is not None and replies.channel == reply_to:
        _route(replies, message)
        return
    await get_channel_layer().send(reply_to, message)


@dataclass
class _Replies:
    """One reply channel per event loop, shared by every pending call of the process.

    A channel per call would leave a subscription behind on the Redis pub/sub layer after
    each answer (it only unsubscribes a channel whose receive is cancelled) and costs a
    subscribe round trip per call; one pump routing answers by correlation id has neither.
    """

    channel: str
    waiting: dict[str, asyncio.Future] = field(default_factory=dict)
    pump: asyncio.Task | None = None


_replies_by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Replies]" = (
    weakref.WeakKeyDictionary()
)
_replies_lock_by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = (
    weakref.WeakKeyDictionary()
)
_background: set[asyncio.Task] = set()


def _replies_running(loop: asyncio.AbstractEventLoop) -> _Replies | None:
    """This loop's reply channel when its pump runs (every call but the first): no lock, no
    coroutine."""
    replies = _replies_by_loop.get(loop)
    if replies is not None and replies.pump is not None and not replies.pump.done():
        return replies
    return None


async def _replies() -> _Replies:
    loop = asyncio.get_running_loop()
    lock = _replies_lock_by_loop.setdefault(loop, asyncio.Lock())
    async with lock:
        replies = _replies_by_loop.get(loop)
        if replies is None or replies.pump is None or replies.pump.done():
            layer = get_channel_layer()
            replies = _Replies(channel=await layer.new_channel(prefix="client-tool-replies."))
            replies.pump = loop.create_task(_pump(layer, replies))
            _replies_by_loop[loop] = replies
    return replies


def _route(replies: _Replies, message: dict) -> None:
    if message.get("type") != CLIENT_TOOL_ANSWER:
        return
    waiter = replies.waiting.pop(str(message.get("correlation_id")), None)
    if waiter is not None and not waiter.done():
        waiter.set_result(message)


async def _pump(layer, replies: _Replies) -> None:
    try:
        while True:
            _route(replies, await layer.receive(replies.channel))
    finally:
        # Whoever still waits hears it at once instead of at its deadline.
        for waiter in replies.waiting.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("the reply channel closed"))
        replies.waiting.clear()


def _forget_later(channel_name: str, correlation_id: str) -> None:
    """Tell the socket to drop a call the engine no longer awaits (best effort, not awaited)."""
    message = client_tool_forget_message(correlation_id)
    attached = _attached_here(channel_name, asyncio.get_running_loop())
    task = asyncio.ensure_future(
        attached.forget(message) if attached else get_channel_layer().send(channel_name, message)
    )
    _background.add(task)
    task.add_done_callback(_background.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def _answer_read(tool: ClientTool, message: ClientToolAnswerMessage) -> ClientAnswer:
    failure = message.get("failure")
    if isinstance(failure, str):
        return ClientAnswer(ok=False, result=None, error=failure)
    error = message.get("error")
    if error is not None:
        text = str(error)[:CLIENT_ERROR_MAX_CHARS]
        return ClientAnswer(ok=False, result=None, error=f"The client refused: {text}")
    result = message.get("result")
    if not isinstance(result, dict):
        return ClientAnswer(
            ok=False, result=None, error="The client's answer was not a JSON object."
        )
    if tool.result is not None:
        size = message.get("size")
        # The consumer refused an answer past the caps before passing it on (bounded).
        problem = await validation_problem(
            schema=tool.result,
            value=result,
            size=size if isinstance(size, int) else None,
            bounded=True,
            validator=tool.result_validator,
        )
        if problem:
            return ClientAnswer(
                ok=False,
                result=None,
                error=f"The client's answer does not match the result schema of {tool.name}: {problem}",
            )
    return ClientAnswer(ok=True, result=result, error=None)


REACHABLE_CHECK_SECONDS = 2.0

# A correlation id only has to be unique: a page can answer only the calls its own socket
# holds, and answers are routed within the process that waits. A random prefix per process
# (drawn again in a forked child) and a counter, rather than uuid4 per call (a getrandom
# system call each).
_correlation_numbers = itertools.count()


def _correlation_prefix_draw() -> None:
    global _correlation_prefix
    _correlation_prefix = uuid.uuid4().hex[:16]


_correlation_prefix_draw()
os.register_at_fork(after_in_child=_correlation_prefix_draw)


def _correlation_id() -> str:
    return f"{_correlation_prefix}{next(_correlation_numbers):016x}"


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _retrieved(task: asyncio.Future) -> None:
    """Mark a left-behind check's error as seen (the answer won; asyncio would log it)."""
    if not task.cancelled():
        task.exception()


async def _answered_or_gone(
    waiter: asyncio.Future, reachable: Callable[[], Awaitable[bool]] | None
) -> bool:
    """Wait for the answer (True), or until `reachable` says the socket is gone (False); the
    waiter's time-out (`_expire`) is raised here."""
    if reachable is None:
        # Awaited directly: the answer wakes the caller in the loop's next round, not the
        # round after (asyncio.wait would wake a future of its own first).
        await waiter  # an error of the reply channel is raised here
        return True
    while True:
        done, _ = await asyncio.wait({waiter}, timeout=REACHABLE_CHECK_SECONDS)
        if not done:
            # The check runs beside the waiter: its database read can queue for a while under
            # load, and an answer or the time-out coming meanwhile must not wait for it.
            check = asyncio.ensure_future(reachable())
            check.add_done_callback(_retrieved)
            try:
                done, _ = await asyncio.wait({waiter, check}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                check.cancel()
            if waiter not in done:
                if check.result():
                    continue
                return False
        waiter.result()
        return True


# The time-out is part of the answer (readable text for the model), not a cancellation.
async def client_tool_request(
    *,
    channel_name: str,
    tool: ClientTool,
    arguments: dict,
    timeout: float,  # noqa: ASYNC109
    elsewhere: bool = True,
    reachable: Callable[[], Awaitable[bool]] | None = None,
) -> ClientAnswer:
    """Invoke a blocking tool on the socket `channel_name` and await its answer.

    A socket attached in this process gets the invoke directly; one held `elsewhere` through
    the channel layer; one that should be here but is not (it closed) fails at once. Answers
    within `timeout` seconds whatever the page does. Cancelling the caller leaves nothing
    waiting here and tells the socket to forget the call. `reachable`, asked every
    `REACHABLE_CHECK_SECONDS` while the answer is awaited: False (the socket's process stopped
    heartbeating) answers at once that the client could not be reached.
    """
    loop = asyncio.get_running_loop()  # a `getpid` system call on CPython 3.11: once a call
    attached = _attached_here(channel_name, loop)
    if attached is None and not elsewhere:
        return ClientAnswer(ok=False, result=None, error=WENT_AWAY)
    replies = _replies_running(loop) or await _replies()
    correlation_id = _correlation_id()
    waiter = loop.create_future()
    replies.waiting[correlation_id] = waiter
    answered = False
    invoke = client_tool_invoke_message(
        correlation_id=correlation_id,
        reply_to=replies.channel,
        name=tool.name,
        arguments=arguments,
    )
    expiry = None
    try:
        try:
            if attached is not None:
                await attached.invoke(invoke)
            else:
                await get_channel_layer().send(channel_name, invoke)
        except Exception:  # a full channel or a layer that is down: the socket never sees it
            logger.warning("could not send a client-tool invoke to %s", channel_name, exc_info=True)
            answered = True  # nothing reached the socket, so there is nothing to forget
            return ClientAnswer(ok=False, result=None, error=UNREACHABLE)
        # A timer on the waiter itself: `asyncio.timeout` costs a context manager, its own
        # timer and the task's cancellation bookkeeping on every call.
        expiry = loop.call_later(timeout, _expire, waiter)
        if not await _answered_or_gone(waiter, reachable):
            answered = True  # its process is gone: nobody is left to tell
            return ClientAnswer(ok=False, result=None, error=UNREACHABLE)
        message = waiter.result()
        answered = True
        return await _answer_read(tool, message)
    except TimeoutError:
        return ClientAnswer(
            ok=False, result=None, error=f"No answer from the client within {timeout:g} seconds."
        )
    except ConnectionError:
        return ClientAnswer(ok=False, result=None, error=UNREACHABLE)
    finally:
        if expiry is not None:
            expiry.cancel()
        replies.waiting.pop(correlation_id, None)
        if not answered:
            _forget_later(channel_name, correlation_id)
