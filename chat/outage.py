"""The channel layer as this process sees it: up, or down since when.

With Redis, live events and cross-process client-tool calls travel through it. When it fails,
a socket can no longer hear what other processes emit, so every socket of this process is
closed with `wire.CLOSE_LIVE_LOST`: the page reads the stored transcript over HTTP and
reconnects with its back-off, and new sockets are accepted and closed with the same code (a
clean refusal the page understands, never an HTTP 500 on the upgrade) until the layer answers
again. The outage is logged once when it starts and once when it ends, not once per event;
the Redis layer's own traceback a second is silenced meanwhile.

Who learns of a failure: any layer operation of this process (`layer_failed`), and a probe
sending one small message a second while sockets are open (`socket_watch`), so a process that
has nothing to send notices too, and notices the end of the outage.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from channels.layers import InMemoryChannelLayer, get_channel_layer

from geosense import wire

logger = logging.getLogger(__name__)

PROBE_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 2.0
PROBE_CHANNEL = "geosense.layer.probe"

Close = Callable[[], Awaitable[None]]

_down_since: float | None = None
_sockets: dict[str, tuple[asyncio.AbstractEventLoop, Close]] = {}
_probes: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}


def layer_down() -> bool:
    return _down_since is not None


def layer_failed(exc: BaseException) -> None:
    """A layer operation failed: log the outage once, close this process's sockets."""
    global _down_since
    if _down_since is None:
        _down_since = time.monotonic()
        logger.warning(
            "The channel layer failed (%s: %s): live events stop; this process's sockets are "
            "closed with %d and new ones refused until it answers again.",
            type(exc).__name__,
            exc,
            wire.CLOSE_LIVE_LOST,
        )
    _close_all()


def layer_ok() -> None:
    global _down_since
    if _down_since is not None:
        logger.warning(
            "The channel layer answers again after %.1f s.", time.monotonic() - _down_since
        )
        _down_since = None


def _close_all() -> None:
    for channel_name, (loop, close) in list(_sockets.items()):
        _sockets.pop(channel_name, None)
        if loop.is_closed():
            continue
        loop.call_soon_threadsafe(lambda close=close: asyncio.ensure_future(close()))


def socket_watch(channel_name: str, close: Close) -> None:
    """A socket of this process to close when the layer fails; starts this loop's probe."""
    loop = asyncio.get_running_loop()
    _sockets[channel_name] = (loop, close)
    layer = get_channel_layer()
    probe = _probes.get(loop)
    if layer is not None and not isinstance(layer, InMemoryChannelLayer):
        if probe is None or probe.done():
            _probes[loop] = loop.create_task(_probe(layer), name="channel-layer probe")


def socket_unwatch(channel_name: str) -> None:
    _sockets.pop(channel_name, None)


async def _probe(layer) -> None:
    """Send one small message a second while this loop has sockets (or the layer is down)."""
    loop = asyncio.get_running_loop()
    while layer_down() or any(owner is loop for owner, _ in _sockets.values()):
        # A task of its own, awaited with a deadline: a send stuck inside the Redis client
        # does not always end when cancelled, and the probe must go on.
        send = asyncio.ensure_future(layer.send(PROBE_CHANNEL, {"type": "layer.probe"}))
        done, _ = await asyncio.wait({send}, timeout=PROBE_TIMEOUT_SECONDS)
        if not done:
            send.cancel()
            send.add_done_callback(lambda t: t.cancelled() or t.exception())
            layer_failed(TimeoutError(f"no answer within {PROBE_TIMEOUT_SECONDS:g} s"))
        elif send.exception() is not None:
            layer_failed(send.exception())
        else:
            layer_ok()
        await asyncio.sleep(PROBE_SECONDS)
    _probes.pop(loop, None)


class _QuietDuringOutage(logging.Filter):
    """The Redis layer logs a traceback a second while Redis is away: one line is enough,
    and ours (`layer_failed`) already said it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (
            isinstance(exc, OSError) or type(exc).__module__.startswith("redis")
        ):
            layer_failed(exc)  # its receive task lost Redis: that is an outage too
            return False
        return not layer_down()


logging.getLogger("channels_redis.pubsub").addFilter(_QuietDuringOutage())
