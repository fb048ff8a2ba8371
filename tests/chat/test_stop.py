"""Stop (issue 15, item 7): `POST /api/sessions/<id>/stop` ends the session's turn at any
moment — mid-stream, while a served client tool is awaited, or paused on a reader's decision —
keeping what was streamed (cut off), answering every call, releasing the session and ending
with `turn_end`. Owner only; cookie callers need CSRF; JSON answers."""

import asyncio
import json
import threading

import pytest
from django.test import AsyncClient

from chat.models import ChatSession, Message, PendingDecision
from chat.turns import STOPPED_NOTE, turns_settle
from tests.chat.test_consumer_turns import frames_until, is_invoke, start_turn, tab
from tests.client_tools import LOCATION, PICK
from tests.fakes.fake_openai import Pause, Text

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def stop(client, caller, *, token: str | None = None) -> tuple[int, dict]:
    response = await client.post(
        caller.url("/stop"), headers={"Authorization": f"Bearer {token or caller.token}"}
    )
    return response.status_code, json.loads(response.content)


async def stored(caller) -> list[tuple[str, str, bool]]:
    return [
        (m.role, m.content, m.cut_off)
        async for m in Message.objects.filter(session=caller.session).order_by("id")
    ]


async def until_stored(caller, role: str, content: str) -> None:
    for _ in range(500):
        if await Message.objects.filter(
            session=caller.session, role=role, content=content
        ).aexists():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {role} message {content!r} was stored")


async def test_stop_mid_stream_keeps_the_text_cut_off_and_frees_the_session(
    client, trusted_caller, openai_agent
):
    openai_agent.reply(Text("Counting the", 1), Pause(20), Text(" trees: twelve."))
    turn = start_turn(client, trusted_caller, "count the trees")
    await until_stored(trusted_caller, "assistant", "Counting the")  # the draft, as shown

    assert await stop(client, trusted_caller) == (200, {"status": "stopped"})
    out = await turn
    await turns_settle()

    assert out.text == "Counting the"
    assert out.names()[-1] == "turn_end" and "error" not in out.names()
    assert await stored(trusted_caller) == [
        ("user", "count the trees", False),
        ("assistant", "Counting the", True),
        ("note", STOPPED_NOTE, False),
    ]
    session = await ChatSession.objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == ChatSession.TurnState.IDLE
    assert await stop(client, trusted_caller) == (200, {"status": "idle"})
    openai_agent.reply_text("Twelve.")
    again = await start_turn(client, trusted_caller, "again")
    assert again.text == "Twelve."


async def test_a_stop_that_lands_in_the_turns_finish_answers_once_the_session_is_released(
    client, trusted_caller, openai_agent, monkeypatch
):
    """Review 31-b L6: the turn's finish (release, then `turn_end`) ran shielded, so a Stop that
    cancelled the task meanwhile ended it at once: "stopped" came back while the session was
    still running, and a stream that saw its task done could end without `turn_end`."""
    from chat import services

    entered, gate = threading.Event(), threading.Event()
    release = services.session_release

    def slow_release(**kwargs):
        entered.set()
        gate.wait(10)
        release(**kwargs)

    monkeypatch.setattr(services, "session_release", slow_release)
    openai_agent.reply_text("Done.")
    turn = start_turn(client, trusted_caller, "hello")
    for _ in range(500):
        if entered.is_set():
            break
        await asyncio.sleep(0.01)
    assert entered.is_set()
    stopping = asyncio.create_task(stop(client, trusted_caller))
    await asyncio.sleep(0.3)
    assert not stopping.done()  # the answer waits for the release
    gate.set()
    assert await stopping == (200, {"status": "stopped"})
    session = await ChatSession.objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == ChatSession.TurnState.IDLE
    out = await turn
    await turns_settle()
    assert out.text == "Done." and out.names()[-1] == "turn_end"


async def test_stop_while_a_served_client_tool_is_awaited_answers_the_call_and_withdraws_it(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    await frames_until(ws, is_invoke)

    assert await stop(client, trusted_caller) == (200, {"status": "stopped"})
    out = await turn
    await turns_settle()

    assert out.names()[-1] == "turn_end"
    rows = await stored(trusted_caller)
    assert sorted(r[0] for r in rows) == ["assistant", "note", "tool", "user"]
    assert [r for r in rows if r[0] == "note"] == [("note", STOPPED_NOTE, False)]
    assert len(openai_agent.requests) == 1  # the model was not asked again
    frames = await frames_until(ws, lambda f: f["type"] == "client-tool-cancelled")
    assert frames[-1]["type"] == "client-tool-cancelled"
    await ws.disconnect()


async def test_stop_of_a_turn_paused_on_a_reader_sets_the_pause_aside(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "map_select", {"prompt": "Pick the pools"})])
    ws = await tab(trusted_caller, [PICK])
    out = await start_turn(client, trusted_caller, "let me choose")
    assert out.message["pending_decision"]["tool_call"] == "c1"

    assert await stop(client, trusted_caller) == (200, {"status": "set_aside"})

    pause = await PendingDecision.objects.aget(session=trusted_caller.session)
    assert pause.status == PendingDecision.Status.SET_ASIDE
    assert [r[0] for r in await stored(trusted_caller)] == ["user", "assistant", "tool"]
    await ws.disconnect()


async def test_stop_is_the_owners_only_and_needs_csrf_with_a_cookie(
    client, trusted_caller, caller, openai_agent
):
    assert (await stop(client, trusted_caller, token=caller.token))[0] == 404
    anonymous = await client.post(trusted_caller.url("/stop"))
    assert anonymous.status_code == 401 and "error" in json.loads(anonymous.content)
    cookie = AsyncClient(enforce_csrf_checks=True)
    await cookie.aforce_login(trusted_caller.user)
    refused = await cookie.post(trusted_caller.url("/stop"))
    assert refused.status_code == 403 and "CSRF" in json.loads(refused.content)["error"]
    wrong_method = await client.get(
        trusted_caller.url("/stop"), headers={"Authorization": f"Bearer {trusted_caller.token}"}
    )
    assert wrong_method.status_code == 405
