"""The vectorised MVT encoder against the kept library's decoder: every kind of shape comes
back where it was (to the grid), with its properties; degenerate shapes are left out."""

import random

import mapbox_vector_tile
import numpy as np
import pytest
import shapely

from geosense.annotations.mvt import Layer, layer_of_dicts, tile_encode


def shapes(n: int) -> list:
    rng = random.Random(1)
    made = []
    for k in range(n):
        x, y = rng.uniform(0, 4000), rng.uniform(0, 4000)
        made.append(
            [
                shapely.Point(x, y),
                shapely.LineString([(x, y), (x + 50, y + 30), (x + 90, y - 10)]),
                shapely.box(x, y, x + 40, y + 30),
                shapely.Polygon(
                    shapely.box(x, y, x + 80, y + 80).exterior.coords,
                    [shapely.box(x + 10, y + 10, x + 30, y + 30).exterior.coords],
                ),
                shapely.MultiPolygon(
                    [shapely.box(x, y, x + 10, y + 10), shapely.box(x + 20, y, x + 30, y + 10)]
                ),
                shapely.MultiLineString([[(x, y), (x + 10, y)], [(x, y + 5), (x + 10, y + 9)]]),
                shapely.MultiPoint([(x, y), (x + 3, y + 4)]),
            ][k % 7]
        )
    return made


def test_every_kind_of_shape_comes_back_within_a_grid_unit_with_its_properties():
    geoms = shapes(140)
    collection = shapely.GeometryCollection(
        [shapely.box(0, 0, 10, 10), shapely.LineString([(20, 20), (30, 30)])]
    )
    sliver = shapely.box(5, 5, 5.2, 5.2)  # nothing left of it on the grid
    every = [*geoms, collection, sliver]
    properties = [
        {"id": n, "class": "thing", "area_m2": 1.5, "big": n % 2 == 0} for n in range(len(every))
    ]

    data = tile_encode([layer_of_dicts("a", every, properties)], extent=4096)
    decoded = mapbox_vector_tile.decode(data, default_options={"y_coord_down": True})["a"]

    got = {f["properties"]["id"]: f for f in decoded["features"]}
    assert set(got) == set(range(len(geoms) + 1))
    for n, geom in enumerate(geoms):
        back = shapely.geometry.shape(got[n]["geometry"])
        assert back.is_valid and back.geom_type == geom.geom_type, n
        assert shapely.hausdorff_distance(back, geom) <= 1, n
        assert got[n]["properties"] == properties[n]
        assert got[n]["id"] == n
    # A collection keeps the parts of its highest dimension.
    assert shapely.geometry.shape(got[len(geoms)]["geometry"]).equals(shapely.box(0, 0, 10, 10))
    assert decoded["extent"] == 4096


def test_varints_are_protobuf_s_for_every_size():
    from google.protobuf.internal.encoder import _VarintBytes

    from geosense.annotations.mvt import _varints

    values = [0, 1, 127, 128, 300, 16_383, 16_384, 2**21, 2**35 + 5, 2**56, 2**63 - 1, 2**64 - 1]
    encoded = _varints(np.array(values, dtype=np.uint64))
    assert encoded == b"".join(_VarintBytes(v) for v in values)


def test_a_layer_of_columns_gives_each_feature_only_the_properties_it_has():
    geoms = np.array(
        [shapely.Point(1, 2), shapely.box(10, 10, 20, 20), shapely.Point(5, 5), None],
        dtype=object,
    )
    ids = np.ma.array([7, 8, 0, 9], mask=[False, False, True, False])
    layer = Layer(
        "a",
        geoms,
        {
            "id": ids,
            "class": np.array(["tree", "house", "tree", "tree"]),
            "count": np.ma.array([0, 0, 12, 0], mask=[True, True, False, True]),
            "area_m2": np.ma.array([0.0, 100.25, 0.0, 0.0], mask=[True, False, True, True]),
            "big": np.array([False, True, False, False]),
        },
        ids=ids,
    )

    decoded = mapbox_vector_tile.decode(
        tile_encode([layer, Layer("empty", np.zeros(0, dtype=object))], extent=512),
        default_options={"y_coord_down": True},
    )

    features = decoded["a"]["features"]
    assert decoded["a"]["extent"] == 512
    assert [f["properties"] for f in features] == [
        {"id": 7, "class": "tree", "big": False},
        {"id": 8, "class": "house", "area_m2": 100.25, "big": True},
        {"class": "tree", "count": 12, "big": False},
    ]  # the missing geometry is left out
    assert [f["id"] for f in features[:2]] == [7, 8]
    assert features[1]["geometry"]["type"] == "Polygon"
    assert decoded["empty"]["features"] == []


def test_a_property_of_mixed_types_is_refused():
    with pytest.raises(TypeError, match="several types"):
        layer_of_dicts("a", [shapely.Point(1, 1)] * 2, [{"n": 1}, {"n": "one"}])
