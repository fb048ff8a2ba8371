"""The history window as chat/history.py built it before it kept rows between steps (at
cc00fcc): every window read from the database from the newest row back. Kept as the oracle
the kept window is compared with (tests/chat/test_history_kept.py); not used by the app."""

from dataclasses import dataclass
from typing import Any

from django.db.models import Case, F, TextField, When
from django.db.models.functions import Length, Substr

from chat import history
from chat.history import HistoryWindow, _pictures_of, tokens_estimate, user_content
from chat.models import Message


@dataclass
class _Row:
    id: int
    turn: int
    role: str
    text: str
    size: int
    tool_calls: list[dict[str, Any]]
    tool_call_id: str


def _rows_before(session_id: object, before: int | None) -> list[_Row]:
    rows = Message.objects.filter(session_id=session_id).exclude(role=Message.Role.NOTE)
    if before is not None:
        rows = rows.filter(id__lt=before)
    rows = rows.annotate(
        text=Case(
            When(role=Message.Role.TOOL, then=Substr("content", 1, history.TOOL_RESULT_CHARS)),
            default=F("content"),
            output_field=TextField(),
        ),
        size=Length("content"),
    ).order_by("-id")
    fields = ("id", "turn", "role", "text", "size", "tool_calls", "tool_call_id")
    return [_Row(*values) for values in rows.values_list(*fields)[: history.READ_BATCH]]


def _tool_text(row: _Row) -> str:
    if row.size <= history.TOOL_RESULT_CHARS:
        return row.text
    return (
        f"{row.text}… (cut: the model reads the first {history.TOOL_RESULT_CHARS} of "
        f"{row.size} characters of this result)"
    )


def _entry(row: _Row, contexts: dict, pictures: dict | None) -> tuple[dict[str, Any], int]:
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
    budget: int
    images: bool
    turns: list[list[dict[str, Any]]]
    used: int = 0
    latest_user: tuple[str, list[tuple[str, str, Any]]] | None = None

    def take(self, rows: list[_Row], contexts: dict) -> bool:
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


def history_window_reference(
    *, session_id: object, budget: int, images: bool = False
) -> HistoryWindow:
    gather = _Gather(budget=budget, images=images, turns=[])
    turn_rows: list[_Row] = []
    contexts: dict = {}
    before: int | None = None
    while True:
        batch = _rows_before(session_id, before)
        contexts.update(
            history.contexts_of_messages(r.id for r in batch if r.role == Message.Role.USER)
        )
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
        if len(batch) < history.READ_BATCH:
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
