"""The chat page: the user's sessions, the map and the transcript, rendered on the server.

Every message goes through one template (`chat/message.html`) whether it comes with the page,
with a turn re-rendered after a live update, or alone: live and reloaded views are the same.
"""

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET, require_POST

from geosense.accounts.services import credit_balance
from geosense.annotations.selectors import (
    annotation_counts,
    annotation_vector_names,
    annotations_revision,
)

from . import events, selectors
from .activity import ClientCall, LocationCard, client_record
from .markup import (
    Answer,
    Response,
    TranscriptQuestions,
    parse_message,
    placeholder_artifact_ids,
    render_message,
    responses_in_transcript,
    transcript_questions,
)
from .models import ChatSession, Message
from .rendered import MessageToRender, messages_html

SHOWN_ROLES = selectors.SHOWN_ROLES
PREVIEW_MAX_CHARS = 256_000
# Turns per page of the transcript: the page opens with the latest ones, and loads as many
# more each time the reader scrolls to the top.
PAGE_TURNS = 20
REASON_LABELS = {
    "backend_access": "First use of the server's tools in this conversation",
    "destructive": "Deletes annotations",
}


@dataclass(frozen=True)
class ShownMessage:
    """A message as the page shows it: its HTML and, for a paused turn, its card's data."""

    id: int
    role: str
    turn: int
    html: SafeString
    text: str
    approval: dict[str, Any] | None
    decision: dict[str, Any] | None
    # The stream of this text broke off (a crash, the model failed, the turn was stopped).
    cut_off: bool = False
    # A user message's contexts (chips; a picture with its thumbnail).
    shared: tuple[selectors.SharedContext, ...] = ()
    # The turn's client-tool calls (its activity log), on the turn's first shown message.
    activity: list[ClientCall] = field(default_factory=list)
    location: LocationCard | None = None


class _DataClasses(Collection[str]):
    """The data's classes, read on first use: only a find-similar block without samples asks
    (so a transcript without one costs no count of the annotations); and the vector kinds of a
    block's samples that name one."""

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(annotation_counts())

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def vectors_of(self, ids: list[int]) -> dict[int, list[str]]:
        """The vector kinds of these annotations (a find-similar block's samples)."""
        return annotation_vector_names(ids=ids)


@dataclass(frozen=True)
class Turn:
    number: int
    messages: list[ShownMessage]


def _reason_labels(approval: dict[str, Any]) -> list[str]:
    labels = []
    for reason in approval["reasons"]:
        if reason == "credits":
            cost = approval["cost_credits"]
            labels.append(f"Costs {cost} credit{'' if cost == 1 else 's'}")
        else:
            labels.append(REASON_LABELS.get(reason, reason.replace("_", " ").capitalize()))
    return labels


def _decision_result(messages: list[Message], tool_call_id: str) -> dict[str, Any] | None:
    for message in messages:
        if message.role == Message.Role.TOOL and message.tool_call_id == tool_call_id:
            try:
                value = json.loads(message.content)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _questions_and_responses(
    *, session: ChatSession, messages: list[Message], turns: tuple[int, int] | None
) -> tuple[TranscriptQuestions, dict[str, Response], list[Message]]:
    """Which answers answer the questions of `messages` (the turns `turns`, or the whole
    transcript) and which responses their find-similar requests have: read from the page and
    from the few messages outside it that matter (selectors.messages_marked_around). Returns
    them with the messages from outside whose artifacts the page needs (earlier askers)."""
    earlier: list[Message] = []
    later: list[Message] = []
    if turns is not None:
        page_ids = {m.pk for m in messages}
        answers = [
            block
            for m in messages
            if m.role == Message.Role.USER and "<answer" in m.content
            for block in parse_message(m.content, artifacts={}, role="user")
            if isinstance(block, Answer)
        ]
        asked_in = {int(a.asked_in) for a in answers if (a.asked_in or "").isdigit()}
        earlier, later = selectors.messages_marked_around(
            session_id=session.pk, turns=turns, asked_in=asked_in - page_ids
        )
        if any(not (a.asked_in or "").isdigit() for a in answers):
            # An answer that does not say where it was asked answers the latest such question.
            before = selectors.questions_asked_before(session_id=session.pk, turn=turns[0])
            earlier = sorted({m.pk: m for m in [*earlier, *before]}.values(), key=lambda m: m.pk)
    marked = [
        m
        for m in [*earlier, *messages, *later]
        if (m.role == Message.Role.ASSISTANT and "<question" in m.content)
        or (m.role == Message.Role.USER and ("<answer" in m.content or "<response" in m.content))
    ]
    asked = transcript_questions(
        ((m.pk, m.role, m.content) for m in marked),
        artifacts=selectors.artifacts_map(
            session_id=session.pk,
            artifact_ids=set().union(
                *(placeholder_artifact_ids(m.content) for m in marked if m.role != "user")
            ),
        ),
    )
    responses = responses_in_transcript(
        m.content for m in marked if m.role == Message.Role.USER and "<response" in m.content
    )
    return asked, responses, earlier


def transcript_shown(
    *, session: ChatSession, turns: tuple[int, int] | None = None
) -> list[ShownMessage]:
    """The session's messages as shown (all, or those of the turns `turns`: first, last),
    questions marked answered, requests marked run, each message's HTML from the cache when
    nothing it depends on changed (chat/rendered.py).

    Tool messages are internals; an assistant message that only carried tool calls shows
    nothing unless it paused the turn (then it is an approval or decision card) or asked for
    the user's location (the turn's location card). A turn's client-tool calls ride on its
    first shown message, which renders the turn's activity log after itself. The cost follows
    the turns shown, not the transcript.
    """
    messages = selectors.messages_of_session(session_id=session.pk, turns=turns)
    if selectors.session_turn_running(session=session):
        # The running turn's text streamed so far is stored as it streams (`cut_off` until it
        # completes): the page shows it from the turn's progress, as it goes on, not twice.
        messages = [m for m in messages if not (m.cut_off and m.turn == session.turn_count)]
    asked, responses, _ = _questions_and_responses(session=session, messages=messages, turns=turns)
    shared = selectors.shared_contexts(
        session_id=session.pk,
        message_ids=[m.pk for m in messages if m.role == Message.Role.USER],
    )
    record = client_record(messages)
    visible = []
    for message in messages:
        if message.role not in SHOWN_ROLES:
            continue
        data = selectors.message_serialize(message)
        location = record.location_by_message.get(message.pk)
        if message.role == Message.Role.ASSISTANT and not (
            message.content.strip() or data.get("approval") or data.get("decision") or location
        ):
            continue
        visible.append((message, data, location))
    to_render = [
        MessageToRender(
            id=message.pk,
            role=message.role,
            text=message.content,
            answers=asked.answers_in(message.pk),
            questions=asked.questions_answered_in(message.pk),
        )
        for message, _, _ in visible
        if message.role != Message.Role.NOTE
    ]
    html = messages_html(
        to_render,
        artifacts=selectors.artifacts_map(
            session_id=session.pk,
            artifact_ids=set().union(*(placeholder_artifact_ids(m.text) for m in to_render)),
        ),
        responses=responses,
        classes=_DataClasses(),
        revision=annotations_revision,
    )
    logged: set[int] = set()
    shown = []
    for message, data, location in visible:
        approval = data.get("approval")
        decision = data.get("decision")
        activity = [] if message.turn in logged else record.calls_by_turn.get(message.turn, [])
        logged.add(message.turn)
        if approval:
            approval = {**approval, "reason_labels": _reason_labels(approval)}
        if decision:
            decision = {**decision, "result": _decision_result(messages, decision["tool_call"])}
        shown.append(
            ShownMessage(
                id=message.pk,
                role=message.role,
                turn=message.turn,
                html=html.get(message.pk, SafeString("")),
                text=message.content,
                approval=approval,
                decision=decision,
                cut_off=message.cut_off,
                shared=tuple(shared.get(message.pk, ())),
                activity=activity,
                location=location,
            )
        )
    return shown


def turns_group(messages: list[ShownMessage]) -> list[Turn]:
    turns: list[Turn] = []
    for message in messages:
        if not turns or turns[-1].number != message.turn:
            turns.append(Turn(number=message.turn, messages=[]))
        turns[-1].messages.append(message)
    return turns


def _owned(request: HttpRequest, session_id: UUID) -> ChatSession:
    session = selectors.session_of_user(session_id=session_id, user=request.user)
    if session is None:  # another user's session answers 404, as if it did not exist
        raise Http404("no such session")
    return session


def _with_state(response: HttpResponse, *, request: HttpRequest, session: ChatSession) -> None:
    """What a live update changes beside the transcript, for the page to show."""
    response["X-GeoSense-Credits"] = str(credit_balance(user=request.user))
    response["X-GeoSense-Allow-Backend-Tools"] = "true" if session.allow_backend_tools else "false"


def _turns_page(*, session: ChatSession, before: int | None) -> dict[str, Any]:
    """The latest PAGE_TURNS turns before turn `before` (the latest of all when None), and
    where the page before them starts, if there is one (`earlier`: the turn to load before)."""
    numbers, more = selectors.shown_turns_latest(
        session_id=session.pk, before=before, count=PAGE_TURNS
    )
    if not numbers:
        return {"turns": [], "earlier": None}
    shown = transcript_shown(session=session, turns=(numbers[0], numbers[-1]))
    return {"turns": turns_group(shown), "earlier": numbers[0] if more else None}


@require_GET
@login_required
def chat_page(request: HttpRequest, session_id: UUID | None = None) -> HttpResponse:
    """The page with the latest turns of the open session; earlier ones load on scroll."""
    current = _owned(request, session_id) if session_id is not None else None
    page = _turns_page(session=current, before=None) if current is not None else {"turns": []}
    return render(
        request,
        "chat/page.html",
        {
            "sessions": selectors.session_list(user=request.user),
            "current": current,
            "running": current is not None and selectors.session_turn_running(session=current),
            **page,
            "credits": credit_balance(user=request.user),
            "tile_url": settings.GEOSENSE_MAP_TILE_URL,
        },
    )


@require_GET
@login_required
def turns_earlier(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The page of turns before `?before=<turn>`, with the marker of the page before it: what
    the transcript loads when the reader scrolls up to its top."""
    session = _owned(request, session_id)
    try:
        before = int(request.GET["before"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "before must be a turn number"}, status=400)
    return render(
        request,
        "chat/turns.html",
        {
            **_turns_page(session=session, before=before),
            "credits": credit_balance(user=request.user),
        },
    )


@require_GET
@login_required
def turn_partial(request: HttpRequest, session_id: UUID, turn: int) -> HttpResponse:
    """One turn's messages, rendered as the full page renders them (for live updates)."""
    session = _owned(request, session_id)
    messages = transcript_shown(session=session, turns=(turn, turn))
    response = render(
        request,
        "chat/turn.html",
        {
            "turn": Turn(number=turn, messages=messages),
            "credits": credit_balance(user=request.user),
        },
    )
    _with_state(response, request=request, session=session)
    return response


@require_GET
@login_required
def message_partial(request: HttpRequest, session_id: UUID, message_id: int) -> HttpResponse:
    session = _owned(request, session_id)
    turn = selectors.turn_of_message(session_id=session.pk, message_id=message_id)
    if turn is None:
        raise Http404("no such message")
    for message in transcript_shown(session=session, turns=(turn, turn)):
        if message.id == message_id:
            response = render(
                request,
                "chat/message.html",
                {"message": message, "credits": credit_balance(user=request.user)},
            )
            _with_state(response, request=request, session=session)
            return response
    raise Http404("no such message")


@require_GET
@login_required
def shared_picture(request: HttpRequest, session_id: UUID, artifact_id: str) -> HttpResponse:
    """A picture of the map the user shared, for its thumbnail in the transcript (an artifact
    never changes, so the browser may keep it)."""
    session = _owned(request, session_id)
    picture = selectors.picture_of_session(session_id=session.pk, artifact_id=artifact_id)
    if picture is None:
        raise Http404("no such picture")
    data, media_type = picture
    response = HttpResponse(data, content_type=media_type)
    response["Cache-Control"] = "private, max-age=86400, immutable"
    return response


@require_GET
@login_required
def turn_progress(request: HttpRequest, session_id: UUID) -> JsonResponse:
    """The running turn so far, for a page opened while it runs: `{"running": false}`, or
    `{"running": true, "turn", "seq", "events": [{"event", "data"}]}` (the turn's events up
    to number `seq`, consecutive text deltas as one; docs/protocol.md, "A turn already
    running")."""
    session = _owned(request, session_id)
    if not selectors.session_turn_running(session=session):
        return JsonResponse({"running": False})
    return JsonResponse(events.turn_progress(session_id=session.pk))


@require_POST
@login_required
def message_preview(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The streaming bubble: the text streamed so far, rendered as its stored message will be,
    with half-open Markdown and markup held back (docs/protocol.md, "The streaming preview").

    The page posts the text it has from `text_delta` events; only the artifacts its `${…}`
    placeholders name are read, so the cost follows the text, not the session.
    """
    session = _owned(request, session_id)
    try:
        text = json.loads(request.body)["text"]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": 'the body must be JSON: {"text": "…"}'}, status=400)
    if not isinstance(text, str):
        return JsonResponse({"error": "text must be a string"}, status=400)
    if len(text) > PREVIEW_MAX_CHARS:
        return JsonResponse(
            {"error": f"text longer than {PREVIEW_MAX_CHARS:,} characters"}, status=413
        )
    artifacts = selectors.artifacts_map(
        session_id=session.pk, artifact_ids=placeholder_artifact_ids(text)
    )
    html = render_message(
        text,
        role=Message.Role.ASSISTANT,
        artifacts=artifacts,
        streaming=True,
        classes=_DataClasses(),
    )
    return HttpResponse(html, content_type="text/html; charset=utf-8")
