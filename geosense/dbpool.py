"""A small fixed pool of threads for the turn engine's ORM work.

Under ASGI, `sync_to_async` (thread-sensitive) runs a request's ORM calls in a thread of that
request's own, and a turn task started from the request inherits it: 500 turns in flight made
500 threads, each with its SQLite connection (and its page cache) contending for one writer
until the busy timeout ran out (issue 15). Every engine call goes through this pool instead, so
the number of threads and database connections is `GEOSENSE_DB_THREADS` however many turns run;
turns queue for a thread rather than for the database's lock.

Connections: with SQLite a pool thread keeps its connection to the file from one call to the
next (under load, opening a connection per call was a tenth of the process's time: connect, the
SQLite pragmas, the schema read again), for at most `KEPT_CONNECTION_SECONDS`: a file connection
holds nothing on a server, and the process keeps one open anyway (`sqlite_wal_keep`). With a
database server, a pool of one thread keeps its connection only while other calls wait for the
pool, and a pool of several threads (PostgreSQL's) closes after every call: a waiting call may
start on another thread, and the thread that kept its connection for it could then stay idle
with the connection open. A call that finds such a pool idle closes, as
`channels.db.database_sync_to_async` does, so an idle process holds none (`CONN_MAX_AGE = 0`,
docs/deploy.md). A connection left unusable, in a transaction or outside autocommit by a call
is closed at once, whatever the queue.

The requests' own ORM work (a bearer token, an async request's user, the API's reads and writes)
has a pool of its own of the same kind (`in_request_thread`), so it neither queues behind the
turns nor keeps a connection, hence a thread, in the request (geosense/handler.py).
"""

import asyncio
import contextvars
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import FunctionType
from typing import Any

from asgiref.sync import SyncToAsync, _restore_context
from django.conf import settings
from django.db import close_old_connections, connections

# A connection older than this when a call ends is closed (the next call opens a new one); the
# age is checked only then, so an idle kept connection can be older at its next call.
KEPT_CONNECTION_SECONDS = 60.0


class _Pool(ThreadPoolExecutor):
    """A thread pool that knows how many submitted calls have not started yet."""

    def __init__(self, *, max_workers: int, keep_idle: bool = False) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="db")
        self._queued = 0
        self._queued_lock = threading.Lock()
        # Each thread keeps a fit connection even when no call waits (see `request_pool`).
        self.keep_idle = keep_idle

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def single(self) -> bool:
        """One thread: a waiting call is sure to run on the thread that finished."""
        return self._max_workers == 1

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        with self._queued_lock:
            self._queued += 1
        return super().submit(self._started, fn, *args, **kwargs)

    def _started(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        with self._queued_lock:
            self._queued -= 1
        return fn(*args, **kwargs)

    def cancel(self, call: Future) -> None:
        """A call that has not started never will, and no longer counts as queued (it never
        reaches `_started`: counted for ever, a single-thread pool on a database server kept
        its connection for ever)."""
        if call.cancel():
            with self._queued_lock:
                self._queued -= 1


_pool: _Pool | None = None
_pool_lock = threading.Lock()
# Per pool thread: database alias → (the connection kept, when it was opened).
_opened = threading.local()


def _sqlite() -> bool:
    return settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"


def db_pool() -> _Pool:
    """The process's pool, made on first use with `GEOSENSE_DB_THREADS` threads. With SQLite
    its thread keeps its connection when the pool goes idle too: at 200 users the pool drained
    often enough that a connection was opened every third turn (connect, pragmas, schema)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = _Pool(max_workers=settings.GEOSENSE_DB_THREADS, keep_idle=_sqlite())
    return _pool


def _connection_fit(conn: Any, now: float) -> bool:
    """Whether the pool thread may keep this connection for its next call: back in
    autocommit, outside any transaction, not failed, and not older than the limit."""
    if conn.in_atomic_block or conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
        return False
    if conn.errors_occurred and not conn.is_usable():
        return False
    kept = getattr(_opened, "by_alias", {})
    raw, opened = kept.get(conn.alias, (None, now))
    if raw is not conn.connection:
        opened = now
    kept[conn.alias] = (conn.connection, opened)
    _opened.by_alias = kept
    return now - opened < KEPT_CONNECTION_SECONDS


def connections_tidy(*, busy: bool) -> None:
    """After a pool call: keep a fit connection while other calls wait (`busy`), else close
    what Django's own hygiene closes (every connection, at `CONN_MAX_AGE = 0`)."""
    if not busy:
        close_old_connections()
        return
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if _connection_fit(conn, now):
            conn.errors_occurred = False
            conn.health_check_done = False  # checked again before its next use, as Django does
        else:
            conn.close()


class _Trip:
    """`function` as a coroutine function run on `pool`, with the pool's connection hygiene
    around each call.

    What asgiref's `SyncToAsync` (not thread-sensitive, on an executor) gives such a call, for
    less than half of the event loop's Python work a trip (99 calls before, 37-43 now; ~40 → ~23
    µs of the loop's CPU in isolation; about ten trips a turn): the caller's context
    (contextvars, asgiref `Local`s) is the function's and comes back with its changes, the
    caller's exception is the function's `sys.exc_info()`, the loop is the one the function's
    `async_to_sync` runs its coroutine on (asgiref's thread-local `main_event_loop`:
    `_announce` in annotations, `_revoke` in accounts), and a cancelled caller ends as with
    asgiref (`_cancelled`). Left out: the shield around the call and the thread-sensitive
    lookups, which a call on an executor of its own never uses."""

    __slots__ = ("function", "pool")

    def __init__(self, function: Callable, pool: _Pool) -> None:
        self.function = function
        self.pool = pool

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        task_context: list[asyncio.Task] = []  # the task the function's `async_to_sync` runs
        ended = loop.create_future()
        call = self.pool.submit(
            self._run, loop, ended, sys.exception(), task_context, context, args, kwargs
        )
        try:
            return await ended
        except asyncio.CancelledError:
            return await _cancelled(self.pool, call, task_context, loop)
        finally:
            _restore_context(context)

    def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        ended: asyncio.Future,
        caller_exception: BaseException | None,
        task_context: list[asyncio.Task],
        context: contextvars.Context,
        args: tuple,
        kwargs: dict,
    ) -> Any:
        """In the pool thread: the call, then its end handed to the loop in one callback
        (asyncio's `wrap_future` takes a done callback on each side, and the concurrent future's
        locks and five reads of its state on the loop). The concurrent future ends the same,
        for a cancelled caller that waits for the call (`_cancelled`)."""
        try:
            result = self._call(loop, caller_exception, task_context, context, args, kwargs)
        except BaseException as error:
            _hand_over(loop, ended, None, error)
            raise
        _hand_over(loop, ended, result, None)
        return result

    def _call(
        self,
        loop: asyncio.AbstractEventLoop,
        caller_exception: BaseException | None,
        task_context: list[asyncio.Task],
        context: contextvars.Context,
        args: tuple,
        kwargs: dict,
    ) -> Any:
        """asgiref's `thread_handler`, then the connections tidied."""
        threadlocal = SyncToAsync.threadlocal
        threadlocal.main_event_loop = loop
        threadlocal.main_event_loop_pid = os.getpid()
        threadlocal.task_context = task_context
        try:
            if caller_exception is None:
                return context.run(self._in_context, context, args, kwargs)
            try:
                raise caller_exception
            except BaseException:
                return context.run(self._in_context, context, args, kwargs)
        finally:
            pool = self.pool
            connections_tidy(busy=pool.keep_idle or (pool.single and pool.queued > 0))

    def _in_context(self, context: contextvars.Context, args: tuple, kwargs: dict) -> Any:
        _restore_context(context)  # asgiref `Local`s set on the loop, moved to this thread
        return self.function(*args, **kwargs)


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    ended: asyncio.Future,
    result: Any,
    error: BaseException | None,
) -> None:
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_end, ended, result, error)
        except RuntimeError:  # closed in between
            pass


def _end(ended: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if ended.cancelled():
        return
    if error is None:
        ended.set_result(result)
    else:
        ended.set_exception(error)


async def _cancelled(
    pool: _Pool, call: Future, task_context: list[asyncio.Task], loop: asyncio.AbstractEventLoop
) -> Any:
    """A trip whose caller was cancelled, as asgiref's `SyncToAsync` ends it: a call still
    queued never runs; one that runs goes on in its thread, unawaited, unless it waits in
    `async_to_sync` on a task of this loop: that task is cancelled, and if it finishes anyway
    the caller waits for the call and gets its result."""
    pool.cancel(call)
    if task_context:
        inner = task_context[0]
        inner.cancel()
        await inner
        return await asyncio.wrap_future(call, loop=loop)
    raise asyncio.CancelledError


# Threads of the requests' pool (`in_request_thread`).
REQUEST_THREADS = 4
_request_pool: _Pool | None = None


def request_pool() -> _Pool:
    """The pool of the requests' own ORM work, made on first use. With SQLite its threads
    keep their connections between calls (at most `KEPT_CONNECTION_SECONDS`): opening and
    closing a file connection around each of a request's two checks was most of their CPU
    (~3.5 ms a turn at 200 users); a connection to a server is closed after every call."""
    global _request_pool
    if _request_pool is None:
        with _pool_lock:
            if _request_pool is None:
                _request_pool = _Pool(max_workers=REQUEST_THREADS, keep_idle=_sqlite())
    return _request_pool


# The coroutine function of each module-level function, per pool: asgiref's constructor checks
# the function and copies its attributes (~4 µs), and every trip (about ten a turn) made one.
# Closures, lambdas and bound methods (new objects each time) get a new one per call.
_made: dict[tuple[Callable, _Pool], _Trip] = {}


def _on_pool(function: Callable, pool: _Pool) -> _Trip:
    if type(function) is not FunctionType or "<" in function.__qualname__:
        return _Trip(function, pool)
    made = _made.get((function, pool))
    if made is None:
        made = _made[function, pool] = _Trip(function, pool)
    return made


def in_request_thread(function: Callable) -> Callable:
    """`function` as a coroutine function run in the requests' pool (`request_pool`).

    For the ORM work of async views and middleware (the user, the session's owner): in the
    request's own thread its connection would keep that thread until the request's end (a
    streamed turn's length, geosense/handler.py), and on the engine's pool it would queue
    behind every turn's work (one thread with SQLite: at 200 users, turns waited there 0.3-1 s
    for each request's token and session checks)."""
    return _on_pool(function, request_pool())


def in_db_thread(function: Callable) -> Callable:
    """`function` as a coroutine function that runs in the pool (connections as above).

    Never for code that waits on the event loop (`async_to_sync`) or on another pool call: a
    full pool would wait on itself."""
    return _on_pool(function, db_pool())


# The connection `sqlite_wal_keep` keeps open for the life of the process.
_wal_keeper: sqlite3.Connection | None = None


def sqlite_wal_keep() -> None:
    """With SQLite, keep one connection to the database file open for the process's life.

    Closing the last connection to a database in WAL mode checkpoints the WAL and deletes it,
    with fsyncs (10-40 ms a close on this machine under load). The pool closes its connection
    whenever nothing queues behind a call, so under a light load nearly every trip closed the
    file's last connection: until the request path stopped holding a thread (issue 15), a
    streamed request's own thread kept a connection open for the turn's length and hid it.
    This one reads the header once and runs nothing after: it holds no read snapshot, so it
    never holds back a checkpoint."""
    global _wal_keeper
    database = settings.DATABASES["default"]
    if _wal_keeper is not None or database["ENGINE"] != "django.db.backends.sqlite3":
        return
    if database["NAME"] == ":memory:" or str(database["NAME"]).startswith("file:"):
        return
    _wal_keeper = wal_keeper_open(str(database["NAME"]))


def wal_keeper_open(path: str) -> sqlite3.Connection | None:
    """A connection to the SQLite file at `path` that has read its header (so it counts as
    open for the WAL) and holds nothing; None if there is no such file (none is created)."""
    try:
        keeper = sqlite3.connect(f"file:{path}?mode=rw", uri=True, check_same_thread=False)
        keeper.execute("PRAGMA schema_version").fetchall()
    except sqlite3.OperationalError:
        return None
    return keeper
