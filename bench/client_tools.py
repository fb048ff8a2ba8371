"""Client-tool round trip against a raw WebSocket echo, on one Daphne server in one run.

    .venv/bin/python bench/client_tools.py [--calls 2000] [--blocks 10] [--redis redis://127.0.0.1:6379/0]
        [--tree PATH]

Setup, chosen so that every figure crosses the same server in the same conditions:
- This process runs Daphne in-process (the `geosense.asgi.application` of `--tree`, default
  this checkout: give a worktree of an older commit to measure "before" with the same script;
  a temporary SQLite file) and, on Daphne's own event loop, the engine's side of a call:
  `client_tool_request`, exactly as the turn engine calls it.
- A second process plays the page: a `websockets` client that binds a session, registers one
  served blocking tool and answers every `client-tool-invoke` at once with its arguments.
- Echo: the page sends a frame the consumer answers by itself (a `client-tool-result` for an
  unknown correlation id → the `error` frame) and times frame out → answer in.
- Bare echo: the same frame through the same Daphne to a bare ASGI application that sends
  every text frame back (a second socket of the page; no Channels, no consumer).
- Client-tool round trip: from `client_tool_request` sending the invoke to the validated result
  being back in the engine: consumer → socket → page → socket → consumer → engine (through the
  channel layer when the socket is another process's).
- Least round trip: the same invoke and answer through the same Daphne to a bare ASGI
  application that does the least any server must (writes the invoke as JSON, parses the
  answer, wakes the waiting caller; no checks, no Channels), answered by the page exactly as
  the consumer's invokes (a third socket). It is the floor of the round trip on this Daphne:
  the page's own JSON and the extra loop round are in it, GeoSense's work is not.
The calls are split in `--blocks` blocks; before each block of calls the page runs as many
echoes and bare echoes, and the least round trips just before the calls, so that the figures
share the machine's load of the moment (a shared machine's load moves more within a run than
the difference measured). One more block first warms up and is not counted. With `--redis`
the channel layer is `RedisPubSubChannelLayer` on that server.
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
BARE_ECHO_PATH = "/bench/bare-echo/"
LEAST_PATH = "/bench/least-tool/"

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


async def timed_echoes(ws, probe: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await ws.send(probe)
        await ws.recv()
        samples.append(time.perf_counter() - started)
    return samples


async def answer_invokes(ws, count: int) -> None:
    """Answer `count` invokes with their arguments, as a page serving a tool does."""
    for _ in range(count):
        frame = json.loads(await ws.recv())
        assert frame["type"] == "client-tool-invoke", frame
        await ws.send(
            json.dumps(
                {
                    "type": "client-tool-result",
                    "correlationId": frame["correlationId"],
                    "result": frame["arguments"],
                }
            )
        )


async def page(port: int, token: str, session: str) -> None:
    """Bind, register, say "ready"; then for each block size read on stdin: that many echoes
    and bare echoes (their times printed as one JSON line), then answer that many invokes of
    the least server, then of the consumer."""
    import websockets

    async with (
        websockets.connect(
            f"ws://127.0.0.1:{port}/ws/chat/",
            additional_headers={"Authorization": f"Bearer {token}"},
            max_size=2**20,
        ) as ws,
        websockets.connect(f"ws://127.0.0.1:{port}{BARE_ECHO_PATH}") as bare,
        websockets.connect(f"ws://127.0.0.1:{port}{LEAST_PATH}") as least,
    ):
        await ws.send(json.dumps({"type": "session-bind", "session": session}))
        assert json.loads(await ws.recv())["type"] == "session-bound"
        await ws.send(json.dumps({"type": "client-tool-register", "tools": [BENCH_TOOL]}))
        assert json.loads(await ws.recv())["type"] == "client-tool-registered"
        print("ready", flush=True)
        probe = json.dumps({"type": "client-tool-result", "correlationId": "echo", "result": {}})
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            count = int(line)
            echoes = await timed_echoes(ws, probe, count)
            bares = await timed_echoes(bare, probe, count)
            print(json.dumps({"echo": echoes, "bare": bares}), flush=True)
            await answer_invokes(least, count)
            await answer_invokes(ws, count)


async def bare_echo(scope, receive, send) -> None:
    """A bare ASGI WebSocket application: every text frame straight back."""
    while True:
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
        elif message["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message["text"]})
        else:
            return


class LeastServer:
    """A bare ASGI application doing the least a client-tool server must: the invoke written
    as JSON, the answer parsed and handed to the caller's future."""

    def __init__(self) -> None:
        self.send = None
        self.waiting: dict[str, asyncio.Future] = {}

    async def __call__(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.connect":
                self.send = send
                await send({"type": "websocket.accept"})
            elif message["type"] == "websocket.receive":
                frame = json.loads(message["text"])
                self.waiting.pop(frame["correlationId"]).set_result(frame["result"])
            else:
                return

    async def calls_timed(self, count: int, first: int) -> list[float]:
        loop = asyncio.get_running_loop()
        samples = []
        for index in range(first, first + count):
            started = time.perf_counter()
            correlation_id = f"{index:032x}"
            waiter = self.waiting[correlation_id] = loop.create_future()
            invoke = {
                "type": "client-tool-invoke",
                "correlationId": correlation_id,
                "name": BENCH_TOOL["name"],
                "arguments": {"i": index},
            }
            await self.send({"type": "websocket.send", "text": json.dumps(invoke)})
            result = await waiter
            samples.append(time.perf_counter() - started)
            assert result == {"i": index}, result
        return samples


LEAST = LeastServer()


# --- the server and the engine (this process) -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def django_ready(tree: Path, database: Path, redis_url: str | None) -> tuple[str, str]:
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
    sys.path.insert(0, str(tree))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from chat.models import ChatSession
    from geosense.accounts.services import api_token_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    return api_token_create(user=user), str(ChatSession.objects.create(user=user).pk)


async def calls_timed(toolset, count: int, first: int) -> list[float]:
    """`count` calls as the turn engine makes them, each timed."""
    from tools.client import client_tool_request

    tool = toolset.tools["bench_echo"]
    samples = []
    for index in range(first, first + count):
        started = time.perf_counter()
        answer = await client_tool_request(
            channel_name=toolset.channel_name, tool=tool, arguments={"i": index}, timeout=30
        )
        samples.append(time.perf_counter() - started)
        assert answer.ok and answer.result == {"i": index}, answer
    return samples


async def blocks_timed(browser, session: str, calls: int, blocks: int) -> dict[str, list[float]]:
    """Warm-up block, then `blocks` blocks: the page's echoes and bare echoes, then the calls."""
    from asgiref.sync import sync_to_async

    from chat.selectors import client_toolset_of_session

    assert (await asyncio.wait_for(browser.stdout.readline(), timeout=120)).strip() == b"ready"
    toolset = await sync_to_async(client_toolset_of_session)(session_id=session)
    size = max(1, calls // blocks)
    timed: dict[str, list[float]] = {"echo": [], "bare": [], "least": [], "tool": []}
    for block in range(blocks + 1):
        browser.stdin.write(f"{size}\n".encode())
        echoes = json.loads(await asyncio.wait_for(browser.stdout.readline(), timeout=120))
        least = await LEAST.calls_timed(size, block * size)
        tool = await calls_timed(toolset, size, block * size)
        if block:  # the first block warms up
            timed["echo"] += echoes["echo"]
            timed["bare"] += echoes["bare"]
            timed["least"] += least
            timed["tool"] += tool
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--redis", help="a Redis URL: measure through RedisPubSubChannelLayer")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout Daphne runs")
    parser.add_argument(
        "--page", nargs=3, metavar=("PORT", "TOKEN", "SESSION"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.page:
        port, token, session = args.page
        asyncio.run(page(int(port), token, session))
        return

    with tempfile.TemporaryDirectory() as tmp:
        token, session = django_ready(args.tree.resolve(), Path(tmp) / "bench.sqlite3", args.redis)
        from daphne.server import Server, twisted_loop
        from twisted.internet import reactor

        from geosense.asgi import application

        async def served(scope, receive, send) -> None:
            if scope["type"] == "websocket" and scope["path"] == BARE_ECHO_PATH:
                return await bare_echo(scope, receive, send)
            if scope["type"] == "websocket" and scope["path"] == LEAST_PATH:
                return await LEAST(scope, receive, send)
            return await application(scope, receive, send)

        port = free_port()
        outcome: dict = {}

        async def run() -> None:
            browser = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--page",
                str(port),
                token,
                session,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                timed = await blocks_timed(browser, session, args.calls, args.blocks)
                outcome.update({name: summary(samples) for name, samples in timed.items()})
            finally:
                browser.stdin.close()
                browser.terminate()
                await browser.wait()
                reactor.stop()

        def start() -> None:
            task = asyncio.ensure_future(run(), loop=twisted_loop)
            task.add_done_callback(
                lambda t: t.cancelled() or outcome.setdefault("error", t.exception())
            )

        server = Server(
            application=served,
            endpoints=[f"tcp:port={port}:interface=127.0.0.1"],
            signal_handlers=False,
            verbosity=0,
            ready_callable=lambda: reactor.callLater(0.2, start),
        )
        server.run()

    if outcome.get("error"):
        raise outcome["error"]
    echo, bare, least, tool = outcome["echo"], outcome["bare"], outcome["least"], outcome["tool"]
    layer = "RedisPubSubChannelLayer" if args.redis else "InMemoryChannelLayer"
    print(
        f"tree: {args.tree}; layer: {layer}; {tool['n']} calls, {echo['n']} echoes and bare "
        f"echoes, in {args.blocks} blocks after one of warm-up"
    )
    for label, figures in (
        ("echo", echo),
        ("bare echo", bare),
        ("least round", least),
        ("client-tool round", tool),
    ):
        print(f"{label:18} median {figures['median_ms']:.3f} ms   p99 {figures['p99_ms']:.3f} ms")
    for label, top, base in (
        ("tool / echo", tool, echo),
        ("tool / bare echo", tool, bare),
        ("least / bare echo", least, bare),
        ("tool / least", tool, least),
    ):
        print(
            f"ratio ({label}) median {top['median_ms'] / base['median_ms']:.2f}×"
            f"   p99 {top['p99_ms'] / base['p99_ms']:.2f}×"
        )


if __name__ == "__main__":
    main()
