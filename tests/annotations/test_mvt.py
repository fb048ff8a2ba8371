"""The vectorised MVT encoder against the kept library's decoder: every kind of shape comes
back where it was (to the grid), with its properties; degenerate shapes are left out."""

import random

import mapbox_vector_tile
import numpy as np
import shapely

from geosense.annotations.mvt import tile_encode


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

    data = tile_encode([("a", np.array(every, dtype=object), properties)], extent=4096)
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
