"""Two Daphne processes sharing a Redis channel layer: a client-tool call made in one process
reaches the socket another process holds, and turn events reach sockets in both.

The first test runs the engine's side as a process of its own (`manage.py shell`); the second
starts a real turn over HTTP on the other Daphne (the local agent answers "where am I?" with
`location_get`). Either way the caller finds the socket in the database and reaches it only
through the channel layer.
"""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.daphne_server import SERVE

websockets = pytest.importorskip("websockets")

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.redis

if shutil.which("redis-server") is None and not os.environ.get("CI"):
    pytest.skip("redis-server is not installed", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


SETUP = """
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from geosense.accounts.services import api_token_create
user = get_user_model().objects.create_user("multi")
print(api_token_create(user=user), ChatSession.objects.create(user=user).pk)
"""

# The engine's side of a served blocking call, in a process of its own.
ENGINE = """
import asyncio, json
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from chat.events import session_group
from chat.selectors import client_toolset_of_session
from geosense import wire
from tools.client import client_tool_request

async def main():
    await get_channel_layer().group_send(
        session_group("{session}"),
        wire.turn_event_message(wire.turn_start(session="{session}", turn=1)),
    )
    toolset = await sync_to_async(client_toolset_of_session)(session_id="{session}")
    answer = await client_tool_request(
        channel_name=toolset.channel_name,
        tool=toolset.tools["location_get"],
        arguments={{}},
        timeout=10,
    )
    print(json.dumps({{"ok": answer.ok, "result": answer.result, "error": answer.error}}))

asyncio.run(main())
"""

LOCATION = {
    "kind": "blocking",
    "name": "location_get",
    "description": "The user's position.",
    "arguments": {"type": "object", "properties": {}},
    "result": {"type": "object", "required": ["status"]},
    "serve": True,
}


@pytest.fixture
def cluster(tmp_path) -> Iterator[dict]:
    """Redis, a migrated SQLite file, a user with a token and a session, two Daphnes."""
    processes: list[subprocess.Popen] = []
    try:
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        processes.append(redis)
        wait_for_port(redis_port, redis)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("GEOSENSE_", "DJANGO_"))
        }
        env.update(
            DEBUG="1",
            SECRET_KEY="x",
            DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
            REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            DJANGO_SETTINGS_MODULE="geosense.settings",
            GEOSENSE_AGENT="local",
            GEOSENSE_ENV_FILE="",  # a developer's .env is not the cluster's
        )
        manage(env, "migrate", "--noinput")
        token, session = manage(env, "shell", "-c", SETUP).strip().splitlines()[-1].split()
        ports = []
        for _ in range(2):
            port = free_port()
            daphne = subprocess.Popen(
                [
                    *SERVE,
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "geosense.asgi:application",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(tmp_path / f"daphne-{port}.log").open("w"),
            )
            processes.append(daphne)
            ports.append(port)
        for port, daphne in zip(ports, processes[1:], strict=True):
            wait_for_port(port, daphne)
        yield {"env": env, "token": token, "session": session, "ports": ports}
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


async def open_bound(cluster: dict, port: int):
    ws = await websockets.connect(
        f"ws://127.0.0.1:{port}/ws/chat/",
        additional_headers={"Authorization": f"Bearer {cluster['token']}"},
    )
    await ws.send(json.dumps({"type": "session-bind", "session": cluster["session"]}))
    assert json.loads(await ws.recv()) == {"type": "session-bound", "session": cluster["session"]}
    return ws


async def frame(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout=10))


@pytest.mark.asyncio
async def test_a_call_from_another_process_reaches_the_socket_and_comes_back(cluster):
    holder = await open_bound(cluster, cluster["ports"][0])
    watcher = await open_bound(cluster, cluster["ports"][1])
    try:
        await holder.send(json.dumps({"type": "client-tool-register", "tools": [LOCATION]}))
        assert await frame(holder) == {"type": "client-tool-registered", "tools": ["location_get"]}

        engine = await asyncio.create_subprocess_exec(
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            ENGINE.format(session=cluster["session"]),
            cwd=ROOT,
            env=cluster["env"],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for ws in (holder, watcher):
            assert await frame(ws) == {
                "type": "event",
                "event": "turn_start",
                "data": {"session": cluster["session"], "turn": 1},
            }
        invoke = await frame(holder)
        assert invoke["type"] == "client-tool-invoke"
        assert invoke["name"] == "location_get"
        result = {"status": "DECLINED", "message": "The user chose not to share."}
        await holder.send(
            json.dumps(
                {
                    "type": "client-tool-result",
                    "correlationId": invoke["correlationId"],
                    "result": result,
                }
            )
        )
        out, err = await asyncio.wait_for(engine.communicate(), timeout=30)
        assert engine.returncode == 0, err.decode()
        assert json.loads(out.decode().strip().splitlines()[-1]) == {
            "ok": True,
            "result": result,
            "error": None,
        }
    finally:
        await holder.close()
        await watcher.close()


def post_stream(port: int, path: str, body: dict, token: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


@pytest.mark.asyncio
async def test_a_turn_in_one_process_calls_the_tool_of_a_tab_held_by_the_other(cluster):
    holder = await open_bound(cluster, cluster["ports"][0])
    try:
        await holder.send(json.dumps({"type": "client-tool-register", "tools": [LOCATION]}))
        assert (await frame(holder))["type"] == "client-tool-registered"
        # The local agent answers "where am I?" by calling location_get.
        stream = asyncio.create_task(
            asyncio.to_thread(
                post_stream,
                cluster["ports"][1],
                f"/api/sessions/{cluster['session']}/message/stream",
                {"text": "where am I?"},
                cluster["token"],
            )
        )
        while (invoke := await frame(holder))["type"] != "client-tool-invoke":
            pass
        assert invoke["name"] == "location_get"
        result = {
            "status": "GRANTED",
            "latitude": 48.137,
            "longitude": 11.575,
            "accuracy": 35,
            "timestamp": 1764480000000,
        }
        await holder.send(
            json.dumps(
                {
                    "type": "client-tool-result",
                    "correlationId": invoke["correlationId"],
                    "result": result,
                }
            )
        )
        body = await asyncio.wait_for(stream, timeout=30)
        assert "event: client_tool_call" in body
        assert body.rstrip().endswith("data: {}")
        assert "event: message" in body
        assert "48.137" in body
    finally:
        await holder.close()
