"""Where a turn's events go: its local listeners, then the session's sockets.

The engine persists first, then emits (docs/architecture.md, "Engine invariants", 5). The
events and their data are defined in `geosense.wire`; emitting goes to the turn's local
listeners (an SSE response following the turn) and to the session's channel-layer group,
where every socket bound to the session relays it.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.core.cache import cache

from geosense import wire
from geosense.wire import TurnEvent, turn_event_message

from . import outage

logger = logging.getLogger(__name__)

# A socket's delivery of a turn event's frame, as JSON text (`wire.event_frame_text`).
Relay = Callable[[str], Awaitable[None]]

# How often, at most, a running turn's progress is copied to the shared cache while text
# streams (every other event is copied at once): a page served by another process reads it.
PROGRESS_SHARE_SECONDS = 0.25
PROGRESS_TIMEOUT_SECONDS = 3600


def _progress_key(session_id: object) -> str:
    return f"turn-progress:{session_id}"


@dataclass
class TurnProgress:
    """A running turn's events so far, for a page opened while it runs (a reload, a switch
    back): the events in order, consecutive text deltas as one, and `seq`, the number of the
    last event (the socket's live events carry theirs, so the page skips what it has).

    Kept per event at O(1): streamed text is gathered in a list and joined when read. The
    sink adds each event in its own frame (`EventSink.emit`: a method here was a Python call
    an event on the loop, issue 15).
    """

    turn: int | None = None
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    shared_at: float = 0.0

    def text_flush(self) -> None:
        self.events.append({"event": "text_delta", "data": {"delta": "".join(self.text)}})
        self.text = []

    def snapshot(self) -> dict[str, Any]:
        text = [{"event": "text_delta", "data": {"delta": "".join(self.text)}}] if self.text else []
        return {"running": True, "turn": self.turn, "seq": self.seq, "events": self.events + text}


# session id → the progress of its turn running in this process
_progress: dict[str, TurnProgress] = {}


def turn_progress(*, session_id: object) -> dict[str, Any]:
    """The session's running turn so far (`TurnProgress.snapshot`), from this process when it
    runs here, else from the shared cache; `{"running": false}` when no turn runs."""
    progress = _progress.get(str(session_id))
    if progress is not None:
        return progress.snapshot()
    return cache.get(_progress_key(session_id)) or {"running": False}


def _cache_shared() -> bool:
    """Whether the cache reaches other processes (Redis); each process's memory otherwise,
    where this process's own record is all there is."""
    return "redis" in settings.CACHES["default"]["BACKEND"].lower()


async def _progress_share(key: str, event: TurnEvent, progress: TurnProgress) -> None:
    """Copy the session's progress to the shared cache, for pages served by other processes."""
    try:
        if event.event == "turn_end":
            await cache.adelete(_progress_key(key))
        elif (
            event.event != "text_delta"
            or time.monotonic() - progress.shared_at >= PROGRESS_SHARE_SECONDS
        ):
            progress.shared_at = time.monotonic()
            await cache.aset(_progress_key(key), progress.snapshot(), PROGRESS_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        raise
    except Exception:  # the shared copy is a convenience; the turn goes on
        logger.exception("could not share a turn's progress")


def session_group(session_id: object) -> str:
    """The channel-layer group of a session's bound sockets."""
    return f"chat.session.{str(session_id).replace('-', '')}"


# Sockets of this process, per session group: channel name → (their loop, their relay).
_local: dict[str, dict[str, tuple[asyncio.AbstractEventLoop, Relay]]] = {}


def session_socket_attach(session_id: object, channel_name: str, relay: Relay) -> None:
    """A socket of this process bound to the session: its turns' events are handed to it
    directly, in order with its client-tool invokes (which also skip the channel layer)."""
    _local.setdefault(session_group(session_id), {})[channel_name] = (
        asyncio.get_running_loop(),
        relay,
    )


def session_socket_detach(session_id: object, channel_name: str) -> None:
    group = session_group(session_id)
    sockets = _local.get(group, {})
    sockets.pop(channel_name, None)
    if not sockets:
        _local.pop(group, None)


class EventFeed:
    """A turn's events for one SSE stream, in the order emitted: `put` is the turn's listener,
    `taken_now` and `taken` hand the stream what was put since it last took.

    The stream read an `asyncio.Queue` within an `asyncio.timeout` (its keep-alive) for every
    event: the queue's put, get and wake-up and the timeout's context and timer, ~28 Python
    calls an event on the loop. Here a list, one waiter, and one keep-alive timer for the whole
    stream: when it fires, it wakes the waiting reader only if nothing was taken for `idle`
    seconds, and is set again for when that would be. `close` stops it (the stream's end)."""

    def __init__(self, *, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: list[TurnEvent] = []
        self._waiter: asyncio.Future[None] | None = None
        self._idle = idle
        self._taken_at = time.monotonic()  # `loop.time()`'s clock (uvloop's to the millisecond)
        self._timer = self._loop.call_at(self._taken_at + idle, self._keepalive_due)

    def put(self, event: TurnEvent) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def taken_now(self) -> list[TurnEvent]:
        """The events put since the last take, none waited for."""
        events, self._events = self._events, []
        self._taken_at = time.monotonic()
        return events

    async def taken(self) -> list[TurnEvent]:
        """The events put since the last take, waiting for one if there are none; none when
        `idle` seconds pass without any (a keep-alive is due)."""
        if not self._events:
            self._waiter = asyncio.Future(loop=self._loop)
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.taken_now()

    def _keepalive_due(self) -> None:
        due = self._taken_at + self._idle
        now = time.monotonic()
        if now >= due:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            due = now + self._idle
        self._timer = self._loop.call_at(due, self._keepalive_due)

    def close(self) -> None:
        self._timer.cancel()


@dataclass
class EventSink:
    """Where one turn's events go: local listeners first, then the session's sockets.

    A listener that fails or went away is dropped; it never stops the turn. What the sink
    needs of its session (its key and group, whether progress is shared, the channel layer
    and whether it is this process's own) is found once per turn, and the loop it emits on at
    its first event with a socket here (`get_running_loop` is a `getpid` system call on
    CPython 3.11): ~6 events a turn, each on the event loop (issue 15). `emit` does its work in
    its own frame (the progress, the frame to each socket of this process, whether the layer has more to reach): each helper
    it called was a Python call an event.
    """

    session_id: object
    listeners: list[Callable[[TurnEvent], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._key = str(self.session_id)
        self._group = session_group(self._key)
        self._shared = _cache_shared()
        self._layer = get_channel_layer()
        self._in_memory = isinstance(self._layer, InMemoryChannelLayer)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def emit(self, event: TurnEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the turn
                logger.exception("turn event listener failed; dropping it")
                self.listeners.remove(listener)
        # The session's progress in this process (dropped at `turn_end`): the events in order,
        # streamed text gathered in a list and joined when read (`TurnProgress`).
        key, name = self._key, event.event
        progress = _progress.get(key)
        if progress is None:
            progress = _progress[key] = TurnProgress()
        progress.seq = seq = progress.seq + 1
        if name == "text_delta":
            progress.text.append(event.data["delta"])
        else:
            if name == "turn_start":
                progress.turn = event.data["turn"]
            elif name == "turn_end":
                del _progress[key]
            if progress.text:
                progress.text_flush()
            progress.events.append({"event": name, "data": event.data})
        if self._shared:
            await _progress_share(key, event, progress)
        # The session's sockets on this loop, handed the frame directly, encoded once for all.
        delivered: list[str] = []
        sockets = _local.get(self._group)
        if sockets:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            text = wire.event_frame_text(event, seq=seq)
            for channel_name, (socket_loop, relay) in list(sockets.items()):
                if socket_loop is not loop:
                    continue
                try:
                    await relay(text)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a socket closing meanwhile: the layer may still reach it
                    continue
                delivered.append(channel_name)
        layer = self._layer
        if layer is None:
            return
        # The in-memory layer's members are all of this process (each was handed the event,
        # unless it is on another event loop); its `group_send` would also sweep every channel
        # and group of the process for expired entries, per event. Any other layer may reach
        # other processes.
        if not self._in_memory or layer.groups.get(self._group, {}).keys() - delivered:
            await _group_send(layer, self._group, event, delivered, seq=seq)


async def _group_send(
    layer: Any, group: str, event: TurnEvent, delivered: list[str], *, seq: int
) -> None:
    try:
        await layer.group_send(group, turn_event_message(event, delivered=delivered, seq=seq))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the socket side is best effort; the database is the record
        # Logged once per outage; the sockets are told to read the stored transcript.
        outage.layer_failed(exc)
