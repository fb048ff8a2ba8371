"""The model server failing or slow (issue 15, items 1, 2 and 7): a model that never answers
ends the turn at the first-byte time-out with one request, a stall mid-stream ends it at the
between-chunk time-out with the text already shown kept (cut off), and every turn of a process
shares one client built off the event loop, with its body serialised off the loop too."""

import asyncio
import sys
import threading

import pytest

from chat.agents import AgentContext, agent_configured
from chat.agents import openai as openai_agent_module
from chat.models import ChatSession, Message
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


async def test_turns_share_one_client_built_off_the_loop_and_send_a_body_serialised_off_it(
    client, trusted_caller, openai_agent, monkeypatch
):
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

    assert len(builds) == 1 and builds[0] != main
    assert len(bodies) == 3 and main not in bodies
    shared = await openai_agent_module.provider_client(
        openai_agent_module.ProviderConfig(base_url=openai_agent.base_url)
    )
    await openai_agent_module.provider_clients_close()
    assert shared.is_closed()


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
    request with 2 and with 40 connections kept."""
    agent = agent_configured()

    async def answer() -> None:
        async for _ in agent.stream(
            history=[{"role": "user", "content": "hi"}], tools=[], context=AgentContext()
        ):
            pass

    async def calls_of_one_request() -> int:
        calls = 0

        def count(frame, event, arg):
            nonlocal calls
            calls += event == "call"

        sys.setprofile(count)
        try:
            await answer()
        finally:
            sys.setprofile(None)
        return calls

    async def connections_kept(n: int) -> None:
        for _ in range(n):
            openai_agent.reply(Pause(0.3), Text("held"))
        await asyncio.gather(*(answer() for _ in range(n)))

    # The least of five: the profile counts every call of the thread while the request waits
    # (a loaded machine adds loop rounds, so one reading can be high by chance).
    await connections_kept(2)
    with_two = min([await calls_of_one_request() for _ in range(5)])
    await connections_kept(40)
    with_forty = min([await calls_of_one_request() for _ in range(5)])

    assert with_forty < with_two + 40, (with_two, with_forty)


async def _three_turns(client, caller, openai_agent) -> list:
    """Three messages, one after the other, each answered by the fake with "Answer <text>."."""
    outs = []
    for text in ("one", "two", "three"):
        openai_agent.reply_text(f"Answer {text}.")
        url = caller.url("/message/stream")
        outs.append(await post_stream(client, url, {"text": text}, token=caller.token))
    return outs
