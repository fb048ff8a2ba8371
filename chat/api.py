"""The JSON and streaming HTTP API (docs/protocol.md). Thin: parse, call a service, answer.

The domain refuses in its own terms (`TurnRequestInvalid`, `SessionBusy`, `PauseNotFound`,
`PauseConflict`, `AnswerInvalid`); the HTTP status of each is decided here, in `REFUSALS`.
"""

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from geosense.accounts.first_read import first_read, reads_first
from geosense.annotations.selectors import annotations_similar_by_hint
from geosense.annotations.types import (
    SIMILAR_SAMPLES_MAX,
    AnnotationNotFound,
    ClassNotFound,
    VectorNotFound,
)
from geosense.dbpool import in_request_thread
from geosense.throttle import cache_allow
from geosense.wire import UNPAIRED_SURROGATE, TurnEvent, holds_unpaired_surrogate, sse_frame
from tools.schemas import CheckTooCostly, checked_inline, json_depth_exceeds

from . import selectors, services
from .approvals import AnswerInvalid, PauseConflict, PauseNotFound
from .events import EventFeed
from .models import ChatSession
from .turns import (
    ApprovalAnswer,
    DecisionAnswer,
    NewMessage,
    PreparedTurn,
    TurnElsewhere,
    TurnRequestInvalid,
    TurnUnavailable,
    turn_launch,
    turn_prepare,
    turn_stop,
)
from .usage import TurnUnaffordable

KEEPALIVE_SECONDS = 15.0
# The page's find-similar block is free (the reader's own action on a block the agent
# proposed), so it is bounded instead: the 20 hits a block shows, 10 searches a minute per user.
# More results, and an artifact of them, are the paid similarity_search tool's.
FIND_SIMILAR_K_MAX = 20
FIND_SIMILAR_PER_MINUTE = 10
MAX_TEXT_LENGTH = 20_000


# How each refusal of the domain answers, before any stream starts.
REFUSALS: tuple[tuple[type[Exception], int], ...] = (
    (TurnRequestInvalid, 400),
    (AnswerInvalid, 400),
    (PauseNotFound, 404),
    (PauseConflict, 409),
    (services.SessionBusy, 409),
    (TurnUnaffordable, 402),
    (TurnUnavailable, 503),
    (TurnElsewhere, 409),
)


class BadRequest(Exception):
    """A body this module cannot parse; `status` is its HTTP answer (400, or 413 too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _refused(exc: Exception) -> JsonResponse:
    return _error(str(exc), next(status for kind, status in REFUSALS if isinstance(exc, kind)))


def _error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


BODY_MAX_DEPTH = 64
ID_MAX = 2**63 - 1  # the database's integer ids


async def _body(request: HttpRequest) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest: parsed and measured within a deadline, since
    its depth is the sender's choice; on the loop when it is short (every message's POST: a
    hop to the schema worker cost more than the parse), else in the worker."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest("request body too large", status=413) from None
    if not raw:
        return {}
    try:
        return await checked_inline(_body_parse, raw, size=len(raw))
    except CheckTooCostly:
        raise BadRequest("the body could not be read in time") from None


def _body_parse(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body must be JSON") from None
    except RecursionError:
        raise BadRequest(f"the body nests deeper than {BODY_MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    if json_depth_exceeds(data, BODY_MAX_DEPTH):
        raise BadRequest(f"the body nests deeper than {BODY_MAX_DEPTH} levels")
    if holds_unpaired_surrogate(raw, data):
        raise BadRequest(f"the body {UNPAIRED_SURROGATE}")
    return data


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= ID_MAX


async def _user(request: HttpRequest):
    user = await request.auser()
    return user if user.is_authenticated else None


# The views of one session read it first, in the trip that reads their user.
_reads_session_first = reads_first(selectors.session_of_user, "session_id")


async def _owned_session(
    request: HttpRequest, session_id
) -> tuple[Any, ChatSession] | JsonResponse:
    user = await _user(request)
    if user is None:
        return _error("authentication required", 401)
    session = await first_read(request, selectors.session_of_user, session_id=session_id, user=user)
    if session is None:
        return _error("session not found", 404)
    return user, session


# --- sessions --------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
async def sessions(request: HttpRequest) -> JsonResponse:
    user = await _user(request)
    if user is None:
        return _error("authentication required", 401)
    if request.method == "GET":
        rows = await in_request_thread(selectors.session_list)(user=user)
        return JsonResponse({"sessions": [selectors.session_serialize(s) for s in rows]})
    try:
        body = await _body(request)
    except BadRequest as exc:
        return _error(str(exc), exc.status)
    title = body.get("title", "")
    if not isinstance(title, str):
        return _error("title must be a string", 400)
    allow = body.get("allow_backend_tools", False)
    if not isinstance(allow, bool):
        return _error("allow_backend_tools must be true or false", 400)
    session = await in_request_thread(services.session_create)(
        user=user, title=title, allow_backend_tools=allow
    )
    return JsonResponse(selectors.session_serialize(session), status=201)


MESSAGES_PAGE_DEFAULT = 50
MESSAGES_PAGE_MAX = 200
_CURSOR = re.compile(r"before:([1-9][0-9]{0,18})")


def _messages_page(query: Any) -> tuple[int | None, int | None]:
    """`?limit=N` and `?cursor=C` as (before message id, limit); (None, None) without either:
    the whole transcript, in the contract's shape. BadRequest for a malformed one."""
    cursor, limit = query.get("cursor"), query.get("limit")
    if cursor is None and limit is None:
        return None, None
    before = None
    if cursor is not None:
        match = _CURSOR.fullmatch(cursor)
        if match is None or int(match[1]) > ID_MAX:
            raise BadRequest("cursor is not one this API gave (use next_cursor as it is)")
        before = int(match[1])
    if limit is None:
        return before, MESSAGES_PAGE_DEFAULT
    if not limit.isdigit() or not 1 <= int(limit) <= MESSAGES_PAGE_MAX:
        raise BadRequest(f"limit must be a whole number from 1 to {MESSAGES_PAGE_MAX}")
    return before, int(limit)


def _session_with_messages(
    session: ChatSession, *, before: int | None = None, limit: int | None = None
) -> dict[str, Any]:
    """The session and its messages: all of them, or with `limit` a page of the latest ones
    (before the cursor's message) and `next_cursor`, the cursor of the page before it."""
    data = selectors.session_serialize(session)
    messages = selectors.messages_of_session(session_id=session.pk, before_id=before, limit=limit)
    data["messages"] = [selectors.message_serialize(m) for m in messages]
    if limit is not None:
        more = len(messages) == limit and selectors.message_exists_before(
            session_id=session.pk, message_id=messages[0].pk
        )
        data["next_cursor"] = f"before:{messages[0].pk}" if more else None
    return data


@_reads_session_first
@require_http_methods(["GET", "PATCH"])
async def session_detail(request: HttpRequest, session_id) -> JsonResponse:
    owned = await _owned_session(request, session_id)
    if isinstance(owned, JsonResponse):
        return owned
    _, session = owned
    if request.method == "PATCH":
        try:
            body = await _body(request)
        except BadRequest as exc:
            return _error(str(exc), exc.status)
        allow = body.get("allow_backend_tools")
        title = body.get("title")
        if allow is not None and not isinstance(allow, bool):
            return _error("allow_backend_tools must be true or false", 400)
        if title is not None and not isinstance(title, str):
            return _error("title must be a string", 400)
        if allow is None and title is None:
            return _error("nothing to change: send allow_backend_tools or title", 400)
        session = await in_request_thread(services.session_update)(
            session=session, allow_backend_tools=allow, title=title
        )
        return JsonResponse(selectors.session_serialize(session))
    try:
        before, limit = _messages_page(request.GET)
    except BadRequest as exc:
        return _error(str(exc), exc.status)
    return JsonResponse(
        await in_request_thread(_session_with_messages)(session, before=before, limit=limit)
    )


@_reads_session_first
@require_GET
async def artifact_detail(request: HttpRequest, session_id, artifact_id: str) -> JsonResponse:
    owned = await _owned_session(request, session_id)
    if isinstance(owned, JsonResponse):
        return owned
    artifact = await in_request_thread(selectors.artifact_of_session)(
        session_id=session_id, artifact_id=artifact_id
    )
    if artifact is None:
        return _error("artifact not found", 404)
    return JsonResponse(
        {"artifact_id": artifact.artifact_id, "kind": artifact.kind, "data": artifact.data}
    )


# --- turns as Server-Sent Events -------------------------------------------------------------


def _framed(events: list[TurnEvent], frames: list[str]) -> bool:
    """Add the events' frames to `frames`, up to `turn_end`; whether it came."""
    for event in events:
        frames.append(sse_frame(event))
        if event.event == "turn_end":
            return True
    return False


def _turn_answer(event: TurnEvent) -> bool:
    """Whether `event` is the message that ends a turn: an answer without calls (a message
    with calls, paused for a person, goes out at once)."""
    if event.event != "message":
        return False
    data = event.data
    return not (
        data.get("tool_calls") or data.get("pending_approval") or data.get("pending_decision")
    )


async def _follow(prepared: PreparedTurn) -> AsyncIterator[bytes]:
    """Stream a turn's events. The turn is a task of its own: if this client goes away,
    Django cancels this iterator and the turn still runs to its end and is stored.

    The events emitted by the time this stream runs go out as one chunk: each chunk is a trip
    through Django's response, Daphne and the socket, and under load several events of a
    turn wait together (the same bytes either way). The first chunk, `: ok`, waits for the
    turn's first step (one round of the loop, until its first wait) and takes its
    `turn_start` along. The turn's answer (a `message` without calls) goes with the
    `turn_end` that follows it once the claim is released, in one chunk (a chunk fewer a
    turn), or with whatever else comes first; held no longer than a keep-alive's wait. Chunks
    are bytes, encoded here: a text chunk has Django's response look up its charset each time
    (the Content-Type header, a regex, the settings). A keep-alive comment goes out after
    `KEEPALIVE_SECONDS` without an event (`EventFeed`)."""
    feed = EventFeed(idle=KEEPALIVE_SECONDS)
    try:
        task = turn_launch(prepared, listener=feed.put)
        await asyncio.sleep(0)
        frames = [": ok\n\n"]
        ended = _framed(feed.taken_now(), frames)
        yield "".join(frames).encode()
        frames = []
        while not ended:
            events = await feed.taken()
            if not events:  # idle for `KEEPALIVE_SECONDS`, or the turn's task ended
                if frames:
                    yield "".join(frames).encode()
                    frames = []
                elif not task.done():
                    yield b": keep-alive\n\n"
                if task.done():
                    return
                continue
            ended = _framed(events, frames)
            if not ended and _turn_answer(events[-1]):
                continue  # it waits for its `turn_end`, one trip away: one chunk
            yield "".join(frames).encode()
            frames = []
    finally:
        feed.close()


class _EventStream(StreamingHttpResponse):
    """A turn's stream, its chunks handed to Django's handler as `_follow` yields them: they are
    bytes already, and Django's own hands each part on through two async generators of its own
    (`__aiter__`, `streaming_content`'s wrapper) and `make_bytes`, three Python calls a chunk.
    The handler closes the stream as it closed Django's generators (`aclosing`), and
    `streaming_content` is Django's."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterator


def _stream_response(prepared: PreparedTurn) -> StreamingHttpResponse:
    response = _EventStream(_follow(prepared), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _start(request: HttpRequest, session_id, parse) -> HttpResponse:
    owned = await _owned_session(request, session_id)
    if isinstance(owned, JsonResponse):
        return owned
    user, session = owned
    try:
        turn_request = parse(await _body(request))
        prepared = await turn_prepare(session_id=session.pk, user=user, request=turn_request)
    except BadRequest as exc:
        return _error(str(exc), exc.status)
    except tuple(kind for kind, _ in REFUSALS) as exc:
        return _refused(exc)
    return _stream_response(prepared)


def _parse_message(body: dict[str, Any]) -> NewMessage:
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("text is required")
    if len(text) > MAX_TEXT_LENGTH:
        raise BadRequest(f"text is longer than {MAX_TEXT_LENGTH} characters", status=413)
    contexts = body.get("contexts")
    if contexts is not None and not isinstance(contexts, list):
        raise BadRequest("contexts must be a list")
    return NewMessage(text=text, contexts=contexts or [])


def _parse_resume(body: dict[str, Any]) -> ApprovalAnswer | DecisionAnswer:
    if "approval" in body:
        approval = body["approval"]
        if not _is_id(approval):
            raise BadRequest("approval must be an approval id (integer)")
        if body.get("decision") not in ("approve", "reject"):
            raise BadRequest('decision must be "approve" or "reject"')
        return ApprovalAnswer(approval_id=approval, decision=body["decision"])
    if "tool_call" in body:
        if not isinstance(body["tool_call"], str) or not body["tool_call"]:
            raise BadRequest("tool_call must be a tool call id (string)")
        if not isinstance(body.get("result"), dict):
            raise BadRequest("result must be a JSON object")
        return DecisionAnswer(tool_call_id=body["tool_call"], result=body["result"])
    raise BadRequest('send {"approval", "decision"} or {"tool_call", "result"}')


@_reads_session_first
@require_POST
async def message_stream(request: HttpRequest, session_id) -> HttpResponse:
    return await _start(request, session_id, _parse_message)


@_reads_session_first
@require_POST
async def resume_stream(request: HttpRequest, session_id) -> HttpResponse:
    return await _start(request, session_id, _parse_resume)


@_reads_session_first
@require_POST
async def stop(request: HttpRequest, session_id) -> JsonResponse:
    """Stop the session's turn (the Stop button): `{"status": "stopped" | "set_aside" |
    "idle"}` once it is stopped; what was streamed stays, cut off (docs/protocol.md)."""
    owned = await _owned_session(request, session_id)
    if isinstance(owned, JsonResponse):
        return owned
    try:
        status = await turn_stop(session_id=owned[1].pk)
    except tuple(kind for kind, _ in REFUSALS) as exc:
        return _refused(exc)
    return JsonResponse({"status": status})


# --- the page's find-similar block -----------------------------------------------------------


@_reads_session_first
@require_POST
async def find_similar(request: HttpRequest, session_id) -> JsonResponse:
    """Run a find-similar block's search for the reader: free, and bounded (above)."""
    owned = await _owned_session(request, session_id)
    if isinstance(owned, JsonResponse):
        return owned
    try:
        body = await _body(request)
        samples, hint = body.get("samples", []), body.get("hint")
        if hint is not None and not isinstance(hint, str):
            raise BadRequest("hint must be a text")
        if (
            not isinstance(samples, list)
            or len(samples) > SIMILAR_SAMPLES_MAX
            or not (samples or hint)
        ):
            raise BadRequest(
                f"send samples (a list of 1 to {SIMILAR_SAMPLES_MAX} {{id, v?}} objects), "
                "a hint naming a class, or both"
            )
        pairs = []
        for sample in samples:
            if not isinstance(sample, dict) or not _is_id(sample.get("id")):
                raise BadRequest("each sample needs an annotation id (a positive integer)")
            v = sample.get("v")
            if v is not None and not isinstance(v, str):
                raise BadRequest("a sample's v must be a string")
            pairs.append((sample["id"], v))
        k = body.get("k", 20)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= FIND_SIMILAR_K_MAX:
            raise BadRequest(f"k must be an integer from 1 to {FIND_SIMILAR_K_MAX}")
    except BadRequest as exc:
        return _error(str(exc), exc.status)
    user, _ = owned
    if not await cache_allow(
        f"find-similar:{user.pk}", limit=FIND_SIMILAR_PER_MINUTE, window_seconds=60
    ):
        return _error(
            f"at most {FIND_SIMILAR_PER_MINUTE} searches a minute; try again in a minute", 429
        )
    try:
        search = await sync_to_async(annotations_similar_by_hint)(samples=pairs, hint=hint, k=k)
    except (AnnotationNotFound, VectorNotFound, ClassNotFound) as exc:
        return _error(str(exc), 404)
    return JsonResponse(
        {
            "class": search.category,
            "ids": [h.id for h in search.hits],
            "scores": [round(h.score, 4) for h in search.hits],
        }
    )
