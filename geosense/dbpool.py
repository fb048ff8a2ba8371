"""A small fixed pool of threads for the turn engine's ORM work.

Under ASGI, `sync_to_async` (thread-sensitive) runs a request's ORM calls in a thread of that
request's own, and a turn task started from the request inherits it: 500 turns in flight made
500 threads, each with its SQLite connection (and its page cache) contending for one writer
until the busy timeout ran out (issue 15). Every engine call goes through this pool instead, so
the number of threads and database connections is `GEOSENSE_DB_THREADS` however many turns run;
turns queue for a thread rather than for the database's lock.

Connection hygiene is `channels.db.database_sync_to_async`'s: `close_old_connections()` before
and after each call, so no connection outlives a call (`CONN_MAX_AGE = 0`, docs/deploy.md).
"""

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from channels.db import DatabaseSyncToAsync
from django.conf import settings

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def db_pool() -> ThreadPoolExecutor:
    """The process's pool, made on first use with `GEOSENSE_DB_THREADS` threads."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(
                    max_workers=settings.GEOSENSE_DB_THREADS, thread_name_prefix="db"
                )
    return _pool


def in_db_thread(function: Callable) -> Callable:
    """`function` as a coroutine function that runs in the pool, connections closed around it.

    Never for code that waits on the event loop (`async_to_sync`) or on another pool call: a
    full pool would wait on itself."""
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=db_pool())
