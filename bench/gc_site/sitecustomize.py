"""On the server's PYTHONPATH (`PYTHONPATH=bench/gc_site`, with `BENCH_GC_OUT=FILE`): the
garbage collector's passes in the server, per generation, written to FILE as JSON
`BENCH_GC_SECONDS` (default 14) after the server started: passes, their summed and longest
wall and CPU time (the collecting thread's), and the objects each generation found kept only by
cycles. The server holds the GIL through a pass: its CPU time is a pause of the whole process."""

import os
import sys

OUT = os.environ.get("BENCH_GC_OUT")
if OUT and any(name in " ".join(sys.orig_argv) for name in ("daphne", "geosense.serve")):
    import gc
    import json
    import threading
    import time

    _passes = {
        g: {"n": 0, "wall": 0.0, "wall_max": 0.0, "cpu": 0.0, "cpu_max": 0.0, "found": 0}
        for g in (0, 1, 2)
    }
    _began: dict[str, float] = {}

    def _pass(phase: str, info: dict) -> None:
        if phase == "start":
            _began["wall"], _began["cpu"] = time.perf_counter(), time.thread_time()
            return
        wall = time.perf_counter() - _began["wall"]
        cpu = time.thread_time() - _began["cpu"]
        entry = _passes[info["generation"]]
        entry["n"] += 1
        entry["wall"] += wall
        entry["cpu"] += cpu
        entry["wall_max"] = max(entry["wall_max"], wall)
        entry["cpu_max"] = max(entry["cpu_max"], cpu)
        entry["found"] += info["collected"]

    def _write() -> None:
        time.sleep(float(os.environ.get("BENCH_GC_SECONDS", "14")))
        report = {
            "passes": _passes,
            "tracked": len(gc.get_objects()),
            "frozen": gc.get_freeze_count(),
        }
        with open(OUT, "w") as out:
            json.dump(report, out)

    gc.callbacks.append(_pass)
    threading.Thread(target=_write, daemon=True).start()
