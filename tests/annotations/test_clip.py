"""Overlap areas of many polygon pairs at once (`clip.overlap_areas`) against GEOS."""

import numpy as np
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely import affinity

from geosense.annotations.clip import overlap_areas


def _l_shape(x: float, y: float, turn: float) -> shapely.Polygon:
    ring = [(x, y), (x + 10, y), (x + 10, y + 4), (x + 4, y + 4), (x + 4, y + 10), (x, y + 10)]
    return affinity.rotate(shapely.Polygon(ring), turn, origin=(x, y))


def _rectangle(x: float, y: float, w: float, h: float, turn: float) -> shapely.Polygon:
    return affinity.rotate(shapely.box(x, y, x + w, y + h), turn, origin=(x, y))


_coordinate = st.floats(-12, 12, allow_nan=False)
_size = st.floats(0.5, 9)
_turn = st.floats(0, 360)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(_coordinate, _coordinate, _size, _size, _turn, _turn, st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_overlap_areas_agree_with_geos(pairs):
    """Rectangles (convex) against concave L-shaped roofs, either way round, askew, apart,
    overlapping or one inside the other."""
    a, b = [], []
    for x, y, w, h, turn, other_turn, flip in pairs:
        rectangle, roof = _rectangle(x, y, w, h, turn), _l_shape(0, 0, other_turn)
        a.append(roof if flip else rectangle)
        b.append(rectangle if flip else roof)
    a, b = np.array(a, dtype=object), np.array(b, dtype=object)

    expected = shapely.area(shapely.intersection(a, b))
    assert np.allclose(overlap_areas(a, b), expected, rtol=1e-9, atol=1e-9)


def test_what_the_clip_does_not_take_goes_to_geos_and_touching_is_no_overlap():
    square = shapely.box(0, 0, 5, 5)
    holed = shapely.box(2, 2, 9, 9).difference(shapely.box(4, 4, 5, 5))
    many_sided = shapely.Point(3, 3).buffer(3)  # 65 points: more than the clip pads to
    pairs = [
        (square, shapely.box(5, 0, 8, 5)),  # touching along a side
        (square, shapely.box(6, 6, 8, 8)),  # apart
        (square, holed),  # a hole
        (many_sided, square),
        (_l_shape(0, 0, 10), _l_shape(3, 2, 40)),  # neither convex
        (shapely.MultiPolygon([square, shapely.box(10, 0, 12, 2)]), shapely.box(1, 1, 11, 2)),
        (shapely.LineString([(0, 0), (9, 9)]), square),  # not a polygon: no area
        (shapely.box(0, 0, 0, 5), square),  # degenerate: no area
    ]
    a = np.array([p for p, _ in pairs], dtype=object)
    b = np.array([q for _, q in pairs], dtype=object)

    areas = overlap_areas(a, b)

    assert np.allclose(areas, shapely.area(shapely.intersection(a, b)), rtol=1e-9, atol=1e-12)
    assert areas[0] == 0 and areas[1] == 0 and areas[2] == 9 - 1
