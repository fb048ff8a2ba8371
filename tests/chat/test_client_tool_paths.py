"""The path of a client-tool call (issue 15, items 5 and 8): a socket nobody holds any more is
never waited for, a socket of the turn's own process is reached without the channel layer or
a thread hop, and the database is visited once per served call."""

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from channels.layers import get_channel_layer
from django.utils import timezone

from chat import events, processes, selectors, services, turns
from chat.models import ClientToolRegistration, Message, ServerProcess
from tests.chat.test_consumer_turns import (
    frames_until,
    invoke_answer,
    is_invoke,
    is_turn_end,
    last_tool_result,
    start_turn,
    tab,
)
from tests.client_tools import LOCATION
from tools import schemas
from tools.client import UNREACHABLE, WENT_AWAY

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def registered_elsewhere(caller, *, process: uuid.UUID) -> None:
    await ClientToolRegistration.objects.acreate(
        channel_name=f"specific.gone!{uuid.uuid4().hex}",
        session=caller.session,
        tools=[LOCATION],
        process=process,
    )


async def test_a_socket_of_this_process_that_is_gone_fails_its_call_at_once(
    client, trusted_caller, openai_agent, settings
):
    # Long enough that a call waiting for its time-out shows in the result, not the clock.
    settings.GEOSENSE_CLIENT_TOOL_TIMEOUT = 3
    await registered_elsewhere(trusted_caller, process=processes.PROCESS_ID)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Your tab is gone.")
    out = await start_turn(client, trusted_caller, "where am I?")
    assert out.names()[-1] == "turn_end"
    assert WENT_AWAY in last_tool_result(openai_agent, 1)


async def test_the_socket_of_a_dead_process_is_nobodys(
    client, trusted_caller, openai_agent, settings, monkeypatch
):
    monkeypatch.setattr(processes, "_started", True)
    settings.GEOSENSE_PROCESS_HEARTBEAT = 1.0
    settings.GEOSENSE_CLIENT_TOOL_TIMEOUT = 3
    dead = await ServerProcess.objects.acreate(
        id=uuid.uuid4(), host="elsewhere", pid=1, heartbeat=timezone.now() - timedelta(seconds=30)
    )
    await registered_elsewhere(trusted_caller, process=dead.pk)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("No location.")
    out = await start_turn(client, trusted_caller, "where am I?")
    assert out.names()[-1] == "turn_end"
    assert "location_get" not in {
        t["function"]["name"] for t in openai_agent.requests[0].get("tools", [])
    }
    assert "There is no tool named 'location_get'" in last_tool_result(openai_agent, 1)


async def test_a_served_call_in_one_process_crosses_no_channel_layer_and_no_thread_hop(
    client, trusted_caller, openai_agent, monkeypatch
):
    layer = get_channel_layer()
    sent, hops = [], []
    real_send = layer.send

    async def counted_send(channel, message):
        sent.append(message["type"])
        await real_send(channel, message)

    async def counted_hop():
        hops.append(1)

    monkeypatch.setattr(layer, "send", counted_send)
    monkeypatch.setattr("channels.consumer.aclose_old_connections", counted_hop)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("You are near the park.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    frames = await frames_until(ws, is_invoke)
    assert [f.get("event") for f in frames] == ["turn_start", "client_tool_call", None]
    await ws.send_json_to(
        {
            "type": "client-tool-result",
            "correlationId": frames[-1]["correlationId"],
            "result": {"status": "GRANTED"},
        }
    )
    out = await turn
    assert json.loads(last_tool_result(openai_agent, 1)) == {"status": "GRANTED"}
    assert out.names()[-1] == "turn_end"
    await frames_until(ws, is_turn_end)
    await ws.disconnect()
    assert not [t for t in sent if t.startswith("client.tool")]
    assert hops == []


async def test_a_served_calls_small_values_are_checked_on_the_loop_and_its_answer_measured_once(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The model's small arguments and the page's small answer are checked on the event loop
    (a hop to the schema threads costs more than such a check), and the answer is not walked
    for its bounds at all: its frame's text is too short to hold a value past them, and the
    engine checks only its schema."""
    answer = {"status": "GRANTED", "bench": "measured once"}
    offloaded, measured = [], []
    real_offload, real_depth = schemas.checked_off_loop, schemas.json_depth_exceeds

    async def counted_offload(fn, *args, **kwargs):
        offloaded.append(fn.__name__)
        return await real_offload(fn, *args, **kwargs)

    def counted_depth(value, limit):
        if value == answer:
            measured.append(limit)
        return real_depth(value, limit)

    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("You are near the park.")
    ws = await tab(trusted_caller, [LOCATION])
    monkeypatch.setattr(schemas, "checked_off_loop", counted_offload)
    monkeypatch.setattr(schemas, "json_depth_exceeds", counted_depth)
    turn = start_turn(client, trusted_caller, "where am I?")
    await invoke_answer(ws, answer)
    out = await turn
    await ws.disconnect()
    assert out.names()[-1] == "turn_end"
    assert json.loads(last_tool_result(openai_agent, 1)) == answer
    assert offloaded == []
    assert measured == []


@pytest.mark.parametrize("stale", [False, True])
async def test_the_answers_of_a_new_turn_are_counted_in_memory_and_the_lease_renewed_when_old(
    client, trusted_caller, openai_agent, monkeypatch, stale
):
    counted, renewed = [], []
    real_count, real_renew = selectors.tool_answers_in_turn, services.session_lease_renew
    monkeypatch.setattr(
        selectors,
        "tool_answers_in_turn",
        lambda **kw: counted.append(1) or real_count(**kw),
    )
    monkeypatch.setattr(
        services,
        "session_lease_renew",
        lambda **kw: renewed.append(1) or real_renew(**kw),
    )
    if stale:
        monkeypatch.setattr(turns, "STEP_RENEW_SECONDS", -1.0)
    openai_agent.reply_tool_calls([("c1", "location_get", {}), ("c2", "location_get", {})])
    openai_agent.reply_text("Twice.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    for _ in range(2):
        await invoke_answer(ws, {"status": "GRANTED"})
    out = await turn
    assert out.names()[-1] == "turn_end"
    await ws.disconnect()
    assert counted == []  # a new message's turn has no earlier answers: not even read
    # The claim was taken or renewed a moment ago (the keeper renews it every quarter lease,
    # turns.STEP_RENEW_SECONDS): neither the steps nor the results renew it (each result did:
    # 2 statements a turn). Older: the first step, the first result and the second step (whose
    # trip stores the second result) renew it.
    assert len(renewed) == (3 if stale else 0)


async def test_a_new_turn_still_refuses_a_client_tool_past_its_answers_per_turn(
    client, trusted_caller, openai_agent
):
    """Counted in memory from zero (nothing read), the bound of answers per turn still holds."""
    limit = turns.CLIENT_TOOL_ANSWER_LIMIT
    calls = [(f"c{i}", "location_get", {}) for i in range(limit + 1)]
    openai_agent.reply_tool_calls(calls)
    openai_agent.reply_text("Enough.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I, again and again?")
    for _ in range(limit):
        await invoke_answer(ws, {"status": "GRANTED"})
    out = await turn
    await ws.disconnect()
    assert out.names()[-1] == "turn_end"
    results = [m for m in openai_agent.requests[1]["messages"] if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in results[:limit]] == [{"status": "GRANTED"}] * limit
    assert f"already answered {limit} times in this turn" in results[limit]["content"]


async def test_a_call_to_a_socket_whose_process_dies_meanwhile_is_answered_without_waiting_out(
    client, trusted_caller, openai_agent, settings, monkeypatch
):
    """The process was alive when the step began; it stops heartbeating while its socket's
    answer is awaited: the call ends with "could not be reached", not at the time-out."""
    monkeypatch.setattr(processes, "_started", True)
    settings.GEOSENSE_PROCESS_HEARTBEAT = 1.0
    settings.GEOSENSE_CLIENT_TOOL_TIMEOUT = 20
    other = await ServerProcess.objects.acreate(
        id=uuid.uuid4(), host="elsewhere", pid=1, heartbeat=timezone.now()
    )
    await registered_elsewhere(trusted_caller, process=other.pk)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Your tab's server is gone.")

    async def dies_once_invoked() -> None:
        for _ in range(400):  # until the model's call is stored (then it is being invoked)
            if await Message.objects.filter(role="assistant").exclude(tool_calls=[]).aexists():
                break
            await asyncio.sleep(0.05)
        await ServerProcess.objects.filter(pk=other.pk).aupdate(
            heartbeat=timezone.now() - timedelta(seconds=30)
        )

    dying = asyncio.create_task(dies_once_invoked())
    out = await start_turn(client, trusted_caller, "where am I?")
    await dying
    assert out.names()[-1] == "turn_end"
    assert UNREACHABLE in last_tool_result(openai_agent, 1)


def trips_named(monkeypatch) -> list[str]:
    """The names of the functions the turn engine sends to its database thread, in order."""
    names: list[str] = []
    real = turns.in_thread

    def recorded(function):
        names.append(function.__name__)
        return real(function)

    monkeypatch.setattr(turns, "in_thread", recorded)
    return names


async def test_a_new_message_is_refused_until_the_turn_has_ended(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The claim is the turn's until its `turn_end`: released with the answer's store, a new
    message prepared while the answer's events went out was taken (turn 2) while the first
    turn's stream was still open, its progress and `turn_end` mixed with the new turn's, and a
    Stop then wrote its note after a complete answer with the session no longer the turn's."""
    openai_agent.reply_text("Complete answer.")
    seen: list[str] = []
    real_emit = events.EventSink.emit

    async def emit(sink, event):
        await real_emit(sink, event)
        if event.event == "message":
            try:
                await turns.turn_prepare(
                    session_id=trusted_caller.session.pk,
                    user=trusted_caller.user,
                    request=turns.NewMessage("again"),
                )
            except services.SessionBusy:
                seen.append("busy")
            else:
                seen.append("taken")

    monkeypatch.setattr(events.EventSink, "emit", emit)
    out = await start_turn(client, trusted_caller, "hello")
    assert out.names()[-1] == "turn_end"
    assert seen == ["busy"]


async def test_a_served_calls_result_is_stored_by_the_trip_of_the_next_steps_reads(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A served call's round trip waits for the engine's database thread once: its result is
    stored by the trip that reads the next step's inputs, not by one of its own (under load
    each trip waits behind every other turn's, issue 15: two waits were ~480 ms of the round
    trip at 200 users)."""
    trips = trips_named(monkeypatch)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("You are near the park.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    invoke = (await frames_until(ws, is_invoke))[-1]
    before_answer = len(trips)
    await ws.send_json_to(
        {
            "type": "client-tool-result",
            "correlationId": invoke["correlationId"],
            "result": {"status": "GRANTED"},
        }
    )
    out = await turn
    await ws.disconnect()
    assert out.names()[-1] == "turn_end"
    # It was tool_result_store, _step_inputs, _step_store, _repair_and_release.
    assert trips[before_answer:] == ["_step_inputs", "_step_store", "_repair_and_release"]
    assert json.loads(last_tool_result(openai_agent, 1)) == {"status": "GRANTED"}
    session = await type(trusted_caller.session).objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == "idle"


async def test_a_result_left_for_the_next_step_is_stored_before_a_failure_is_noted(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The next step fails before its trip: the result the socket gave is still stored (not a
    repair's), before the note that tells of the failure (engine invariant 1)."""
    real = turns.TurnRunner._step_inputs

    def second_fails(runner):
        if runner.deferred is not None:
            raise RuntimeError("the second step broke")
        return real(runner)

    monkeypatch.setattr(turns.TurnRunner, "_step_inputs", second_fails)
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    await invoke_answer(ws, {"status": "GRANTED"})
    out = await turn
    await ws.disconnect()
    assert out.names()[-2:] == ["error", "turn_end"]
    stored = [
        (m.role, m.content)
        async for m in Message.objects.filter(session=trusted_caller.session, turn=1).order_by("id")
    ]
    assert [role for role, _ in stored] == ["user", "assistant", "tool", "note"]
    assert json.loads(stored[2][1]) == {"status": "GRANTED"}
    assert stored[3][1] == turns.FAILED_NOTE
    session = await type(trusted_caller.session).objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == "idle"
