"""chat.agents.openai: every recorded dialect through the real agent and the turn engine, and the
provider settings as the server receives them."""

import json
import socket

import aiohttp
import pytest

from chat.agents import AgentContext, TextDelta, agent_configured
from chat.agents.openai import ProviderConfig, chat_request, provider_client
from chat.agents.prompts import system_prompt
from chat.models import Message
from tests.chat.helpers import post_stream
from tests.fakes.dialects import ANSWER_TEXT, ANSWERS, RECORDINGS, recording
from tests.fakes.fake_openai import Raw
from tools.registry import backend_tools

ASKED = "what is here?"
RESULTS = {
    "list_classes": {"counts": {}, "total": 0},
    "measure": {"error": "There is no annotation #7."},
}


def stored(session) -> list[tuple]:
    return [
        (m.role, m.content, m.tool_calls or [], m.tool_call_id or "")
        for m in Message.objects.filter(session=session).order_by("id")
    ]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("played", RECORDINGS, ids=lambda r: r.id)
async def test_every_dialect_plays_through_the_agent_and_the_engine(
    client, trusted_caller, openai_agent, played
):
    openai_agent.reply(Raw(played.wire))
    answer = recording(played.dialect, ANSWERS[played.dialect])
    if played.calls:
        openai_agent.reply(Raw(answer.wire))

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": ASKED}, token=trusted_caller.token
    )

    assert out.status == 200
    assert out.names()[0] == "turn_start" and out.names()[-1] == "turn_end"
    history = await _stored(trusted_caller.session)
    if played.error:
        said = (
            "The assistant could not answer. "
            f"The language model server reported an error: {played.error}"
        )
        assert out.of("error") == [{"message": said}]
        # What the person already saw stays, cut off (issue 15): only a stream that failed
        # before its first word stores no answer.
        kept = [("assistant", out.text, [], "")] if out.text else []
        assert history == [("user", ASKED, [], ""), *kept, ("note", said, [], "")]
        cut_off = Message.objects.filter(session=trusted_caller.session, role="assistant")
        assert [m.cut_off async for m in cut_off] == [True] * len(kept)
        return

    thinking = [e["text"] for e in out.of("backend_thinking")]
    for thought in played.thinking + (answer.thinking if played.calls else ()):
        assert thought in thinking
        assert thought not in out.text and thought not in out.message["content"]
    calls = [{"id": i, "name": n, "arguments": a} for i, n, a in played.calls]
    if not played.calls:
        assert out.text == played.text == out.message["content"]
        assert history == [("user", ASKED, [], ""), ("assistant", played.text, [], "")]
        assert len(openai_agent.requests) == 1
        return

    assert [(e["call_id"], e["name"]) for e in out.of("backend_tool_call")] == [
        (c["id"], c["name"]) for c in calls
    ]
    assert out.message["content"] == answer.text == ANSWER_TEXT
    results = [json.dumps(RESULTS[c["name"]], ensure_ascii=False) for c in calls]
    assert history == [
        ("user", ASKED, [], ""),
        ("assistant", played.text, calls, ""),
        *[("tool", result, [], c["id"]) for c, result in zip(calls, results, strict=True)],
        ("assistant", ANSWER_TEXT, [], ""),
    ]
    first, second = openai_agent.requests
    assert second == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": system_prompt(overview={})},
            {"role": "user", "content": ASKED},
            {
                "role": "assistant",
                "content": played.text or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            },
            *[
                {"role": "tool", "tool_call_id": c["id"], "content": result}
                for c, result in zip(calls, results, strict=True)
            ],
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": first["tools"],
    }
    assert [t["function"]["name"] for t in first["tools"]] == [t.name for t in backend_tools()]


async def _stored(session):
    from asgiref.sync import sync_to_async

    return await sync_to_async(stored)(session)


# --- the request ------------------------------------------------------------------------------
HISTORY = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "measure", "parameters": {}}}]
LATER = [*HISTORY, {"role": "assistant", "content": None}, {"role": "tool", "content": "{}"}]


def test_a_plain_configuration_sends_only_what_every_server_understands():
    body = chat_request(ProviderConfig(base_url="x", model="m"), history=HISTORY, tools=TOOLS)
    assert body == {
        "model": "m",
        "messages": HISTORY,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": TOOLS,
    }


def test_temperature_and_max_tokens_are_sent_when_set():
    config = ProviderConfig(base_url="x", model="m", temperature=0.2, max_tokens=512)
    body = chat_request(config, history=HISTORY, tools=[])
    assert body["temperature"] == 0.2 and body["max_tokens"] == 512
    assert "tools" not in body and "tool_choice" not in body


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_auto_and_none_tool_choice_apply_to_every_step(mode):
    config = ProviderConfig(base_url="x", tool_choice=mode)
    assert chat_request(config, history=HISTORY, tools=TOOLS)["tool_choice"] == mode
    assert chat_request(config, history=LATER, tools=TOOLS)["tool_choice"] == mode


def test_required_tool_choice_applies_to_the_first_step_only():
    config = ProviderConfig(base_url="x", tool_choice="required")
    assert chat_request(config, history=HISTORY, tools=TOOLS)["tool_choice"] == "required"
    assert "tool_choice" not in chat_request(config, history=LATER, tools=TOOLS)


def test_a_named_tool_choice_forces_that_tool_on_the_first_step():
    config = ProviderConfig(base_url="x", tool_choice="measure")
    assert chat_request(config, history=HISTORY, tools=TOOLS)["tool_choice"] == {
        "type": "function",
        "function": {"name": "measure"},
    }
    assert "tool_choice" not in chat_request(config, history=LATER, tools=TOOLS)
    other = ProviderConfig(base_url="x", tool_choice="teleport")
    assert "tool_choice" not in chat_request(other, history=HISTORY, tools=TOOLS)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_settings_reach_the_server_as_headers_and_body_fields(
    client, trusted_caller, openai_agent, settings, fake_llm
):
    settings.GEOSENSE_LLM_HEADERS = {"X-Tenant": "geo", "api-key": "k-123"}
    settings.GEOSENSE_LLM_TEMPERATURE = 0.3
    settings.GEOSENSE_LLM_MAX_TOKENS = 700
    settings.GEOSENSE_LLM_TOOL_CHOICE = "auto"
    openai_agent.reply_text("Hi.")

    await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    (body,) = fake_llm.requests
    assert (body["temperature"], body["max_tokens"], body["tool_choice"]) == (0.3, 700, "auto")
    (headers,) = fake_llm.headers
    assert headers["x-tenant"] == "geo" and headers["api-key"] == "k-123"
    assert headers["authorization"] == "Bearer not-needed"  # no key: the placeholder
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("GeoSense aiohttp/")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_key_goes_as_a_bearer_token_unless_a_header_of_that_name_replaces_it(
    openai_agent, settings, fake_llm
):
    settings.GEOSENSE_LLM_API_KEY = "sk-123"
    await _answer()
    settings.GEOSENSE_LLM_HEADERS = {"authorization": "Token abc"}
    await _answer()

    assert [h["authorization"] for h in fake_llm.headers] == ["Bearer sk-123", "Token abc"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_line_longer_than_64_kib_arrives_whole(openai_agent):
    """aiohttp's `readline` stops at 64 KiB; a model may send a tool call's arguments, or a
    long answer, in one event."""
    long = "x" * 300_000
    chunk = {"choices": [{"index": 0, "delta": {"content": long}, "finish_reason": "stop"}]}
    openai_agent.reply(Raw(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()))

    assert await _answer() == long


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("end", [b"\r\n", b"\r"], ids=["crlf", "cr"])
async def test_lines_may_end_with_crlf_or_cr(openai_agent, end):
    events = [
        {"choices": [{"index": 0, "delta": {"content": "Two "}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "lines."}, "finish_reason": "stop"}]},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + end + end for e in events)
    openai_agent.reply(Raw(body + b"data: [DONE]" + end + end))

    assert await _answer() == "Two lines."


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_body_is_read_without_asking_for_bytes_not_there(openai_agent, monkeypatch):
    """A read that finds nothing buffered is four of aiohttp's Python calls for nothing: the
    reader waits at once when its count of the body's bytes says nothing is buffered, and the
    body's end is not asked for once `at_eof` says it came (issue 15). Pieces arriving
    apart (a pause between them) and together, as a model streams them."""
    from tests.fakes.fake_openai import Pause, Text

    reads: list[int] = []
    read_nowait = aiohttp.StreamReader.read_nowait

    def counted(stream, *args):
        data = read_nowait(stream, *args)
        reads.append(len(data))
        return data

    monkeypatch.setattr(aiohttp.StreamReader, "read_nowait", counted)
    openai_agent.reply(Text("Hello there.", chunks=3))
    openai_agent.reply(Text("Hello", chunks=2), Pause(0.2), Text(" again.", chunks=2))

    assert await _answer() == "Hello there."
    assert await _answer() == "Hello again."
    assert 0 not in reads


class _CountedHeaders(dict):
    """Configured headers that count how often they are read."""

    reads = 0

    def items(self):
        self.reads += 1
        return super().items()


@pytest.mark.asyncio
async def test_a_configurations_client_is_found_without_reading_its_settings_again():
    """`provider_client` runs at every model request: the configuration's key (its headers
    sorted) is made once, not per request (issue 15)."""
    headers = _CountedHeaders(b="2", a="1")
    config = ProviderConfig(base_url="http://127.0.0.1:9/v1", headers=headers)
    client = provider_client(config)
    built = headers.reads
    try:
        assert all(provider_client(config) is client for _ in range(3))
        assert headers.reads == built
    finally:
        await client.session.close()


async def _answer() -> str:
    agent = agent_configured()
    history = [{"role": "user", "content": "hi"}]
    items = [item async for item in agent.stream(history=history, tools=[], context=AgentContext())]
    return "".join(item.text for item in items if isinstance(item, TextDelta))


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_request_timeout_setting_ends_a_silent_server_with_a_readable_error(
    client, trusted_caller, openai_agent, settings
):
    from tests.fakes.fake_openai import Pause, Text

    settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = 1.0
    for _ in range(3):  # a retry would take the next
        openai_agent.reply(Pause(2.5), Text("too late"))

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.of("error") == [
        {
            "message": "The assistant could not answer. "
            "The language model server did not answer in time."
        }
    ]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_server_that_refuses_the_connection_is_a_broken_stream_not_a_timeout(
    client, trusted_caller, openai_agent, settings, monkeypatch
):
    """A refused connection is not a time-out (the SDK's aiohttp transport reported it as a
    connect time-out); the user is told the connection broke, as with every failed connection."""
    from chat.agents import openai as openai_agent_module

    monkeypatch.setattr(openai_agent_module, "MAX_RETRIES", 0)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        settings.GEOSENSE_LLM_BASE_URL = f"http://127.0.0.1:{unused.getsockname()[1]}/v1"

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.of("error") == [
        {
            "message": "The assistant could not answer. "
            "The language model stream broke off (APIConnectionError)."
        }
    ]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_http_error_keeps_the_servers_explanation(client, trusted_caller, openai_agent):
    openai_agent.fail(400, message="max_tokens must be at most 4096")

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.of("error") == [
        {
            "message": "The assistant could not answer. The language model server answered "
            "HTTP 400. max_tokens must be at most 4096"
        }
    ]


def test_the_proxy_the_environment_names_is_used_unless_no_proxy_covers_the_host(monkeypatch):
    """As httpx read the environment for the SDK; looked up once per client, not per request."""
    from chat.agents.openai import _environment_proxy

    for name in ("HTTP_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "llm.internal")

    assert _environment_proxy("https://api.openai.com/v1") == "http://proxy.example:3128"
    assert _environment_proxy("https://llm.internal/v1") is None
    assert _environment_proxy("http://127.0.0.1:8080/v1") is None  # no HTTP_PROXY
    monkeypatch.setenv("ALL_PROXY", "http://proxy.example:8888")  # what httpx read last
    assert _environment_proxy("http://127.0.0.1:8080/v1") == "http://proxy.example:8888"
    assert _environment_proxy("https://api.openai.com/v1") == "http://proxy.example:3128"


def test_a_tool_schema_number_past_64_bits_is_written_not_refused():
    """A client tool's schema may hold any JSON number; orjson refuses integers past 64 bits,
    and every turn of the session failed while the socket offered that tool."""
    from chat.agents.openai import ProviderConfig, request_json

    tool = {"type": "function", "function": {"name": "t", "parameters": {"maximum": 10**24}}}
    body = request_json(
        ProviderConfig(base_url="http://x"),
        history=[{"role": "user", "content": "é"}],
        tools=[tool],
    )
    assert json.loads(body)["tools"][0]["function"]["parameters"]["maximum"] == 10**24
    assert json.loads(body)["messages"][0]["content"] == "é"


def test_the_key_and_headers_stay_out_of_a_configurations_repr():
    from chat.agents.openai import ProviderConfig

    config = ProviderConfig(base_url="http://x", api_key="sk-secret", headers={"api-key": "k2"})
    assert "sk-secret" not in repr(config) and "k2" not in repr(config)


def test_retry_after_infinity_is_not_retried_and_nan_gives_way_to_the_other_header():
    from chat.agents.openai import StatusError, _retry_after, _should_retry

    assert not _should_retry(StatusError(429, None, {"retry-after": "inf"}))
    assert _retry_after({"retry-after-ms": "nan", "retry-after": "2"}) == 2.0
    assert _should_retry(StatusError(429, None, {"retry-after": "1"}))


def test_the_configuration_is_read_from_the_settings_once_until_a_setting_changes(settings):
    """Built at every turn, the configuration's eleven settings cost ~30 Python calls a turn on
    the event loop; it is kept, and a changed setting (here the test's) is read anew."""
    settings.GEOSENSE_AGENT = "openai"
    settings.GEOSENSE_LLM_BASE_URL = "http://127.0.0.1:9/v1"
    first = agent_configured().config

    assert agent_configured().config is first
    settings.GEOSENSE_LLM_MODEL = "another-model"
    assert agent_configured().config.model == "another-model"
    settings.GEOSENSE_LLM_HEADERS = {"X-Team": "maps"}
    assert dict(agent_configured().config.headers) == {"X-Team": "maps"}
