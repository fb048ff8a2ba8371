"""For `bench/load.py --tracemalloc DIR` only (on the server's PYTHONPATH): the first SIGUSR1
starts tracing the server's allocations (from start-up it slowed the start past minutes);
each later one collects garbage and dumps a snapshot to DIR/snapshot-<n>.bin."""

import os

OUT = os.environ.get("BENCH_TRACEMALLOC_DIR")
if OUT:
    import gc
    import signal
    import tracemalloc
    from pathlib import Path

    signals = []

    def _dump(signum, frame) -> None:
        signals.append(1)
        if len(signals) == 1:
            tracemalloc.start(12)
        else:
            gc.collect()
            tracemalloc.take_snapshot().dump(str(Path(OUT) / f"snapshot-{len(signals)}.bin"))
        (Path(OUT) / f"snapshot-{len(signals)}.done").touch()

    signal.signal(signal.SIGUSR1, _dump)
