"""chat.history keeps the rows a window walked for the session's next window: every window
is the one a read of the whole database would give (the oracle: tests/chat/history_reference.py,
the window as it was built before), whatever happened to the session's rows in between, and a
step reads only what was stored since."""

import json

import pytest
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat import history
from chat.history import TOOL_RESULT_CHARS, history_window
from chat.models import Artifact, ChatSession, Message
from chat.selectors import user_request_latest
from tests.chat.costs import python_calls_of
from tests.chat.history_reference import history_window_reference

pytestmark = pytest.mark.django_db

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="

# What happens to a session between two windows, as any process may do it (a turn of this or
# another process, the admin deleting a message or an artifact, a row committed late).
turn_op = st.tuples(
    st.just("turn"),
    st.integers(0, 2),  # calls
    st.sampled_from(["", "position", "image", "both"]),  # contexts of the user message
    st.sampled_from([5, 300, TOOL_RESULT_CHARS + 50]),  # result length
    st.booleans(),  # a note in the turn
    st.booleans(),  # stored by this process's turn: its kept rows told (`history_rows_stored`)
)
operations = st.lists(
    st.one_of(
        turn_op,
        st.tuples(st.just("draft"), st.sampled_from(["start", "grow", "complete", "call"])),
        st.tuples(st.just("delete message"), st.integers(0, 1_000)),
        st.tuples(st.just("delete context"), st.integers(0, 1_000)),
        st.tuples(st.just("attach context"), st.integers(0, 1_000)),
        st.tuples(st.just("late row"), st.sampled_from(["user", "assistant"])),
        st.tuples(
            st.just("window"),
            st.integers(1, 2_500),  # budget
            st.booleans(),  # images
            st.sampled_from([0, 1]),  # which process reads it
        ),
    ),
    max_size=30,
)


class Session:
    """A session and a scratch one (whose row ids a late row of the session takes)."""

    def __init__(self, user) -> None:
        self.session = ChatSession.objects.create(user=user)
        self.scratch = ChatSession.objects.create(user=user)
        self.reserved: Message | None = Message.objects.create(session=self.scratch, turn=0)
        self.late: Message | None = None
        self.turn = 0
        self.contexts = 0
        self.draft: Message | None = None

    def add(self, role: str, *, through: bool = False, **fields) -> Message:
        message = Message.objects.create(session=self.session, turn=self.turn, role=role, **fields)
        if through:  # as chat/turns.py tells the kept rows of what its turn stored
            history.history_rows_stored(session_id=self.session.pk, messages=[message])
        return message

    def context(self, message: Message, kind: str) -> None:
        data = {"png": PNG, "width": 8, "height": 6} if kind == "image" else {"zoom": 17}
        self.contexts += 1
        Artifact.objects.create(
            session=self.session,
            artifact_id=f"{kind}-{self.contexts}",
            kind=kind,
            data=data,
            origin=f"client:{kind}",
            message=message,
        )

    def apply(self, op: tuple) -> None:
        rows = list(Message.objects.filter(session=self.session).order_by("id"))
        if op[0] == "turn":
            _, calls, contexts, size, note, through = op
            self.turn += 1
            # A user message with contexts is not told (they are attached after it).
            user = self.add(
                "user", content=f"question {self.turn}", through=through and not contexts
            )
            for kind in ("position", "image"):
                if contexts in (kind, "both"):
                    self.context(user, kind)
            for n in range(calls):
                call = {"id": f"c{self.turn}-{n}", "name": "measure", "arguments": '{"i": 1}'}
                self.add("assistant", content="", tool_calls=[call], through=through)
                self.add(
                    "tool",
                    content="r" * size,
                    tool_call_id=call["id"],
                    tool_name="measure",
                    through=through,
                )
            if note:
                self.add("note", content="never sent", through=through)
            self.add("assistant", content=f"answer {self.turn}", through=through)
        elif op == ("draft", "start"):
            self.draft = self.add("assistant", content="dra", cut_off=True)
        elif op[0] == "draft" and self.draft is not None:
            # As chat/services.py writes a draft: its text grows while cut off; completing it
            # (with or without calls) clears the flag.
            if op[1] == "grow":
                Message.objects.filter(pk=self.draft.pk, cut_off=True).update(content="draft")
            else:
                calls = [{"id": "d", "name": "m", "arguments": "{}"}] if op[1] == "call" else []
                Message.objects.filter(pk=self.draft.pk, cut_off=True).update(
                    content="drafted", tool_calls=calls, cut_off=False
                )
                self.draft = None
        elif op[0] == "delete message" and rows:
            rows[op[1] % len(rows)].delete()
        elif op[0] == "delete context":
            contexts = list(Artifact.objects.filter(session=self.session).order_by("id"))
            if contexts:
                contexts[op[1] % len(contexts)].delete()
        elif op[0] == "attach context":
            users = [row for row in rows if row.role == "user"]
            if users:
                self.context(users[op[1] % len(users)], "position")
        elif op[0] == "late row":
            # A row committed after later ones (PostgreSQL's sequences): an id the session
            # never had, below its newest row (or below all of them: `reserved`).
            if self.reserved is not None:
                taken, self.reserved = self.reserved, None
            elif self.late is not None:
                taken, self.late = self.late, None
            else:
                self.late = Message.objects.create(session=self.scratch, turn=0, role="user")
                return
            pk = taken.pk
            taken.delete()
            Message.objects.create(
                pk=pk, session=self.session, turn=self.turn, role=op[1], content="late"
            )


def assert_same_window(session_id, *, budget: int, images: bool) -> None:
    kept = history_window(session_id=session_id, budget=budget, images=images)
    read = history_window_reference(session_id=session_id, budget=budget, images=images)
    assert json.dumps(kept.messages) == json.dumps(read.messages)
    assert kept.left_out == read.left_out
    # The step reads the latest request from the database when the window did not meet it.
    latest = user_request_latest(session_id=session_id)
    for window in (kept, read):
        if window.latest_user is not None:
            text, contexts = window.latest_user
            assert (text, [tuple(c) for c in contexts]) == (
                latest.text,
                [(c.artifact_id, c.type, c.data) for c in latest.contexts],
            )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    operations=operations,
    batch=st.sampled_from([3, 5, 256]),
    check_rows=st.sampled_from([12, history.CHECK_ROWS]),
)
def test_every_window_is_the_one_read_from_the_database(monkeypatch, operations, batch, check_rows):
    monkeypatch.setattr(history, "READ_BATCH", batch)
    monkeypatch.setattr(history, "CHECK_ROWS", check_rows)
    processes = [history._KeptSessions(), history._KeptSessions()]
    user = get_user_model().objects.get_or_create(username="kept")[0]
    session = Session(user)
    for op in [*operations, ("window", 2_000, True, 0)]:
        if op[0] == "window":
            monkeypatch.setattr(history, "_kept", processes[op[3]])
            assert_same_window(session.session.pk, budget=op[1], images=op[2])
        else:
            session.apply(op)


def turns(session: Session, count: int) -> None:
    for _ in range(count):
        session.apply(("turn", 1, "position", 300, False, False))


def test_a_step_decodes_only_the_rows_stored_since_the_last_window(monkeypatch):
    """Issue 15: every step of every turn read, decoded and estimated its whole window again.
    Now a turn's first step decodes its new user message, its second step the call and its
    result, whatever the session's length (200 messages here, or 16)."""
    decoded = [0]
    loads = json.loads

    def counted(*args, **kwargs):
        decoded[0] += 1
        return loads(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counted)  # JSON fields decode with it
    user = get_user_model().objects.create_user("steps")
    per_step = {}
    for length in (4, 50):
        session = Session(user)
        turns(session, length)
        history_window(session_id=session.session.pk, budget=100_000)  # the turn before
        turns(session, 1)
        decoded[0] = 0
        first = history_window(session_id=session.session.pk, budget=100_000)
        steps = [decoded[0]]
        call = {"id": "x", "name": "m", "arguments": "{}"}
        session.add("assistant", tool_calls=[call])
        session.add("tool", content="{}", tool_call_id="x", tool_name="m")
        decoded[0] = 0
        second = history_window(session_id=session.session.pk, budget=100_000)
        per_step[length] = [*steps, decoded[0]]
        assert first.messages[-4]["content"].startswith(f"question {length + 1}")
        assert second == history_window_reference(session_id=session.session.pk, budget=100_000)
    # Each new row's calls (a user message's contexts: their rows' data, one each).
    assert per_step[4] == per_step[50] == [4 + 1, 2], per_step


@pytest.mark.parametrize("through", [False, True])
def test_the_rows_a_turn_stored_are_kept_without_a_statement_reading_them(monkeypatch, through):
    """What the turn holding the claim stores (its user message, its calls, their results, its
    answer) its kept rows are told (`history_rows_stored`): the next window reads no new row
    for them (a statement a step, issue 15) and is the one read from the database, a long
    result cut as the database cuts it, a NUL in a text or in a call's name and arguments as
    storing replaced it (review 30-a M1: the calls were noted with the model's NUL). A user
    message with contexts, or a row stored by anyone else, is read from the database as
    before, with the other new rows."""
    read = []
    real_read = history._read
    monkeypatch.setattr(history, "_read", lambda *a, **k: read.append(1) or real_read(*a, **k))
    monkeypatch.setattr(history, "_kept", history._KeptSessions())
    user = get_user_model().objects.get_or_create(username="through")[0]
    session = Session(user)
    turns(session, 2)
    history_window(session_id=session.session.pk, budget=100_000)
    reads = []
    for other, contexts, size, note, text, name in (
        (False, "", TOOL_RESULT_CHARS + 50, True, "answer", "measure"),
        (False, "", 5, False, "an answer with a NUL \x00 in it", "meas\x00ure"),
        (False, "position", 5, False, "answer", "measure"),
        (True, "", 5, False, "answer", "measure"),
    ):
        if other:  # stored by someone else before the turn (a pause's result set aside)
            session.add("tool", content="set aside", tool_call_id="p", tool_name="m")
        session.turn += 1
        message = session.add("user", content="question", through=through)
        if contexts:
            session.context(message, contexts)
        arguments = '{"i": 1}' if name == "measure" else '{"q": "a\x00b"}'
        call = {"id": f"c{session.turn}", "name": name, "arguments": arguments}
        session.add("assistant", content="", tool_calls=[call], through=through)
        session.add(
            "tool", content="r" * size, tool_call_id=call["id"], tool_name="m", through=through
        )
        if note:
            session.add("note", content="never sent", through=through)
        session.add("assistant", content=text, through=through)
        read.clear()
        assert_same_window(session.session.pk, budget=100_000, images=False)
        reads.append(len(read))
    assert reads == ([0, 0, 1, 1] if through else [1, 1, 1, 1]), reads


def test_a_new_sessions_first_message_is_kept_as_its_whole_session(monkeypatch):
    """A new session's first turn's message is kept as the session's only row: its first
    window checks it (a statement) instead of reading the rows and their contexts (two). Any
    other row the session holds after all (written without a turn's numbering) shows in that
    check, which read every row of the session: the rows it did not know are read as new ones
    (their contexts only if the check showed some)."""
    from tests.chat.costs import Costs

    monkeypatch.setattr(history, "_kept", history._KeptSessions())
    user = get_user_model().objects.get_or_create(username="first")[0]
    statements = []
    for earlier in (False, False, True):
        session = Session(user)
        if earlier:  # a row no turn numbered (an import, a test's fixture)
            session.add("user", content="before")
            session.add("assistant", content="earlier answer")
        session.turn = 1
        message = session.add("user", content="the first question")
        history.history_rows_stored(session_id=session.session.pk, messages=[message], first=True)
        with monkeypatch.context() as patched:
            costs = Costs(patched)
            history_window(session_id=session.session.pk, budget=100_000)
        statements.append(len(costs.statements))
        history.history_rows_stored(session_id=session.session.pk, messages=[message], first=True)
        assert_same_window(session.session.pk, budget=100_000, images=False)
    assert statements[1:] == [1, 2], statements  # 2 read before; the check, then the rows


def test_a_window_of_thousands_of_short_rows_is_kept_and_checked_in_one_statement(monkeypatch):
    """A window is bounded by tokens: at 32,000 a session of short turns fills ~2,000 rows. Kept
    only up to 1,024 rows, every step of such a session read and decoded its whole window again
    (eight reads of 256 rows, their entries and estimates: 45-130 ms of the engine's database
    thread a turn, session 31); kept, a step checks it in one statement."""
    from tests.chat.costs import Costs

    monkeypatch.setattr(history, "_kept", history._KeptSessions())
    user = get_user_model().objects.get_or_create(username="short turns")[0]
    session = ChatSession.objects.create(user=user)
    Message.objects.bulk_create(
        Message(session=session, turn=turn, role=role, **fields)
        for turn in range(1, 501)
        for role, fields in (
            ("user", {"content": "go"}),
            (
                "assistant",
                {"content": "", "tool_calls": [{"id": f"c{turn}", "name": "m", "arguments": "{}"}]},
            ),
            ("tool", {"content": "ok", "tool_call_id": f"c{turn}", "tool_name": "m"}),
            ("assistant", {"content": "done"}),
        )
    )
    first = history_window(session_id=session.pk, budget=100_000)
    assert len(first.messages) == 2_000 and not first.left_out
    with monkeypatch.context() as patched:
        costs = Costs(patched)
        again = history_window(session_id=session.pk, budget=100_000)
    assert len(costs.statements) == 1, len(costs.statements)  # 16 while kept up to 1,024 rows
    assert again.messages == first.messages


def test_a_step_costs_the_same_python_calls_whatever_the_windows_length():
    """Every step walked its whole window again (issue 15: the engine's database thread every
    turn queues on): a Python call per kept turn (138 calls at 10 turns, 248 at 120, session
    32). Now the kept turns stay gathered with their token sums, and a step adds only its new
    rows and finds the oldest turn that fits by bisection: the same calls at any length."""
    user = get_user_model().objects.create_user("walks")
    calls = {}
    for length in (2, 10, 120):  # the first compiles the reads (geosense/compiled.py)
        session = Session(user)
        turns(session, length)
        history_window(session_id=session.session.pk, budget=100_000)  # the turn before
        turns(session, 1)
        calls[length] = python_calls_of(
            history_window, session_id=session.session.pk, budget=100_000
        )
    assert calls[10] == calls[120] < 150, calls


def test_the_kept_turns_follow_the_budget_down_and_up(monkeypatch):
    """A step keeps only the turns of its window, the one left out before them and the row
    after it (`_Session.drop`); a later window with a larger budget (another agent's tools, a
    shorter prompt) walks the older turns from that row again, and one with the same budget
    finds the same turns from the kept token sums: each is the window read from the
    database, with or without new rows between them."""
    monkeypatch.setattr(history, "_kept", history._KeptSessions())
    monkeypatch.setattr(history, "READ_BATCH", 5)  # batches end inside turns
    user = get_user_model().objects.get_or_create(username="budgets")[0]
    session = Session(user)
    turns(session, 12)
    for budget, more in (
        (100_000, 0),
        (400, 0),
        (400, 1),
        (150, 0),
        (900, 1),
        (1, 0),
        (100_000, 1),
    ):
        turns(session, more)
        assert_same_window(session.session.pk, budget=budget, images=False)
        kept = history._kept._sessions[str(session.session.pk)]
        assert kept.complete or kept.edge.row.id < kept.turns[0].rows[0].row.id


def test_a_steps_check_answers_one_row_whatever_the_windows_length(monkeypatch):
    """The check's answer held every kept row (its id, a draft's length, a context's id: a
    tuple made and compared at every step of every turn, 44 rows at 10 turns and 484 at 120,
    issue 15). The database now joins them and compares them with the kept ones' text: one
    row, the new rows' texts in it."""
    answers = []
    rows = history._CHECK.rows
    monkeypatch.setattr(
        history._CHECK, "rows", lambda *args: answers.append(rows(*args)) or answers[-1]
    )
    user = get_user_model().objects.create_user("one-row")
    sizes, new = {}, {}
    for length in (10, 120):
        session = Session(user)
        turns(session, length)
        history_window(session_id=session.session.pk, budget=100_000)
        turns(session, 1)
        answers.clear()
        assert_same_window(session.session.pk, budget=100_000, images=False)
        answer = answers[-1]  # (the first also compiles the statement, then runs it)
        # One row (by construction: the session's), which says the kept rows passed (review
        # 32-a L2: a check that always failed would re-read the same window, unseen).
        sizes[length] = len(answer), bool(answer[-1][0])
        context = Artifact.objects.get(message__content=f"question {length + 1}").pk
        new[length] = answer[-1][-1], context
    assert sizes == {10: (1, True), 120: (1, True)}, sizes
    for texts, context in new.values():  # the new turn's 4 rows, its question's context
        assert [text.partition(":")[2] for text in texts.split(",")] == [
            ":",
            ":",
            ":",
            f":{context}",
        ]


def test_two_rows_deleted_and_two_committed_late_with_the_same_ids_sum_show_in_the_check():
    """What the check compares is every kept row's id, draft length and contexts, not a count
    or a sum of them: two kept rows deleted and two rows committed late between them (ids
    never used, summing to the deleted ones') are seen, and the window is read again."""
    user = get_user_model().objects.create_user("late-pair")
    session = Session(user)
    reserved = []
    for _ in range(3):
        turns(session, 1)
        reserved.append(Message.objects.create(session=session.scratch, turn=0))
    turns(session, 1)
    history_window(session_id=session.session.pk, budget=100_000)
    ids = list(Message.objects.filter(session=session.session).values_list("id", flat=True))
    low, high = reserved[0].pk, reserved[2].pk
    deleted = [low - 1, high + 1]  # a kept row before the first reserved id, one after the last
    assert set(deleted) <= set(ids)
    Message.objects.filter(pk__in=deleted).delete()
    for row in (reserved[0], reserved[2]):
        pk = row.pk
        row.delete()
        Message.objects.create(pk=pk, session=session.session, turn=1, role="user", content="late")
    assert sum(deleted) == low + high
    assert_same_window(session.session.pk, budget=100_000, images=False)


@pytest.mark.parametrize(
    "change",
    ["delete message", "delete context", "attach context", "draft grown", "draft completed"],
)
def test_every_change_to_a_kept_row_shows_in_the_check(change):
    """Each change engine invariant 6 lets happen to a stored row fails the check, and the
    window is the one read from the database."""
    user = get_user_model().objects.get_or_create(username="changes")[0]
    session = Session(user)
    turns(session, 3)
    session.apply(("draft", "start"))
    history_window(session_id=session.session.pk, budget=100_000)
    if change == "draft grown":
        session.apply(("draft", "grow"))
    elif change == "draft completed":
        session.apply(("draft", "complete"))
    else:
        session.apply((change, 1))
    assert_same_window(session.session.pk, budget=100_000, images=False)


def test_a_step_reads_the_contexts_of_its_new_rows_only_when_they_have_some():
    """A step after a kept window read the contexts of a new user message by a statement of
    its own (with or without any: the check had read their ids), and made what the next check
    compares of a row without a context in three Python calls: 3 statements and 160 Python
    calls for one new turn of 4 rows (10 kept before it), now 2 and 121 (issue 15). A new
    user message with a context still has it read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    user = get_user_model().objects.create_user("new-rows")
    for _ in range(2):  # the first compiles the reads (geosense/compiled.py)
        session = Session(user)
        turns(session, 10)
        history_window(session_id=session.session.pk, budget=100_000)
        session.apply(("turn", 1, None, 300, False, False))  # no context
        calls = python_calls_of(history_window, session_id=session.session.pk, budget=100_000)
    assert calls <= 130, calls
    session.apply(("turn", 1, None, 300, False, False))
    with CaptureQueriesContext(connection) as statements:
        window = history_window(session_id=session.session.pk, budget=100_000)
    assert len(statements) == 2, [query["sql"][:60] for query in statements]
    message = session.add("user", content="with a context")
    Artifact.objects.create(
        session=session.session,
        artifact_id="selection-new",
        kind="selection",
        data={"ids": [1]},
        origin="client:selection",
        message=message,
    )
    window = history_window(session_id=session.session.pk, budget=100_000)
    assert window.latest_user == ("with a context", [("selection-new", "selection", {"ids": [1]})])


def test_what_is_kept_counts_the_contexts_data_and_the_sessions(monkeypatch):
    """A context may be megabytes (a selection of 200,000 ids): counted as text alone, five
    such sessions kept 36 MB under a bound that saw 715 characters. Contexts' data counts,
    and so does the number of sessions."""
    user = get_user_model().objects.create_user("kept-size")
    selection = {"ids": list(range(200_000))}
    history._kept.clear()
    monkeypatch.setattr(history, "KEPT_SESSIONS", 3)
    monkeypatch.setattr(history, "KEPT_CHARS", 200_000_000)  # room for all five
    for n in range(5):
        session = Session(user)
        message = session.add("user", content=f"question {n}")
        Artifact.objects.create(
            session=session.session,
            artifact_id=f"selection-{n}",
            kind="selection",
            data=selection,
            origin="client:selection",
            message=message,
        )
        history_window(session_id=session.session.pk, budget=100_000)
        json_chars = len(json.dumps(selection, separators=(",", ":")))
        assert history._kept._chars >= history.CONTEXT_CHARS_WEIGHT * json_chars
    assert len(history._kept._sessions) == 3
    monkeypatch.setattr(history, "KEPT_CHARS", 20_000_000)  # a quarter is less than a session
    history._kept.clear()
    history_window(session_id=session.session.pk, budget=100_000)
    assert history._kept._chars == 0


def test_noting_stored_rows_never_raises_to_its_caller(monkeypatch, caplog):
    """Noting saves a read and nothing more: the turn's end notes its deferred result just
    before releasing its claim, so an error in the noting is logged and the rows are read from
    the database, never raised (review 30-a L2: an error there would skip the release)."""
    user = get_user_model().objects.get_or_create(username="noting")[0]
    session = Session(user)
    turns(session, 1)
    history_window(session_id=session.session.pk, budget=100_000)
    message = session.add("assistant", content="answer")

    def broken(message):
        raise ValueError("a bug in the noting")

    monkeypatch.setattr(history, "_stored_row", broken)
    history.history_rows_stored(session_id=session.session.pk, messages=[message])

    assert "stored rows not noted" in caplog.text
    assert_same_window(session.session.pk, budget=100_000, images=False)
