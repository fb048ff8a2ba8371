"""`GET /healthz`: can this process serve? For the proxy, the orchestrator and the operator.

Three checks run at once, each bounded in time:
- `database`: a query answers;
- `channel_layer`: a message sent on the layer comes back to this process (with Redis, a round
  trip through the server, which is what client tools and live events need);
- `migrations`: every migration this code knows is applied (a process started before
  `migrate` answers 503 until it ran).
200 when all pass, 503 otherwise; the JSON body names each check. No authentication (a load
balancer has none), so the body says nothing secret: a failure is named by its exception type,
never by its message (which may carry a host name or a user).
"""

import asyncio
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from geosense.wire import health_ping_message

CHECK_TIMEOUT = 3.0


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    ms: float
    details: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "ms": round(self.ms, 1), **self.details}


async def _timed(check: Callable[[], Awaitable[dict[str, Any]]]) -> CheckResult:
    """Run a check within CHECK_TIMEOUT; an exception or a time-out is a failed check."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            details = await check()
        ok = details.pop("ok", True)
    except TimeoutError:
        ok, details = False, {"error": f"no answer within {CHECK_TIMEOUT:g} s"}
    except Exception as exc:
        ok, details = False, {"error": type(exc).__name__}
    return CheckResult(ok=ok, ms=(time.perf_counter() - start) * 1000, details=details)


@database_sync_to_async
def _database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"vendor": connection.vendor}


@database_sync_to_async
def _migrations() -> dict[str, Any]:
    loader = MigrationLoader(connection)
    graph = loader.graph
    known = {node for leaf in graph.leaf_nodes() for node in graph.forwards_plan(leaf)}
    unapplied = sorted(f"{app}.{name}" for app, name in known - set(loader.applied_migrations))
    return {"ok": not unapplied, "unapplied": unapplied}


class _Probe:
    """One channel per event loop for the layer round trip, reused by every check.

    A channel per check would leave a subscription behind on the Redis pub/sub layer each time
    (it unsubscribes only a channel whose receive is cancelled). Checks take turns on it.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.channel: str | None = None


_probes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Probe]" = (
    weakref.WeakKeyDictionary()
)


async def _channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    probe = _probes.setdefault(asyncio.get_running_loop(), _Probe())
    async with probe.lock:
        if probe.channel is None:
            probe.channel = await layer.new_channel(prefix="healthz.")
        token = uuid.uuid4().hex
        try:
            await layer.send(probe.channel, health_ping_message(token))
            while (await layer.receive(probe.channel)).get("token") != token:
                pass  # the answer to an earlier check that gave up waiting
        except BaseException:
            probe.channel = None  # a cancelled receive may have dropped the subscription
            raise
    return {"backend": type(layer).__name__}


async def health_report() -> tuple[bool, dict[str, CheckResult]]:
    database, channel_layer, migrations = await asyncio.gather(
        _timed(_database), _timed(_channel_layer), _timed(_migrations)
    )
    checks = {"database": database, "channel_layer": channel_layer, "migrations": migrations}
    return all(check.ok for check in checks.values()), checks


@never_cache
@require_safe
async def healthz(request: HttpRequest) -> JsonResponse:
    ok, checks = await health_report()
    return JsonResponse(
        {
            "status": "ok" if ok else "failing",
            "checks": {name: check.as_json() for name, check in checks.items()},
        },
        status=200 if ok else 503,
    )
