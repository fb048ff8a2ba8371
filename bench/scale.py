"""GeoSense on PostgreSQL + Redis with several Daphne processes, against one process on the
embedded channel layer, in one run on this machine.

    .venv/bin/python bench/scale.py [--calls 1000] [--deltas 2000] [--users 16] [--seconds 20]
                                    [--processes 1,2,4] [--only roundtrip,events,turns]

Everything runs on loopback: a throwaway PostgreSQL cluster (tests/scale/cluster.py), a
redis-server, Daphne processes, a fake OpenAI-compatible model in this process.

- roundtrip: a served blocking client-tool call from the engine's side to a page's socket and
  back (as bench/client_tools.py times it), with the in-memory layer in one process (that
  script, in-process Daphne) and across two processes through Redis (the engine's side in a
  process of its own, the socket held by a Daphne process), for the pub/sub layer the app uses
  and for channels_redis' core layer.
- events: a turn streaming N text deltas; a tab bound to its session counts the `event` frames
  per second from the first delta to the last. In-memory: turn and tab on one process;
  Redis: the turn on process A, the tab on process B.
- turns: U users, each with a session of its own, run turns back to back for S seconds; each
  turn calls `list_classes` and then streams a ten-chunk answer (two model requests, six
  stored rows). Users are spread over 1, 2 or 4 Daphne processes; the CPU time each part used
  (Daphne processes, PostgreSQL, Redis, the model and the clients) says what limits it.
"""

import daphne.server  # isort:skip  # noqa: F401 - installs the asyncio reactor before Twisted loads

import argparse
import asyncio
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from client_tools import engine, summary  # noqa: E402 - bench/ is on the path
from proc_cpu import cpu_seconds, postgres_cpu  # noqa: E402

from tests.browser.daphne_server import manage, server_env  # noqa: E402
from tests.fakes.fake_openai import FakeOpenAI, Response, Text, ToolCalls  # noqa: E402
from tests.scale.cluster import (  # noqa: E402
    DaphneProcess,
    PostgresCluster,
    RedisServer,
    postgres_bindir,
)

LAYERS = {
    "pubsub": ("RedisPubSubChannelLayer", "geosense.settings"),
    "core": ("RedisChannelLayer", "core_layer_settings"),
}
SETUP = """
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from geosense.accounts.services import api_token_create, credit_set
user = get_user_model().objects.create_user("bench-{n}")
credit_set(user=user, balance=10**6)
ids = [str(ChatSession.objects.create(user=user, allow_backend_tools=True).pk) for _ in range({sessions})]
print(api_token_create(user=user), " ".join(ids))
"""


class ScriptedModel(FakeOpenAI):
    """Answers by what it is asked, not from a queue, so concurrent turns never mix answers:
    a user's message gets a `list_classes` call, a tool result gets a ten-chunk answer. A
    queued response (the events bench) still comes first."""

    def next_response(
        self, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Response:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if body["messages"][-1]["role"] == "user":
            call = (f"call_{uuid.uuid4().hex[:16]}", "list_classes", {})
            return Response(steps=(ToolCalls((call,), 1),))
        return Response(steps=(Text("There are trees, houses, pools and roads here.", 10),))


# --- the set-up -------------------------------------------------------------------------------


class Bench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.model = ScriptedModel().start()
        self.postgres = PostgresCluster(bindir=postgres_bindir()).start()
        self.redis = RedisServer().start()
        self.daphnes: list[DaphneProcess] = []
        self.users = 0
        manage("migrate", "--noinput", env=self.env())
        manage("seed_demo", "--annotations", "2000", "--seed", "1", env=self.env())

    def env(self, layer: str | None = "pubsub") -> dict[str, str]:
        extra = {
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1",
            "LOG_LEVEL": "ERROR",
            "GEOSENSE_LLM_BASE_URL": self.model.base_url,
            "GEOSENSE_LLM_MODEL": "fake-model",
            "PYTHONPATH": str(BENCH),
        }
        if layer is not None:
            extra["REDIS_URL"] = self.redis.url
            extra["DJANGO_SETTINGS_MODULE"] = LAYERS[layer][1]
        return server_env(database_url=self.postgres.url, extra=extra)

    def daphne(self, layer: str | None) -> DaphneProcess:
        n = len(self.daphnes)
        process = DaphneProcess(
            name=str(n), env=self.env(layer), log_path=self.workdir / f"daphne-{n}.log"
        ).start()
        self.daphnes.append(process)
        return process

    def user(self, sessions: int) -> tuple[str, list[str]]:
        self.users += 1
        out = manage(
            "shell", "-c", SETUP.format(n=self.users, sessions=sessions), env=self.env(None)
        )
        token, ids = out.strip().splitlines()[-1].split(" ", 1)
        return token, ids.split()

    def stop_daphnes(self) -> None:
        for process in self.daphnes:
            process.stop()
        self.daphnes.clear()

    def close(self) -> None:
        self.stop_daphnes()
        self.redis.stop()
        self.postgres.stop()
        self.model.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


# --- client-tool round trip -------------------------------------------------------------------


def roundtrip_in_memory(calls: int) -> dict:
    """bench/client_tools.py: Daphne, the engine's side and the layer in one process."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "client_tools.py"), "--calls", str(calls)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("client-tool round"))
    median, p99 = (float(part.split()[0]) for part in line.split("median")[1].split("p99"))
    return {"median_ms": median, "p99_ms": p99}


def roundtrip_redis(bench: Bench, layer: str, calls: int) -> dict:
    """The socket on a Daphne process, the engine's side in a process of its own."""
    holder = bench.daphne(layer)
    token, (session,) = bench.user(1)
    page = subprocess.Popen(
        [
            sys.executable,
            str(BENCH / "client_tools.py"),
            "--calls",
            "100",
            "--page",
            str(holder.port),
            token,
            session,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        page.stdout.readline()  # its echo figures; then it registers and serves
        out = subprocess.run(
            [sys.executable, __file__, "--engine", session, "--calls", str(calls)],
            env=bench.env(layer),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])
    finally:
        page.terminate()
        page.wait()
        bench.stop_daphnes()


def engine_process(session: str, calls: int) -> None:
    import django

    django.setup()
    print(json.dumps(summary(asyncio.run(engine(session, calls)))))


# --- events through a bound socket ------------------------------------------------------------


def post(port: int, token: str, path: str, body: dict) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    return conn.getresponse()


async def events_per_second(turn_port: int, tab_port: int, token: str, session: str, n: int):
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{tab_port}/ws/chat/",
        additional_headers={"Authorization": f"Bearer {token}"},
    ) as ws:
        await ws.send(json.dumps({"type": "session-bind", "session": session}))
        assert json.loads(await ws.recv())["type"] == "session-bound"

        def turn() -> None:
            response = post(
                turn_port, token, f"/api/sessions/{session}/message/stream", {"text": "go"}
            )
            response.read()

        streaming = asyncio.create_task(asyncio.to_thread(turn))
        times = []
        while True:
            # turn_end itself may be dropped: once the stream is over, a quiet second ends it.
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=1)
            except TimeoutError:
                if streaming.done():
                    break
                continue
            frame = json.loads(raw)
            if frame.get("event") == "text_delta":
                times.append(time.perf_counter())
            if frame.get("event") == "turn_end":
                break
        await streaming
    # A group message to a full channel is dropped (capacity 100 on the in-memory and core
    # layers): the tab may see fewer deltas than the turn sent. The `message` event that ends
    # the turn carries the whole text, and the database has it.
    return (len(times) - 1) / (times[-1] - times[0]), len(times) / n


def events(bench: Bench, layer: str | None, deltas: int, runs: int = 3) -> tuple[float, float]:
    """(events per second at the tab, the share of the deltas it received): medians."""
    a = bench.daphne(layer)
    b = bench.daphne(layer) if layer else a
    token, (session,) = bench.user(1)
    rates, received = [], []
    try:
        for _ in range(runs):
            bench.model.reply(Text("word " * deltas, deltas))
            rate, share = asyncio.run(events_per_second(a.port, b.port, token, session, deltas))
            rates.append(rate)
            received.append(share)
    finally:
        bench.stop_daphnes()
    return statistics.median(rates), statistics.median(received)


# --- concurrent turns -------------------------------------------------------------------------


def load(ports: list[int], token: str, sessions: list[str], seconds: float) -> dict:
    """Users (threads), each on its own session and process, running turns back to back."""
    latencies: list[float] = []
    errors = []
    deadline = time.monotonic() + seconds

    def user(index: int) -> None:
        port = ports[index % len(ports)]
        path = f"/api/sessions/{sessions[index]}/message/stream"
        while time.monotonic() < deadline:
            started = time.perf_counter()
            response = post(port, token, path, {"text": "what is here?"})
            body = response.read()
            if response.status != 200 or b"event: message" not in body:
                errors.append(body[:200])
                continue
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(sessions))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    return {
        "turns": len(latencies),
        "errors": len(errors),
        "seconds": elapsed,
        "latencies": latencies,
    }


def turns(bench: Bench, processes: int, users: int, seconds: float) -> dict:
    daphnes = [bench.daphne("pubsub") for _ in range(processes)]
    token, sessions = bench.user(users)
    ports = [d.port for d in daphnes]
    try:
        load(ports, token, sessions[: max(2, processes)], 3)  # warm-up: imports, connections
        parts = {
            "daphne": lambda: sum(cpu_seconds(d.process.pid) for d in daphnes),
            "postgres": lambda: postgres_cpu(bench.postgres.process.pid),
            "redis": lambda: cpu_seconds(bench.redis.process.pid),
            "model+clients": lambda: cpu_seconds(os.getpid()),
        }
        before = {name: read() for name, read in parts.items()}
        result = load(ports, token, sessions, seconds)
        used = {name: read() - before[name] for name, read in parts.items()}
    finally:
        bench.stop_daphnes()
    latencies = sorted(result["latencies"])
    return {
        "processes": processes,
        "turns_per_second": result["turns"] / result["seconds"],
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))] * 1000,
        "errors": result["errors"],
        "cpu_share": {name: value / result["seconds"] for name, value in used.items()},
        # What a turn costs, whatever else the machine runs: the ceiling of a core count.
        "cpu_ms_per_turn": {
            name: value * 1000 / max(1, result["turns"]) for name, value in used.items()
        },
    }


# --- the report -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--only", default="roundtrip,events,turns")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        engine_process(args.engine, args.calls)
        return

    only = set(args.only.split(","))
    # A plain `kill` still stops the servers this run started (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    bench = Bench(Path(tempfile.mkdtemp(prefix="geosense-bench-scale-")))
    try:
        print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
        if "roundtrip" in only:
            print(f"\nclient-tool round trip ({args.calls} calls after 100 warm-up)")
            rows = {"InMemoryChannelLayer, one process": roundtrip_in_memory(args.calls)}
            for layer, (name, _) in LAYERS.items():
                rows[f"{name}, two processes"] = roundtrip_redis(bench, layer, args.calls)
            base = rows["InMemoryChannelLayer, one process"]["median_ms"]
            for label, row in rows.items():
                print(
                    f"  {label:42} median {row['median_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms"
                    f"  ({row['median_ms'] / base:.2f}× in-memory)"
                )
        if "events" in only:
            print(
                f"\nevents per second at a bound socket (a turn of {args.deltas} deltas, median of 3)"
            )
            rows = {"InMemoryChannelLayer, one process": events(bench, None, args.deltas)}
            for layer, (name, _) in LAYERS.items():
                rows[f"{name}, turn on A, tab on B"] = events(bench, layer, args.deltas)
            base = rows["InMemoryChannelLayer, one process"][0]
            for label, (rate, share) in rows.items():
                print(
                    f"  {label:42} {rate:9,.0f} events/s  ({rate / base:.2f}× in-memory)"
                    f"  {share:.0%} of the deltas reached the tab"
                )
        if "turns" in only:
            print(
                f"\nconcurrent turns: {args.users} users, {args.seconds:g} s, "
                "RedisPubSubChannelLayer, PostgreSQL"
            )
            for processes in (int(p) for p in args.processes.split(",")):
                row = turns(bench, processes, args.users, args.seconds)
                shares = ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_share"].items())
                per_turn = ", ".join(f"{k} {v:.0f}" for k, v in row["cpu_ms_per_turn"].items())
                print(
                    f"  {processes} process(es): {row['turns_per_second']:6.1f} turns/s"
                    f"  p50 {row['p50_ms']:6.0f} ms  p99 {row['p99_ms']:6.0f} ms"
                    f"  errors {row['errors']}\n      cores busy: {shares}\n"
                    f"      CPU ms per turn: {per_turn}"
                )
    finally:
        bench.close()


if __name__ == "__main__":
    main()
