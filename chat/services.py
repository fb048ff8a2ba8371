"""Writes of the chat core: sessions, the turn claim, messages, results, artifacts, and the
client tools each socket registered. Pauses are written by `chat/approvals.py`.

All synchronous ORM code; async callers run it in a worker thread (`chat.turns.in_thread`,
the consumer's `database_sync_to_async`).
"""

import json
import secrets
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from geosense.compiled import CompiledInsert, CompiledRead, CompiledUpdate, db_value
from geosense.fields import nul_free
from tools.client import ClientTool

from . import processes
from .models import (
    Approval,
    Artifact,
    ChatSession,
    ClientToolRegistration,
    Message,
    PendingDecision,
    ServerProcess,
)

TURN_LEASE = timedelta(seconds=settings.GEOSENSE_TURN_LEASE)
TITLE_LENGTH = 60

INTERRUPTED_RESULT = "Not run: the turn ended before this call could run (the user moved on or the server restarted)."


class SessionBusy(Exception):
    """Another turn runs in this session."""


def session_create(*, user, title: str = "", allow_backend_tools: bool = False) -> ChatSession:
    return ChatSession.objects.create(
        user=user, title=title.strip()[:200], allow_backend_tools=allow_backend_tools
    )


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


def session_claim(*, session_id: object, numbered_from: int | None = None) -> bool:
    """Claim the session for one turn, across processes (docs/architecture.md, "Engine
    invariants" 2).

    The claim names this process; a dead process's claim is free at once (chat/processes.py),
    and any claim expires with its lease. Raises SessionBusy.

    `numbered_from`: the session's `turn_count` as a new message read it, no turn holding the
    session and nothing to set aside or repair (`session_turn_facts`, `calls_unanswered`): the
    claim numbers the new turn too (True), in the same update, if the count still holds (a
    turn numbered since may have left something to repair: then the claim alone, False). One statement and one write
    transaction fewer a turn than a claim and then a numbering (the session's row twice in
    the write-ahead log), on the database thread every turn queues on (issue 15).
    """
    processes.process_start()
    now = timezone.now()
    live = processes.heartbeats_on()
    fresh = processes.heartbeat_fresh_since() if live else None
    if numbered_from is not None and _CLAIM_NUMBERED.run(
        session_id, now, live, fresh, numbered_from
    ):
        return True
    if not _CLAIM.run(session_id, now, live, fresh):
        raise SessionBusy("a turn is already running in this session")
    return False


def _claim_update(session_id: object, now: Any, live: bool, fresh: Any):
    free = ChatSession.objects.filter(pk=session_id).filter(
        processes.claim_free_q(now, live=live, since=fresh)
    )
    return free, {
        "turn_state": ChatSession.TurnState.RUNNING,
        "turn_lease": now + TURN_LEASE,
        "turn_owner": processes.PROCESS_ID,
    }


def _claim_tail(connection: Any, session_id: object, now: Any, live: bool, fresh: Any):
    tail = [
        ChatSession.TurnState.RUNNING,
        db_value(ChatSession, "turn_lease", now + TURN_LEASE, connection),
        db_value(ChatSession, "turn_owner", processes.PROCESS_ID, connection),
        db_value(ChatSession, "id", session_id, connection),
        ChatSession.TurnState.IDLE,
        db_value(ChatSession, "turn_lease", now, connection),
    ]
    if live:
        tail.append(db_value(ServerProcess, "heartbeat", fresh, connection))
    return tail


def _claim_numbered_update(session_id: object, now: Any, live: bool, fresh: Any, count: int):
    free, values = _claim_update(session_id, now, live, fresh)
    return free.filter(turn_count=count), {**values, "turn_count": count + 1}


def _claim_numbered_tail(
    connection: Any, session_id: object, now: Any, live: bool, fresh: Any, count: int
):
    tail = _claim_tail(connection, session_id, now, live, fresh)
    return [*tail[:3], count + 1, *tail[3:], count]


# Every turn's claim (engine invariant 2), a new message's with its numbering: compiled once
# per process and heartbeat setting.
_CLAIM = CompiledUpdate(
    build=_claim_update, tail=_claim_tail, shape=lambda session_id, now, live, fresh: live
)
_CLAIM_NUMBERED = CompiledUpdate(
    build=_claim_numbered_update,
    tail=_claim_numbered_tail,
    shape=lambda session_id, now, live, fresh, count: live,
)


def session_lease_renew(*, session_id: object) -> None:
    _LEASE_RENEW.run(session_id, timezone.now() + TURN_LEASE)


def _lease_renew_update(session_id: object, lease: Any):
    running = ChatSession.objects.filter(pk=session_id, turn_state=ChatSession.TurnState.RUNNING)
    return running, {"turn_lease": lease}


def _lease_renew_tail(connection: Any, session_id: object, lease: Any) -> list[Any]:
    return [
        db_value(ChatSession, "turn_lease", lease, connection),
        db_value(ChatSession, "id", session_id, connection),
        ChatSession.TurnState.RUNNING,
    ]


# Every step and every call renews the lease: compiled once per process (geosense/compiled.py).
_LEASE_RENEW = CompiledUpdate(build=_lease_renew_update, tail=_lease_renew_tail)


def session_turn_running(*, session_id: object) -> bool:
    """A live turn holds the session's claim (not idle, not expired, its process alive)."""
    return (
        ChatSession.objects.filter(pk=session_id)
        .exclude(processes.claim_free_q(timezone.now()))
        .exists()
    )


def session_release(*, session_id: object) -> None:
    """Release this process's claim; one taken over meanwhile (this process was silent too
    long) belongs to another turn and stays."""
    _RELEASE.run(session_id, timezone.now())


def _release_update(session_id: object, now: Any):
    owned = ChatSession.objects.filter(pk=session_id, turn_owner=processes.PROCESS_ID)
    return owned, {
        "turn_state": ChatSession.TurnState.IDLE,
        "turn_lease": None,
        "turn_owner": None,
        "updated": now,
    }


def _release_tail(connection: Any, session_id: object, now: Any) -> list[Any]:
    return [
        ChatSession.TurnState.IDLE,
        db_value(ChatSession, "updated", now, connection),
        db_value(ChatSession, "id", session_id, connection),
        db_value(ChatSession, "turn_owner", processes.PROCESS_ID, connection),
    ]


# Every turn's end (engine invariant 2): compiled once per process.
_RELEASE = CompiledUpdate(build=_release_update, tail=_release_tail)


def turn_begin(*, session_id: object, count: int | None = None) -> int:
    """Number the new turn (a resume continues the current one). `count`: the session's
    `turn_count` as just read under the claim (`session_turn_facts`), so numbering is one
    conditional update; anything else (or a count that moved) reads the row locked."""
    if count is not None and _TURN_NUMBER.run(session_id, count):
        return count + 1
    with transaction.atomic():
        session = ChatSession.objects.select_for_update().get(pk=session_id)
        session.turn_count += 1
        session.save(update_fields=["turn_count"])
        return session.turn_count


def session_turn_facts(
    *, session_id: object
) -> tuple[int, bool, bool, bool, list[tuple[int, int, str, Any]]]:
    """(turn_count, whether the session has a title, whether a pause of it is open, whether
    no turn holds it (`turn_state` idle: released, never claimed), the latest turns' results
    and calls as `history_repair` reads them), in one read: a new
    message's turn needs them all (the repair and the numbering; the title from its first
    message; the pauses it sets aside, usually none: two reads of their own before, and the
    repair's read a statement of its own after, on the database thread every turn queues on,
    issue 15). The session's row is joined with its latest turns' messages (the turns from
    `turn_count - 1`, as the repair reads them): one row per message, or one with none."""
    rows = _TURN_FACTS.rows(session_id)
    if not rows:
        raise ChatSession.DoesNotExist("ChatSession matching query does not exist.")
    count, title, approval_open, decision_open, state = rows[0][:5]
    unsettled = [row[5:] for row in rows if row[5] is not None]
    idle = state == ChatSession.TurnState.IDLE
    return count, bool(title), bool(approval_open or decision_open), idle, unsettled


def _turn_number_update(session_id: object, count: int):
    return ChatSession.objects.filter(pk=session_id, turn_count=count), {"turn_count": count + 1}


def _turn_number_tail(connection: Any, session_id: object, count: int) -> list[Any]:
    return [count + 1, db_value(ChatSession, "id", session_id, connection), count]


def _turn_facts_query(session_id: object) -> models.QuerySet:
    def pending(model: type[Approval] | type[PendingDecision]) -> models.Exists:
        return models.Exists(
            model.objects.filter(session_id=models.OuterRef("pk"), status=model.Status.PENDING)
        )

    latest = models.FilteredRelation(
        "messages",
        condition=models.Q(messages__turn__gte=models.F("turn_count") - 1)
        & _results_and_calls("messages__"),
    )
    return (
        ChatSession.objects.filter(pk=session_id)
        .annotate(latest=latest)
        .annotate(
            approval_open=pending(Approval),
            decision_open=pending(PendingDecision),
            calls=_calls_of("latest__"),
        )
        .order_by("latest__id")
        .values_list(
            "turn_count",
            "title",
            "approval_open",
            "decision_open",
            "turn_state",
            "latest__id",
            "latest__turn",
            "latest__tool_call_id",
            "calls",
        )
    )


# Every new message's turn reads the session's count, title, open pauses and latest turns'
# results and calls, then numbers the turn (under the claim, so the count read still holds):
# both compiled once per process.
# The open-pause flags, on every row, come as the database gives them (`bool` of the first).
_TURN_FACTS = CompiledRead(
    build=_turn_facts_query,
    tail=lambda connection, session_id: [db_value(ChatSession, "id", session_id, connection)],
    raw=(2, 3),
)
_TURN_NUMBER = CompiledUpdate(build=_turn_number_update, tail=_turn_number_tail)


# Every turn stores its user message, one assistant message a step and one result a call: the
# insert is compiled once per process (geosense/compiled.py).
_MESSAGE_INSERT = CompiledInsert(Message)


def message_store(
    *,
    session_id: object,
    turn: int,
    role: str,
    content: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
    draft_id: int | None = None,
    titled: bool | None = None,
) -> Message:
    """Store a message; `draft_id` completes the draft its stream was stored in so far.
    `titled`: whether the session has a title, when the caller read it already (a user
    message titles an untitled session).

    A draft is the one message ever updated, and only while it is cut off: its text grows,
    then its completion clears the flag (chat/history.py keeps rows between steps on that)."""
    if draft_id is not None:
        Message.objects.filter(pk=draft_id, session_id=session_id, cut_off=True).update(
            content=content, tool_calls=tool_calls or [], cut_off=False
        )
        return Message.objects.get(pk=draft_id)
    message = _MESSAGE_INSERT.create(
        session_id=session_id, turn=turn, role=role, content=content, tool_calls=tool_calls or []
    )
    if role == Message.Role.USER:
        if titled is None:
            titled = bool(ChatSession.objects.values_list("title", flat=True).get(pk=session_id))
        if not titled:
            from .markup import message_plain_text

            title = " ".join(message_plain_text(content).split())[:TITLE_LENGTH] or "New session"
            _TITLE_SET.run(session_id, title)
    return message


def _title_set_update(session_id: object, title: str):
    return ChatSession.objects.filter(pk=session_id, title=""), {"title": title}


def _title_set_tail(connection: Any, session_id: object, title: str) -> list[Any]:
    return [nul_free(title), db_value(ChatSession, "id", session_id, connection), ""]


# A session's first message titles it: compiled once per process (through the ORM, 285
# Python calls on the engine's database thread for each new session's first turn, 15 now; a
# bench's level starts with every user's at once, issue 15).
_TITLE_SET = CompiledUpdate(build=_title_set_update, tail=_title_set_tail)


def message_draft_save(*, session_id: object, turn: int, draft_id: int | None, content: str) -> int:
    """Store the assistant's text streamed so far, marked cut off until its stream completes
    (`message_store(draft_id=…)`): if the process dies or the model fails, what the user saw
    stays. Returns the draft's id; a completed draft is never overwritten."""
    if draft_id is None:
        return Message.objects.create(
            session_id=session_id,
            turn=turn,
            role=Message.Role.ASSISTANT,
            content=content,
            cut_off=True,
        ).pk
    Message.objects.filter(pk=draft_id, cut_off=True).update(content=content)
    return draft_id


def tool_calls_with_fresh_ids(
    *, session_id: object, calls: list[dict[str, Any]], turn: int | None = None
) -> list[dict[str, Any]]:
    """The step's calls, each with an id not used before in the session.

    Some OpenAI-compatible servers number calls per response (`call_0` every time); a reused
    id would make a new call look answered by an old result. Reads the ids like these, not
    every call of the session: its cost does not grow with the session. `turn`: the running
    turn holding the claim (the session's latest), which spares reading the turn count.
    """
    bases = sorted({call["id"] or "call" for call in calls})
    # Every earlier call has its result (engine invariant 1), so the results name them, read
    # by id in the database; only the latest turns may hold calls still without one: both in
    # one statement.
    since = _turns_unsettled(session_id) if turn is None else max(0, turn - 1)
    used: set[str] = set()
    assistants = []  # decoded alone: results are many (a model that reuses its ids), these few
    for row in _IDS_USED.rows(session_id, bases, since):
        if row[1] is None:  # a result
            used.add(row[0])
        else:
            assistants.append(row)
    for _, tool_calls in _IDS_USED.convert(assistants, session_id, bases, since):
        used.update(call["id"] for call in tool_calls)
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
    lease_renew: bool = False,
    title: str = "",
    summary: str = "",
) -> Message:
    """Store the one result of a call; a second result for the same call is never written.

    `lease_renew`: the running turn's claim is renewed with it (one trip to the database
    thread per call, not two). `title` and `summary` word a client tool's call for a person
    (the activity log).
    """
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if lease_renew:
        session_lease_renew(session_id=session_id)
    values = dict(
        session_id=session_id,
        turn=turn,
        role=Message.Role.TOOL,
        content=text,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        is_error=is_error,
        title=title[: Message.TITLE_MAX_CHARS],
        summary=summary[: Message.SUMMARY_MAX_CHARS],
    )
    try:
        if not transaction.get_connection().in_atomic_block:
            # One statement, atomic by itself: a refused second result leaves nothing to undo
            # (a transaction around it cost a BEGIN and a COMMIT on every call's result).
            return _MESSAGE_INSERT.create(**values)
        with transaction.atomic():  # a savepoint: the caller's transaction goes on
            return _MESSAGE_INSERT.create(**values)
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


def _turns_unsettled(session_id: object) -> int:
    """The first turn that may hold a call without a result.

    A new message's turn begins only after a repair that went through (`turn_begin` follows
    `history_repair` and `pauses_set_aside` in chat.turns), and a turn's result is stored in
    the call's own turn; so every turn before the previous one is settled. The previous turn is
    read too: a turn begun (numbered) whose preparation then failed left the repair's turn one
    behind.
    """
    count = ChatSession.objects.filter(pk=session_id).values_list("turn_count", flat=True).first()
    return max(0, (count or 0) - 1)


def history_repair(
    *,
    session_id: object,
    turn_count: int | None = None,
    pauses_open: bool = True,
    unsettled: list[tuple[int, int, str, Any]] | None = None,
) -> int:
    """Give every call that has no result (a crash, an error mid-step) its result.

    Calls of a message that waits on a pending pause are left alone: they run after it.
    Keeps engine invariant 1 (docs/architecture.md) whatever happened before: the history stays
    valid to send. Only the latest turns can hold such calls (`_turns_unsettled`), so only they
    are read: a repair at every turn's start and end must not cost the session's length.
    `turn_count`: the session's, as the caller just read it; `pauses_open=False`: the caller
    set every pause aside in this transaction (a new message), so none is read; `unsettled`:
    the latest turns' results and calls as the caller read them with that count
    (`session_turn_facts`) with nothing written since, so they are not read again.
    """
    since = _turns_unsettled(session_id) if turn_count is None else max(0, turn_count - 1)
    paused: set[int] = set()
    if pauses_open:
        paused = set(
            Approval.objects.filter(
                session_id=session_id, status=Approval.Status.PENDING
            ).values_list("message_id", flat=True)
        ) | set(
            PendingDecision.objects.filter(
                session_id=session_id, status=PendingDecision.Status.PENDING
            ).values_list("message_id", flat=True)
        )
    if unsettled is None:
        unsettled = _UNSETTLED.rows(session_id, since)
    repaired = 0
    for turn, call in calls_unanswered(unsettled, paused=paused):
        tool_result_store(
            session_id=session_id,
            turn=turn,
            tool_call_id=call["id"],
            tool_name=call["name"],
            content={"error": INTERRUPTED_RESULT},
            is_error=True,
        )
        repaired += 1
    return repaired


def calls_unanswered(
    unsettled: list[tuple[int, int, str, Any]], *, paused: Collection[int] = ()
) -> list[tuple[int, dict[str, Any]]]:
    """The calls without a result among the latest turns' results and calls (as
    `session_turn_facts` and the repair read them), each with its turn, but those of a message
    in `paused` (its calls run after its pause)."""
    answered = {call_id for _, _, call_id, tool_calls in unsettled if tool_calls is None}
    return [
        (turn, call)
        for message_id, turn, _, tool_calls in unsettled
        if tool_calls is not None and message_id not in paused
        for call in tool_calls
        if call["id"] not in answered
    ]


def _results_and_calls(prefix: str = "") -> models.Q:
    """Results, and assistant messages with calls (`prefix`: the relation that reaches them)."""
    no_calls = models.Q(**{f"{prefix}tool_calls": []})
    assistant = models.Q(**{f"{prefix}role": Message.Role.ASSISTANT})
    return models.Q(**{f"{prefix}role": Message.Role.TOOL}) | (assistant & ~no_calls)


def _calls_of(prefix: str = "") -> models.Case:
    """An assistant message's calls, None for a result."""
    return models.Case(
        models.When(
            **{f"{prefix}role": Message.Role.ASSISTANT, "then": models.F(f"{prefix}tool_calls")}
        ),
        default=None,
    )


def _unsettled_query(session_id: object, since: int) -> models.QuerySet:
    """The latest turns' results (their call ids) and assistant messages with calls (their
    calls: None for a result), in order."""
    return (
        Message.objects.filter(session_id=session_id, turn__gte=since)
        .filter(_results_and_calls())
        .annotate(calls=_calls_of())
        .order_by("id")
        .values_list("id", "turn", "tool_call_id", "calls")
    )


def _unsettled_tail(connection: Any, session_id: object, since: int) -> list[Any]:
    session = db_value(Message, "session", session_id, connection)
    no_calls = db_value(Message, "tool_calls", [], connection)
    return [session, since, Message.Role.TOOL, Message.Role.ASSISTANT, no_calls]


# Every new message's turn repairs (engine invariant 1), in one read of the latest turns' results
# and calls (two before): compiled once per process.
_UNSETTLED = CompiledRead(build=_unsettled_query, tail=_unsettled_tail)


def _ids_used_query(session_id: object, bases: list[str], since: int) -> models.QuerySet:
    """The results named like `bases` (a base, or a base and `~n`), and the latest turns'
    assistant messages with calls (their calls: None for a result)."""
    assistant = Message.Role.ASSISTANT
    named = models.Q()
    for base in bases:
        named |= models.Q(tool_call_id=base) | models.Q(tool_call_id__startswith=f"{base}~")
    results = named & models.Q(role=Message.Role.TOOL)
    calls = models.Q(role=assistant, turn__gte=since) & ~models.Q(tool_calls=[])
    return (
        Message.objects.filter(session_id=session_id)
        .filter(results | calls)
        .annotate(
            calls=models.Case(
                models.When(role=assistant, then=models.F("tool_calls")), default=None
            )
        )
        .values_list("tool_call_id", "calls")
    )


def _ids_used_tail(connection: Any, session_id: object, bases: list[str], since: int):
    tail: list[Any] = [db_value(Message, "session", session_id, connection)]
    for base in bases:
        tail += [base, f"{connection.ops.prep_for_like_query(f'{base}~')}%"]
    no_calls = db_value(Message, "tool_calls", [], connection)
    return [*tail, Message.Role.TOOL, Message.Role.ASSISTANT, since, no_calls]


# Every step with calls gives them fresh ids (`tool_calls_with_fresh_ids`): compiled once per
# process and number of distinct ids (nearly always one).
_IDS_USED = CompiledRead(
    build=_ids_used_query,
    tail=_ids_used_tail,
    shape=lambda session_id, bases, since: len(bases),
    converted=False,
)


def client_tools_register(*, channel_name: str, session_id, tools: Sequence[ClientTool]) -> None:
    """Replace this socket's registration; registering on another session moves it there.

    No tools at all removes the registration: the socket then offers nothing.
    """
    if not tools:
        client_tools_unregister(channel_name=channel_name)
        return
    processes.process_start()
    # One statement (an upsert on the unique channel name), not `update_or_create`'s read, write
    # and transaction around them: every socket of a storm of connects registers.
    ClientToolRegistration.objects.bulk_create(
        [
            ClientToolRegistration(
                channel_name=channel_name,
                session_id=session_id,
                tools=[tool.declaration() for tool in tools],
                process=processes.PROCESS_ID,
            )
        ],
        update_conflicts=True,
        unique_fields=["channel_name"],
        update_fields=["session", "tools", "process", "updated"],
    )


def client_tools_unregister(*, channel_name: str) -> None:
    ClientToolRegistration.objects.filter(channel_name=channel_name).delete()
