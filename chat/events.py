"""Turn events: one vocabulary for the HTTP stream and the session socket.

The engine persists first, then emits (ENGINE.md invariant 5). Emitting goes to the
turn's local listeners (an SSE response following the turn) and to the session's
channel-layer group, where every socket bound to the session relays it.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

EventName = Literal[
    "turn_start",
    "text_delta",
    "backend_thinking",
    "backend_tool_call",
    "client_tool_call",
    "message",
    "error",
    "turn_end",
]


@dataclass(frozen=True)
class TurnEvent:
    event: EventName
    data: dict[str, Any]


def session_group(session_id: object) -> str:
    """The channel-layer group of a session's bound sockets."""
    return f"chat.session.{str(session_id).replace('-', '')}"


# The group message type the consumer handles (`turn_event`).
GROUP_TURN_EVENT = "turn.event"


@dataclass
class EventSink:
    """Where one turn's events go: local listeners first, then the session's sockets.

    A listener that fails or went away is dropped; it never stops the turn.
    """

    session_id: object
    listeners: list[Callable[[TurnEvent], None]] = field(default_factory=list)
    broadcast: bool = True

    async def emit(self, event: EventName, data: dict[str, Any]) -> None:
        item = TurnEvent(event, data)
        for listener in list(self.listeners):
            try:
                listener(item)
            except Exception:  # a broken listener must not break the turn
                logger.exception("turn event listener failed; dropping it")
                self.listeners.remove(listener)
        if self.broadcast:
            await _group_send(self.session_id, item)


async def _group_send(session_id: object, item: TurnEvent) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(
            session_group(session_id),
            {"type": GROUP_TURN_EVENT, "event": item.event, "data": item.data},
        )
    except asyncio.CancelledError:
        raise
    except Exception:  # the socket side is best effort; the database is the record
        logger.exception("could not relay a turn event to the session's sockets")
