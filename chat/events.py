"""Where a turn's events go: its local listeners, then the session's sockets.

The engine persists first, then emits (docs/architecture.md, "Engine invariants", 5). The
events and their data are defined in `geosense.wire`; emitting goes to the turn's local
listeners (an SSE response following the turn) and to the session's channel-layer group,
where every socket bound to the session relays it.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from channels.layers import get_channel_layer

from geosense.wire import TurnEvent, TurnEventMessage, turn_event_message

from . import outage

logger = logging.getLogger(__name__)

Relay = Callable[[TurnEventMessage], Awaitable[None]]


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


@dataclass
class EventSink:
    """Where one turn's events go: local listeners first, then the session's sockets.

    A listener that fails or went away is dropped; it never stops the turn.
    """

    session_id: object
    listeners: list[Callable[[TurnEvent], None]] = field(default_factory=list)

    async def emit(self, event: TurnEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the turn
                logger.exception("turn event listener failed; dropping it")
                self.listeners.remove(listener)
        delivered = await _local_send(self.session_id, event)
        await _group_send(self.session_id, event, delivered)


async def _local_send(session_id: object, event: TurnEvent) -> list[str]:
    loop = asyncio.get_running_loop()
    sockets = _local.get(session_group(session_id), {})
    delivered = []
    for channel_name, (socket_loop, relay) in list(sockets.items()):
        if socket_loop is not loop:
            continue
        try:
            await relay(turn_event_message(event))
        except asyncio.CancelledError:
            raise
        except Exception:  # a socket closing meanwhile: the channel layer may still reach it
            continue
        delivered.append(channel_name)
    return delivered


async def _group_send(session_id: object, event: TurnEvent, delivered: list[str]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(
            session_group(session_id), turn_event_message(event, delivered=delivered)
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the socket side is best effort; the database is the record
        # Logged once per outage; the sockets are told to read the stored transcript.
        outage.layer_failed(exc)
