"""The model server failing or slow (issue 15, items 1, 2 and 7): a model that never answers
ends the turn at the first-byte time-out with one request, a stall mid-stream ends it at the
between-chunk time-out with the text already shown kept (cut off), and every turn of a process
shares one client."""

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiohttp import web

from chat.agents import AgentContext, AgentError, agent_configured, agents_close
from chat.agents import openai as openai_agent_module
from chat.models import ChatSession, Message
from tests.chat.costs import python_calls, python_calls_of
from tests.chat.helpers import post_stream
from tests.fakes.fake_openai import Pause, Text

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_a_model_that_never_answers_ends_the_turn_at_the_first_byte_timeout_once(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = 1.5
    for _ in range(3):  # what retries would take
        openai_agent.reply(Pause(6), Text("too late"))

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.of("error") == [
        {
            "message": "The assistant could not answer. "
            "The language model server did not answer in time."
        }
    ]
    assert out.names()[-1] == "turn_end"
    assert len(openai_agent.requests) == 1  # the deadline covers the retries
    session = await ChatSession.objects.aget(pk=trusted_caller.session.pk)
    assert session.turn_state == ChatSession.TurnState.IDLE


async def test_a_stall_mid_stream_ends_the_turn_and_keeps_the_text_shown_cut_off(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_LLM_CHUNK_TIMEOUT = 0.5
    settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = 30
    openai_agent.reply(Text("There are twelve", 1), Pause(3), Text(" trees."))

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.text == "There are twelve"
    assert out.of("error") == [
        {
            "message": "The assistant could not answer. The language model server stopped "
            "answering mid-way (nothing for 0.5 s)."
        }
    ]
    assert out.names()[-1] == "turn_end"
    assert len(openai_agent.requests) == 1  # never retried once the answer had begun
    kept = [
        (m.content, m.cut_off)
        async for m in Message.objects.filter(
            session=trusted_caller.session, role=Message.Role.ASSISTANT
        )
    ]
    assert kept == [("There are twelve", True)]


async def test_a_pause_mid_stream_longer_than_the_first_byte_timeout_is_waited_out(
    client, trusted_caller, openai_agent, settings
):
    """Each time-out holds on its own: the between-chunk one (3 s) governs a pause mid-stream
    even when the first-byte one (1 s) is the smaller."""
    settings.GEOSENSE_LLM_CHUNK_TIMEOUT = 3
    settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = 1
    openai_agent.reply(Text("There are twelve", 1), Pause(1.6), Text(" trees."))

    out = await post_stream(
        client, trusted_caller.url("/message/stream"), {"text": "hi"}, token=trusted_caller.token
    )

    assert out.of("error") == []
    assert out.text == "There are twelve trees."


async def test_turns_share_one_client_and_every_body_is_serialised_on_the_loop(
    client, trusted_caller, openai_agent, monkeypatch
):
    """One client serves every turn; a body is serialised on the loop however long the
    conversation (the history window's budget bounds it): orjson holds the GIL, so the worker
    thread it went to held the loop up as long, and its hop cost the loop ~60 Python calls more
    a request (issue 15)."""
    builds: list[str] = []
    bodies: list[str] = []
    build, serialise = openai_agent_module._client_build, openai_agent_module.request_json

    def counted_build(config):
        builds.append(threading.current_thread().name)
        return build(config)

    def counted_serialise(config, **kwargs):
        bodies.append(threading.current_thread().name)
        return serialise(config, **kwargs)

    monkeypatch.setattr(openai_agent_module, "_client_build", counted_build)
    monkeypatch.setattr(openai_agent_module, "request_json", counted_serialise)
    await openai_agent_module.provider_clients_close()  # whatever an earlier test built
    main = threading.current_thread().name
    outs = await _three_turns(client, trusted_caller, openai_agent)
    assert [out.text for out in outs] == ["Answer one.", "Answer two.", "Answer three."]
    assert len(builds) == 1
    assert bodies == [main] * 3

    many = [{"role": "user", "content": "hi"}] * 200
    await _answer(agent_configured(), history=many)
    assert openai_agent.requests[-1]["messages"] == many
    assert bodies == [main] * 4

    # What makes it right: the body is one C call (orjson, holding the GIL) whatever the window
    # holds, its Python calls the same for 4,000 messages or 200 pictures as for one message.
    config = agent_configured().config
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}
    windows = {
        "one message": [{"role": "user", "content": "hi"}],
        "4,000 messages": [{"role": "user", "content": "x" * 200}] * 4000,
        "200 pictures": [{"role": "user", "content": [{"type": "text", "text": "a"}, picture]}]
        * 200,
    }
    calls = {
        name: python_calls_of(serialise, config, history=history, tools=[])
        for name, history in windows.items()
    }
    assert set(calls.values()) == {calls["one message"]} and calls["one message"] <= 3, calls

    shared = openai_agent_module.provider_client(
        openai_agent_module.ProviderConfig(base_url=openai_agent.base_url)
    )
    await openai_agent_module.provider_clients_close()
    assert shared.session.closed


async def test_turns_reuse_the_model_server_connection(
    client, trusted_caller, openai_agent, monkeypatch
):
    """A streamed answer is read to its end after `[DONE]`, so its connection goes back to the
    pool: closed mid-body, every request opened a new connection (with TLS, a handshake)."""
    from tests.fakes import fake_openai

    connections: list[int] = []
    setup = fake_openai._Handler.setup

    def counted(handler):
        connections.append(1)
        return setup(handler)

    monkeypatch.setattr(fake_openai._Handler, "setup", counted)
    await openai_agent_module.provider_clients_close()  # whatever an earlier test built
    openai_agent.reply_tool_calls([("c1", "list_classes", {})])
    outs = await _three_turns(client, trusted_caller, openai_agent)
    assert all(out.names()[-1] == "turn_end" for out in outs)

    assert len(openai_agent.requests) == 4
    assert len(connections) == 1
    await openai_agent_module.provider_clients_close()


async def test_a_model_request_costs_the_same_however_many_connections_the_pool_keeps(
    openai_agent,
):
    """httpx's pool (httpcore) looked at every kept connection on every request, a
    `getpeername` and two dicts each: with 100 requests in flight a request cost 2.2 ms of CPU,
    0.95 ms on aiohttp's pool (issue 15, docs/benchmarks.md). Counted in Python calls, the same
    request with 2 and with 120 connections kept: httpcore's ~50 calls per kept connection
    would add ~6,000; how the answer's bytes happen to arrive (one read or several) moves a
    reading by up to ~200."""
    agent = agent_configured()

    async def calls_of_one_request() -> int:
        return await python_calls(_answer(agent))

    async def connections_kept(n: int) -> None:
        """`n` requests at once, opened ten at a time (the fake's listen backlog is 5)."""
        for _ in range(n):
            openai_agent.reply(Pause(2), Text("held"))
        answers = []
        for opened in range(0, n, 10):
            answers += [asyncio.ensure_future(_answer(agent)) for _ in range(min(10, n - opened))]
            await asyncio.sleep(0.05)
        await asyncio.gather(*answers)

    # The least of five: the profile counts every call of the thread while the request waits
    # (a loaded machine adds loop rounds, so one reading can be high by chance).
    await connections_kept(2)
    with_two = min([await calls_of_one_request() for _ in range(5)])
    await connections_kept(120)
    with_many = min([await calls_of_one_request() for _ in range(5)])

    assert with_many < with_two + 250, (with_two, with_many)


async def test_a_streamed_request_costs_the_loop_a_few_hundredpython_calls(openai_agent):
    """The openai SDK's request building (its options models, httpx's request, header and URL
    objects, its transport adapter and decoding layers) took ~1,700 Python calls a request;
    aiohttp alone with the agent's own SSE framing takes ~320 (issue 15: the loop's CPU
    is a process's ceiling). The least of five, as above."""
    agent = agent_configured()
    await _answer(agent)  # the connection, the client: what every later request finds

    calls = min([await python_calls(_answer(agent)) for _ in range(5)])

    assert calls < 450, calls


# --- retries, as the openai SDK made them, on a server scripted per request -----------------
@dataclass
class ScriptedServer:
    """A model server on the test's loop: each request takes the next of `answers` (aiohttp
    handlers); `times` holds when each request arrived (the loop's clock)."""

    answers: list[Callable[[], web.StreamResponse]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.times.append(asyncio.get_running_loop().time())
        await request.read()
        return self.answers.pop(0)()


@pytest_asyncio.fixture
async def scripted_server(openai_agent, settings) -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    settings.GEOSENSE_LLM_BASE_URL = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield server
    await agents_close()
    await runner.cleanup()


def _error(status: int, message: str, **headers: str) -> Callable[[], web.StreamResponse]:
    body = {"error": {"message": message, "type": "server_error"}}
    return lambda: web.json_response(body, status=status, headers=headers)


def _streamed(text: str) -> Callable[[], web.StreamResponse]:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    return lambda: web.Response(body=body, content_type="text/event-stream")


@pytest.mark.parametrize(
    "wait",
    [{"Retry-After": "0.6"}, {"retry-after-ms": "600"}],
    ids=["retry-after", "retry-after-ms"],
)
async def test_a_rate_limit_is_tried_again_after_the_wait_the_server_asks(scripted_server, wait):
    scripted_server.answers += [_error(429, "Rate limit reached", **wait), _streamed("Hello.")]

    assert await _answer(agent_configured()) == "Hello."

    first, second = scripted_server.times
    assert second - first >= 0.6  # the backoff alone would be 0.375-0.5 s


async def test_a_wait_that_would_end_past_the_first_byte_deadline_is_not_begun(
    scripted_server, settings
):
    """The server's own words at once, rather than "did not answer in time" 2 s later (the
    SDK slept the 30 s and the deadline cut it)."""
    settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT = 2
    scripted_server.answers += [_error(429, "Rate limit reached", **{"Retry-After": "30"})]
    started = asyncio.get_running_loop().time()

    with pytest.raises(AgentError) as caught:
        await _answer(agent_configured())

    assert str(caught.value) == "The language model server answered HTTP 429. Rate limit reached"
    assert asyncio.get_running_loop().time() - started < 1
    assert len(scripted_server.times) == 1


@pytest.mark.parametrize(
    ("answer", "requests"),
    [
        (_error(409, "locked"), 2),
        (_error(408, "request timeout"), 2),
        (_error(503, "overloaded"), 2),
        (_error(503, "overloaded", **{"x-should-retry": "false"}), 1),
        (_error(400, "bad request", **{"x-should-retry": "true"}), 2),
        (_error(400, "bad request"), 1),
        (_error(429, "slow down", **{"Retry-After": "121"}), 1),
    ],
    ids=["409", "408", "503", "503-told-not-to", "400-told-to", "400", "429-past-2-minutes"],
)
async def test_which_answers_are_tried_again(scripted_server, answer, requests, monkeypatch):
    monkeypatch.setattr(openai_agent_module, "RETRY_DELAY_SECONDS", 0.01)
    scripted_server.answers += [answer, _streamed("Hello.")]

    try:
        await _answer(agent_configured())
    except AgentError:
        pass

    assert len(scripted_server.times) == requests


async def test_retries_back_off_exponentially_with_jitter(scripted_server):
    scripted_server.answers += [_error(500, "boom"), _error(502, "boom"), _streamed("Hello.")]

    assert await _answer(agent_configured()) == "Hello."

    first, second, third = scripted_server.times
    assert 0.375 <= second - first < 0.6  # 0.5 s less up to a quarter
    assert 0.75 <= third - second < 1.1  # doubled


async def _answer(agent, *, history=None) -> str:
    text = ""
    history = history or [{"role": "user", "content": "hi"}]
    async for item in agent.stream(history=history, tools=[], context=AgentContext()):
        text += getattr(item, "text", "")
    return text


async def _three_turns(client, caller, openai_agent) -> list:
    """Three messages, one after the other, each answered by the fake with "Answer <text>."."""
    outs = []
    for text in ("one", "two", "three"):
        openai_agent.reply_text(f"Answer {text}.")
        url = caller.url("/message/stream")
        outs.append(await post_stream(client, url, {"text": text}, token=caller.token))
    return outs
