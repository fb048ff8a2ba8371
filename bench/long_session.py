"""What a turn in a 4,000-message session costs every other user of the process.

    .venv/bin/python bench/long_session.py [--messages 4000] [--runs 10] [--tree PATH]

Set-up, all on loopback (scaffolding of bench/load.py): one Daphne process serving `--tree`
(default this checkout) on a fresh SQLite file, started through bench/loopwatch.py so every
callback of its event loop is timed; the scripted fake model of bench/load.py in a process of
its own. Three users: A owns a session of `--messages` stored messages (turns of four: a
question, a tool call, its ~1 KB result, the answer), S owns an empty session, and B is the
"other user": a bound socket sending a frame the consumer answers itself (the echo of
bench/client_tools.py) every 2 ms, and a loop of `GET /api/sessions` calls, both timed.
A and S each run a turn with one served client-tool call (two model steps), alternately,
`--runs` times, first alone (what each turn costs the loop), then again while B probes.

Reported, medians over the runs, for the long session's turns and the short session's:
- the longest single event-loop callback while the turn ran (the longest any other user's
  frame or request had to wait behind one piece of work), and the loop's busy time (sum of
  callbacks of at least 0.1 ms) during the turn, each as wall time and as the loop thread's
  CPU time (wall time on a shared machine includes waiting for a CPU or the GIL), and the
  loop's CPU time over the whole turn (the turns with no probe running);
- B's socket echo and API call: the slowest during the turn, against B's median with no turn.
"A turn in a 4,000-message session adds under 5 ms of event-loop time for every other user":
the long session's longest callback and B's worst added wait, next to the short session's.
Also, over every served call of these turns: the engine's handling of the call whole, its
round trip alone, and the difference ("a served call inside a real turn adds under 2 ms
beyond the round trip": the client_tool_call event, the bound per turn, the result stored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import load  # bench/load.py: the fake model, the users' sockets and turns
from load import Level, turn_post, user_socket

BENCH = Path(__file__).resolve().parent
PROBE_SECONDS = 0.002


@dataclass
class Probes:
    """B's timed round trips: (sent, took) on the shared monotonic clock."""

    echo: list[tuple[float, float]] = field(default_factory=list)
    api: list[tuple[float, float]] = field(default_factory=list)


def session_seed(tree: Path, env: dict[str, str], messages: int) -> list[tuple[str, str]]:
    """Users A (a session of `messages`), S (an empty session) and B: (token, session) each."""
    code = f"""
import json
from django.contrib.auth import get_user_model
from chat.models import ChatSession, Message
from geosense.accounts.services import api_token_create
result = json.dumps({{"ids": list(range(150)), "note": "x" * 400}})
out = []
for name in ("long", "short", "other"):
    user = get_user_model().objects.create_user(name)
    out.append((api_token_create(user=user), ChatSession.objects.create(user=user)))
session = out[0][1]
rows = []
for turn in range(1, {messages} // 4 + 1):
    call = {{"id": f"call-{{turn}}", "name": "bench_echo", "arguments": '{{"i": 1}}'}}
    rows += [
        Message(session=session, turn=turn, role="user", content=f"question {{turn}} " * 8),
        Message(session=session, turn=turn, role="assistant", tool_calls=[call]),
        Message(session=session, turn=turn, role="tool", content=result,
                tool_call_id=call["id"], tool_name="bench_echo"),
        Message(session=session, turn=turn, role="assistant", content="an answer " * 30),
    ]
Message.objects.bulk_create(rows, batch_size=500)
session.turn_count = {messages} // 4
session.save(update_fields=["turn_count"])
print(json.dumps([(token, str(s.pk)) for token, s in out]))
"""
    return [tuple(pair) for pair in load.shell_json(tree, env, code)]


async def echo_probe(port: int, token: str, session: str, probes: Probes, stop: asyncio.Event):
    import websockets

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/chat/",
        additional_headers={"Authorization": f"Bearer {token}"},
        ping_interval=None,
    ) as ws:
        await ws.send(json.dumps({"type": "session-bind", "session": session}))
        assert json.loads(await ws.recv())["type"] == "session-bound"
        probe = json.dumps({"type": "client-tool-result", "correlationId": "echo", "result": {}})
        while not stop.is_set():
            sent = time.monotonic()
            await ws.send(probe)
            await ws.recv()
            probes.echo.append((sent, time.monotonic() - sent))
            await asyncio.sleep(PROBE_SECONDS)


async def api_probe(port: int, token: str, probes: Probes, stop: asyncio.Event) -> None:
    request = (
        f"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ).encode()
    while not stop.is_set():
        sent = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        status = await reader.readline()
        assert b" 200 " in status, status
        await reader.read()
        writer.close()
        probes.api.append((sent, time.monotonic() - sent))
        await asyncio.sleep(PROBE_SECONDS * 10)


def window_figures(
    window: tuple[float, float], loop: list[tuple[float, float, float]], probes: Probes
) -> dict[str, float]:
    start, end = window
    inside = [(took, cpu) for began, took, cpu in loop if began < end and began + took > start]
    echoes = [took for sent, took in probes.echo if start <= sent <= end]
    apis = [took for sent, took in probes.api if start <= sent <= end]
    return {
        "turn_ms": (end - start) * 1000,
        "longest_callback_ms": max((took for took, _ in inside), default=0.0) * 1000,
        "longest_callback_cpu_ms": max((cpu for _, cpu in inside), default=0.0) * 1000,
        "loop_busy_ms": sum(took for took, _ in inside) * 1000,
        "loop_cpu_ms": sum(cpu for _, cpu in inside) * 1000,
        "echo_worst_ms": max(echoes, default=float("nan")) * 1000,
        "api_worst_ms": max(apis, default=float("nan")) * 1000,
    }


async def turns_run(
    port: int, users: list[tuple[str, str]], runs: int, probe_loop: Any
) -> dict[str, list[tuple[float, float]]]:
    """A's and S's turns, alternately, each with its socket serving `bench_echo`."""
    windows: dict[str, list[tuple[float, float]]] = {"long": [], "short": []}
    readies = [asyncio.Event(), asyncio.Event()]
    sockets = [
        asyncio.create_task(user_socket(port, token, session, ready))
        for (token, session), ready in zip(users[:2], readies, strict=True)
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=60)
        level = Level()
        for token, session in users[:2]:  # warm both paths
            await turn_post(port, token, session, "tool please", level)
        quiet = time.monotonic()
        await asyncio.sleep(2)  # B's baseline, no turn running
        windows["quiet"] = [(quiet, time.monotonic())]
        for _ in range(runs):
            for name, (token, session) in zip(("long", "short"), users[:2], strict=True):
                probe_loop(name)
                started = time.monotonic()
                await turn_post(port, token, session, "tool please", level)
                windows[name].append((started, time.monotonic()))
                probe_loop(name)
                await asyncio.sleep(0.3)
        assert not level.failed and not level.http_errors, level.failures
        return windows
    finally:
        for task in sockets:
            task.cancel()
        await asyncio.gather(*sockets, return_exceptions=True)


async def bench(
    port: int, users: list[tuple[str, str]], runs: int, probe_loop: Any
) -> tuple[dict, dict, Probes]:
    """The turns alone (the loop's own cost of each), then again while B probes."""
    alone = await turns_run(port, users, runs, probe_loop)
    probes = Probes()
    stop = asyncio.Event()
    other_token, other_session = users[2]
    probers = [
        asyncio.create_task(echo_probe(port, other_token, other_session, probes, stop)),
        asyncio.create_task(api_probe(port, other_token, probes, stop)),
    ]
    try:
        await asyncio.sleep(1)
        probed = await turns_run(port, users, runs, lambda name: None)
    finally:
        stop.set()
        await asyncio.gather(*probers)
    return alone, probed, probes


def report(alone: dict, probed: dict, loop: list, probes: Probes) -> dict:
    """Medians per kind of turn: the loop's figures from the turns alone, B's waits from the
    turns B probed (against B's medians in a quiet window of 2 s with no turn)."""
    (quiet,) = probed.pop("quiet")
    alone.pop("quiet")
    calm = window_figures(quiet, loop, probes)
    out: dict[str, Any] = {
        "echo_quiet_median_ms": statistics.median(
            took for sent, took in probes.echo if quiet[0] <= sent <= quiet[1]
        )
        * 1000,
        "api_quiet_median_ms": statistics.median(
            took for sent, took in probes.api if quiet[0] <= sent <= quiet[1]
        )
        * 1000,
        "quiet_longest_callback_ms": calm["longest_callback_ms"],
    }
    loop_keys = ("turn_ms", "longest_callback_ms", "longest_callback_cpu_ms", "loop_busy_ms")
    for name in alone:
        rows = [window_figures(w, loop, probes) for w in alone[name]]
        figures = {key: statistics.median(r[key] for r in rows) for key in loop_keys}
        figures["loop_cpu_ms"] = statistics.median(r["loop_cpu_ms"] for r in rows)
        figures["longest_callback_max_ms"] = max(r["longest_callback_ms"] for r in rows)
        figures["longest_callback_cpu_max_ms"] = max(r["longest_callback_cpu_ms"] for r in rows)
        rows = [window_figures(w, loop, probes) for w in probed[name]]
        for key in ("echo_worst_ms", "api_worst_ms"):
            figures[key] = statistics.median(r[key] for r in rows)
            figures[key.replace("worst", "worst_max")] = max(r[key] for r in rows)
        out[name] = figures
    return out


def served_figures(served: list[list[float]]) -> dict[str, float]:
    """Medians over every served call of the bench's turns (long and short sessions)."""
    return {
        "calls": len(served),
        "in_turn_ms": statistics.median(whole for whole, _ in served) * 1000,
        "round_trip_ms": statistics.median(trip for _, trip in served) * 1000,
        "added_ms": statistics.median(whole - trip for whole, trip in served) * 1000,
        "added_p90_ms": sorted(whole - trip for whole, trip in served)[int(0.9 * len(served))]
        * 1000,
    }


def profile_print(files: list[Path]) -> None:
    import pstats

    stats = pstats.Stats(*map(str, files))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tree", type=Path, default=BENCH.parent)
    parser.add_argument("--profile", action="store_true", help="profile the long turns' loop")
    parser.add_argument("--stacks", type=int, default=0, help="print the N commonest long stacks")
    args = parser.parse_args()
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        work = Path(tmp)
        db, port_file, loop_file = work / "db.sqlite3", work / "fake-url", work / "loop.json"
        fake = subprocess.Popen([sys.executable, load.__file__, "--fake", str(port_file)])
        server = None
        try:
            env = load.server_env(db_path=db, extra={"LOG_LEVEL": "ERROR"})
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=tree, env=env, check=True, capture_output=True,
            )  # fmt: skip
            users = session_seed(tree, env, args.messages)
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            env.update(
                GEOSENSE_LLM_BASE_URL=port_file.read_text(),
                GEOSENSE_LLM_MODEL="fake",
                LOOPWATCH_SERVED="1",
            )
            port = load.free_port()
            server = subprocess.Popen(
                [sys.executable, str(BENCH / "loopwatch.py"), str(loop_file),
                 "-b", "127.0.0.1", "-p", str(port), load.APP],
                cwd=tree, env=env, stdout=(work / "daphne.log").open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            load.port_wait(port)

            def probe_loop(name: str) -> None:
                """With --profile, the loop thread is profiled during the long session's turns
                (OUT.prof-1, -3, ...)."""
                if args.profile and name == "long":
                    server.send_signal(signal.SIGUSR2)

            alone, probed, probes = asyncio.run(bench(port, users, args.runs, probe_loop))
            server.send_signal(signal.SIGUSR1)
            while not loop_file.exists():
                time.sleep(0.05)
            watched = json.loads(loop_file.read_text())
            result = report(alone, probed, watched["callbacks"], probes)
            result["served_call"] = served_figures(watched["served"])
            if args.profile:
                profile_print(sorted(work.glob("loop.json.prof-*")))
            if args.stacks:
                for stack, count in watched["stacks"][: args.stacks]:
                    print(f"--- {count} callbacks past 4 ms:\n{stack}")
            result.update(tree=str(tree), messages=args.messages, runs=args.runs)
            print(json.dumps(result, indent=1))
        finally:
            if server is not None:
                server.terminate()
                server.wait()
            fake.terminate()
            fake.wait()


if __name__ == "__main__":
    main()
