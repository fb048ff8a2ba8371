"""What one trip to the engine's database pool costs the event loop, in isolation.

    .venv/bin/python bench/pool_trip.py [--trips 3000] [--tree PATH]

Runs, in a child process on `--tree` (default: this checkout; a worktree of an older commit
measures "before"), trips of a function that does nothing through `dbpool.in_db_thread`, one
after another, and prints as JSON the Python calls the loop's thread made for one trip
(`sys.setprofile`, that thread only) and the loop thread's CPU per trip (`time.thread_time`:
the pool thread's work is not in it). The turn engine makes about ten such trips a turn.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import asyncio, json, sys, time
import django
django.setup()
from geosense import dbpool

def nothing(n):
    return n

async def main(trips):
    trip = dbpool.in_db_thread(nothing)
    await trip(0)
    calls = 0

    def counted(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(counted)
    await trip(1)
    sys.setprofile(None)
    started = time.thread_time()
    for n in range(trips):
        await trip(n)
    cpu = (time.thread_time() - started) / trips
    print(json.dumps({"python_calls_per_trip": calls, "loop_cpu_us_per_trip": round(cpu * 1e6, 1)}))

asyncio.run(main(int(sys.argv[1])))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=3000)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    tree = args.tree.resolve()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.trips)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(json.dumps({"tree": str(tree), **json.loads(out.splitlines()[-1])}))


if __name__ == "__main__":
    main()
