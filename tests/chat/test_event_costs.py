"""What one turn event costs the event loop (issue 15: a process is bound by its loop's CPU and
a turn emits ~6 events): handed to the turn's SSE stream and to a socket of the session bound
in this process, counted in Python calls, so that a change that adds work per event shows."""

import asyncio
import json

import pytest

from chat import services
from chat.events import EventSink
from geosense import wire
from tests.chat.costs import python_calls
from tests.chat.helpers import scripted_stream
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
    # id written out and its group and the layer found for every event; 41, then 37 now (the
    # sink's helpers in its own frame), 10 of them the test socket's queue (Daphne's send, in
    # the server).
    assert calls <= 40, calls


async def test_an_events_way_to_its_stream_and_socket_is_few_python_frames(caller):
    """`emit` keeps the progress, hands each socket of this process its frame and asks the
    in-memory layer whether anyone is left, in its own frame; the SSE frame reads the data's
    JSON the socket's frame encoded, without a call. A delta: 19 Python calls before
    (`_progress_add`, `_local_send`, `_layer_reaches_more`, `_flush_text` with no text to flush
    and the second read of `data_json` were a call each, the first read two), then 15, 14 now
    (the progress kept in `emit`'s frame, not in `TurnProgress.add`), 7 of them the test
    socket's queue (Daphne's send, in the server) and one this test's own."""
    ws = await tab(caller)
    streamed: list[wire.TurnEvent] = []
    sink = EventSink(session_id=caller.session.pk, listeners=[streamed.append])
    await sink.emit(wire.turn_start(session=caller.session.pk, turn=1))

    async def one(event: wire.TurnEvent) -> None:
        await sink.emit(event)
        wire.sse_frame(event)

    deltas = [wire.text_delta("There are twelve trees.") for _ in range(5)]
    ends = [wire.turn_end() for _ in range(5)]
    delta = min([await python_calls(one(event)) for event in deltas])
    end = min([await python_calls(one(event)) for event in ends[:1]])
    frames = [await ws.receive_json_from() for _ in range(7)]
    await ws.disconnect()

    assert [f["event"] for f in frames] == ["turn_start", *["text_delta"] * 5, "turn_end"]
    assert [f["seq"] for f in frames] == list(range(1, 8))
    assert (delta, end) == (14, 15)  # the end flushes the text streamed before it


async def _streamed(
    client, caller, monkeypatch, *, deltas: int, pause: float = 0.0, end: bool = True
) -> list[str]:
    """The chunks of a streamed turn whose engine emits `deltas` text deltas, one a loop round
    (or `pause` seconds) apart, then `turn_end` (unless not `end`)."""

    def launch(prepared, *, listener):
        async def turn():
            listener(wire.turn_start(session=caller.session.pk, turn=1))
            for i in range(deltas):
                await asyncio.sleep(pause)
                listener(wire.text_delta(f"{i} "))
            await asyncio.sleep(pause)
            if end:
                listener(wire.turn_end())

        return asyncio.create_task(turn())

    try:
        return [chunk async for chunk in scripted_stream(client, caller, monkeypatch, launch)]
    finally:
        await asyncio.to_thread(services.session_release, session_id=caller.session.pk)


async def test_a_streamed_event_costs_the_loop_few_python_calls(
    client, trusted_caller, monkeypatch
):
    """The stream read an `asyncio.Queue` within an `asyncio.timeout` (its keep-alive) for
    every event: ~28 Python calls an event for the queue's put, get and wake-up and the
    timeout's context and timer; now a list, one waiter, one keep-alive timer a stream."""

    async def calls(deltas: int) -> int:
        counted = 0

        async def stream() -> None:
            nonlocal counted
            counted = await python_calls(
                _streamed(client, trusted_caller, monkeypatch, deltas=deltas)
            )

        await stream()
        return counted

    few, many = min([await calls(2) for _ in range(3)]), min([await calls(22) for _ in range(3)])
    per_event = (many - few) / 20

    # ~82 before (the queue and the timeout), ~49 now: the turn's own step, the event's way
    # through its sink, its frame, and the chunk through Django's test client.
    assert per_event <= 55, per_event


async def test_a_stream_sends_a_keep_alive_while_no_event_comes(
    client, trusted_caller, monkeypatch
):
    import chat.api

    monkeypatch.setattr(chat.api, "KEEPALIVE_SECONDS", 0.05)
    chunks = await _streamed(client, trusted_caller, monkeypatch, deltas=1, pause=0.17)

    assert chunks[0].startswith(": ok\n\nevent: turn_start\n")
    assert ": keep-alive\n\n" in chunks
    assert [c for c in chunks if c != ": keep-alive\n\n"][1:] == [
        'event: text_delta\ndata: {"delta": "0 "}\n\n',
        "event: turn_end\ndata: {}\n\n",
    ]


async def test_a_stream_whose_turn_ended_without_its_end_event_ends_at_its_keep_alive(
    client, trusted_caller, monkeypatch
):
    import chat.api

    monkeypatch.setattr(chat.api, "KEEPALIVE_SECONDS", 0.05)
    chunks = await _streamed(client, trusted_caller, monkeypatch, deltas=0, end=False)

    assert len(chunks) == 1 and chunks[0].startswith(": ok\n\nevent: turn_start\n")


@pytest.mark.parametrize("left", ["while waiting", "at a chunk"])
async def test_a_stream_its_client_left_leaves_no_keep_alive_timer(monkeypatch, left):
    """Django cancels the stream's iterator when the client goes away (while it waits for an
    event) or closes it (at a chunk): its feed's keep-alive timer goes with it, not left on
    the loop for every stream ever cut. Watched by the timer's firings, so on any event loop
    (asyncio's keeps its timers in `_scheduled`, uvloop's in C)."""
    import chat.api
    from chat.events import EventFeed

    fired = []
    keepalive_due = EventFeed._keepalive_due

    def counted(feed):
        fired.append(feed)
        keepalive_due(feed)

    def launch(prepared, *, listener):
        async def turn():
            listener(wire.turn_start(session="s", turn=1))
            await asyncio.sleep(0.6)
            listener(wire.turn_end())

        return asyncio.create_task(turn())

    monkeypatch.setattr(EventFeed, "_keepalive_due", counted)
    monkeypatch.setattr(chat.api, "KEEPALIVE_SECONDS", 0.2)
    monkeypatch.setattr(chat.api, "turn_launch", launch)
    stream = chat.api._follow(None)
    assert (await stream.__anext__()).startswith(b": ok")
    if left == "while waiting":
        waiting = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    else:
        await stream.aclose()
    await asyncio.sleep(0.5)  # the timer, left on the loop, would have fired twice by now
    assert fired == []


async def test_a_served_call_turn_looks_its_loop_up_once_for_its_events_and_once_a_way_for_its_call(
    client, trusted_caller, openai_agent
):
    """`asyncio.get_running_loop` is a `getpid` system call on CPython 3.11. A turn's sink looked
    its loop up at every event with a socket of this process (6 a served-call turn), and a call
    twice on its way out: once each now, and once for its answer's way back."""
    import sys

    from tests.chat.test_consumer_turns import frames_until, is_invoke, is_turn_end, start_turn
    from tests.client_tools import LOCATION

    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("You are near the park.")
    ws = await tab(trusted_caller, [LOCATION])
    looked_up: list[str] = []

    def counted(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") == "get_running_loop":
            name = frame.f_code.co_filename
            if name.endswith(("chat/events.py", "tools/client.py")):
                looked_up.append(frame.f_code.co_name)

    sys.setprofile(counted)
    try:
        turn = start_turn(client, trusted_caller, "where am I?")
        frames = await frames_until(ws, is_invoke)
        await ws.send_json_to(
            {
                "type": "client-tool-result",
                "correlationId": frames[-1]["correlationId"],
                "result": {"status": "GRANTED"},
            }
        )
        out = await turn
        await frames_until(ws, is_turn_end)
    finally:
        sys.setprofile(None)
    await ws.disconnect()

    assert out.names()[-1] == "turn_end"
    # Besides: the stream's feed (`EventFeed.__init__`, once a stream) and this loop's reply
    # channel, built by its first call (`_replies`; a test's loop is new).
    assert sorted(looked_up) == [
        "__init__",
        "_replies",
        "client_tool_answer_send",
        "client_tool_request",
        "emit",
    ], looked_up
