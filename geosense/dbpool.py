"""A small fixed pool of threads for the turn engine's ORM work.

Under ASGI, `sync_to_async` (thread-sensitive) runs a request's ORM calls in a thread of that
request's own, and a turn task started from the request inherits it: 500 turns in flight made
500 threads, each with its SQLite connection (and its page cache) contending for one writer
until the busy timeout ran out (issue 15). Every engine call goes through this pool instead, so
the number of threads and database connections is `GEOSENSE_DB_THREADS` however many turns run;
turns queue for a thread rather than for the database's lock, and the queue is served oldest work
first (`work_begin`, `_Pool`): a running turn's trips pass those of the turns begun after it.

Connections: with SQLite a pool thread keeps its connection to the file from one call to the
next (under load, opening a connection per call was a tenth of the process's time: connect, the
SQLite pragmas, the schema read again), for at most `KEPT_CONNECTION_SECONDS`: a file connection
holds nothing on a server, and the process keeps one open anyway (geosense/sqlite_wal.py). With a
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
import atexit
import collections
import contextvars
import heapq
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from types import FunctionType
from typing import Any

from asgiref.local import _Storage
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

# A connection older than this when a call ends is closed (the next call opens a new one); the
# age is checked only then, so an idle kept connection can be older at its next call.
KEPT_CONNECTION_SECONDS = 60.0


# The work (a turn) the trips made in this context belong to: how far it has come (0, then -1,
# -2, … for each step it has taken: `work_advance`) and when it began (`work_begin`).
# None: no work (asgiref's `async_to_sync` copies a call's context back into its sync caller's,
# so a mark can reach a context that is not a turn's; tests/test_dbpool.py clears it so).
_began: contextvars.ContextVar[tuple[int, float] | None] = contextvars.ContextVar("work_began")


def work_begin() -> None:
    """The trips made in this context from now on belong to work that begins now (a turn, as
    its request prepares it: the turn's task, and the tasks that task starts, inherit the
    mark): each pool runs them before the trips of work begun later."""
    _began.set((0, time.monotonic()))


def work_advance() -> None:
    """The work of this context has come a step further (a turn whose calls are answered goes
    on to its next step): from now on its trips go before those of work that has come less
    far, however old. Closest to its end first: a client tool's answer waited behind the first
    steps of the turns begun before its own (p99 ~520-580 → ~400-470 ms at 200 users, measured
    on a loaded machine), and a turn that ends lets go of its claim and its memory."""
    stage, began = _began.get(None) or (0, time.monotonic())
    _began.set((stage - 1, began))


# A thread that takes this from its pool's wake-ups ends (`_Pool.shutdown`).
_STOP = object()


class _Pool:
    """`max_workers` threads ("db_0", "db_1", …; the requests' pool's "request_0", …: py-spy
    put both pools' first threads under "db_0"), started as calls come and wait, that run the
    calls submitted to them oldest work first.

    A call's mark is how far the work it belongs to has come and when that work began
    (`work_begin`, `work_advance`: every trip of a turn carries the turn's start and its step).
    A free thread takes the queued call of the work furthest along, the oldest among equals,
    the first submitted among equal marks. In the order calls came, at 200 users each of a
    turn's ~8 trips waited behind ~196 others (~240 ms a trip, so ~480 ms a client tool's round
    trip): now a running turn's trips pass those of every turn begun after it, and the wait
    gathers at new turns' first trips (the tool's round trip p50 ~550 → ~135 ms, p99 ~950 →
    ~510 ms; docs/benchmarks.md).
    Calls without a mark (a socket's tool registration, a Stop: what a person waits on before a
    turn of theirs can begin or end) queue apart, in the order submitted, and take turns with
    the marked ones while both wait: such a call waits for one turn's trip per call queued
    before it, and a flood of them (anyone can send frames) at most halves the turns' share of
    the pool. Ordered as work begun when it was submitted, it waited for every trip of every
    turn begun before it, the whole drain of the running turns at saturation (a new message's
    preparation, in that place, waited ~2.9 s at p50 at 200 users); put before every turn's,
    a flood of them stopped every turn while it lasted (review of session 27, H1 and M3).
    Only calls queued at the same time change order: a call its caller awaited has ended before
    anything that caller does next, and one context's calls (a turn's) keep their order.

    Leaner than the `ThreadPoolExecutor` it replaces, whose `submit` was ~13 % of the event
    loop's samples at 200 users (a Future with its Condition and RLock, a work item, the idle
    semaphore, the thread count): a call is a list `[function, args]` in a heap (or the
    unmarked calls' deque), a lock guards them and the counts, and a `SimpleQueue` carries one
    wake-up per call to the threads.
    A thread that takes a call empties its list, `cancel` empties a queued one: under the lock,
    whichever comes first decides whether the call runs, and the call leaves the count of
    queued calls once. A cancelled call's entry is dropped when its wake-up comes.

    The threads are daemons, and the pool's `shutdown` at the interpreter's exit runs what is
    queued and joins them, as `ThreadPoolExecutor`'s threads were."""

    def __init__(self, *, max_workers: int, keep_idle: bool = False, name: str = "db") -> None:
        self.max_workers = max_workers
        self.name = name  # its threads' names' stem: a profile tells the pools apart
        # Each thread keeps a fit connection even when no call waits (see `request_pool`).
        self.keep_idle = keep_idle
        self._calls: list[tuple[tuple[int, float], int, list]] = []  # (mark, sequence, call)
        self._unmarked: collections.deque[list] = collections.deque()
        self._unmarked_last = False  # the last call taken was an unmarked one
        self._sequence = itertools.count()
        self._wake: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0
        self._busy = 0
        self._threads: list[threading.Thread] = []
        atexit.register(self.shutdown)

    @property
    def queued(self) -> int:
        """Calls submitted that have not started and will (not cancelled)."""
        return self._queued

    @property
    def single(self) -> bool:
        """One thread: a waiting call is sure to run on the thread that finished."""
        return self.max_workers == 1

    def submit(self, fn: Callable, /, *args: Any) -> list:
        """Queue `fn(*args)`, which must not raise (a trip hands its exception to its caller);
        the list returned is the call, for `cancel`."""
        mark = _began.get(None)
        call = [fn, args]
        with self._lock:
            if mark is None:
                self._unmarked.append(call)
            else:
                heapq.heappush(self._calls, (mark, next(self._sequence), call))
            self._queued += 1
            threads = len(self._threads)
            if self._queued > threads - self._busy and threads < self.max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}_{threads}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._wake.put(None)
        return call

    def cancel(self, call: list) -> bool:
        """Whether `call` was still queued: then it never runs."""
        with self._lock:
            if not call:
                return False
            call.clear()
            self._queued -= 1
            return True

    def _work(self) -> None:
        while self._wake.get() is not _STOP:
            with self._lock:
                unmarked = bool(self._unmarked) and not (self._unmarked_last and self._calls)
                call = self._unmarked.popleft() if unmarked else heapq.heappop(self._calls)[2]
                if not call:  # cancelled while queued
                    continue
                self._unmarked_last = unmarked
                fn, args = call
                call.clear()
                self._queued -= 1
                self._busy += 1
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._busy -= 1

    def shutdown(self, *, wait: bool = True) -> None:
        """The threads end once the calls queued before have run (a later call starts new
        ones); with `wait`, once they have ended."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._wake.put(_STOP)
        if wait:
            for thread in threads:
                thread.join()


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
    """Whether the pool thread may keep this open connection for its next call: back in
    autocommit, outside any transaction, not failed, and not older than the limit. Its
    `autocommit` read as it is: `get_autocommit()` first makes sure the connection is open,
    through Django's async-safety check, which on a pool thread raises and catches a
    `RuntimeError` (no running loop), every trip."""
    if conn.in_atomic_block or conn.autocommit != conn.settings_dict["AUTOCOMMIT"]:
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


def connections_tidy(*, busy: bool, trip: Any = None) -> None:
    """After a pool call: keep a fit connection while other calls wait (`busy`), else close
    what Django's own hygiene closes (every connection, at `CONN_MAX_AGE = 0`). `trip`: the
    call's connection to the default database, the only one to look at when the process has
    no other (the thread's connections looked up through asgiref's `Local`: ~6 Python calls
    every trip)."""
    if not busy:
        close_old_connections()
        return
    now = time.monotonic()
    alone = trip is not None and len(connections.settings) == 1
    for conn in (trip,) if alone else connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if _connection_fit(conn, now):
            conn.errors_occurred = False
            conn.health_check_done = False  # checked again before its next use, as Django does
        else:
            conn.close()


class _TripConnections(threading.local):
    """The default database's connection of the trip a pool thread runs (`default`), None
    between trips: for the compiled statements it runs (geosense/compiled.py), where
    `connections[alias]` is three Python calls through asgiref's `Local`, and a `RuntimeError`
    raised and caught (the `Local` asks for a running loop: a pool thread has none), and a
    turn's trips run ~20 statements.
    `own`: the thread's connection, looked up at its first trip. Django makes a thread's at its
    first lookup and keeps the same object for the thread's life, open or closed (only code
    that assigns `connections[alias]`, none on a pool thread, replaces it): a lookup every
    trip (five a served-call turn, on the engine's thread) found the same one."""

    default: Any = None
    own: Any = None


trip_connections = _TripConnections()


class _Trip:
    """`function` as a coroutine function run on `pool`, with the pool's connection hygiene
    around each call.

    What asgiref's `SyncToAsync` (not thread-sensitive, on an executor) gives such a call, for
    less than a third of the event loop's Python work a trip (99 calls through it, 37-43 on a
    `ThreadPoolExecutor`, 28-30 on `_Pool`; ~40 → ~20 µs of the loop's CPU in isolation; about
    ten trips a turn): the caller's context
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
        ended = [loop.create_future()]  # what the call's end sets (`_cancelled` may replace it)
        call = self.pool.submit(
            self._run, loop, ended, sys.exception(), task_context, context, args, kwargs
        )
        try:
            return await ended[0]
        except asyncio.CancelledError:
            return await _cancelled(self.pool, call, ended, task_context, loop)
        finally:
            _context_restore(context)

    def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        ended: list[asyncio.Future],
        caller_exception: BaseException | None,
        task_context: list[asyncio.Task],
        context: contextvars.Context,
        args: tuple,
        kwargs: dict,
    ) -> None:
        """In the pool thread: asgiref's `thread_handler`, the call, the connections tidied,
        then the call's end handed to the loop in one callback (asyncio's `wrap_future` takes a
        done callback on each side, and a concurrent future's locks and five reads of its state
        on the loop)."""
        threadlocal = SyncToAsync.threadlocal
        threadlocal.main_event_loop = loop
        threadlocal.main_event_loop_pid = os.getpid()
        threadlocal.task_context = task_context
        own = trip_connections.own
        if own is None:
            own = trip_connections.own = connections[DEFAULT_DB_ALIAS]
        trip_connections.default = own
        try:
            try:
                if caller_exception is None:
                    result = context.run(self._in_context, context, args, kwargs)
                else:
                    try:
                        raise caller_exception
                    except BaseException:
                        result = context.run(self._in_context, context, args, kwargs)
            finally:
                trip, trip_connections.default = trip_connections.default, None
                pool = self.pool
                connections_tidy(
                    busy=pool.keep_idle or (pool.single and pool.queued > 0), trip=trip
                )
        except BaseException as error:
            _hand_over(loop, ended, None, error)
        else:
            _hand_over(loop, ended, result, None)

    def _in_context(self, context: contextvars.Context, args: tuple, kwargs: dict) -> Any:
        _context_restore(context)  # asgiref `Local`s set on the loop, moved to this thread
        return self.function(*args, **kwargs)


_UNSET = object()  # a variable not set in the current context


def _context_restore(context: contextvars.Context) -> None:
    """asgiref's `_restore_context` (what `SyncToAsync` does on both sides of a call): each
    variable of `context` set in the current one, an asgiref `Local`'s storage moved to this
    thread (its data, tagged with the thread that may read it), without the two Python calls
    asgiref makes for each `Local` (`_rehome` and the storage's `__init__`): a turn's
    context holds four, moved on both sides of each of its ~6 trips (~96 Python calls a turn
    of the database thread and the loop, under the one GIL; issue 15).
    A storage already this thread's with the same data (a `Local` the call did not set, back
    on the loop) is left as it is: it reads the same."""
    thread = threading.get_ident()
    for cvar, value in context.items():
        if isinstance(value, _Storage):
            current = cvar.get(None)
            if (
                isinstance(current, _Storage)
                and current.data is value.data
                and current.thread_id == thread
            ):
                continue
            moved = object.__new__(_Storage)  # its slots set here: no Python `__init__` call
            moved.thread_id = thread
            moved.data = value.data
            value = moved
        if cvar.get(_UNSET) is not value:
            cvar.set(value)


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    ended: list[asyncio.Future],
    result: Any,
    error: BaseException | None,
) -> None:
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(_end, ended, result, error)
        except RuntimeError:  # closed in between
            pass


def _end(ended: list[asyncio.Future], result: Any, error: BaseException | None) -> None:
    future = ended[0]
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


async def _cancelled(
    pool: _Pool,
    call: list,
    ended: list[asyncio.Future],
    task_context: list[asyncio.Task],
    loop: asyncio.AbstractEventLoop,
) -> Any:
    """A trip whose caller was cancelled, as asgiref's `SyncToAsync` ends it: a call still
    queued never runs; one that runs goes on in its thread, unawaited, unless it waits in
    `async_to_sync` on a task of this loop: that task is cancelled, and if it finishes anyway
    the caller waits for the call and gets its result."""
    if pool.cancel(call) or not task_context:
        raise asyncio.CancelledError
    # The call cannot end before that task, which this loop runs: its end comes here.
    after = ended[0] = loop.create_future()
    inner = task_context[0]
    inner.cancel()
    try:
        await inner
    except BaseException:
        after.cancel()  # nobody waits for the call's end
        raise
    return await after


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
                _request_pool = _Pool(
                    max_workers=REQUEST_THREADS, keep_idle=_sqlite(), name="request"
                )
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
