"""The turn engine's database pool (geosense/dbpool.py): a free thread takes the queued call of
the oldest work first; with SQLite a thread keeps its file connection between calls; with a
database server it keeps it only while other calls wait for the pool, and closes it (Django's
hygiene, `CONN_MAX_AGE = 0`) when the pool is idle behind it; a connection a call left unfit is
closed at once."""

import asyncio
import contextvars
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from asgiref.local import Local
from asgiref.sync import async_to_sync
from django.db import connection, transaction

from chat.models import ChatSession
from geosense import dbpool
from tests.source_pins import source_digests

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_a_pool_thread_keeps_its_connection_while_calls_queue_and_closes_it_when_idle(
    monkeypatch,
):
    """On a database server (a pool that does not keep idle connections, as PostgreSQL's)."""
    idle_closes: list[int] = []
    monkeypatch.setattr(dbpool, "close_old_connections", lambda: idle_closes.append(1))
    monkeypatch.setattr(dbpool, "_pool", dbpool._Pool(max_workers=1))
    gate = threading.Event()
    seen: list[object] = []

    def query(wait: bool) -> None:
        if wait:
            gate.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen.append(connection.connection)

    pool = dbpool.db_pool()
    calls = [asyncio.ensure_future(dbpool.in_db_thread(query)(i == 0)) for i in range(3)]
    while pool.queued < 2:  # noqa: ASYNC110 (a thread pool's count: no event to await)
        await asyncio.sleep(0.01)
    gate.set()  # the first call held the thread while the two others queued
    await asyncio.gather(*calls)
    pool.shutdown(wait=True)
    assert len(set(map(id, seen))) == 1  # one connection for the three calls
    assert idle_closes == [1]  # closed after the last only


async def test_a_connection_in_a_transaction_or_too_old_is_not_kept(monkeypatch):
    # A pool thread of its own: the test database is SQLite in memory, whose connection
    # `close()` keeps open, so on the shared pool thread the connection could be one this
    # thread saw opened by an earlier test, past the limit in a long suite ((False, False,
    # False) twice in the whole suite).
    pool = dbpool._Pool(max_workers=1)
    monkeypatch.setattr(dbpool, "_pool", pool)

    def fitness() -> tuple[bool, bool, bool]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        now = time.monotonic()
        with transaction.atomic():
            inside = dbpool._connection_fit(connection, now)
        outside = dbpool._connection_fit(connection, now)
        aged = dbpool._connection_fit(connection, now + dbpool.KEPT_CONNECTION_SECONDS + 1)
        return inside, outside, aged

    assert await dbpool.in_db_thread(fitness)() == (False, True, False)
    pool.shutdown(wait=True)


async def test_a_pool_of_several_threads_closes_after_every_call(monkeypatch):
    """A waiting call may start on another thread; the one that finished would otherwise keep
    its connection open while it idles (PostgreSQL showed an idle connection after the turns)."""
    idle_closes: list[int] = []
    monkeypatch.setattr(dbpool, "close_old_connections", lambda: idle_closes.append(1))
    monkeypatch.setattr(dbpool, "_pool", dbpool._Pool(max_workers=2))
    gate = threading.Event()

    def query(wait: bool) -> None:
        if wait:
            gate.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    pool = dbpool.db_pool()
    calls = [asyncio.ensure_future(dbpool.in_db_thread(query)(i < 2)) for i in range(4)]
    while pool.queued < 2:  # noqa: ASYNC110 (a thread pool's count: no event to await)
        await asyncio.sleep(0.01)
    gate.set()  # both threads were held while two calls queued
    await asyncio.gather(*calls)
    pool.shutdown(wait=True)
    assert idle_closes == [1, 1, 1, 1]


async def test_both_pools_keep_their_sqlite_connections_between_calls(monkeypatch):
    """Opening and closing a file connection around each of a request's checks was most of
    the requests' pool's CPU; the engine's one thread, idle between turns' trips often enough
    under load, opened a connection every third turn at 200 users."""
    idle_closes: list[int] = []
    monkeypatch.setattr(dbpool, "close_old_connections", lambda: idle_closes.append(1))

    def query() -> object:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return connection.connection

    assert await dbpool.in_request_thread(query)() is not None
    first = await dbpool.in_db_thread(query)()
    assert await dbpool.in_db_thread(query)() is first
    assert idle_closes == []


def _thread_name() -> str:
    return threading.current_thread().name


async def test_each_pools_threads_are_named_after_it():
    """A profile (py-spy) names a thread by its name: the requests' pool's first thread was
    "db_0" as the engine's, and their samples were counted as one thread's."""
    assert (await dbpool.in_db_thread(_thread_name)()).startswith("db_")
    assert (await dbpool.in_request_thread(_thread_name)()).startswith("request_")


def _answer(value: int) -> int:
    return value


async def test_a_module_functions_trips_share_one_wrapper(monkeypatch):
    """asgiref's `SyncToAsync` checks and copies the function it wraps as it is made (~4 µs),
    and every trip to a pool made one: a module-level function's is made once per pool, a
    closure's (a new object each time) per call, as before."""
    made = []
    real_init = dbpool._Trip.__init__

    def counted(wrapper, *args, **kwargs):
        made.append(wrapper)
        real_init(wrapper, *args, **kwargs)

    monkeypatch.setattr(dbpool._Trip, "__init__", counted)
    answers = [await dbpool.in_db_thread(_answer)(n) for n in range(3)]
    answers += [await dbpool.in_request_thread(_answer)(n) for n in range(3)]
    before_closures = len(made)
    answers += [await dbpool.in_db_thread(lambda n=n: n)() for n in range(2)]

    assert answers == [0, 1, 2, 0, 1, 2, 0, 1]
    assert before_closures <= 2
    assert len(made) - before_closures == 2


def _loop_calls_of_a_trip(locals_set: bool = False) -> tuple[int, list[str]]:
    """A trip's answer and the Python calls on its caller's loop, counted on a loop and in a
    context of their own (with `locals_set`, holding 20 asgiref `Local`s), the pool's thread
    started by a trip before."""
    trip = dbpool.in_db_thread(_answer)

    async def counted_trip() -> tuple[int, list[str]]:
        if locals_set:
            for number, local in enumerate(_locals):
                local.value = f"loop {number}"
        await trip(0)
        calls = []

        def counted(frame, event, arg):
            if event == "call":
                calls.append(frame.f_code.co_name)

        sys.setprofile(counted)  # this thread only: this loop's
        try:
            answer = await trip(1)
        finally:
            sys.setprofile(None)
        return answer, calls

    return contextvars.Context().run(asyncio.run, counted_trip())


async def test_a_trip_costs_the_event_loop_few_python_calls():
    """About ten trips a turn: through asgiref's `SyncToAsync` (its context and thread-sensitive
    lookups, the shield, `wrap_future`'s chained futures) a trip was 99 Python calls on the
    loop, a fifth of its CPU at 200 users."""
    # A context of its own: a trip restores each asgiref `Local` of its caller's context (two
    # calls each), and the tests before this one leave ~50 in the shared one (CI counted 193).
    answer, calls = await asyncio.to_thread(_loop_calls_of_a_trip)
    assert answer == 1
    # 37-43 through `ThreadPoolExecutor` (its Future, Condition, RLock, work item, semaphore),
    # 28-30 now.
    assert len(calls) < 37, " ".join(calls)


async def test_a_trip_tidies_its_own_connection_without_looking_the_threads_up():
    """Every trip ends by tidying its thread's connections: with one database, the trip's own
    is the only one (looking them up through asgiref's `Local` cost ~6 Python calls a trip).
    Kept or closed as before."""
    from django.db import connections

    from tests.chat.costs import python_calls_of

    def tidied() -> tuple[int, int, bool]:  # in a thread of its own, with its connection
        own_connection = connections["default"]
        with own_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        raw = own_connection.connection
        looked_up = python_calls_of(dbpool.connections_tidy, busy=True)
        own = python_calls_of(dbpool.connections_tidy, busy=True, trip=own_connection)
        kept = own_connection.connection is raw
        own_connection.close()
        return looked_up, own, kept

    looked_up, own, kept = await asyncio.to_thread(tidied)
    assert kept  # fit: kept, as before
    assert own <= looked_up - 5, (own, looked_up)


async def test_a_trip_costs_the_pools_thread_few_python_calls_besides_its_function():
    """The pool thread's side of a trip whose connection is kept (a served-call turn makes
    five; the engine's thread is the queue every turn waits in): the call in the caller's
    context, the connection tidied, the end handed to the loop. Each trip looked the thread's
    connection up (three Python calls and a `RuntimeError` raised and caught: asgiref's `Local`
    asks for a running loop), Django's `get_autocommit()` made three more and raised another
    (its async-safety check), and the handler and the call were two methods."""
    from django.db import connections

    from tests.chat.costs import python_calls_of

    loop = asyncio.get_running_loop()
    ended = [loop.create_future(), loop.create_future()]
    trip = dbpool._Trip(_answer, dbpool._Pool(max_workers=1, keep_idle=True))

    def run_counted() -> tuple[int, bool]:  # in a thread of its own, its connection open
        own_connection = connections["default"]
        with own_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        raw = own_connection.connection
        trip._run(loop, ended[:1], None, [], contextvars.copy_context(), (6,), {})  # its first
        context = contextvars.copy_context()
        calls = python_calls_of(trip._run, loop, ended[1:], None, [], context, (7,), {})
        kept = own_connection.connection is raw
        own_connection.close()
        return calls, kept

    calls, kept = await asyncio.to_thread(run_counted)
    assert [await ended[0], await ended[1]] == [6, 7]
    assert kept
    # 15 before (14 outside the tests, whose pytest-django patch adds one): `_run`, `_call`,
    # `connections[alias]` (3), `_in_context`, `_context_restore`, `_answer`,
    # `connections_tidy`, `_connection_fit`, `get_autocommit` (3), `_hand_over`. Now 7: `_run`,
    # `_in_context`, `_context_restore`, `_answer`, `connections_tidy`, `_connection_fit`,
    # `_hand_over`.
    assert calls <= 7, calls


_seen = contextvars.ContextVar("seen")
_local = Local()


async def test_a_trip_looks_its_connection_up_once_for_its_compiled_statements(monkeypatch):
    """Each compiled statement looked its connection up (`connections[alias]`: three Python
    calls through asgiref's `Local`, ~20 statements a turn on the engine's thread); a trip
    looks it up once, and its statements run on it: the thread's own connection."""
    from django.db import connections
    from django.utils.connection import BaseConnectionHandler

    from geosense.compiled import CompiledRead

    read = CompiledRead(
        build=lambda: ChatSession.objects.values_list("id")[:1],
        tail=lambda connection: [],
    )
    lookups: list[str] = []
    real = BaseConnectionHandler.__getitem__

    def looked_up(handler, alias):
        lookups.append(alias)
        return real(handler, alias)

    def three_reads() -> object:
        read.rows(), read.rows(), read.rows()
        return connections["default"]

    await dbpool.in_db_thread(three_reads)()  # the first read compiles (through the ORM)
    monkeypatch.setattr(BaseConnectionHandler, "__getitem__", looked_up)
    own = await dbpool.in_db_thread(three_reads)()
    # `three_reads`'s own: the trip's is the thread's, looked up at the thread's first trip (5
    # when each read looked, 3 while the tidying after it looked the thread's connections up, 2
    # while each trip looked it up).
    assert lookups == ["default"]
    assert own.connection is not None  # the thread's connection, which the reads used
    assert dbpool.trip_connections.default is None  # not this thread's, nor after the trip


async def test_a_trip_shares_the_callers_context_both_ways():
    """As `sync_to_async`: the caller's contextvars and asgiref `Local`s are the function's,
    and what the function sets is the caller's after the trip."""
    _seen.set("loop")
    _local.value = "loop"

    def read_and_set() -> tuple[str, str]:
        found = _seen.get(), _local.value
        _seen.set("pool")
        return found

    assert await dbpool.in_db_thread(read_and_set)() == ("loop", "loop")
    assert _seen.get() == "pool"


_locals = [Local() for _ in range(20)]


def _locals_read_and_one_set() -> list[str]:
    found = [local.value for local in _locals]
    _locals[0].value = "pool"
    return found


async def test_a_trip_moves_its_callers_locals_without_a_python_call_each():
    """asgiref's `_restore_context` made two Python calls for each `Local` of the context, on
    both sides of every trip (a turn's context holds four, ~6 trips a turn). The trip's own
    move (`_context_restore`) makes none, on the pool's thread (the caller's context moved
    there) and back on the loop's, and a `Local` is read and set across a trip as with
    asgiref: what the call set is the caller's after, what it did not set reads as before.
    Counted on a loop and in a context of their own, each move by itself (a trip's other
    work, and other tests' trips on the pool's thread, stay out of the count)."""
    from tests.chat.costs import python_calls_of

    trip = dbpool.in_db_thread(_locals_read_and_one_set)

    async def moved() -> tuple[int, int]:
        for number, local in enumerate(_locals):
            local.value = f"loop {number}"
        context = contextvars.copy_context()
        in_pool = await asyncio.to_thread(
            context.run, python_calls_of, dbpool._context_restore, context
        )
        on_loop = python_calls_of(dbpool._context_restore, context)
        assert await trip() == [f"loop {number}" for number in range(20)]
        assert [local.value for local in _locals] == ["pool"] + [f"loop {n}" for n in range(1, 20)]
        return in_pool, on_loop

    in_pool, on_loop = await asyncio.to_thread(contextvars.Context().run, asyncio.run, moved())
    # 41 each through asgiref's `_restore_context` (itself, and two a `Local`).
    assert (in_pool, on_loop) == (1, 1)


async def test_a_trip_with_locals_in_its_context_costs_the_loop_few_python_calls():
    """The loop's side of a real trip whose caller's context holds 20 `Local`s: the trip must
    move them with `_context_restore` (asgiref's `_restore_context` there: 68 calls, two a
    `Local`; review 31-b M1: the count above calls the function itself, not a trip)."""
    answer, calls = await asyncio.to_thread(_loop_calls_of_a_trip, True)
    assert answer == 1
    assert len(calls) < 37, " ".join(calls)


# What `dbpool._context_restore` stands in for (asgiref's `_restore_context`, which re-homes each
# `Local`'s storage with `_rehome`), and what it relies on (`_Storage`'s two slots, and a
# `Local` reading only a storage of its own thread): a lock bump that changes any of them fails
# here (review 31-a L3).
ASSUMED_SOURCES = {
    "asgiref.sync._restore_context": "05b96f4ee7dab00f",
    "asgiref.local._rehome": "9014b9aa2306c0be",
    "asgiref.local._Storage": "6a712bd48329940f",
    "asgiref.local._CVar._storage": "37bfde39a7ef0ef3",
}


async def test_the_asgiref_sources_a_trips_context_move_stands_in_for_are_the_ones_read():
    from asgiref import local, sync

    originals = {
        "asgiref.sync._restore_context": sync._restore_context,
        "asgiref.local._rehome": local._rehome,
        "asgiref.local._Storage": local._Storage,
        "asgiref.local._CVar._storage": local._CVar._storage,
    }
    assert source_digests(originals) == ASSUMED_SOURCES


async def test_a_failing_call_raises_in_the_caller_within_the_callers_exception():
    def fail() -> None:
        raise KeyError(sys.exc_info()[0].__name__)

    with pytest.raises(KeyError) as raised:
        try:
            raise ValueError
        except ValueError:
            await dbpool.in_db_thread(fail)()
    assert raised.value.args == ("ValueError",)


async def test_async_to_sync_in_a_trip_runs_its_coroutine_on_the_callers_loop():
    """`_announce` (annotations) and `_revoke` (accounts) send to the channel layer from the
    pool: on the loop that runs the sockets (the in-memory layer's queues belong to it)."""
    ran_on = []

    async def note() -> str:
        ran_on.append((asyncio.get_running_loop(), threading.current_thread()))
        return "sent"

    assert await dbpool.in_db_thread(lambda: async_to_sync(note)())() == "sent"
    assert ran_on == [(asyncio.get_running_loop(), threading.current_thread())]


async def test_a_cancelled_caller_drops_a_queued_call_and_leaves_a_running_one_to_end(
    monkeypatch,
):
    """As asgiref's `SyncToAsync` on an executor: the caller's `CancelledError` comes at once;
    a call that had not started never runs; one that had goes on in its thread, unawaited."""
    pool = dbpool._Pool(max_workers=1)
    monkeypatch.setattr(dbpool, "_pool", pool)
    gate, started = threading.Event(), threading.Event()
    ran = []

    def held() -> None:
        started.set()
        gate.wait(10)
        ran.append("held")

    running = asyncio.ensure_future(dbpool.in_db_thread(held)())
    queued = asyncio.ensure_future(dbpool.in_db_thread(lambda: ran.append("queued"))())
    await asyncio.to_thread(started.wait, 10)
    running.cancel()
    queued.cancel()
    for task in (running, queued):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert ran == []
    gate.set()
    pool.shutdown(wait=True)
    assert ran == ["held"]


async def test_a_cancelled_caller_cancels_the_coroutine_its_call_waits_on():
    """A call waiting in `async_to_sync` on a task of the caller's loop: that task is cancelled
    and the call sees it; a task that finishes anyway makes the caller wait for the call's
    result, as asgiref's `SyncToAsync` does."""
    entered = asyncio.Event()
    seen = []

    async def wait_forever() -> None:
        entered.set()
        await asyncio.sleep(30)

    async def finish_anyway() -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass

    def waits(coroutine_function) -> str:
        try:
            async_to_sync(coroutine_function)()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "ended"

    caller = asyncio.ensure_future(dbpool.in_db_thread(waits)(wait_forever))
    await entered.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    entered.clear()
    caller = asyncio.ensure_future(dbpool.in_db_thread(waits)(finish_anyway))
    await entered.wait()
    caller.cancel()
    assert await caller == "ended"
    assert seen == ["cancelled"]


async def test_a_cancelled_queued_call_leaves_the_queue_and_the_idle_pool_closes(monkeypatch):
    """A queued call whose caller was cancelled never starts: it counted as queued for ever,
    and a pool of one thread on a database server (PostgreSQL with `GEOSENSE_DB_THREADS=1`)
    then kept its connection for ever, as if calls always waited."""
    idle_closes: list[int] = []
    monkeypatch.setattr(dbpool, "close_old_connections", lambda: idle_closes.append(1))
    pool = dbpool._Pool(max_workers=1)
    monkeypatch.setattr(dbpool, "_pool", pool)
    gate, started = threading.Event(), threading.Event()

    def held() -> None:
        started.set()
        gate.wait(10)

    running = asyncio.ensure_future(dbpool.in_db_thread(held)())
    await asyncio.to_thread(started.wait, 10)
    queued = asyncio.ensure_future(dbpool.in_db_thread(_answer)(1))
    await asyncio.sleep(0)
    assert pool.queued == 1
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert pool.queued == 0
    gate.set()
    await running
    pool.shutdown(wait=True)
    assert idle_closes == [1]


@pytest.fixture(autouse=True)
def no_work_mark():
    """Each test's trips carry only the marks it makes: Django's test client runs a view
    through `async_to_sync`, which copies the view's context back into the test runner's, so a
    turn an earlier test prepared through it left its mark there (the order tests failed after
    tests/security/test_malformed_http.py)."""
    token = dbpool._began.set(None)
    yield
    dbpool._began.reset(token)


class _Held:
    """A pool of one thread held by a call until `release`, and trips noting their name on it
    in the order they run."""

    def __init__(self, monkeypatch) -> None:
        self.pool = dbpool._Pool(max_workers=1)
        monkeypatch.setattr(dbpool, "_pool", self.pool)
        self.ran: list[str] = []
        self._gate, started = threading.Event(), threading.Event()

        def held() -> None:
            started.set()
            self._gate.wait(10)

        self._holder = asyncio.ensure_future(dbpool.in_db_thread(held)())
        self._started = started

    async def hold(self) -> None:
        await asyncio.to_thread(self._started.wait, 10)

    def note(self, name: str) -> asyncio.Future:
        """A trip of the current context (its mark, if any), submitted at once."""
        return asyncio.ensure_future(dbpool.in_db_thread(self.ran.append)(name))

    async def queued(self, count: int) -> None:
        while self.pool.queued < count:  # noqa: ASYNC110 (submitted on this loop: no event)
            await asyncio.sleep(0)

    async def release(self, *trips: asyncio.Future) -> None:
        self._gate.set()
        await asyncio.gather(self._holder, *trips)
        self.pool.shutdown(wait=True)


async def _turn(pool: _Held, *names: str, go: asyncio.Event) -> None:
    """A turn's task: it begins, then, once let go, makes its trips at once (a gather: one
    mark, submitted in order)."""
    dbpool.work_begin()
    await go.wait()
    await asyncio.gather(*(pool.note(name) for name in names))


async def test_a_free_thread_takes_the_call_of_the_oldest_work_first(monkeypatch):
    """A turn's trips carry its start: the queue runs them in that order, not in the order calls
    came, and calls without a mark, in the order submitted, take turns with them (at 200 users a running turn's every
    trip waited behind ~196 others, newer turns' included)."""
    pool = _Held(monkeypatch)
    await pool.hold()
    early = pool.note("early")  # no mark: submitted before both turns began
    older_go, newer_go = asyncio.Event(), asyncio.Event()
    older = asyncio.ensure_future(_turn(pool, "older 1", "older 2", go=older_go))
    await asyncio.sleep(0)
    newer = asyncio.ensure_future(_turn(pool, "newer", go=newer_go))
    await asyncio.sleep(0)
    late = pool.note("late")  # no mark: submitted after both began
    newer_go.set()  # the newer turn's trip comes first
    await pool.queued(3)
    older_go.set()
    await pool.queued(5)
    await pool.release(early, older, newer, late)

    # The holder's call had no mark: a turn's goes next.
    assert pool.ran == ["older 1", "early", "older 2", "late", "newer"]


async def test_calls_without_a_mark_take_turns_with_the_turns_trips(monkeypatch):
    """A socket's registration, a Stop (no turn, no mark) waits for one turn's trip per call
    queued before it, not for the drain of every turn begun before it (review H1: seconds at
    200 users), and a flood of them takes every other trip, not all (review M3: a turn's trips
    waited out the flood)."""
    pool = _Held(monkeypatch)
    await pool.hold()
    go = asyncio.Event()
    turns = [asyncio.ensure_future(_turn(pool, "before 1", "before 2", "before 3", go=go))]
    await asyncio.sleep(0)
    go.set()
    await pool.queued(3)
    flood = [pool.note(f"frame {i}") for i in range(4)]
    turns += [asyncio.ensure_future(_turn(pool, "after", go=go))]
    await pool.queued(8)
    await pool.release(*flood, *turns)

    # The holder's call had no mark: a turn's goes next.
    assert pool.ran == [
        "before 1",
        "frame 0",
        "before 2",
        "frame 1",
        "before 3",
        "frame 2",
        "after",
        "frame 3",
    ]


async def test_a_turn_a_step_further_goes_before_older_turns_at_their_first(monkeypatch):
    """Closest to its end first: a turn whose calls were answered (its next step's reads store a
    client tool's result) passes the first steps of every turn, older ones included; among
    turns as far along, the oldest first; a call without a mark before all."""
    pool = _Held(monkeypatch)
    await pool.hold()
    go = asyncio.Event()

    async def turn(name: str, steps_taken: int) -> None:
        dbpool.work_begin()
        for _ in range(steps_taken):
            dbpool.work_advance()
        await go.wait()
        await pool.note(name)

    trips = [asyncio.ensure_future(turn("oldest, first step", 0))]
    await asyncio.sleep(0)
    trips.append(pool.note("registration"))
    await asyncio.sleep(0)
    trips += [
        asyncio.ensure_future(turn(name, taken))
        for name, taken in (("older, second step", 1), ("newer, third step", 2))
    ]
    await asyncio.sleep(0)
    trips.append(asyncio.ensure_future(turn("newest, second step", 1)))
    go.set()
    await pool.queued(5)
    await pool.release(*trips)

    assert pool.ran == [
        "newer, third step",
        "registration",
        "older, second step",
        "newest, second step",
        "oldest, first step",
    ]


async def test_a_cancelled_queued_call_is_passed_over_and_the_rest_keep_their_order(monkeypatch):
    pool = _Held(monkeypatch)
    await pool.hold()
    go = asyncio.Event()
    newer = asyncio.ensure_future(_turn(pool, "newer", go=go))
    await asyncio.sleep(0)
    first, dropped, last = (pool.note(name) for name in ("first", "dropped", "last"))
    go.set()
    await pool.queued(4)
    dropped.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert pool.pool.queued == 3
    await pool.release(first, last, newer)

    assert pool.ran == ["newer", "first", "last"]
    assert pool.pool.queued == 0


ROOT = Path(__file__).resolve().parent.parent
EXIT = """
import threading, time
from geosense import dbpool

pool = dbpool._Pool(max_workers=1)
pool.submit(time.sleep, 0.2)
pool.submit(print, "queued ran")
print(*(t.name for t in threading.enumerate() if t.name.startswith("db")))
"""


async def test_a_process_that_exits_runs_what_is_queued_and_waits_on_no_idle_thread():
    """As with `ThreadPoolExecutor`'s threads: the pool's threads ("db_0", …) are joined at
    exit once the calls queued before have run, and an idle one holds no exit back."""
    ended = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", EXIT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert ended.stdout.splitlines() == ["db_0", "queued ran"]
