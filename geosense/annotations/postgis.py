"""The spatial questions answered by PostGIS, when the database is PostgreSQL (`spatial.py`).

Same questions, same answers as the in-process index (`index.py`, through `selectors.py`), read
from the `geom` column that migration annotations/0005 keeps in step with the GeoJSON, and its
GiST indexes on `geom` and `(geom::geography)`. No process holds a copy of the dataset:

- distances are geodesic metres on `geography` (WGS84 spheroid): the geography index finds
  candidates (within-distance: `&&` with the box grown by the reach, then a planar test,
  `_planar_within_sql`; nearest: `ST_DWithin` on the sphere widened by its error), and each
  is measured between its nearest points (`_metres_sql`);
- overlap shares are `ST_Area` (or `ST_Length`) of `ST_Intersection(...)::geography` over the
  source's own, as the index divides measures in its plane;
- nearest: the geography index's KNN (`<->`, sphere distance) finds the k nearest, then every
  annotation within the k-th one's distance widened by the sphere's error is measured on the
  spheroid and ranked, so a spheroid-nearer one cannot be left out;
- class counts and shapes: one GROUP BY, kept per `AnnotationRevision` token;
- similarity reads the candidate class's vectors of one name per query (`ClassVectors`).

Live means `deleted_at IS NULL`, the filter of `Annotation.objects`.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import connection, transaction

from .index import VectorMatrix
from .models import AnnotationRevision
from .types import BBox, NearestHit, OverlapPair, Shape, WithinPairs

TABLE = "annotations_annotation"
# The sphere `<->` measures on and the spheroid differ by under 0.6 %: 2 % covers it.
SPHERE_MARGIN = 1.02
# WGS84's first eccentricity squared.
E2 = 0.00669437999014
# Metres in a degree of latitude at the equator: the least anywhere on WGS84.
MERIDIAN_DEGREE_M = 110_574.0


def _metres_sql(a: str, b: str, lat: str) -> str:
    """SQL for the geodesic metres between the nearest points of geometries a and b near
    latitude `lat` (0 where they meet).

    `ST_Distance(geography)` on the spheroid is off by up to 0.35 % from a point to a polygon's
    edge (measured on the demo: 6.2853 m where the geodesic is 6.2733 m). So the nearest points
    are found in a plane that is conformal at `lat` (longitudes scaled by the ratio of the
    parallel's radius to the meridian's), where a perpendicular is one on the ground, and the
    geodesic between them is `ST_Length` of that segment on the spheroid (exact for two points).
    """
    scale = _conformal_scale_sql(lat)
    line = f"ST_ShortestLine(ST_Scale({a}, {scale}, 1), ST_Scale({b}, {scale}, 1))"
    return f"ST_Length(ST_Scale({line}, 1 / {scale}, 1)::geography)"


def _conformal_scale_sql(lat: str) -> str:
    """SQL for the longitude scale of a plane conformal at latitude `lat` (`_metres_sql`)."""
    return f"(cos(radians({lat})) * (1 - {E2} * sin(radians({lat}))^2) / (1 - {E2}))"


def _planar_within_sql(a: str, b: str, lat: str) -> str:
    """SQL true when geometries a and b may lie within `%(reach)s` metres (near `lat`): their
    distance in the plane of `_metres_sql`, in degrees of latitude, against the reach over the
    least metres in a degree of latitude on WGS84 (110,574 m, at the equator).

    A superset of the pairs within the reach (the plane's error over a reach is far inside its
    2 % margin), at a fraction of `ST_DWithin(geography)`'s cost: measured at 200,000, the
    geography test on the 420,390 box candidates of "trees within 20 m of a house" cost as much
    PostgreSQL CPU as the index probes that found them (~3 s each)."""
    scale = _conformal_scale_sql(lat)
    return (
        f"ST_DWithin(ST_Scale({a}, {scale}, 1), ST_Scale({b}, {scale}, 1),"
        f" %(reach)s / {MERIDIAN_DEGREE_M})"
    )


_SHAPES: dict[int, Shape] = {0: "point", 1: "line", 2: "polygon"}


def _rows(sql: str, params: dict[str, Any] | Sequence[Any], *, join: bool = False) -> list[tuple]:
    """Rows of one query, without JIT: its compile time (~0.2 s) costs more than it saves on
    these index-driven plans, which PostgreSQL's cost estimates overrate.

    A `join` probes a GiST index once per row of one side. Without bitmap scans: the planner
    otherwise ANDs each probe's bitmap with the whole class's from the category index (43,000
    entries per probe at 200,000 annotations: an overlap took 25 s instead of 3)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        if join:
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(sql, params)
        return cursor.fetchall()


def _sources_sql(bbox: BBox | None) -> tuple[str, str, str, dict[str, Any]]:
    """(WITH clause, FROM item, WHERE condition) naming `s`, the live sources of a join (class
    `%(source)s`), and their parameters.

    Within a bbox (the index's filter: an annotation's bounding box meets it, on the bbox
    columns), the sources are found first through the `geom` index and materialised: left in
    the join, the planner scanned every row for them (0.9 s of CPU at a million for a 600 m
    square, 0.05 s this way). Without one, the join stays free to probe from either side."""
    live = "s.category = %(source)s AND s.deleted_at IS NULL"
    if bbox is None:
        return "", f"{TABLE} s", live, {}
    min_lon, min_lat, max_lon, max_lat = bbox
    with_sql = (
        f"WITH s AS MATERIALIZED (SELECT s.id, s.geom, s.min_lat FROM {TABLE} s WHERE {live}"
        " AND s.geom && ST_MakeEnvelope(%(min_lon)s, %(min_lat)s, %(max_lon)s, %(max_lat)s, 4326)"
        " AND s.min_lon <= %(max_lon)s AND s.max_lon >= %(min_lon)s"
        " AND s.min_lat <= %(max_lat)s AND s.max_lat >= %(min_lat)s)"
    )
    params = {"min_lon": min_lon, "min_lat": min_lat, "max_lon": max_lon, "max_lat": max_lat}
    return with_sql, "s", "TRUE", params


# --- counts, shapes, ids, areas --------------------------------------------------------------

_overview_cache: tuple[str, dict[str, int], dict[str, Shape]] | None = None


def annotation_overview() -> tuple[dict[str, int], dict[str, Shape]]:
    """(live annotations per class, each class's shape), by class name: one GROUP BY per
    revision (every turn's prompt asks; a write changes the token)."""
    global _overview_cache
    revision = AnnotationRevision.current()
    cached = _overview_cache
    if cached is not None and cached[0] == revision:
        return cached[1], cached[2]
    counts: dict[str, int] = {}
    dimensions: dict[str, set[int]] = {}
    for category, dimension, n in _rows(
        f"SELECT category, ST_Dimension(geom), count(*) FROM {TABLE} "
        "WHERE deleted_at IS NULL GROUP BY 1, 2",
        (),
    ):
        counts[category] = counts.get(category, 0) + n
        dimensions.setdefault(category, set()).add(dimension)
    shapes: dict[str, Shape] = {
        name: _SHAPES.get(next(iter(dims)), "mixed") if len(dims) == 1 else "mixed"
        for name, dims in dimensions.items()
    }
    counts = {name: counts[name] for name in sorted(counts)}
    _overview_cache = (revision, counts, shapes)
    return counts, shapes


def annotations_missing(*, ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(deleted, unknown) among ids, each sorted (both empty when every id is live)."""
    wanted = sorted({int(i) for i in ids})
    if not wanted:
        return [], []
    state = dict(_rows(f"SELECT id, deleted_at IS NULL FROM {TABLE} WHERE id = ANY(%s)", [wanted]))
    deleted = [i for i in wanted if state.get(i) is False]
    unknown = [i for i in wanted if i not in state]
    return deleted, unknown


def annotation_areas(*, ids: np.ndarray) -> np.ndarray:
    """The stored geodesic area of each of ids (0 for one not live)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return np.zeros(0)
    found = _rows(
        f"SELECT id, area_m2 FROM {TABLE} WHERE id = ANY(%s) AND deleted_at IS NULL",
        [np.unique(ids).tolist()],
    )
    if not found:
        return np.zeros(len(ids))
    known = np.array(found, dtype=float).reshape(-1, 2)
    order = np.argsort(known[:, 0])
    known_ids, areas = known[order, 0].astype(np.int64), known[order, 1]
    at = np.minimum(np.searchsorted(known_ids, ids), len(known_ids) - 1)
    return np.where(known_ids[at] == ids, areas[at], 0.0)


# --- relations -------------------------------------------------------------------------------


def annotations_within_distance(
    *, source: str, target: str, distance_m: float, bbox: BBox | None = None
) -> WithinPairs:
    """Each live `source` with a live `target` within distance_m geodesic metres, with its
    nearest one (the lowest id among equals); sorted by distance, then id (`selectors`).

    One join: the planner probes the geography index (`&&` with the box grown by the reach)
    from the side it picks, `_planar_within_sql` drops the far candidates, and DISTINCT ON
    keeps each source's nearest by `_metres_sql`.
    """
    if distance_m < 0:
        return WithinPairs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    with_sql, sources, sources_live, params = _sources_sql(bbox)
    rows = _rows(
        f"""
        {with_sql}
        SELECT * FROM (
          SELECT DISTINCT ON (s.id) s.id AS source_id, t.id AS target_id,
                 {_metres_sql("s.geom", "t.geom", "s.min_lat")} AS metres
          FROM {sources} JOIN {TABLE} t
            ON s.geom::geography && _ST_Expand(t.geom::geography, %(reach)s)
               AND {_planar_within_sql("s.geom", "t.geom", "s.min_lat")}
               AND t.id <> s.id
          WHERE t.category = %(target)s AND t.deleted_at IS NULL
            AND {sources_live}
          ORDER BY s.id, metres, t.id
        ) nearest
        WHERE metres <= %(distance)s
        ORDER BY source_id
        """,
        {
            "source": source,
            "target": target,
            "distance": distance_m,
            "reach": distance_m * SPHERE_MARGIN + 0.01,
            **params,
        },
        join=True,
    )
    table = np.array(rows, dtype=float).reshape(-1, 3)
    source_ids, target_ids = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    metres = table[:, 2]
    order = np.argsort(metres, kind="stable")  # rows come by source id: ties stay in id order
    return WithinPairs(source_ids[order], target_ids[order], metres[order])


def annotations_overlapping(
    *, source: str, target: str, bbox: BBox | None = None
) -> list[OverlapPair]:
    """Each live `source` overlapping a live `target`, with the one it overlaps most: the share
    of its geodesic area (lines: length; points: 1) inside; by share, largest first, then id."""
    with_sql, sources, sources_live, params = _sources_sql(bbox)
    rows = _rows(
        f"""
        {with_sql}
        SELECT DISTINCT ON (source_id) source_id, target_id, share FROM (
          SELECT s.id AS source_id, t.id AS target_id,
            LEAST(GREATEST(CASE ST_Dimension(s.geom)
              WHEN 2 THEN ST_Area(ST_CollectionExtract(ST_Intersection(s.geom, t.geom), 3)
                                  ::geography) / NULLIF(ST_Area(s.geom::geography), 0)
              WHEN 1 THEN ST_Length(ST_CollectionExtract(ST_Intersection(s.geom, t.geom), 2)
                                    ::geography) / NULLIF(ST_Length(s.geom::geography), 0)
              ELSE 1.0 END, 0), 1) AS share
          FROM {sources} JOIN {TABLE} t ON ST_Intersects(s.geom, t.geom) AND t.id <> s.id
          WHERE t.category = %(target)s AND t.deleted_at IS NULL
            AND {sources_live}
        ) pairs
        WHERE share > 0
        ORDER BY source_id, share DESC, target_id
        """,
        {"source": source, "target": target, **params},
        join=True,
    )
    rows.sort(key=lambda row: (-row[2], row[0]))
    return [OverlapPair(source_id=s, target_id=t, share=float(v)) for s, t, v in rows]


def annotations_nearest(
    *, lat: float, lon: float, category: str | None = None, k: int = 5
) -> list[NearestHit]:
    """The k live annotations nearest to a point, in geodesic metres to their nearest point
    (0 inside); ties by id."""
    if k <= 0:
        return []
    of_class = " AND category = %(category)s" if category is not None else ""
    params = {"lon": lon, "lat": lat, "category": category, "k": k}
    point_geometry = "ST_SetSRID(ST_MakePoint(%(lon)s, %(lat)s), 4326)"
    point = f"{point_geometry}::geography"
    reach = _rows(
        f"SELECT max(sphere) FROM (SELECT geom::geography <-> {point} AS sphere FROM {TABLE} "
        f"WHERE deleted_at IS NULL{of_class} ORDER BY geom::geography <-> {point} LIMIT %(k)s) n",
        params,
    )[0][0]
    if reach is None:
        return []
    rows = _rows(
        f"SELECT id, category, {_metres_sql('geom', point_geometry, '%(lat)s')} AS metres "
        f"FROM {TABLE} WHERE deleted_at IS NULL{of_class} "
        f"AND ST_DWithin(geom::geography, {point}, %(reach)s, false) "
        "ORDER BY metres, id LIMIT %(k)s",
        {**params, "reach": float(reach) * SPHERE_MARGIN + 0.01},
    )
    return [NearestHit(id=pk, category=name, distance_m=float(m)) for pk, name, m in rows]


# --- similarity ------------------------------------------------------------------------------


@dataclass
class ClassVectors:
    """A class's live ids and, on request, its vectors of one name, read for one query: what
    `selectors.annotations_similar` asks of the index's `ClassIndex`, without keeping a copy."""

    category: str
    ids: np.ndarray
    vectors: dict[tuple[str, int], VectorMatrix] = field(default_factory=dict)

    @classmethod
    def read(cls, category: str) -> "ClassVectors | None":
        rows = _rows(
            f"SELECT id FROM {TABLE} WHERE category = %s AND deleted_at IS NULL ORDER BY id",
            [category],
        )
        if not rows:
            return None
        return cls(category=category, ids=np.array([row[0] for row in rows], dtype=np.int64))

    def vector_matrix(self, name: str, size: int) -> VectorMatrix:
        """The class's vectors called `name` of `size` numbers (others are left out)."""
        key = (name, size)
        if key not in self.vectors:
            positions: list[int] = []
            texts: list[str] = []
            for pk, vector in _rows(
                f"SELECT id, vectors -> %s FROM {TABLE} WHERE category = %s "
                "AND deleted_at IS NULL AND jsonb_typeof(vectors -> %s) = 'array' "
                "AND jsonb_array_length(vectors -> %s) = %s ORDER BY id",
                [name, self.category, name, name, size],
            ):
                at = int(np.searchsorted(self.ids, pk))
                if at < len(self.ids) and self.ids[at] == pk:
                    positions.append(at)
                    texts.append(vector)
            # jsonb comes as text through Django's cursor: parsed in one call, not per row.
            matrix = np.array(json.loads(f"[{','.join(texts)}]"), dtype=float)
            matrix = matrix.reshape(len(texts), size)
            self.vectors[key] = VectorMatrix.of(np.array(positions, dtype=np.int64), matrix)
        return self.vectors[key]
