"""Counting what a piece of work costs the process, for the cost tests of turns
(test_turn_costs.py) and of sockets' connects (test_socket_costs.py): thread hops (any
`sync_to_async` and any trip to a database pool), trips to the database pools (the engine's
and, apart, the requests'), SQL statements and the ORM's compiles of a statement, on any
thread, while a `Costs` lives (the patches go with the test's monkeypatch)."""

import sys
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import SyncToAsync
from django.db.backends import utils as db_utils
from django.db.models.sql import compiler as sql_compiler

from geosense import compiled, dbpool


class Costs:
    def __init__(self, monkeypatch) -> None:
        self.hops = 0
        self.trips = 0
        # Trips to the requests' pool (a request's token and session checks), not the engine's.
        self.request_trips = 0
        self.compiled = 0
        self.statements: list[str] = []
        self._lock = threading.Lock()
        call, submit = SyncToAsync.__call__, dbpool._Pool.submit
        execute, qmark_execute = db_utils.CursorWrapper._execute, compiled._qmark_execute

        async def counted_call(hop, *args, **kwargs):
            with self._lock:
                self.hops += 1
            return await call(hop, *args, **kwargs)

        def counted_submit(pool, fn, /, *args, **kwargs):
            with self._lock:
                self.hops += 1  # a trip is a hop too, without asgiref's `SyncToAsync`
                if pool is dbpool._request_pool:
                    self.request_trips += 1
                else:
                    self.trips += 1
            return submit(pool, fn, *args, **kwargs)

        def counted_execute(cursor, sql, params, *ignored):
            with self._lock:
                self.statements.append(sql[:80])
            return execute(cursor, sql, params, *ignored)

        def counted_qmark_execute(cursor, sql, params, *ignored, **result):
            with self._lock:
                self.statements.append(sql[:80])
            return qmark_execute(cursor, sql, params, *ignored, **result)

        def counted(compile_sql):
            def counted_compile(compiler, *args, **kwargs):
                with self._lock:
                    self.compiled += 1
                return compile_sql(compiler, *args, **kwargs)

            return counted_compile

        monkeypatch.setattr(SyncToAsync, "__call__", counted_call)
        monkeypatch.setattr(dbpool._Pool, "submit", counted_submit)
        monkeypatch.setattr(db_utils.CursorWrapper, "_execute", counted_execute)
        # A compiled statement's SQLite form runs below `_execute` (geosense/compiled.py).
        monkeypatch.setattr(compiled, "_qmark_execute", counted_qmark_execute)
        for kind in ("SQLCompiler", "SQLInsertCompiler", "SQLUpdateCompiler", "SQLDeleteCompiler"):
            cls = getattr(sql_compiler, kind)
            monkeypatch.setattr(cls, "as_sql", counted(cls.__dict__["as_sql"]))

    def snapshot(self) -> tuple[int, int, int]:
        """Hops, trips and statements so far."""
        return self.hops, self.trips, len(self.statements)


def _counter(builtins: bool) -> tuple[Callable[..., None], list[int]]:
    """A profile function that counts Python calls (and builtins' calls, with `builtins`)
    into the list's one item. Callers set and unset it inline (`try`/`finally`): a context
    manager's own exit would be counted with the work."""
    counted = ("call", "c_call") if builtins else ("call",)
    calls = [0]

    def count(frame, event, arg):
        calls[0] += event in counted

    return count, calls


async def python_calls(awaitable, *, builtins: bool = False) -> int:
    """The Python calls made on this thread while `awaitable` runs (and the calls of builtins,
    with `builtins`)."""
    count, calls = _counter(builtins)
    sys.setprofile(count)
    try:
        await awaitable
    finally:
        sys.setprofile(None)
    return calls[0]


def python_calls_of(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> int:
    """The Python calls made while `function(*args, **kwargs)` runs (synchronous work)."""
    count, calls = _counter(False)
    sys.setprofile(count)
    try:
        function(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return calls[0]
