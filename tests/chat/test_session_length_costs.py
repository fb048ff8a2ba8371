"""What every turn does to the stored transcript costs what the latest turns hold, not the
session's length (issue 15 cause 2: a turn of a long session held the one database thread
of the process, and the GIL, while it read every earlier call twice per turn and per step)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.backends import utils

from chat import services
from chat.models import ChatSession, Message
from tests.chat.costs import Costs, python_calls_of
from tests.chat.helpers import stored_history_is_valid

pytestmark = pytest.mark.django_db


@contextmanager
def rows_counted() -> Iterator[list[int]]:
    """Rows the database hands to Python while the block runs (every fetch of a query)."""
    read = [0]
    wrapped: dict[str, Callable] = {}

    def counting(name: str) -> Callable:
        def fetch(self: Any, *args: Any) -> Any:
            rows = getattr(self.cursor, name)(*args)
            if rows is not None:
                read[0] += 1 if name == "fetchone" else len(rows)
            return rows

        return fetch

    for name in ("fetchone", "fetchmany", "fetchall"):
        wrapped[name] = counting(name)
    originals = {name: utils.CursorWrapper.__dict__.get(name) for name in wrapped}
    try:
        for name, fetch in wrapped.items():
            setattr(utils.CursorWrapper, name, fetch)
        yield read
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(utils.CursorWrapper, name)
            else:
                setattr(utils.CursorWrapper, name, original)


def long_session(turns: int) -> ChatSession:
    """A session of `turns` settled turns, each: a question, a call `call_0`-like, its result,
    the answer (ids made fresh as the engine does)."""
    user = get_user_model().objects.create_user("long")
    session = ChatSession.objects.create(user=user, turn_count=turns)
    rows = []
    for turn in range(1, turns + 1):
        call_id = f"call-{turn}"
        rows += [
            Message(session=session, turn=turn, role="user", content=f"question {turn}"),
            Message(
                session=session,
                turn=turn,
                role="assistant",
                tool_calls=[{"id": call_id, "name": "measure", "arguments": "{}"}],
            ),
            Message(
                session=session,
                turn=turn,
                role="tool",
                content="{}",
                tool_call_id=call_id,
                tool_name="measure",
            ),
            Message(session=session, turn=turn, role="assistant", content="an answer"),
        ]
    Message.objects.bulk_create(rows)
    return session


def session_with_a_lost_call() -> ChatSession:
    """A session of 300 turns whose last left a call without a result."""
    session = long_session(300)
    Message.objects.create(
        session=session,
        turn=300,
        role="assistant",
        tool_calls=[{"id": "lost", "name": "measure", "arguments": "{}"}],
    )
    return session


def test_the_repair_reads_the_latest_turns_only_and_still_repairs_them():
    session = session_with_a_lost_call()
    with rows_counted() as read:
        assert services.history_repair(session_id=session.pk) == 1
    assert read[0] < 20, f"{read[0]} rows read for a repair of one turn"
    assert Message.objects.filter(session=session, role="tool", tool_call_id="lost").exists()
    assert stored_history_is_valid(session.pk)


def test_a_new_messages_facts_read_gives_the_repair_the_latest_turns_in_its_own_statement(
    monkeypatch,
):
    """A new message reads the session's count, title and open pauses, and with them the
    latest turns' results and calls: the repair takes those (no statement of its own) and
    still repairs only what is left without a result; a session with no message yet gives
    none."""
    session = session_with_a_lost_call()
    services.session_turn_facts(session_id=session.pk)  # compiled by the first read
    with monkeypatch.context() as patched:
        costs = Costs(patched)
        count, titled, paused, idle, unsettled = services.session_turn_facts(session_id=session.pk)
        assert len(costs.statements) == 1, costs.statements
        assert (count, titled, paused, idle) == (300, False, False, True)
        assert len(unsettled) == 5  # turns 299 and 300: two calls, their results, the lost call
        statements = len(costs.statements)
        repaired = services.history_repair(
            session_id=session.pk, turn_count=count, pauses_open=False, unsettled=unsettled
        )
        assert repaired == 1
        repair = costs.statements[statements:]
        assert not [sql for sql in repair if sql.startswith("SELECT")], repair  # writes only
    assert stored_history_is_valid(session.pk)
    empty = ChatSession.objects.create(user=session.user)
    assert services.session_turn_facts(session_id=empty.pk) == (0, False, False, True, [])


def test_a_new_messages_facts_read_converts_its_pause_flags_once_not_per_row_read():
    """The open-pause flags come on every row the facts read joins (one per result and call of
    the latest turns): read as the database gives them and taken from the first row, not made
    into booleans by the ORM's converter on each row (two Python calls a row, every turn)."""
    session = session_with_a_lost_call()
    services.session_turn_facts(session_id=session.pk)  # compiled by the first read
    calls = python_calls_of(services.session_turn_facts, session_id=session.pk)
    # 5 rows: 36 Python calls with the flags converted on each.
    assert calls <= 26, calls


def test_fresh_call_ids_read_the_ids_like_the_new_ones_not_every_earlier_call():
    session = long_session(300)
    calls = [{"id": "call-7", "name": "measure", "arguments": "{}"}]
    with rows_counted() as read:
        fresh = services.tool_calls_with_fresh_ids(session_id=session.pk, calls=calls)
    assert read[0] < 20, f"{read[0]} rows read to number one call"
    assert fresh == [{"id": "call-7~2", "name": "measure", "arguments": "{}"}]


def test_fresh_call_ids_run_sql_compiled_once_per_process(monkeypatch):
    """Every step with calls numbers them: after the first, its read (the results named like
    the calls and the latest turns' calls: two reads before) compiles nothing."""
    session = long_session(3)
    calls = [{"id": "call-2", "name": "measure", "arguments": "{}"}]
    services.tool_calls_with_fresh_ids(session_id=session.pk, calls=calls, turn=3)
    costs = Costs(monkeypatch)
    fresh = services.tool_calls_with_fresh_ids(session_id=session.pk, calls=calls, turn=3)
    assert fresh == [{"id": "call-2~2", "name": "measure", "arguments": "{}"}]
    assert (costs.compiled, len(costs.statements)) == (0, 1), costs.statements


def test_a_call_id_reused_in_many_turns_and_in_the_running_turn_is_made_fresh_each_time():
    session = long_session(3)
    for turn, call_id in ((1, "call_0"), (2, "call_0~2")):
        Message.objects.create(
            session=session,
            turn=turn,
            role="assistant",
            tool_calls=[{"id": call_id, "name": "measure", "arguments": "{}"}],
        )
        Message.objects.create(
            session=session,
            turn=turn,
            role="tool",
            content="{}",
            tool_call_id=call_id,
            tool_name="measure",
        )
    # The running turn's earlier step: a call whose result is not stored yet (it waits).
    Message.objects.create(
        session=session,
        turn=3,
        role="assistant",
        tool_calls=[{"id": "call_0~3", "name": "measure", "arguments": "{}"}],
    )
    calls = [{"id": "call_0", "name": "measure", "arguments": "{}"}, {"id": "", "name": "m"}]
    fresh = services.tool_calls_with_fresh_ids(session_id=session.pk, calls=calls)
    assert [c["id"] for c in fresh] == ["call_0~4", "call"]
