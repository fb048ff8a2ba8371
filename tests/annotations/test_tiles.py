"""The map's vector tiles against the index: what each zoom holds, ETags, 304s, auth, sizes."""

import gzip
import math

import mapbox_vector_tile
import numpy as np
import pytest
import shapely
from django.contrib.auth import get_user_model

from geosense.accounts.services import api_token_create
from geosense.annotations import tiles
from geosense.annotations.index import spatial_index
from geosense.annotations.services import annotation_create, annotations_soft_delete, demo_seed
from geosense.annotations.tiles import EXTENT, TILE_PIXELS, tile_bounds

from .shapes import line, point, rectangle

pytestmark = pytest.mark.django_db
PIXEL = EXTENT / TILE_PIXELS  # one pixel of a 512-pixel tile, in tile units


@pytest.fixture
def user():
    return get_user_model().objects.create_user(username="ana", password="pw-ana-123")


@pytest.fixture
def logged_in(client, user):
    client.force_login(user)
    return client


def tile_of(lon: float, lat: float, z: int) -> tuple[int, int]:
    n = 2**z
    x = int((lon + 180) / 360 * n)
    lat_r = math.radians(lat)
    y = int((1 - math.log(math.tan(lat_r) + 1 / math.cos(lat_r)) / math.pi) / 2 * n)
    return x, y


def decoded(response) -> list[dict]:
    assert response["Content-Type"] == "application/vnd.mapbox-vector-tile"
    assert response["Content-Encoding"] == "gzip"
    layers = mapbox_vector_tile.decode(
        gzip.decompress(response.content), default_options={"y_coord_down": True}
    )
    return layers.get("annotations", {"features": []})["features"]


def expected_in_tile(z: int, x: int, y: int) -> dict[int, tuple[str, object]]:
    """id → (class, shape in tile units, clipped to the buffered tile) of every live annotation
    whose Mercator bounds meet the buffered tile, worked out from the index."""
    index = spatial_index()
    west, south, east, north = tile_bounds(z, x, y)
    size = east - west
    pad = size * tiles.BUFFER / EXTENT
    found = {}
    for name, class_index in index.classes.items():
        shapes = shapely.transform(index.projection.unproject(class_index.geoms), tiles.mercator)
        for annotation_id, shape in zip(class_index.ids.tolist(), shapes, strict=True):
            minx, miny, maxx, maxy = shape.bounds
            if maxx < west - pad or minx > east + pad or maxy < south - pad or miny > north + pad:
                continue
            local = shapely.transform(
                shape,
                lambda c: np.column_stack(
                    [(c[:, 0] - west) * EXTENT / size, (north - c[:, 1]) * EXTENT / size]
                ),
            )
            clipped = shapely.clip_by_rect(
                local, -tiles.BUFFER, -tiles.BUFFER, EXTENT + tiles.BUFFER, EXTENT + tiles.BUFFER
            )
            if not clipped.is_empty:
                found[annotation_id] = (name, clipped)
    return found


@pytest.fixture
def neighbourhood():
    demo_seed(annotations=2000, seed=0)
    return spatial_index()


@pytest.mark.parametrize("z", [16, 17, 19])
def test_every_annotation_of_a_close_tile_is_in_it_with_its_exact_shape(
    logged_in, neighbourhood, z
):
    x, y = tile_of(-118.5214, 34.1566, z)
    features = decoded(logged_in.get(f"/tiles/annotations/{z}/{x}/{y}.mvt"))
    expected = expected_in_tile(z, x, y)

    by_id = {f["properties"]["id"]: f for f in features}
    assert len(by_id) == len(features)
    assert set(by_id) == set(expected)
    assert len(expected) > 10
    for annotation_id, (name, shape) in expected.items():
        feature = by_id[annotation_id]
        assert feature["properties"]["class"] == name
        got = shapely.geometry.shape(feature["geometry"])
        assert shapely.hausdorff_distance(got, shape) <= PIXEL, annotation_id
        if shape.geom_type.endswith("Polygon"):
            assert feature["properties"]["area_m2"] > 0


def test_a_far_tile_counts_what_is_smaller_than_a_pixel_and_loses_nothing(logged_in, neighbourhood):
    z = 12
    x, y = tile_of(-118.5214, 34.1566, z)
    features = decoded(logged_in.get(f"/tiles/annotations/{z}/{x}/{y}.mvt"))

    counted: dict[str, int] = {}
    for feature in features:
        properties = feature["properties"]
        if "count" in properties:
            assert "id" not in properties
            assert feature["geometry"]["type"] == "Point"
        counted[properties["class"]] = counted.get(properties["class"], 0) + properties.get(
            "count", 1
        )
    assert counted == neighbourhood.counts()
    assert any("count" in f["properties"] for f in features)
    # Roads are longer than a pixel even this far out: drawn as lines, with their ids.
    assert any(
        f["properties"]["class"] == "road" and f["geometry"]["type"] == "LineString"
        for f in features
    )


def test_the_tileset_counts_every_live_annotation_per_class_as_the_api_does(
    logged_in, neighbourhood
):
    annotations_soft_delete(ids=[1, 2, 3])
    tileset = logged_in.get("/tiles/annotations.json").json()
    features = logged_in.get("/api/annotations").json()["features"]

    api_counts: dict[str, int] = {}
    for feature in features:
        name = feature["properties"]["class"]
        api_counts[name] = api_counts.get(name, 0) + 1
    assert tileset["counts"] == api_counts
    assert tileset["total"] == len(features) == 1997
    assert tileset["tiles"] == ["/tiles/annotations/{z}/{x}/{y}.mvt"]
    assert (tileset["minzoom"], tileset["maxzoom"]) == (0, 22)
    west, south, east, north = tileset["bounds"]
    assert west < -118.5214 < east and south < 34.1566 < north
    assert tileset["revision"]


def test_a_deletion_changes_the_etag_of_the_tiles_it_touches_and_no_other(logged_in):
    here = annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    annotation_create(category="house", geometry=rectangle(-118.40, 34.15, 12, 10))
    z = 16
    x, y = tile_of(-118.52, 34.15, z)
    fx, fy = tile_of(-118.40, 34.15, z)
    near, far = f"/tiles/annotations/{z}/{x}/{y}.mvt", f"/tiles/annotations/{z}/{fx}/{fy}.mvt"
    first_near, first_far = logged_in.get(near), logged_in.get(far)
    assert logged_in.get(near)["ETag"] == first_near["ETag"]  # nothing changed, nothing new

    annotations_soft_delete(ids=[here.pk])

    second_near, second_far = logged_in.get(near), logged_in.get(far)
    assert second_near["ETag"] != first_near["ETag"]
    assert decoded(second_near) == []
    assert second_far["ETag"] == first_far["ETag"]
    assert second_near["Cache-Control"] == "private, no-cache"


def test_a_tile_asked_again_with_its_etag_answers_304(logged_in):
    annotation_create(category="tree", geometry=point(-118.52, 34.15))
    x, y = tile_of(-118.52, 34.15, 17)
    url = f"/tiles/annotations/17/{x}/{y}.mvt"
    tag = logged_in.get(url)["ETag"]

    again = logged_in.get(url, headers={"If-None-Match": tag})
    other = logged_in.get(url, headers={"If-None-Match": '"something-else"'})

    assert again.status_code == 304
    assert again.content == b""
    assert again["ETag"] == tag
    assert other.status_code == 200
    assert len(decoded(other)) == 1


def test_tiles_need_a_login_or_a_bearer_token(client, user):
    annotation_create(category="tree", geometry=point(-118.52, 34.15))
    x, y = tile_of(-118.52, 34.15, 17)
    url = f"/tiles/annotations/17/{x}/{y}.mvt"

    for path in (url, "/tiles/annotations.json"):
        anonymous = client.get(path)
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": "authentication required"}
        assert client.get(path, headers={"Authorization": "Bearer gs_nope"}).status_code == 401

    token = api_token_create(user=user)
    with_token = client.get(url, headers={"Authorization": f"Bearer {token}"})
    assert with_token.status_code == 200
    assert decoded(with_token)[0]["properties"]["class"] == "tree"
    tileset = client.get("/tiles/annotations.json", headers={"Authorization": f"Bearer {token}"})
    assert tileset.json()["counts"] == {"tree": 1}


def test_tiles_outside_the_world_are_json_404s(logged_in):
    for path in ("/tiles/annotations/3/8/0.mvt", "/tiles/annotations/23/0/0.mvt"):
        answer = logged_in.get(path)
        assert answer.status_code == 404
        assert "error" in answer.json()
    assert logged_in.post("/tiles/annotations/3/1/1.mvt").status_code in (403, 405)


def test_a_far_tile_of_many_annotations_is_made_coarser_until_it_fits(logged_in, monkeypatch):
    demo_seed(annotations=20_000, seed=0)
    z = 14
    x, y = tile_of(-118.5214, 34.1566, z)
    url = f"/tiles/annotations/{z}/{x}/{y}.mvt"
    whole = logged_in.get(url)
    assert len(whole.content) <= tiles.MAX_TILE_BYTES
    cap = len(whole.content) // 3
    monkeypatch.setattr(tiles, "MAX_TILE_BYTES", cap)
    monkeypatch.setattr(tiles, "ENCODING_VERSION", "capped")  # another ETag: not the cached one

    capped = logged_in.get(url)

    assert len(capped.content) <= cap
    counted = sum(f["properties"].get("count", 1) for f in decoded(capped))
    assert counted == sum(f["properties"].get("count", 1) for f in decoded(whole))


def test_lines_carry_their_length(logged_in):
    road = annotation_create(category="road", geometry=line((-118.5205, 34.15), (-118.5195, 34.15)))
    x, y = tile_of(-118.52, 34.15, 17)
    (feature,) = decoded(logged_in.get(f"/tiles/annotations/17/{x}/{y}.mvt"))
    assert feature["properties"] == {
        "id": road.pk,
        "class": "road",
        "length_m": round(road.length_m, 2),
    }


def test_the_demo_draws_its_blocks_parks_and_lots_as_a_base_layer(logged_in, neighbourhood):
    def base(z: int, lon: float, lat: float) -> list[str]:
        x, y = tile_of(lon, lat, z)
        response = logged_in.get(f"/tiles/annotations/{z}/{x}/{y}.mvt")
        layers = mapbox_vector_tile.decode(gzip.decompress(response.content))
        return [f["properties"]["kind"] for f in layers.get("base", {"features": []})["features"]]

    # Block (-1, 0) is a park: 268 m west of the centre.
    park_lon = -118.5214 - 268 / (111_320 * math.cos(math.radians(34.1566)))
    close = base(16, -118.5214, 34.1566)
    assert "lot" in close and "block" in close
    assert "park" in base(16, park_lon, 34.1566)
    far = base(13, -118.5214, 34.1566)
    assert "lot" not in far and {"block", "park"} <= set(far)
    assert base(10, -118.5214, 34.1566) == []


def test_a_tile_served_again_reuses_its_etag_until_a_write(logged_in, monkeypatch):
    """A low-zoom tile's tag digests every id it holds: asked again at the same revision it is
    neither selected nor digested again; a deletion still gives it a new tag."""
    here = annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    annotation_create(category="house", geometry=rectangle(-118.521, 34.151, 12, 10))
    x, y = tile_of(-118.52, 34.15, 10)
    url = f"/tiles/annotations/10/{x}/{y}.mvt"
    first = logged_in.get(url)
    selected = []
    real_select = tiles._select
    monkeypatch.setattr(tiles, "_select", lambda *a: selected.append(a) or real_select(*a))

    again = logged_in.get(url)
    revalidated = logged_in.get(url, headers={"If-None-Match": first["ETag"]})
    assert (again["ETag"], revalidated.status_code, selected) == (first["ETag"], 304, [])
    assert again.content == first.content

    annotations_soft_delete(ids=[here.pk])
    after = logged_in.get(url)
    assert after["ETag"] != first["ETag"]
    assert len(decoded(after)) == 1
    assert selected  # the new revision was selected afresh


def test_the_tileset_json_follows_a_deletion(logged_in):
    here = annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    annotation_create(category="tree", geometry=point(-118.40, 34.15))
    first = logged_in.get("/tiles/annotations.json").json()
    annotations_soft_delete(ids=[here.pk])
    second = logged_in.get("/tiles/annotations.json").json()
    assert (first["counts"], second["counts"]) == ({"house": 1, "tree": 1}, {"tree": 1})
    assert first["revision"] != second["revision"]


def test_the_initial_tiles_cover_the_data_at_the_zooms_a_fitted_map_asks_first():
    bounds = (-118.6652588, 34.1154609, -118.3803799, 34.1968252)  # the million's extent
    found = tiles.initial_tiles(bounds)
    zooms = sorted({z for z, _, _ in found})
    assert len(zooms) == tiles.WARM_ZOOMS
    assert zooms == list(range(zooms[0], zooms[0] + tiles.WARM_ZOOMS))
    west, south, east, north = tiles.mercator(np.array([bounds[:2], bounds[2:]])).ravel()
    for z in zooms:
        covering = [(x, y) for zz, x, y in found if zz == z]
        assert 0 < len(covering) <= tiles.WARM_TILES
        for corner in ((west, south), (east, north), (west, north), (east, south)):
            assert any(
                tile_bounds(z, x, y)[0] <= corner[0] <= tile_bounds(z, x, y)[2]
                and tile_bounds(z, x, y)[1] <= corner[1] <= tile_bounds(z, x, y)[3]
                for x, y in covering
            )
    # One zoom further in would take more than WARM_TILES tiles.
    top = zooms[-1] + 1
    (x0, y0), (x1, y1) = tile_of(*bounds[:2], top), tile_of(*bounds[2:], top)
    assert (abs(x1 - x0) + 1) * (abs(y1 - y0) + 1) > tiles.WARM_TILES


def test_tiles_warm_draws_the_initial_tiles_before_anyone_asks(logged_in, monkeypatch):
    annotation_create(category="house", geometry=rectangle(-118.52, 34.15, 12, 10))
    annotation_create(category="tree", geometry=point(-118.50, 34.16))
    monkeypatch.setattr(tiles, "_backends", {})
    tiles.tiles_warm(spatial_index())
    bounds = logged_in.get("/tiles/annotations.json").json()["bounds"]

    def no_drawing(*args):
        raise AssertionError("a warmed tile was drawn again")

    monkeypatch.setattr(tiles, "_render", no_drawing)
    for z, x, y in tiles.initial_tiles(tuple(bounds)):
        assert logged_in.get(f"/tiles/annotations/{z}/{x}/{y}.mvt").status_code == 200


def test_an_overview_counts_lines_of_a_few_pixels_that_closer_tiles_draw(logged_in):
    """From zoom 10 out an annotation under 4 pixels is counted (a million annotations' first
    view had ~13,000 short road lines per tile); at zoom 12 the same road is a line."""
    road = annotation_create(category="road", geometry=line((-118.52, 34.15), (-118.5185, 34.15)))
    kinds = {}
    for z in (10, 12):
        x, y = tile_of(-118.52, 34.15, z)
        features = decoded(logged_in.get(f"/tiles/annotations/{z}/{x}/{y}.mvt"))
        kinds[z] = [
            (f["geometry"]["type"], f["properties"].get("id"), f["properties"].get("count"))
            for f in features
        ]
    # ~138 m: ~2.3 pixels at zoom 10, ~9 pixels at zoom 12.
    assert kinds == {10: [("Point", None, 1)], 12: [("LineString", road.pk, None)]}


def test_measures_are_rounded_as_python_rounds_them():
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.uniform(0, 1e6, 20_000),
            np.round(rng.uniform(0, 1e4, 5_000), 3) + 0.005,  # halves, as near as floats get
            [0.125, 2.675, 1.005, 0.0, 1e15 + 0.5, float("nan")],
        ]
    )
    rounded = tiles.round2(values)
    expected = [round(v, 2) for v in values.tolist()]
    assert rounded[:-1].tolist() == expected[:-1]
    assert math.isnan(rounded[-1])


def test_shapes_left_unsimplified_are_those_simplify_leaves_as_they_are():
    rng = np.random.default_rng(5)
    made = []
    for _ in range(3_000):
        x, y = rng.uniform(0, 4000, 2)
        w, h = rng.uniform(0.5, 40, 2)
        turn = rng.uniform(0, 90)
        quad = shapely.affinity.rotate(shapely.box(x, y, x + w, y + h), turn)
        made += [
            quad,
            shapely.Polygon([(x, y), (x + w, y), (x, y + h)]),
            shapely.LineString([(x, y), (x + w, y + h)]),
            shapely.Point(x, y),
            shapely.Point(x, y).buffer(w, quad_segs=4),  # a pool: always simplified
        ]
    geoms = np.array(made, dtype=object)
    tolerance = 4.0

    may = tiles._simplify_may_change(geoms, tolerance)

    simplified = shapely.simplify(geoms, tolerance, preserve_topology=True)
    left = ~may
    assert shapely.equals_exact(simplified[left], geoms[left], 0.0).all()
    changed = ~shapely.equals_exact(simplified, geoms, 0.0)
    assert changed.any() and (~left[changed]).all()
    assert left.sum() > len(made) / 2  # most are not simplified at all
