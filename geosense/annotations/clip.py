"""Areas where pairs of polygons overlap, for many pairs at once.

`shapely.intersection` builds each pair's overlay in GEOS: ~11 µs a pair, 0.6 s of a 0.7 s
"garages overlapping a house" query at a million annotations (52,000 pairs). Most such pairs
are a simple polygon against a convex one (rectangles, squared-off roofs), where the area of
the overlap is that of the simple polygon clipped by each side of the convex one in turn
(Sutherland-Hodgman, 1974: with a convex clip the result's area is exact even for a concave
subject; the degenerate edges it may leave have no area). That is done here with numpy for
every such pair together; the rest go to `shapely.intersection`.
"""

import numpy as np
import shapely

POLYGON_TYPE = 3
MAX_POINTS = 12  # rings with more go to GEOS: every ring is padded to the longest one


def overlap_areas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The area of the overlap of each pair of polygons a[i], b[i] (projected, any kind)."""
    areas = np.zeros(len(a))
    if not len(a):
        return areas
    simple_a, simple_b = _simple_polygons(a), _simple_polygons(b)
    ring_a, count_a = _ring_coords(a[simple_a])
    ring_b, count_b = _ring_coords(b[simple_b])
    convex_a, convex_b = np.zeros(len(a), bool), np.zeros(len(b), bool)
    convex_a[simple_a], convex_b[simple_b] = _convex(ring_a), _convex(ring_b)
    # Rows of the ring arrays by pair (-1: not a simple polygon).
    row_a = np.where(simple_a, np.cumsum(simple_a) - 1, -1)
    row_b = np.where(simple_b, np.cumsum(simple_b) - 1, -1)
    by_b = simple_a & convex_b  # a clipped by b
    by_a = ~by_b & simple_b & convex_a  # b clipped by a
    if by_b.any():
        rows, clips = row_a[by_b], row_b[by_b]
        areas[by_b] = _clipped_areas(ring_a[rows], count_a[rows], ring_b[clips])
    if by_a.any():
        rows, clips = row_b[by_a], row_a[by_a]
        areas[by_a] = _clipped_areas(ring_b[rows], count_b[rows], ring_a[clips])
    rest = ~(by_b | by_a)
    if rest.any():
        areas[rest] = shapely.area(shapely.intersection(a[rest], b[rest]))
    return areas


def _simple_polygons(geoms: np.ndarray) -> np.ndarray:
    """Polygons without holes, of at most MAX_POINTS points."""
    simple = shapely.get_type_id(geoms) == POLYGON_TYPE
    polygons = geoms[simple]
    simple[simple] = (shapely.get_num_interior_rings(polygons) == 0) & (
        shapely.get_num_coordinates(polygons) <= MAX_POINTS + 1
    )
    return simple


def _ring_coords(polygons: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each polygon's ring (polygons without holes) without its closing point, padded to one
    width by repeating its last point (a repeated point adds an edge of no length: no area, no
    crossing): an (n, width, 2) array, and each ring's number of points."""
    coords, owner = shapely.get_coordinates(polygons, return_index=True)
    sizes = np.bincount(owner, minlength=len(polygons))
    starts = np.cumsum(sizes) - sizes
    counts = sizes - 1
    width = int(counts.max()) if len(counts) else 0
    column = np.minimum(np.arange(width)[None, :], counts[:, None] - 1)
    return coords[starts[:, None] + column], counts


def _convex(ring: np.ndarray) -> np.ndarray:
    """Which padded rings are convex: every turn along the ring one way (or none)."""
    if not len(ring):
        return np.zeros(0, bool)
    edge = np.roll(ring, -1, axis=1) - ring
    turn = (
        edge[:, :, 0] * np.roll(edge, -1, axis=1)[:, :, 1]
        - edge[:, :, 1] * np.roll(edge, -1, axis=1)[:, :, 0]
    )
    scale = np.abs(edge).max(axis=(1, 2)) ** 2
    tolerance = 1e-12 * scale[:, None]
    return ~((turn > tolerance).any(axis=1) & (turn < -tolerance).any(axis=1))


def _clipped_areas(points: np.ndarray, counts: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """The area of each subject ring (padded, with its number of points) clipped by its convex
    clip ring (padded)."""
    # Inside is the left of each edge for a counter-clockwise clip ring, the right otherwise.
    side = np.sign(_shoelace(clip))
    for k in range(clip.shape[1]):
        start, end = clip[:, k], clip[:, (k + 1) % clip.shape[1]]
        points, counts = _clip_step(points, counts, start, end, side)
        if not counts.any():
            break
    return np.where(side == 0, 0.0, np.abs(_shoelace(points)))


def _shoelace(ring: np.ndarray) -> np.ndarray:
    """Signed areas of padded rings (n, width, 2): positive counter-clockwise."""
    if ring.shape[1] == 0:
        return np.zeros(len(ring))
    after = np.roll(ring, -1, axis=1)
    cross = ring[:, :, 0] * after[:, :, 1] - after[:, :, 0] * ring[:, :, 1]
    return cross.sum(axis=1) / 2


def _clip_step(
    points: np.ndarray, counts: np.ndarray, start: np.ndarray, end: np.ndarray, side: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every ring clipped by the half-plane left (side 1) or right (side -1) of start→end.

    An edge of no length (the padding of a clip ring) clips nothing. Each point of a ring gives
    what Sutherland-Hodgman gives for the edge ending at it: the crossing if the edge crosses
    the line, then the point if it is inside.
    """
    direction = end - start
    length = np.hypot(direction[:, 0], direction[:, 1])
    relative = points - start[:, None, :]
    distance = (
        direction[:, None, 0] * relative[:, :, 1] - direction[:, None, 1] * relative[:, :, 0]
    ) * side[:, None]
    distance[length == 0] = 1.0
    # Padding repeats a ring's last point, so the point before the first is its last.
    valid = np.arange(points.shape[1])[None, :] < counts[:, None]
    inside = distance >= 0
    crosses = (inside != np.roll(inside, 1, axis=1)) & valid
    inside &= valid
    emitted = crosses.astype(np.int64) + inside
    new_counts = emitted.sum(axis=1)
    slot = np.cumsum(emitted, axis=1) - emitted  # where each point's output starts
    out = np.zeros((len(points), int(new_counts.max()) if len(points) else 0, 2))
    rows, columns = np.nonzero(crosses)
    previous = columns - 1  # -1: the last column, a copy of the ring's last point
    here, there = distance[rows, columns], distance[rows, previous]
    t = (there / (there - here))[:, None]
    out[rows, slot[rows, columns]] = points[rows, previous] + t * (
        points[rows, columns] - points[rows, previous]
    )
    rows, columns = np.nonzero(inside)
    out[rows, slot[rows, columns] + crosses[rows, columns]] = points[rows, columns]
    # Pad each row with its last point again (rows left with nothing stay zeros: no area).
    width = out.shape[1]
    column = np.minimum(np.arange(width)[None, :], np.maximum(new_counts, 1)[:, None] - 1)
    out = np.take_along_axis(out, column[:, :, None], axis=1)
    return out, new_counts
