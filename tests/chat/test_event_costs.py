"""What one turn event costs the event loop (issue 15: a process is bound by its loop's CPU and
a turn emits ~6 events): handed to the turn's SSE stream and to a socket of the session bound
in this process, counted in Python calls, so that a change that adds work per event shows."""

import json

import pytest

from chat.events import EventSink
from geosense import wire
from tests.chat.costs import python_calls
from tests.chat.test_consumer_turns import tab

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_an_event_costs_the_loop_few_python_calls_for_its_stream_and_socket(caller):
    """An event is encoded once for the SSE stream and the socket frame (they hold the same
    JSON), and what a turn's sink knows of its session (its group, whether progress is shared)
    is found once per turn, not per event."""
    ws = await tab(caller)
    streamed: list[wire.TurnEvent] = []
    sink = EventSink(session_id=caller.session.pk, listeners=[streamed.append])
    await sink.emit(wire.turn_start(session=caller.session.pk, turn=1))

    async def one() -> None:
        await sink.emit(wire.text_delta("There are twelve trees."))
        wire.sse_frame(streamed[-1])

    calls = min([await python_calls(one(), builtins=True) for _ in range(5)])
    await sink.emit(wire.turn_end())
    frames = [await ws.receive_json_from() for _ in range(7)]
    await ws.disconnect()

    assert [f["event"] for f in frames] == ["turn_start", *["text_delta"] * 5, "turn_end"]
    assert [f["data"] for f in frames[1:6]] == [{"delta": "There are twelve trees."}] * 5
    head, data = wire.sse_frame(streamed[1]).removesuffix("\n\n").split("\n")
    assert (head, json.loads(data.removeprefix("data: "))) == (
        "event: text_delta",
        {"delta": "There are twelve trees."},
    )
    # 63 before: the data encoded twice by `json.dumps` (~6 Python calls each), the session's
    # id written out and its group and the layer found for every event; 41 now, 10 of them the
    # test socket's queue (Daphne's send, in the server).
    assert calls <= 44, calls
