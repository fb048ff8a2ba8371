"""The in-process spatial index: live annotations projected to metres, one STRtree per class.

Built on first use and rebuilt when `AnnotationRevision` says the table changed (one
primary-key read per query), so writes by other processes are seen. Feature-vector matrices
for similarity are loaded per (class, vector name) on first use and live as long as the index.
"""

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
    category: str
    ids: np.ndarray
    geoms: np.ndarray
    bounds: np.ndarray
    tree: shapely.STRtree
    vectors: dict[tuple[str, int], VectorMatrix] = field(default_factory=dict)

    def positions_in(self, bbox: BBox | None) -> np.ndarray:
        """Positions of the annotations whose bounding box meets bbox (all when None)."""
        if bbox is None:
            return np.arange(len(self.ids))
        min_lon, min_lat, max_lon, max_lat = bbox
        b = self.bounds
        mask = (b[:, 0] <= max_lon) & (b[:, 2] >= min_lon) & (b[:, 1] <= max_lat) & (b[:, 3] >= min_lat)
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

    def search_distance(self, distance_m: float, *, lon: float | None = None, lat: float | None = None) -> float:
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
    reach = GEOD.inv(np.full(4, projection.lon), np.full(4, projection.lat), corners_lon, corners_lat)[2]
    geoms = projection.project(shapely.from_geojson(texts)) if len(rows) else texts
    classes: dict[str, ClassIndex] = {}
    if len(rows):
        cuts = np.flatnonzero(categories[1:] != categories[:-1]) + 1
        for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(rows)], strict=True):
            part = slice(int(start), int(stop))
            class_geoms = geoms[part]
            classes[str(categories[start])] = ClassIndex(
                category=str(categories[start]),
                ids=ids[part],
                geoms=class_geoms,
                bounds=bounds[part],
                tree=shapely.STRtree(class_geoms),
            )
    return SpatialIndex(
        revision=revision,
        projection=projection,
        scale=scale_bound(float(np.max(reach))),
        classes=classes,
    )


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
    return VectorMatrix(positions=np.array(positions, dtype=np.int64), unit_rows=unit_rows, mean=mean, std=std)
