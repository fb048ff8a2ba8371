"""Writes of the chat core: sessions, the turn claim, messages, results, artifacts, pauses.

All synchronous ORM code; the engine calls it through `database_sync_to_async`.
"""

import json
import secrets
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from .models import Approval, Artifact, ChatSession, Message, PendingDecision

TURN_LEASE = timedelta(seconds=120)
TITLE_LENGTH = 60

SET_ASIDE_RESULT = (
    "Not run: the user sent a new message instead of answering, so this call was set aside."
)
INTERRUPTED_RESULT = "Not run: the turn ended before this call could run (the user moved on or the server restarted)."


class SessionBusy(Exception):
    """Another turn runs in this session."""


def session_create(*, user, title: str = "") -> ChatSession:
    return ChatSession.objects.create(user=user, title=title.strip()[:200])


def session_update(
    *, session: ChatSession, allow_backend_tools: bool | None = None, title: str | None = None
) -> ChatSession:
    fields = ["updated"]
    if allow_backend_tools is not None:
        session.allow_backend_tools = allow_backend_tools
        fields.append("allow_backend_tools")
    if title is not None:
        session.title = title.strip()[:200]
        fields.append("title")
    session.save(update_fields=fields)
    return session


def session_claim(*, session_id: object) -> None:
    """Claim the session for one turn, across processes (ENGINE.md invariant 2).

    A crashed process's claim expires with its lease. Raises SessionBusy.
    """
    now = timezone.now()
    claimed = (
        ChatSession.objects.filter(pk=session_id)
        .filter(Q(turn_state=ChatSession.TurnState.IDLE) | Q(turn_lease__lt=now))
        .update(turn_state=ChatSession.TurnState.RUNNING, turn_lease=now + TURN_LEASE)
    )
    if not claimed:
        raise SessionBusy


def session_lease_renew(*, session_id: object) -> None:
    ChatSession.objects.filter(pk=session_id, turn_state=ChatSession.TurnState.RUNNING).update(
        turn_lease=timezone.now() + TURN_LEASE
    )


def session_release(*, session_id: object) -> None:
    ChatSession.objects.filter(pk=session_id).update(
        turn_state=ChatSession.TurnState.IDLE, turn_lease=None, updated=timezone.now()
    )


def turn_begin(*, session_id: object) -> int:
    """Number the new turn (a resume continues the current one)."""
    with transaction.atomic():
        session = ChatSession.objects.select_for_update().get(pk=session_id)
        session.turn_count += 1
        session.save(update_fields=["turn_count"])
        return session.turn_count


def message_store(
    *,
    session_id: object,
    turn: int,
    role: str,
    content: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
) -> Message:
    message = Message.objects.create(
        session_id=session_id, turn=turn, role=role, content=content, tool_calls=tool_calls or []
    )
    if role == Message.Role.USER:
        session = ChatSession.objects.get(pk=session_id)
        if not session.title:
            from .markup import message_plain_text

            title = " ".join(message_plain_text(content).split())[:TITLE_LENGTH] or "New session"
            ChatSession.objects.filter(pk=session_id, title="").update(title=title)
    return message


def tool_calls_with_fresh_ids(
    *, session_id: object, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The step's calls, each with an id not used before in the session.

    Some OpenAI-compatible servers number calls per response (`call_0` every time); a reused
    id would make a new call look answered by an old result.
    """
    used: set[str] = set()
    for tool_calls in Message.objects.filter(
        session_id=session_id, role=Message.Role.ASSISTANT
    ).values_list("tool_calls", flat=True):
        used.update(call["id"] for call in tool_calls or [])
    fresh = []
    for call in calls:
        call_id, n = call["id"] or "call", 1
        while call_id in used:
            n += 1
            call_id = f"{call['id'] or 'call'}~{n}"
        used.add(call_id)
        fresh.append({**call, "id": call_id})
    return fresh


def tool_result_store(
    *,
    session_id: object,
    turn: int,
    tool_call_id: str,
    tool_name: str,
    content: dict[str, Any] | str,
    is_error: bool = False,
) -> Message:
    """Store the one result of a call; a second result for the same call is never written."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    try:
        with transaction.atomic():
            return Message.objects.create(
                session_id=session_id,
                turn=turn,
                role=Message.Role.TOOL,
                content=text,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                is_error=is_error,
            )
    except IntegrityError:
        return Message.objects.get(
            session_id=session_id, role=Message.Role.TOOL, tool_call_id=tool_call_id
        )


def artifact_save(
    *, session_id: object, kind: str, data: Any, origin: str, message_id: int | None = None
) -> str:
    """Store a data context and return its new `artifact_id` (usable in `${…}` placeholders)."""
    prefix = "".join(c if c.isalnum() else "-" for c in kind.lower())[:24] or "artifact"
    for _ in range(5):
        artifact_id = f"{prefix}-{secrets.token_hex(3)}"
        try:
            with transaction.atomic():
                Artifact.objects.create(
                    session_id=session_id,
                    artifact_id=artifact_id,
                    kind=kind,
                    data=data,
                    origin=origin,
                    message_id=message_id,
                )
            return artifact_id
        except IntegrityError:
            continue
    raise RuntimeError("could not allocate an artifact id")


def approval_create(
    *,
    session_id: object,
    message: Message,
    call: dict[str, Any],
    arguments: dict[str, Any],
    reasons: list[str],
    cost: int,
) -> Approval:
    return Approval.objects.create(
        session_id=session_id,
        message=message,
        tool_call_id=call["id"],
        tool_name=call["name"],
        arguments=arguments,
        reasons=reasons,
        cost_credits=cost,
    )


def decision_create(
    *,
    session_id: object,
    message: Message,
    call: dict[str, Any],
    arguments: dict[str, Any],
    result_schema: dict[str, Any],
) -> PendingDecision:
    return PendingDecision.objects.create(
        session_id=session_id,
        message=message,
        tool_call_id=call["id"],
        name=call["name"],
        arguments=arguments,
        result_schema=result_schema,
    )


def pauses_set_aside(*, session_id: object) -> int:
    """A new user message sets every open pause aside; each paused call gets its result."""
    count = 0
    now = timezone.now()
    pauses = ((Approval, "tool_name", "decided_at"), (PendingDecision, "name", "answered_at"))
    with transaction.atomic():
        for model, name_field, time_field in pauses:
            for pause in model.objects.filter(
                session_id=session_id, status="pending"
            ).select_related("message"):
                if model.objects.filter(pk=pause.pk, status="pending").update(
                    status="set_aside", **{time_field: now}
                ):
                    tool_result_store(
                        session_id=session_id,
                        turn=pause.message.turn,
                        tool_call_id=pause.tool_call_id,
                        tool_name=getattr(pause, name_field),
                        content={"error": SET_ASIDE_RESULT},
                        is_error=True,
                    )
                    count += 1
    return count


def history_repair(*, session_id: object) -> int:
    """Give every call that has no result (a crash, an error mid-step) its result.

    Calls of a message that waits on a pending pause are left alone: they run after it.
    Keeps ENGINE.md invariant 1 whatever happened before: the history stays valid to send.
    """
    paused = set(
        Approval.objects.filter(session_id=session_id, status=Approval.Status.PENDING).values_list(
            "message_id", flat=True
        )
    ) | set(
        PendingDecision.objects.filter(
            session_id=session_id, status=PendingDecision.Status.PENDING
        ).values_list("message_id", flat=True)
    )
    answered = set(
        Message.objects.filter(session_id=session_id, role=Message.Role.TOOL).values_list(
            "tool_call_id", flat=True
        )
    )
    repaired = 0
    for message in Message.objects.filter(
        session_id=session_id, role=Message.Role.ASSISTANT
    ).exclude(tool_calls=[]):
        if message.pk in paused:
            continue
        for call in message.tool_calls:
            if call["id"] not in answered:
                tool_result_store(
                    session_id=session_id,
                    turn=message.turn,
                    tool_call_id=call["id"],
                    tool_name=call["name"],
                    content={"error": INTERRUPTED_RESULT},
                    is_error=True,
                )
                repaired += 1
    return repaired
