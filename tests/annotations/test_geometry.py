import itertools
import math

import numpy as np
import pytest
from pyproj import Geod

from geosense.annotations.geometry import geometry_parse, shape_vector
from geosense.annotations.services import geometry_measures
from geosense.annotations.types import GeometryError

from .shapes import line, point, rectangle

GEOD = Geod(ellps="WGS84")


def within(value: float, expected: float, tolerance: float = 0.005) -> bool:
    return abs(value - expected) <= tolerance * abs(expected)


@pytest.mark.parametrize("lat", [0.0, 34.15, -45.0, 60.0, 78.0])
@pytest.mark.parametrize("size_m", [3.0, 40.0, 900.0, 25_000.0])
def test_polygon_area_and_perimeter_match_pyproj_geodesic(lat, size_m):
    geometry = rectangle(10.0, lat, size_m, size_m * 1.7, turn_deg=20)
    lons, lats = zip(*geometry["coordinates"][0], strict=True)
    area, perimeter = GEOD.polygon_area_perimeter(lons, lats)

    area_m2, length_m = geometry_measures(geometry)

    assert within(area_m2, abs(area))
    assert within(length_m, perimeter)


@pytest.mark.parametrize("lat", [0.0, 51.5, -33.9, 70.0])
@pytest.mark.parametrize("span_deg", [0.0001, 0.01, 1.0, 8.0])
def test_line_length_matches_pyproj_geodesic(lat, span_deg):
    coords = [(5.0, lat), (5.0 + span_deg, lat + span_deg / 2), (5.0 + 2 * span_deg, lat)]
    expected = sum(GEOD.inv(*a, *b)[2] for a, b in itertools.pairwise(coords))

    area_m2, length_m = geometry_measures(line(*coords))

    assert area_m2 == 0
    assert within(length_m, expected)


def test_area_is_not_a_flat_earth_degree_product():
    # A one-degree cell at 60°N is about half the size of one at the equator.
    equator = geometry_measures(
        {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}
    )[0]
    north = geometry_measures(
        {"type": "Polygon", "coordinates": [[[0, 60], [1, 60], [1, 61], [0, 61], [0, 60]]]}
    )[0]

    assert 0.45 < north / equator < 0.52


def test_a_polygon_hole_is_not_counted_in_its_area():
    outer = rectangle(0, 45, 100, 100)["coordinates"][0]
    hole = rectangle(0, 45, 50, 50)["coordinates"][0][::-1]

    area, _ = geometry_measures({"type": "Polygon", "coordinates": [outer, hole]})

    assert within(area, 7500, 0.01)


def test_a_point_has_no_area_or_length():
    assert geometry_measures(point(2.35, 48.85)) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("geometry", "reason"),
    [
        ({"type": "GeometryCollection", "geometries": []}, "not supported"),
        ({"type": "Point"}, "coordinates"),
        ({"type": "Point", "coordinates": [200, 10]}, "WGS84"),
        ({"type": "Point", "coordinates": ["a", "b"]}, "malformed"),
        (
            {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]},
            "invalid Polygon",
        ),
        ("POINT (1 2)", "GeoJSON object"),
    ],
)
def test_invalid_geometries_are_refused_with_a_reason(geometry, reason):
    with pytest.raises(GeometryError, match=reason):
        geometry_parse(geometry)


def test_shape_vectors_put_similar_shapes_closer_than_different_ones():
    base = np.array(shape_vector(geometry_parse(rectangle(0, 40, 10, 4)), {}))
    twin = np.array(shape_vector(geometry_parse(rectangle(0.01, 40.01, 10.2, 4.1)), {}))
    square = np.array(shape_vector(geometry_parse(rectangle(0, 40, 30, 30)), {}))

    assert np.linalg.norm(base - twin) < np.linalg.norm(base - square) / 5


def test_a_rectangle_turned_a_quarter_has_the_opposite_orientation_feature():
    along = shape_vector(geometry_parse(rectangle(0, 40, 10, 4)), {})
    across = shape_vector(geometry_parse(rectangle(0, 40, 10, 4, turn_deg=90)), {})

    assert math.isclose(along[4], -across[4], abs_tol=0.02)
    assert math.isclose(along[0], across[0], abs_tol=0.01)
