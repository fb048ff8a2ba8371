"""The turn engine's database pool (geosense/dbpool.py): with SQLite a thread keeps its file
connection between calls; with a database server it keeps it only while other calls wait for the
pool, and closes it (Django's hygiene, `CONN_MAX_AGE = 0`) when the pool is idle behind it; a
connection a call left unfit is closed at once."""

import asyncio
import threading
import time

import pytest
from django.db import connection, transaction

from geosense import dbpool

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


def _write_and_close(path) -> None:
    import sqlite3

    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE IF NOT EXISTS t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    busy, _, _ = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0  # the keeper holds back no checkpoint
    writer.close()


async def test_the_wal_keeper_keeps_a_closing_connection_from_checkpointing_the_file(tmp_path):
    """Closing SQLite's last connection checkpoints the WAL and deletes it (fsyncs): with the
    request path holding no connection, the pool's every idle close was the last one."""
    path = tmp_path / "db.sqlite3"
    _write_and_close(path)
    assert not (tmp_path / "db.sqlite3-wal").exists()  # the last close removed it

    assert dbpool.wal_keeper_open(str(tmp_path / "none.sqlite3")) is None
    keeper = dbpool.wal_keeper_open(str(path))
    _write_and_close(path)
    assert (tmp_path / "db.sqlite3-wal").exists()  # not the last: nothing to do on close
    keeper.close()


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


def _answer(value: int) -> int:
    return value


async def test_a_module_functions_trips_share_one_wrapper(monkeypatch):
    """asgiref's `SyncToAsync` checks and copies the function it wraps as it is made (~4 µs),
    and every trip to a pool made one: a module-level function's is made once per pool, a
    closure's (a new object each time) per call, as before."""
    made = []
    real_init = dbpool._PoolSyncToAsync.__init__

    def counted(wrapper, *args, **kwargs):
        made.append(wrapper)
        real_init(wrapper, *args, **kwargs)

    monkeypatch.setattr(dbpool._PoolSyncToAsync, "__init__", counted)
    answers = [await dbpool.in_db_thread(_answer)(n) for n in range(3)]
    answers += [await dbpool.in_request_thread(_answer)(n) for n in range(3)]
    before_closures = len(made)
    answers += [await dbpool.in_db_thread(lambda n=n: n)() for n in range(2)]

    assert answers == [0, 1, 2, 0, 1, 2, 0, 1]
    assert before_closures <= 2
    assert len(made) - before_closures == 2
