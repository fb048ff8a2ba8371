"""Two Daphne processes sharing a Redis channel layer: a client-tool call made in one process
reaches the socket another process holds, and turn events reach sockets in both.

The engine side runs as its own process (`manage.py shell`), as a turn task in any process of
a scale-out deployment would: it finds the socket in the database and talks to it only through
the channel layer.
"""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
from chat.events import GROUP_TURN_EVENT, session_group
from tools.client import client_tool_request, client_toolset_of_session

async def main():
    await get_channel_layer().group_send(
        session_group("{session}"),
        {{"type": GROUP_TURN_EVENT, "event": "turn_start", "data": {{"session": "{session}"}}}},
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
        )
        manage(env, "migrate", "--noinput")
        token, session = manage(env, "shell", "-c", SETUP).strip().splitlines()[-1].split()
        ports = []
        for _ in range(2):
            port = free_port()
            daphne = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daphne",
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
                "data": {"session": cluster["session"]},
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
