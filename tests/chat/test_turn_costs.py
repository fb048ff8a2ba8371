"""What one turn costs the process's database thread (issue 15, throughput): the engine's trips
to the pool and the SQL statements it runs, counted for a turn with one served client-tool call
and a text-only turn, so that a change that adds trips or statements per turn shows here; and
what an event costs when every socket it goes to is served directly."""

import asyncio
import json

import pytest
from channels.layers import get_channel_layer

from chat import history
from chat.events import session_group
from tests.chat.costs import Costs
from tests.chat.test_consumer_turns import (
    frames_until,
    invoke_answer,
    is_turn_end,
    start_turn,
    tab,
)
from tests.client_tools import LOCATION
from tools import client as client_tools
from tools import registry

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_a_turn_with_one_served_client_call_costs_few_pool_trips_and_statements(
    client, trusted_caller, openai_agent, monkeypatch
):
    # The process's first turns build what later ones share (the second is the first to
    # check the rows the window kept, chat/history.py).
    for _ in range(2):
        openai_agent.reply_text("Warm.")
        assert (await start_turn(client, trusted_caller, "hello")).names()[-1] == "turn_end"
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Here.")
    ws = await tab(trusted_caller, [LOCATION])
    costs = Costs(monkeypatch)
    turn = start_turn(client, trusted_caller, "where am I?")
    await invoke_answer(ws, {"status": "GRANTED"})
    out = await turn
    trips = costs.trips  # the socket's closing is a trip of its own (test_socket_costs.py)
    await ws.disconnect()
    assert out.names()[-1] == "turn_end"
    # The claim and the user's message; each of the two steps' reads, then its message; the
    # call's result; the end (the release). It was 22 trips, one per ORM call, and 56
    # statements (the request's own and the socket's closing included) at e5351e0, 47 at
    # 2efd665 (the new message's preparation in one transaction reading the session once,
    # the overview's revision read once, the usage row inserted with its counts, the fresh
    # call ids without the turn count, no write transaction to find no pause: 36; each
    # step's usage one upsert instead of a transaction, a locked read and a write: 32; the
    # window kept between steps, a step reading its new rows after a check of the kept ones,
    # and no lease renewal by a step whose claim was just taken or renewed: 31; the call's
    # result stored without a transaction around its one insert, and the lease renewed with
    # it only when old: 29; the open pauses read with the session's count and title: 27; a
    # step's new rows' contexts read only when the check shows some: 26; the free tokens of
    # the step with the call recorded with the next step's: 25; the repair's two reads in
    # one: 24; the fresh call ids' two in one: 23; the rows the turn stored kept for the
    # window, not read again by the next step: 21, 19 with the claim's facts read apart again;
    # each step's annotations' revision read with its client tools: 17; the repair's read
    # joined to the session's facts' read: 16; the claim numbering the turn, the facts read
    # before it: 15).
    # 7 trips until the call's result was stored by the next step's
    # trip (the claim is released by the end's trip, after the answer's events: a new message
    # is refused until `turn_end`); 6 until the first step's reads were made in the new
    # message's preparation.
    assert trips <= 5, trips
    # 17 with the socket's closing (its registration deleted), 18 before the claim numbered
    # the turn.
    assert len(costs.statements) <= 17, costs.statements
    # The window, contexts, client tools, revision, pause and repair reads, the claim, the
    # lease and the release are compiled once per process (geosense/compiled.py): 43 compiles
    # (selects, inserts, updates, deletes) at 2efd665, 19 before the usage upsert; 13 with the
    # fresh call ids' reads compiled once (their first compile may fall in this turn) and the
    # answer serialised reading no pause; 11 with the new message's session facts and
    # numbering compiled once; 7 with the messages' insert compiled once; 5 with the request's
    # bearer token (with its user) and session-owner reads compiled once.
    assert costs.compiled <= 5, costs.compiled


async def test_a_served_call_turn_starts_few_tasks(
    client, trusted_caller, openai_agent, monkeypatch
):
    """Every task a turn starts is a Python call or three on the loop to make (asyncio's task
    registry, its name), its steps, and a Python call more when it ends. The claim's keeper and
    the streamed text's draft were tasks sleeping to be cancelled at their end (nearly
    always); they are timers, whose work is a task only when it is due (the draft's is an hour
    away here: a slow machine does not make it due; review 30-b M2)."""
    from chat import turns

    monkeypatch.setattr(turns, "DRAFT_SECONDS", 3600.0)
    openai_agent.reply_text("Warm.")
    assert (await start_turn(client, trusted_caller, "hello")).names()[-1] == "turn_end"
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Here.")
    ws = await tab(trusted_caller, [LOCATION])
    loop = asyncio.get_running_loop()
    started = []

    def counted(loop, coro, **kwargs):
        started.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counted)
    try:
        turn = start_turn(client, trusted_caller, "where am I?")
        await invoke_answer(ws, {"status": "GRANTED"})
        out = await turn
    finally:
        loop.set_task_factory(None)
    await ws.disconnect()

    assert out.names()[-1] == "turn_end"
    # The test's own (its request, the test client's `sync_to_async`), the turn's, its end's
    # (shielded), the reply channel's pump (this loop's first client call), the model client's
    # body writer for each of its two requests: 7; 9 before.
    assert len(started) <= 7, started


async def test_a_text_turn_costs_few_pool_trips_and_statements(
    client, trusted_caller, openai_agent, monkeypatch
):
    openai_agent.reply_text("Warm.")
    assert (await start_turn(client, trusted_caller, "hello")).names()[-1] == "turn_end"
    openai_agent.reply_text("Hello.")
    costs = Costs(monkeypatch)
    out = await start_turn(client, trusted_caller, "hello")
    assert out.names()[-1] == "turn_end"
    # It was 12, then 4: the new message's preparation, the step's inputs and store, the end's;
    # 3 with the step's inputs read in the preparation's trip.
    assert costs.trips <= 3, costs.trips
    # 37 at e5351e0, 29 at 2efd665, 20 before the usage upsert, 18 before the open pauses were
    # read with the session's count and title, 16 before the step's new rows' contexts were
    # read only when the check shows some, 15 before the repair's two reads were one, 14
    # before the user's message was kept for the window as it was stored, 13 before the
    # repair's read of the latest turns' calls and results was the session's facts' read, 12
    # before the claim numbered the turn (the facts read before it, nothing to repair)
    assert len(costs.statements) <= 11, costs.statements
    # The hot reads, the claim, the lease and the release run SQL compiled once per process
    # (geosense/compiled.py): 28 compiles (selects, inserts, updates, deletes) at 2efd665, 10
    # before the usage upsert and the answer's serialisation reading no pause, 6 before the new
    # message's session facts and numbering were compiled once, 4 before the messages' insert,
    # 2 before the request's bearer token (with its user) and session-owner reads.
    assert costs.compiled == 0, costs.compiled


async def _served_call_turn(client, caller, openai_agent, ws) -> None:
    """A turn whose one client-tool call `ws` serves, to its `turn_end`; then the tab closes."""
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Here.")
    turn = start_turn(client, caller, "where am I?")
    await invoke_answer(ws, {"status": "GRANTED"})
    assert (await turn).names()[-1] == "turn_end"
    await ws.disconnect()


async def test_a_step_builds_no_tool_spec_and_writes_no_json_of_them(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The tools a step offers (backend tools and the socket's declared ones) and the length
    of their JSON, which the history's budget counts, are made once per set of tools: a step
    built every spec, decoded the socket's declarations into tools, and wrote every spec's
    JSON again (a tenth of the database thread's work per turn, issue 15)."""
    ws = await tab(trusted_caller, [LOCATION])
    for _ in range(2):  # the process's first turns make what later ones share
        openai_agent.reply_tool_calls([("c1", "location_get", {})])
        openai_agent.reply_text("Here.")
        turn = start_turn(client, trusted_caller, "where am I?")
        await invoke_answer(ws, {"status": "GRANTED"})
        assert (await turn).names()[-1] == "turn_end"
    made = {"specs": 0, "declared": 0, "json": 0}

    def counted(name, function):
        def call(*args, **kwargs):
            made[name] += 1
            return function(*args, **kwargs)

        return call

    class Json:
        def dumps(self, value, **kwargs):
            text = json.dumps(value, **kwargs)
            made["json"] += len(text)
            return text

    monkeypatch.setattr(
        registry, "openai_function_spec", counted("specs", registry.openai_function_spec)
    )
    monkeypatch.setattr(
        client_tools, "openai_function_spec", counted("specs", client_tools.openai_function_spec)
    )
    monkeypatch.setattr(
        client_tools.ClientTool,
        "from_declaration",
        classmethod(counted("declared", client_tools.ClientTool.from_declaration.__func__)),
    )
    monkeypatch.setattr(history, "json", Json())
    await _served_call_turn(client, trusted_caller, openai_agent, ws)
    # Two steps: 18 specs built, 2 declarations decoded, 9,000+ characters of JSON before.
    assert made["specs"] == 0, made
    assert made["declared"] == 0, made
    assert made["json"] < registry.backend_tool_specs().json_chars // 4, made


async def test_a_step_makes_no_overview_and_no_system_prompt_while_the_index_holds(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The dataset's overview (counts and shapes from the spatial index) and the system prompt
    made from it are the same while the index's revision is: each step made both (the counts,
    the overview's JSON and the guide joined into the prompt) on the database thread every
    turn queues on (issue 15)."""
    from chat import turns
    from geosense.annotations import selectors as annotation_selectors

    openai_agent.reply_text("Warm.")  # the process's first turn makes them
    assert (await start_turn(client, trusted_caller, "hello")).names()[-1] == "turn_end"
    made = {"prompts": 0, "overviews": 0}

    def counted(name, function):
        def call(*args, **kwargs):
            made[name] += 1
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(turns, "system_prompt", counted("prompts", turns.system_prompt))
    monkeypatch.setattr(
        annotation_selectors,
        "DatasetOverview",
        counted("overviews", annotation_selectors.DatasetOverview),
    )
    ws = await tab(trusted_caller, [LOCATION])
    await _served_call_turn(client, trusted_caller, openai_agent, ws)
    # Two steps: 2 prompts and 2 overviews before.
    assert made == {"prompts": 0, "overviews": 0}, made


async def test_events_for_sockets_all_served_directly_skip_the_in_memory_layer(
    client, trusted_caller, openai_agent, monkeypatch
):
    """Every socket of the in-memory layer is of this process and handed each event directly:
    its `group_send` (which also sweeps every channel and group of the process, per event) is
    left out, and the socket still sees the whole turn once. A member that was not handed the
    event (another event loop's socket) still gets it through the layer."""
    layer = get_channel_layer()
    sent: list[str] = []
    real = layer.group_send

    async def counted(group, message):
        sent.append(group)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", counted)
    openai_agent.reply_text("Hello.")
    ws = await tab(trusted_caller)
    out = await start_turn(client, trusted_caller, "hello")
    frames = await frames_until(ws, is_turn_end)
    assert out.names()[-1] == "turn_end"
    assert [f["event"] for f in frames if f["type"] == "event"] == out.names()
    assert sent == []
    await layer.group_add(session_group(trusted_caller.session.pk), "specific.elsewhere!1")
    openai_agent.reply_text("Again.")
    out = await start_turn(client, trusted_caller, "again")
    await frames_until(ws, is_turn_end)
    await ws.disconnect()
    assert len(sent) == len(out.names())


async def test_a_new_sessions_first_turn_costs_a_later_turns_statements_and_its_title(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A bench level starts with every user's first turn at once (issue 15): a new session's
    first turn reads its window as a later turn does (the check of its one message: 2
    statements before, the rows and their contexts), and its title's update, compiled once,
    is its one statement more."""
    from dataclasses import replace

    from chat.models import ChatSession

    for caller in (trusted_caller, None):  # the first compiles what a new session's turn runs
        if caller is None:
            session = await ChatSession.objects.acreate(user=trusted_caller.user)
            caller = replace(trusted_caller, session=session)
        openai_agent.reply_text("Hello.")
        costs = Costs(monkeypatch)
        out = await start_turn(client, caller, "hello")
        assert out.names()[-1] == "turn_end"
    assert costs.trips <= 3, costs.trips
    assert len(costs.statements) <= 13, costs.statements  # a later text turn's 12, the title
    assert costs.compiled == 0, costs.compiled
