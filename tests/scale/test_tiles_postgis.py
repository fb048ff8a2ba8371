"""The map's vector tiles on PostgreSQL come from PostGIS (`ST_AsMVT`, `tiles_postgis.py`) and
hold what the embedded encoder's hold on the same seeded demo: at zoom 16 and closer the same
annotations with the same classes and measures, shapes within a pixel; farther out the same
per-class counts, nothing lost. A deletion through one process changes the ETag of the tiles
it touches, as served by the other process, and of no other tile."""

import base64
import gzip
import json
import math
import urllib.error
import urllib.request
from collections import Counter

import mapbox_vector_tile
import pytest
import shapely

from tests.scale.client import Api
from tests.scale.cluster import ScaleCluster

EXTENT, TILE_PIXELS = 4096, 512
PIXEL = EXTENT / TILE_PIXELS  # one pixel of a 512-pixel tile, in tile units

# Both backends draw the same tiles in one process on the cluster's database, at one moment.
BOTH_BACKENDS = """
import base64, json
from geosense.annotations.tiles import IndexTileBackend, tile_backend
from geosense.annotations.tiles_postgis import PostgisTileBackend
index, postgis = IndexTileBackend(), PostgisTileBackend()
drawn = {{}}
for z, x, y in {tiles!r}:
    drawn[f"{{z}}/{{x}}/{{y}}"] = {{
        name: base64.b64encode(backend.render(z, x, y)).decode()
        for name, backend in (("index", index), ("postgis", postgis))
    }}
print(json.dumps({{
    "chosen": type(tile_backend()).__name__,
    "counts": {{"index": index.metadata().counts, "postgis": postgis.metadata().counts}},
    "tiles": drawn,
}}))
"""


def tile_of(lon: float, lat: float, z: int) -> tuple[int, int, int]:
    n = 2**z
    lat_r = math.radians(lat)
    return z, int((lon + 180) / 360 * n), int((1 - math.asinh(math.tan(lat_r)) / math.pi) / 2 * n)


def features(data: bytes) -> list[dict]:
    layers = mapbox_vector_tile.decode(
        gzip.decompress(data), default_options={"y_coord_down": True}
    )
    return layers.get("annotations", {"features": []})["features"]


def get_tile(
    api: Api, base: str, tile: tuple[int, int, int], etag: str = ""
) -> tuple[int, dict, bytes]:
    z, x, y = tile
    request = urllib.request.Request(
        f"{base}/tiles/annotations/{z}/{x}/{y}.mvt",
        headers={
            "Authorization": f"Bearer {api.token}",
            **({"If-None-Match": etag} if etag else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def drawn_by_both(cluster: ScaleCluster, tiles: list[tuple[int, int, int]]) -> dict:
    return json.loads(cluster.shell(BOTH_BACKENDS.format(tiles=tiles)).strip().splitlines()[-1])


def house_corner(cluster: ScaleCluster, offset: int = 0) -> tuple[int, float, float]:
    ((annotation_id, lon, lat),) = cluster.sql(
        "SELECT id, (min_lon + max_lon) / 2, (min_lat + max_lat) / 2 FROM annotations_annotation"
        " WHERE category = 'house' AND deleted_at IS NULL ORDER BY id OFFSET %s LIMIT 1",
        (offset,),
    )
    return annotation_id, lon, lat


def data_centre(cluster: ScaleCluster) -> tuple[float, float]:
    ((lon, lat),) = cluster.sql(
        "SELECT (min(min_lon) + max(max_lon)) / 2, (min(min_lat) + max(max_lat)) / 2"
        " FROM annotations_annotation WHERE deleted_at IS NULL"
    )
    return lon, lat


def per_class_total(found: list[dict]) -> Counter:
    total: Counter = Counter()
    for feature in found:
        total[feature["properties"]["class"]] += feature["properties"].get("count", 1)
    return total


@pytest.fixture
def tour(cluster: ScaleCluster) -> list[tuple[int, int, int]]:
    """Close tiles over a house (zooms 16, 17, 19) and far ones over the data's centre (12, 14)."""
    _, lon, lat = house_corner(cluster)
    centre = data_centre(cluster)
    return [tile_of(*centre, 12), tile_of(*centre, 14)] + [
        tile_of(lon, lat, z) for z in (16, 17, 19)
    ]


def test_the_served_tiles_are_postgis_s_and_hold_what_the_embedded_encoder_s_hold(
    cluster, scale_api, tour
):
    both = drawn_by_both(cluster, tour)
    assert both["chosen"] == "PostgisTileBackend"
    assert both["counts"]["postgis"] == both["counts"]["index"]

    for tile in tour:
        status, _, served = get_tile(scale_api, cluster.daphnes[0].url, tile)
        assert status == 200, served
        drawn = both["tiles"]["/".join(map(str, tile))]
        # What the process served is what ST_AsMVT draws (not the embedded encoder's bytes).
        assert features(served) == features(base64.b64decode(drawn["postgis"]))
        postgis = features(base64.b64decode(drawn["postgis"]))
        index = features(base64.b64decode(drawn["index"]))
        if tile[0] >= 16:
            assert_same_annotations(postgis, index)
        else:
            assert_same_counts(postgis, index)
    far = features(base64.b64decode(both["tiles"]["/".join(map(str, tour[0]))]["postgis"]))
    assert per_class_total(far) == Counter(both["counts"]["postgis"])  # zoom 12 loses nothing


def assert_same_annotations(postgis: list[dict], index: list[dict]) -> None:
    """The same ids, classes and measures, every shape within a pixel of the other's."""
    by_id = {f["properties"].get("id"): f for f in postgis}  # a count point has none
    expected = {f["properties"].get("id"): f for f in index}
    assert len(by_id) == len(postgis)
    assert None not in by_id and None not in expected
    assert set(by_id) == set(expected) and expected
    for annotation_id, want in expected.items():
        got = by_id[annotation_id]
        assert got["id"] == annotation_id
        assert got["properties"]["class"] == want["properties"]["class"]
        for measure in ("area_m2", "length_m"):
            assert (measure in got["properties"]) == (measure in want["properties"])
            if measure in want["properties"]:
                assert got["properties"][measure] == pytest.approx(
                    want["properties"][measure], abs=0.011
                )
        distance = shapely.hausdorff_distance(
            shapely.geometry.shape(got["geometry"]), shapely.geometry.shape(want["geometry"])
        )
        assert distance <= PIXEL, (annotation_id, got["geometry"], want["geometry"])


def assert_same_counts(postgis: list[dict], index: list[dict]) -> None:
    """The same drawn annotations (by id) and the same count points: per class and cell the
    same number, where the embedded encoder put it (to a tile unit)."""
    assert per_class_total(postgis) == per_class_total(index)
    drawn = {f["properties"]["id"] for f in postgis if "id" in f["properties"]}
    assert drawn == {f["properties"]["id"] for f in index if "id" in f["properties"]}

    def counts(found: list[dict]) -> list[tuple[str, int, tuple[int, int]]]:
        return sorted(
            (
                f["properties"]["class"],
                f["properties"]["count"],
                tuple(f["geometry"]["coordinates"]),
            )
            for f in found
            if "count" in f["properties"]
        )

    got, want = counts(postgis), counts(index)
    assert len(got) == len(want) and want
    for (got_class, got_n, got_at), (want_class, want_n, want_at) in zip(got, want, strict=True):
        assert (got_class, got_n) == (want_class, want_n)
        assert math.dist(got_at, want_at) <= 1.5
        assert all("id" not in f["properties"] for f in postgis if "count" in f["properties"])


SOFT_DELETE = """
from geosense.annotations.services import annotations_{verb}
print(annotations_{verb}(ids=[{annotation_id}]))
"""


def test_a_deletion_in_one_process_changes_the_etag_of_its_tiles_only_in_the_other(
    cluster, scale_api
):
    a, b = cluster.daphnes
    house, lon, lat = house_corner(cluster)
    near = tile_of(lon, lat, 17)
    offset = 1
    while tile_of(*house_corner(cluster, offset)[1:], 17) == near:
        offset += 1
    far = tile_of(*house_corner(cluster, offset)[1:], 17)
    _, near_before, body = get_tile(scale_api, b.url, near)
    _, far_before, _ = get_tile(scale_api, b.url, far)
    assert house in {f["properties"].get("id") for f in features(body)}

    cluster.shell(SOFT_DELETE.format(verb="soft_delete", annotation_id=house))
    try:
        status, near_after, body = get_tile(scale_api, b.url, near, near_before["ETag"])
        assert status == 200
        assert near_after["ETag"] != near_before["ETag"]
        assert house not in {f["properties"].get("id") for f in features(body)}
        assert get_tile(scale_api, a.url, near, near_after["ETag"])[0] == 304
        status, far_after, _ = get_tile(scale_api, b.url, far, far_before["ETag"])
        assert status == 304
        assert far_after["ETag"] == far_before["ETag"]
    finally:
        cluster.shell(SOFT_DELETE.format(verb="restore", annotation_id=house))
    status, restored, _ = get_tile(scale_api, a.url, near, near_before["ETag"])
    assert status == 304 and restored["ETag"] == near_before["ETag"]
