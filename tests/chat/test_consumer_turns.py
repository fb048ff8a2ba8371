"""Client tools through real turns: a turn started over HTTP (the openai agent against the fake
model server) calls the tools a tab registered on its session socket."""

import asyncio
import json
import time

import pytest
from channels.testing import WebsocketCommunicator

from chat.models import ChatSession
from geosense.asgi import application
from tests.chat.helpers import post_stream
from tests.client_tools import FOCUS, LOCATION, PICK

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def tab(caller, tools: list[dict] | None = None) -> WebsocketCommunicator:
    """A browser tab: a socket bound to the caller's session, with these tools registered."""
    ws = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"authorization", f"Bearer {caller.token}".encode())]
    )
    assert (await ws.connect())[0]
    await ws.send_json_to({"type": "session-bind", "session": str(caller.session.pk)})
    assert (await ws.receive_json_from())["type"] == "session-bound"
    if tools:
        await ws.send_json_to({"type": "client-tool-register", "tools": tools})
        assert (await ws.receive_json_from())["type"] == "client-tool-registered"
    return ws


async def frames_until(ws: WebsocketCommunicator, done) -> list[dict]:
    seen = []
    while True:
        frame = await ws.receive_json_from(timeout=5)
        seen.append(frame)
        if done(frame):
            return seen


def is_invoke(frame: dict) -> bool:
    return frame["type"] == "client-tool-invoke"


async def invoke_answer(ws: WebsocketCommunicator, result: dict) -> dict:
    """Wait for the next invoke on `ws` and answer it with `result`; the invoke."""
    invoke = (await frames_until(ws, is_invoke))[-1]
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": invoke["correlationId"], "result": result}
    )
    return invoke


def is_turn_end(frame: dict) -> bool:
    return frame.get("event") == "turn_end"


def events(frames: list[dict]) -> list[str]:
    return [f["event"] for f in frames if f["type"] == "event"]


def start_turn(client, caller, text: str) -> asyncio.Task:
    return asyncio.create_task(
        post_stream(client, caller.url("/message/stream"), {"text": text}, token=caller.token)
    )


def last_tool_result(fake, request_index: int) -> str:
    message = fake.requests[request_index]["messages"][-1]
    assert message["role"] == "tool"
    return message["content"]


async def answered_with(client, caller, fake, answer: dict) -> str:
    """Run a turn whose model calls location_get, answer the invoke with `answer` (the frame's
    result/error part), and return what the model read as the call's result."""
    fake.reply_tool_calls([("c1", "location_get", {})])
    fake.reply_text("Done.")
    ws = await tab(caller, [LOCATION])
    turn = start_turn(client, caller, "where am I?")
    invoke = (await frames_until(ws, is_invoke))[-1]
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": invoke["correlationId"], **answer}
    )
    out = await turn
    assert out.names()[-1] == "turn_end"
    await ws.disconnect()
    return last_tool_result(fake, 1)


async def test_a_served_call_is_answered_by_the_page_and_the_model_reads_it(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("You are near the park.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    before = await frames_until(ws, is_invoke)
    assert events(before) == ["turn_start", "client_tool_call"]
    invoke = before[-1]
    assert invoke["name"] == "location_get"
    assert invoke["arguments"] == {}
    result = {"status": "GRANTED", "accuracy": 30}
    await ws.send_json_to(
        {"type": "client-tool-result", "correlationId": invoke["correlationId"], "result": result}
    )
    out = await turn
    assert out.of("client_tool_call") == [
        {
            "call_id": "c1",
            "name": "location_get",
            "arguments": {},
            "kind": "blocking",
            "title": "Location get",  # the test's declaration has no title: its name in words
            "summary": "",
        }
    ]
    assert json.loads(last_tool_result(openai_agent, 1)) == result
    assert "location_get" in {t["function"]["name"] for t in openai_agent.requests[0]["tools"]}
    after = await frames_until(ws, is_turn_end)
    assert events(after)[-2:] == ["message", "turn_end"]
    await ws.disconnect()


async def test_an_error_answer_reaches_the_model_as_a_readable_refusal(
    client, trusted_caller, openai_agent
):
    content = await answered_with(
        client, trusted_caller, openai_agent, {"error": "Location is switched off."}
    )
    assert "The client refused: Location is switched off." in content


async def test_a_result_breaking_the_schema_reaches_the_model_as_a_refusal(
    client, trusted_caller, openai_agent
):
    content = await answered_with(client, trusted_caller, openai_agent, {"result": {"lat": 1}})
    assert "does not match the result schema of location_get" in content


async def test_an_unanswered_call_times_out_with_a_readable_result(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_CLIENT_TOOL_TIMEOUT = 0.3
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("I could not get your location.")
    ws = await tab(trusted_caller, [LOCATION])
    out = await start_turn(client, trusted_caller, "where am I?")
    assert out.names()[-1] == "turn_end"
    assert "No answer from the client within 0.3 seconds." in last_tool_result(openai_agent, 1)
    await ws.disconnect()


async def test_a_tab_closing_while_its_call_is_pending_answers_the_model_at_once(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_CLIENT_TOOL_TIMEOUT = 10
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("Your tab went away.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I?")
    await frames_until(ws, is_invoke)
    closed = time.monotonic()
    await ws.disconnect()
    out = await turn
    assert time.monotonic() - closed < 2
    assert out.names()[-1] == "turn_end"
    assert "The client went away before answering." in last_tool_result(openai_agent, 1)


async def test_a_one_way_call_is_handed_to_the_page_and_the_turn_carries_on(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "map_focus", {"ids": [3, 4]})])
    openai_agent.reply_text("They are on the map now.")
    ws = await tab(trusted_caller, [FOCUS])
    out = await start_turn(client, trusted_caller, "show 3 and 4")
    assert out.message["content"] == "They are on the map now."
    frames = await frames_until(ws, is_turn_end)
    assert not any(is_invoke(f) for f in frames)
    (shown,) = [f["data"] for f in frames if f.get("event") == "client_tool_call"]
    assert shown == {
        "call_id": "c1",
        "name": "map_focus",
        "arguments": {"ids": [3, 4]},
        "kind": "one-way",
        "title": "Show annotations on the map",
        "summary": "#3 and #4",
    }
    assert "error" not in json.loads(last_tool_result(openai_agent, 1))
    await ws.disconnect()


async def test_invalid_arguments_are_refused_and_nothing_reaches_the_page(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "map_focus", {"ids": "all"})])
    openai_agent.reply_text("Sorry.")
    ws = await tab(trusted_caller, [FOCUS, LOCATION])
    await start_turn(client, trusted_caller, "show everything")
    frames = await frames_until(ws, is_turn_end)
    assert not any(is_invoke(f) for f in frames)
    assert "Nothing was sent to the client" in last_tool_result(openai_agent, 1)
    await ws.disconnect()


async def test_a_reader_answered_call_pauses_the_turn_and_resume_continues_it(
    client, trusted_caller, openai_agent
):
    openai_agent.reply_tool_calls([("c1", "map_select", {"prompt": "Pick the pools"})])
    ws = await tab(trusted_caller, [PICK])
    out = await start_turn(client, trusted_caller, "let me choose")
    decision = out.message["pending_decision"]
    assert (decision["tool_call"], decision["name"], decision["arguments"]) == (
        "c1",
        "map_select",
        {"prompt": "Pick the pools"},
    )
    frames = await frames_until(ws, is_turn_end)
    assert not any(is_invoke(f) for f in frames)
    (paused,) = [f["data"] for f in frames if f.get("event") == "message"]
    assert paused["pending_decision"]["tool_call"] == "c1"

    url = trusted_caller.url("/message/resume/stream")
    refused = await post_stream(
        client, url, {"tool_call": "c1", "result": {"ids": "x"}}, token=trusted_caller.token
    )
    assert 400 <= refused.status < 500
    openai_agent.reply_text("You picked two pools.")
    resumed = await post_stream(
        client, url, {"tool_call": "c1", "result": {"ids": [7, 9]}}, token=trusted_caller.token
    )
    assert resumed.message["content"] == "You picked two pools."
    assert json.loads(last_tool_result(openai_agent, 1)) == {"ids": [7, 9]}
    await ws.disconnect()


async def test_the_same_client_tool_is_answered_at_most_three_times_per_turn(
    client, trusted_caller, openai_agent
):
    for index in range(4):
        openai_agent.reply_tool_calls([(f"c{index}", "location_get", {})])
    openai_agent.reply_text("Enough.")
    ws = await tab(trusted_caller, [LOCATION])
    turn = start_turn(client, trusted_caller, "where am I, really?")
    for _ in range(3):
        await invoke_answer(ws, {"status": "GRANTED"})
    out = await turn
    assert out.message["content"] == "Enough."
    assert "Stop calling it" in last_tool_result(openai_agent, 4)
    frames = await frames_until(ws, is_turn_end)
    assert not any(is_invoke(f) for f in frames)
    await ws.disconnect()


async def test_without_a_tab_the_model_is_not_offered_client_tools(
    client, trusted_caller, openai_agent
):
    ws = await tab(trusted_caller, [LOCATION])
    await ws.disconnect()
    openai_agent.reply_tool_calls([("c1", "location_get", {})])
    openai_agent.reply_text("I cannot see your location.")
    out = await start_turn(client, trusted_caller, "where am I?")
    assert out.names()[-1] == "turn_end"
    assert "location_get" not in {t["function"]["name"] for t in openai_agent.requests[0]["tools"]}
    assert "no tool named 'location_get'" in last_tool_result(openai_agent, 1)


async def test_another_tab_sees_a_turn_started_over_http(client, trusted_caller, openai_agent):
    openai_agent.reply_text("Hello, both tabs.")
    other_tab = await tab(trusted_caller)
    elsewhere = await ChatSession.objects.acreate(user=trusted_caller.user)
    unrelated = await tab(trusted_caller)
    await unrelated.send_json_to({"type": "session-bind", "session": str(elsewhere.pk)})
    assert (await unrelated.receive_json_from())["type"] == "session-bound"
    out = await start_turn(client, trusted_caller, "hi")
    frames = await frames_until(other_tab, is_turn_end)
    assert events(frames) == out.names()
    (message,) = [f["data"] for f in frames if f.get("event") == "message"]
    assert message["content"] == "Hello, both tabs."
    assert await unrelated.receive_nothing()
    await other_tab.disconnect()
    await unrelated.disconnect()
