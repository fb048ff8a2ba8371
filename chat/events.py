"""Where a turn's events go: its local listeners, then the session's sockets.

The engine persists first, then emits (docs/architecture.md, "Engine invariants", 5). The
events and their data are defined in `geosense.wire`; emitting goes to the turn's local
listeners (an SSE response following the turn) and to the session's channel-layer group,
where every socket bound to the session relays it.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from channels.layers import get_channel_layer

from geosense.wire import TurnEvent, turn_event_message

logger = logging.getLogger(__name__)


def session_group(session_id: object) -> str:
    """The channel-layer group of a session's bound sockets."""
    return f"chat.session.{str(session_id).replace('-', '')}"


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
        await _group_send(self.session_id, event)


async def _group_send(session_id: object, event: TurnEvent) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(session_group(session_id), turn_event_message(event))
    except asyncio.CancelledError:
        raise
    except Exception:  # the socket side is best effort; the database is the record
        logger.exception("could not relay a turn event to the session's sockets")
