"""PostgreSQL as GeoSense uses it. What real servers, models and browsers send is stored as on
SQLite: call ids of thousands of characters, tool names no tool has, NUL characters (SQLite
accepts them all; PostgreSQL refused each one before its fix). And connections follow the
load: none stays open after the requests and turns that used it."""

import asyncio
import base64
import os

import pytest

from tests.chat.helpers import history_is_valid
from tests.client_tools import LOCATION
from tests.scale.client import is_invoke, tab
from tests.scale.data import balance, paid_call_paused, stored_history

pytestmark = pytest.mark.asyncio


def long_call_id() -> str:
    """A call id as LiteLLM sends for Gemini: the id with a thought signature glued on
    (4,572 characters were observed in the wild)."""
    signature = base64.b64encode(os.urandom(3400)).decode()
    return f"call_{os.urandom(16).hex()}__thought__{signature}"


async def test_call_ids_and_names_of_any_length_keep_the_session_working(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url, allow_backend_tools=True)
    first, second = long_call_id(), long_call_id()
    fake_llm.reply_tool_calls([(first, "list_classes", {}), (second, "x" * 300, {})])
    fake_llm.reply_text("Listed.")
    out = await asyncio.to_thread(scale_api.say, a.url, session, "classes?")
    assert out.names()[-1] == "turn_end" and "error" not in out.names()
    assert out.message["content"] == "Listed."

    fake_llm.reply_text("Again.")
    again = await asyncio.to_thread(scale_api.say, b.url, session, "and again")
    assert again.message["content"] == "Again."
    fed = fake_llm.requests[-1]["messages"]
    assert [
        c["id"] for m in fed if m["role"] == "assistant" for c in m.get("tool_calls") or []
    ] == [
        first,
        second,
    ]
    assert [m["tool_call_id"] for m in fed if m["role"] == "tool"] == [first, second]
    assert history_is_valid(stored_history(cluster, session))


async def test_a_paid_call_with_a_long_id_is_approved_and_charged_once(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    call_id = long_call_id()
    session, approval = await asyncio.to_thread(
        paid_call_paused, cluster, scale_api, fake_llm, base=a.url, call_id=call_id
    )
    before = balance(cluster)
    fake_llm.reply_text("Found.")
    resumed = await asyncio.to_thread(
        scale_api.resume, b.url, session, {"approval": approval["id"], "decision": "approve"}
    )
    assert resumed.message["content"] == "Found."
    assert balance(cluster) == before - approval["cost_credits"]
    assert cluster.sql(
        "SELECT count(*) FROM accounts_creditcharge WHERE tool_call_id = %s", (call_id,)
    ) == [(1,)]


async def test_nul_characters_from_a_user_a_model_and_a_page_are_stored(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url, allow_backend_tools=True)
    fake_llm.reply_tool_calls([("nul1", "location_get", {})], text="Let me\x00 look.")
    fake_llm.reply_text("Found\x00 you.")
    async with tab(b.url, scale_api, session, [LOCATION]) as holder:
        turn = asyncio.create_task(
            asyncio.to_thread(
                scale_api.stream,
                a.url,
                f"/api/sessions/{session}/message/stream",
                {
                    "text": "where\x00 am I?",
                    "contexts": [{"type": "position", "data": {"label\x00": "here\x00"}}],
                },
            )
        )
        invoke = (await holder.until(is_invoke))[-1]
        await holder.answer(invoke, {"status": "DECLINED", "message": "not\x00 now"})
        out = await turn

    assert out.status == 200 and "error" not in out.names()
    assert out.message["content"] == "Found\ufffd you."
    contents = [m["content"] for m in await asyncio.to_thread(scale_api.messages, b.url, session)]
    assert contents[0] == "where\ufffd am I?"
    ((data,),) = cluster.sql(
        "SELECT data FROM chat_artifact WHERE session_id = %s AND kind = 'position'", (session,)
    )
    assert data == {"label\ufffd": "here\ufffd"}


async def test_turns_and_requests_leave_no_database_connection_open(cluster, scale_api, fake_llm):
    """CONN_MAX_AGE = 0 (settings.py): a request's connection closes at its end, and a turn
    task's when the turn ends, so PostgreSQL's connections follow the load, not its history."""
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url, allow_backend_tools=True)
    for n in range(3):
        fake_llm.reply_tool_calls([(f"conn{n}", "list_classes", {})])
        fake_llm.reply_text("Listed.")
        out = await asyncio.to_thread(scale_api.say, (a, b)[n % 2].url, session, "classes?")
        assert out.message["content"] == "Listed."
        await asyncio.to_thread(scale_api.messages, (a, b)[n % 2].url, session)

    open_connections = "SELECT count(*) FROM pg_stat_activity WHERE datname = 'geosense' AND pid <> pg_backend_pid()"
    deadline = asyncio.get_running_loop().time() + 5
    while cluster.sql(open_connections) != [(0,)]:
        assert asyncio.get_running_loop().time() < deadline, cluster.sql(
            "SELECT application_name, state, query FROM pg_stat_activity WHERE datname = 'geosense'"
        )
        await asyncio.sleep(0.2)


async def test_the_turn_engine_s_statements_keep_their_compiled_plans(cluster, scale_api, fake_llm):
    """The engine's hot statements are compiled once per process (geosense/compiled.py), kept
    only when Django binds the parameters the plan would: a JSON parameter (psycopg's `Jsonb`,
    which has no equality of its own) kept the messages' insert and the repair's read on the
    ORM on PostgreSQL, each logged as staying there."""
    a, b = cluster.daphnes
    session = await asyncio.to_thread(scale_api.session_create, a.url, allow_backend_tools=True)
    for n in range(2):
        fake_llm.reply_tool_calls([(f"plan{n}", "list_classes", {})])
        fake_llm.reply_text("Listed.")
        out = await asyncio.to_thread(scale_api.say, (a, b)[n % 2].url, session, "classes?")
        assert out.message["content"] == "Listed."
    assert not any("stays on the ORM" in daphne.log() for daphne in cluster.daphnes)
    rows = cluster.sql(
        "SELECT role, turn, tool_calls FROM chat_message WHERE session_id = %s ORDER BY id",
        (session,),
    )
    assert [(role, turn) for role, turn, _ in rows] == [
        (role, turn) for turn in (1, 2) for role in ("user", "assistant", "tool", "assistant")
    ]
    assert rows[1][2][0]["name"] == "list_classes" and rows[2][2] == []
