"""The fake model server speaks OpenAI's wire format: the real `openai` client reads it."""

import json
from http.server import BaseHTTPRequestHandler

import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from tests.burst import connects_completed
from tests.fakes.fake_openai import FakeHTTPServer, Pause, Text, ToolCalls


@pytest_asyncio.fixture
async def openai_client(fake_llm):
    async with AsyncOpenAI(
        base_url=fake_llm.base_url, api_key="test", max_retries=0, timeout=10
    ) as client:
        yield client


async def _stream(client, **kwargs):
    messages = kwargs.pop("messages", [{"role": "user", "content": "hi"}])
    stream = await client.chat.completions.create(
        model="fake-model", messages=messages, stream=True, **kwargs
    )
    return [chunk async for chunk in stream]


def _text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _calls(chunks) -> dict[int, dict]:
    """Assemble streamed tool calls the way an agent does: by index, arguments concatenated."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for part in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
    return calls


@pytest.mark.asyncio
async def test_streamed_text_arrives_in_the_requested_chunks(fake_llm, openai_client):
    fake_llm.reply_text("Hello from the fake", chunks=3)

    chunks = await _stream(openai_client)

    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(pieces) == 3
    assert _text(chunks) == "Hello from the fake"
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.asyncio
async def test_tool_call_arguments_split_across_chunks_reassemble(fake_llm, openai_client):
    fake_llm.reply_tool_calls([("call_1", "count_annotations", {"class": "tree"})])

    chunks = await _stream(openai_client)

    argument_parts = [
        part.function.arguments
        for c in chunks
        for part in c.choices[0].delta.tool_calls or []
        if part.function.arguments
    ]
    assert len(argument_parts) > 1
    assert _calls(chunks) == {
        0: {"id": "call_1", "name": "count_annotations", "arguments": '{"class": "tree"}'}
    }
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.asyncio
async def test_parallel_tool_calls_carry_distinct_indices(fake_llm, openai_client):
    fake_llm.reply_tool_calls(
        [("call_a", "list_classes", {}), ("call_b", "largest", {"class": "pool"})],
        text="Looking.",
    )

    chunks = await _stream(openai_client)

    calls = _calls(chunks)
    assert _text(chunks) == "Looking."
    assert [calls[0]["id"], calls[1]["id"]] == ["call_a", "call_b"]
    assert json.loads(calls[1]["arguments"]) == {"class": "pool"}


@pytest.mark.asyncio
async def test_http_500_raises_the_clients_server_error(fake_llm, openai_client):
    fake_llm.fail(500, message="boom")

    with pytest.raises(openai.InternalServerError) as caught:
        await _stream(openai_client)

    assert caught.value.status_code == 500
    assert "boom" in str(caught.value)


@pytest.mark.asyncio
async def test_a_broken_off_stream_raises_a_connection_error_after_the_first_chunks(
    fake_llm, openai_client
):
    fake_llm.break_off(after_chunks=2, text="abcdefghi")
    received = []

    stream = await openai_client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk)

    assert _text(received) == "abcdef"
    assert all(c.choices[0].finish_reason is None for c in received)


@pytest.mark.asyncio
async def test_every_request_body_is_recorded_in_order(fake_llm, openai_client):
    history = [
        {"role": "user", "content": "how many trees?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "n", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12"},
    ]
    await _stream(openai_client, messages=history[:1])
    await _stream(openai_client, messages=history)

    assert [len(r["messages"]) for r in fake_llm.requests] == [1, 3]
    assert fake_llm.requests[1]["messages"][2]["tool_call_id"] == "c1"
    assert fake_llm.requests[0]["stream"] is True


@pytest.mark.asyncio
async def test_an_empty_queue_answers_the_default_text(fake_llm, openai_client):
    chunks = await _stream(openai_client)

    assert _text(chunks) == fake_llm.default_text


@pytest.mark.asyncio
async def test_a_pause_delays_the_rest_of_the_stream(fake_llm, openai_client):
    fake_llm.reply(Text("a"), Pause(0.3), ToolCalls((("c1", "t", {}),)))

    with pytest.raises(openai.APITimeoutError):
        await openai_client.with_options(timeout=0.1).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}]
        )


@pytest.mark.asyncio
async def test_a_non_streamed_completion_carries_text_and_tool_calls(fake_llm, openai_client):
    fake_llm.reply_tool_calls([("call_9", "where_am_i", {})], text="One moment.")

    completion = await openai_client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "where?"}]
    )

    message = completion.choices[0].message
    assert message.content == "One moment."
    assert message.tool_calls[0].function.name == "where_am_i"
    assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.asyncio
async def test_models_lists_the_fake_model(fake_llm, openai_client):
    models = await openai_client.models.list()

    assert [m.id for m in models.data] == ["fake-model"]


def test_the_fake_queues_a_burst_of_connections_as_a_real_model_server_does():
    """Its accept thread busy (here: not serving yet), 300 connections at once all complete
    their handshake: none waits for TCP's retransmission (socketserver's backlog of 5 let 6)."""
    server = FakeHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    try:
        assert connects_completed(server.server_address[1], 300, within=0.5) == 300
    finally:
        server.server_close()
