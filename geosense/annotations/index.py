"""The in-process spatial index: live annotations projected to metres, one STRtree per class.

Built on first use and rebuilt when `AnnotationRevision` says the table changed (one
primary-key read per query), so writes by other processes are seen. Feature-vector matrices
for similarity are loaded per (class, vector name) on first use and live as long as the index.
"""

import gc
import threading
from dataclasses import dataclass, field

import numpy as np
import shapely
from django.db.models import TextField
from django.db.models.functions import Cast

from .geometry import GEOD, LocalProjection, nearest_point_distances, scale_bound
from .models import Annotation, AnnotationRevision
from .types import BBox


@dataclass(frozen=True)
class VectorMatrix:
    """A class's vectors of one name and size, standardised per column and unit-normalised."""

    positions: np.ndarray
    unit_rows: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    def unit(self, vector: np.ndarray) -> np.ndarray:
        standard = (vector - self.mean) / self.std
        norm = np.linalg.norm(standard)
        return standard / norm if norm > 0 else standard


@dataclass
class ClassIndex:
    """One class's live annotations in id order: lon/lat `bounds` for bbox filters, projected
    `geoms` with their `tree`, and for the bounds `nearest_within` prunes with, their projected
    bounding boxes (`extents`: rows minx, miny, maxx, maxy) and one point on each (`anchors`:
    rows x, y of its first vertex). Rows, not columns, so that gathers are contiguous."""

    category: str
    ids: np.ndarray
    geoms: np.ndarray
    bounds: np.ndarray
    tree: shapely.STRtree
    extents: np.ndarray
    anchors: np.ndarray
    vectors: dict[tuple[str, int], VectorMatrix] = field(default_factory=dict)

    @classmethod
    def build(
        cls, category: str, ids: np.ndarray, geoms: np.ndarray, bounds: np.ndarray
    ) -> "ClassIndex":
        """The index of one class from its ids, projected geometries and lon/lat bounds."""
        return cls(
            category=category,
            ids=ids,
            geoms=geoms,
            bounds=bounds,
            tree=shapely.STRtree(geoms),
            extents=np.ascontiguousarray(shapely.bounds(geoms).T),
            anchors=np.ascontiguousarray(_first_vertices(geoms).T),
        )

    def positions_in(self, bbox: BBox | None) -> np.ndarray:
        """Positions of the annotations whose bounding box meets bbox (all when None)."""
        if bbox is None:
            return np.arange(len(self.ids))
        min_lon, min_lat, max_lon, max_lat = bbox
        b = self.bounds
        mask = (
            (b[:, 0] <= max_lon)
            & (b[:, 2] >= min_lon)
            & (b[:, 1] <= max_lat)
            & (b[:, 3] >= min_lat)
        )
        return np.flatnonzero(mask)

    def vector_matrix(self, name: str, size: int) -> VectorMatrix:
        key = (name, size)
        if key not in self.vectors:
            self.vectors[key] = _vector_matrix_load(self, name, size)
        return self.vectors[key]


@dataclass
class SpatialIndex:
    revision: str
    projection: LocalProjection
    scale: float
    classes: dict[str, ClassIndex]

    def search_distance(
        self, distance_m: float, *, lon: float | None = None, lat: float | None = None
    ) -> float:
        """A projected radius that surely holds every geodesic neighbour within distance_m."""
        scale = self.scale
        if lon is not None and lat is not None:
            scale = max(scale, scale_bound(self.projection.reach_m(lon, lat)))
        return distance_m * scale * 1.001 + 0.01

    def geodesic(self, projected: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Geodesic metres between geometry pairs whose projected distances are known.

        Within about 150 km of the centre the plane's distances exceed the geodesic ones by
        less than 0.01 % (`scale_bound`), so they are the answer; farther out the nearest
        points go back to longitude/latitude and through pyproj's Geod.
        """
        if self.scale - 1.0 < PLANE_TOLERANCE:
            return projected
        return nearest_point_distances(self.projection, a, b)


PLANE_TOLERANCE = 1e-4
_lock = threading.Lock()
_cached: SpatialIndex | None = None


def spatial_index() -> SpatialIndex:
    """The index of the live annotations as of now (rebuilt if anything was written)."""
    global _cached
    revision = AnnotationRevision.current()
    cached = _cached
    if cached is not None and cached.revision == revision:
        return cached
    with _lock:
        if _cached is None or _cached.revision != revision:
            _cached = _spatial_index_build(revision)
        return _cached


def nearest_within(
    sources: ClassIndex, positions: np.ndarray, targets: ClassIndex, radius: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nearest target within radius (projected metres) of each source at positions.

    Returns aligned arrays, in ascending source position: the source's position, its nearest
    target's position (the lowest among equals) and their projected distance. When sources and
    targets are one class, an annotation is not its own neighbour.

    Cheaper than a `dwithin` query followed by the distances of what it finds, because only
    bounding boxes are compared before the exact distances:
    1. candidates: the smaller side's boxes, grown by radius, against the other side's tree;
    2. pruning: a candidate whose box distance (a lower bound of its distance) exceeds an upper
       bound of the source's nearest distance cannot be the nearest. The upper bound is the
       least MINMAXDIST (Roussopoulos et al., 1995) from a point of the source to a candidate's
       box: each side of a geometry's bounding box touches the geometry, so the nearer side
       holds a point of it no farther away than that side's far end;
    3. `shapely.distance` on the candidates left, and the least per source.
    """
    no_pairs = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    if len(positions) == 0 or len(targets.ids) == 0:
        return no_pairs
    if len(positions) <= len(targets.ids):
        query_at, target = targets.tree.query(_grown(sources.extents[:, positions], radius))
        source = positions[query_at]
    else:
        target, source = sources.tree.query(_grown(targets.extents, radius))
        if len(positions) < len(sources.ids):
            wanted = np.zeros(len(sources.ids), dtype=bool)
            wanted[positions] = True
            keep = wanted[source]
            source, target = source[keep], target[keep]
    if sources is targets:
        distinct = source != target
        source, target = source[distinct], target[distinct]
    if len(source) == 0:
        return no_pairs

    target_boxes = targets.extents[:, target]
    lower = _box_distances_squared(sources.extents[:, source], target_boxes)
    upper = np.full(len(sources.ids), radius * radius)
    np.minimum.at(
        upper, source, _minmax_distances_squared(sources.anchors[:, source], target_boxes)
    )
    # A micrometre more guards against rounding: the bounds are exact up to it.
    threshold = (np.sqrt(upper) + 1e-6) ** 2
    keep = lower <= threshold[source]
    source, target = source[keep], target[keep]

    distances = shapely.distance(sources.geoms[source], targets.geoms[target])
    nearest = np.full(len(sources.ids), np.inf)
    np.minimum.at(nearest, source, distances)
    is_nearest = distances == nearest[source]
    nearest_target = np.full(len(sources.ids), np.iinfo(np.int64).max)
    np.minimum.at(nearest_target, source[is_nearest], target[is_nearest])
    found = np.flatnonzero(nearest <= radius)
    return found, nearest_target[found], nearest[found]


def _grown(extents: np.ndarray, radius: float) -> np.ndarray:
    """Boxes of the extents grown by radius on every side, to query a tree with.

    Making tens of thousands of geometries sets off the cyclic garbage collector, which then
    scans every geometry the index holds: up to 50 ms at 200,000 annotations, more than the
    query. Boxes cannot form cycles and reference counting frees them (which also takes back
    the allocation count a collection would have acted on), so collection is paused meanwhile.
    Clockwise because those are quicker to build; only the boxes' extents are used.
    """
    left, bottom, right, top = extents
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return shapely.box(left - radius, bottom - radius, right + radius, top + radius, ccw=False)
    finally:
        if was_enabled:
            gc.enable()


def _box_distances_squared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared distances between pairs of boxes (rows minx, miny, maxx, maxy): 0 where they meet."""
    dx = np.maximum(np.maximum(b[0] - a[2], a[0] - b[2]), 0)
    dy = np.maximum(np.maximum(b[1] - a[3], a[1] - b[3]), 0)
    return dx * dx + dy * dy


def _minmax_distances_squared(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Squared MINMAXDIST from each point (rows x, y) to its box: the geometry the box bounds
    has a point no farther away."""
    x, y = points
    left, bottom, right, top = boxes
    west, south = x <= (left + right) / 2, y <= (bottom + top) / 2
    near_x, far_x = np.where(west, left, right) - x, np.where(west, right, left) - x
    near_y, far_y = np.where(south, bottom, top) - y, np.where(south, top, bottom) - y
    return np.minimum(near_x * near_x + far_y * far_y, near_y * near_y + far_x * far_x)


def _spatial_index_build(revision: str) -> SpatialIndex:
    rows = list(
        Annotation.objects.annotate(geometry_text=Cast("geometry", TextField()))
        .order_by("category", "id")
        .values_list("id", "category", "geometry_text", "min_lon", "min_lat", "max_lon", "max_lat")
    )
    if rows:
        ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        categories = np.array([row[1] for row in rows], dtype=object)
        texts = np.array([row[2] for row in rows], dtype=object)
        bounds = np.array([row[3:] for row in rows], dtype=float)
    else:
        ids = np.zeros(0, dtype=np.int64)
        categories = np.zeros(0, dtype=object)
        texts = np.zeros(0, dtype=object)
        bounds = np.zeros((0, 4))
    if len(rows):
        min_lon, min_lat = bounds[:, 0].min(), bounds[:, 1].min()
        max_lon, max_lat = bounds[:, 2].max(), bounds[:, 3].max()
    else:
        min_lon = min_lat = max_lon = max_lat = 0.0
    projection = LocalProjection(lon=(min_lon + max_lon) / 2, lat=(min_lat + max_lat) / 2)
    corners_lon = np.array([min_lon, min_lon, max_lon, max_lon])
    corners_lat = np.array([min_lat, max_lat, min_lat, max_lat])
    reach = GEOD.inv(
        np.full(4, projection.lon), np.full(4, projection.lat), corners_lon, corners_lat
    )[2]
    geoms = projection.project(shapely.from_geojson(texts)) if len(rows) else texts
    classes: dict[str, ClassIndex] = {}
    if len(rows):
        cuts = np.flatnonzero(categories[1:] != categories[:-1]) + 1
        for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(rows)], strict=True):
            part = slice(int(start), int(stop))
            category = str(categories[start])
            classes[category] = ClassIndex.build(category, ids[part], geoms[part], bounds[part])
    return SpatialIndex(
        revision=revision,
        projection=projection,
        scale=scale_bound(float(np.max(reach))),
        classes=classes,
    )


def _first_vertices(geoms: np.ndarray) -> np.ndarray:
    coords, owners = shapely.get_coordinates(geoms, return_index=True)
    return coords[np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])]


def _vector_matrix_load(index: ClassIndex, name: str, size: int) -> VectorMatrix:
    position_of = {int(annotation_id): pos for pos, annotation_id in enumerate(index.ids)}
    positions: list[int] = []
    rows: list[list[float]] = []
    for annotation_id, vectors in Annotation.objects.filter(category=index.category).values_list(
        "id", "vectors"
    ):
        vector = vectors.get(name) if isinstance(vectors, dict) else None
        pos = position_of.get(annotation_id)
        if pos is not None and isinstance(vector, list) and len(vector) == size:
            positions.append(pos)
            rows.append(vector)
    matrix = np.array(rows, dtype=float).reshape(len(rows), size)
    mean = matrix.mean(axis=0) if len(rows) else np.zeros(size)
    std = matrix.std(axis=0) if len(rows) else np.ones(size)
    std = np.where(std > 1e-12, std, 1.0)
    standard = (matrix - mean) / std
    norms = np.linalg.norm(standard, axis=1, keepdims=True)
    unit_rows = np.divide(standard, norms, out=np.zeros_like(standard), where=norms > 0)
    return VectorMatrix(
        positions=np.array(positions, dtype=np.int64), unit_rows=unit_rows, mean=mean, std=std
    )
