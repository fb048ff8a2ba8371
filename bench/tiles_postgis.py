"""Vector tile latency on PostgreSQL: PostGIS's `ST_AsMVT` (`PostgisTileBackend`) against the
embedded encoder (`IndexTileBackend`, the in-process index) on the same database, in one run:

    .venv/bin/python bench/tiles_postgis.py [--annotations 200000] [--runs 1]

A throwaway PostgreSQL + PostGIS cluster on loopback (tests/scale/cluster.py), migrated and
seeded with `--annotations` demo annotations (seed 0). Both backends serve the scripted tour
of bench/tiles_scale.py (zooms 12 to 19: the tiles a 1280x800 map of 512-pixel tiles shows at
the data's centre and at two places panned away from it) through the whole view stack
(Django's test client, a logged-in user; a database connection per request, CONN_MAX_AGE=0),
in this process. Per backend, p50 / p99 / max over the tour:
- cold: each tile drawn for the first time (the backend's tile cache empty; PostgreSQL's own
  buffers are warm from the seed);
- warm: the same tile asked again without an ETag (the ETag worked out, the bytes from the
  cache);
- revalidated: asked with its ETag, 304;
and the cold median per zoom, the largest tile, the tile set document, and for the embedded
backend the time to build the index and the tiles' shapes first (what a process does before
its first tile). The backends run one after the other, PostGIS first.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiles_scale import percentile, viewport  # bench/ is on the path when a bench runs
from tools_scale import ms, rss_mb

KINDS = ("cold", "warm", "revalidated")


def database_start(annotations: int):
    """A migrated PostGIS database holding the seeded demo; returns the cluster to stop."""
    from tests.scale.cluster import PostgresCluster, postgres_bindir

    bindir = postgres_bindir()
    assert bindir is not None, "PostgreSQL is not installed"
    postgres = PostgresCluster(bindir=bindir).start()
    os.environ.update(
        DATABASE_URL=postgres.url,
        DEBUG="1",
        GEOSENSE_ENV_FILE="",
        GEOSENSE_INDEX_WARM="0",
        DJANGO_SETTINGS_MODULE="geosense.settings",
        ALLOWED_HOSTS="testserver",
    )
    import django

    django.setup()
    from django.core.management import call_command

    from geosense.annotations.services import demo_seed

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    demo_seed(annotations=annotations, seed=0)
    postgres.sql("VACUUM ANALYZE annotations_annotation")
    print(f"seeded {annotations:,} on PostgreSQL in {time.perf_counter() - started:.1f} s")
    return postgres


def tour_run(client, tour: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Latencies of the tour's tiles, cold, warm and revalidated, and their sizes."""

    def get(z: int, x: int, y: int, etag: str = "") -> tuple[float, Any]:
        headers = {"If-None-Match": etag} if etag else {}
        began = time.perf_counter()
        response = client.get(f"/tiles/annotations/{z}/{x}/{y}.mvt", headers=headers)
        return time.perf_counter() - began, response

    results: dict[str, list[float]] = {kind: [] for kind in KINDS}
    sizes, etags = {}, {}
    for tile in tour:
        seconds, response = get(*tile)
        assert response.status_code == 200, response.status_code
        results["cold"].append(seconds)
        sizes[tile] = len(response.content)
        etags[tile] = response["ETag"]
    for tile in tour:
        results["warm"].append(get(*tile)[0])
    for tile in tour:
        seconds, response = get(*tile, etags[tile])
        assert response.status_code == 304, response.status_code
        results["revalidated"].append(seconds)
    return {"results": results, "sizes": sizes}


def report(name: str, tour: list[tuple[int, int, int]], run: dict[str, Any]) -> None:
    results, sizes = run["results"], run["sizes"]
    print(f"{name}:")
    for kind in KINDS:
        values = results[kind]
        print(
            f"  {kind}: p50 {ms(percentile(values, 50))}, p99 {ms(percentile(values, 99))},"
            f" max {ms(max(values))}"
        )
    cold_by_zoom: dict[int, list[float]] = {}
    for tile, seconds in zip(tour, results["cold"], strict=True):
        cold_by_zoom.setdefault(tile[0], []).append(seconds)
    print(
        "  cold median per zoom: "
        + ", ".join(f"z{z} {ms(statistics.median(v))}" for z, v in sorted(cold_by_zoom.items()))
    )
    print(f"  largest tile: {max(sizes.values()) / 1000:.0f} KB; rss {rss_mb():,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--annotations", type=int, default=200_000)
    args = parser.parse_args()
    postgres = database_start(args.annotations)
    try:
        from django.contrib.auth import get_user_model
        from django.test import Client, override_settings

        from geosense.annotations import tiles
        from geosense.annotations.index import spatial_index
        from geosense.annotations.tiles_postgis import PostgisTileBackend

        user, _ = get_user_model().objects.get_or_create(username="bench-tiles")
        client = Client()
        client.force_login(user)
        assert isinstance(tiles.tile_backend(), PostgisTileBackend)
        began = time.perf_counter()
        meta = client.get("/tiles/annotations.json").json()
        print(f"tile set document (PostGIS, first): {ms(time.perf_counter() - began)}")
        west, south, east, north = meta["bounds"]
        lon, lat = (west + east) / 2, (south + north) / 2
        places = [(lon, lat), (lon + (east - west) / 5, lat), (lon, lat - (north - south) / 5)]
        tour = list(
            dict.fromkeys(t for z in range(12, 20) for p in places for t in viewport(*p, z))
        )
        print(f"tour: {len(tour)} tiles, zooms 12-19 ({meta['total']:,} annotations)\n")
        report("PostGIS (ST_AsMVT)", tour, tour_run(client, tour))

        with override_settings(GEOSENSE_SPATIAL_BACKEND="index"):
            assert isinstance(tiles.tile_backend(), tiles.IndexTileBackend)
            began = time.perf_counter()
            index = spatial_index()
            for class_index in index.classes.values():  # tiles_warm's shapes, no tile drawn
                tiles._mercator_of(class_index, index)
            print(
                f"\nembedded: index and tiles' shapes built in"
                f" {time.perf_counter() - began:.1f} s; rss {rss_mb():,.0f} MB"
            )
            report("embedded (IndexTileBackend)", tour, tour_run(client, tour))
    finally:
        from django.db import connections

        connections.close_all()
        postgres.stop()


if __name__ == "__main__":
    main()
