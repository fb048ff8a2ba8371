"""The core walks of the API and socket suites on PostgreSQL + Redis with two Daphne processes,
each crossing from one process to the other: what a user does in one tab or request, another
process serves or sees."""

import asyncio
import threading

import pytest

from tests.client_tools import LOCATION, PICK
from tests.scale.client import events_of, is_invoke, is_turn_end, tab
from tests.scale.data import balance, first_pool, paid_call_paused

pytestmark = pytest.mark.asyncio

GRANTED = {"status": "GRANTED", "latitude": 48.137, "longitude": 11.575, "accuracy": 35}


async def test_a_turn_streamed_by_one_process_reaches_a_tab_on_the_other(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url)
    fake_llm.reply_text("There are trees, houses and pools here.", chunks=5)
    async with tab(b.url, scale_api, session) as watcher:
        out = await asyncio.to_thread(scale_api.say, a.url, session, "what is here?")
        frames = await watcher.until(is_turn_end)

    assert out.status == 200
    assert out.text == "There are trees, houses and pools here."
    assert events_of(frames) == out.names()
    assert [m["content"] for m in await asyncio.to_thread(scale_api.messages, b.url, session)] == [
        "what is here?",
        "There are trees, houses and pools here.",
    ]


async def test_an_approval_paused_on_one_process_is_approved_on_the_other(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session, approval = await asyncio.to_thread(
        paid_call_paused, cluster, scale_api, fake_llm, base=a.url, call_id="sim1"
    )
    assert approval["reasons"] == ["credits"]
    before = balance(cluster)

    fake_llm.reply_text("Here are the similar pools.")
    resumed = await asyncio.to_thread(
        scale_api.resume, b.url, session, {"approval": approval["id"], "decision": "approve"}
    )

    assert resumed.status == 200
    (call,) = resumed.of("backend_tool_call")
    assert (call["name"], call["ok"]) == ("similarity_search", True)
    assert resumed.message["content"] == "Here are the similar pools."
    assert balance(cluster) == before - approval["cost_credits"]


async def test_a_turn_on_one_process_calls_the_tool_of_a_tab_on_the_other(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url)
    fake_llm.reply_tool_calls([("loc1", "location_get", {})])
    fake_llm.reply_text("You are in Munich.")
    async with tab(b.url, scale_api, session, [LOCATION]) as holder:
        turn = asyncio.create_task(asyncio.to_thread(scale_api.say, a.url, session, "where am I?"))
        invoke = (await holder.until(is_invoke))[-1]
        assert invoke["name"] == "location_get"
        await holder.answer(invoke, GRANTED)
        out = await turn

    assert out.names()[-1] == "turn_end"
    assert out.message["content"] == "You are in Munich."
    fed = fake_llm.requests[1]["messages"][-1]
    assert fed["role"] == "tool" and '"GRANTED"' in fed["content"]


async def test_a_reader_answered_call_paused_on_one_process_is_answered_through_the_other(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url)
    fake_llm.reply_tool_calls([("pick1", "map_select", {"prompt": "Pick the pools"})])
    async with tab(a.url, scale_api, session, [PICK]):
        paused = await asyncio.to_thread(scale_api.say, b.url, session, "let me pick")
    decision = paused.message["pending_decision"]
    assert decision["name"] == "map_select"

    fake_llm.reply_text("You picked two.")
    resumed = await asyncio.to_thread(
        scale_api.resume,
        a.url,
        session,
        {"tool_call": decision["tool_call"], "result": {"ids": [1, 2]}},
    )

    assert resumed.message["content"] == "You picked two."
    assert fake_llm.requests[1]["messages"][-1]["content"] == '{"ids": [1, 2]}'


async def test_two_concurrent_resumes_on_two_processes_run_once_and_charge_once(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session, approval = await asyncio.to_thread(
        paid_call_paused, cluster, scale_api, fake_llm, base=a.url, call_id="race1"
    )
    before = balance(cluster)
    fake_llm.reply_text("Found them.")
    fake_llm.reply_text("A second answer nobody should ask for.")
    start = threading.Barrier(2)

    def approve(base: str):
        start.wait()
        return scale_api.resume(base, session, {"approval": approval["id"], "decision": "approve"})

    outs = await asyncio.gather(*(asyncio.to_thread(approve, d.url) for d in (a, b)))

    assert sorted(out.status for out in outs) == [200, 409]
    assert balance(cluster) == before - approval["cost_credits"]
    assert cluster.sql(
        "SELECT count(*) FROM chat_message WHERE session_id = %s AND role = 'tool'", (session,)
    ) == [(1,)]
    assert fake_llm.pending == 1  # the model was asked to continue once


async def test_a_deletion_through_one_process_is_seen_by_the_next_query_on_the_other(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    bbox = "/api/annotations?bbox=-180,-90,180,90"
    _, before = await asyncio.to_thread(scale_api.request, a.url, "GET", bbox)
    victim = first_pool(cluster)
    assert victim in {f["id"] for f in before["features"]}

    session = await asyncio.to_thread(scale_api.session_create, b.url, allow_backend_tools=True)
    fake_llm.reply_tool_calls([("del1", "delete_annotations", {"ids": [victim]})])
    paused = await asyncio.to_thread(scale_api.say, b.url, session, f"delete {victim}")
    fake_llm.reply_text("Deleted.")
    await asyncio.to_thread(
        scale_api.resume,
        b.url,
        session,
        {"approval": paused.message["pending_approval"]["id"], "decision": "approve"},
    )

    _, after = await asyncio.to_thread(scale_api.request, a.url, "GET", bbox)
    assert victim not in {f["id"] for f in after["features"]}
    assert len(after["features"]) == len(before["features"]) - 1
    cluster.sql("UPDATE annotations_annotation SET deleted_at = NULL WHERE id = %s", (victim,))


async def test_a_tab_idle_past_redis_client_timeouts_still_sees_the_next_turn(
    cluster, scale_api, fake_llm
):
    """redis-py 8 cuts socket reads at 5 s by default, which tears down idle consumers on
    channels_redis' core layer (channels_redis issue 422); the pub/sub layer never blocks on
    a read that long."""
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url)
    async with tab(b.url, scale_api, session) as watcher:
        await asyncio.sleep(6)
        fake_llm.reply_text("Still here.")
        out = await asyncio.to_thread(scale_api.say, a.url, session, "hello again")
        frames = await watcher.until(is_turn_end)

    assert out.message["content"] == "Still here."
    assert events_of(frames) == out.names()
