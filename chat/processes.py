"""This process among the deployment's processes: who holds a turn claim or a socket.

Every claim (`ChatSession.turn_owner`) and client-tool registration
(`ClientToolRegistration.process`) names the process holding it, `PROCESS_ID`. A process
writes its `ServerProcess` row and then a heartbeat every `GEOSENSE_PROCESS_HEARTBEAT`
seconds from a thread of its own (not the event loop: a loop busy for a second must not look
like a death). A process silent for `GEOSENSE_PROCESS_STALE` seconds is dead: its claims can
be taken (`services.session_claim`) and its registrations are nobody's
(`selectors.client_toolset_of_session`). So after `kill -9`, a session takes a new turn a few
seconds after the kill, and at once when the process is restarted on the same machine: at
start-up a process releases what the dead processes of its host held (their pid is gone, or is
its own). A process that ends normally (SIGTERM) releases its claims and registrations on
its way out.

With heartbeats off (`GEOSENSE_PROCESS_HEARTBEAT=0`, the test process), no row is written:
claims then last their lease and registrations until their socket closes, as before.
"""

import atexit
import logging
import os
import socket
import threading
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from .models import ChatSession, ClientToolRegistration, ServerProcess

logger = logging.getLogger(__name__)

PROCESS_ID = uuid.uuid4()
HOST = socket.gethostname()[:255]

_started = False
_start_lock = threading.Lock()
_stopping = threading.Event()


def heartbeats_on() -> bool:
    return settings.GEOSENSE_PROCESS_HEARTBEAT > 0


def heartbeat_fresh_since() -> Any:
    """The oldest heartbeat of a process still alive."""
    return timezone.now() - timedelta(seconds=settings.GEOSENSE_PROCESS_STALE)


def process_live_ids(*, since: Any = None) -> QuerySet:
    """The ids of the processes that heartbeated recently (a subquery for claims and
    registrations); `since`: `heartbeat_fresh_since()` as the caller read it."""
    fresh = heartbeat_fresh_since() if since is None else since
    return ServerProcess.objects.filter(heartbeat__gte=fresh).values("id")


def process_alive(*, process_id: object) -> bool:
    """Whether the process heartbeated recently (a socket it holds can still answer)."""
    return ServerProcess.objects.filter(pk=process_id, id__in=process_live_ids()).exists()


def _pid_gone(pid: int) -> bool:
    if pid == os.getpid():  # a restart that got the same pid (a container's pid 1)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


def processes_dead_release() -> int:
    """Free what dead processes held: the claims and registrations of every process of this
    host whose pid is gone, and of every process anywhere that stopped heartbeating.

    Returns how many processes were found dead. Runs at start-up (`process_start`).
    """
    fresh = timezone.now() - timedelta(seconds=settings.GEOSENSE_PROCESS_STALE)
    dead = [
        process_id
        for process_id, host, pid, heartbeat in ServerProcess.objects.exclude(
            pk=PROCESS_ID
        ).values_list("id", "host", "pid", "heartbeat")
        if heartbeat < fresh or (host == HOST and _pid_gone(pid))
    ]
    if dead:
        _release(dead)
    return len(dead)


def _release(process_ids: list[uuid.UUID]) -> None:
    with transaction.atomic():
        ChatSession.objects.filter(
            turn_owner__in=process_ids, turn_state=ChatSession.TurnState.RUNNING
        ).update(turn_state=ChatSession.TurnState.IDLE, turn_lease=None, turn_owner=None)
        ClientToolRegistration.objects.filter(process__in=process_ids).delete()
        ServerProcess.objects.filter(pk__in=process_ids).delete()


def _beat() -> None:
    updated = ServerProcess.objects.filter(pk=PROCESS_ID).update(heartbeat=timezone.now())
    if not updated:  # declared dead while frozen, and its row removed: it lives again
        ServerProcess.objects.create(
            id=PROCESS_ID, host=HOST, pid=os.getpid(), heartbeat=timezone.now()
        )


def _heartbeat_loop() -> None:
    failing = False
    while not _stopping.wait(settings.GEOSENSE_PROCESS_HEARTBEAT):
        try:
            _beat()
            if failing:
                logger.warning("process heartbeat: the database answers again")
            failing = False
        except DatabaseError:
            if not failing:  # once per outage, not once a second
                logger.warning("process heartbeat: the database refused it", exc_info=True)
            failing = True
        finally:
            # CONN_MAX_AGE = 0 holds here too: no connection idles between two beats.
            connection.close()


def process_start() -> None:
    """Announce this process, free what dead processes held, and start the heartbeat.

    Idempotent; a no-op with heartbeats off. Called at start-up (`geosense/asgi.py`) and before
    this process first claims a session or registers a socket (a `manage.py shell`, a bench).
    """
    global _started
    if _started or not heartbeats_on():
        return
    with _start_lock:
        if _started:
            return
        try:
            ServerProcess.objects.update_or_create(
                id=PROCESS_ID,
                defaults={"host": HOST, "pid": os.getpid(), "heartbeat": timezone.now()},
            )
            released = processes_dead_release()
        except DatabaseError:  # not migrated yet, or the database is down: tried again later
            logger.warning("could not announce this process", exc_info=True)
            return
        if released:
            logger.info("released the claims and sockets of %d dead process(es)", released)
        threading.Thread(target=_heartbeat_loop, name="process-heartbeat", daemon=True).start()
        atexit.register(process_stop)
        _started = True


def process_stop() -> None:
    """Release this process's claims and registrations (a normal exit: SIGTERM, Ctrl-C).

    Its running turns end here without a `turn_end`; the next turn of each session repairs
    their calls (engine invariant 1), and their streamed text is kept, cut off.
    """
    _stopping.set()
    try:
        close_old_connections()
        _release([PROCESS_ID])
    except DatabaseError:
        logger.warning("could not release this process's claims on exit", exc_info=True)


def claim_free_q(now, *, live: bool | None = None, since: Any = None) -> Q:
    """Which sessions a new turn may claim: idle, an expired lease, or a dead owner. `live`:
    `heartbeats_on()` and `since`: `heartbeat_fresh_since()`, as the caller read them."""
    free = Q(turn_state=ChatSession.TurnState.IDLE) | Q(turn_lease__lt=now)
    if heartbeats_on() if live is None else live:
        free |= Q(turn_owner__isnull=False) & ~Q(turn_owner__in=process_live_ids(since=since))
    return free
