"""One Daphne process under load: N users, each with a bound socket, running turns back to back.

    .venv/bin/python bench/load.py [--users 1,50,200,500] [--seconds 20] [--tree PATH] [--hold N]
        [--rate TURNS_PER_S] [--keep-alive]

Set-up, all on loopback: a Daphne process runs GeoSense from `--tree` (default: this checkout;
give a worktree of an older commit to measure "before" with the same script) on a fresh seeded
SQLite file, with the `openai` agent pointed at a scripted fake model (tests/fakes, in a process
of its own). This process plays N users: each has its own account, token and session, a socket
bound to it that registers a served blocking client tool (`bench_echo`) and answers every invoke
at once, and a loop that posts a message (`POST …/message/stream`) and reads the SSE stream to
`turn_end`, then posts the next: on a new connection each turn (`Connection: close`), or with
`--keep-alive` on the connection its previous turn used, as a browser's `fetch` reuses one (the
server then accepts and sets up one connection a user, not one a turn). The model's script: a user message → call `bench_echo`; the
tool's result → a short text. So every turn is two model requests and one client-tool call.

Back to back, the process is saturated and a turn's latency is the queue in front of it: by
Little's law the mean turn takes N users / throughput (200 users at 50 turns/s: 4 s), however
fast each turn's own work is. `--rate R` measures latency as people meet it instead: the N users
together offer R turns/s (each posts every N/R s from a random phase; `late` counts the turns
posted late because the user's previous turn still ran, i.e. the process fell behind R).

Reported per level (N users, `--seconds` of turns, then the turns in flight finish):
- turns/s, turn p50/p99 (POST sent → `turn_end` read);
- client-tool round trip p50/p99: the `client_tool_call` event read → the engine's next model
  request reaching the fake (the fake stamps it with the shared monotonic clock in its text):
  invoke over the layer, socket, answer, validation, the result stored, the next step's reads;
- HTTP errors (any answer but 200), failed turns (no `turn_end`, an `error` event, or no
  tool answer), sessions left running, and the stored messages counted in the database: every
  finished turn must hold exactly user 1, assistant 2, tool 1 ("stored once");
- the server's memory: RSS once the level's sockets are bound minus the RSS before them, per
  socket; peak RSS during the turns minus that, per turn in flight (one per user);
- the storm of connects (every user's socket at once, as after a restart): handshakes the
  server dropped (Daphne's 5 s handshake time-out; each connects again after the page's
  back-off, counted as "reconnect"), the time until every socket was bound, each socket's
  connect time (first attempt → its handshake held) and bind time (→ `session-bound`), p50/p99,
  and the CPU the server and this bench itself used meanwhile (they share the cores);
- the server's CPU time (user + system, every thread) during the level per finished turn: what a
  turn costs the process, less sensitive to a shared machine's load than the wall-clock figures.
With `--hold N`, after the levels: the server's RSS with no turn, N and 2N turns all waiting
for the model's first byte; memory per turn in flight = (RSS at 2N - RSS at N) / N
(`--tracemalloc DIR` adds where the server's Python allocations grew, per turn).
Before the levels: one user, warm, a text-only turn and a turn with one client-tool call
(medians of `--warm` turns each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser.daphne_server import SERVE, free_port, server_env  # noqa: E402

BENCH_TOOL = {
    "kind": "blocking",
    "name": "bench_echo",
    "description": "Answers with its arguments.",
    "arguments": {"type": "object", "properties": {"i": {"type": "integer"}}},
    "result": {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]},
    "serve": True,
}
STAMP = "stamp="
# A "hold" turn: the model answers after this long (the turn waits for its first byte meanwhile).
HOLD_SECONDS = 40.0
APP = "geosense.asgi:application"
# Error frames the users' sockets received, by status and text (a refused bind or registration
# leaves a socket "not ready": the report says why).
SOCKET_ERRORS: dict[str, int] = {}


@dataclass
class SocketTimes:
    """One user's socket, from its first connect attempt (seconds on the monotonic clock)."""

    started: float = 0.0
    attempts: int = 0
    opened: float | None = None  # the handshake that held (after any dropped ones)
    handshake: float | None = None  # that attempt's own handshake: TCP connect → 101
    bound: float | None = None  # `session-bound` read


# --- the scripted model (a process of its own) ------------------------------------------------


def scripted_fake() -> Any:
    """The scripted model, started: text-only turns, a tool call, or the final text."""
    from tests.fakes.fake_openai import FakeOpenAI, Pause, Response, Text, ToolCalls

    class Scripted(FakeOpenAI):
        """Answers by the last message: text-only turns, a tool call, or the final text."""

        def next_response(self, body: dict[str, Any], headers: Any = None) -> Response:
            last = (body.get("messages") or [{}])[-1]
            if last.get("role") == "tool":
                return Response(steps=(Text(f"Done. {STAMP}{time.monotonic():.6f}"),))
            if str(last.get("content", "")).startswith("hold"):
                return Response(steps=(Pause(HOLD_SECONDS), Text("Held.")))
            if str(last.get("content", "")).startswith("text"):
                return Response(steps=(Text(f"Hello. {STAMP}{time.monotonic():.6f}"),))
            call = (f"call_{uuid.uuid4().hex[:12]}", "bench_echo", {"i": 1})
            return Response(steps=(ToolCalls((call,), argument_chunks=1),))

    return Scripted().start()


def fake_main(port_file: str) -> None:
    """Serve the scripted model until the bench that started it is gone: terminated at its end,
    or left behind by a bench killed outright (then this process's parent changes)."""
    bench = os.getppid()
    fake = scripted_fake()
    Path(port_file).write_text(fake.base_url)
    while os.getppid() == bench:
        time.sleep(1.0)


# --- the users --------------------------------------------------------------------------------


@dataclass
class Level:
    turns: list[float] = field(default_factory=list)
    round_trips: list[float] = field(default_factory=list)
    # with --trace: each finished turn's moments, seconds on the monotonic clock (`turn_post`)
    traces: list[dict[str, float | None]] | None = None
    http_errors: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    not_ready: int = 0  # sockets not bound and registered in time
    ready_seconds: float = 0.0  # until every socket (that made it) was bound and registered
    running: int = 0  # users that ran turns (their sockets were ready)
    late: int = 0  # with --rate: turns posted after they were due (the previous one still ran)
    rss_ready_kib: int = 0  # the server's RSS once the sockets were ready, before any turn
    sockets: list[SocketTimes] = field(default_factory=list)
    # CPU seconds (user + system) while the sockets connected: the server's, and this bench's
    # own (its clients share the machine's cores with the server)
    server_cpu_connecting: float = 0.0
    bench_cpu_connecting: float = 0.0

    def fail(self, why: str) -> None:
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1


@dataclass
class Connection:
    """A user's HTTP connection, kept from one turn to the next with `--keep-alive`, as a
    browser's `fetch` keeps it; None until the first turn opens it, again once it closed."""

    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def body_lines(reader: asyncio.StreamReader, chunked: bool):
    """The lines of an answer's body: de-chunked, to the last chunk (the connection is then
    ready for the next request); without chunks, to the connection's end."""
    if not chunked:
        while line := await reader.readline():
            yield line
        return
    pending = b""
    while size := int((await reader.readline()).split(b";")[0], 16):
        pending += (await reader.readexactly(size + 2))[:-2]
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line + b"\n"
    while (await reader.readline()).strip():  # the trailer, to its empty line
        pass


async def turn_post(
    port: int,
    token: str,
    session: str,
    text: str,
    level: Level,
    kept: Connection | None = None,
) -> None:
    """One turn through the SSE endpoint, timed and checked: on a connection of its own
    (`Connection: close`), or on `kept`, the user's connection, opened if it is not."""
    started = time.monotonic()
    body = json.dumps({"text": text}).encode()
    connection = kept or Connection()
    if connection.writer is None or connection.writer.is_closing():
        try:
            connection.reader, connection.writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            level.http_errors += 1
            return
    reader, writer = connection.reader, connection.writer
    connected = time.monotonic()
    reusable = False
    try:
        writer.write(
            (
                f"POST /api/sessions/{session}/message/stream HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                + ("" if kept else "Connection: close\r\n")
                + "\r\n"
            ).encode()
            + body
        )
        status_line = await reader.readline()
        answered_at = time.monotonic()
        status = int(status_line.split()[1]) if status_line else 0
        if status != 200:
            level.http_errors += 1
            level.fail(f"HTTP {status}")
            return
        headers = []
        while (header := await reader.readline()).strip():
            headers.append(header.lower())
        chunked = any(h.startswith(b"transfer-encoding:") and b"chunked" in h for h in headers)
        closing = any(h.startswith(b"connection:") and b"close" in h for h in headers)
        lines = body_lines(reader, chunked)
        tool_seen = first_event = stamp = None
        answered = error = False
        event = ""
        async for line in lines:
            line = line.strip()
            if line.startswith(b"event: "):
                event = line[7:].decode()
                first_event = first_event or time.monotonic()
                if event == "client_tool_call":
                    tool_seen = time.monotonic()
                elif event == "error":
                    error = True
                elif event == "turn_end":
                    break
            elif line.startswith(b"data: ") and event == "text_delta" and STAMP.encode() in line:
                stamp = float(line.split(STAMP.encode())[1].split(b'"')[0])
                if tool_seen is not None:
                    level.round_trips.append(stamp - tool_seen)
                    answered = True
        else:
            level.fail("no turn_end")
            return
        ended = time.monotonic()
        if kept is not None and chunked and not closing:
            async for _ in lines:  # the rest of the answer: the connection's next request follows
                pass
            reusable = True
        if error:
            level.fail("error event")
        elif text.startswith("tool") and not answered:
            level.fail("tool not answered")
        else:
            level.turns.append(ended - started)
            if level.traces is not None:
                level.traces.append(
                    {
                        "posted": started,
                        "connected": connected,
                        "status": answered_at,
                        "first_event": first_event,
                        "tool_call": tool_seen,
                        "model_after_tool": stamp,
                        "ended": ended,
                    }
                )
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        level.fail(type(exc).__name__)
    finally:
        if not reusable:
            connection.close()


# The page's reconnection back-off (static/geosense/socket.js BACKOFF_MS), in seconds.
BACKOFF = (0.5, 1, 2, 4, 8, 15)


async def user_socket(
    port: int, token: str, session: str, ready: asyncio.Event, times: SocketTimes | None = None
) -> None:
    """The user's tab: binds, registers `bench_echo`, answers every invoke at once. A socket
    the server drops before it is ready connects again after the page's back-off, as the page
    does (counted in SOCKET_ERRORS as "reconnect: …")."""
    import websockets

    times = times or SocketTimes()
    times.started = time.monotonic()
    attempt = 0
    while True:
        try:
            await user_socket_once(port, token, session, ready, times)
            return
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            if ready.is_set():
                raise
            why = f"reconnect: {type(exc).__name__}: {exc}"[:90]
            SOCKET_ERRORS[why] = SOCKET_ERRORS.get(why, 0) + 1
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1


async def user_socket_once(
    port: int, token: str, session: str, ready: asyncio.Event, times: SocketTimes
) -> None:
    import websockets

    times.attempts += 1
    attempt_started = time.monotonic()
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/chat/",
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=120,
        ping_interval=None,
    ) as ws:
        times.opened = time.monotonic()
        times.handshake = times.opened - attempt_started
        await ws.send(json.dumps({"type": "session-bind", "session": session}))
        await ws.send(json.dumps({"type": "client-tool-register", "tools": [BENCH_TOOL]}))
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "session-bound" and times.bound is None:
                times.bound = time.monotonic()
            elif frame["type"] == "client-tool-registered":
                ready.set()
            elif frame["type"] == "error":
                why = f"{frame.get('status')} {str(frame.get('error'))[:60]}"
                SOCKET_ERRORS[why] = SOCKET_ERRORS.get(why, 0) + 1
            elif frame["type"] == "client-tool-invoke":
                answer = {
                    "type": "client-tool-result",
                    "correlationId": frame["correlationId"],
                    "result": frame["arguments"],
                }
                await ws.send(json.dumps(answer))


async def level_run(
    port: int,
    users: list[tuple[str, str]],
    seconds: float,
    pid: int,
    rate: float | None = None,
    trace: bool = False,
    keep_alive: bool = False,
) -> tuple[Level, float]:
    """One level: every user's socket at once, then `seconds` of turns. Without `rate` each
    user posts its next message as soon as its turn ends (closed loop: the process saturated).
    With `rate` (turns/s offered by all the users together) each user posts every
    len(users) / rate seconds from a random phase, as people who read an answer before they
    write again; a user whose turn is still running when the next is due posts it when the
    turn ends (counted as `late`: the process did not keep up with the offered rate)."""
    level = Level(traces=[] if trace else None)
    readies = [asyncio.Event() for _ in users]
    level.sockets = [SocketTimes() for _ in users]
    server_cpu, bench_cpu = cpu_seconds(pid), own_cpu_seconds()
    binding = time.monotonic()
    # All at once, as when a process restarts under its open pages.
    sockets = [
        asyncio.create_task(user_socket(port, token, session, ready, times))
        for (token, session), ready, times in zip(users, readies, level.sockets, strict=True)
    ]
    try:
        # Every socket bound with its tool registered, or what is ready after 180 s goes on
        # (the others are reported: a process too slow to take its sockets is a result too).
        await asyncio.wait([asyncio.ensure_future(r.wait()) for r in readies], timeout=180)
        level.ready_seconds = time.monotonic() - binding
        level.server_cpu_connecting = cpu_seconds(pid) - server_cpu
        level.bench_cpu_connecting = own_cpu_seconds() - bench_cpu
        level.not_ready = sum(1 for r in readies if not r.is_set())
        for task in sockets:
            if task.done() and not task.cancelled() and task.exception() is not None:
                why = f"socket {type(task.exception()).__name__}: {task.exception()}"[:90]
                SOCKET_ERRORS[why] = SOCKET_ERRORS.get(why, 0) + 1
        users = [u for u, r in zip(users, readies, strict=True) if r.is_set()]
        level.running = len(users)
        level.rss_ready_kib = rss_kib(pid)
        started = time.monotonic()
        stop_at = started + seconds

        async def user(token: str, session: str) -> None:
            kept = Connection() if keep_alive else None
            try:
                await user_turns(token, session, kept)
            finally:
                if kept is not None:
                    kept.close()

        async def user_turns(token: str, session: str, kept: Connection | None) -> None:
            if rate is None:
                while time.monotonic() < stop_at:
                    await turn_post(port, token, session, "tool please", level, kept)
                return
            period = len(users) / rate
            due = started + random.uniform(0, period)
            while due < stop_at:
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    level.late += 1
                await turn_post(port, token, session, "tool please", level, kept)
                due += period

        await asyncio.wait_for(
            asyncio.gather(*(user(t, s) for t, s in users)), timeout=seconds + 300
        )
        return level, time.monotonic() - started
    finally:
        for task in sockets:
            task.cancel()
        await asyncio.gather(*sockets, return_exceptions=True)


async def warm(
    port: int, user: tuple[str, str], turns: int, keep_alive: bool = False
) -> dict[str, float]:
    token, session = user
    ready = asyncio.Event()
    socket = asyncio.create_task(user_socket(port, token, session, ready))
    kept = Connection() if keep_alive else None
    try:
        await asyncio.wait_for(ready.wait(), timeout=60)
        result = {}
        for kind in ("text", "tool"):
            level = Level()
            for _ in range(turns + 5):
                await turn_post(port, token, session, f"{kind} please", level, kept)
            assert not level.failed, level.failures
            result[kind] = statistics.median(level.turns[5:]) * 1000
        return result
    finally:
        if kept is not None:
            kept.close()
        socket.cancel()
        await asyncio.gather(socket, return_exceptions=True)


# --- the server and its database ---------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def sockets_row(level: Level) -> dict[str, Any]:
    """The storm of connects: handshakes dropped (each one a reconnect after the page's
    back-off), each socket's connect time (first attempt → its handshake held) and bind time
    (first attempt → `session-bound`), the last handshake alone, and the CPU it all took."""
    connect = [t.opened - t.started for t in level.sockets if t.opened is not None]
    bind = [t.bound - t.started for t in level.sockets if t.bound is not None]
    handshake = [t.handshake for t in level.sockets if t.handshake is not None]
    return {
        "handshakes_dropped": sum(max(0, t.attempts - 1) for t in level.sockets),
        "all_bound_s": max(bind) if len(bind) == len(level.sockets) else None,
        "connect_p50_ms": pct(connect, 0.5),
        "connect_p99_ms": pct(connect, 0.99),
        "handshake_p99_ms": pct(handshake, 0.99),
        "bind_p50_ms": pct(bind, 0.5),
        "bind_p99_ms": pct(bind, 0.99),
        "server_cpu_connecting_s": level.server_cpu_connecting,
        "bench_cpu_connecting_s": level.bench_cpu_connecting,
    }


def rss_kib(pid: int) -> int:
    return proc_status(pid, "VmRSS")


def proc_status(pid: int, name: str) -> int:
    """A number of /proc/PID/status (`VmRSS` in KiB, `Threads`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    return 0


async def rss_peak(pid: int, stop: asyncio.Event) -> int:
    peak = 0
    while not stop.is_set():
        peak = max(peak, rss_kib(pid))
        await asyncio.sleep(0.25)
    return peak


def users_create(tree: Path, env: dict[str, str], count: int) -> list[tuple[str, str]]:
    code = f"""
import json
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from geosense.accounts.services import api_token_create
out = []
for i in range({count}):
    user = get_user_model().objects.create_user(f"load{{i}}")
    out.append((api_token_create(user=user), str(ChatSession.objects.create(user=user).pk)))
print(json.dumps(out))
"""
    return [tuple(pair) for pair in shell_json(tree, env, code)]


def serve_module(tree: Path) -> tuple[str, ...]:
    """How `tree` is served: Daphne on uvloop (`SERVE`, geosense/serve.py), or Daphne's own
    command for a checkout from before that launcher (a "before" tree)."""
    return SERVE[1:] if (tree / "geosense" / "serve.py").exists() else ("-m", "daphne")


def shell_json(tree: Path, env: dict[str, str], code: str) -> Any:
    """Run `code` in the Django shell of `tree` and read the JSON it printed last."""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def stored_counts(db: Path, sessions: list[str]) -> dict[str, int]:
    """Finished turns whose messages are stored exactly once, and those that are not."""
    ids = [s.replace("-", "") for s in sessions]
    marks = ",".join("?" * len(ids))
    with closing(sqlite3.connect(db, timeout=60)) as conn:
        rows = conn.execute(
            f"SELECT session_id, turn, role, COUNT(*) FROM chat_message "
            f"WHERE session_id IN ({marks}) GROUP BY session_id, turn, role",
            ids,
        ).fetchall()
        running = conn.execute(
            f"SELECT COUNT(*) FROM chat_chatsession WHERE id IN ({marks}) AND turn_state != 'idle'",
            ids,
        ).fetchone()[0]
    turns: dict[tuple[str, int], dict[str, int]] = {}
    for session, turn, role, count in rows:
        turns.setdefault((session, turn), {})[role] = count
    exact = sum(1 for t in turns.values() if t == {"user": 1, "assistant": 2, "tool": 1})
    return {"turns": len(turns), "exact": exact, "other": len(turns) - exact, "running": running}


def pct(samples: list[float], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] * 1000


async def bench(args: argparse.Namespace, port: int, pid: int, db: Path, users) -> dict:
    report: dict[str, Any] = {
        "keep_alive": args.keep_alive,
        "warm_ms": await warm(port, users[0], args.warm, args.keep_alive),
        "levels": [],
    }
    offset = 1
    for count in args.users:
        group = users[offset : offset + count]
        offset += count
        baseline = rss_kib(pid)
        cpu_before = cpu_seconds(pid)
        stop = asyncio.Event()
        peak_task = asyncio.create_task(rss_peak(pid, stop))
        SOCKET_ERRORS.clear()
        bench_cpu = own_cpu_seconds()
        level, elapsed = await level_run(
            port,
            group,
            args.seconds,
            pid,
            args.rate,
            trace=args.trace is not None,
            keep_alive=args.keep_alive,
        )
        if args.trace is not None:
            with args.trace.open("a") as out:
                for moments in level.traces or ():
                    out.write(json.dumps({"users": count, **moments}) + "\n")
        bench_cpu = own_cpu_seconds() - bench_cpu
        stop.set()
        peak = await peak_task
        cpu = cpu_seconds(pid) - cpu_before
        await asyncio.sleep(1)
        stored = stored_counts(db, [s for _, s in group])
        row = {
            "users": count,
            "turns": len(level.turns),
            "offered_per_s": args.rate,
            "late": level.late,
            "turns_per_s": len(level.turns) / elapsed,
            "turn_p50_ms": pct(level.turns, 0.5),
            "turn_p99_ms": pct(level.turns, 0.99),
            "cpu_ms_per_turn": cpu * 1000 / max(1, len(level.turns)),
            # this bench's own CPU (its users and their sockets) per turn: it shares the cores
            "bench_cpu_ms_per_turn": bench_cpu * 1000 / max(1, len(level.turns)),
            "tool_p50_ms": pct(level.round_trips, 0.5),
            "tool_p99_ms": pct(level.round_trips, 0.99),
            "http_errors": level.http_errors,
            "failed": level.failed,
            "failures": level.failures,
            "sockets_not_ready": level.not_ready,
            "socket_errors": dict(SOCKET_ERRORS),
            "stored": stored,
            "rss_before_mib": baseline / 1024,
            "sockets_ready_s": level.ready_seconds,
            **sockets_row(level),
            "kib_per_socket": max(0, level.rss_ready_kib - baseline) / max(1, level.running),
            "kib_per_turn_in_flight": max(0, peak - level.rss_ready_kib) / max(1, level.running),
            "rss_after_mib": rss_kib(pid) / 1024,
        }
        print(json.dumps(row), flush=True)
        report["levels"].append(row)
    if args.hold:
        row = await held_turns_memory(args, port, pid, users[offset:], args.tracemalloc)
        print(json.dumps(row), flush=True)
        report["held"] = row
    return report


async def settled(pid: int, *, most: float = 15.0) -> None:
    """Until the server has used under 2 % of a core for half a second (at most `most` s)."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        await asyncio.sleep(0.5)
        if cpu_seconds(pid) - before < 0.01:
            return


async def held_turns_memory(args, port: int, pid: int, users, snapshots: Path | None) -> dict:
    """Memory per turn in flight, measured apart from sockets and transient garbage: the
    server's RSS with no turn, with N turns and with 2N turns all waiting for the model's
    first byte (held `HOLD_SECONDS`); per turn = (RSS at 2N - RSS at N) / N. With
    `--tracemalloc`, the server's allocations are snapshot at each point (after a garbage
    collection) and the largest growths from N to 2N are listed per turn."""
    count = args.hold
    level = Level()
    tasks: list[asyncio.Task] = []
    points: list[int] = []
    threads: list[int] = []
    for wave in range(3):
        if wave:
            tasks += [
                asyncio.create_task(turn_post(port, token, session, "hold please", level))
                for token, session in users[(wave - 1) * count : wave * count]
            ]
        await settled(pid)
        if snapshots is not None:
            os.kill(pid, signal.SIGUSR1)
            for _ in range(1500):  # a snapshot of a large heap takes a while
                if (snapshots / f"snapshot-{wave + 1}.done").exists():
                    break
                await asyncio.sleep(0.2)
            await settled(pid)
        points.append(rss_kib(pid))
        threads.append(proc_status(pid, "Threads"))
    _, late = await asyncio.wait(tasks, timeout=HOLD_SECONDS + 60)
    for task in late:
        task.cancel()
    row = {
        "held_turns": count,
        "rss_kib_0_n_2n": points,
        "threads_0_n_2n": threads,
        "kib_per_held_turn_first_n": (points[1] - points[0]) / count,
        "kib_per_held_turn": (points[2] - points[1]) / count,
        "held_finished": len(level.turns),
        "held_failed": level.failed,
        "held_unfinished": len(late),
    }
    if snapshots is not None:
        row["tracemalloc_kib_per_held_turn"] = tracemalloc_growth(snapshots, count)
    return row


def tracemalloc_growth(snapshots: Path, count: int, top: int = 15) -> dict[str, Any]:
    import tracemalloc

    first, second = (
        tracemalloc.Snapshot.load(str(snapshots / f"snapshot-{n}.bin")) for n in (2, 3)
    )
    total = sum(d.size_diff for d in second.compare_to(first, "filename")) / 1024 / count
    lines = second.compare_to(first, "traceback")[:top]
    return {
        "total": total,
        "largest": [
            {
                "kib": d.size_diff / 1024 / count,
                "blocks": d.count_diff / count,
                "at": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in d.traceback][
                    -6:
                ],
            }
            for d in lines
        ],
    }


def port_wait(port: int, timeout: float = 60) -> None:
    """Until the server on `port` accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with closing(socket.create_connection(("127.0.0.1", port))):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,50,200,500")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warm", type=int, default=30, help="warm one-user turns of each kind")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout Daphne runs")
    parser.add_argument(
        "--profile", type=Path, help="run the server under cProfile, its stats written here"
    )
    parser.add_argument(
        "--hold", type=int, default=0, help="then N and 2N turns held in flight: memory per turn"
    )
    parser.add_argument(
        "--tracemalloc", type=Path, help="with --hold: the server's allocation snapshots, here"
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="turns/s offered by each level's users together (default: back to back)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="append each finished turn's moments here (JSON lines: posted, connected, status, "
        "first_event, tool_call, model_after_tool, ended; seconds on the machine's monotonic "
        "clock)",
    )
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="each user keeps its HTTP connection from one turn to the next, as a browser's "
        "fetch does (default: a connection of its own a turn, `Connection: close`)",
    )
    parser.add_argument("--fake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake:
        fake_main(args.fake)
        return
    args.users = [int(n) for n in args.users.split(",")]
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp)
        db = work / "db.sqlite3"
        port_file = work / "fake-url"
        fake = subprocess.Popen([sys.executable, __file__, "--fake", str(port_file)], cwd=ROOT)
        server = None
        try:
            # DEBUG off, as a served process: with DEBUG on Django keeps every query's SQL.
            served = {"LOG_LEVEL": "ERROR", "DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1"}
            env = server_env(db_path=db, extra=served)
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                cwd=tree,
                env=env,
                check=True,
                capture_output=True,
            )
            users = users_create(tree, env, 1 + sum(args.users) + 2 * args.hold)
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            env.update(
                GEOSENSE_LLM_BASE_URL=port_file.read_text(),
                GEOSENSE_LLM_MODEL="fake-model",
                GEOSENSE_CLIENT_TOOL_TIMEOUT="60",
            )
            if args.tracemalloc:
                args.tracemalloc = args.tracemalloc.resolve()
                args.tracemalloc.mkdir(parents=True, exist_ok=True)
                env.update(
                    BENCH_TRACEMALLOC_DIR=str(args.tracemalloc),
                    PYTHONPATH=str(ROOT / "bench" / "tracemalloc_site"),
                )
            port = free_port()
            log = (work / "daphne.log").open("wb")
            server = subprocess.Popen(
                [
                    sys.executable,
                    *(
                        ["-m", "cProfile", "-o", str(args.profile.resolve())]
                        if args.profile
                        else []
                    ),
                    *serve_module(tree),
                    *("-b", "127.0.0.1", "-p", str(port), APP),
                ],
                cwd=tree,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            port_wait(port)
            report = asyncio.run(bench(args, port, server.pid, db, users))
            tracebacks = (work / "daphne.log").read_text(errors="replace").count("Traceback")
            report["tree"] = str(tree)
            report["tracebacks_in_log"] = tracebacks
            print(json.dumps(report))
        finally:
            if server is not None:
                server.terminate()
                server.wait()
            fake.terminate()
            fake.wait()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
