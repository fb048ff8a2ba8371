"""A Daphne process killed with SIGKILL in the middle of a turn: nothing it stored is lost, its
claim on the session runs out with the lease (GEOSENSE_TURN_LEASE, 8 s here, 120 s by
default), and a turn it paused earlier is resumed through the other process."""

import asyncio
import signal
import time

import pytest

from tests.chat.helpers import history_is_valid
from tests.fakes.fake_openai import Pause, Text
from tests.scale.client import tab
from tests.scale.conftest import TURN_LEASE_SECONDS
from tests.scale.data import paid_call_paused, stored_history

pytestmark = pytest.mark.asyncio

STALL_SECONDS = 60


async def test_a_process_killed_mid_turn_loses_nothing_and_frees_the_session_within_the_lease(
    cluster, scale_api, fake_llm
):
    a, b = cluster.daphnes
    # A turn A paused earlier, waiting for its approval.
    paused_session, approval = await asyncio.to_thread(
        paid_call_paused, cluster, scale_api, fake_llm, base=a.url, call_id="paid1"
    )

    # A turn running on A: one call answered and stored, then the model stalls mid-answer.
    session = await asyncio.to_thread(scale_api.session_create, a.url, allow_backend_tools=True)
    fake_llm.reply_tool_calls([("classes1", "list_classes", {})])
    fake_llm.reply(Text("Counting the"), Pause(STALL_SECONDS))
    async with tab(b.url, scale_api, session) as watcher:
        stream = asyncio.create_task(asyncio.to_thread(scale_api.say, a.url, session, "count"))
        await watcher.until(lambda f: f.get("event") == "text_delta")
        a.kill(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 - the connection dies with the process
            await stream

    busy = await asyncio.to_thread(scale_api.say, b.url, session, "hello?")
    assert busy.status == 409
    fake_llm.reply_text("Found the similar pools.")
    resumed = await asyncio.to_thread(
        scale_api.resume, b.url, paused_session, {"approval": approval["id"], "decision": "approve"}
    )
    assert resumed.message["content"] == "Found the similar pools."

    fake_llm.reply_text("Three classes.")
    while (out := await asyncio.to_thread(scale_api.say, b.url, session, "count")).status == 409:
        assert time.monotonic() - killed < TURN_LEASE_SECONDS + 2
        await asyncio.sleep(0.25)
    assert out.message["content"] == "Three classes."

    messages = await asyncio.to_thread(scale_api.messages, b.url, session)
    assert [(m["role"], m["content"]) for m in messages if m["role"] != "tool"][:2] == [
        ("user", "count"),
        ("assistant", ""),
    ]
    assert [m["tool_calls"][0]["name"] for m in messages if m.get("tool_calls")] == ["list_classes"]
    assert history_is_valid(stored_history(cluster, session))
