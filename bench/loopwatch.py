"""Daphne with a watch on its event loop: how long each callback held the loop, and when.

    python bench/loopwatch.py OUT_FILE DAPHNE_ARGS...   (run with cwd = the checkout to serve)

Every callback the asyncio loop runs (a task step, a protocol's data_received, a timer) is
timed by wrapping `asyncio.events.Handle._run`; those of at least `MIN_SECONDS` are kept as
(start, wall time, CPU time of the loop thread) on the shared monotonic clock, so a bench in another process can tell which
ran during a window it timed. A thread samples the loop thread's stack once per callback that runs past 4 ms (what held the
loop). SIGUSR1 writes both to OUT_FILE as JSON (and starts afresh); SIGUSR2 starts a cProfile
of the loop thread, and the next SIGUSR2 writes it to OUT_FILE.prof-N. With LOOPWATCH_SERVED=1
each served client-tool call of a turn is timed whole and its round trip apart.
The wrapper costs about a microsecond per callback, the same for every tree measured.
It watches asyncio's own loop only: uvloop's handles are C and never call `Handle._run`, so
under uvloop's policy it refuses to start rather than report an empty watch (a served process
runs uvloop, `python -m geosense.serve`: these figures are asyncio's).
"""

from __future__ import annotations

import asyncio.events
import cProfile
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

MIN_SECONDS = 0.0001
# A callback still running after this long gets its stack sampled (what held the loop).
SAMPLE_AFTER_SECONDS = 0.004
_kept: list[tuple[float, float, float]] = []  # (start, wall, CPU of the loop thread)
_running: dict[str, float] = {}  # "started" → when the running callback started
_stacks: dict[str, int] = {}  # the sampled stacks of long callbacks, innermost last


def _watch() -> None:
    original = asyncio.events.Handle._run
    clock = time.monotonic

    cpu_clock = time.thread_time

    def timed(self: Any) -> None:
        started = _running["started"] = clock()
        cpu = cpu_clock()
        try:
            original(self)
        finally:
            _running["started"] = 0.0
            took = clock() - started
            if took >= MIN_SECONDS:
                _kept.append((started, took, cpu_clock() - cpu))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


def _sampler(loop_thread: int) -> None:
    """Once per long callback, the loop thread's stack (in our code and the libraries')."""
    sampled = 0.0
    while True:
        time.sleep(0.001)
        started = _running.get("started", 0.0)
        if not started or started == sampled or time.monotonic() - started < SAMPLE_AFTER_SECONDS:
            continue
        frame = sys._current_frames().get(loop_thread)
        if frame is None:
            continue
        sampled = started
        stack = [
            f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
            for f in traceback.extract_stack(frame)[-14:]
        ]
        key = "\n".join(stack)
        _stacks[key] = _stacks.get(key, 0) + 1


def _dump_on_signal(out: Path) -> None:
    def dump(signum: int, frame: Any) -> None:
        kept = _kept[:]
        del _kept[: len(kept)]
        stacks = sorted(_stacks.items(), key=lambda item: -item[1])
        _stacks.clear()
        tmp = out.with_suffix(".tmp")
        served = _served[:]
        del _served[: len(served)]
        tmp.write_text(json.dumps({"callbacks": kept, "stacks": stacks, "served": served}))
        tmp.replace(out)

    signal.signal(signal.SIGUSR1, dump)
    profiles: list[cProfile.Profile] = []

    def profile(signum: int, frame: Any) -> None:
        """SIGUSR2: start profiling the loop thread; again: stop, write OUT_FILE.prof-N."""
        if profiles and profiles[-1] is not None:
            profiles[-1].disable()
            profiles[-1].dump_stats(f"{out}.prof-{len(profiles)}")
            profiles.append(None)  # type: ignore[arg-type]
        else:
            profiles.append(cProfile.Profile())
            profiles[-1].enable()

    signal.signal(signal.SIGUSR2, profile)


# With LOOPWATCH_SERVED=1, per served client-tool call of a turn: the engine's whole handling
# (`TurnRunner._client_call`: the client_tool_call event, the bound per turn, the round trip,
# the result stored with the lease) and its round trip alone (`client_tool_request`).
_served: list[tuple[float, float]] = []


def _served_calls_timed() -> None:
    import django

    django.setup()
    from chat import turns
    from tools import client

    request, handle = client.client_tool_request, turns.TurnRunner._client_call
    last = [0.0]

    async def timed_request(**kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await request(**kwargs)
        finally:
            last[0] = time.perf_counter() - started

    async def timed_handle(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        outcome = await handle(self, *args, **kwargs)
        _served.append((time.perf_counter() - started, last[0]))
        return outcome

    client.client_tool_request = timed_request  # type: ignore[assignment]
    turns.TurnRunner._client_call = timed_handle  # type: ignore[method-assign]


def main() -> None:
    if not isinstance(asyncio.get_event_loop_policy(), asyncio.DefaultEventLoopPolicy):
        raise SystemExit("loopwatch times asyncio's own loop's callbacks: run it without uvloop")
    out = Path(sys.argv[1])
    sys.argv = ["daphne", *sys.argv[2:]]
    sys.path.insert(0, os.getcwd())
    _watch()
    if os.environ.get("LOOPWATCH_SERVED"):
        _served_calls_timed()
    threading.Thread(target=_sampler, args=(threading.get_ident(),), daemon=True).start()
    _dump_on_signal(out)
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
