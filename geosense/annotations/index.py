"""The in-process spatial index: live annotations projected to metres, one STRtree per class.

Built on first use (or as the process starts, `GEOSENSE_INDEX_WARM`) and kept in step with
`AnnotationRevision` (one primary-key read per query), so writes by other processes are seen:
a write of content (a new generation) rebuilds it; a soft delete or a restore only reads the
ids deleted now; a deletion keeps its class's tree and hides what left it (`KeptTree`), a
restore rebuilds the trees of the classes it touches (`_spatial_index_sync`).
Each class keeps its annotations' measures, so answers read none through the ORM.
Feature-vector matrices for similarity are loaded per (class, vector name) on first use and
follow deletions and restores without another read.
"""

import gc
import logging
import threading
from dataclasses import dataclass, field

import numpy as np
import shapely
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast

from .geometry import GEOD, LocalProjection, nearest_point_distances, scale_bound
from .models import Annotation, AnnotationRevision
from .types import BBox

DENSE_IDS = 4  # areas_of reads an array by id when ids leave at most this many slots each


class KeptTree:
    """An STRtree less some of its geometries, answering as a tree of those kept would.

    Building a class's tree again after a deletion took ~0.2 s for the 530,000 trees of a
    million annotations, on the first query after every deletion. `position` maps each of the
    tree's geometries to its position among those kept (-1: gone); `query` maps its answers.
    Once a tenth is gone, the next deletion builds the tree again (`ClassIndex.without`).
    """

    def __init__(self, tree: shapely.STRtree, position: np.ndarray, geoms: np.ndarray) -> None:
        self.tree, self.position, self.geoms = tree, position, geoms
        self._kept_only: shapely.STRtree | None = None

    def query(self, geometry, predicate: str | None = None, distance=None) -> np.ndarray:
        found = self.tree.query(geometry, predicate=predicate, distance=distance)
        if found.ndim == 1:
            mapped = self.position[found]
            return mapped[mapped >= 0]
        mapped = self.position[found[1]]
        kept = mapped >= 0
        return np.vstack([found[0][kept], mapped[kept]])

    def query_nearest(self, geometry, **options):
        """The nearest may be gone: answered by a tree of the geometries kept (built once)."""
        if self._kept_only is None:
            self._kept_only = shapely.STRtree(self.geoms)
        return self._kept_only.query_nearest(geometry, **options)

    def __len__(self) -> int:
        return len(self.geoms)


def _tree_without(tree: "shapely.STRtree | KeptTree", keep: np.ndarray, geoms: np.ndarray):
    """The tree of a class less the positions not kept: the same tree with those hidden, or a
    new one once a tenth of what it holds would be hidden."""
    new_position = np.where(keep, np.cumsum(keep) - 1, -1)
    if isinstance(tree, KeptTree):
        inner, held = tree.tree, tree.position
        position = np.where(held >= 0, new_position[np.maximum(held, 0)], -1)
    else:
        inner, position = tree, new_position
    if (position < 0).sum() * 10 > len(position):
        return shapely.STRtree(geoms)
    return KeptTree(inner, position, geoms)


@dataclass(frozen=True)
class VectorMatrix:
    """A class's vectors of one name and size, standardised per column and unit-normalised."""

    positions: np.ndarray
    unit_rows: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    raw: np.ndarray  # the vectors as stored, to standardise again after a deletion

    @classmethod
    def of(cls, positions: np.ndarray, matrix: np.ndarray) -> "VectorMatrix":
        size = matrix.shape[1]
        mean = matrix.mean(axis=0) if len(matrix) else np.zeros(size)
        std = matrix.std(axis=0) if len(matrix) else np.ones(size)
        std = np.where(std > 1e-12, std, 1.0)
        standard = (matrix - mean) / std
        norms = np.linalg.norm(standard, axis=1, keepdims=True)
        unit_rows = np.divide(standard, norms, out=np.zeros_like(standard), where=norms > 0)
        return cls(positions=positions, unit_rows=unit_rows, mean=mean, std=std, raw=matrix)

    def unit(self, vector: np.ndarray) -> np.ndarray:
        standard = (vector - self.mean) / self.std
        norm = np.linalg.norm(standard)
        return standard / norm if norm > 0 else standard


@dataclass
class ClassIndex:
    """One class's live annotations in id order: lon/lat `bounds` for bbox filters, projected
    `geoms` with their `tree`, and for the bounds `nearest_within` prunes with, their projected
    bounding boxes (`boxes`: rows centre x, centre y, half width, half height, which make the
    distance bounds a few operations on whole columns) and one point on each (`anchors`: rows
    x, y of its first vertex); `points` when every one is a point (its box is its anchor).
    Rows, not columns, so that gathers are contiguous.
    `measures` holds each one's geodesic (area_m2, length_m) as stored; `derived`, arrays of
    one row per annotation that other modules work out once (the tiles' Web Mercator shapes)."""

    category: str
    ids: np.ndarray
    geoms: np.ndarray
    bounds: np.ndarray
    tree: "shapely.STRtree | KeptTree"
    boxes: np.ndarray
    anchors: np.ndarray
    points: bool = False
    measures: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    vectors: dict[tuple[str, int], VectorMatrix] = field(default_factory=dict)
    derived: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        category: str,
        ids: np.ndarray,
        geoms: np.ndarray,
        bounds: np.ndarray,
        measures: np.ndarray | None = None,
    ) -> "ClassIndex":
        """The index of one class from its ids, projected geometries and lon/lat bounds."""
        left, bottom, right, top = shapely.bounds(geoms).T
        boxes = np.array(
            [(left + right) / 2, (bottom + top) / 2, (right - left) / 2, (top - bottom) / 2]
        )
        return cls(
            category=category,
            ids=ids,
            geoms=geoms,
            bounds=bounds,
            tree=shapely.STRtree(geoms),
            boxes=boxes,
            anchors=np.ascontiguousarray(_first_vertices(geoms).T),
            points=bool(len(ids)) and bool((shapely.get_type_id(geoms) == 0).all()),
            measures=np.zeros((len(ids), 2)) if measures is None else measures,
        )

    def without(self, drop: np.ndarray) -> "ClassIndex":
        """This class less the annotations at the positions where drop is True: the tree hides
        them (`KeptTree`; nothing is parsed, read or built again).

        What queries add to a class as they first need it (`derived`, `vectors`) may be added
        by another thread meanwhile: they are read from copies made in one step (`dict(...)`
        runs in C, where no other thread runs), as iterating the dicts themselves failed
        ("dictionary changed size during iteration")."""
        derived, vectors = dict(self.derived), dict(self.vectors)
        keep = ~drop
        new_position = np.cumsum(keep) - 1
        tree_of = self.geoms[keep]
        smaller = ClassIndex(
            category=self.category,
            ids=self.ids[keep],
            geoms=tree_of,
            bounds=self.bounds[keep],
            tree=_tree_without(self.tree, keep, tree_of),
            boxes=np.ascontiguousarray(self.boxes[:, keep]),
            anchors=np.ascontiguousarray(self.anchors[:, keep]),
            points=self.points,
            measures=self.measures[keep],
            derived={name: rows[keep] for name, rows in derived.items()},
        )
        for key, matrix in vectors.items():
            kept = keep[matrix.positions]
            smaller.vectors[key] = VectorMatrix.of(
                new_position[matrix.positions[kept]], matrix.raw[kept]
            )
        return smaller

    def position_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions of ids in this class (ids are sorted); -1 for an id not in it."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(self.ids):
            return np.full(len(ids), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[at] == ids, at, -1)

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
    """Every class's index at one revision; `generation` is the content it was built from and
    `deleted` the ids (sorted) deleted then, which `_spatial_index_sync` compares with now."""

    revision: str
    projection: LocalProjection
    scale: float
    classes: dict[str, ClassIndex]
    generation: str = ""
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    memo: dict[str, object] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Live annotations per class, by class name."""
        return {name: len(self.classes[name].ids) for name in sorted(self.classes)}

    def areas_of(self, ids: np.ndarray) -> np.ndarray:
        """The geodesic area of each of ids (0 for one not live), from the index.

        Read from an array indexed by id, made once per index, when ids are dense enough
        (at most `DENSE_IDS` slots per annotation): a within-distance answer names 400,000
        ids, which the search of every class's ids below took ~0.18 s to look up.
        """
        ids = np.asarray(ids, dtype=np.int64)
        by_id = self._areas_by_id()
        if by_id is not None:
            inside = (ids >= 0) & (ids < len(by_id))
            return np.where(inside, by_id[np.where(inside, ids, 0)], 0.0)
        order = np.argsort(ids, kind="stable")  # sorted look-ups walk memory in order
        wanted = ids[order]
        areas = np.zeros(len(ids))
        for class_index in self.classes.values():
            at = class_index.position_of(wanted)
            hit = at >= 0
            areas[order[hit]] = class_index.measures[at[hit], 0]
        return areas

    def _areas_by_id(self) -> np.ndarray | None:
        if "areas_by_id" not in self.memo:
            total = sum(len(c.ids) for c in self.classes.values())
            top = max((int(c.ids[-1]) for c in self.classes.values() if len(c.ids)), default=0)
            by_id = None
            if total and top < DENSE_IDS * total:
                by_id = np.zeros(top + 1)
                for class_index in self.classes.values():
                    by_id[class_index.ids] = class_index.measures[:, 0]
            self.memo["areas_by_id"] = by_id
        return self.memo["areas_by_id"]  # type: ignore[return-value]

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


logger = logging.getLogger(__name__)
PLANE_TOLERANCE = 1e-4
_lock = threading.Lock()
_cached: SpatialIndex | None = None


def spatial_index() -> SpatialIndex:
    """The index of the live annotations as of now (caught up if anything was written)."""
    global _cached
    revision, generation = AnnotationRevision.state()
    cached = _cached
    if cached is not None and cached.revision == revision:
        return cached
    with _lock:
        cached = _cached
        if cached is None or cached.revision != revision:
            if cached is not None and generation and cached.generation == generation:
                _cached = _spatial_index_sync(cached, revision)
            else:
                _cached = _spatial_index_build(revision, generation)
        return _cached


def spatial_index_warm(*, also=None) -> threading.Thread:
    """Build the index in a thread as the process starts (`GEOSENSE_INDEX_WARM`): a query that
    comes meanwhile waits for it rather than building its own. `also(index)` runs after (the
    tiles' shapes). A failure (no table yet) is logged: the first query builds it then."""

    def build() -> None:
        try:
            index = spatial_index()
            if also is not None:
                also(index)
        except Exception:
            logger.exception("the spatial index could not be built at start")
        finally:
            connection.close()

    thread = threading.Thread(target=build, name="spatial-index-warm", daemon=True)
    thread.start()
    return thread


def spatial_index_cached() -> SpatialIndex | None:
    """The index as last built, without asking the database (None before the first build)."""
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
        query_at, target = targets.tree.query(_grown(sources.boxes[:, positions], radius))
        source = positions[query_at]
    else:
        target, source = sources.tree.query(_grown(targets.boxes, radius))
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

    lower, minmax = _distance_bounds_squared(sources, source, targets, target)
    upper = np.full(len(sources.ids), radius * radius)
    np.minimum.at(upper, source, minmax)
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


def _grown(boxes: np.ndarray, radius: float) -> np.ndarray:
    """The boxes (rows centre x, centre y, half width, half height) grown by radius on every
    side, as geometries to query a tree with: each one's diagonal, a two-point line whose
    envelope is the box. A query without a predicate compares envelopes only, and the lines are
    made and freed in ~60 % of the time of box polygons (ring, shell, five points): freeing
    215,000 boxes alone took ~55 ms of a million-annotation within-distance query.

    Making tens of thousands of geometries sets off the cyclic garbage collector, which then
    scans every geometry the index holds: up to 50 ms at 200,000 annotations, more than the
    query. Lines cannot form cycles and reference counting frees them (which also takes back
    the allocation count a collection would have acted on), so collection is paused meanwhile.
    """
    x, y, half_width, half_height = boxes
    corners = np.empty((len(x), 2, 2))
    reach_x, reach_y = half_width + radius, half_height + radius
    np.subtract(x, reach_x, out=corners[:, 0, 0])
    np.subtract(y, reach_y, out=corners[:, 0, 1])
    np.add(x, reach_x, out=corners[:, 1, 0])
    np.add(y, reach_y, out=corners[:, 1, 1])
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return shapely.linestrings(corners)
    finally:
        if was_enabled:
            gc.enable()


def _distance_bounds_squared(
    sources: ClassIndex, source: np.ndarray, targets: ClassIndex, target: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Squared lower and upper bounds of the distance of each pair (source, target positions).

    Lower: the distance between their bounding boxes (0 where they meet). Upper: the least
    MINMAXDIST from the source's anchor to the target's box: the nearer of the box's two sides
    along one axis, at its far end along the other; each side touches the geometry it bounds.
    With a box as centre c and half size h, a coordinate p is |p - c| - h from the nearer side
    (negative inside) and |p - c| + h from the farther one. For points (a tree, a pool marker)
    the box is the anchor, and half of the gathers and operations are left out: this was a fifth
    of a million-annotation within-distance query.
    """
    x, y, half_width, half_height = targets.boxes[:, target]
    px, py = sources.anchors[:, source]
    across_x, across_y = np.abs(px - x), np.abs(py - y)
    near_x, near_y = across_x - half_width, across_y - half_height
    if sources.points:
        gap_x, gap_y = np.maximum(near_x, 0), np.maximum(near_y, 0)
    else:
        sx, sy, source_half_width, source_half_height = sources.boxes[:, source]
        gap_x = np.maximum(np.abs(sx - x) - source_half_width - half_width, 0)
        gap_y = np.maximum(np.abs(sy - y) - source_half_height - half_height, 0)
    gap_x *= gap_x
    gap_y *= gap_y
    lower = np.add(gap_x, gap_y, out=gap_x)
    far_x, far_y = (
        np.add(across_x, half_width, out=across_x),
        np.add(across_y, half_height, out=across_y),
    )
    near_x *= near_x
    near_y *= near_y
    far_x *= far_x
    far_y *= far_y
    near_x += far_y
    near_y += far_x
    return lower, np.minimum(near_x, near_y, out=near_x)


_ROW_FIELDS = (
    "id",
    "category",
    "geometry_text",
    "min_lon",
    "min_lat",
    "max_lon",
    "max_lat",
    "area_m2",
    "length_m",
)


def _rows_read(queryset) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, classes, GeoJSON texts, lon/lat bounds, measures) of a queryset, by class then id."""
    rows = list(
        queryset.annotate(geometry_text=Cast("geometry", TextField()))
        .order_by("category", "id")
        .values_list(*_ROW_FIELDS)
    )
    ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
    categories = np.array([row[1] for row in rows], dtype=object)
    texts = np.array([row[2] for row in rows], dtype=object)
    numbers = np.array([row[3:] for row in rows], dtype=float).reshape(len(rows), 6)
    return ids, categories, texts, numbers[:, :4], numbers[:, 4:]


def _class_slices(categories: np.ndarray):
    """(class, slice) of each run of one class in rows sorted by class."""
    if not len(categories):
        return
    cuts = np.flatnonzero(categories[1:] != categories[:-1]) + 1
    for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(categories)], strict=True):
        yield str(categories[start]), slice(int(start), int(stop))


def _deleted_ids() -> np.ndarray:
    return np.array(
        sorted(
            Annotation.all_objects.filter(deleted_at__isnull=False).values_list("id", flat=True)
        ),
        dtype=np.int64,
    )


def _spatial_index_sync(cached: SpatialIndex, revision: str) -> SpatialIndex:
    """The index caught up with soft deletions and restores since it was built: deleted
    annotations leave their class (its tree is built again from the geometries it keeps),
    restored ones are read by id and join theirs. Nothing else is read."""
    deleted = _deleted_ids()
    gone = np.setdiff1d(deleted, cached.deleted, assume_unique=True)
    back = np.setdiff1d(cached.deleted, deleted, assume_unique=True)
    classes = dict(cached.classes)
    # One restored while the index was built is in it already.
    for class_index in cached.classes.values():
        back = back[class_index.position_of(back) < 0]
    if len(gone):
        for name, class_index in cached.classes.items():
            drop = np.isin(class_index.ids, gone, assume_unique=True)
            if drop.any():
                classes[name] = class_index.without(drop)
    scale = cached.scale
    if len(back):
        ids, categories, texts, bounds, measures = _rows_read(
            Annotation.objects.filter(id__in=back.tolist())
        )
        geoms = cached.projection.project(shapely.from_geojson(texts)) if len(ids) else texts
        for name, part in _class_slices(categories):
            classes[name] = _class_joined(
                classes.get(name), name, ids[part], geoms[part], bounds[part], measures[part]
            )
        if len(ids):
            scale = max(scale, _scale_over(cached.projection, bounds))
    return SpatialIndex(
        revision=revision,
        projection=cached.projection,
        scale=scale,
        classes={name: classes[name] for name in sorted(classes) if len(classes[name].ids)},
        generation=cached.generation,
        deleted=deleted,
    )


def _class_joined(
    class_index: ClassIndex | None,
    name: str,
    ids: np.ndarray,
    geoms: np.ndarray,
    bounds: np.ndarray,
    measures: np.ndarray,
) -> ClassIndex:
    """A class with annotations added, in id order (its vectors are loaded again on use)."""
    if class_index is not None:
        ids = np.r_[class_index.ids, ids]
        geoms = np.r_[class_index.geoms, geoms]
        bounds = np.r_[class_index.bounds, bounds]
        measures = np.r_[class_index.measures, measures]
    order = np.argsort(ids, kind="stable")
    return ClassIndex.build(name, ids[order], geoms[order], bounds[order], measures[order])


def _scale_over(projection: LocalProjection, bounds: np.ndarray) -> float:
    """The distortion bound of the projection over lon/lat bounds (rows w, s, e, n)."""
    if not len(bounds):
        return 1.0
    min_lon, min_lat = bounds[:, 0].min(), bounds[:, 1].min()
    max_lon, max_lat = bounds[:, 2].max(), bounds[:, 3].max()
    corners_lon = np.array([min_lon, min_lon, max_lon, max_lon])
    corners_lat = np.array([min_lat, max_lat, min_lat, max_lat])
    reach = GEOD.inv(
        np.full(4, projection.lon), np.full(4, projection.lat), corners_lon, corners_lat
    )[2]
    return scale_bound(float(np.max(reach)))


def _spatial_index_build(revision: str, generation: str = "") -> SpatialIndex:
    deleted = _deleted_ids()
    ids, categories, texts, bounds, measures = _rows_read(Annotation.objects.all())
    if len(ids):
        min_lon, min_lat = bounds[:, 0].min(), bounds[:, 1].min()
        max_lon, max_lat = bounds[:, 2].max(), bounds[:, 3].max()
    else:
        min_lon = min_lat = max_lon = max_lat = 0.0
    projection = LocalProjection(lon=(min_lon + max_lon) / 2, lat=(min_lat + max_lat) / 2)
    geoms = projection.project(shapely.from_geojson(texts)) if len(ids) else texts
    classes = {
        name: ClassIndex.build(name, ids[part], geoms[part], bounds[part], measures[part])
        for name, part in _class_slices(categories)
    }
    return SpatialIndex(
        revision=revision,
        projection=projection,
        scale=_scale_over(projection, bounds),
        classes=classes,
        generation=generation,
        deleted=deleted,
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
    return VectorMatrix.of(np.array(positions, dtype=np.int64), matrix)
