"""Every shape that crosses a socket or a process, spelled out once.

Three wires, described for users in docs/protocol.md:
- **socket frames** between the page and the consumer of `/ws/chat/`;
- **channel-layer messages** between the turn engine and the consumer that holds a socket
  (`client.tool.*`), from the engine to a session's sockets (`turn.event`), and from
  `/healthz` to its own process (`health.ping`);
- **turn events**, the same on the SSE stream of `…/message/stream` and in `event` frames.

Each shape is a `TypedDict` here, and every frame and message is built by a function here, so
no other module writes one as a dict literal (tests/test_code_shape.py checks that the type
names appear nowhere else). The page's side is `static/geosense/wire.js`: JSDoc typedefs of the
same shapes and builders of the frames the page sends; tests/test_wire.py checks that both
sides name the same events, frames and context types.

Nothing here imports from the rest of GeoSense: every layer may use it.
"""

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring
from typing import Any, Literal, NotRequired, TypedDict, get_args

import orjson

# --- data contexts --------------------------------------------------------------------------

ContextType = Literal["visibility", "position", "image", "selection"]
#: Every context a user message may carry (`POST …/message/stream`, `contexts`).
CONTEXT_TYPES: tuple[ContextType, ...] = get_args(ContextType)
#: The contexts the map gives and a question option may ask for (`context="…"`); `selection`
#: is the page's own (a find-similar search's result).
MAP_CONTEXT_TYPES: tuple[ContextType, ...] = ("visibility", "position", "image")
#: At most this many contexts per message.
CONTEXTS_MAX = 8


# A JSON escape of a UTF-16 surrogate: only then can a string hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
UNPAIRED_SURROGATE = "holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)"


def json_text(value: Any) -> str:
    """`value` as compact JSON text, by orjson (a frame or an event costs the event loop one
    C call, `json.dumps` ~6 Python calls). What orjson refuses (an integer past 64 bits, a lone
    surrogate, a key that is not a string) `json` writes, lone surrogates as ASCII escapes."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))


def holds_unpaired_surrogate(raw: str | bytes, value: Any) -> bool:
    """Whether the JSON text `raw`, read as `value`, holds a lone UTF-16 surrogate (an escape
    such as `\\ud83d` without its pair): such text cannot be encoded, so it breaks whatever
    stores or sends it on (a message's insert, the model's request, an SSE response)."""
    pattern = _SURROGATE_ESCAPE_BYTES if isinstance(raw, bytes) else _SURROGATE_ESCAPE
    if not pattern.search(raw):
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


class DataContext(TypedDict):
    """A context as the page attaches it to a message."""

    type: ContextType
    data: Any


# --- client-tool declarations ---------------------------------------------------------------

ClientToolKind = Literal["blocking", "one-way"]


class ClientToolDeclaration(TypedDict):
    """One tool of a `client-tool-register` frame, stored as registered."""

    kind: ClientToolKind
    name: str
    description: str
    arguments: dict[str, Any]
    result: NotRequired[dict[str, Any] | None]  # blocking only
    serve: NotRequired[bool]  # blocking only
    title: NotRequired[str]  # a person's name for the tool ("Show annotations on the map")
    summary: NotRequired[str]  # a template of one line about a call ("{ids:ids}")


def client_tool_declaration(
    *,
    kind: ClientToolKind,
    name: str,
    description: str,
    arguments: dict[str, Any],
    result: dict[str, Any] | None,
    serve: bool,
    title: str = "",
    summary: str = "",
) -> ClientToolDeclaration:
    declaration = ClientToolDeclaration(
        kind=kind, name=name, description=description, arguments=arguments
    )
    if kind == "blocking":
        declaration["result"] = result
        declaration["serve"] = serve
    if title:
        declaration["title"] = title
    if summary:
        declaration["summary"] = summary
    return declaration


# --- turn events ----------------------------------------------------------------------------

EventName = Literal[
    "turn_start",
    "text_delta",
    "backend_thinking",
    "backend_tool_call",
    "client_tool_call",
    "message",
    "error",
    "turn_end",
]
TURN_EVENTS: tuple[EventName, ...] = get_args(EventName)


class TurnStartData(TypedDict):
    session: str
    turn: int


class TextDeltaData(TypedDict):
    delta: str


class BackendThinkingData(TypedDict):
    text: str


class BackendToolCallData(TypedDict):
    """A backend call as it ended. `error` is the precise reason the model reads; `title`,
    `summary` and `problem` say the same for a person (the page's activity log)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    ok: bool
    error: NotRequired[str]
    title: str
    summary: str
    problem: NotRequired[str]


class ClientToolCallData(TypedDict):
    call_id: str
    name: str
    arguments: dict[str, Any]
    kind: ClientToolKind
    title: str
    summary: str


ApprovalReason = Literal["backend_access", "credits", "destructive"]


class ApprovalData(TypedDict):
    """An approval as `pending_approval` and `approval` show it."""

    id: int
    tool: str
    arguments: dict[str, Any]
    reasons: list[ApprovalReason]
    cost_credits: int
    status: str
    title: str  # the tool's title, for a person
    summary: str  # this call in one line, for a person
    decided_at: str | None


class DecisionData(TypedDict):
    """A reader-answered client-tool call as `pending_decision` and `decision` show it."""

    tool_call: str
    name: str
    arguments: dict[str, Any]
    status: str
    title: str  # the tool's title, for a person
    summary: str  # this call in one line, for a person


class StoredToolCall(TypedDict):
    """A call of an assistant message: arguments as the model's JSON text."""

    id: str
    name: str
    arguments: str


class MessageData(TypedDict):
    """A message as `GET /api/sessions/<id>` and the `message` event show it."""

    id: int
    role: str
    content: str
    created: str
    turn: int
    pending_approval: ApprovalData | None
    pending_decision: DecisionData | None
    approval: NotRequired[ApprovalData]
    decision: NotRequired[DecisionData]
    tool_calls: NotRequired[list[StoredToolCall]]
    tool_call_id: NotRequired[str]
    tool_name: NotRequired[str]
    is_error: NotRequired[bool]
    # Assistant text whose stream broke off (a crash, the model failed): what the user saw.
    cut_off: NotRequired[bool]


class ErrorData(TypedDict):
    message: str


class TurnEndData(TypedDict):
    pass


EventData = (
    TurnStartData
    | TextDeltaData
    | BackendThinkingData
    | BackendToolCallData
    | ClientToolCallData
    | MessageData
    | ErrorData
    | TurnEndData
)

#: The data shape of each event, for code and tests that read events by name.
EVENT_DATA: Mapping[EventName, type] = {
    "turn_start": TurnStartData,
    "text_delta": TextDeltaData,
    "backend_thinking": BackendThinkingData,
    "backend_tool_call": BackendToolCallData,
    "client_tool_call": ClientToolCallData,
    "message": MessageData,
    "error": ErrorData,
    "turn_end": TurnEndData,
}


@dataclass(frozen=True)
class TurnEvent:
    """One event of a turn, as the engine emits it to every listener."""

    event: EventName
    data: EventData

    @functools.cached_property
    def data_json(self) -> str:
        """`data` as JSON text, encoded at its first use and kept (in the instance's
        `__dict__`, where a second read finds it without a Python call): the SSE stream and the
        session's sockets of this process send the same text (`sse_frame`,
        `event_frame_text`). The data is not changed once emitted (the engine persists, then
        emits: docs/architecture.md, "Engine invariants").

        As `json.dumps(data, ensure_ascii=False)` writes it, by the C encoder that
        `JSONEncoder.encode` builds for each call (with its own markers, for its check of
        circular data), without `encode`'s and `iterencode`'s two Python frames; with a lone
        surrogate (which no UTF-8 stream can carry) in ASCII escapes, so that the SSE stream
        and the sockets still send it."""
        text = "".join(_event_data_encoder({})(self.data, 0))
        try:
            text.encode()
        except UnicodeEncodeError:
            return json.dumps(self.data)
        return text


_EVENT_DATA_ENCODER = json.JSONEncoder(ensure_ascii=False)
_event_data_encoder = functools.partial(
    c_make_encoder,
    default=_EVENT_DATA_ENCODER.default,
    encoder=encode_basestring,
    indent=None,
    key_separator=_EVENT_DATA_ENCODER.key_separator,
    item_separator=_EVENT_DATA_ENCODER.item_separator,
    sort_keys=False,
    skipkeys=False,
    allow_nan=True,
)


def turn_start(*, session: object, turn: int) -> TurnEvent:
    return TurnEvent("turn_start", TurnStartData(session=str(session), turn=turn))


def text_delta(delta: str) -> TurnEvent:
    return TurnEvent("text_delta", TextDeltaData(delta=delta))


def backend_thinking(text: str) -> TurnEvent:
    return TurnEvent("backend_thinking", BackendThinkingData(text=text))


def backend_tool_call(
    *,
    call_id: str,
    name: str,
    arguments: dict[str, Any],
    ok: bool,
    error: str | None,
    title: str = "",
    summary: str = "",
    problem: str | None = None,
) -> TurnEvent:
    data = BackendToolCallData(
        call_id=call_id, name=name, arguments=arguments, ok=ok, title=title, summary=summary
    )
    if not ok:
        data["error"] = error or "failed"
        data["problem"] = problem or data["error"]
    return TurnEvent("backend_tool_call", data)


def client_tool_call(
    *,
    call_id: str,
    name: str,
    arguments: dict[str, Any],
    kind: ClientToolKind,
    title: str = "",
    summary: str = "",
) -> TurnEvent:
    return TurnEvent(
        "client_tool_call",
        ClientToolCallData(
            call_id=call_id,
            name=name,
            arguments=arguments,
            kind=kind,
            title=title,
            summary=summary,
        ),
    )


def message(data: MessageData) -> TurnEvent:
    return TurnEvent("message", data)


def error(message: str) -> TurnEvent:
    return TurnEvent("error", ErrorData(message=message))


def turn_end() -> TurnEvent:
    return TurnEvent("turn_end", TurnEndData())


def sse_frame(event: TurnEvent) -> str:
    """One Server-Sent Event: `event: NAME` and `data: JSON`."""
    return f"event: {event.event}\ndata: {event.data_json}\n\n"


# --- channel-layer messages -----------------------------------------------------------------
# Channels dispatches a message to the consumer method named after its type with dots as
# underscores: `client.tool.invoke` → `ChatConsumer.client_tool_invoke`.

CLIENT_TOOL_INVOKE = "client.tool.invoke"
CLIENT_TOOL_ANSWER = "client.tool.answer"
CLIENT_TOOL_FORGET = "client.tool.forget"
TURN_EVENT = "turn.event"
AUTH_REVOKED = "auth.revoked"
ANNOTATIONS_CHANGED = "annotations.changed"
#: The channel-layer group every authenticated socket joins, to hear of annotation writes.
ANNOTATIONS_GROUP = "annotations"
HEALTH_PING = "health.ping"


class ClientToolInvokeMessage(TypedDict):
    """Engine → the socket's consumer: ask the page; answer on `reply_to`."""

    type: Literal["client.tool.invoke"]
    correlation_id: str
    reply_to: str
    name: str
    arguments: dict[str, Any]


class ClientToolAnswerMessage(TypedDict):
    """Consumer → the engine's reply channel: exactly one of `result`, `error`, `failure`.

    `error` is the page's refusal (the model reads "The client refused: …"); `failure` is the
    consumer's own sentence for a call the page can no longer answer (the socket closed).
    """

    type: Literal["client.tool.answer"]
    correlation_id: str
    result: NotRequired[dict[str, Any]]
    error: NotRequired[str]
    failure: NotRequired[str]
    # The length of the page's frame: a small answer is checked on the event loop.
    size: NotRequired[int]


class AuthRevokedMessage(TypedDict):
    """accounts → every socket of a user or a token: its authentication is gone (a revoked or
    expired token, a deactivated user); the socket closes with 4401."""

    type: Literal["auth.revoked"]


def auth_revoked_message() -> AuthRevokedMessage:
    return AuthRevokedMessage(type=AUTH_REVOKED)


def auth_group_of_user(user_id: int) -> str:
    """The channel-layer group of every socket of a user."""
    return f"auth.user.{user_id}"


def auth_group_of_token(token_id: int) -> str:
    """The channel-layer group of every socket opened with a token."""
    return f"auth.token.{token_id}"


class AnnotationsChangedMessage(TypedDict):
    """annotations → every socket (`ANNOTATIONS_GROUP`): annotations were written (a deletion,
    a restore, an import, an edit, a seed); `revision` is the new `AnnotationRevision` token."""

    type: Literal["annotations.changed"]
    revision: str


def annotations_changed_message(revision: str) -> AnnotationsChangedMessage:
    return AnnotationsChangedMessage(type=ANNOTATIONS_CHANGED, revision=revision)


class ClientToolForgetMessage(TypedDict):
    """Engine → consumer: the engine stopped waiting (time-out, cancelled turn)."""

    type: Literal["client.tool.forget"]
    correlation_id: str


class TurnEventMessage(TypedDict):
    """Engine → a session's group: a turn event every bound socket relays. `seq` numbers the
    turn's events from 1 (a page that read the turn's progress so far skips what it has)."""

    type: Literal["turn.event"]
    event: EventName
    data: EventData
    # The sockets of the emitting process that already had it, handed over directly.
    delivered: NotRequired[list[str]]
    seq: NotRequired[int]


def client_tool_invoke_message(
    *, correlation_id: str, reply_to: str, name: str, arguments: dict[str, Any]
) -> ClientToolInvokeMessage:
    return ClientToolInvokeMessage(
        type=CLIENT_TOOL_INVOKE,
        correlation_id=correlation_id,
        reply_to=reply_to,
        name=name,
        arguments=arguments,
    )


def client_tool_answer_message(
    frame: "ClientToolResultFrame", *, error_max_chars: int, size: int | None = None
) -> ClientToolAnswerMessage:
    """The page's answer, passed on to the engine (a refusal cut to `error_max_chars`)."""
    answer = ClientToolAnswerMessage(type=CLIENT_TOOL_ANSWER, correlation_id=frame["correlationId"])
    if "result" in frame:
        answer["result"] = frame["result"]
        if size is not None:
            answer["size"] = size
    else:
        answer["error"] = frame["error"][:error_max_chars]
    return answer


def client_tool_failure_message(*, correlation_id: str, failure: str) -> ClientToolAnswerMessage:
    return ClientToolAnswerMessage(
        type=CLIENT_TOOL_ANSWER, correlation_id=correlation_id, failure=failure
    )


def client_tool_forget_message(correlation_id: str) -> ClientToolForgetMessage:
    return ClientToolForgetMessage(type=CLIENT_TOOL_FORGET, correlation_id=correlation_id)


def turn_event_message(
    event: TurnEvent, *, delivered: list[str] | None = None, seq: int | None = None
) -> TurnEventMessage:
    message = TurnEventMessage(type=TURN_EVENT, event=event.event, data=event.data)
    if delivered:
        message["delivered"] = delivered
    if seq is not None:
        message["seq"] = seq
    return message


class HealthPingMessage(TypedDict):
    """`/healthz` → its own process, through the layer (and Redis): the round-trip check."""

    type: Literal["health.ping"]
    token: str


def health_ping_message(token: str) -> HealthPingMessage:
    return HealthPingMessage(type=HEALTH_PING, token=token)


# --- socket frames: page → server -----------------------------------------------------------

SESSION_BIND = "session-bind"
CLIENT_TOOL_REGISTER = "client-tool-register"
CLIENT_TOOL_RESULT = "client-tool-result"
CLIENT_FRAME_TYPES = (SESSION_BIND, CLIENT_TOOL_REGISTER, CLIENT_TOOL_RESULT)


class SessionBindFrame(TypedDict):
    type: Literal["session-bind"]
    session: str


class ClientToolRegisterFrame(TypedDict):
    type: Literal["client-tool-register"]
    tools: list[Any]  # each checked by tools.client.client_tool_declare


class ClientToolResultFrame(TypedDict):
    """Exactly one of `result` (a JSON object) or `error` (text the model reads)."""

    type: Literal["client-tool-result"]
    correlationId: str
    result: NotRequired[dict[str, Any]]
    error: NotRequired[str]


class FrameInvalid(ValueError):
    """A frame that does not have its type's shape; the message is the `error` frame's text."""


def client_tool_register_parse(frame: Mapping[str, Any]) -> ClientToolRegisterFrame:
    if not isinstance(frame.get("tools"), list):
        raise FrameInvalid("client-tool-register needs a list of tools")
    return ClientToolRegisterFrame(type=CLIENT_TOOL_REGISTER, tools=frame["tools"])


def client_tool_result_parse(frame: Mapping[str, Any]) -> ClientToolResultFrame:
    correlation_id = frame.get("correlationId")
    has_result, has_error = "result" in frame, "error" in frame
    if not isinstance(correlation_id, str) or has_result == has_error:
        raise FrameInvalid(
            "client-tool-result needs a correlationId and exactly one of result or error"
        )
    parsed = ClientToolResultFrame(type=CLIENT_TOOL_RESULT, correlationId=correlation_id)
    if has_result:
        if not isinstance(frame["result"], dict):
            raise FrameInvalid("result must be a JSON object")
        parsed["result"] = frame["result"]
    else:
        if not isinstance(frame["error"], str):
            raise FrameInvalid("error must be a string")
        parsed["error"] = frame["error"]
    return parsed


# --- socket frames: server → page -----------------------------------------------------------


class SessionBoundFrame(TypedDict):
    type: Literal["session-bound"]
    session: str


class ClientToolRegisteredFrame(TypedDict):
    type: Literal["client-tool-registered"]
    tools: list[str]


class ClientToolInvokeFrame(TypedDict):
    type: Literal["client-tool-invoke"]
    correlationId: str
    name: str
    arguments: dict[str, Any]


class ClientToolCancelledFrame(TypedDict):
    type: Literal["client-tool-cancelled"]
    correlationId: str


# Close codes the page reads (static/geosense/wire.js CLOSE_CODES).
CLOSE_UNAUTHENTICATED = 4401
# The live channel failed (the channel layer, Redis, is unreachable): read the stored
# transcript and reconnect with the usual back-off (chat/outage.py).
CLOSE_LIVE_LOST = 4503


class EventFrame(TypedDict):
    type: Literal["event"]
    event: EventName
    data: EventData
    seq: NotRequired[int]  # the event's number in its turn (see TurnEventMessage)


class AnnotationsChangedFrame(TypedDict):
    """Annotations were written: the map reloads its counts and tiles (unchanged tiles 304)."""

    type: Literal["annotations-changed"]
    revision: str


class ErrorFrame(TypedDict):
    type: Literal["error"]
    status: int
    error: str
    tool: NotRequired[str]  # a refused tool of a client-tool-register frame
    correlationId: NotRequired[str]  # an unknown correlation id


ServerFrame = (
    SessionBoundFrame
    | ClientToolRegisteredFrame
    | ClientToolInvokeFrame
    | ClientToolCancelledFrame
    | EventFrame
    | AnnotationsChangedFrame
    | ErrorFrame
)

#: The shape of each frame the server sends, by its `type`.
SERVER_FRAMES: Mapping[str, type] = {
    "session-bound": SessionBoundFrame,
    "client-tool-registered": ClientToolRegisteredFrame,
    "client-tool-invoke": ClientToolInvokeFrame,
    "client-tool-cancelled": ClientToolCancelledFrame,
    "event": EventFrame,
    "annotations-changed": AnnotationsChangedFrame,
    "error": ErrorFrame,
}


def session_bound_frame(session: object) -> SessionBoundFrame:
    return SessionBoundFrame(type="session-bound", session=str(session))


def client_tool_registered_frame(names: list[str]) -> ClientToolRegisteredFrame:
    return ClientToolRegisteredFrame(type="client-tool-registered", tools=names)


def client_tool_invoke_frame(message: ClientToolInvokeMessage) -> ClientToolInvokeFrame:
    return ClientToolInvokeFrame(
        type="client-tool-invoke",
        correlationId=message["correlation_id"],
        name=message["name"],
        arguments=message["arguments"],
    )


def client_tool_cancelled_frame(correlation_id: str) -> ClientToolCancelledFrame:
    return ClientToolCancelledFrame(type="client-tool-cancelled", correlationId=correlation_id)


def event_frame_text(event: TurnEvent, *, seq: int) -> str:
    """`event`'s `EventFrame` as JSON text, for the sockets of the process that emits it: its
    data's JSON is the SSE stream's (`TurnEvent.data_json`), written around it, not again.
    Event names are this module's constants (`EventName`): nothing in them needs escaping."""
    return f'{{"type":"event","event":"{event.event}","data":{event.data_json},"seq":{seq}}}'


def event_frame(message: TurnEventMessage) -> EventFrame:
    frame = EventFrame(type="event", event=message["event"], data=message["data"])
    if "seq" in message:
        frame["seq"] = message["seq"]
    return frame


def annotations_changed_frame(message: AnnotationsChangedMessage) -> AnnotationsChangedFrame:
    return AnnotationsChangedFrame(type="annotations-changed", revision=message["revision"])


def error_frame(
    status: int, error: str, *, tool: str | None = None, correlation_id: str | None = None
) -> ErrorFrame:
    frame = ErrorFrame(type="error", status=status, error=error)
    if tool is not None:
        frame["tool"] = tool
    if correlation_id is not None:
        frame["correlationId"] = correlation_id
    return frame
