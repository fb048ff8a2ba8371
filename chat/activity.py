"""What a turn's client-tool calls left in the transcript, as a person reads it.

Live, the page builds a turn's activity log from its events (static/geosense/live-turn.js).
Every client-tool call, one-way or blocking, is stored with its result and, since issue 16,
with its words (the tool's title and the call's summary, `Message.title`/`summary`), so the
same entries are rendered from the database: after a reload, and when a turn is rendered
again (the page then puts the stored entry, which knows the outcome, in place of the live one,
by its call id). Backend calls and the model's thinking are not part of this record (the seed:
that log is not stored).

A turn that asked for the user's location also shows one location card, on the message that
made its first `location_get` call, in the state the model last read ("Answered: PENDING…").
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .models import Message, PendingDecision

LOCATION_TOOL = "location_get"
# The words of a location card and of a location_get call in the log; the page's live card
# (static/geosense/location-card.js) says the same.
LOCATION_WORDS = {
    "GRANTED": "Location shared (within about {accuracy} m).",
    "DECLINED": "Location not shared.",
    "UNAVAILABLE": "Location unavailable.",
    "PENDING": "Answered: PENDING, no answer yet.",
}
NOT_ANSWERED = "Not answered by the page."
WAITING = "Waiting for an answer…"


@dataclass(frozen=True)
class ClientCall:
    """One entry of the activity log. `ok` is None while the call waits for its answer."""

    call_id: str
    title: str
    summary: str
    outcome: str
    ok: bool | None


@dataclass(frozen=True)
class LocationCard:
    """The location card of a turn: `status` is the last result's (`waiting` before any)."""

    status: str
    outcome: str


def _result_of(message: Message | None) -> dict[str, Any] | None:
    if message is None:
        return None
    try:
        value = json.loads(message.content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _location_words(result: Message | None) -> tuple[str, str]:
    """(status, words) of a location_get call's result."""
    if result is None:
        return "waiting", WAITING
    value = _result_of(result) or {}
    status = value.get("status")
    if result.is_error or status not in LOCATION_WORDS:
        return "none", NOT_ANSWERED
    accuracy = value.get("accuracy")
    accuracy = round(accuracy) if isinstance(accuracy, int | float) else "?"
    return status, LOCATION_WORDS[status].format(accuracy=accuracy)


def _picked_words(decision: PendingDecision, result: Message | None) -> str:
    if decision.status == PendingDecision.Status.SET_ASIDE:
        return "Set aside."
    if result is None:
        return "Waiting for your pick…"
    ids = (_result_of(result) or {}).get("ids") or []
    ids = [i for i in ids if isinstance(i, int)]
    if not ids:
        return "Nothing picked."
    shown = ", ".join(f"#{i}" for i in ids[:10])
    return f"Picked {shown}" + (f" and {len(ids) - 10} more." if len(ids) > 10 else ".")


def _outcome(name: str, result: Message | None, decision: PendingDecision | None) -> str:
    if decision is not None:
        return _picked_words(decision, result)
    if name == LOCATION_TOOL:
        return _location_words(result)[1]
    if result is None:
        return WAITING
    return NOT_ANSWERED if result.is_error else "Done."


def _client_call(
    call: dict[str, Any], result: Message | None, decision: PendingDecision | None
) -> ClientCall | None:
    """The log's entry for a stored call, or None when it is not a client tool's call."""
    if decision is not None:
        title, summary = decision.title or decision.tool_name, decision.summary
    elif result is not None and result.title:
        title, summary = result.title, result.summary
    else:
        return None  # a backend call, or a call whose answer has not come yet
    ok = None if result is None else not result.is_error
    return ClientCall(
        call_id=str(call.get("id", "")),
        title=title,
        summary=summary,
        outcome=_outcome(str(call.get("name", "")), result, decision),
        ok=ok,
    )


@dataclass(frozen=True)
class ClientRecord:
    """Each turn's log entries, and the location cards by the id of the message that shows one."""

    calls_by_turn: dict[int, list[ClientCall]]
    location_by_message: dict[int, LocationCard]


def client_record(messages: Iterable[Message]) -> ClientRecord:
    """The client-tool calls of `messages` (a session's, in order, decisions prefetched)."""
    messages = list(messages)
    results = {m.tool_call_id: m for m in messages if m.role == Message.Role.TOOL}
    calls_by_turn: dict[int, list[ClientCall]] = {}
    first_location: dict[int, int] = {}  # turn → the message showing its card
    last_location: dict[int, Message | None] = {}  # turn → the result of its last call
    for message in messages:
        if message.role != Message.Role.ASSISTANT or not message.tool_calls:
            continue
        decisions = {d.tool_call_id: d for d in message.pending_decisions.all()}
        for call in message.tool_calls:
            if not isinstance(call, dict):
                continue
            result = results.get(call.get("id"))
            entry = _client_call(call, result, decisions.get(call.get("id")))
            if entry is not None:
                calls_by_turn.setdefault(message.turn, []).append(entry)
            if call.get("name") == LOCATION_TOOL:
                first_location.setdefault(message.turn, message.pk)
                last_location[message.turn] = result
    location_by_message = {}
    for turn, message_id in first_location.items():
        status, words = _location_words(last_location[turn])
        location_by_message[message_id] = LocationCard(status=status, outcome=words)
    return ClientRecord(calls_by_turn=calls_by_turn, location_by_message=location_by_message)
