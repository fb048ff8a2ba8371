"""Vector tile latency and size at scale, through the whole view stack (Django's test client,
a logged-in user), in one process:

    .venv/bin/python bench/tiles_scale.py --database /tmp/geosense-1m.sqlite3 [--annotations 1000000]
        [--before /tmp/before-checkout]

The database is seeded as bench/tools_scale.py seeds it (when it holds another number). A
scripted tour: zooms 12 to 19, at each the tiles a 1280x800 map shows (512-pixel tiles) at the
data's centre and at two places panned away from it. Reported per request kind, p50 / p99 / max
of the wall time over the tour, and the CPU time of the process per tile:
- cold: the tile drawn for the first time (nothing drawn before it: the tile cache is emptied
  after the start-up work, so the initial tiles `tiles_warm` draws do not count as cold);
- warm: the same tile asked again without an ETag (served from the cache);
- revalidated: asked with its ETag (`If-None-Match`): 304, what a browser that has it does;
then the issue 17 targets (p50 < 30 ms, p99 < 150 ms, warm and cold) met or missed, the median
cold tile per zoom, the largest tile of the tour and of zooms 0 to 11 over the data's centre,
the start-up work (the index, the tiles' shapes and initial tiles), and the load average.

With `--before ROOT`, the same tour runs twice, one process after the other on the same
database: the checkout at ROOT (GEOSENSE_ROOT: its code, this script), then this checkout;
printed side by side with ratios (after / before).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools_scale import ROOT, ms, rss_mb, setup  # bench/ is on the path when a bench runs

TARGET_P50, TARGET_P99 = 0.030, 0.150
KINDS = ("cold", "warm", "revalidated")


def tile_of(lon: float, lat: float, z: int) -> tuple[float, float]:
    n = 2**z
    lat_r = math.radians(lat)
    return (lon + 180) / 360 * n, (1 - math.asinh(math.tan(lat_r)) / math.pi) / 2 * n


def viewport(lon: float, lat: float, z: int) -> list[tuple[int, int, int]]:
    """The tiles of a 1280x800 map of 512-pixel tiles centred on lon/lat at zoom z."""
    fx, fy = tile_of(lon, lat, z)
    half_w, half_h = 1280 / 512 / 2, 800 / 512 / 2
    return [
        (z, x, y)
        for x in range(math.floor(fx - half_w), math.floor(fx + half_w) + 1)
        for y in range(math.floor(fy - half_h), math.floor(fy + half_h) + 1)
    ]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(database: str, annotations: int) -> dict:
    """The tour in this process: every figure the summary prints, as plain data."""
    os.environ["ALLOWED_HOSTS"] = "testserver"
    setup(database, annotations)
    from django.contrib.auth import get_user_model
    from django.test import Client

    from geosense.annotations import tiles
    from geosense.annotations.index import spatial_index

    found = {"load_start": load_average(), "root": str(ROOT)}
    started = time.perf_counter()
    index = spatial_index()
    found["index_s"] = time.perf_counter() - started
    started = time.perf_counter()
    tiles.tiles_warm(index)
    found["warm_start_s"] = time.perf_counter() - started
    found["rss_start_mb"] = rss_mb()
    backend = tiles.tile_backend()
    memo = backend.memo
    backend.memo = tiles.TileMemo(cache_bytes=memo.cache_bytes, tags_kept=memo.tags_kept)
    meta = backend.metadata()
    west, south, east, north = meta.bounds
    lon, lat = (west + east) / 2, (south + north) / 2
    places = [(lon, lat), (lon + (east - west) / 5, lat), (lon, lat - (north - south) / 5)]
    tour = [t for z in range(12, 20) for p in places for t in viewport(*p, z)]
    tour = list(dict.fromkeys(tour))
    found["initial_in_tour"] = len(set(tiles.initial_tiles(meta.bounds)) & set(tour))
    user, _ = get_user_model().objects.get_or_create(username="bench-tiles")
    client = Client()
    client.force_login(user)

    def get(z, x, y, etag=None):
        headers = {"If-None-Match": etag} if etag else {}
        began, cpu = time.perf_counter(), time.process_time()
        response = client.get(f"/tiles/annotations/{z}/{x}/{y}.mvt", headers=headers)
        return time.perf_counter() - began, time.process_time() - cpu, response

    wall = {kind: [] for kind in KINDS}
    cpu = {kind: [] for kind in KINDS}
    sizes, etags = [], {}
    for kind in KINDS:
        for t in tour:
            seconds, used, response = get(*t, etags.get(t) if kind == "revalidated" else None)
            assert response.status_code == (304 if kind == "revalidated" else 200), t
            wall[kind].append(seconds)
            cpu[kind].append(used)
            if kind == "cold":
                sizes.append(len(response.content))
                etags[t] = response["ETag"]
    low = []
    for z in range(0, 12):
        fx, fy = tile_of(lon, lat, z)
        seconds, _, response = get(z, int(fx), int(fy))
        low.append((z, len(response.content), seconds))
    found.update(
        total=meta.total,
        tour=tour,
        wall=wall,
        cpu=cpu,
        sizes=sizes,
        low=low,
        max_tile_bytes=tiles.MAX_TILE_BYTES,
        rss_end_mb=rss_mb(),
        load_end=load_average(),
    )
    return found


def summary(found: dict) -> dict[str, str]:
    """Label → figure, in the order printed."""
    rows = {}
    tour = [tuple(t) for t in found["tour"]]
    rows["annotations / tour"] = f"{found['total']:,} / {len(tour)} tiles, zooms 12-19"
    for kind in KINDS:
        wall, cpu = found["wall"][kind], found["cpu"][kind]
        rows[f"{kind} p50 / p99 / max"] = (
            f"{ms(percentile(wall, 50))} / {ms(percentile(wall, 99))} / {ms(max(wall))}"
        )
        rows[f"{kind} CPU per tile p50 / p99"] = (
            f"{ms(percentile(cpu, 50))} / {ms(percentile(cpu, 99))}"
        )
    for kind in ("cold", "warm"):
        wall = found["wall"][kind]
        p50, p99 = percentile(wall, 50), percentile(wall, 99)
        rows[f"targets, {kind}"] = (
            f"p50 < 30 ms {'met' if p50 < TARGET_P50 else 'MISSED'},"
            f" p99 < 150 ms {'met' if p99 < TARGET_P99 else 'MISSED'}"
        )
    by_zoom: dict[int, list[float]] = {}
    cpu_by_zoom: dict[int, list[float]] = {}
    largest: dict[int, int] = {}
    cold = zip(tour, found["wall"]["cold"], found["cpu"]["cold"], found["sizes"], strict=True)
    for t, seconds, used, size in cold:
        by_zoom.setdefault(t[0], []).append(seconds)
        cpu_by_zoom.setdefault(t[0], []).append(used)
        largest[t[0]] = max(largest.get(t[0], 0), size)
    for label, values in (
        ("cold median per zoom", by_zoom),
        ("cold CPU median per zoom", cpu_by_zoom),
    ):
        rows[f"{label} (ms)"] = ", ".join(
            f"z{z} {statistics.median(v) * 1000:,.0f}" for z, v in sorted(values.items())
        )
    rows["largest tile per zoom (KB)"] = ", ".join(
        f"z{z} {s / 1000:.0f}" for z, s in sorted(largest.items())
    )
    rows["zooms 0-11 over the centre (KB / ms)"] = ", ".join(
        f"z{z} {s / 1000:.0f}/{t * 1000:,.0f}" for z, s, t in found["low"]
    )
    every = [*found["sizes"], *(s for _, s, _ in found["low"])]
    rows["largest tile"] = (
        f"{max(every) / 1000:.0f} KB (cap {found['max_tile_bytes'] / 1000:.0f} KB)"
    )
    rows["start: index + shapes and initial tiles"] = (
        f"{found['index_s']:.1f} s + {found['warm_start_s']:.1f} s"
        f" ({found['initial_in_tour']} of the tour's tiles among the initial ones)"
    )
    rows["rss after start / end"] = f"{found['rss_start_mb']:,.0f} / {found['rss_end_mb']:,.0f} MB"
    rows["load average start / end"] = f"{found['load_start']} / {found['load_end']}"
    return rows


def side_by_side(before: dict, after: dict) -> None:
    left, right = summary(before), summary(after)
    print(f"before: {before['root']}\nafter:  {after['root']}\n")
    for label in left:
        print(f"{label}\n  before: {left[label]}\n  after:  {right[label]}")
        kind = label.split()[0]
        if kind not in KINDS or "p50" not in label:
            continue
        measure, points = ("cpu", (50, 99)) if "CPU" in label else ("wall", (50, 99, 100))
        ratios = [
            percentile(after[measure][kind], p) / percentile(before[measure][kind], p)
            for p in points
        ]
        print("  after / before: " + " / ".join(f"{r:.2f}x" for r in ratios))


def run_in(root: Path, args: argparse.Namespace) -> dict:
    """This script in a process of its own, with the code of the checkout at root."""
    command = [sys.executable, __file__, "--database", args.database, "--json"]
    command += ["--annotations", str(args.annotations)]
    env = {**os.environ, "GEOSENSE_ROOT": str(root)}
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", required=True)
    parser.add_argument("--annotations", type=int, default=1_000_000)
    parser.add_argument("--before", help="another checkout to measure first, side by side")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    if args.before:
        before = run_in(Path(args.before).resolve(), args)
        after = run_in(Path(__file__).resolve().parent.parent, args)
        side_by_side(before, after)
        return
    found = measure(args.database, args.annotations)
    if args.json:
        print(json.dumps(found))
        return
    for label, figure in summary(found).items():
        print(f"{label}: {figure}")


if __name__ == "__main__":
    main()
