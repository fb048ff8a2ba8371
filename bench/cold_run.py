"""Time a cold `make run`: from `git clone` to the first served page, as a new user meets it.

Each run clones REF into a new temporary folder and starts `make run` there with none of the
project's variables in its environment (`tests/setup/fresh_clone.py`, as the fresh-clone
test does), then polls the login page until it answers 200. The package caches are empty for
every run (`--cache empty`, the default: a new machine) or shared by all runs of a ref and
filled by an untimed run first (`--cache warm`: another clone on the same machine). Several
refs are timed side by side, interleaved run by run, so they share the machine's load.

    .venv/bin/python bench/cold_run.py --ref main --ref HEAD --runs 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.setup.fresh_clone import MakeRun, clean_environment  # noqa: E402

TIMEOUT = 900.0


def cold_run(ref: str, cache: Path, log: Path) -> float:
    """Seconds from the start of `git clone` to the login page answering 200."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    env = clean_environment(PIP_CACHE_DIR=str(cache / "pip"), UV_CACHE_DIR=str(cache / "uv"))
    with tempfile.TemporaryDirectory(prefix="geosense-cold-") as workdir:
        clone = Path(workdir) / "geosense"
        started = time.perf_counter()
        subprocess.run(
            ["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True
        )
        subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone, check=True)
        run = MakeRun.start(clone, log, env)
        try:
            run.wait_served(TIMEOUT)
            return time.perf_counter() - started
        finally:
            run.stop()
            # When each line of make's output appeared: where the time goes.
            log.with_suffix(".timeline").write_text(
                "".join(f"{seconds:7.2f}  {line}\n" for seconds, line in run.timeline)
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", action="append", required=True, help="a git ref (repeatable)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", choices=["empty", "warm"], default="empty")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="geosense-cold-bench-"))
    times: dict[str, list[float]] = {ref: [] for ref in args.ref}
    if args.cache == "warm":
        for index, ref in enumerate(args.ref):
            cold_run(ref, scratch / f"cache-{index}", scratch / f"warm-up-{index}.log")
    for run in range(args.runs):
        for index, ref in enumerate(args.ref):
            cache = scratch / (f"cache-{index}" if args.cache == "warm" else f"empty-{index}")
            seconds = cold_run(ref, cache, scratch / f"run-{run + 1}-{index}.log")
            times[ref].append(seconds)
            print(f"run {run + 1} {ref}: {seconds:.1f} s", flush=True)
            if args.cache == "empty":
                shutil.rmtree(cache, ignore_errors=True)
    print(f"\n{args.runs} runs, package caches {args.cache}, medians (logs, timelines: {scratch}):")
    for ref, values in times.items():
        print(
            f"  {ref}: {statistics.median(values):.1f} s  ({', '.join(f'{v:.1f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
