"""Client-tool round trip against a raw WebSocket echo, on one Daphne server in one run.

    .venv/bin/python bench/client_tools.py [--calls 2000] [--redis redis://127.0.0.1:6379/0]

Setup, chosen so that both figures cross the same server and the same socket:
- This process runs Daphne in-process (the real `geosense.asgi.application`, a temporary SQLite
  file) and, on Daphne's own event loop, the engine's side of a call: `client_tool_request`,
  exactly as the turn engine calls it.
- A second process plays the page: a `websockets` client that binds a session, registers one
  served blocking tool and answers every `client-tool-invoke` at once with its arguments.
- Raw echo: the page sends a frame the consumer answers by itself (a `client-tool-result` for
  an unknown correlation id → the `error` frame) and times frame out → answer in.
- Client-tool round trip: from `client_tool_request` sending the invoke to the validated result
  being back in the engine: layer → consumer → socket → page → socket → consumer → layer.
The echo phase runs first, then the calls; each after a warm-up. With `--redis` the channel
layer is `RedisPubSubChannelLayer` on that server (the consumer and the engine still share
this process, so each call crosses Redis twice).
"""

import asyncio  # isort:skip
import daphne.server  # isort:skip  # noqa: F401 - installs the asyncio reactor before Twisted loads

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 100

BENCH_TOOL = {
    "kind": "blocking",
    "name": "bench_echo",
    "description": "Answers with its arguments.",
    "arguments": {"type": "object", "properties": {"i": {"type": "integer"}}},
    "result": {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]},
    "serve": True,
}


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict:
    return {
        "n": len(samples),
        "median_ms": statistics.median(samples) * 1000,
        "p99_ms": percentile(samples, 0.99) * 1000,
    }


# --- the page (a separate process) ------------------------------------------------------------


async def page(port: int, token: str, session: str, echoes: int) -> None:
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/chat/",
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=2**20,
    ) as ws:
        await ws.send(json.dumps({"type": "session-bind", "session": session}))
        assert json.loads(await ws.recv())["type"] == "session-bound"
        probe = json.dumps({"type": "client-tool-result", "correlationId": "echo", "result": {}})
        samples = []
        for index in range(WARMUP + echoes):
            started = time.perf_counter()
            await ws.send(probe)
            answer = await ws.recv()
            if index >= WARMUP:
                samples.append(time.perf_counter() - started)
            assert json.loads(answer)["status"] == 404
        print(json.dumps(summary(samples)), flush=True)

        await ws.send(json.dumps({"type": "client-tool-register", "tools": [BENCH_TOOL]}))
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "client-tool-invoke":
                await ws.send(
                    json.dumps(
                        {
                            "type": "client-tool-result",
                            "correlationId": frame["correlationId"],
                            "result": frame["arguments"],
                        }
                    )
                )


# --- the server and the engine (this process) -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def django_ready(database: Path, redis_url: str | None) -> tuple[str, str]:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="geosense.settings",
        DEBUG="1",
        SECRET_KEY="bench",
        DATABASE_URL=f"sqlite:///{database}",
        LOG_LEVEL="ERROR",
        GEOSENSE_ENV_FILE="",  # measured on the defaults, not on a local .env
    )
    os.environ.pop("REDIS_URL", None)
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from chat.models import ChatSession
    from geosense.accounts.services import api_token_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    return api_token_create(user=user), str(ChatSession.objects.create(user=user).pk)


async def engine(session: str, calls: int) -> list[float]:
    from asgiref.sync import sync_to_async

    from chat.selectors import client_toolset_of_session
    from tools.client import client_tool_request

    deadline = time.monotonic() + 60
    toolset = None
    while toolset is None or "bench_echo" not in toolset.tools:
        if time.monotonic() > deadline:
            raise TimeoutError("the page never registered its tool")
        await asyncio.sleep(0.05)
        toolset = await sync_to_async(client_toolset_of_session)(session_id=session)
    tool = toolset.tools["bench_echo"]
    samples = []
    for index in range(WARMUP + calls):
        started = time.perf_counter()
        answer = await client_tool_request(
            channel_name=toolset.channel_name, tool=tool, arguments={"i": index}, timeout=30
        )
        elapsed = time.perf_counter() - started
        assert answer.ok and answer.result == {"i": index}, answer
        if index >= WARMUP:
            samples.append(elapsed)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--redis", help="a Redis URL: measure through RedisPubSubChannelLayer")
    parser.add_argument(
        "--page", nargs=3, metavar=("PORT", "TOKEN", "SESSION"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.page:
        port, token, session = args.page
        asyncio.run(page(int(port), token, session, args.calls))
        return

    with tempfile.TemporaryDirectory() as tmp:
        token, session = django_ready(Path(tmp) / "bench.sqlite3", args.redis)
        from daphne.server import Server, twisted_loop
        from twisted.internet import reactor

        from geosense.asgi import application

        port = free_port()
        outcome: dict = {}

        async def run() -> None:
            browser = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--calls",
                str(args.calls),
                "--page",
                str(port),
                token,
                session,
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                line = await asyncio.wait_for(browser.stdout.readline(), timeout=120)
                outcome["echo"] = json.loads(line)
                outcome["tool"] = summary(await engine(session, args.calls))
            finally:
                browser.terminate()
                await browser.wait()
                reactor.stop()

        def start() -> None:
            task = asyncio.ensure_future(run(), loop=twisted_loop)
            task.add_done_callback(
                lambda t: t.cancelled() or outcome.setdefault("error", t.exception())
            )

        server = Server(
            application=application,
            endpoints=[f"tcp:port={port}:interface=127.0.0.1"],
            signal_handlers=False,
            verbosity=0,
            ready_callable=lambda: reactor.callLater(0.2, start),
        )
        server.run()

    if outcome.get("error"):
        raise outcome["error"]
    echo, tool = outcome["echo"], outcome["tool"]
    layer = "RedisPubSubChannelLayer" if args.redis else "InMemoryChannelLayer"
    print(f"layer: {layer}; {tool['n']} calls, {echo['n']} echoes (after {WARMUP} warm-up each)")
    print(f"raw echo           median {echo['median_ms']:.3f} ms   p99 {echo['p99_ms']:.3f} ms")
    print(f"client-tool round  median {tool['median_ms']:.3f} ms   p99 {tool['p99_ms']:.3f} ms")
    print(
        f"ratio (tool / echo) median {tool['median_ms'] / echo['median_ms']:.2f}×"
        f"   p99 {tool['p99_ms'] / echo['p99_ms']:.2f}×"
    )


if __name__ == "__main__":
    main()
