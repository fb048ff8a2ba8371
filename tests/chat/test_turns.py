"""The turn engine through the HTTP API, with the real openai agent against the fake server."""

import asyncio
import json
import time

import pytest

from chat import services
from chat.models import Approval, ChatSession, ClientToolRegistration, Message
from chat.turns import turns_settle
from tests.chat.helpers import (
    history_is_valid,
    post_stream,
    scripted_stream,
    stored_history_is_valid,
)
from tools.registry import BackendTool, ToolError, backend_tools_added

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_streamed_text_arrives_in_order_and_is_stored(client, trusted_caller, openai_agent):
    openai_agent.reply_text("Hello from the model, streamed in pieces.", chunks=5)
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert out.status == 200
    assert out.names()[0] == "turn_start"
    assert out.names()[-2:] == ["message", "turn_end"]
    assert len(out.of("text_delta")) == 5
    assert out.text == "Hello from the model, streamed in pieces."
    assert out.message["content"] == out.text
    assert out.message["pending_approval"] is None
    stored = [
        m async for m in Message.objects.filter(session=trusted_caller.session).order_by("id")
    ]
    assert [(m.role, m.content) for m in stored] == [("user", "hi"), ("assistant", out.text)]


async def test_tool_call_split_across_chunks_runs_and_the_model_gets_its_result(
    client, trusted_caller, openai_agent, neighbourhood
):
    openai_agent.reply_tool_calls([("call_a", "list_classes", {})], argument_chunks=4)
    openai_agent.reply_text("There are houses and trees.")
    out = await post_stream(
        client,
        trusted_caller.url("/message/stream"),
        {"text": "what is here?"},
        token=trusted_caller.token,
    )
    (call,) = out.of("backend_tool_call")
    assert call == {
        "call_id": "call_a",
        "name": "list_classes",
        "arguments": {},
        "ok": True,
        "title": "Count annotations per class",
        "summary": "Every class",
    }
    assert out.names().index("backend_tool_call") < out.names().index("message")
    second = openai_agent.requests[1]["messages"]
    assert history_is_valid(second)
    result = json.loads(second[-1]["content"])
    assert result["total"] > 0 and "house" in result["counts"]


async def test_two_parallel_calls_each_get_one_result_in_order(
    client, trusted_caller, openai_agent, neighbourhood
):
    openai_agent.reply_tool_calls([("c1", "list_classes", {}), ("c2", "measure", {"id": 1})])
    openai_agent.reply_text("Done.")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "go"}, token=trusted_caller.token
    )
    assert [c["call_id"] for c in out.of("backend_tool_call")] == ["c1", "c2"]
    fed = openai_agent.requests[1]["messages"]
    assert [m["tool_call_id"] for m in fed if m["role"] == "tool"] == ["c1", "c2"]
    assert history_is_valid(fed)


async def test_schema_invalid_arguments_become_a_readable_result_and_the_turn_goes_on(
    client, trusted_caller, openai_agent, neighbourhood
):
    openai_agent.reply_tool_calls(
        [("c1", "measure", {"id": "twelve"}), ("c2", "query_annotations", "{not json")]
    )
    openai_agent.reply_text("Sorry.")
    out = await post_stream(
        client,
        trusted_caller.url("/message/stream"),
        {"text": "measure"},
        token=trusted_caller.token,
    )
    calls = out.of("backend_tool_call")
    assert [c["ok"] for c in calls] == [False, False]
    assert "Invalid arguments for measure" in calls[0]["error"]
    assert "not valid JSON" in calls[1]["error"]
    assert out.message["content"] == "Sorry."
    assert history_is_valid(openai_agent.requests[1]["messages"])


async def test_a_raising_handler_becomes_a_readable_result(client, trusted_caller, openai_agent):
    def explode(context, arguments):
        raise RuntimeError("disk on fire")

    def refuse(context, arguments):
        raise ToolError("That id does not exist.")

    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    openai_agent.reply_tool_calls([("c1", "explode", {}), ("c2", "refuse", {})])
    openai_agent.reply_text("Both failed.")
    with backend_tools_added(
        BackendTool("explode", "Fails.", empty, explode, title="Explode"),
        BackendTool("refuse", "Refuses.", empty, refuse, title="Refuse"),
    ):
        out = await post_stream(
            client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
        )
    first, second = out.of("backend_tool_call")
    assert first["ok"] is False and "internal error (RuntimeError)" in first["error"]
    assert "disk on fire" not in first["error"]  # internals stay on the server
    assert first["problem"] == "It failed on the server; the administrator can see why."
    assert second["error"] == second["problem"] == "That id does not exist."
    assert out.message["content"] == "Both failed."


async def test_an_unknown_tool_gets_a_result_saying_so(client, trusted_caller, openai_agent):
    openai_agent.reply_tool_calls([("c1", "teleport", {})])
    openai_agent.reply_text("OK.")
    await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
    )
    fed = openai_agent.requests[1]["messages"]
    assert "no tool named 'teleport'" in fed[-1]["content"]


async def test_provider_http_error_becomes_an_error_event_and_the_session_stays_usable(
    client, trusted_caller, openai_agent
):
    for _ in range(3):  # the client retries server errors twice
        openai_agent.fail(500)
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert out.names() == ["turn_start", "error", "turn_end"]
    assert "HTTP 500" in out.of("error")[0]["message"]
    note = await Message.objects.filter(session=trusted_caller.session, role="note").afirst()
    assert "HTTP 500" in note.content
    openai_agent.reply_text("Back again.")
    again = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert again.message["content"] == "Back again."
    assert all(m["role"] != "note" for m in openai_agent.requests[-1]["messages"])


async def test_a_stream_that_breaks_off_is_an_error_and_keeps_what_was_shown_cut_off(
    client, trusted_caller, openai_agent
):
    openai_agent.break_off(after_chunks=2)
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert "error" in out.names() and out.names()[-1] == "turn_end"
    assert "message" not in out.names()
    stored = [
        (m.role, m.content, m.cut_off)
        async for m in Message.objects.filter(session=trusted_caller.session).order_by("id")
    ]
    assert stored[1] == ("assistant", out.text, True)
    assert out.text and stored[2][0] == "note"
    response = await client.get(
        trusted_caller.url(), headers={"Authorization": f"Bearer {trusted_caller.token}"}
    )
    assert [m.get("cut_off", False) for m in response.json()["messages"]] == [False, True, False]


async def test_a_client_that_disconnects_mid_stream_loses_nothing(
    client, trusted_caller, openai_agent
):
    from tests.fakes.fake_openai import Pause, Text

    openai_agent.reply(Text("first part ", 1), Pause(0.3), Text("and the rest.", 1))
    response = await client.post(
        trusted_caller.url("/message/stream"),
        data=json.dumps({"text": "hi"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {trusted_caller.token}"},
    )
    stream = response.streaming_content
    async for chunk in stream:
        if b"text_delta" in (chunk if isinstance(chunk, bytes) else chunk.encode()):
            break
    await stream.aclose()  # the browser went away
    await turns_settle()
    final = await Message.objects.filter(session=trusted_caller.session, role="assistant").alast()
    assert final.content == "first part and the rest."
    session = await ChatSession.objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == "idle"


async def test_events_queued_together_go_out_in_one_chunk(client, trusted_caller, monkeypatch):
    """Each chunk of the stream is a write through Django, Daphne and the socket: the events
    a turn emitted by the time the stream runs are sent together, in order; the first
    chunk, `: ok`, takes along what the turn's first step emitted (its `turn_start`): a
    chunk fewer per turn; and the turn's `message` waits for the `turn_end` that follows it
    once the claim is released (a trip later): another."""
    from geosense.wire import TurnEvent

    def launch(prepared, *, listener):
        async def turn():
            listener(TurnEvent("turn_start", {"n": "turn_start"}))
            await asyncio.sleep(0)
            for name in ("text_delta", "message"):
                listener(TurnEvent(name, {"n": name}))
            await asyncio.sleep(0)
            listener(TurnEvent("turn_end", {}))

        return asyncio.create_task(turn())

    chunks = [c async for c in scripted_stream(client, trusted_caller, monkeypatch, launch)]

    assert chunks == [
        ': ok\n\nevent: turn_start\ndata: {"n": "turn_start"}\n\n',
        'event: text_delta\ndata: {"n": "text_delta"}\n\n'
        'event: message\ndata: {"n": "message"}\n\n'
        "event: turn_end\ndata: {}\n\n",
    ]
    await asyncio.to_thread(services.session_release, session_id=trusted_caller.session.pk)


@pytest.mark.parametrize(
    ("message", "keepalive"),
    [({"n": "message"}, 0.01), ({"n": "message", "pending_approval": {"id": 1}}, 3600.0)],
    ids=["answer", "paused"],
)
async def test_a_message_held_for_its_turn_end_goes_out_by_the_next_keep_alive(
    client, trusted_caller, monkeypatch, message, keepalive
):
    """The turn's answer waits for its `turn_end` no longer than a keep-alive's wait: a
    release that takes long (a busy database) does not keep it from the reader; a message
    with calls (a pause for a person) is not held at all."""
    import chat.api
    from geosense.wire import TurnEvent

    released = asyncio.Event()

    def launch(prepared, *, listener):
        async def turn():
            listener(TurnEvent("turn_start", {}))
            await asyncio.sleep(0)
            listener(TurnEvent("message", message))
            await released.wait()
            listener(TurnEvent("turn_end", {}))

        return asyncio.create_task(turn())

    monkeypatch.setattr(chat.api, "KEEPALIVE_SECONDS", keepalive)
    chunks = []
    async for chunk in scripted_stream(client, trusted_caller, monkeypatch, launch):
        chunks.append(chunk)
        if len(chunks) == 2:
            released.set()  # the release goes through once the answer is out

    assert chunks[1] == f"event: message\ndata: {json.dumps(message)}\n\n"
    assert chunks[-1] == "event: turn_end\ndata: {}\n\n"
    await asyncio.to_thread(services.session_release, session_id=trusted_caller.session.pk)


async def test_a_short_body_is_read_on_the_loop_and_a_deep_one_still_refused(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A message's body is parsed within a deadline: on the loop when short (no hop to the
    schema worker for every message), and a body nesting past the limit is refused alike."""
    from tools import schemas

    hops = []
    real = schemas.checked_off_loop

    async def counted(fn, *args, **kwargs):
        hops.append(getattr(fn, "__name__", fn))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(schemas, "checked_off_loop", counted)
    openai_agent.reply_text("Hi.")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert out.names()[-1] == "turn_end" and hops == []
    deep: object = "x"
    for _ in range(100):
        deep = [deep]
    refused = await post_stream(
        client,
        trusted_caller.url("/message/stream"),
        {"text": "hi", "contexts": deep},
        token=trusted_caller.token,
    )
    assert refused.status == 400 and "nests deeper than 64 levels" in refused.body["error"]


async def test_a_second_message_while_a_turn_runs_answers_409(client, trusted_caller):
    await asyncio.to_thread(services.session_claim, session_id=trusted_caller.session.pk)
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )
    assert out.status == 409
    assert "already running" in out.body["error"]
    assert not await Message.objects.filter(session=trusted_caller.session).aexists()


async def test_an_expired_lease_does_not_block_the_session_forever(client, trusted_caller):
    from datetime import timedelta

    from django.utils import timezone

    await ChatSession.objects.filter(pk=trusted_caller.session.pk).aupdate(
        turn_state="running", turn_lease=timezone.now() - timedelta(seconds=1)
    )
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hello"}, token=trusted_caller.token
    )
    assert out.status == 200


async def test_the_history_fed_after_a_restart_has_a_result_for_every_call(
    client, trusted_caller, openai_agent
):
    """A crash left a call without a result; the next turn repairs it before asking the model."""
    session_id = trusted_caller.session.pk
    await Message.objects.acreate(session_id=session_id, turn=1, role="user", content="earlier")
    await Message.objects.acreate(
        session_id=session_id,
        turn=1,
        role="assistant",
        tool_calls=[{"id": "lost", "name": "list_classes", "arguments": "{}"}],
    )
    openai_agent.reply_text("Fine.")
    await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "again"}, token=trusted_caller.token
    )
    fed = openai_agent.requests[0]["messages"]
    assert history_is_valid(fed)
    assert (
        "turn ended before this call could run"
        in next(m for m in fed if m["role"] == "tool")["content"]
    )
    assert await asyncio.to_thread(stored_history_is_valid, session_id)


async def test_a_turn_numbered_between_a_new_messages_read_and_its_claim_is_repaired_first(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A new message reads the session's facts before its claim, and its claim numbers the
    turn only while the count it read holds: a turn numbered meanwhile (here one that left a
    call without its result, as a crash does) makes it the claim alone, the facts are read
    again under it, and the call gets its result before the new turn is numbered (engine
    invariant 1)."""
    from django.db.models import F

    from chat import turns

    session_id = trusted_caller.session.pk
    real_facts = turns._facts_settled

    def facts_then_a_turn_elsewhere(session_id):
        facts = real_facts(session_id)
        ChatSession.objects.filter(pk=session_id).update(turn_count=F("turn_count") + 1)
        Message.objects.create(
            session_id=session_id,
            turn=facts.count + 1,
            role="assistant",
            tool_calls=[{"id": "lost", "name": "list_classes", "arguments": "{}"}],
        )
        return facts

    monkeypatch.setattr(turns, "_facts_settled", facts_then_a_turn_elsewhere)
    openai_agent.reply_text("Fine.")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "again"}, token=trusted_caller.token
    )
    assert out.names()[-1] == "turn_end"
    result = await Message.objects.aget(session_id=session_id, role="tool", tool_call_id="lost")
    assert result.is_error and result.turn == 1
    asked = await Message.objects.filter(session_id=session_id, role="user").alatest("id")
    assert (asked.turn, asked.content) == (2, "again") and result.pk < asked.pk
    assert history_is_valid(openai_agent.requests[0]["messages"])


async def test_a_pause_left_by_the_turn_holding_the_claim_at_a_new_messages_read_is_set_aside(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The turn holding the session's claim while a new message reads its facts is numbered
    already: it may store a call and its pause and release before the new message's claim,
    and the count does not move. The facts show the session held, so the claim comes first and
    the facts are read again under it: the pause is set aside and its call answered before the
    new turn (engine invariant 1; review 32-a H1: the numbered claim skipped both)."""
    from chat import turns

    session_id = trusted_caller.session.pk
    await ChatSession.objects.filter(pk=session_id).aupdate(turn_count=1, turn_state="running")
    await Message.objects.acreate(session_id=session_id, turn=1, role="user", content="first")
    real_facts = turns._facts_settled

    def facts_then_the_holder_pauses_and_releases(session_id):
        facts = real_facts(session_id)
        message = Message.objects.create(
            session_id=session_id,
            turn=1,
            role="assistant",
            tool_calls=[{"id": "paid", "name": "list_classes", "arguments": "{}"}],
        )
        Approval.objects.create(
            session_id=session_id,
            message=message,
            tool_call_id="paid",
            tool_name="list_classes",
            reasons=["credits"],
        )
        ChatSession.objects.filter(pk=session_id).update(turn_state="idle", turn_lease=None)
        return facts

    monkeypatch.setattr(turns, "_facts_settled", facts_then_the_holder_pauses_and_releases)
    openai_agent.reply_text("Fine.")
    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "again"}, token=trusted_caller.token
    )
    assert out.names()[-1] == "turn_end"
    approval = await Approval.objects.aget(tool_call_id="paid")
    assert approval.status == "set_aside"
    assert history_is_valid(openai_agent.requests[0]["messages"])
    asked = await Message.objects.filter(session_id=session_id, role="user").alatest("id")
    assert (asked.turn, asked.content) == (2, "again")


async def test_a_subagent_gets_only_read_only_backend_tools_never_client_tools(
    client, trusted_caller, openai_agent
):
    await ClientToolRegistration.objects.acreate(
        channel_name="specific.test!abc",
        session=trusted_caller.session,
        tools=[
            {
                "kind": "blocking",
                "name": "map_get_view",
                "description": "The map's view.",
                "arguments": {"type": "object", "properties": {}},
                "result": {"type": "object"},
                "serve": True,
            }
        ],
    )
    openai_agent.reply_tool_calls([("c1", "area_report", {"question": "How many houses?"})])
    openai_agent.reply_text("The helper says: 12 houses.")  # the sub-turn's answer
    openai_agent.reply_text("There are 12 houses.")
    out = await post_stream(
        client,
        trusted_caller.url("/message/stream"),
        {"text": "report"},
        token=trusted_caller.token,
    )
    main_tools = {t["function"]["name"] for t in openai_agent.requests[0]["tools"]}
    sub_tools = {t["function"]["name"] for t in openai_agent.requests[1]["tools"]}
    assert "map_get_view" in main_tools
    assert sub_tools == {"list_classes", "query_annotations", "measure"}
    assert out.of("backend_tool_call")[0]["ok"] is True
    assert "12 houses" in openai_agent.requests[2]["messages"][-1]["content"]


# --- the API's refusals ----------------------------------------------------------------------


async def test_another_users_session_answers_404(client, caller, transactional_db):
    from tests.chat.conftest import make_caller

    mallory = await asyncio.to_thread(make_caller, "mallory")
    for method, path in (
        ("get", ""),
        ("patch", ""),
        ("post", "/message/stream"),
        ("post", "/message/resume/stream"),
    ):
        headers = {"Authorization": f"Bearer {mallory.token}"}
        if method == "get":
            response = await client.get(caller.url(path), headers=headers)
        else:
            response = await getattr(client, method)(
                caller.url(path),
                data=json.dumps({"text": "hi", "allow_backend_tools": True}),
                content_type="application/json",
                headers=headers,
            )
        assert response.status_code == 404, (method, path)
    assert not await Message.objects.filter(session=caller.session).aexists()


async def test_anonymous_and_bad_token_callers_are_refused(client, caller):
    assert (await client.get("/api/sessions")).status_code == 401
    response = await client.get("/api/sessions", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ("not json", 400, "must be JSON"),
        ("[1, 2]", 400, "JSON object"),
        ('{"text": ""}', 400, "text is required"),
        ('{"text": 5}', 400, "text is required"),
        ('{"text": "hi", "contexts": {"type": "x"}}', 400, "contexts must be a list"),
        (
            '{"text": "hi", "contexts": [{"type": "secret", "data": 1}]}',
            400,
            "each context needs a type",
        ),
    ],
)
async def test_malformed_bodies_answer_4xx_before_any_stream(
    client, caller, body, status, fragment
):
    response = await client.post(
        caller.url("/message/stream"),
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {caller.token}"},
    )
    assert response.status_code == status
    assert fragment in json.loads(response.content)["error"]
    session = await ChatSession.objects.aget(pk=caller.session.pk)
    assert session.turn_state == "idle"


async def test_an_oversized_body_answers_413(client, caller):
    response = await client.post(
        caller.url("/message/stream"),
        data=json.dumps({"text": "x" * (3 * 1024 * 1024)}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {caller.token}"},
    )
    assert response.status_code == 413


async def test_cookie_authenticated_writes_need_csrf(caller):
    from django.test import AsyncClient

    browser = AsyncClient(enforce_csrf_checks=True)
    await browser.aforce_login(caller.user)
    response = await browser.post("/api/sessions", data="{}", content_type="application/json")
    assert response.status_code == 403


async def test_sessions_are_created_listed_newest_first_and_patched(client, caller):
    headers = {"Authorization": f"Bearer {caller.token}"}
    created = await client.post(
        "/api/sessions", data='{"title": "Trees"}', content_type="application/json", headers=headers
    )
    assert created.status_code == 201
    body = json.loads(created.content)
    assert set(body) >= {"id", "title", "allow_backend_tools", "created"}
    assert body["allow_backend_tools"] is False and body["title"] == "Trees"
    listing = json.loads((await client.get("/api/sessions", headers=headers)).content)
    assert [s["id"] for s in listing["sessions"]] == [body["id"], str(caller.session.pk)]
    patched = await client.patch(
        f"/api/sessions/{body['id']}",
        data='{"allow_backend_tools": true}',
        content_type="application/json",
        headers=headers,
    )
    assert json.loads(patched.content)["allow_backend_tools"] is True
    bad = await client.patch(
        f"/api/sessions/{body['id']}",
        data='{"allow_backend_tools": "yes"}',
        content_type="application/json",
        headers=headers,
    )
    assert bad.status_code == 400


async def test_a_session_may_be_created_with_backend_tools_allowed(client, caller):
    """The page's "Allow backend tools" ticked before the first message creates it so."""
    headers = {"Authorization": f"Bearer {caller.token}"}

    async def create(data: str):
        return await client.post(
            "/api/sessions", data=data, content_type="application/json", headers=headers
        )

    created = await create('{"allow_backend_tools": true}')
    assert created.status_code == 201
    assert json.loads(created.content)["allow_backend_tools"] is True
    refused = await create('{"allow_backend_tools": "yes"}')
    assert refused.status_code == 400
    assert "allow_backend_tools must be true or false" in json.loads(refused.content)["error"]


async def test_artifacts_are_served_to_their_owner_only(
    client, trusted_caller, openai_agent, neighbourhood
):
    from tests.chat.conftest import make_caller

    openai_agent.reply_tool_calls(
        [
            (
                "c1",
                "spatial_relation",
                {
                    "relation": "within_distance",
                    "source": "tree",
                    "target": "house",
                    "distance_m": 20,
                },
            )
        ]
    )
    openai_agent.reply_text("Done.")
    await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "x"}, token=trusted_caller.token
    )
    result = json.loads(openai_agent.requests[1]["messages"][-1]["content"])
    path = trusted_caller.url(f"/artifacts/{result['artifact_id']}")
    mine = await client.get(path, headers={"Authorization": f"Bearer {trusted_caller.token}"})
    assert json.loads(mine.content)["data"]["linkType"] == "distance"
    other = await asyncio.to_thread(make_caller, "eve")
    theirs = await client.get(path, headers={"Authorization": f"Bearer {other.token}"})
    assert theirs.status_code == 404


async def test_a_call_id_the_model_reuses_in_a_later_turn_still_runs_and_gets_its_own_result(
    client, trusted_caller, openai_agent, neighbourhood
):
    for text in ("first", "second"):
        openai_agent.reply_tool_calls([("call_0", "list_classes", {})])
        openai_agent.reply_text(f"{text} done")
        out = await post_stream(
            client,
            trusted_caller.url("/message/stream"),
            {"text": text},
            token=trusted_caller.token,
        )
        assert out.of("backend_tool_call")[0]["ok"] is True
    fed = openai_agent.requests[-1]["messages"]
    assert history_is_valid(fed)
    assert [m["tool_call_id"] for m in fed if m["role"] == "tool"] == ["call_0", "call_0~2"]


async def test_half_an_emoji_from_the_model_still_ends_the_turn(
    client, trusted_caller, openai_agent
):
    """A tokenizer may cut an emoji in two (a lone surrogate in the chunk's JSON): the SSE
    response could not encode it and broke off without `turn_end`, and the message's insert
    failed (CONTRACT: the stream always ends with `turn_end`)."""
    openai_agent.reply_text("Half an emoji: \ud83d, then more.")

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.names()[-1] == "turn_end"
    stored = await Message.objects.filter(role="assistant").alatest("id")
    assert stored.content == "Half an emoji: \ufffd, then more."


async def test_a_claims_freshness_runs_from_before_its_write(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A step skips the renewal while the claim is fresh: the time must be read before the
    claim's write, not after the whole preparation (which may wait on a busy database)."""
    from chat import turns

    claims, prepared = [], []
    real_claim, real_prepare = services.session_claim, turns._prepare_sync
    monkeypatch.setattr(
        services,
        "session_claim",
        lambda **kw: claims.append(time.monotonic()) or real_claim(**kw),
    )
    monkeypatch.setattr(
        turns, "_prepare_sync", lambda **kw: prepared.append(real_prepare(**kw)) or prepared[-1]
    )
    openai_agent.reply_text("Hello.")

    await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert prepared[0].claimed <= claims[0]


@pytest.mark.parametrize("fails", [False, True])
async def test_a_new_messages_first_step_is_read_with_its_preparation_or_by_itself(
    client, trusted_caller, openai_agent, monkeypatch, caplog, fails
):
    """The first step's inputs are read in the preparation's trip; when that read fails, the
    message is still taken and the step reads them in a trip of its own (and answers as usual).
    A failure that is not the database being busy is logged, not hidden (review 30-a L3)."""
    from chat import turns

    reads = []
    real_reads = turns._step_reads

    def reads_counted(**kwargs):
        reads.append(len(reads))
        if fails and len(reads) == 1:
            raise RuntimeError("the read ahead broke")
        return real_reads(**kwargs)

    monkeypatch.setattr(turns, "_step_reads", reads_counted)
    openai_agent.reply_text("Hello.")

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.names() == ["turn_start", "text_delta", "message", "turn_end"]
    assert len(reads) == (2 if fails else 1)
    logged = [r for r in caplog.records if "read ahead failed" in r.getMessage()]
    assert len(logged) == (1 if fails else 0)


@pytest.mark.parametrize("stale", [False, True])
async def test_a_step_renews_the_claim_only_when_its_last_renewal_is_old(
    client, trusted_caller, openai_agent, monkeypatch, stale
):
    """The claim was just taken (or renewed with a call's result): a step does not renew it
    again, one statement a step less; a step long after still renews it (engine invariant 2)."""
    from chat import turns

    renewed = []
    real_renew = services.session_lease_renew
    monkeypatch.setattr(
        services, "session_lease_renew", lambda **kw: renewed.append(1) or real_renew(**kw)
    )
    if stale:
        monkeypatch.setattr(turns, "STEP_RENEW_SECONDS", -1.0)
    openai_agent.reply_text("Hello.")

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.names()[-1] == "turn_end"
    assert len(renewed) == (1 if stale else 0)


async def test_the_keeper_renews_the_claim_every_quarter_lease_and_stops_with_the_turn(
    client, trusted_caller, openai_agent, monkeypatch
):
    """The keeper is a timer of the loop a quarter lease away; when it fires, the claim is
    renewed in a task of its own and the next timer armed (engine invariant 2); the turn's end
    cancels it. Fired by hand here: nothing depends on how fast the machine runs."""
    from chat import turns

    renewed = []
    real_renew = services.session_lease_renew
    monkeypatch.setattr(
        services, "session_lease_renew", lambda **kw: renewed.append(1) or real_renew(**kw)
    )
    keep, runners = turns.TurnRunner._lease_keep, []
    monkeypatch.setattr(
        turns.TurnRunner, "_lease_keep", lambda runner: runners.append(runner) or keep(runner)
    )
    openai_agent.reply_text("Hello.")

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    (runner,) = runners
    assert out.names()[-1] == "turn_end"
    assert runner._keeper.cancelled() and runner._renewal is None and renewed == []

    loop = asyncio.get_running_loop()
    quarter = services.TURN_LEASE.total_seconds() / 4
    before = loop.time()
    keep(runner)
    first = runner._keeper
    # uvloop arms a timer on libuv's millisecond clock: `when()` may be a rounding away from
    # `loop.time() + quarter` (review 30-b M1: ~1 run in 8 failed on one ulp).
    assert before + quarter - 1e-3 <= first.when() <= loop.time() + quarter + 1e-3
    runner._lease_due()  # as the loop runs it when the timer fires
    await runner._renewal
    assert renewed == [1] and runner._renewal is None
    assert runner._keeper is not first and not runner._keeper.cancelled()
    runner._keeper.cancel()
