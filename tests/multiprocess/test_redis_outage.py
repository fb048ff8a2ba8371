"""Redis stopped under a running Daphne, then started again (chat/outage.py): open sockets are
told (closed with 4503, so the page reads the stored transcript and reconnects), new sockets
are refused with the same code instead of an HTTP 500 on the upgrade, the log says it once,
and sockets work again as soon as Redis is back."""

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.browser.daphne_server import free_port, manage, server_env, start_server

websockets = pytest.importorskip("websockets")

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

if shutil.which("redis-server") is None and not os.environ.get("CI"):
    pytest.skip("redis-server is not installed", allow_module_level=True)

SETUP = """
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from geosense.accounts.services import api_token_create
user = get_user_model().objects.create_user("outage")
print(api_token_create(user=user), ChatSession.objects.create(user=user).pk)
"""
LIVE_LOST = 4503


def redis_start(port: int) -> subprocess.Popen:
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    return redis


async def redis_ready(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError("redis-server did not start")


async def bound(url: str, token: str, session: str):
    ws = await websockets.connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10
    )
    await ws.send(json.dumps({"type": "session-bind", "session": session}))
    return ws, json.loads(await asyncio.wait_for(ws.recv(), timeout=10))


async def closed_with(ws) -> int:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:  # the close arrives a probe interval after the outage at most
            await asyncio.wait_for(ws.recv(), timeout=20)
    return closed.value.rcvd.code


async def test_a_redis_outage_closes_and_refuses_sockets_cleanly_and_recovery_is_quick(
    tmp_path: Path,
):
    redis_port = free_port()
    redis = redis_start(redis_port)
    server = None
    try:
        await redis_ready(redis_port)
        db = tmp_path / "db.sqlite3"
        env = server_env(db_path=db)
        await asyncio.to_thread(manage, "migrate", "--noinput", env=env)
        server = start_server(
            db_path=db,
            log_path=tmp_path / "daphne.log",
            extra_env={"REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"},
        )
        token, session = server.shell(SETUP).split()[-2:]
        url = f"ws://127.0.0.1:{server.port}/ws/chat/"
        ws, frame = await bound(url, token, session)
        assert frame["type"] == "session-bound"

        redis.terminate()
        redis.wait(timeout=10)
        assert await closed_with(ws) == LIVE_LOST

        # A new socket is accepted and closed with the code the page reads: no HTTP 500.
        refused = await websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10
        )
        assert await closed_with(refused) == LIVE_LOST

        redis = redis_start(redis_port)
        await redis_ready(redis_port)
        for _ in range(100):
            try:
                ws, frame = await bound(url, token, session)
            except websockets.ConnectionClosed:
                await asyncio.sleep(0.2)
                continue
            break
        assert frame == {"type": "session-bound", "session": session}
        await ws.close()

        log = server.log()
        assert log.count("The channel layer failed") == 1, log
        assert "Traceback" not in log, log
        assert "The channel layer answers again" in log
    finally:
        if server is not None:
            server.stop()
        if redis.poll() is None:
            redis.terminate()
            redis.wait(timeout=10)
