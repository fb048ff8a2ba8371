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
import logging
import re
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import (
    BooleanField,
    Case,
    F,
    IntegerField,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Length, Substr

from geosense.compiled import CompiledRead, db_value
from geosense.fields import json_nul_free, json_text
from tools.registry import ToolSpecs

from .models import Artifact, ChatSession, Message

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
logger = logging.getLogger(__name__)
IMAGE_DATA_URL_RE = re.compile(r"data:image/(?:png|jpeg|webp);base64,[A-Za-z0-9+/]+={0,2}")


def tokens_estimate(value: Any) -> int:
    """About four characters of JSON per token (English text and JSON; a bound, not a count)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text) // CHARS_PER_TOKEN + 1


def history_budget(*, system: str, tools: Sequence[dict[str, Any]] | ToolSpecs) -> int:
    """Tokens left for the transcript once the prompt, the tools and the answer have theirs
    (`ToolSpecs`: their JSON measured once, not written again at every step)."""
    answer = settings.GEOSENSE_LLM_MAX_TOKENS or ANSWER_RESERVE_TOKENS
    if isinstance(tools, ToolSpecs):
        tools_tokens = tools.json_chars // CHARS_PER_TOKEN + 1
    else:
        tools_tokens = tokens_estimate(list(tools))
    fixed = tokens_estimate(system) + tools_tokens + answer
    return settings.GEOSENSE_LLM_CONTEXT_TOKENS - fixed - tokens_estimate(LEFT_OUT_NOTE)


@dataclass(frozen=True)
class HistoryWindow:
    # OpenAI chat format, oldest first, no system message; its entries are the session's kept
    # ones (shared with later windows of the session): read them, never change them.
    messages: list[dict[str, Any]]
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
    cut_off: bool


def _rows_query(session_id: object, before: int | None, after: int | None) -> QuerySet:
    rows = Message.objects.filter(session_id=session_id).exclude(role=Message.Role.NOTE)
    if before is not None:
        rows = rows.filter(id__lt=before)
    if after is not None:
        rows = rows.filter(id__gt=after)
    rows = rows.annotate(
        text=Case(
            When(role=Message.Role.TOOL, then=Substr("content", 1, TOOL_RESULT_CHARS)),
            default=F("content"),
            output_field=TextField(),
        ),
        size=Length("content"),
    ).order_by("-id")
    fields = ("id", "turn", "role", "text", "size", "tool_calls", "tool_call_id", "cut_off")
    return rows.values_list(*fields)[:READ_BATCH]


def _rows_tail(connection: Any, session_id: object, before: int | None, after: int | None):
    tail = [db_value(Message, "session", session_id, connection), Message.Role.NOTE]
    return [*tail, *(bound for bound in (before, after) if bound is not None)]


# Every step of every turn reads rows of its window: compiled once per process
# (geosense/compiled.py). READ_BATCH is the SQL's LIMIT (tests change it).
_ROWS = CompiledRead(
    build=_rows_query,
    tail=_rows_tail,
    shape=lambda session_id, before, after: (before is None, after is None, READ_BATCH),
)


def contexts_of_messages(message_ids: Iterable[int]) -> dict[int, list[tuple[str, str, Any]]]:
    """message id → [(artifact_id, kind, data)]; a picture's data is its size only (the PNG is
    read for the one message whose picture is sent, `_pictures_of`). One query."""
    return {
        message_id: [context[1:] for context in found]
        for message_id, found in _contexts_read(message_ids).items()
    }


def _contexts_read(message_ids: Iterable[int]) -> dict[int, list[tuple[int, str, str, Any]]]:
    """`contexts_of_messages` with each artifact's primary key first."""
    ids = list(message_ids)
    if not ids:
        return {}
    found: dict[int, list[tuple[int, str, str, Any]]] = {}
    for pk, message_id, artifact_id, kind, body, width, height in _CONTEXTS.rows(ids):
        data = {"width": _whole(width), "height": _whole(height)} if kind == "image" else body
        found.setdefault(message_id, []).append((pk, artifact_id, kind, data))
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
        .values_list("id", "message_id", "artifact_id", "kind", "body", "width", "height")
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
    row: _Row, contexts: list[tuple[str, str, Any]], pictures: dict[str, str] | None
) -> tuple[dict[str, Any], int]:
    if row.role == Message.Role.USER:
        content, tokens = user_content(row.text, contexts, pictures=pictures)
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


# What a kept row's entry depends on that may change in the database, as `_CHECK` writes it
# (a text per row and context, "id:cut:context"): the row's id, the length of its text while
# it is cut off (a draft's text only grows, and completing it clears the flag; no UPDATE
# touches a message that is not cut off, chat/services.py), and the primary keys of the
# contexts attached to it, in order (an artifact is attached as it is stored and never
# changed, only deleted), each empty when there is none. Ids are never reused.
_Checked = tuple[str, ...]


def _checked(row_id: int, cut: int | None, pk: int | None) -> str:
    return f"{row_id}:{'' if cut is None else cut}:{'' if pk is None else pk}"


@dataclass
class _Kept:
    """A row as the window reads it, with its contexts and what it was read with
    (`_Checked`), kept from one step to the next; its entry is made once."""

    row: _Row
    contexts: list[tuple[str, str, Any]]
    checked: _Checked
    chars: int  # what keeping it costs, in characters (`_kept_chars`)
    entry: tuple[dict[str, Any], int] | None = None  # without pictures (shared: never changed)

    def entry_of(self, pictures: dict[str, str] | None) -> tuple[dict[str, Any], int]:
        if pictures is not None:
            return _entry(self.row, self.contexts, pictures)
        if self.entry is None:
            self.entry = _entry(self.row, self.contexts, None)
        return self.entry


def _read(
    session_id: object, *, before: int | None = None, after: int | None = None, seen: int = 0
) -> list[_Kept]:
    """A batch of rows, newest first (`after`: only newer ones), with their contexts, read for
    the user messages newer than `seen` (the rows up to it are known to have none)."""
    rows = [_Row(*values) for values in _ROWS.rows(session_id, before, after)]
    user = Message.Role.USER
    contexts = _contexts_read(row.id for row in rows if row.role == user and row.id > seen)
    kept = []
    for row in rows:
        found = contexts.get(row.id)
        cut = row.size if row.cut_off else None
        if found is None:  # most rows: no context, `_checked(row.id, cut, None)` without a call
            checked, contexts_kept = (f"{row.id}:{'' if cut is None else cut}:",), []
        else:
            pks = sorted(context[0] for context in found)
            checked = tuple(_checked(row.id, cut, pk) for pk in pks)
            contexts_kept = [context[1:] for context in found]
        chars = _kept_chars(row, contexts_kept)
        kept.append(_Kept(row=row, contexts=contexts_kept, checked=checked, chars=chars))
    return kept


def _kept_chars(row: _Row, contexts: list[tuple[str, str, Any]]) -> int:
    """What keeping a row costs, in characters: its text, its calls and its contexts' data as
    JSON (a context may be megabytes: a selection of 200,000 ids; weighted for its decoded
    objects), and its objects (the row, its entry, its check) as `ROW_OVERHEAD_CHARS`.
    Measured once, when the row is read."""
    chars = len(row.text) + ROW_OVERHEAD_CHARS
    if row.tool_calls:
        chars += len(json_text(row.tool_calls))
    for _, _, data in contexts:
        chars += len(json_text(data)) * CONTEXT_CHARS_WEIGHT
    return chars


@dataclass
class _Turn:
    """A turn of the window, as kept between steps: its rows (oldest first), their entries
    without pictures and what they cost; a step adds the rows new since to the newest turn (or
    as turns of their own), never walks a kept one again."""

    rows: list[_Kept] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    cost: int = 0  # tokens of `entries`
    checks: int = 0  # what `_CHECK` reads of its rows
    chars: int = 0  # of its rows (`_kept_chars`)
    user: tuple[str, list[tuple[str, str, Any]]] | None = None  # its newest user message
    images: bool = False  # a user message of it has a picture

    def add(self, kept: _Kept) -> None:
        """A row newer than its others."""
        entry, tokens = kept.entry_of(None)
        self.rows.append(kept)
        self.entries.append(entry)
        self.cost += tokens
        self.checks += len(kept.checked)
        self.chars += kept.chars
        if kept.row.role == Message.Role.USER:
            self.user = (kept.row.text, kept.contexts)
            self.images = self.images or any(kind == "image" for _, kind, _ in kept.contexts)

    def sent(self, images: bool) -> tuple[list[dict[str, Any]], int]:
        """Its entries and their cost as the newest turn of a window: with its pictures as
        image parts when the model takes images (read again at every step, as before)."""
        if not (images and self.images):
            return self.entries, self.cost
        entries, cost = [], 0
        for kept in self.rows:
            pictures = None
            if kept.row.role == Message.Role.USER and any(
                kind == "image" for _, kind, _ in kept.contexts
            ):
                pictures = _pictures_of(kept.row.id)
            entry, tokens = kept.entry_of(pictures)
            entries.append(entry)
            cost += tokens
        return entries, cost


def _turns_of(rows: Iterable[_Kept], turns: list[_Turn]) -> None:
    """Add `rows` (oldest first, newer than every row of `turns`) to `turns` (oldest first):
    to the newest turn while they are of its number, else as turns of their own."""
    turn = turns[-1] if turns else None
    for kept in rows:
        if turn is None or kept.row.turn != turn.rows[-1].row.turn:
            turn = _Turn()
            turns.append(turn)
        turn.add(kept)


@dataclass
class _Gather:
    """Whole turns older than the known ones, newest first, while they fit (`used`: the tokens
    of the turns taken already). Rows are walked a batch at a time, each in the loop's own
    code: a call per turn, not per row."""

    budget: int
    images: bool
    known: bool  # the window's newest turn is known (not walked here)
    used: int = 0
    newest: list[dict[str, Any]] | None = None  # the newest turn's entries, if walked here
    taken: list[_Turn] = field(default_factory=list)  # newest first
    failed: _Turn | None = None  # the turn that did not fit
    edge: _Kept | None = None  # the row walked after it: the newest of an older turn
    latest_user: tuple[str, list[tuple[str, str, Any]]] | None = None
    walked: list[_Kept] = field(default_factory=list)  # every row walked, newest first
    turn_rows: list[_Kept] = field(default_factory=list)  # the turn being walked

    def walk(self, batch: list[_Kept]) -> bool:
        """Walk rows (newest first, after those walked already); False once a turn did not
        fit (the row walked last, `edge`, is the newest of an older turn: older rows may
        follow)."""
        for kept in batch:
            self.walked.append(kept)
            row = kept.row
            if self.latest_user is None and row.role == Message.Role.USER:
                self.latest_user = (row.text, kept.contexts)
            if self.turn_rows and row.turn != self.turn_rows[-1].row.turn:
                if not self.take(self.turn_rows):
                    self.edge = kept
                    return False
                self.turn_rows = []
            self.turn_rows.append(kept)
        return True

    def take(self, rows: list[_Kept]) -> bool:
        """Add one turn (`rows` newest first); False when it does not fit (`failed`)."""
        turn = _Turn()
        for kept in reversed(rows):
            turn.add(kept)
        if not self.known and not self.taken:  # the newest turn goes in, whatever it costs
            self.newest, cost = turn.sent(self.images)
        elif self.used + turn.cost > self.budget:
            self.failed = turn
            return False
        else:
            cost = turn.cost
        self.taken.append(turn)
        self.used += cost
        return True


# --- the rows kept between steps -------------------------------------------------------------

# The check reads at most this many rows (a row per attached context); a session whose kept
# rows come near it is read from the database at every step, as without keeping. A window is
# bounded by tokens, not rows: at 32,000 tokens a session of short turns (a question, a call, a
# short result, a short answer) fills ~2,000 rows, and at 2,048 here (kept windows up to 1,024
# rows) every step of such a session read and decoded its whole window again, 45-130 ms of the
# engine's one database thread a turn (session 31). The check's own cost is the database's: a
# short text a row, joined and compared in one statement (`_CHECK`) that answers one row.
CHECK_ROWS = 8_192
# What is kept for all sessions together, in characters of text, calls and contexts' data (the
# least recently used go first), and at most this many sessions.
KEPT_CHARS = 8_000_000
KEPT_SESSIONS = 4_096
# A kept row's objects (the row, its entry, its check) counted as this many characters.
ROW_OVERHEAD_CHARS = 256
# A context's data is kept decoded: its Python objects take 5-24 bytes per character of its
# JSON (lists of numbers, lists of small objects), text about one.
CONTEXT_CHARS_WEIGHT = 8


@dataclass
class _Session:
    """A session's rows as the last window walked them: whole turns from its newest row down,
    and the row walked after the oldest of them (`edge`: the newest of an older turn), unless
    they start the session (`complete`)."""

    turns: list[_Turn] = field(default_factory=list)  # oldest first, no row missing between
    # sums[i]: the tokens of the turns before turns[i] (from any base: only differences count)
    sums: list[int] = field(default_factory=lambda: [0])
    edge: _Kept | None = None
    complete: bool = False
    chars: int = 0  # of the turns' rows, the edge and `stored`
    # What `_CHECK` compares of the turns' rows and the edge (`_checked`), newest first.
    checked: list[str] = field(default_factory=list)
    # Rows the turn holding the claim stored since (`history_rows_stored`), newest first, and
    # what `_CHECK` reads of them: the next window's new rows when the check finds just these.
    stored: list[_Kept] = field(default_factory=list)
    stored_checked: list[str] = field(default_factory=list)
    stored_chars: int = 0

    @property
    def newest(self) -> int:
        """The id of the newest row kept (not counting `stored`), 0 if none."""
        return self.turns[-1].rows[-1].row.id if self.turns else 0

    def store(self, rows: list[_Kept], checked: list[str]) -> int:
        """Note `rows` (newest first, newer than the others) as stored since; their chars."""
        chars = sum([kept.chars for kept in rows])
        self.stored = rows + self.stored
        self.stored_checked = checked + self.stored_checked
        self.stored_chars += chars
        self.chars += chars
        return chars

    def unstore(self) -> tuple[list[_Kept], list[str]]:
        """The rows noted as stored since, and what the check reads of them, no longer kept."""
        stored, checked = self.stored, self.stored_checked
        self.stored, self.stored_checked = [], []
        self.chars -= self.stored_chars
        self.stored_chars = 0
        return stored, checked

    def newer(self, rows: list[_Kept]) -> None:
        """Add the rows stored since the newest kept one (newest first; every one of them)."""
        count = len(self.turns)
        _turns_of(reversed(rows), self.turns)
        del self.sums[max(count, 1) :]  # the newest kept turn may have grown
        for turn in self.turns[max(count - 1, 0) :]:
            self.sums.append(self.sums[-1] + turn.cost)
        self.checked[:0] = [values for kept in rows for values in kept.checked]
        self.chars += sum([kept.chars for kept in rows])

    def older(self, gather: _Gather, *, complete: bool) -> None:
        """Add the turns a walk took or left out (the walk starts at `edge`, if any)."""
        if self.edge is not None:  # walked again, as the first of the older rows
            del self.checked[len(self.checked) - len(self.edge.checked) :]
            self.chars -= self.edge.chars
        older = gather.taken[::-1]
        if gather.failed is not None:
            older.insert(0, gather.failed)
        self.turns[:0] = older
        self.sums = [0, *accumulate(map(attrgetter("cost"), self.turns))]
        self.checked += [values for kept in gather.walked for values in kept.checked]
        self.chars += sum([kept.chars for kept in gather.walked])
        self.edge, self.complete = gather.edge, complete

    def drop(self, count: int) -> None:
        """Keep no more than the turns from turns[count] on, and the newest row before them as
        the edge: older ones are no longer in any window of this budget (the next window's
        may take them again from the database, as before)."""
        if count < 1:
            return
        dropped = self.turns[:count]
        edge = dropped[-1].rows[-1]
        checks = sum(map(attrgetter("checks"), dropped)) - len(edge.checked)
        chars = sum(map(attrgetter("chars"), dropped)) - edge.chars
        if self.edge is not None:
            checks += len(self.edge.checked)
            chars += self.edge.chars
        del self.checked[len(self.checked) - checks :]
        self.chars -= chars
        del self.turns[:count]
        del self.sums[:count]
        self.edge, self.complete = edge, False

    def latest_user(self, first: int) -> tuple[str, list[tuple[str, str, Any]]] | None:
        """The newest user message among the rows a window from turns[first] walked: its
        turns, the one left out before them and the row after it."""
        turns = self.turns
        for index in range(len(turns) - 1, max(first - 1, 0) - 1, -1):
            if turns[index].user is not None:
                return turns[index].user
        after = turns[first - 2].rows[-1] if first >= 2 else self.edge if first == 1 else None
        if after is not None and after.row.role == Message.Role.USER:
            return after.row.text, after.contexts
        return None


class _KeptSessions:
    """The sessions' kept rows, least recently used first, at most `KEPT_CHARS` (`_kept_chars`)
    and `KEPT_SESSIONS`.
    A session's window is read by the turn holding its claim: one reader at a time, which
    takes the rows out (`take`) and puts back what it walked (`put`)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def take(self, key: str) -> _Session | None:
        with self._lock:
            session = self._sessions.pop(key, None)
            if session is not None:
                self._chars -= session.chars
            return session

    def put(self, key: str, session: _Session, *, first: bool = False) -> None:
        """Keep a session's walked rows, unless they are too many to check in one statement
        with the rows the next step adds (half its `CHECK_ROWS`) or a quarter of `KEPT_CHARS`;
        `first`: only if nothing is kept for it (`history_rows_stored`)."""
        if (
            not (session.turns or session.stored)
            or session.chars > KEPT_CHARS // 4
            or len(session.checked) + len(session.stored_checked) > CHECK_ROWS // 2
        ):
            return
        with self._lock:
            if first and key in self._sessions:
                return
            old = self._sessions.pop(key, None)
            self._chars += session.chars - (old.chars if old is not None else 0)
            self._sessions[key] = session
            while self._chars > KEPT_CHARS or len(self._sessions) > KEPT_SESSIONS:
                _, dropped = self._sessions.popitem(last=False)
                self._chars -= dropped.chars

    def stored_add(self, key: str, rows: list[_Kept]) -> None:
        """Note `rows` (newest first, newer than any row kept or noted) as stored since a kept
        session's last window, within the limits of `put` (past them the session is dropped)."""
        chars = sum([kept.chars for kept in rows])
        checked = [values for kept in rows for values in kept.checked]
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return
            newest = session.stored[0].row.id if session.stored else session.newest
            if rows[-1].row.id <= newest:
                return
            if (
                session.chars + chars > KEPT_CHARS // 4
                or len(session.checked) + len(session.stored_checked) + len(checked)
                > CHECK_ROWS // 2
            ):
                del self._sessions[key]
                self._chars -= session.chars
                return
            self._chars += session.store(rows, checked)
            self._sessions.move_to_end(key)
            while self._chars > KEPT_CHARS or len(self._sessions) > KEPT_SESSIONS:
                _, dropped = self._sessions.popitem(last=False)
                self._chars -= dropped.chars

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._chars = 0


_kept = _KeptSessions()


def history_rows_stored(
    *, session_id: object, messages: Sequence[Message], first: bool = False
) -> None:
    """Messages the turn holding the session's claim has just stored, oldest first, noted with
    the session's kept rows as a window reads them: when the next window's check finds just
    these as its new rows, no statement reads them (a statement and its rows' Python work each
    step of a turn, issue 15). Any other new row (stored by anyone else, or not noted: a draft,
    a message with contexts) and the new rows are read as before (engine invariant 6). A note
    is skipped (no window reads it); the messages are noted up to the first that cannot be.

    `first`: they are the session's first turn's (none numbered before), so very likely its
    only rows: kept as the whole session when nothing is kept for it, and the next window
    checks them, every row of the session in that statement (any other row, and the window is
    read as before), instead of reading the rows and their contexts (a statement more, on the
    first turn of every new session: a bench's level starts with every user's at once)."""
    try:
        rows: list[_Kept] = []
        for message in messages:
            if message.role == Message.Role.NOTE:
                continue
            kept = _stored_row(message)
            if kept is None or (rows and kept.row.id <= rows[-1].row.id):
                break
            rows.append(kept)
        if rows and first:
            session = _Session(complete=True)
            session.store(rows[::-1], [values for kept in rows[::-1] for values in kept.checked])
            _kept.put(str(session_id), session, first=True)
        elif rows:
            _kept.stored_add(str(session_id), rows[::-1])
    except Exception:
        # Noting saves a read and nothing more: never in the way of what called it (the turn's
        # end releases its claim after it; review 30-a L2).
        logger.exception("session %s: stored rows not noted (read from the database)", session_id)


def _stored_row(message: Message) -> _Kept | None:
    """A stored message as the window reads it (`_read`), or None for a draft (its text may
    still grow). Its text fields hold what the database holds (a NUL-free text field replaces
    a NUL on the instance saved too, geosense/fields.py); its calls (a JSON field, which
    replaces a NUL only in what it sends) are made NUL-free here as the database got them: a
    model's call with a NUL in its arguments reads back with U+FFFD (review 30-a M1). The
    message has no context: one attached to it later shows in the check."""
    content, call_id = message.content, message.tool_call_id
    if message.cut_off:
        return None
    tool = message.role == Message.Role.TOOL
    row = _Row(
        id=message.pk,
        turn=message.turn,
        role=str(message.role),
        text=content[:TOOL_RESULT_CHARS] if tool else content,
        size=len(content),
        tool_calls=json_nul_free(message.tool_calls) if message.tool_calls else [],
        tool_call_id=call_id,
        cut_off=False,
    )
    checked = (f"{row.id}::",)  # `_checked(row.id, None, None)`, written out (a call a row)
    return _Kept(row=row, contexts=[], checked=checked, chars=_kept_chars(row, []))


def _checked_query(session_id: object, since: int, newest: int | None) -> QuerySet:
    """What `_CHECK` compares of the rows from `since` (to `newest`), newest first: a row per
    row and context (`_checked`)."""
    rows = Message.objects.filter(session_id=session_id).filter(id__gte=since)
    if newest is not None:
        rows = rows.filter(id__lte=newest)
    cut = Case(
        When(cut_off=True, then=Length("content")), default=Value(None), output_field=IntegerField()
    )
    rows = rows.exclude(role=Message.Role.NOTE).annotate(cut=cut, context=F("artifact__id"))
    return rows.order_by("-id", "artifact__id").values("id", "cut", "context")[:CHECK_ROWS]


# `_checked`'s texts of a `_checked_query`, joined by the database (the same text, spelled in
# each one's SQL). The vendor is the default connection's: GeoSense uses one database.
_JOINED = {
    "sqlite": "GROUP_CONCAT(id || ':' || COALESCE(cut, '') || ':' || COALESCE(context, ''), ',')",
    "postgresql": "STRING_AGG(CONCAT(id, ':', cut, ':', context), ',' ORDER BY id DESC, context)",
}


def _check_query(session_id: object, since: int, newest: int, kept: str) -> QuerySet:
    """One row: whether the kept rows' texts (`_checked`), joined in order, are `kept`, and the
    new rows' (newer than `newest`) joined, or NULL. PostgreSQL joins them in the order its
    aggregate names; SQLite in the order its subquery gives them (its `group_concat` takes an
    order from 3.44 only, and promises none before: a different one would only fail the
    check, since equal texts are the same rows, contexts and drafts' lengths; review 32-a L1)."""
    join = _JOINED[connections[DEFAULT_DB_ALIAS].vendor]
    kept_sql, kept_params = _checked_query(session_id, since, newest).query.sql_with_params()
    new_sql, new_params = _checked_query(session_id, newest + 1, None).query.sql_with_params()
    same = RawSQL(
        f"SELECT COALESCE({join}, '') = %s FROM ({kept_sql}) kept_rows",
        (kept, *kept_params),
        output_field=BooleanField(),
    )
    fresh = RawSQL(f"SELECT {join} FROM ({new_sql}) new_rows", new_params, output_field=TextField())
    return (
        ChatSession.objects.filter(pk=session_id)
        .annotate(same=same, fresh=fresh)
        .order_by()
        .values_list("same", "fresh")
    )


def _check_tail(
    connection: Any, session_id: object, since: int, newest: int, kept: str
) -> list[Any]:
    session = db_value(Message, "session", session_id, connection)
    note = Message.Role.NOTE
    return [kept, session, since, newest, note, session, newest + 1, note, session]


# Every step checks its kept rows: compiled once per process. SQLite (or PostgreSQL) reads
# every kept row, and the answer is one row: Python's work is the rows stored since, not
# the window's (each kept row's three integers were a tuple to make and compare at every step
# of every turn, issue 15).
_CHECK = CompiledRead(
    build=_check_query,
    tail=_check_tail,
    shape=lambda session_id, since, newest, kept: CHECK_ROWS,
    converted=False,
)


def _known(session_id: object, session: _Session | None) -> tuple[_Session, list[_Kept]]:
    """The session's kept turns, with the rows stored since added, if one statement shows each
    kept row still as it was kept and no other row among them (a row deleted, a context added
    or removed, a draft grown or completed, a row committed late: all read again). Else a new
    `_Session` and the newest rows, if read already (the window walks from them)."""
    if session is None:
        return _Session(), []
    since = session.edge.row.id if session.edge is not None else 0
    newest = session.newest
    stored, stored_checked = session.unstore()
    found = _CHECK.rows(session_id, since, newest, ",".join(session.checked))
    if not found or not found[0][0]:
        return _Session(), []
    if found[0][1] is None:
        return session, []
    fresh_checked = found[0][1].split(",")
    if len(fresh_checked) + len(session.checked) >= CHECK_ROWS:
        return _Session(), []
    if fresh_checked == stored_checked:  # just what the turn stored: known already
        session.newer(stored)
        return session, []
    # The new rows the check saw without a context have none: their contexts are not read.
    contexts = not all(text.endswith(":") for text in fresh_checked)
    seen = newest if contexts else int(fresh_checked[0].partition(":")[0])
    fresh = _read(session_id, after=newest, seen=seen)
    if len(fresh) >= READ_BATCH:  # too many to join up: the rows before them are read
        return _Session(), fresh
    session.newer(fresh)
    return session, []


def history_window(*, session_id: object, budget: int, images: bool = False) -> HistoryWindow:
    """The newest whole turns of the session whose estimate fits `budget` tokens (the newest
    turn always), read from the database only as far back as they reach.

    `images`: the newest user message's pictures go as `image_url` parts (the model takes
    images); older pictures, and every picture otherwise, are described in words.

    The turns a window walked are kept for the session's next one (its next step, its next
    turn), which reads only the rows stored since and one statement checking the kept ones
    (`_known`), adds them to its newest turns and finds the oldest turn that fits from the
    kept turns' token sums: a step costs what is new, not the window's length."""
    key = str(session_id)
    session, start = _known(session_id, _kept.take(key))
    turns, sums = session.turns, session.sums
    newest, used = turns[-1].sent(images) if turns else ([], 0)
    # Turns cost at least a token: the sums grow, and the oldest turn that fits with those
    # after it is found by bisection (a window is the newest turns that fit, in a row).
    first = bisect_left(sums, sums[-2] - (budget - used), 0, len(turns) - 1) if turns else 0
    latest_user = session.latest_user(first)
    if first == 0 and not session.complete:  # older turns may fit: walk them
        gather = _Gather(budget=budget, images=images, known=bool(turns))
        gather.used = used + sums[-2] - sums[0] if turns else 0
        complete = True
        edge = [session.edge] if session.edge is not None else start
        for batch in _newest_first(session_id, edge):
            if not gather.walk(batch):
                complete = False
                break
        else:
            if gather.turn_rows:
                gather.take(gather.turn_rows)
        if not turns:
            newest = gather.newest or []
        latest_user = latest_user or gather.latest_user
        session.older(gather, complete=complete)
        first = int(gather.failed is not None)
    messages = list(chain.from_iterable(map(attrgetter("entries"), session.turns[first:-1])))
    messages += newest
    session.drop(first - 1)
    _kept.put(key, session)
    return HistoryWindow(messages=messages, left_out=first > 0, latest_user=latest_user)


def _newest_first(session_id: object, known: list[_Kept]) -> Iterator[list[_Kept]]:
    """The known rows, then the older ones read a batch at a time (newest first)."""
    yield known
    before = known[-1].row.id if known else None
    while True:
        batch = _read(session_id, before=before)
        yield batch
        if len(batch) < READ_BATCH:
            return
        before = batch[-1].row.id
