"""What the model reads of a session: the newest whole turns that fit its context window.

The transcript is stored in the shape a model is fed (chat/models.py); this module picks the
part of it a request carries and writes it in OpenAI's chat format:
- **A window of whole turns.** Messages are read newest first, a batch at a time, and only as far
  back as the budget reaches, so a step of a 4,000-message session reads what a step of a short
  one does (issue 15, cause 2). A turn goes in whole or not at all: a tool call never arrives
  without its result. The newest turn always goes in; when older turns were left out, the
  system prompt says so.
- **Bounded tool results.** The model reads at most `TOOL_RESULT_CHARS` of one result, cut in the
  database (large results are artifacts already; the model refers to them by id).
- **Contexts after their message's text.** Data contexts as bounded JSON; a picture of the map
  as a short description, plus the picture itself as an `image_url` part for the newest user
  message when the model takes images (`images=True`). Never base64 in text.

Tokens are estimated (about four characters of JSON per token, a fixed price per picture): the
window needs a bound, not a tokenizer.
"""

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Case, F, QuerySet, TextField, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Length, Substr

from geosense.compiled import CompiledRead, db_value

from .models import Artifact, Message

CHARS_PER_TOKEN = 4
# What one picture costs a vision model, about (OpenAI: 85 + 170 per 512-px tile of an 800-px map).
IMAGE_TOKENS = 1_000
# Kept free for the answer when GEOSENSE_LLM_MAX_TOKENS does not say how long it may be.
ANSWER_RESERVE_TOKENS = 1_024
TOOL_RESULT_CHARS = 8_000
CONTEXT_PREVIEW_CHARS = 4_000
READ_BATCH = 256
LEFT_OUT_NOTE = (
    "Earlier turns of this conversation were left out of this request to fit the model's "
    "context window. If the user refers to something you cannot see here, say so and ask."
)
IMAGE_DATA_URL_RE = re.compile(r"data:image/(?:png|jpeg|webp);base64,[A-Za-z0-9+/]+={0,2}")


def tokens_estimate(value: Any) -> int:
    """About four characters of JSON per token (English text and JSON; a bound, not a count)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text) // CHARS_PER_TOKEN + 1


def history_budget(*, system: str, tools: Sequence[dict[str, Any]]) -> int:
    """Tokens left for the transcript once the prompt, the tools and the answer have theirs."""
    answer = settings.GEOSENSE_LLM_MAX_TOKENS or ANSWER_RESERVE_TOKENS
    fixed = tokens_estimate(system) + tokens_estimate(list(tools)) + answer
    return settings.GEOSENSE_LLM_CONTEXT_TOKENS - fixed - tokens_estimate(LEFT_OUT_NOTE)


@dataclass(frozen=True)
class HistoryWindow:
    messages: list[dict[str, Any]]  # OpenAI chat format, oldest first, no system message
    left_out: bool  # older turns exist that are not in `messages`
    # The newest user message as stored, with its contexts [(artifact_id, kind, data)], read
    # with the window (the step's request need not be read again); None if not among the rows.
    latest_user: tuple[str, list[tuple[str, str, Any]]] | None = None


def image_data_url(value: Any) -> str | None:
    """The picture as a data URL a model server takes, or None for anything else."""
    if isinstance(value, str) and IMAGE_DATA_URL_RE.fullmatch(value):
        return value
    return None


def image_description(*, width: Any, height: Any) -> str:
    size = (
        f", {width}×{height} px"
        if isinstance(width, int | str) and isinstance(height, int | str)
        else ""
    )
    return f"A picture of the map as the user saw it{size}."


@dataclass
class _Row:
    id: int
    turn: int
    role: str
    text: str
    size: int
    tool_calls: list[dict[str, Any]]
    tool_call_id: str


def _rows_before_query(session_id: object, before: int | None) -> QuerySet:
    rows = Message.objects.filter(session_id=session_id).exclude(role=Message.Role.NOTE)
    if before is not None:
        rows = rows.filter(id__lt=before)
    rows = rows.annotate(
        text=Case(
            When(role=Message.Role.TOOL, then=Substr("content", 1, TOOL_RESULT_CHARS)),
            default=F("content"),
            output_field=TextField(),
        ),
        size=Length("content"),
    ).order_by("-id")
    fields = ("id", "turn", "role", "text", "size", "tool_calls", "tool_call_id")
    return rows.values_list(*fields)[:READ_BATCH]


def _rows_before_tail(connection: Any, session_id: object, before: int | None) -> list[Any]:
    tail = [db_value(Message, "session", session_id, connection), Message.Role.NOTE]
    return tail if before is None else [*tail, before]


# Every step of every turn reads its window: compiled once per process (geosense/compiled.py).
_ROWS_BEFORE = CompiledRead(
    build=_rows_before_query,
    tail=_rows_before_tail,
    shape=lambda session_id, before: before is None,
)


def _rows_before(session_id: object, before: int | None) -> list[_Row]:
    return [_Row(*values) for values in _ROWS_BEFORE.rows(session_id, before)]


def contexts_of_messages(message_ids: Iterable[int]) -> dict[int, list[tuple[str, str, Any]]]:
    """message id → [(artifact_id, kind, data)]; a picture's data is its size only (the PNG is
    read for the one message whose picture is sent, `_pictures_of`). One query."""
    ids = list(message_ids)
    if not ids:
        return {}
    found: dict[int, list[tuple[str, str, Any]]] = {}
    for message_id, artifact_id, kind, body, width, height in _CONTEXTS.rows(ids):
        data = {"width": _whole(width), "height": _whole(height)} if kind == "image" else body
        found.setdefault(message_id, []).append((artifact_id, kind, data))
    return found


def _contexts_query(ids: list[int]) -> QuerySet:
    return (
        Artifact.objects.filter(message_id__in=ids)
        .annotate(
            body=Case(When(kind="image", then=Value(None)), default=F("data")),
            width=KT("data__width"),
            height=KT("data__height"),
        )
        .order_by("id")
        .values_list("message_id", "artifact_id", "kind", "body", "width", "height")
    )


# A batch's user messages' contexts, every step: compiled once per number of ids.
_CONTEXTS = CompiledRead(build=_contexts_query, tail=lambda connection, ids: ids, shape=len)


def _whole(value: Any) -> Any:
    """A picture's size as a number on every database (PostgreSQL's `->>` gives text)."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _pictures_of(message_id: int) -> dict[str, str]:
    """artifact_id → data URL of the pictures attached to one message."""
    pictures = (
        Artifact.objects.filter(message_id=message_id, kind="image")
        .annotate(png=KT("data__png"))
        .values_list("artifact_id", "png")
    )
    return {aid: url for aid, png in pictures if (url := image_data_url(png))}


def user_content(
    text: str, contexts: list[tuple[str, str, Any]], *, pictures: dict[str, str] | None = None
) -> tuple[str | list[dict[str, Any]], int]:
    """A user message's content for the model and its token estimate.

    Contexts follow the text, one line each; a picture is described in words and, when
    `pictures` holds its data URL, sent as an `image_url` part after the text."""
    parts = [text]
    images: list[dict[str, Any]] = []
    for artifact_id, kind, data in contexts:
        head = f'\n[context type="{kind}" artifact_id="{artifact_id}"] '
        if kind == "image":
            data = data if isinstance(data, dict) else {}
            parts.append(
                head + image_description(width=data.get("width"), height=data.get("height"))
            )
            if pictures and artifact_id in pictures:
                images.append({"type": "image_url", "image_url": {"url": pictures[artifact_id]}})
            continue
        body = json.dumps(data, ensure_ascii=False)
        if len(body) > CONTEXT_PREVIEW_CHARS:
            body = body[:CONTEXT_PREVIEW_CHARS] + "… (truncated; the full data is in the artifact)"
        parts.append(head + body)
    joined = "".join(parts)
    tokens = tokens_estimate(joined) + IMAGE_TOKENS * len(images)
    if not images:
        return joined, tokens
    return [{"type": "text", "text": joined}, *images], tokens


def _tool_text(row: _Row) -> str:
    if row.size <= TOOL_RESULT_CHARS:
        return row.text
    return (
        f"{row.text}… (cut: the model reads the first {TOOL_RESULT_CHARS} of "
        f"{row.size} characters of this result)"
    )


def _entry(
    row: _Row, contexts: dict[int, list[tuple[str, str, Any]]], pictures: dict[str, str] | None
) -> tuple[dict[str, Any], int]:
    if row.role == Message.Role.USER:
        content, tokens = user_content(row.text, contexts.get(row.id, []), pictures=pictures)
        return {"role": "user", "content": content}, tokens + 4
    if row.role == Message.Role.ASSISTANT:
        entry: dict[str, Any] = {"role": "assistant", "content": row.text or None}
        if row.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in row.tool_calls
            ]
        return entry, tokens_estimate(entry)
    entry = {"role": "tool", "tool_call_id": row.tool_call_id, "content": _tool_text(row)}
    return entry, tokens_estimate(entry)


@dataclass
class _Gather:
    """Whole turns, newest first, while they fit."""

    budget: int
    images: bool
    turns: list[list[dict[str, Any]]]
    used: int = 0
    latest_user: tuple[str, list[tuple[str, str, Any]]] | None = None

    def take(self, rows: list[_Row], contexts: dict[int, list[tuple[str, str, Any]]]) -> bool:
        """Add one turn (`rows` newest first); False when it does not fit (nothing added)."""
        newest = not self.turns
        entries, cost = [], 0
        for row in reversed(rows):
            pictures = None
            if (
                newest
                and self.images
                and row.role == Message.Role.USER
                and any(kind == "image" for _, kind, _ in contexts.get(row.id, ()))
            ):
                pictures = _pictures_of(row.id)
            entry, tokens = _entry(row, contexts, pictures)
            entries.append(entry)
            cost += tokens
        if not newest and self.used + cost > self.budget:
            return False
        self.turns.append(entries)
        self.used += cost
        return True


def history_window(*, session_id: object, budget: int, images: bool = False) -> HistoryWindow:
    """The newest whole turns of the session whose estimate fits `budget` tokens (the newest
    turn always), read from the database only as far back as they reach.

    `images`: the newest user message's pictures go as `image_url` parts (the model takes
    images); older pictures, and every picture otherwise, are described in words."""
    gather = _Gather(budget=budget, images=images, turns=[])
    turn_rows: list[_Row] = []
    contexts: dict[int, list[tuple[str, str, Any]]] = {}
    before: int | None = None
    while True:
        batch = _rows_before(session_id, before)
        contexts.update(contexts_of_messages(r.id for r in batch if r.role == Message.Role.USER))
        if gather.latest_user is None:
            newest = next((r for r in batch if r.role == Message.Role.USER), None)
            if newest is not None:
                gather.latest_user = (newest.text, contexts.get(newest.id, []))
        for row in batch:
            if turn_rows and row.turn != turn_rows[-1].turn:
                if not gather.take(turn_rows, contexts):
                    return _window(gather, left_out=True)
                turn_rows = []
            turn_rows.append(row)
        if len(batch) < READ_BATCH:
            break
        before = batch[-1].id
    if turn_rows and not gather.take(turn_rows, contexts):
        return _window(gather, left_out=True)
    return _window(gather, left_out=False)


def _window(gather: _Gather, *, left_out: bool) -> HistoryWindow:
    return HistoryWindow(
        messages=[entry for turn in reversed(gather.turns) for entry in turn],
        left_out=left_out,
        latest_user=gather.latest_user,
    )
