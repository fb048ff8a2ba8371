"""Reads of the chat core: what the API shows, what the model is fed, what the engine needs."""

import base64
import binascii
import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import (
    Case,
    Count,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
    prefetch_related_objects,
)
from django.db.models.fields.json import KT
from django.urls import reverse
from django.utils import timezone

from geosense.annotations.models import AnnotationRevision
from geosense.compiled import CompiledRead, db_value, model_columns, model_from_row
from geosense.wire import ApprovalData, DecisionData, MessageData
from tools.client import ClientTool, ClientToolset
from tools.registry import ToolSpecs, backend_tool

from . import processes
from .agents.base import AttachedContext, UserRequest
from .history import contexts_of_messages, image_data_url
from .models import (
    Approval,
    Artifact,
    ChatSession,
    ClientToolRegistration,
    Message,
    PendingDecision,
    ServerProcess,
)

# The roles the page shows (tool messages are internals).
SHOWN_ROLES = (Message.Role.USER, Message.Role.ASSISTANT, Message.Role.NOTE)


def _session_of_user_query(session_id: object, user_id: object) -> QuerySet:
    return (
        ChatSession.objects.filter(pk=session_id, user_id=user_id)
        .order_by("pk")
        .values_list(*model_columns(ChatSession))[:1]
    )


def _session_of_user_tail(connection: Any, session_id: object, user_id: object) -> list[Any]:
    return [
        db_value(ChatSession, "id", session_id, connection),
        db_value(ChatSession, "user", user_id, connection),
    ]


# Every API request on a session checks its owner: compiled once per process (through the
# ORM, ~370 µs of the requests' pool a request; ~35 µs).
_SESSION_OF_USER = CompiledRead(build=_session_of_user_query, tail=_session_of_user_tail)


def session_of_user(*, session_id: object, user) -> ChatSession | None:
    """The session if it exists and belongs to the user; None otherwise (answered as 404)."""
    if not getattr(user, "is_authenticated", False):
        return None
    try:
        rows = _SESSION_OF_USER.rows(session_id, user.pk)
    except (ValueError, TypeError, ValidationError):  # not a UUID
        return None
    return model_from_row(ChatSession, rows[0]) if rows else None


def session_list(*, user) -> list[ChatSession]:
    return list(ChatSession.objects.filter(user=user).order_by("-created"))


def session_turn_running(*, session: ChatSession) -> bool:
    """Whether a turn of the session runs now: claimed, and the claim not free for the taking
    (a lapsed lease, a dead process's claim: that turn will never end by itself)."""
    if session.turn_state != ChatSession.TurnState.RUNNING:
        return False
    return (
        ChatSession.objects.filter(pk=session.pk)
        .exclude(processes.claim_free_q(timezone.now()))
        .exists()
    )


def session_serialize(session: ChatSession) -> dict[str, Any]:
    return {
        "id": str(session.pk),
        "title": session.title,
        "allow_backend_tools": session.allow_backend_tools,
        "created": session.created.isoformat(),
        "updated": session.updated.isoformat(),
        "busy": session.turn_state == ChatSession.TurnState.RUNNING,
    }


def approval_serialize(approval: Approval) -> ApprovalData:
    tool = backend_tool(approval.tool_name)
    return ApprovalData(
        id=approval.pk,
        tool=approval.tool_name,
        arguments=approval.arguments,
        reasons=list(approval.reasons),
        cost_credits=approval.cost_credits,
        status=approval.status,
        title=tool.title if tool else approval.tool_name,
        summary=tool.summary_of(approval.arguments) if tool else "",
        decided_at=approval.decided_at.isoformat() if approval.decided_at else None,
    )


def decision_serialize(decision: PendingDecision) -> DecisionData:
    return DecisionData(
        tool_call=decision.tool_call_id,
        name=decision.tool_name,
        arguments=decision.arguments,
        status=decision.status,
        title=decision.title or decision.tool_name,
        summary=decision.summary,
    )


def message_serialize(message: Message) -> MessageData:
    """A message as the API and the `message` event show it.

    `pending_approval`/`pending_decision` are set only while the pause waits; `approval` and
    `decision` keep showing how it ended, so a card can show the decision after a reload.
    """
    approvals = list(message.approvals.all())
    decisions = list(message.pending_decisions.all())
    return _message_data(
        message,
        approval=approvals[-1] if approvals else None,
        decision=decisions[-1] if decisions else None,
    )


def _message_data(
    message: Message, *, approval: Approval | None, decision: PendingDecision | None
) -> MessageData:
    data = MessageData(
        id=message.pk,
        role=message.role,
        content=message.content,
        created=message.created.isoformat(),
        turn=message.turn,
        pending_approval=approval_serialize(approval)
        if approval and approval.status == Approval.Status.PENDING
        else None,
        pending_decision=decision_serialize(decision)
        if decision and decision.status == PendingDecision.Status.PENDING
        else None,
    )
    if approval:
        data["approval"] = approval_serialize(approval)
    if decision:
        data["decision"] = decision_serialize(decision)
    if message.tool_calls:
        data["tool_calls"] = message.tool_calls
    if message.cut_off:
        data["cut_off"] = True
    if message.role == Message.Role.TOOL:
        data["tool_call_id"] = message.tool_call_id
        data["tool_name"] = message.tool_name
        data["is_error"] = message.is_error
    return data


def messages_of_session(
    *,
    session_id: object,
    turns: tuple[int, int] | None = None,
    before_id: int | None = None,
    limit: int | None = None,
) -> list[Message]:
    """The session's messages in order: all, those of the turns `turns` (first, last), or the
    `limit` latest ones before the message `before_id` (a page of the API's cursor walk)."""
    messages = Message.objects.filter(session_id=session_id)
    if turns is not None:
        messages = messages.filter(turn__gte=turns[0], turn__lte=turns[1])
    if before_id is not None:
        messages = messages.filter(id__lt=before_id)
    if limit is not None:
        messages = messages.order_by("-id")[:limit]
    found = list(messages.order_by("id") if limit is None else messages)
    prefetch_related_objects(
        found,
        Prefetch("approvals", queryset=Approval.objects.order_by("id")),
        Prefetch("pending_decisions", queryset=PendingDecision.objects.order_by("id")),
    )
    return found if limit is None else found[::-1]


def shown_turns_latest(
    *, session_id: object, before: int | None, count: int
) -> tuple[list[int], bool]:
    """The numbers of the `count` latest turns before turn `before` that show a message, in
    order, and whether an earlier one exists (the page loads it on scroll)."""
    messages = Message.objects.filter(session_id=session_id, role__in=SHOWN_ROLES)
    if before is not None:
        messages = messages.filter(turn__lt=before)
    turns = list(messages.order_by("-turn").values_list("turn", flat=True).distinct()[: count + 1])
    return sorted(turns[:count]), len(turns) > count


def messages_marked_around(
    *, session_id: object, turns: tuple[int, int], asked_in: Collection[int]
) -> tuple[list[Message], list[Message]]:
    """What a page of turns needs from outside it to show its questions and requests right:
    the messages `asked_in` that asked the questions its answers pick from, and every later
    user message holding an `<answer>` or a `<response>` (to its questions and requests).
    Only messages holding markup of that kind are read, never the whole transcript's text."""
    earlier = list(
        Message.objects.filter(
            session_id=session_id, pk__in=list(asked_in), role=Message.Role.ASSISTANT
        ).order_by("id")
    )
    later = list(
        Message.objects.filter(session_id=session_id, role=Message.Role.USER, turn__gt=turns[1])
        .filter(Q(content__contains="<answer") | Q(content__contains="<response"))
        .order_by("id")
    )
    return earlier, later


def questions_asked_before(*, session_id: object, turn: int) -> list[Message]:
    """Assistant messages before `turn` that ask a question: an answer that does not name the
    message that asked (`asked-in`) answers the latest question with its id."""
    return list(
        Message.objects.filter(
            session_id=session_id,
            role=Message.Role.ASSISTANT,
            turn__lt=turn,
            content__contains="<question",
        ).order_by("id")
    )


def message_exists_before(*, session_id: object, message_id: int) -> bool:
    return Message.objects.filter(session_id=session_id, pk__lt=message_id).exists()


def turn_of_message(*, session_id: object, message_id: int) -> int | None:
    return (
        Message.objects.filter(session_id=session_id, pk=message_id)
        .values_list("turn", flat=True)
        .first()
    )


def message_get(*, message_id: int) -> MessageData:
    message = (
        Message.objects.filter(pk=message_id)
        .prefetch_related(
            Prefetch("approvals", queryset=Approval.objects.order_by("id")),
            Prefetch("pending_decisions", queryset=PendingDecision.objects.order_by("id")),
        )
        .get()
    )
    return message_serialize(message)


def message_fresh_serialize(message: Message) -> MessageData:
    """`message_serialize` of a message without calls that was just stored: no pause can refer
    to it, so none is read (a turn's answer, shown as it is stored), nor made into querysets
    (empty ones, for each answer, cost as much as the message's insert)."""
    return _message_data(message, approval=None, decision=None)


def artifacts_map(
    *, session_id: object, artifact_ids: Iterable[str] | None = None
) -> dict[str, Any]:
    """artifact_id → data, for `${…}` interpolation; only `artifact_ids` when given."""
    artifacts = Artifact.objects.filter(session_id=session_id)
    if artifact_ids is not None:
        artifacts = artifacts.filter(artifact_id__in=list(artifact_ids))
    return dict(artifacts.values_list("artifact_id", "data"))


def artifact_of_session(*, session_id: object, artifact_id: str) -> Artifact | None:
    return Artifact.objects.filter(session_id=session_id, artifact_id=artifact_id).first()


SHARED_LABELS = {
    "visibility": "Visible classes",
    "position": "Map position",
    "image": "Picture of the map",
    "selection": "Selected annotations",
}
THUMBNAIL_WIDTH = 96  # a picture's thumbnail fits this box (px)
THUMBNAIL_HEIGHT = 72


@dataclass(frozen=True)
class SharedContext:
    """A context the user's message carried, as the transcript shows it: a label and, for a
    picture of the map, the thumbnail's URL and size."""

    type: str
    artifact_id: str
    label: str
    picture_url: str = ""
    width: int = 0
    height: int = 0
    # What exactly was shared, in a few words ("zoom 16", "7") and in full for a tooltip.
    detail: str = ""
    title: str = ""


SHARED_TITLE_NAMES = 12  # a tooltip lists at most this many class names


def _json_list(text: object) -> list[Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _shared_words(
    kind: str, zoom: object, lat: object, lon: object, items: object
) -> dict[str, str]:
    """The chip's detail and tooltip: the zoom and centre of a position, how many classes
    were visible (and which), how many annotations were selected."""
    if kind == "position":
        try:
            level = float(zoom)
        except (TypeError, ValueError):
            return {}
        words = {"detail": f"zoom {level:.0f}", "title": f"Zoom {level:.1f}"}
        try:
            words["title"] += f", centre {float(lat):.5f}, {float(lon):.5f}"
        except (TypeError, ValueError):
            pass
        return words
    if kind in ("visibility", "selection"):
        listed = _json_list(items)
        if not listed:
            return {}
        if kind == "selection":
            return {"detail": f"{len(listed):,}"}
        names = ", ".join(str(name) for name in listed[:SHARED_TITLE_NAMES])
        more = "…" if len(listed) > SHARED_TITLE_NAMES else ""
        return {"detail": f"{len(listed):,}", "title": f"Shown: {names}{more}"}
    return {}


def shared_contexts(
    *, session_id: object, message_ids: Iterable[int]
) -> dict[int, list[SharedContext]]:
    """message id → what it shared, in order; a picture's PNG is not read (only its size)."""
    found: dict[int, list[SharedContext]] = {}
    rows = (
        Artifact.objects.filter(session_id=session_id, message_id__in=list(message_ids))
        .annotate(
            width=KT("data__width"),
            height=KT("data__height"),
            zoom=KT("data__zoom"),
            lat=KT("data__center__lat"),
            lon=KT("data__center__lon"),
            items=Case(
                When(kind="visibility", then=KT("data__classes")),
                When(kind="selection", then=KT("data__ids")),
                default=Value(""),
                output_field=TextField(),
            ),
        )
        .order_by("id")
        .values_list(
            "message_id", "artifact_id", "kind", "width", "height", "zoom", "lat", "lon", "items"
        )
    )
    for message_id, artifact_id, kind, width, height, zoom, lat, lon, items in rows:
        shared = SharedContext(
            type=kind,
            artifact_id=artifact_id,
            label=SHARED_LABELS.get(kind, kind.capitalize()),
            **_shared_words(kind, zoom, lat, lon, items),
        )
        if kind == "image":
            try:
                w, h = max(1, int(width)), max(1, int(height))
            except (TypeError, ValueError):
                w, h = 4, 3
            shared = replace(
                shared,
                picture_url=reverse(
                    "chat-picture", kwargs={"session_id": session_id, "artifact_id": artifact_id}
                ),
                width=max(1, round(w * min(THUMBNAIL_WIDTH / w, THUMBNAIL_HEIGHT / h))),
                height=max(1, round(h * min(THUMBNAIL_WIDTH / w, THUMBNAIL_HEIGHT / h))),
            )
        found.setdefault(message_id, []).append(shared)
    return found


def picture_of_session(*, session_id: object, artifact_id: str) -> tuple[bytes, str] | None:
    """A picture context's bytes and media type (PNG, JPEG or WebP only), or None."""
    row = (
        Artifact.objects.filter(session_id=session_id, artifact_id=artifact_id, kind="image")
        .annotate(png=KT("data__png"))
        .values_list("png", flat=True)
        .first()
    )
    url = image_data_url(row)
    if url is None:
        return None
    head, _, payload = url.partition(",")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error:
        return None
    return data, head.removeprefix("data:").removesuffix(";base64")


def calls_without_result(*, message: Message) -> list[dict[str, Any]]:
    """The message's calls that have no result yet (only their own results are read)."""
    answered = set(
        Message.objects.filter(
            session_id=message.session_id,
            role=Message.Role.TOOL,
            tool_call_id__in=[call["id"] for call in message.tool_calls],
        ).values_list("tool_call_id", flat=True)
    )
    return [call for call in message.tool_calls if call["id"] not in answered]


def tool_answers_in_turn(*, session_id: object, turn: int) -> dict[str, int]:
    """How many results each tool name has in this turn of the session."""
    return dict(
        Message.objects.filter(session_id=session_id, turn=turn, role=Message.Role.TOOL)
        .values("tool_name")
        .annotate(n=Count("id"))
        .values_list("tool_name", "n")
    )


def message_of_session(*, session_id: object, message_id: int) -> Message:
    return Message.objects.get(pk=message_id, session_id=session_id)


def session_allows_backend_tools(*, session_id: object) -> bool:
    return ChatSession.objects.values_list("allow_backend_tools", flat=True).get(pk=session_id)


def client_toolset_of_session(*, session_id: object) -> ClientToolset | None:
    """The tools of the session's most recently registered socket (a tab), or None.

    A socket of a process that stopped heartbeating is nobody's (chat/processes.py): its tools
    are not offered, and no call waits for it.
    """
    return client_tools_offered(session_id=session_id)[0]


def client_tools_offered(*, session_id: object) -> tuple[ClientToolset | None, ToolSpecs]:
    """`client_toolset_of_session`, with its tools' specs as a step offers them."""
    return client_tools_and_revision(session_id=session_id)[:2]


def client_tools_and_revision(
    *, session_id: object
) -> tuple[ClientToolset | None, ToolSpecs, tuple[str, str] | None]:
    """`client_tools_offered`, and the annotations' revision (`AnnotationRevision.state()`)
    read by the same statement when the session has a socket's tools (None when it has none):
    a step reads both, and each statement is a GIL hand-off or two of the database thread
    every turn queues on (issue 15)."""
    live = processes.heartbeats_on()
    fresh = processes.heartbeat_fresh_since() if live else None
    rows = _REGISTRATION_LATEST.rows(session_id, live, fresh)
    if not rows:
        return None, ToolSpecs(), None
    channel_name, declared, process, token, generation = rows[0]
    tools, specs = _declared_tools(declared)
    toolset = ClientToolset(
        channel_name=channel_name,
        tools=tools,
        elsewhere=process != processes.PROCESS_ID,
        process=process,
    )
    return toolset, specs, (token or "", generation or "")


# Declarations (their JSON text as stored) → their tools and specs, made once: every step of
# every turn reads its session's registration, and the pages of a deployment declare the same
# few sets of tools (decoding them and building the tools and specs anew at every step was a
# twentieth of the database thread's work per turn). The tools are frozen and shared.
DECLARED_KEPT = 256
_declared: OrderedDict[str, tuple[dict[str, ClientTool], ToolSpecs]] = OrderedDict()
_declared_lock = threading.Lock()


def _declared_tools(declared: Any) -> tuple[dict[str, ClientTool], ToolSpecs]:
    """The tools of a registration's declarations, as the database gives them (their JSON
    text; decoded already by the first read of a process, which runs through the ORM)."""
    if not isinstance(declared, str):
        return _tools_built(declared)
    with _declared_lock:
        found = _declared.get(declared)
        if found is not None:
            _declared.move_to_end(declared)
            return found
    found = _tools_built(json.loads(declared))
    with _declared_lock:
        _declared[declared] = found
        while len(_declared) > DECLARED_KEPT:
            _declared.popitem(last=False)
    return found


def _tools_built(declared: list[Any]) -> tuple[dict[str, ClientTool], ToolSpecs]:
    tools = {tool.name: tool for tool in map(ClientTool.from_declaration, declared)}
    return tools, ToolSpecs.of(tool.openai_spec() for tool in tools.values())


def _registration_latest_query(session_id: object, live: bool, fresh: Any) -> QuerySet:
    registrations = ClientToolRegistration.objects.filter(session_id=session_id)
    if live:
        registrations = registrations.filter(
            Q(process=processes.PROCESS_ID) | Q(process__in=processes.process_live_ids(since=fresh))
        )
    revision = AnnotationRevision.objects.filter(pk=1)
    return (
        registrations.order_by("-updated")
        .annotate(
            revision_token=Subquery(revision.values("token")[:1]),
            revision_generation=Subquery(revision.values("generation")[:1]),
        )
        .values_list("channel_name", "tools", "process", "revision_token", "revision_generation")[
            :1
        ]
    )


def _registration_latest_tail(connection: Any, session_id: object, live: bool, fresh: Any):
    tail = [db_value(ClientToolRegistration, "session", session_id, connection)]
    if live:
        tail += [
            db_value(ClientToolRegistration, "process", processes.PROCESS_ID, connection),
            db_value(ServerProcess, "heartbeat", fresh, connection),
        ]
    return tail


# Every step reads the session's client tools, with the annotations' revision (as
# `AnnotationRevision.state()` reads it, in the same statement): compiled once per process
# (geosense/compiled.py); the declarations come as their JSON text (`_declared_tools`).
_REGISTRATION_LATEST = CompiledRead(
    build=_registration_latest_query,
    tail=_registration_latest_tail,
    shape=lambda session_id, live, fresh: live,
    raw=(1,),
)


def user_request_latest(*, session_id: object) -> UserRequest:
    """The session's latest user message and the data contexts attached to it, as data (the
    model reads them as text in `chat.history`; the local agent reads them as they are). A
    picture is its size only: no agent reads its PNG here, and a step need not load it."""
    message = (
        Message.objects.filter(session_id=session_id, role=Message.Role.USER)
        .order_by("-id")
        .first()
    )
    if message is None:
        return UserRequest(text="", contexts=())
    return user_request_of(
        text=message.content, contexts=contexts_of_messages([message.pk]).get(message.pk, [])
    )


def user_request_of(*, text: str, contexts: list[tuple[str, str, Any]]) -> UserRequest:
    """A user message's text and its contexts [(artifact_id, kind, data)] as a request."""
    return UserRequest(
        text=text,
        contexts=tuple(
            AttachedContext(type=kind, artifact_id=artifact_id, data=data)
            for artifact_id, kind, data in contexts
        ),
    )
