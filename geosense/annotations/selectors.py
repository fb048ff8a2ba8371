"""Reads over live annotations: counts, lists, spatial relations, measures, similarity.

Spatial relations, counts and similarity run on the in-process index (`index.py`), or in
PostGIS when the database is PostgreSQL (`postgis.py`; `spatial.py` decides, and each selector
below that the index would answer hands over first: same answers, no copy of the dataset).
Every distance the index reports is geodesic within 0.01 %: its equidistant plane where its
distortion bound allows, pyproj's Geod between the nearest points elsewhere. Shares are ratios
of measures in that plane (its distortion cancels out in a ratio).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import shapely
from django.db.models import Count, Q, QuerySet, TextField
from django.db.models.functions import Cast
from shapely.geometry import shape

from . import postgis
from .classes import class_match
from .clip import overlap_areas
from .geometry import GEOD
from .index import ClassIndex, SpatialIndex, nearest_within, spatial_index, spatial_index_cached
from .models import Annotation, AnnotationRevision
from .spatial import spatial_backend
from .types import (
    DEFAULT_VECTOR,
    AnnotationMeasures,
    AnnotationNotFound,
    AnnotationSummary,
    BBox,
    ClassNotFound,
    DatasetOverview,
    NearestHit,
    OverlapPair,
    Shape,
    SimilarHit,
    SimilarSearch,
    VectorNotFound,
    WithinPairs,
)

ORDERINGS = frozenset({"area_m2", "-area_m2", "length_m", "-length_m", "id"})
ID_CHUNK = 900


def _in_bbox(queryset: QuerySet[Annotation], bbox: BBox | None) -> QuerySet[Annotation]:
    """Annotations whose bounding box meets bbox (an indexable test on the bbox columns)."""
    if bbox is None:
        return queryset
    min_lon, min_lat, max_lon, max_lat = bbox
    return queryset.filter(
        Q(min_lon__lte=max_lon)
        & Q(max_lon__gte=min_lon)
        & Q(min_lat__lte=max_lat)
        & Q(max_lat__gte=min_lat)
    )


def annotation_counts(*, bbox: BBox | None = None) -> dict[str, int]:
    """Live annotations per class: over everything, from the index (kept per revision: every
    turn's system prompt asks); within a bbox, counted by the database."""
    if bbox is None:
        if spatial_backend() == "postgis":
            return postgis.annotation_overview()[0]
        return spatial_index().counts()
    rows = _in_bbox(Annotation.objects.all(), bbox).values("category").annotate(n=Count("id"))
    return {row["category"]: row["n"] for row in rows.order_by("category")}


def annotation_vector_names(*, ids: Sequence[int]) -> dict[int, list[str]]:
    """The vector kinds ("shape", "context") of each of these live annotations, in order."""
    return {
        pk: list(vectors) if isinstance(vectors, dict) else []
        for pk, vectors in Annotation.objects.filter(id__in=list(ids)).values_list("id", "vectors")
    }


_SHAPES_BY_DIMENSION: dict[int, Shape] = {0: "point", 1: "line", 2: "polygon"}
# The overview of the index last asked (its id and revision): made once per index revision
# (the counts, the shapes, worked out from the index), not at every step of every turn.
_overview_cache: tuple[int, str, DatasetOverview] | None = None


def annotation_overview(*, revision: tuple[str, str] | None = None) -> DatasetOverview:
    """Live annotations per class and each class's shape (from the spatial index; the shapes
    are worked out once per index). `revision`: the revision row's (token, generation) as the
    caller's statement read it just now (`AnnotationRevision.state()`), so that the index kept
    at that token is taken without reading the row again (a statement a step, issue 15); any
    other token, or none, and the index is asked as ever (it reads the row).

    With the index, the same overview (one object, shared: read it, never change it) is given
    while the index and its revision are the same: a step's system prompt is then made once
    too (chat.turns)."""
    global _overview_cache
    if spatial_backend() == "postgis":
        counts, shapes = postgis.annotation_overview()
        return DatasetOverview(counts=counts, shapes=shapes)
    index = spatial_index_cached()
    if index is None or revision is None or index.revision != revision[0]:
        index = spatial_index()
    cached = _overview_cache
    if cached is not None and cached[:2] == (id(index), index.revision):
        return cached[2]
    shapes = {name: _class_shape(c) for name, c in index.classes.items()}
    counts = index.counts()  # the index just read: not the revision row a second time
    overview = DatasetOverview(
        counts=counts, shapes={name: shapes.get(name, "mixed") for name in counts}
    )
    _overview_cache = (id(index), index.revision, overview)
    return overview


def _class_shape(class_index: ClassIndex) -> Shape:
    """A class's shape from its annotations' dimensions, kept with the class (`derived`, which
    a deletion carries over): the first turn after a deletion measured every geometry of every
    class again (~45 ms at a million), though only the class that lost some changed."""
    dimensions = class_index.derived.get("dimensions")
    if dimensions is None:
        dimensions = shapely.get_dimensions(class_index.geoms).astype(np.int8)
        class_index.derived["dimensions"] = dimensions
    present = np.flatnonzero(np.bincount(dimensions.astype(np.intp) + 1, minlength=4)) - 1
    return _SHAPES_BY_DIMENSION.get(int(present[0]), "mixed") if len(present) == 1 else "mixed"


def annotations_missing(*, ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(deleted, unknown) among ids: the soft-deleted ones and those no annotation ever had,
    each sorted; both empty when every id is live. From the index (no row is read)."""
    if spatial_backend() == "postgis":
        return postgis.annotations_missing(ids=ids)
    index = spatial_index()
    wanted = np.unique(np.asarray(list(ids), dtype=np.int64))
    live = np.zeros(len(wanted), dtype=bool)
    for class_index in index.classes.values():
        live |= class_index.position_of(wanted) >= 0
    absent = wanted[~live]
    deleted = np.isin(absent, index.deleted)
    return absent[deleted].tolist(), absent[~deleted].tolist()


def annotation_areas(*, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The geodesic area of each of ids (0 for one not live), for attributes of large answers:
    read from the index, which keeps every annotation's measures (an answer may name 400,000)."""
    if spatial_backend() == "postgis":
        return postgis.annotation_areas(ids=np.asarray(ids, dtype=np.int64))
    return spatial_index().areas_of(np.asarray(ids, dtype=np.int64))


def annotation_list(
    *,
    category: str | None = None,
    bbox: BBox | None = None,
    ids: Sequence[int] | None = None,
    order_by: str | None = None,
    limit: int | None = None,
) -> list[AnnotationSummary]:
    """Live annotations as summaries, ordered by `order_by` (then id), at most `limit`.

    Long id lists are read in chunks (SQLite caps the parameters of one statement) and
    ordered here.
    """
    if order_by is not None and order_by not in ORDERINGS:
        raise ValueError(f"order_by must be one of {sorted(ORDERINGS)}")
    # Geometries come as text and are parsed in one vectorised call (long lists are common:
    # the ids of every pair of a within-distance answer).
    queryset = _in_bbox(
        Annotation.objects.annotate(geometry_text=Cast("geometry", TextField())), bbox
    )
    if category is not None:
        queryset = queryset.filter(category=category)
    fields = ("id", "category", "area_m2", "length_m", "attributes", "geometry_text")
    ordering = [order_by, "id"] if order_by and order_by != "id" else ["id"]
    if ids is None or len(ids) <= ID_CHUNK:
        if ids is not None:
            queryset = queryset.filter(id__in=list(ids))
        queryset = queryset.order_by(*ordering)
        if limit is not None:
            queryset = queryset[: max(limit, 0)]
        rows = list(queryset.values_list(*fields))
    else:
        wanted = sorted(set(ids))
        rows = [
            row
            for start in range(0, len(wanted), ID_CHUNK)
            for row in queryset.filter(id__in=wanted[start : start + ID_CHUNK]).values_list(*fields)
        ]
        column = {"area_m2": 2, "length_m": 3}.get((order_by or "id").lstrip("-"), 0)
        rows.sort(key=lambda row: row[0])
        rows.sort(key=lambda row: row[column], reverse=bool(order_by and order_by.startswith("-")))
        rows = rows[: max(limit, 0)] if limit is not None else rows
    if not rows:
        return []
    centres = shapely.get_coordinates(
        shapely.centroid(shapely.from_geojson([row[5] for row in rows]))
    ).tolist()
    return [
        AnnotationSummary(
            id=pk,
            category=category_,
            area_m2=area,
            length_m=length,
            attributes=attributes,
            centroid_lat=lat,
            centroid_lon=lon,
        )
        for (pk, category_, area, length, attributes, _), (lon, lat) in zip(
            rows, centres, strict=True
        )
    ]


def annotation_measures(*, annotation_id: int) -> AnnotationMeasures:
    annotation = Annotation.objects.filter(pk=annotation_id).first()
    if annotation is None:
        raise AnnotationNotFound(f"annotation {annotation_id} does not exist", [annotation_id])
    geom = shape(annotation.geometry)
    centre = geom.centroid
    is_area = shapely.get_dimensions(geom) == 2
    return AnnotationMeasures(
        id=annotation.pk,
        category=annotation.category,
        geometry_type=geom.geom_type,
        area_m2=annotation.area_m2,
        length_m=annotation.length_m,
        perimeter_m=annotation.length_m if is_area else 0.0,
        centroid_lat=centre.y,
        centroid_lon=centre.x,
        bbox=(annotation.min_lon, annotation.min_lat, annotation.max_lon, annotation.max_lat),
        attributes=annotation.attributes,
    )


def annotations_geojson(
    *, bbox: BBox | None = None, category: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """A GeoJSON FeatureCollection of live annotations (ordered by id, at most `limit`)."""
    queryset = _in_bbox(Annotation.objects.all(), bbox)
    if category is not None:
        queryset = queryset.filter(category=category)
    queryset = queryset.order_by("id")
    total = None
    if limit is not None:
        total = queryset.count()
        queryset = queryset[: max(limit, 0)]
    features = [
        {
            "type": "Feature",
            "id": pk,
            "geometry": geometry,
            "properties": {
                **attributes,
                "class": category_,
                "area_m2": round(area, 2),
                "length_m": round(length, 2),
            },
        }
        for pk, category_, geometry, attributes, area, length in queryset.values_list(
            "id", "category", "geometry", "attributes", "area_m2", "length_m"
        )
    ]
    collection: dict[str, Any] = {"type": "FeatureCollection", "features": features}
    if total is not None and total > len(features):
        collection["truncated"] = True
        collection["total"] = total
    return collection


def annotations_within_distance(
    *, source: str, target: str, distance_m: float, bbox: BBox | None = None
) -> WithinPairs:
    """Each `source` annotation with a `target` within distance_m metres, with its nearest one
    (the lowest id among equals).

    bbox limits the sources; their targets may lie outside it. Sorted by distance, then id.
    """
    if spatial_backend() == "postgis":
        return postgis.annotations_within_distance(
            source=source, target=target, distance_m=distance_m, bbox=bbox
        )
    index = spatial_index()
    sources, targets = index.classes.get(source), index.classes.get(target)
    if sources is None or targets is None or distance_m < 0:
        return WithinPairs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    src, chosen, nearest = nearest_within(
        sources, sources.positions_in(bbox), targets, index.search_distance(distance_m)
    )
    metres = index.geodesic(nearest, sources.geoms[src], targets.geoms[chosen])
    keep = metres <= distance_m
    source_ids, target_ids, metres = sources.ids[src][keep], targets.ids[chosen][keep], metres[keep]
    # Sources come in id order, so an order stable among ties keeps ids ascending there.
    order = stable_order(metres)
    return WithinPairs(source_ids[order], target_ids[order], metres[order])


def stable_order(values: np.ndarray) -> np.ndarray:
    """What `np.argsort(values, kind="stable")` gives, in about a quarter of the time.

    numpy's stable sort of floats is a merge sort (~45 ms for the 470,000 distances of a
    million-annotation within-distance answer); its default sort is vectorised (~10 ms) but
    leaves ties in any order. So: the default sort, then only the runs of equal values (often
    none: distances rarely tie) put back in index order.
    """
    order = np.argsort(values)
    ordered = values[order]
    tie = ordered[1:] == ordered[:-1]
    if not tie.any():
        return order
    in_run = np.zeros(len(order), dtype=bool)
    in_run[1:] |= tie
    in_run[:-1] |= tie
    at = np.flatnonzero(in_run)
    # Runs are contiguous and their values ascend, so sorting by (value, index) reorders
    # each run within itself and leaves everything else in place.
    order[at] = order[at][np.lexsort((order[at], ordered[at]))]
    return order


def annotations_overlapping(
    *, source: str, target: str, bbox: BBox | None = None
) -> list[OverlapPair]:
    """Each `source` annotation that overlaps a `target`, with the target it overlaps most.

    The share is the part of the source inside the target: by area for polygons, by length
    for lines, 1 for a point inside. Sorted by share (largest first), then id.
    """
    if spatial_backend() == "postgis":
        return postgis.annotations_overlapping(source=source, target=target, bbox=bbox)
    index = spatial_index()
    sources, targets = index.classes.get(source), index.classes.get(target)
    if sources is None or targets is None:
        return []
    positions = sources.positions_in(bbox)
    if len(positions) == 0:
        return []
    hits, other = targets.tree.query(sources.geoms[positions], predicate="intersects")
    src = positions[hits]
    if source == target:
        distinct = sources.ids[src] != targets.ids[other]
        src, other = src[distinct], other[distinct]
    shares = _overlap_shares(sources.geoms[src], targets.geoms[other])
    keep = shares > 0
    source_ids, target_ids, shares = sources.ids[src][keep], targets.ids[other][keep], shares[keep]
    # Largest share per source (ties: the lowest target id), then the sort order asked for.
    order = np.lexsort((target_ids, -shares, source_ids))
    source_ids, target_ids, shares = source_ids[order], target_ids[order], shares[order]
    first = np.r_[True, source_ids[1:] != source_ids[:-1]] if len(source_ids) else np.zeros(0, bool)
    source_ids, target_ids, shares = source_ids[first], target_ids[first], shares[first]
    order = np.lexsort((source_ids, -shares))
    return [
        OverlapPair(source_id=int(s), target_id=int(t), share=float(v))
        for s, t, v in zip(source_ids[order], target_ids[order], shares[order], strict=True)
    ]


def _overlap_shares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The part of each a inside its b: by area for polygons (`clip.overlap_areas`: numpy where
    one of the pair is convex, GEOS otherwise), by length for lines, 1 for points."""
    if len(a) == 0:
        return np.zeros(0)
    dims = shapely.get_dimensions(a)
    shares = np.ones(len(a))
    polygons, lines = dims == 2, dims == 1
    if polygons.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            by_area = overlap_areas(a[polygons], b[polygons]) / shapely.area(a[polygons])
        # Rounding in the clip can leave ~1e-16 where polygons only touch: that is no overlap.
        shares[polygons] = np.where(by_area < 1e-12, 0.0, by_area)
    if lines.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            shares[lines] = shapely.length(shapely.intersection(a[lines], b[lines])) / (
                shapely.length(a[lines])
            )
    return np.clip(np.nan_to_num(shares), 0.0, 1.0)


def annotations_nearest(
    *, lat: float, lon: float, category: str | None = None, k: int = 5
) -> list[NearestHit]:
    """The k live annotations nearest to a point (geodesic metres to their nearest point)."""
    if spatial_backend() == "postgis":
        return postgis.annotations_nearest(lat=lat, lon=lon, category=category, k=k)
    index = spatial_index()
    if k <= 0:
        return []
    classes = [index.classes[category]] if category in index.classes else []
    if category is None:
        classes = list(index.classes.values())
    point = index.projection.project(np.array([shapely.Point(lon, lat)], dtype=object))[0]
    hits: list[NearestHit] = []
    for class_index in classes:
        hits.extend(_nearest_in_class(index, class_index, point, lon=lon, lat=lat, k=k))
    hits.sort(key=lambda hit: (hit.distance_m, hit.id))
    return hits[:k]


def _nearest_in_class(
    index: SpatialIndex,
    class_index: ClassIndex,
    point: shapely.Point,
    *,
    lon: float,
    lat: float,
    k: int,
) -> list[NearestHit]:
    """Grow a search radius until it holds k candidates, then widen it once by the projection's
    distortion bound so that no geodesically nearer annotation is left outside."""
    total = len(class_index.ids)
    radius = 50.0
    while True:
        candidates = class_index.tree.query(point, predicate="dwithin", distance=radius)
        if len(candidates) >= min(k, total):
            break
        radius *= 4
    metres = _distances_from(index, lon, lat, class_index.geoms[candidates])
    if len(metres):
        reach = index.search_distance(
            float(np.sort(metres)[min(k, len(metres)) - 1]), lon=lon, lat=lat
        )
        if reach > radius:
            candidates = class_index.tree.query(point, predicate="dwithin", distance=reach)
            metres = _distances_from(index, lon, lat, class_index.geoms[candidates])
    order = np.lexsort((class_index.ids[candidates], metres))[:k]
    return [
        NearestHit(
            id=int(class_index.ids[candidates[i]]),
            category=class_index.category,
            distance_m=float(metres[i]),
        )
        for i in order
    ]


def _distances_from(index: SpatialIndex, lon: float, lat: float, geoms: np.ndarray) -> np.ndarray:
    if len(geoms) == 0:
        return np.zeros(0)
    point = index.projection.project(np.array([shapely.Point(lon, lat)], dtype=object))[0]
    ends = shapely.get_coordinates(shapely.shortest_line(point, geoms)).reshape(-1, 2, 2)
    near_lon, near_lat = index.projection.to_lonlat(ends[:, 1, 0], ends[:, 1, 1])
    metres = np.asarray(
        GEOD.inv(np.full(len(geoms), lon), np.full(len(geoms), lat), near_lon, near_lat)[2]
    )
    return np.where(shapely.intersects(point, geoms), 0.0, metres)


def annotations_similar(
    *, samples: Sequence[tuple[int, str | None]], category: str | None = None, k: int = 20
) -> list[SimilarHit]:
    """Top-k annotations of a class by cosine similarity to one or more samples.

    Each sample is (id, vector name or None for "shape"). Vectors are compared after
    standardising each component over the class, so that no feature's unit dominates;
    with several samples the score is the mean of the cosines. Samples are never results.
    """
    if not samples:
        raise ValueError("similarity needs at least one sample")
    sample_ids = [int(sample_id) for sample_id, _ in samples]
    rows = {
        pk: (category_, vectors)
        for pk, category_, vectors in Annotation.objects.filter(id__in=sample_ids).values_list(
            "id", "category", "vectors"
        )
    }
    absent = [sample_id for sample_id in sample_ids if sample_id not in rows]
    if absent:
        raise AnnotationNotFound(f"annotation {absent[0]} does not exist", absent)
    wanted: list[tuple[str, np.ndarray]] = []
    for sample_id, name in samples:
        vector_name = name or DEFAULT_VECTOR
        vector = (
            rows[int(sample_id)][1].get(vector_name)
            if isinstance(rows[int(sample_id)][1], dict)
            else None
        )
        if not isinstance(vector, list) or not vector:
            raise VectorNotFound(f"annotation {sample_id} has no {vector_name!r} vector")
        wanted.append((vector_name, np.asarray(vector, dtype=float)))
    category = category or rows[sample_ids[0]][0]
    class_index = _class_vectors(category)
    if class_index is None or k <= 0:
        return []
    total = np.zeros(len(class_index.ids))
    seen = np.zeros(len(class_index.ids), dtype=np.int64)
    for vector_name, vector in wanted:
        matrix = class_index.vector_matrix(vector_name, len(vector))
        total[matrix.positions] += matrix.unit_rows @ matrix.unit(vector)
        seen[matrix.positions] += 1
    eligible = (seen == len(wanted)) & ~np.isin(class_index.ids, sample_ids)
    positions = np.flatnonzero(eligible)
    return _top_hits(class_index, positions, total[positions] / len(wanted), k=k)


def _class_vectors(category: str) -> ClassIndex | postgis.ClassVectors | None:
    """A class's ids and vectors: the index's, or on PostGIS read for this query alone."""
    if spatial_backend() == "postgis":
        return postgis.ClassVectors.read(category)
    return spatial_index().classes.get(category)


def _top_hits(
    class_index: ClassIndex | postgis.ClassVectors,
    positions: np.ndarray,
    scores: np.ndarray,
    *,
    k: int,
) -> list[SimilarHit]:
    """The k best-scored positions of a class as hits, best first (ties: the lower id)."""
    if len(positions) > k:
        top = np.argpartition(-scores, k - 1)[:k]
        positions, scores = positions[top], scores[top]
    order = np.lexsort((class_index.ids[positions], -scores))
    return [
        SimilarHit(
            id=int(class_index.ids[positions[i]]),
            category=class_index.category,
            score=round(float(scores[i]), 6),
        )
        for i in order
    ]


def annotations_typical(*, category: str, k: int, vector: str = DEFAULT_VECTOR) -> list[SimilarHit]:
    """The k annotations most like their class as a whole: the highest mean cosine similarity
    to the class's members (vectors standardised per component, as `annotations_similar`
    compares them). What a find-similar block with a hint and no samples searches."""
    class_index = _class_vectors(category)
    if class_index is None or k <= 0:
        return []
    sizes = {
        len(vectors[vector])
        for vectors in Annotation.objects.filter(category=category).values_list(
            "vectors", flat=True
        )[:1]
        if isinstance(vectors, dict) and isinstance(vectors.get(vector), list)
    }
    if not sizes:
        return []
    matrix = class_index.vector_matrix(vector, sizes.pop())
    if not len(matrix.positions):
        return []
    scores = matrix.unit_rows @ matrix.unit_rows.mean(axis=0)
    return _top_hits(class_index, matrix.positions, scores, k=k)


def annotations_similar_by_hint(
    *, samples: Sequence[tuple[int, str | None]], hint: str | None, k: int
) -> SimilarSearch:
    """The reader's find-similar search (a block's button). The hint is the class to search
    when it names one ("pool", "pools"); any other hint searches the first sample's class, as a
    model's hint is free text ("big ones"). Without samples the hint must name a class: the
    search then finds the annotations most typical of it (`annotations_typical`)."""
    counts = annotation_counts()
    category = class_match(hint, counts) if hint else None
    if not samples:
        if category is None:
            raise ClassNotFound(f"{hint!r} names no class, and there are no samples")
        return SimilarSearch(category=category, hits=annotations_typical(category=category, k=k))
    hits = annotations_similar(samples=samples, category=category, k=k)
    return SimilarSearch(category=hits[0].category if hits else category, hits=hits)


def annotation_boxes(*, ids: Sequence[int]) -> list[tuple[int, str, float, float, float, float]]:
    """(id, class, min_lon, min_lat, max_lon, max_lat) of the live annotations among `ids`, by
    id: where the map fits a highlight or a focus and ends its link lines. A dense id set (a
    query's answer usually is) is read as one id range, a sparse one in chunks."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    fields = ("id", "category", "min_lon", "min_lat", "max_lon", "max_lat")
    if wanted[-1] - wanted[0] < 4 * len(wanted) + ID_CHUNK:
        keep = set(wanted)
        rows = Annotation.objects.filter(id__gte=wanted[0], id__lte=wanted[-1]).order_by("id")
        return [row for row in rows.values_list(*fields) if row[0] in keep]
    return [
        row
        for start in range(0, len(wanted), ID_CHUNK)
        for row in Annotation.objects.filter(id__in=wanted[start : start + ID_CHUNK])
        .order_by("id")
        .values_list(*fields)
    ]


def annotations_revision() -> str:
    """A token that changes on every write to annotations (cached renderings compare it)."""
    return AnnotationRevision.current()
