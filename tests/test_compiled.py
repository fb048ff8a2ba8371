"""geosense/compiled.py: a read compiled once gives what the ORM gives (values converted as the
ORM converts them) without building or compiling its queryset again, and a read whose
parameters the ORM compiles otherwise stays on the ORM."""

import os
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.db.models.sql import compiler as sql_compiler

from chat.models import ChatSession, Message
from geosense.compiled import CompiledInsert, CompiledRead, CompiledUpdate, db_value, time_param
from tests.chat.costs import python_calls_of
from tests.source_pins import source_digests

pytestmark = pytest.mark.django_db


@pytest.fixture
def sessions():
    user = get_user_model().objects.create_user(username="compiled", password="pw")
    first, second = (ChatSession.objects.create(user=user) for _ in range(2))
    for session, calls in ((first, [{"id": "a", "name": "x", "arguments": "{}"}]), (second, [])):
        Message.objects.create(session=session, turn=1, role="user", content="hi")
        Message.objects.create(session=session, turn=1, role="assistant", tool_calls=calls)
    return first, second


def _query(session_id, turn):
    return Message.objects.filter(session_id=session_id, turn__gte=turn).values_list(
        "id", "role", "tool_calls"
    )


def _turn_read(**options) -> CompiledRead:
    """A turn's messages of a session, compiled (`_query`)."""
    return CompiledRead(
        build=_query,
        tail=lambda connection, session_id, turn: [
            db_value(Message, "session", session_id, connection),
            turn,
        ],
        **options,
    )


def _title_update() -> CompiledUpdate:
    """A session's title set, compiled."""
    return CompiledUpdate(
        build=lambda session_id, title: (
            ChatSession.objects.filter(pk=session_id),
            {"title": title},
        ),
        tail=lambda connection, session_id, title: [
            title,
            db_value(ChatSession, "id", session_id, connection),
        ],
    )


def _compiles(monkeypatch) -> list[int]:
    counted: list[int] = []
    real = sql_compiler.SQLCompiler.as_sql

    def as_sql(self, *args, **kwargs):
        counted.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sql_compiler.SQLCompiler, "as_sql", as_sql)
    return counted


def _recorded(builds: list[object]):
    """`_query` as a read's `build`, recording the sessions it was built for."""

    def build(session_id, turn):
        builds.append(session_id)
        return _query(session_id, turn)

    return build


def test_a_compiled_read_runs_its_kept_sql_with_new_values(sessions, monkeypatch):
    builds: list[object] = []
    build = _recorded(builds)
    read = CompiledRead(
        build=build,
        tail=lambda connection, session_id, turn: [
            db_value(Message, "session", session_id, connection),
            turn,
        ],
    )
    first, second = sessions
    expected = [tuple(r) for r in _query(second.pk, 1)]
    compiles = _compiles(monkeypatch)
    assert read.rows(first.pk, 1) == [tuple(r) for r in _query(first.pk, 1)]
    builds.clear()
    compiles.clear()
    # Another session: the kept SQL with its values, the JSON decoded as the ORM decodes it.
    assert read.rows(second.pk, 1) == expected
    assert read.rows(first.pk, 1)[1][2] == [{"id": "a", "name": "x", "arguments": "{}"}]
    assert read.rows(first.pk, 2) == []
    assert builds == [] and compiles == [], "built or compiled again"


def test_an_unconverted_read_gives_its_rows_as_stored_from_its_first_call(sessions):
    """A read whose values come as the database gives them (the history's check) gives them
    so from its first call, which the ORM compiles (it gave them converted, as the ORM runs
    it, so a caller could not convert some of them later), and converts those its caller
    reads further as the ORM does."""
    first, _ = sessions
    read = _turn_read(converted=False)
    stored = read.rows(first.pk, 1)
    assert read.rows(first.pk, 1) == stored
    assert all(isinstance(calls, str) for _, _, calls in stored)  # the JSON's text
    assert read.convert(stored, first.pk, 1) == [tuple(r) for r in _query(first.pk, 1)]


def test_a_read_whose_parameters_differ_stays_on_the_orm(sessions, caplog):
    builds: list[object] = []
    build = _recorded(builds)
    # The tail in the wrong order: never bound that way, every call goes through the ORM.
    read = CompiledRead(
        build=build,
        tail=lambda connection, session_id, turn: [
            turn,
            db_value(Message, "session", session_id, connection),
        ],
    )
    first, second = sessions
    assert read.rows(first.pk, 1) == [tuple(r) for r in _query(first.pk, 1)]
    assert read.rows(second.pk, 1) == [tuple(r) for r in _query(second.pk, 1)]
    assert len(builds) == 2
    assert "stays on the ORM" in caplog.text


def _title_update_where_none() -> CompiledUpdate:
    """A session's title set where it has none, compiled."""

    def build(session_id, title):
        return ChatSession.objects.filter(pk=session_id, title=""), {"title": title}

    return CompiledUpdate(
        build=build,
        tail=lambda connection, session_id, title: [
            title,
            db_value(ChatSession, "id", session_id, connection),
            "",
        ],
    )


def test_a_compiled_update_sets_new_values_on_the_rows_it_filters(sessions, monkeypatch):
    update = _title_update_where_none()
    first, second = sessions
    assert update.run(first.pk, "one") == 1
    compiles = _compiles(monkeypatch)
    assert update.run(second.pk, "two") == 1
    assert update.run(first.pk, "again") == 0  # titled already: the filter holds
    assert compiles == []
    titles = dict(ChatSession.objects.values_list("pk", "title"))
    assert (titles[first.pk], titles[second.pk]) == ("one", "two")


def test_a_compiled_insert_stores_what_the_orm_stores_compiling_once(sessions, monkeypatch):
    """Its values are prepared as the ORM prepares them (the NUL a field replaces, the
    creation time, JSON), on the instance too, and its primary key comes back."""
    first, _ = sessions
    insert = CompiledInsert(Message)
    calls = [{"id": "c\x00", "name": "x", "arguments": "{}"}]
    orm = insert.create(session_id=first.pk, turn=2, role="assistant", content="a", tool_calls=[])
    inserts: list[int] = []
    real = sql_compiler.SQLInsertCompiler.as_sql

    def as_sql(self, *args, **kwargs):
        inserts.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sql_compiler.SQLInsertCompiler, "as_sql", as_sql)
    kept = insert.create(
        session_id=first.pk, turn=2, role="tool", content="b\x00", tool_calls=calls, is_error=True
    )

    assert inserts == []
    assert kept.pk > orm.pk and not kept._state.adding
    assert kept.content == "b\ufffd" and kept.created is not None
    stored = Message.objects.get(pk=kept.pk)
    assert (stored.session_id, stored.turn, stored.role, stored.content) == (
        first.pk,
        2,
        "tool",
        "b\ufffd",
    )
    assert stored.tool_calls == [{"id": "c\ufffd", "name": "x", "arguments": "{}"}]
    assert stored.is_error and stored.created == kept.created


@pytest.mark.django_db(transaction=True)
def test_a_compiled_statement_reads_its_answer_in_few_python_calls(sessions):
    """A compiled statement ran through Django's execute wrappers' loop with none installed,
    its answer was fetched through Django's cursor, which made and called an error wrapper
    for each fetch, a write outside a transaction ran under the context manager that marks
    one for rollback, and its parameters' fields were looked up at every call (issue 15:
    ~25 statements a turn on the engine's one database thread): 26 Python calls for this
    read and for this update before, 18 after; 15 with Django's broken-transaction check and
    error translation entered only when a transaction needs a rollback or the statement
    raised; 11 with the kept cursor found in the statement's own code; 10 with `DEBUG` read
    from where `LazySettings` caches it (its `__getattribute__` is a Python call)."""
    first, second = sessions
    read = _turn_read(converted=False)
    update = _title_update()
    read.rows(first.pk, 1), update.run(first.pk, "one"), read.rows(first.pk, 1)
    assert python_calls_of(read.rows, second.pk, 1) <= 10
    assert python_calls_of(update.run, second.pk, "two") <= 10
    assert ChatSession.objects.get(pk=second.pk).title == "two"


# `compiled.statement_run` reads `DEBUG` where `LazySettings` caches it: its `__getattr__` caches
# each setting read in its `__dict__`, its `__setattr__` and `__delattr__` clear what they
# change (all of it when an override replaces `_wrapped`). A lock bump that changes any of
# them fails here (review 31-a L3's rule).
ASSUMED_SOURCES = {
    "LazySettings.__getattr__": "371d4a5ad82f9736",
    "LazySettings.__setattr__": "f42afaa8727f7ccd",
    "LazySettings.__delattr__": "f216586e312ec9a9",
}


def test_the_django_settings_sources_the_debug_read_relies_on_are_the_ones_read():
    from django.conf import LazySettings

    originals = {
        "LazySettings.__getattr__": LazySettings.__getattr__,
        "LazySettings.__setattr__": LazySettings.__setattr__,
        "LazySettings.__delattr__": LazySettings.__delattr__,
    }
    assert source_digests(originals) == ASSUMED_SOURCES


@pytest.mark.django_db(transaction=True)
def test_a_compiled_statement_is_logged_as_django_logs_it_with_debug_on(sessions, settings):
    """With `DEBUG` on (set or overridden) Django logs every statement: a compiled one runs as
    Django runs it, and shows in `connection.queries`; off again, it runs as compiled."""
    from django.db import connection, reset_queries

    first, _ = sessions
    read = _turn_read()
    read.rows(first.pk, 1)
    settings.DEBUG = True
    reset_queries()
    read.rows(first.pk, 1)
    assert len(connection.queries) == 1
    settings.DEBUG = False
    reset_queries()
    read.rows(first.pk, 1)
    assert connection.queries == []


def test_a_compiled_insert_hands_on_the_values_its_fields_store_as_they_are(sessions):
    """A message's insert prepared each of its twelve fields through the field (`pre_save`,
    `get_db_prep_save`: ~100 Python calls) and made its instance from keywords: an integer, a
    flag or text without a NUL is stored as it is given, so it is handed on as it is, and the
    instance is made from the values in order (150 Python calls for this insert before, 67
    after; issue 15; 56 with its creation time adapted as `db_value` adapts an aware time; 43
    with its session's key prepared as `db_value` prepares a UUID, and a constant None default
    kept; 38 with its creation time made into SQLite's text by `time_param`; 29 with the
    instance made without `__init__`'s signals and the session key's descriptor). A value of
    another kind is still prepared by its field, as the ORM prepares it."""
    first, _ = sessions
    insert = CompiledInsert(Message)
    insert.create(session_id=first.pk, turn=1, role="note", content="first")
    message = dict(session_id=first.pk, turn=3, role=Message.Role.ASSISTANT, content="Here.")
    calls = python_calls_of(insert.create, **message, tool_calls=[])
    assert calls <= 29, calls
    odd = insert.create(
        session_id=str(first.pk), turn="4", role=Message.Role.TOOL, is_error=1, tool_call_id="\x00"
    )
    stored = Message.objects.get(pk=odd.pk)
    assert (stored.session_id, stored.turn, stored.is_error) == (first.pk, 4, True)
    assert stored.tool_call_id == odd.tool_call_id == "\ufffd"
    assert stored.role == "tool" and stored.tool_calls == [] and stored.title == ""


def _conversions(monkeypatch) -> list[str]:
    """The statements Django's SQLite cursor converts from `%s` to `?` form."""
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    converted: list[str] = []
    real = SQLiteCursorWrapper.convert_query

    def convert_query(self, query, **kwargs):
        converted.append(query)
        return real(self, query, **kwargs)

    monkeypatch.setattr(SQLiteCursorWrapper, "convert_query", convert_query)
    return converted


def test_compiled_statements_hand_sqlite_their_text_converted_once(sessions, monkeypatch):
    """Django's SQLite cursor converts each statement's text with a regular expression, and
    Django makes a cursor per statement; a compiled statement's text is converted with its
    plan, and it runs on a cursor kept for them. Execute wrappers still see every
    statement, a database error is still Django's, and a cursor that logs its queries (DEBUG,
    a test capturing them) still logs them."""
    from django.db import IntegrityError, connection, connections
    from django.test.utils import CaptureQueriesContext

    first, second = sessions
    read = _turn_read()
    update = _title_update()
    insert = CompiledInsert(Message)
    read.rows(first.pk, 1), update.run(first.pk, "one")
    insert.create(session_id=first.pk, turn=1, role="note", content="first")
    converted = _conversions(monkeypatch)
    cursors = []
    wrapper_class = type(connections["default"])
    real_cursor = wrapper_class.create_cursor
    monkeypatch.setattr(
        wrapper_class, "create_cursor", lambda db, *a: cursors.append(1) or real_cursor(db, *a)
    )
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    expected = [tuple(r) for r in _query(second.pk, 1)]
    converted.clear(), cursors.clear()  # the ORM's read just now
    with connection.execute_wrapper(wrapper):
        assert read.rows(second.pk, 1) == expected
        assert update.run(second.pk, "two") == 1
        created = insert.create(session_id=first.pk, turn=1, role="tool", tool_call_id="r")
    assert converted == []
    assert cursors == []  # the cursor the first statements made, kept for the later ones
    assert len(seen) == 3 and all("%s" not in sql for sql in seen)
    assert ChatSession.objects.get(pk=second.pk).title == "two"
    assert Message.objects.get(pk=created.pk).tool_call_id == "r"
    with CaptureQueriesContext(connection) as queries:
        read.rows(first.pk, 1)
    assert len(queries) == 1
    with pytest.raises(IntegrityError):  # one result per call, as Django reports it
        insert.create(session_id=first.pk, turn=1, role="tool", tool_call_id="r")


@pytest.mark.django_db(transaction=True)
def test_a_kept_cursor_leaves_no_statement_open(sessions):
    """Outside a transaction each compiled statement on the kept cursor ends with its answer
    read: SQLite's implicit transaction is over (an `INSERT … RETURNING` left unfinished would
    hold the database's one writer), and a read sees what another connection wrote since."""
    import sqlite3

    from django.db import connection

    first, _ = sessions
    insert = CompiledInsert(Message)
    title = CompiledRead(
        build=lambda pk: ChatSession.objects.filter(pk=pk).values_list("title"),
        tail=lambda connection, pk: [db_value(ChatSession, "id", pk, connection)],
    )
    for content in ("orm", "kept", "kept again"):
        insert.create(session_id=first.pk, turn=3, role="note", content=content)
        assert not connection.connection.in_transaction
    assert title.rows(first.pk) == title.rows(first.pk) == [("",)]
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
    other.execute(
        "UPDATE chat_chatsession SET title = 'other' WHERE id = ?",
        [db_value(ChatSession, "id", first.pk, connection)],
    )
    other.commit()
    other.close()
    assert title.rows(first.pk) == [("other",)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wrapped", [False, True], ids=["own path", "execute wrapper"])
def test_a_compiled_write_that_fails_inside_atomic_marks_it_for_rollback(sessions, wrapped):
    """A compiled write skips Django's rollback marker only outside a transaction: inside
    `atomic()` a failing one leaves the block marked for rollback, on its own path and through
    an execute wrapper, as the ORM's write does, and a later statement is refused."""
    from django.db import IntegrityError, connection, transaction
    from django.db.transaction import TransactionManagementError

    first, _ = sessions
    insert = CompiledInsert(Message)
    insert.create(session_id=first.pk, turn=1, role="tool", tool_call_id="dup")
    insert.create(session_id=first.pk, turn=1, role="note", content="compiled")

    def passed_on(execute, sql, params, many, context):
        return execute(sql, params, many, context)

    with transaction.atomic():
        with pytest.raises(IntegrityError):
            if wrapped:
                with connection.execute_wrapper(passed_on):
                    insert.create(session_id=first.pk, turn=1, role="tool", tool_call_id="dup")
            else:
                insert.create(session_id=first.pk, turn=1, role="tool", tool_call_id="dup")
        assert connection.needs_rollback
        with pytest.raises(TransactionManagementError):
            ChatSession.objects.count()
        with pytest.raises(TransactionManagementError):  # a compiled statement refused too
            insert.create(session_id=first.pk, turn=1, role="note", content="after")
    assert Message.objects.filter(session_id=first.pk, tool_call_id="dup").count() == 1


@pytest.mark.django_db
def test_an_aware_time_is_prepared_as_its_field_prepares_it_in_few_python_calls():
    """A compiled statement's time (the claim's lease, the release's update) went through the
    field's whole preparation, whose steps before the database's adaptation are for naive
    values and text: 12 Python calls before, 5 after (issue 15), at most 2 with SQLite's
    adaptation made by `time_param` (`db_value` and it)."""
    from datetime import UTC, datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    from django.db import connections

    connection = connections["default"]
    field = ChatSession._meta.get_field("turn_lease")
    for value in (
        datetime(2026, 12, 1, 23, 59, 59, 123456, tzinfo=UTC),
        datetime(2026, 12, 2, 1, 0, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 3, 29, 2, 30, 0, 1, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(1999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
        "2026-12-01 10:00:00+00:00",
    ):
        prepared = db_value(ChatSession, "turn_lease", value, connection)
        assert prepared == field.get_db_prep_value(value, connection, prepared=False)
        if isinstance(value, datetime):
            assert time_param(value, connection) == (
                connection.ops.adapt_datetimefield_value(value)
            )
    value = datetime(2026, 12, 1, 23, 59, 59, tzinfo=UTC)
    assert python_calls_of(db_value, ChatSession, "turn_lease", value, connection) <= 2


@pytest.mark.django_db
def test_a_time_is_adapted_as_django_adapts_it_whatever_the_time_zone_settings(
    settings, monkeypatch
):
    """`time_param` makes SQLite's text of an aware time in the connection's time zone (the
    database's `TIME_ZONE`, UTC without one), which Django drops when `USE_TZ` or `TIME_ZONE`
    change; without `USE_TZ` Django's own adaptation answers (it refuses an aware time), and a
    naive time is Django's too."""
    from datetime import UTC, datetime

    from django.db import connections

    connection = connections["default"]
    aware, naive = datetime(2026, 12, 1, 23, 59, 59, 5, tzinfo=UTC), datetime(2026, 12, 1, 8)
    assert time_param(naive, connection) == connection.ops.adapt_datetimefield_value(naive)
    monkeypatch.setitem(connection.settings_dict, "TIME_ZONE", "Asia/Kolkata")
    connection.__dict__.pop("timezone", None)
    try:
        assert time_param(aware, connection) == "2026-12-02 05:29:59.000005"
        assert time_param(aware, connection) == connection.ops.adapt_datetimefield_value(aware)
    finally:
        monkeypatch.undo()
        connection.__dict__.pop("timezone", None)
    settings.USE_TZ = False
    with pytest.raises(ValueError):
        time_param(aware, connection)


@pytest.mark.django_db
def test_a_session_id_is_prepared_as_its_field_prepares_it_in_one_python_call():
    """Most statements of a turn filter on the session's id, a UUID: through its field and
    `UUID.hex`, 3 Python calls each before, 1 after (issue 15). Another kind of value (its
    text) still goes through the field."""
    import uuid

    from django.db import connections

    connection = connections["default"]
    field = ChatSession._meta.get_field("id")
    session_id = uuid.uuid4()
    for value in (session_id, uuid.UUID(int=7), str(session_id)):
        prepared = db_value(Message, "session", value, connection)
        assert prepared == field.get_db_prep_value(value, connection, prepared=False)
    assert python_calls_of(db_value, Message, "session", session_id, connection) == 1


def test_a_compiled_read_makes_stored_times_as_django_does_in_few_python_calls(
    sessions, monkeypatch
):
    """SQLite's time converter (the settings' `USE_TZ`, `is_aware`, `make_aware` twice: 5
    Python calls a time) is `_time_read` in a compiled read's plan: the same aware datetimes
    (a naive one set in the connection's zone, an aware one, text, NULL), for a session
    read (3 times) in 23 Python calls, from 35."""
    from datetime import UTC, datetime, timedelta, timezone

    from django.db import connections

    from geosense.compiled import _time_read, model_columns

    connection = connections["default"]
    django_read = connection.ops.convert_datetimefield_value
    for value in (
        datetime(2026, 12, 1, 23, 59, 59, 123456),
        datetime(2026, 12, 1, 10, tzinfo=timezone(timedelta(hours=2))),
        "2026-12-01 23:59:59",
        "2026-12-1 10:00:00",  # only Django's regular expression reads it
        None,
    ):
        read = _time_read(value, None, connection)
        assert read == django_read(value, None, connection)
        assert read is None or read.tzinfo == django_read(value, None, connection).tzinfo
    monkeypatch.setitem(connection.settings_dict, "TIME_ZONE", "Asia/Kolkata")
    connection.__dict__.pop("timezone", None)
    try:
        naive = datetime(2026, 12, 1, 10)
        kolkata = _time_read(naive, None, connection)
        assert kolkata == django_read(naive, None, connection)
        assert kolkata == datetime(2026, 12, 1, 4, 30, tzinfo=UTC)
    finally:
        monkeypatch.undo()
        connection.__dict__.pop("timezone", None)

    first, second = sessions
    ChatSession.objects.filter(pk=second.pk).update(
        turn_lease=datetime(2026, 12, 1, 10, tzinfo=timezone(timedelta(hours=1)))
    )
    read = CompiledRead(
        build=lambda pk: ChatSession.objects.filter(pk=pk).values_list(*model_columns(ChatSession)),
        tail=lambda connection, pk: [db_value(ChatSession, "id", pk, connection)],
    )
    read.rows(first.pk)
    (row,) = read.rows(second.pk)
    assert (
        row
        == ChatSession.objects.filter(pk=second.pk).values_list(*model_columns(ChatSession)).get()
    )
    assert python_calls_of(read.rows, second.pk) <= 23


def test_the_module_imports_before_any_database_backend_is_loaded():
    """On PostgreSQL nothing loads Django's SQLite backend, and the models that import this
    module load before any backend: importing the SQLite backend's operations first is a
    circular import (3b332ad broke `migrate` on PostgreSQL so)."""
    code = (
        "import sys, geosense.compiled; assert 'django.db.backends.sqlite3.base' not in sys.modules"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "geosense.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db
def test_an_instance_is_made_as_init_makes_it_without_its_signals_or_descriptors(sessions):
    """`model_made` gives what `model(*row)` gives (its fields' values, a new state; a related
    object read through its key) for the models a turn makes, in one Python call (`__init__`'s
    two signals and the keys' descriptors: 6 for a message); a model with a receiver of
    `post_init` is made by `__init__`, and so are its instances."""
    from django.db.models.signals import post_init

    from geosense.accounts.models import ApiToken
    from geosense.compiled import model_from_row, model_made

    first, _ = sessions
    for model, source in (
        (Message, Message.objects.filter(session=first).first()),
        (ChatSession, first),
        (ApiToken, ApiToken(user=first.user, digest="d", prefix="p")),
        (get_user_model(), first.user),
    ):
        row = [getattr(source, field.attname) for field in model._meta.concrete_fields]
        made, init = model_made(model, row), model(*row)
        assert type(made) is model
        assert {k: v for k, v in vars(made).items() if k != "_state"} == {
            k: v for k, v in vars(init).items() if k != "_state"
        }
        assert (made._state.adding, made._state.db) == (True, None)
        loaded = model_from_row(model, row)
        assert (loaded._state.adding, loaded._state.db) == (False, "default")
    stored = Message.objects.first()
    row = [getattr(stored, field.attname) for field in Message._meta.concrete_fields]
    message = model_made(Message, row)
    assert message.session.pk == message.session_id
    assert python_calls_of(model_made, Message, row) == 1

    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(sender)

    post_init.connect(receiver, sender=Message)
    try:
        model_made(Message, row)
    finally:
        post_init.disconnect(receiver, sender=Message)
    assert seen == [Message]
