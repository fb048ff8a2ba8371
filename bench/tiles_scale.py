"""Vector tile latency and size at scale, through the whole view stack (Django's test client,
a logged-in user), in one process:

    .venv/bin/python bench/tiles_scale.py --database /tmp/geosense-1m.sqlite3 [--annotations 1000000]

The database is seeded as bench/tools_scale.py seeds it. A scripted tour: zooms 12 to 19, at
each the tiles a 1280x800 map shows (512-pixel tiles) at the data's centre and at two places
panned away from it. Reported per request kind, p50 / p99 / max over the tour:
- cold: the tile drawn for the first time (the server's tile cache empty);
- warm: the same tile asked again without an ETag (served from the cache);
- revalidated: asked with its ETag (`If-None-Match`): 304, what a browser that has it does;
and the largest tile of the tour and of zooms 0 to 11 over the data's centre, and the time to
work out the tiles' shapes once (done at start with GEOSENSE_INDEX_WARM).
"""

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools_scale import ms, rss_mb, setup  # bench/ is on the path when a bench runs


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", required=True)
    parser.add_argument("--annotations", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ["ALLOWED_HOSTS"] = "testserver"
    setup(args.database, args.annotations)
    from django.contrib.auth import get_user_model
    from django.test import Client

    from geosense.annotations import tiles
    from geosense.annotations.index import spatial_index

    started = time.perf_counter()
    index = spatial_index()
    print(f"index built in {time.perf_counter() - started:.1f} s; rss {rss_mb():,.0f} MB")
    started = time.perf_counter()
    tiles.tiles_warm(index)
    print(
        f"tiles' shapes worked out in {time.perf_counter() - started:.1f} s; rss {rss_mb():,.0f} MB"
    )
    meta = tiles.tile_backend().metadata()
    west, south, east, north = meta.bounds
    lon, lat = (west + east) / 2, (south + north) / 2
    places = [(lon, lat), (lon + (east - west) / 5, lat), (lon, lat - (north - south) / 5)]
    tour = [t for z in range(12, 20) for p in places for t in viewport(*p, z)]
    tour = list(dict.fromkeys(tour))
    user, _ = get_user_model().objects.get_or_create(username="bench-tiles")
    client = Client()
    client.force_login(user)

    def get(z, x, y, etag=None):
        headers = {"If-None-Match": etag} if etag else {}
        began = time.perf_counter()
        response = client.get(f"/tiles/annotations/{z}/{x}/{y}.mvt", headers=headers)
        return time.perf_counter() - began, response

    results = {"cold": [], "warm": [], "revalidated": []}
    sizes = {}
    etags = {}
    for t in tour:
        seconds, response = get(*t)
        assert response.status_code == 200, response.status_code
        results["cold"].append(seconds)
        sizes[t] = len(response.content)
        etags[t] = response["ETag"]
    for t in tour:
        results["warm"].append(get(*t)[0])
    for t in tour:
        seconds, response = get(*t, etags[t])
        assert response.status_code == 304
        results["revalidated"].append(seconds)
    print(f"\ntour: {len(tour)} tiles, zooms 12-19 ({meta.total:,} annotations)")
    for kind, values in results.items():
        print(
            f"  {kind}: p50 {ms(percentile(values, 50))}, p99 {ms(percentile(values, 99))},"
            f" max {ms(max(values))}"
        )
    by_zoom = {}
    for (z, _, _), size in sizes.items():
        by_zoom[z] = max(by_zoom.get(z, 0), size)
    print(
        "  largest tile per zoom (KB): "
        + ", ".join(f"z{z} {s / 1000:.0f}" for z, s in sorted(by_zoom.items()))
    )
    cold_by_zoom = {}
    for t, seconds in zip(tour, results["cold"], strict=True):
        cold_by_zoom.setdefault(t[0], []).append(seconds)
    print(
        "  cold median per zoom: "
        + ", ".join(f"z{z} {ms(statistics.median(v))}" for z, v in sorted(cold_by_zoom.items()))
    )
    low = []
    for z in range(0, 12):
        fx, fy = tile_of(lon, lat, z)
        seconds, response = get(z, int(fx), int(fy))
        low.append((z, len(response.content), seconds))
    print(
        "zooms 0-11 over the centre (size KB / cold): "
        + ", ".join(f"z{z} {s / 1000:.0f}/{ms(t)}" for z, s, t in low)
    )
    largest = max([*sizes.values(), *(s for _, s, _ in low)])
    print(
        f"largest tile: {largest / 1000:.0f} KB (cap {tiles.MAX_TILE_BYTES / 1000:.0f} KB); rss {rss_mb():,.0f} MB"
    )


if __name__ == "__main__":
    main()
