"""Reads whose SQL Django compiles once per process, then runs with new values.

Under one GIL, building and compiling a queryset (filters, `Case`/`When`, JSON key transforms,
the compiler's joins and ordering) cost more CPU than SQLite's own work for the turn engine's
hot reads: a turn ran ~20 of them on the one database thread every user's turn queues on
(issue 15, docs/benchmarks.md). A `CompiledRead` keeps the queryset as the definition (one
home, every database Django supports) and skips the build and compile after the first call.

Each read says how the last of its SQL's parameters are made from its arguments (`tail`: the
filters' values, prepared for the database); those before them (the selected expressions'
constants, which differ between databases) are the first compile's. The first call of a shape
(per database alias and vendor) has the ORM compile the queryset and keeps its SQL only if
Django's own parameters end with `tail`'s: a Django that compiles differently leaves that read
on the ORM (logged once), never with values bound in the wrong places. Every call then runs the
kept SQL with those parameters and applies the converters the ORM would (JSON decoded, dates,
etc.).
"""

import datetime
import functools
import inspect
import logging
import operator
import sqlite3
import threading
import uuid
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import DateTimeField, Field, Model, QuerySet, UUIDField
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.signals import post_init, pre_init
from django.db.models.sql import UpdateQuery

from geosense.dbpool import trip_connections
from geosense.fields import NUL, NulFreeCharField, NulFreeTextField

logger = logging.getLogger(__name__)
T = TypeVar("T")


def qmark_form(connection: Any, sql: str) -> str | None:
    """SQLite's form of `sql` (`?` for Django's `%s`), made once per plan; None on a database
    that takes `sql` as it is."""
    if connection.vendor != "sqlite":
        return None
    from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX

    return FORMAT_QMARK_REGEX.sub("?", sql).replace("%%", "%")


def statement_run(
    connection: Any, sql: str, qmark: str | None, params: list[Any], result: Callable[[Any], T]
) -> T:
    """Run `sql` with `params` and return `result(cursor)`; `qmark`: its SQLite form
    (`qmark_form`).

    Django's SQLite cursor converts every statement's `%s` to `?` with a regular expression (a
    tenth of the engine's database thread at 200 users, issue 15), and Django makes, wraps and
    closes a cursor per statement (~10 µs, as much as a short read's own work): on an open
    SQLite connection a compiled statement hands SQLite the form it made once, on a cursor
    kept for them (one per thread and SQLite connection), through Django's execute wrappers
    and its error translation as any statement. `result` reads the whole answer (Python's
    sqlite3 then resets the statement: nothing stays open on the kept cursor), from SQLite's
    own cursor under Django's error translation (through Django's cursor, each fetch made and
    called a wrapper of its own: ~6 Python calls a statement); with no execute wrapper
    installed, the statement and its answer under one translation, without the wrappers'
    loop. A connection not open yet, or one that logs its queries (DEBUG, tests capturing
    them), runs it as Django runs it."""
    raw = connection.connection
    # Django's `queries_logged`, read without its property's call (two a statement, with
    # looking the kept cursor up in a function of its own), and `settings.DEBUG` read where
    # `LazySettings` caches it (its `__dict__`, which it clears when a setting is set or
    # overridden), not through its Python `__getattribute__`: a call a statement.
    debug = object.__getattribute__(settings, "__dict__").get("DEBUG")
    if debug is None:
        debug = settings.DEBUG
    if qmark is None or raw is None or connection.force_debug_cursor or debug:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return result(cursor)
    kept = connection.__dict__.get("_compiled_cursor")
    thread = threading.get_ident()
    if kept is None or kept[0] is not raw or kept[1] != thread:
        kept = (raw, thread, connection.make_cursor(connection.create_cursor()))
        connection._compiled_cursor = kept
    cursor = kept[2]
    if not connection.execute_wrappers:
        return _qmark_execute(cursor, qmark, params, result=result)
    executor = functools.partial(_qmark_execute, cursor)
    cursor._execute_with_wrappers(qmark, params, many=False, executor=executor)
    with connection.wrap_database_errors:
        return result(cursor.cursor)


def write_run(
    connection: Any, sql: str, qmark: str | None, params: list[Any], result: Callable[[Any], T]
) -> T:
    """`statement_run` for a write: an error inside a transaction marks it for rollback, as
    the ORM's writes do (`transaction.mark_for_rollback_on_error`, which does nothing outside
    one: most of the turn engine's writes, spared its context manager's four Python calls)."""
    if not connection.in_atomic_block:
        return statement_run(connection, sql, qmark, params, result)
    with transaction.mark_for_rollback_on_error(using=connection.alias):
        return statement_run(connection, sql, qmark, params, result)


FETCH_ALL = operator.methodcaller("fetchall")
FETCH_ONE = operator.methodcaller("fetchone")
ROW_COUNT = operator.attrgetter("rowcount")


def _qmark_execute(
    cursor: CursorWrapper,
    sql: str,
    params: Any,
    *ignored_wrapper_args: Any,
    result: Callable[[Any], Any] | None = None,
):
    """`CursorWrapper._execute` for a statement already in SQLite's form; with `result`, what
    it reads of the answer instead, under the same error translation. Both of Django's checks
    are entered only when they have work: the broken transaction's when one needs a rollback,
    the error translation's when the statement raised (each a call or two of every statement,
    ~25 a turn on the engine's one database thread)."""
    db = cursor.db
    if db.needs_rollback:
        db.validate_no_broken_transaction()
    try:
        executed = sqlite3.Cursor.execute(cursor.cursor, sql, params)
        return executed if result is None else result(cursor.cursor)
    except Exception:
        with db.wrap_database_errors:
            raise


@dataclass(frozen=True)
class _Plan:
    sql: str
    qmark: str | None  # its SQLite form (`qmark_form`)
    head: tuple[Any, ...]  # the parameters before the tail, as first compiled
    # (position in the row, converters in order, the expression they were made for)
    converters: tuple[tuple[int, tuple[Callable, ...], Any], ...]


_ORM = object()  # a shape whose parameters did not match: it stays on the ORM


def _same(ours: list[Any], theirs: list[Any]) -> bool:
    """The same parameters, as Django would bind them. A JSON value's adapter (psycopg's
    `Jsonb`, which Django binds on PostgreSQL) has no equality of its own: two are the same
    when they hold the same value (every JSON parameter kept PostgreSQL's plans on the ORM)."""
    return len(ours) == len(theirs) and all(
        mine == their
        or (type(mine) is type(their) and hasattr(mine, "obj") and mine.obj == their.obj)
        for mine, their in zip(ours, theirs, strict=True)
    )


class _Compiled:
    """What a compiled read and a compiled update share: the queryset's definition (`build`),
    how its last parameters are made (`tail`), what changes its SQL's text (`shape`), and the
    plans kept per shape."""

    def __init__(
        self,
        *,
        build: Callable[..., Any],
        tail: Callable[..., list[Any]],
        shape: Callable[..., Hashable] = lambda *args: (),
    ) -> None:
        self.build = build
        self.tail = tail
        self.shape = shape
        self._plans: dict[Hashable, Any] = {}
        self._lock = threading.Lock()


class CompiledRead(_Compiled):
    """A `values_list` read of a fixed shape (see the module's docstring).

    `build(*args)`: the queryset (a `values_list`, sliced or not). `tail(connection, *args)`:
    the last of its parameters, in the SQL's order, prepared for `connection`. `shape(*args)`:
    whatever changes the SQL's text (an optional filter, the length of an `IN` list).
    `converted=False`: rows come as the database gives them (a read of integers compared as
    they are, which the ORM would convert one row at a time), and `convert(rows, *args)`
    converts those the caller reads further (a check's new rows among its kept ones); `raw`:
    the positions in the row that come so (a JSON column's text, kept as a cache's key)."""

    def __init__(
        self, *, converted: bool = True, raw: Collection[int] = (), **compiled: Any
    ) -> None:
        super().__init__(**compiled)
        self.converted = converted
        self.raw = frozenset(raw)

    def rows(self, *args: Any) -> list[tuple[Any, ...]]:
        connection = trip_connections.default or connections[DEFAULT_DB_ALIAS]
        key = (connection.alias, connection.vendor, self.shape(*args))
        plan = self._plans.get(key)
        if plan is None:
            return self._first(key, connection, args)
        if plan is _ORM:
            return [tuple(row) for row in self.build(*args)]
        params = [*plan.head, *self.tail(connection, *args)]
        rows = statement_run(connection, plan.sql, plan.qmark, params, FETCH_ALL)
        if not self.converted or not plan.converters:
            return [tuple(row) for row in rows]
        return _rows_converted(plan, rows, connection)

    def convert(self, rows: list[tuple[Any, ...]], *args: Any) -> list[tuple[Any, ...]]:
        """Rows of a `converted=False` read (with the arguments they were read with) as the ORM
        gives them."""
        connection = trip_connections.default or connections[DEFAULT_DB_ALIAS]
        plan = self._plans.get((connection.alias, connection.vendor, self.shape(*args)))
        if not isinstance(plan, _Plan) or not plan.converters:  # on the ORM: converted already
            return rows
        return _rows_converted(plan, rows, connection)

    def _first(self, key: Hashable, connection: Any, args: tuple[Any, ...]) -> list[tuple]:
        """Compiled by the ORM, its SQL kept when its parameters end with `tail`'s (then run
        as kept, else through the ORM)."""
        queryset = self.build(*args)
        compiler = queryset.query.get_compiler(using=queryset.db)
        sql, compiled = compiler.as_sql()
        tail = list(self.tail(connection, *args))
        head = list(compiled)[: len(compiled) - len(tail)]
        if _same(list(compiled)[len(head) :], tail):
            columns = [select[0] for select in compiler.select[: compiler.col_count]]
            converters = compiler.get_converters(columns)
            plan: _Plan | object = _Plan(
                sql=sql,
                qmark=qmark_form(connection, sql),
                head=tuple(head),
                converters=tuple(
                    (position, tuple(_converter_kept(f, connection) for f in functions), expression)
                    for position, (functions, expression) in converters.items()
                    if position not in self.raw
                ),
            )
        else:
            logger.warning("compiled read %s stays on the ORM: its parameters differ", key)
            plan = _ORM
        with self._lock:
            self._plans.setdefault(key, plan)
        if plan is _ORM:
            return [tuple(row) for row in queryset]
        return self.rows(*args)  # as every later call gives them, values as it converts them


def _time_read(value: Any, expression: Any, connection: Any) -> Any:
    """SQLite's `convert_datetimefield_value`: a stored time (made a naive datetime by the
    converter Django registers with Python's sqlite3 for the column's type) in the
    connection's time zone, set here without the settings' `USE_TZ`, `is_aware` and
    `make_aware` (4 Python calls a time; a request's token, user and session reads hold 8).
    `connection.timezone` is None without `USE_TZ`; any other value goes to Django's
    converter."""
    if value is None:
        return None
    if type(value) is datetime.datetime:
        zone = connection.timezone
        if zone is not None:
            return value.replace(tzinfo=zone) if value.utcoffset() is None else value
    return connection.ops.convert_datetimefield_value(value, expression, connection)


def _converter_kept(function: Callable, connection: Any) -> Callable:
    """The converter a plan keeps for `function`: `_time_read` for SQLite's time converter.
    Django's SQLite backend is loaded (imported here, not with this module: on another
    database nothing has loaded it, and importing its operations first is a circular import)."""
    if connection.vendor != "sqlite":
        return function
    from django.db.backends.sqlite3.operations import DatabaseOperations

    if getattr(function, "__func__", None) is DatabaseOperations.convert_datetimefield_value:
        return _time_read
    return function


def _rows_converted(plan: _Plan, rows: list[Any], connection: Any) -> list[tuple[Any, ...]]:
    """Rows as the database gave them, with the plan's converters applied as the ORM does."""
    out = []
    for row in rows:
        row = list(row)
        for position, converters, expression in plan.converters:
            value = row[position]
            for converter in converters:
                value = converter(value, expression, connection)
            row[position] = value
        out.append(tuple(row))
    return out


def model_columns(model: type[Model], *, through: str = "") -> list[str]:
    """The `values_list` names of `model`'s concrete fields, in order (`through`: the relation
    that reaches it, e.g. "user__"), for a read that builds instances with `model_from_row`."""
    return [f"{through}{field.attname}" for field in model._meta.concrete_fields]


def model_from_row(model: type[Model], row: tuple[Any, ...]) -> Model:
    """The instance the ORM would load from `row` (values of `model_columns`, converted)."""
    if model.from_db.__func__ is not Model.from_db.__func__:  # the model's own loading
        names = [field.attname for field in model._meta.concrete_fields]
        return model.from_db(DEFAULT_DB_ALIAS, names, row)
    obj = model_made(model, row)
    obj._state.adding, obj._state.db = False, DEFAULT_DB_ALIAS
    return obj


def model_made(model: type[Model], row: Sequence[Any]) -> Model:
    """`model(*row)`: `row` holds a value of each of its concrete fields, in order. Made as
    `Model.__init__` makes it from such values, its fields' values in its `__dict__` and a new
    `ModelState`, without `__init__`'s `pre_init` and `post_init` signals and the foreign keys'
    descriptors (which drop a related object's cache, which a new instance has none of): ~5
    Python calls an instance, 8 instances a turn (its messages and usage row, the request's
    token, user and session). A model with its own `__init__`, a field with a descriptor that
    does work when set, or any receiver of those signals (an `ImageField`'s), and `__init__`
    makes it."""
    names = _plain_fields.get(model)
    if names is None:
        names = _plain_fields[model] = _plain_field_names(model)
    if not names or pre_init.receivers or post_init.receivers or len(row) != len(names):
        return model(*row)
    obj = model.__new__(model)
    obj._state = ModelState()
    obj.__dict__.update(zip(names, row, strict=True))
    return obj


def _plain_field_names(model: type[Model]) -> tuple[str, ...]:
    """The attribute names of `model`'s concrete fields, if `model_made` may set them in its
    `__dict__`; () otherwise."""
    if model.__init__ is not Model.__init__:
        return ()
    names = tuple(field.attname for field in model._meta.concrete_fields)
    for name in names:
        descriptor = inspect.getattr_static(model, name, None)
        setter = type(descriptor).__dict__.get("__set__") if descriptor is not None else None
        if setter is not None and type(descriptor) is not ForeignKeyDeferredAttribute:
            return ()
    return names


_plain_fields: dict[type[Model], tuple[str, ...]] = {}


def db_value(model: Any, field: str, value: Any, connection: Any) -> Any:
    """`value` as a parameter of a lookup on `model.field` (a foreign key: its target's); the
    field is looked up once (the tails of every compiled statement prepare their values). A
    UUID of a plain `UUIDField` (a session's id: most statements of a turn filter on it) is
    the UUID on a database that has the type, else its `hex` (made from its integer, without
    the two Python calls of the field and the property), and an aware datetime of a plain
    `DateTimeField` goes straight to the database's adaptation, which is what the field's
    preparation ends in (the steps before it are for naive values and text: 7 Python calls of
    12; the claim's and the release's times, every turn)."""
    target = _db_fields.get((model, field))
    if target is None:
        target = model._meta.get_field(field)
        target = _db_fields[model, field] = getattr(target, "target_field", target)
    if type(value) is uuid.UUID and type(target) is UUIDField:  # `_uuid_param`, inline
        return value if connection.features.has_native_uuid_field else f"{value.int:032x}"
    if (
        type(value) is datetime.datetime
        and type(target) is DateTimeField
        and value.utcoffset() is not None
    ):
        return time_param(value, connection)
    return target.get_db_prep_value(value, connection, prepared=False)


_db_fields: dict[tuple[Any, str], Field] = {}


def time_param(value: datetime.datetime, connection: Any) -> Any:
    """A datetime as the database's adaptation makes it (`adapt_datetimefield_value`). For an
    aware one on SQLite that is the text of the time in the connection's time zone, without
    its offset (Django's `str(make_naive(value, connection.timezone))`), made here: Django's
    way is 5 Python calls (`is_aware`, the settings' `USE_TZ`, `make_naive`, `is_naive`), and
    a turn stores ~10 times (each message's creation, the claim's lease and time, the release,
    the usage row). `connection.timezone` is None without `USE_TZ` (Django then refuses an aware
    time) and is dropped by Django when `USE_TZ` or `TIME_ZONE` change."""
    if connection.vendor == "sqlite" and value.utcoffset() is not None:
        zone = connection.timezone
        if zone is not None:
            return str(value.astimezone(zone).replace(tzinfo=None))
    return connection.ops.adapt_datetimefield_value(value)


def _uuid_param(value: uuid.UUID, connection: Any) -> Any:
    """A UUID as a plain `UUIDField` prepares it: itself where the database has the type, else
    its `hex`, made from its integer."""
    return value if connection.features.has_native_uuid_field else f"{value.int:032x}"


def _uuid_field(field: Field) -> bool:
    """A plain `UUIDField`, or a foreign key to one (a message's session): its value, a UUID,
    is stored as `_uuid_param` makes it (the field's and the key's preparation, ~8 Python
    calls an insert, end in that)."""
    return type(getattr(field, "target_field", field)) is UUIDField


class CompiledUpdate(_Compiled):
    """`queryset.update(**values)` of a fixed shape, compiled once per process (the claim, the
    lease, the release: every turn's writes). `build(*args)` gives the queryset and the values;
    `tail(connection, *args)` every parameter in the SQL's order (the values set, then the
    filters'), checked against Django's own at the first call of each shape as for
    `CompiledRead`. Returns the number of rows updated."""

    def run(self, *args: Any) -> int:
        connection = trip_connections.default or connections[DEFAULT_DB_ALIAS]
        key = (connection.alias, connection.vendor, self.shape(*args))
        plan = self._plans.get(key)
        if not isinstance(plan, tuple):
            queryset, values = self.build(*args)
            if plan is None:
                self._plan(key, connection, queryset, values, args)
            return queryset.update(**values)
        sql, qmark = plan
        return write_run(connection, sql, qmark, self.tail(connection, *args), ROW_COUNT)

    def _plan(self, key: Hashable, connection: Any, queryset: QuerySet, values, args) -> None:
        query = queryset.query.chain(UpdateQuery)
        query.add_update_values(values)
        query.annotations = {}
        sql, compiled = query.get_compiler(queryset.db).as_sql()
        if _same(list(compiled), list(self.tail(connection, *args))):
            plan: tuple[str, str | None] | object = (sql, qmark_form(connection, sql))
        else:
            logger.warning("compiled update %s stays on the ORM: its parameters differ", key)
            plan = _ORM
        with self._lock:
            self._plans.setdefault(key, plan)


# The kinds of value a field may store as they are (`_as_is`), each with the values it is probed
# with once per plan: a `str` subclass too (a model's choices), which text fields hand on.
class _Text(str):
    pass


_AS_IS_PROBES: tuple[tuple[type, tuple[Any, ...]], ...] = (
    (bool, (True, False)),
    (int, (0, 7)),
    (str, ("", "é x", _Text("y"))),
)


def _as_is(field: Field, connection: Any) -> type | None:
    """The kind of value `field` stores on `connection` as it is given (its `pre_save` reads
    it back and its `get_db_prep_save` gives it back unchanged), probed once; None: each of its
    values is prepared by the field. A NUL-free text field replaces a NUL: only a string
    without one is stored as it is (`CompiledInsert._prepared`)."""
    if type(field).pre_save is not Field.pre_save and not isinstance(field, _NUL_FREE):
        return None
    for kind, samples in _AS_IS_PROBES:
        try:
            prepared = [field.get_db_prep_save(sample, connection) for sample in samples]
        except (TypeError, ValueError, ValidationError):
            continue
        if all(
            type(out) in (kind, type(sample)) and out == sample
            for out, sample in zip(prepared, samples, strict=True)
        ):
            return kind
    return None


_NUL_FREE = (NulFreeCharField, NulFreeTextField)


def _time_saved(field: Field, obj: Model, connection: Any) -> Any:
    """A plain `DateTimeField`'s value as an insert stores it (its `pre_save`: the creation
    time of an `auto_now_add`), an aware one adapted as `db_value` adapts it (16 Python calls
    a message's creation time through the field, 9 so)."""
    value = field.pre_save(obj, True)
    if type(value) is datetime.datetime and value.utcoffset() is not None:
        return time_param(value, connection)
    return field.get_db_prep_save(value, connection)


def _default_fresh(field: Field) -> bool:
    """`field.get_default()` may give another value at each call."""
    return (field.has_default() and callable(field.default)) or field.has_db_default()


_FRESH = object()  # a field's default made by `get_default()` at each insert


@dataclass(frozen=True)
class _InsertPlan:
    sql: str
    qmark: str | None  # its SQLite form (`qmark_form`)
    returning: bool  # the SQL returns the new row's primary key (else the cursor's last id)
    # Per field inserted, in the SQL's order: its position among the model's concrete fields,
    # the field, the kind of value it stores as it is (`_as_is`; `datetime` for a plain
    # `DateTimeField`, whose value is made and adapted by `_time_saved`; `UUID` for a plain
    # `UUIDField` or a key to one, `_uuid_param`) and whether it is NUL-free.
    fields: tuple[tuple[int, Field, type | None, bool], ...]


class CompiledInsert:
    """`model.objects.create(**values)` with its INSERT compiled once per process (the turn
    engine stores three or four messages a turn; the ORM built and compiled each insert anew).

    The values are prepared as Django prepares an insert's (each field's `pre_save`, then
    `get_db_prep_save`), but a field that stores a kind of value as it is (an integer, a flag,
    text without a NUL; probed once per plan, `_as_is`) is handed such a value without that
    work (twelve fields of a message: about a hundred Python calls an insert), and the instance
    is made from the values in its fields' order, as the ORM makes the instances it reads.
    The first insert on each database goes through the ORM, and its SQL is kept only if Django
    ran one statement with the parameters this class would bind, returning the primary key
    alone or nothing: a Django that inserts otherwise leaves the model on the ORM (logged
    once). No model signal is sent: for models that have no receivers."""

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        meta = model._meta
        self.fields = [f for f in meta.local_concrete_fields if f is not meta.auto_field]
        # Each concrete field's name and default: made once unless the field makes a new one
        # each time (a callable default, a database default): then `_FRESH` and `get_default()`
        # (a constant None was made at each insert too: 4 Python calls of a message's).
        self._concrete = tuple(
            (f.attname, f, _FRESH if _default_fresh(f) else f.get_default())
            for f in meta.concrete_fields
        )
        self._attnames = frozenset(f.attname for f in meta.concrete_fields)
        self._plans: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def create(self, **values: Any) -> Model:
        connection = trip_connections.default or connections[DEFAULT_DB_ALIAS]
        key = (connection.alias, connection.vendor)
        plan = self._plans.get(key)
        if plan is None:
            return self._first(key, connection, values)
        if plan is _ORM:
            return self.model._default_manager.create(**values)
        obj, params = self._prepared(plan, values, connection)
        meta = self.model._meta

        def new_pk(cursor: Any) -> Any:
            if plan.returning:
                return cursor.fetchone()[0]
            return connection.ops.last_insert_id(cursor, meta.db_table, meta.pk.column)

        obj.pk = write_run(connection, plan.sql, plan.qmark, params, new_pk)
        obj._state.adding, obj._state.db = False, connection.alias
        return obj

    def _prepared(
        self, plan: _InsertPlan, values: dict[str, Any], connection: Any
    ) -> tuple[Model, list[Any]]:
        """The new instance and the INSERT's parameters."""
        if not values.keys() <= self._attnames:  # a related object or a property: as Django
            obj = self.model(**values)
            return obj, [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in self.fields]
        row = [
            values[name] if name in values else f.get_default() if default is _FRESH else default
            for name, f, default in self._concrete
        ]
        obj = model_made(self.model, row)
        params = []
        for position, field, kind, nul_free in plan.fields:
            value = row[position]
            if kind is datetime.datetime:
                params.append(_time_saved(field, obj, connection))
                continue
            if kind is uuid.UUID and type(value) is uuid.UUID:
                params.append(_uuid_param(value, connection))
                continue
            if kind is str:
                as_is = isinstance(value, str) and not (nul_free and NUL in value)
            else:
                as_is = kind is not None and type(value) is kind
            params.append(
                value if as_is else field.get_db_prep_save(field.pre_save(obj, True), connection)
            )
        return obj, params

    def _first(self, key: Hashable, connection: Any, values: dict[str, Any]) -> Model:
        ran: list[tuple[str, Any]] = []

        def recorded(execute, sql, params, many, context):
            ran.append((sql, params))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(recorded):
            obj = self.model._default_manager.create(**values)
        expected = [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in self.fields]
        meta = self.model._meta
        plan: _InsertPlan | object = _ORM
        if (
            len(ran) == 1
            and _same(list(ran[0][1] or ()), expected)
            and meta.db_returning_fields == [meta.pk]
        ):
            sql = ran[0][0]
            kept = _InsertPlan(
                sql=sql,
                qmark=qmark_form(connection, sql),
                returning=" RETURNING " in sql,
                fields=tuple(
                    (
                        position,
                        f,
                        datetime.datetime
                        if type(f) is DateTimeField
                        else uuid.UUID
                        if _uuid_field(f)
                        else _as_is(f, connection),
                        isinstance(f, _NUL_FREE),
                    )
                    for position, (_, f, _) in enumerate(self._concrete)
                    if f in self.fields
                ),
            )
            # The values bound as they are, for the same values, are those Django bound (a
            # time may be another: the creation time).
            _, params = self._prepared(kept, values, connection)
            if all(
                mine == theirs
                for (_, _, kind, _), mine, theirs in zip(kept.fields, params, expected, strict=True)
                if kind not in (None, datetime.datetime)
            ):
                plan = kept
        if plan is _ORM:
            logger.warning("compiled insert %s stays on the ORM: it differs", key)
        with self._lock:
            self._plans.setdefault(key, plan)
        return obj
