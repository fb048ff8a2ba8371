"""The spatial questions answered by PostGIS, when the database is PostgreSQL (`spatial.py`).

Same questions, same answers as the in-process index (`index.py`, through `selectors.py`), read
from the `geom` column that migration annotations/0005 keeps in step with the GeoJSON, and its
GiST indexes on `geom` and `(geom::geography)`. No process holds a copy of the dataset:

- within-distance over the whole dataset up to `NEAREST_REACH_M` reads each source's nearest
  target from `annotations_nearest`, which the database keeps as annotations are written
  (migration annotations/0007, `_within_kept`); the join below answers farther distances and
  questions within a bbox;
- distances are geodesic metres on the WGS84 spheroid, measured between nearest points
  (`_metres_sql`). within-distance finds its candidate pairs by a hash join on a grid of
  cells over the whole dataset (`_grid_pairs_sql`) or through the geography index within a
  bbox (`_probe_pairs_sql`), keeps each source's nearest by a planar distance
  (`_planar_distance_sql`) and takes that one's metres from it, within 0.001 % of the
  spheroid's (`_plane_metres_sql`, which measures on the spheroid where it cannot bound the
  plane's error that tightly); nearest finds its candidates with
  `ST_DWithin` on the sphere widened by its error;
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
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from .index import VectorMatrix
from .models import NEAREST_LOCK, AnnotationRevision
from .types import BBox, NearestHit, OverlapPair, Shape, WithinPairs

TABLE = "annotations_annotation"
# The sphere `<->` measures on and the spheroid differ by under 0.6 %: 2 % covers it.
SPHERE_MARGIN = 1.02
# WGS84's first eccentricity squared.
E2 = 0.00669437999014
# Metres in a degree of latitude at the equator: the least anywhere on WGS84.
MERIDIAN_DEGREE_M = 110_574.0
# The same unrounded, a(1 - e²)·π/180: a degree of latitude at φ is this over
# (1 - e² sin² φ)^1.5 metres.
MERIDIAN_ARC_M = 6_378_137.0 * (1 - E2) * math.pi / 180
# Relative error up to which `_plane_metres_sql` takes the plane's metres for the geodesic
# (0.001 %: the index's own tolerance is 0.01 %, `index.PLANE_TOLERANCE`).
PLANE_BOUND = 1e-5


def _metres_sql(a: str, b: str, scale: str) -> str:
    """SQL for the geodesic metres between the nearest points of geometries a and b, in the
    plane of longitudes times `scale` (`_conformal_scale_sql` of a latitude near them; 0 where
    they meet).

    `ST_Distance(geography)` on the spheroid is off by up to 0.35 % from a point to a polygon's
    edge (measured on the demo: 6.2853 m where the geodesic is 6.2733 m). So the nearest points
    are found in a plane that is conformal at `lat` (longitudes scaled by the ratio of the
    parallel's radius to the meridian's), where a perpendicular is one on the ground, and the
    geodesic between them is `ST_Length` of that segment on the spheroid (exact for two points).
    """
    line = f"ST_ShortestLine(ST_Scale({a}, {scale}, 1), ST_Scale({b}, {scale}, 1))"
    return f"ST_Length(ST_Scale({line}, 1 / {scale}, 1)::geography)"


def _conformal_scale_sql(lat: str) -> str:
    """SQL for the longitude scale of a plane conformal at latitude `lat` (`_metres_sql`)."""
    return f"(cos(radians({lat})) * (1 - {E2} * sin(radians({lat}))^2) / (1 - {E2}))"


def _planar_distance_sql(a: str, b: str, scale: str) -> str:
    """SQL for the distance of geometries a and b in the plane of `_metres_sql` (longitudes
    times `scale`), in degrees of latitude: against `%(reach)s / MERIDIAN_DEGREE_M` (the reach over the
    least metres in a degree of latitude on WGS84, 110,574 m at the equator) it keeps a superset
    of the pairs within the reach (the plane's error over a reach is far inside its 2 % margin),
    and among one source's candidates it ranks them as their metres do (`_metres_sql` is then
    measured for the nearest only).

    Measured at 200,000: `ST_DWithin(geography)` on the 420,390 box candidates of "trees within
    20 m of a house" cost as much PostgreSQL CPU as the index probes that found them (~3 s
    each), and the spheroid metres of every candidate 20 % of the rest."""
    return f"ST_Distance(ST_Scale({a}, {scale}, 1), ST_Scale({b}, {scale}, 1))"


def _plane_metres_sql() -> str:
    """SQL for the geodesic metres of a source and its nearest target in the subquery
    `nearest` of `annotations_within_distance` (columns source_id, target_id, scale, lat0,
    lat1, planar): `planar` times the metres in a degree of latitude at lat0, where the plane of
    `_planar_distance_sql` is conformal; or, where that cannot be trusted to `PLANE_BOUND`,
    `_metres_sql` on their geometries read again by id.

    Why it holds: in that plane (x = longitude times `scale` at lat0, y = latitude, in degrees)
    a length at latitude φ is the plane's times M(φ)/M(lat0) northwards and N(φ)cos φ /
    (N(lat0)cos lat0) eastwards (M, N the spheroid's meridian and prime vertical radii of
    curvature). Per radian of latitude the logarithm of the first moves by 3e² sin φ cos φ /
    (1 - e² sin² φ), at most 3e²/(2(1 - e²)) < 0.0101, and of the second by
    e² sin φ cos φ / (1 - e² sin² φ) - tan φ, at most |tan φ|. The nearest points lie in the
    source's box and within `planar` of it, so in latitudes within lat1 - lat0 + planar of lat0
    (lat0, lat1: the box's least and greatest), and the geodesic between them is the plane's
    metres times e^±B, B that span in radians times (tan of the highest |latitude| in it +
    0.0101). For a tree 20 m from a house at 34° B is ~2e-6, and the metres differ from
    `_metres_sql`'s by as much. Above `PLANE_BOUND` (a span of ~90 m at 34°, ~10 m at 80°),
    at 89° or more, or with the distance within e^±B of %(distance)s (a pair the
    bound cannot put on its side), the spheroid decides as before: a handful of rows.

    Measured at a million ("trees within 20 m of a house", docs/benchmarks.md): `_metres_sql`
    on every nearest pair cost ~2 µs each and made the sort below it carry both geometries."""
    trusted, plane, bound = _plane_sql()
    exact = _metres_sql("s.geom", _near_side_sql("s.geom", "t.geom"), "nearest.scale")
    return (
        f"CASE WHEN {trusted}"
        f" AND ({plane} * (1 + 2 * {bound}) <= %(distance)s"
        f" OR {plane} * (1 - 2 * {bound}) > %(distance)s) THEN {plane}"
        f" ELSE (SELECT {exact} FROM {TABLE} s JOIN {TABLE} t ON t.id = nearest.target_id"
        " WHERE s.id = nearest.source_id) END"
    )


def _plane_sql(
    planar: str = "planar", lat0: str = "lat0", lat1: str = "lat1"
) -> tuple[str, str, str]:
    """SQL for (whether the plane's metres can be trusted, those metres, B) of a source and its
    nearest at `planar`, the source's box spanning latitudes lat0 to lat1: the geodesic is the
    plane's metres times e^±B (`_plane_metres_sql` says why), trusted when B <= `PLANE_BOUND`
    below 89°."""
    top = f"greatest(abs({lat0} - {planar}), abs({lat1} + {planar}))"
    bound = f"(radians({lat1} - {lat0} + {planar}) * (tan(radians({top})) + 0.0101))"
    plane = f"({planar} * {MERIDIAN_ARC_M!r} / (1 - {E2} * sin(radians({lat0}))^2) ^ 1.5)"
    return f"{top} < 89 AND {bound} <= {PLANE_BOUND}", plane, bound


_SHAPES: dict[int, Shape] = {0: "point", 1: "line", 2: "polygon"}


def _rows(
    sql: str, params: dict[str, Any] | Sequence[Any], *, join: bool = False, grid: bool = False
) -> list[tuple]:
    """Rows of one query, without JIT: its compile time (~0.2 s) costs more than it saves on
    these index-driven plans, which PostgreSQL's cost estimates overrate.

    A `join` probes a GiST index once per row of one side. Without bitmap scans: the planner
    otherwise ANDs each probe's bitmap with the whole class's from the category index (43,000
    entries per probe at 200,000 annotations: an overlap took 25 s instead of 3).

    A `grid` join (`_grid_pairs_sql`) is a hash join: without merge joins, which the planner
    picked from its estimate of one matching row (sorting both cell lists on disk: 2.2 s of
    CPU at 200,000 instead of 1.2)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        if join:
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        if grid:
            cursor.execute("SET LOCAL enable_mergejoin = off")
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
        f"WITH s AS MATERIALIZED (SELECT s.id, s.geom, s.min_lat, s.max_lat FROM {TABLE} s"
        f" WHERE {live}"
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

    Over the whole dataset within `NEAREST_REACH_M`, the answer is read from the table the
    database keeps (`_within_kept`). Farther, or within a bbox, it is joined here:
    candidate pairs (`_grid_pairs_sql` for the whole dataset, `_probe_pairs_sql` within a bbox)
    are a superset of the pairs within the reach; `_planar_distance_sql` drops the far ones
    and ranks each source's others, DISTINCT ON keeps its nearest (sorting ids and numbers
    only: the geometries stay behind), and only that one gets its metres (`_plane_metres_sql`:
    from the planar distance, or on the spheroid where that bound is not tight enough). The
    OFFSET 0 fences stop the planner from copying a measure into the filter above it (each
    would be computed twice).
    """
    if distance_m < 0:
        return WithinPairs(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0))
    if bbox is None and distance_m <= NEAREST_REACH_M:
        return _within_kept(source=source, target=target, distance_m=distance_m)
    return within_joined(source=source, target=target, distance_m=distance_m, bbox=bbox)


def within_joined(
    *, source: str, target: str, distance_m: float, bbox: BBox | None = None
) -> WithinPairs:
    """`annotations_within_distance` by a join per question, whatever the distance (the tests
    compare the kept table's answers with it)."""
    reach = distance_m * SPHERE_MARGIN + 0.01
    if bbox is None:
        with_sql, pairs, params = _grid_pairs_sql(reach)
    else:
        with_sql, pairs, params = _probe_pairs_sql(bbox)
    rows = _rows(
        f"""
        {with_sql}
        SELECT source_id, target_id, metres FROM (
          SELECT source_id, target_id, {_plane_metres_sql()} AS metres FROM (
            SELECT DISTINCT ON (source_id) * FROM (
              SELECT source_id, target_id, scale, lat0, lat1,
                     {_planar_distance_sql("sg", "tg", "scale")} AS planar
              FROM ({pairs}) pairs OFFSET 0
            ) candidates
            WHERE planar <= %(reach)s / {MERIDIAN_DEGREE_M}
            ORDER BY source_id, planar, target_id
          ) nearest OFFSET 0
        ) measured
        WHERE metres <= %(distance)s
        ORDER BY source_id
        """,
        {"source": source, "target": target, "distance": distance_m, "reach": reach, **params},
        join=True,
        grid=bbox is None,
    )
    table = np.array(rows, dtype=float).reshape(-1, 3)
    source_ids, target_ids = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    metres = table[:, 2]
    order = np.argsort(metres, kind="stable")  # rows come by source id: ties stay in id order
    return WithinPairs(source_ids[order], target_ids[order], metres[order])


# --- the nearest of each class, kept by the database (migration annotations/0007) -----------

NEAREST_TABLE = "annotations_nearest"
# The reach of the kept table: questions within this many metres over the whole dataset read it,
# farther ones join. Its rows, its build and each write's trigger grow with it (measured at a
# million, docs/benchmarks.md "Issue 18: the nearest of each class kept by the database"):
# 20 m, the question, 4.3 M rows built in ~2 min; 50 m, 6.5 M rows in 5 min.
NEAREST_REACH_M = 20.0
# The setting with which a bulk writer turns the trigger off until its `nearest_rebuild`.
NEAREST_DEFERRED = "geosense.nearest_deferred"
# A write of at least this many rows, and at least a tenth of the table, rebuilds the table
# once instead of keeping it row by row (`nearest_kept_in_bulk`): the trigger costs a few ms a
# row, a rebuild about as much per 40 rows of the table.
NEAREST_BULK_ROWS = 1_000
# The secondary indexes of the table, made again after a rebuild fills it (built from sorted
# rows, not kept row by row during the insert). The question's: an index-only range scan on
# metres for two classes, in the answer's order.
NEAREST_INDEXES = {
    "annotations_nearest_question": "(source_category, target_category, metres, source_id)"
    " INCLUDE (target_id, slack)",
    "annotations_nearest_target": "(target_id)",
}


def nearest_reach() -> float:
    """The kept table's reach as `annotations_within_distance` widens a distance: its rows are
    each source's nearest of a class among those within this many metres (a superset)."""
    return NEAREST_REACH_M * SPHERE_MARGIN + 0.01


def nearest_measures_sql(exact: str) -> tuple[str, str]:
    """SQL for (metres, slack) of a kept row, from columns planar, lat0 and lat1 (as in the
    join): the plane's metres and 2B where `_plane_sql` trusts them (the geodesic is within a
    factor 1 ± slack of them), else `exact` (SQL for the spheroid's, `nearest_exact_sql`) and 0.
    """
    trusted, plane, bound = _plane_sql()
    return (
        f"CASE WHEN {trusted} THEN {plane} ELSE {exact} END",
        f"CASE WHEN {trusted} THEN 2 * {bound} ELSE 0 END",
    )


def nearest_exact_sql(sg: str, tg: str, scale: str) -> str:
    """SQL for the spheroid's metres between a source's geometry sg and tg (either side of
    ±180°) in the source's plane `scale` (`_metres_sql`)."""
    return _metres_sql(sg, _near_side_sql(sg, tg), scale)


def _exact_by_id_sql(row: str) -> str:
    """SQL for `nearest_exact_sql` of a row's source_id and target_id, read again by id."""
    exact = nearest_exact_sql("s.geom", "t.geom", _conformal_scale_sql("s.min_lat"))
    return (
        f"(SELECT {exact} FROM {TABLE} s JOIN {TABLE} t ON t.id = {row}.target_id"
        f" WHERE s.id = {row}.source_id)"
    )


def nearest_planar_sql(a: str, b: str, scale: str) -> str:
    """SQL for the distance that ranks b among a's candidates, as the join ranks them."""
    return _planar_distance_sql(a, _near_side_sql(a, b), scale)


NEAREST_FIND = "annotations_nearest_find"
NEAREST_SYNC = "annotations_nearest_sync"
NEAREST_CLEAR = "annotations_nearest_clear"
NEAREST_LOCK_FIRST = "annotations_nearest_lock_first"
_KEPT_COLUMNS = "source_id, target_category, source_category, target_id, planar, metres, slack"
_KEPT_UPSERT = (
    "ON CONFLICT (source_id, target_category) DO UPDATE SET"
    " source_category = EXCLUDED.source_category, target_id = EXCLUDED.target_id,"
    " planar = EXCLUDED.planar, metres = EXCLUDED.metres, slack = EXCLUDED.slack"
)


def nearest_functions_sql() -> dict[str, str]:
    """The bodies of the database functions that keep the table, by name, as this code renders
    them today (with its reach, its lock and its ranking and metres helpers): the trigger's
    (`NEAREST_SYNC`), the nearest-finding one it calls (`NEAREST_FIND`), the TRUNCATE
    trigger's (`NEAREST_CLEAR`) and the statement trigger's that takes the lock before any row
    of a write is locked (`NEAREST_LOCK_FIRST`).

    The migrations install them as literal text (annotations/0007 to 0009), so that a later
    change here cannot silently change what an upgraded database runs; the scale tests compare
    the migrated database's functions with this render, so a change to the reach, the lock or
    the helpers fails until a new migration installs the new functions and rebuilds the table.
    That test is also what keeps `_within_kept` (which trusts the table up to the code's
    `NEAREST_REACH_M`) within the reach the database keeps."""
    reach = nearest_reach()
    # A pair is a candidate when its planar distance is within the reach over the least metres
    # in a degree of latitude (as in the join).
    planar_reach = reach / MERIDIAN_DEGREE_M
    # A source's own geometry sg and its nearest tg, in the source's plane `scale`.
    metres, slack = nearest_measures_sql(nearest_exact_sql("sg", "tg", "scale"))
    scale = _conformal_scale_sql("min_lat")
    find = f"""
INSERT INTO {NEAREST_TABLE} ({_KEPT_COLUMNS})
SELECT source_id, target_category, source_category, target_id, planar, {metres}, {slack}
FROM (
  SELECT DISTINCT ON (t.category) s.id AS source_id, t.category AS target_category,
         s.category AS source_category, t.id AS target_id, s.geom AS sg, t.geom AS tg,
         s.scale, s.min_lat AS lat0, s.max_lat AS lat1, p.planar
  FROM (SELECT id, category, geom, min_lat, max_lat, {scale} AS scale
        FROM {TABLE} WHERE id = sid) s
  JOIN {TABLE} t
    ON t.geom::geography && _ST_Expand(s.geom::geography, {reach!r}) AND t.id <> s.id
  CROSS JOIN LATERAL (SELECT {nearest_planar_sql("s.geom", "t.geom", "s.scale")}
                      AS planar) p
  WHERE t.deleted_at IS NULL AND (of_class IS NULL OR t.category = of_class)
    AND p.planar <= {planar_reach!r}
  ORDER BY t.category, p.planar, t.id
) nearest
{_KEPT_UPSERT}
"""
    sync = f"""
DECLARE
    sources bigint[];
    classes text[];
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.deleted_at IS NULL) = (NEW.deleted_at IS NULL)
       AND OLD.category = NEW.category
       AND OLD.geom::bytea IS NOT DISTINCT FROM NEW.geom::bytea THEN
        RETURN NULL;
    END IF;
    IF current_setting('{NEAREST_DEFERRED}', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'annotations are written in READ COMMITTED transactions only'
            USING HINT = 'the nearest table''s trigger reads what others committed '
                         'after its lock (migration annotations/0007)';
    END IF;
    PERFORM pg_advisory_xact_lock({NEAREST_LOCK});
    IF TG_OP <> 'INSERT' AND OLD.deleted_at IS NULL THEN
        DELETE FROM {NEAREST_TABLE} WHERE source_id = OLD.id;
        WITH gone AS (DELETE FROM {NEAREST_TABLE} WHERE target_id = OLD.id
                      RETURNING source_id, target_category)
        SELECT array_agg(source_id), array_agg(target_category) INTO sources, classes FROM gone;
        FOR i IN 1 .. coalesce(array_length(sources, 1), 0) LOOP
            PERFORM {NEAREST_FIND}(sources[i], classes[i]);
        END LOOP;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.deleted_at IS NULL AND NEW.geom IS NOT NULL THEN
        PERFORM {NEAREST_FIND}(NEW.id, NULL);
        INSERT INTO {NEAREST_TABLE} AS kept ({_KEPT_COLUMNS})
        SELECT source_id, NEW.category, source_category, NEW.id, planar, {metres}, {slack}
        FROM (
          SELECT y.id AS source_id, y.category AS source_category, y.geom AS sg,
                 NEW.geom AS tg, y.scale, y.min_lat AS lat0, y.max_lat AS lat1,
                 {nearest_planar_sql("y.geom", "NEW.geom", "y.scale")} AS planar
          FROM (SELECT id, category, geom, min_lat, max_lat, {scale} AS scale
                FROM {TABLE}
                WHERE geom::geography && _ST_Expand(NEW.geom::geography, {reach!r})
                  AND id <> NEW.id AND deleted_at IS NULL) y
        ) neighbours
        WHERE planar <= {planar_reach!r}
        {_KEPT_UPSERT}
        WHERE (EXCLUDED.planar, EXCLUDED.target_id) < (kept.planar, kept.target_id);
    END IF;
    RETURN NULL;
END
"""
    clear = f"""
BEGIN
    PERFORM pg_advisory_xact_lock({NEAREST_LOCK});
    TRUNCATE {NEAREST_TABLE};
    RETURN NULL;
END
"""
    lock_first = f"""
BEGIN
    PERFORM pg_advisory_xact_lock({NEAREST_LOCK});
    RETURN NULL;
END
"""
    return {
        NEAREST_FIND: find,
        NEAREST_SYNC: sync,
        NEAREST_CLEAR: clear,
        NEAREST_LOCK_FIRST: lock_first,
    }


# (source id, target id, metres) as `int8send`, `int8send` and `float8send` write them.
_PAIR_BYTES = np.dtype([("source", ">i8"), ("target", ">i8"), ("metres", ">f8")])


def _pairs_in_bytes(sql: str, params: dict[str, Any]) -> np.ndarray:
    """The rows of a SELECT of (source_id, target_id, metres), none NULL, in no order, as
    `_PAIR_BYTES` records: aggregated by PostgreSQL into one bytea that numpy reads without a
    Python object per value (472,248 rows through the cursor cost ~0.5 s of the app's CPU to
    read and convert, ~0.05 s this way, for ~0.15 s more of PostgreSQL's)."""
    data = _rows(
        "SELECT string_agg(int8send(source_id) || int8send(target_id) || float8send(metres),"
        f" ''::bytea) FROM ({sql}) pairs",
        params,
    )[0][0]
    return np.frombuffer(data or b"", dtype=_PAIR_BYTES)


def _within_kept(*, source: str, target: str, distance_m: float) -> WithinPairs:
    """`annotations_within_distance` over the whole dataset from the kept table: one index-only
    range scan on (source_category, target_category, metres), sorted here. Its rows hold the nearest by the
    join's ranking and the join's metres (`_plane_metres_sql`): a row whose plane's metres
    cannot put it on its side of distance_m (within its slack) is measured on the spheroid,
    as there. It is asked only up to the code's `NEAREST_REACH_M`: the scale tests keep the
    database's functions equal to the code's render of them (`nearest_functions_sql`), reach
    included."""
    rows = _pairs_in_bytes(
        f"""
        SELECT source_id, target_id, metres FROM (
          SELECT source_id, target_id,
                 CASE WHEN metres * (1 + slack) <= %(distance)s THEN metres
                      ELSE {_exact_by_id_sql("kept")} END AS metres
          FROM {NEAREST_TABLE} kept
          WHERE source_category = %(source)s AND target_category = %(target)s
            AND metres <= %(distance)s / (1 - 2 * {PLANE_BOUND})
            AND metres * (1 - slack) <= %(distance)s
        ) measured
        WHERE metres <= %(distance)s
        """,
        {"source": source, "target": target, "distance": distance_m},
    )
    source_ids, target_ids = rows["source"].astype(np.int64), rows["target"].astype(np.int64)
    metres = rows["metres"].astype(float)
    order = np.lexsort((source_ids, metres))
    return WithinPairs(source_ids[order], target_ids[order], metres[order])


def nearest_rebuild(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Fill the kept table from scratch, in a transaction of its own or a savepoint of the
    caller's (a bulk writer's, or the migration's): for every live annotation, its nearest live
    one of each class within the reach, found set-based by the grid join over every class
    (`_grid_pairs_sql`) and ranked as the join ranks them. Returns its rows.

    It takes the table's lock first, so writers in other transactions wait and then find the
    table whole; `TRUNCATE` holds readers of the table off until this transaction ends (a
    question then waits, rather than read a half-built table). As the trigger does, it refuses
    to run above READ COMMITTED, where its reads would see the transaction's first snapshot,
    older than the lock. The secondary indexes are made after the rows are in; sorts and hashes
    get 256 MB (a million annotations give 11 M candidate pairs), for this build only."""
    reach = nearest_reach()
    with_sql, pairs, params = _grid_pairs_sql(reach, every_class=True)
    metres, slack = nearest_measures_sql(_exact_by_id_sql("nearest"))
    settings = {
        "jit": "off",
        "enable_mergejoin": "off",
        "enable_nestloop": "off",
        "enable_bitmapscan": "off",
        "work_mem": "256MB",
    }
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        _read_committed_check(cursor)
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [NEAREST_LOCK])
        cursor.execute(f"TRUNCATE {NEAREST_TABLE}")
        for name in NEAREST_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
        cursor.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) name", [list(settings)]
        )
        before = cursor.fetchall()
        for name, value in settings.items():
            cursor.execute("SELECT set_config(%s, %s, true)", [name, value])
        cursor.execute(
            f"""
            INSERT INTO {NEAREST_TABLE}
              (source_id, target_category, source_category, target_id, planar, metres, slack)
            {with_sql}
            SELECT source_id, target_category, source_category, target_id, planar, {metres},
                   {slack}
            FROM (
              SELECT DISTINCT ON (source_id, target_category) * FROM (
                SELECT source_id, target_id, source_category, target_category, lat0, lat1,
                       {_planar_distance_sql("sg", "tg", "scale")} AS planar
                FROM ({pairs}) pairs OFFSET 0
              ) candidates
              WHERE planar <= %(reach)s / {MERIDIAN_DEGREE_M}
              ORDER BY source_id, target_category, planar, target_id
            ) nearest
            """,
            {"reach": reach, **params},
        )
        rows = cursor.rowcount
        for name, columns in NEAREST_INDEXES.items():
            cursor.execute(f"CREATE INDEX {name} ON {NEAREST_TABLE} {columns}")
        # Back to the transaction's own values (SET LOCAL lasts to its end, savepoint or not).
        for name, value in before:
            cursor.execute("SELECT set_config(%s, %s, true)", [name, value])
        cursor.execute(f"ANALYZE {NEAREST_TABLE}")
    return rows


def _read_committed_check(cursor) -> None:
    cursor.execute("SELECT current_setting('transaction_isolation')")
    if cursor.fetchone()[0] != "read committed":
        raise RuntimeError(
            "the kept nearest table is rebuilt in READ COMMITTED transactions only: above it, "
            "its reads would see a snapshot older than its lock (migration annotations/0007)"
        )


def _deferred(cursor) -> bool:
    cursor.execute("SELECT current_setting(%s, true) = 'on'", [NEAREST_DEFERRED])
    return bool(cursor.fetchone()[0])


@contextmanager
def nearest_kept_in_bulk(*, rows: int) -> Iterator[None]:
    """Around a bulk write of `rows` annotations on PostgreSQL: when it is large
    (`NEAREST_BULK_ROWS`, and a tenth of the table), the trigger leaves the kept table alone
    during it and `nearest_rebuild` fills it once at the end (a million rows one by one would
    probe the GiST index millions of times). Elsewhere, and for small writes, it does nothing:
    the trigger keeps the table row by row. Nested, the outermost rebuilds.

    A large block is a transaction of its own, or a savepoint of the caller's. The deferral is
    transaction-local (`set_config(..., true)`, as SET LOCAL: it ends with the transaction, and
    a rollback to a savepoint taken before it undoes it), so an exception leaving the block
    undoes the block's writes and the deferral together: a caller that catches it goes on with
    the trigger on and the table as it was. Like the trigger, it refuses to defer above READ
    COMMITTED (`nearest_rebuild`)."""
    if connection.vendor != "postgresql" or rows < NEAREST_BULK_ROWS:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {TABLE}")
            deferred = rows * 10 >= cursor.fetchone()[0] and not _deferred(cursor)
            if deferred:
                _read_committed_check(cursor)
                cursor.execute("SELECT set_config(%s, 'on', true)", [NEAREST_DEFERRED])
        yield
        if deferred:
            nearest_rebuild()
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config(%s, 'off', true)", [NEAREST_DEFERRED])


def _probe_pairs_sql(bbox: BBox) -> tuple[str, str, dict[str, Any]]:
    """(WITH clause, SELECT of candidate pairs, parameters) for the sources in a bbox: each
    probes the geography index for the targets that meet its box grown by `%(reach)s`.

    The pairs' columns, here and in `_grid_pairs_sql`: source_id, target_id, sg and tg (their
    geometries), scale (`_conformal_scale_sql` at the source's least latitude: the plane of
    `_planar_distance_sql` and `_metres_sql`), lat0 and lat1 (the least and greatest latitude
    of the source's box, `geom`'s: `_plane_metres_sql` bounds its error with them)."""
    with_sql, sources, sources_live, params = _sources_sql(bbox)
    pairs = (
        f"SELECT s.id AS source_id, t.id AS target_id, s.geom AS sg,"
        f" {_near_side_sql('s.geom', 't.geom')} AS tg,"
        f" {_conformal_scale_sql('s.min_lat')} AS scale, s.min_lat AS lat0, s.max_lat AS lat1"
        f" FROM {sources} JOIN {TABLE} t"
        " ON t.geom::geography && _ST_Expand(s.geom::geography, %(reach)s) AND t.id <> s.id"
        f" WHERE t.category = %(target)s AND t.deleted_at IS NULL AND {sources_live}"
    )
    return with_sql, pairs, params


def _near_side_sql(a: str, b: str) -> str:
    """SQL for geometry b moved by 360° of longitude when it lies across ±180° from a (a pair
    the geography index found there), so that the plane of `_planar_distance_sql` and
    `_metres_sql` sees them side by side (`::geography` takes the longitude back)."""
    return (
        f"CASE WHEN ST_XMin({a}) - ST_XMax({b}) > 180 THEN ST_Translate({b}, 360, 0)"
        f" WHEN ST_XMin({b}) - ST_XMax({a}) > 180 THEN ST_Translate({b}, -360, 0) ELSE {b} END"
    )


# The cells a box covers, as offsets (dx, dy) from its lowest one, by how many cells beyond that
# one it spans each way (wx, wy): a box is on the grid when it spans at most three each way
# (`_grid_pairs_sql`). A join on the span gives each box its own cells only (a point one row).
_CELLS = "(VALUES {}) o(wx, wy, dx, dy)".format(
    ", ".join(
        f"({wx}, {wy}, {dx}, {dy})"
        for wx in range(3)
        for wy in range(3)
        for dx in range(wx + 1)
        for dy in range(wy + 1)
    )
)
# The least cell side in degrees (~22 m of latitude): with a short reach the cells stay larger
# than a house, so that most targets fit in three a side.
GRID_CELL_MIN_DEGREES = 0.0002
# Metres in a degree of longitude on the equator of a sphere of WGS84's major axis (a·π/180,
# rounded down): times cos(latitude), no more than the spheroid's at that latitude.
EQUATOR_DEGREE_M = 111_319.49
# Above this latitude (of a target's box grown by the reach) degrees of longitude shrink too
# fast to bound by a box: such targets are probed through the geography index.
GRID_LATITUDE_MAX = 89.0


def _boxes_sql(of_class: str) -> str:
    """SQL for the live annotations meeting `of_class` (a condition on `category`) with their
    geometry's bounding box: the bbox columns, which the geom trigger keeps equal to `geom`'s
    box whoever writes (migration annotations/0006; computing `Box2D(geom)` and its edges here
    cost ~1 µs a row)."""
    return (
        f"SELECT id, category, geom, min_lon, min_lat, max_lon, max_lat FROM {TABLE}"
        f" WHERE {of_class} AND deleted_at IS NULL AND geom IS NOT NULL"
    )


def _grid_pairs_sql(reach: float, *, every_class: bool = False) -> tuple[str, str, dict[str, Any]]:
    """(WITH clause, SELECT of candidate pairs, parameters) over every live source: a hash join
    on a grid of cells in degrees, with no index probe per annotation. The pairs also carry
    source_category and target_category; with `every_class` they are the pairs of any two
    classes (`nearest_rebuild`), else of class `%(source)s` to class `%(target)s`.

    Each target's box is grown by the reach (latitude by the reach over the least metres in a
    degree of latitude, longitude by it over `EQUATOR_DEGREE_M`·cos of the grown box's highest
    latitude: both bounds, so no pair within the reach is missed); sources keep their boxes.
    Each side is listed once per cell its box covers, the lists are hash-joined on the cell,
    and a pair is kept in one cell only (the one holding the low corner of the two boxes'
    intersection) when the boxes meet. A box of more than three cells a side, a grown box
    across ±180° or near a pole is not on the grid: its pairs come from the geography index
    (probed from that side), as `_probe_pairs_sql`'s do.

    Measured at 200,000 ("trees within 20 m of a house", docs/benchmarks.md): 0.5 s of
    PostgreSQL CPU for the 282,163 candidate pairs against 1.2 s for the index probes from each
    house. Both sides are read once (MATERIALIZED, each used by the grid and by the probes);
    a join between them and the table is what lets those probes use its index."""
    dlat = reach / MERIDIAN_DEGREE_M

    def of_class(alias: str, side: str) -> str:
        return "TRUE" if every_class else f"{alias}category = %({side})s"

    cells = "floor({0} / %(cell)s) AS cx0, floor({1} / %(cell)s) AS cy0, " + (
        "floor({2} / %(cell)s) AS cx1, floor({3} / %(cell)s) AS cy1"
    )
    with_sql = f"""
        WITH s AS MATERIALIZED (
          SELECT *, cx1 - cx0 <= 2 AND cy1 - cy0 <= 2 AS gridded FROM (
            SELECT id, category, geom, min_lon, min_lat, max_lon, max_lat,
                   {_conformal_scale_sql("min_lat")} AS scale,
                   {cells.format("min_lon", "min_lat", "max_lon", "max_lat")}
            FROM ({_boxes_sql(of_class("", "source"))}) s) s
        ), t AS MATERIALIZED (
          SELECT *, cx1 - cx0 <= 2 AND cy1 - cy0 <= 2 AND x0 >= -180 AND x1 <= 180
                    AND top < {GRID_LATITUDE_MAX} AS gridded FROM (
            SELECT id, category, geom, x0, y0, x1, y1, top,
                   {cells.format("x0", "y0", "x1", "y1")} FROM (
              SELECT id, category, geom, top, min_lat - %(dlat)s AS y0, max_lat + %(dlat)s AS y1,
                     min_lon - %(reach)s / ({EQUATOR_DEGREE_M} * cos(radians(least(top, 90))))
                       AS x0,
                     max_lon + %(reach)s / ({EQUATOR_DEGREE_M} * cos(radians(least(top, 90))))
                       AS x1
              FROM (SELECT *, greatest(abs(min_lat), abs(max_lat)) + %(dlat)s AS top
                    FROM ({_boxes_sql(of_class("", "target"))}) t) t
            ) t
          ) t
        )"""
    pairs = f"""
        SELECT s.id AS source_id, t.id AS target_id, s.geom AS sg, t.geom AS tg, s.scale,
               s.min_lat AS lat0, s.max_lat AS lat1, s.category AS source_category,
               t.category AS target_category
        FROM (SELECT s.*, cx0 + dx AS cx, cy0 + dy AS cy FROM s JOIN {_CELLS}
              ON o.wx = s.cx1 - s.cx0 AND o.wy = s.cy1 - s.cy0 WHERE gridded) s
        JOIN (SELECT t.*, cx0 + dx AS cx, cy0 + dy AS cy FROM t JOIN {_CELLS}
              ON o.wx = t.cx1 - t.cx0 AND o.wy = t.cy1 - t.cy0 WHERE gridded) t
          ON t.cx = s.cx AND t.cy = s.cy
             AND t.cx = greatest(s.cx0, t.cx0) AND t.cy = greatest(s.cy0, t.cy0)
             AND s.min_lon <= t.x1 AND s.max_lon >= t.x0
             AND s.min_lat <= t.y1 AND s.max_lat >= t.y0 AND t.id <> s.id
        UNION ALL
        SELECT s.id, t.id, s.geom, {_near_side_sql("s.geom", "t.geom")}, s.scale, s.min_lat,
               s.max_lat, s.category, t.category
        FROM s JOIN {TABLE} t
          ON t.geom::geography && _ST_Expand(s.geom::geography, %(reach)s) AND t.id <> s.id
        WHERE NOT s.gridded AND {of_class("t.", "target")} AND t.deleted_at IS NULL
        UNION ALL
        SELECT s.id, t.id, s.geom, {_near_side_sql("s.geom", "t.geom")},
               {_conformal_scale_sql("s.min_lat")}, s.min_lat, s.max_lat, s.category, t.category
        FROM t JOIN {TABLE} s
          ON s.geom::geography && _ST_Expand(t.geom::geography, %(reach)s) AND t.id <> s.id
        WHERE NOT t.gridded AND {of_class("s.", "source")} AND s.deleted_at IS NULL"""
    cell = max(2 * dlat, GRID_CELL_MIN_DEGREES)
    return with_sql, pairs, {"dlat": dlat, "cell": cell}


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
    scale = _conformal_scale_sql("%(lat)s")
    reach = _rows(
        f"SELECT max(sphere) FROM (SELECT geom::geography <-> {point} AS sphere FROM {TABLE} "
        f"WHERE deleted_at IS NULL{of_class} ORDER BY geom::geography <-> {point} LIMIT %(k)s) n",
        params,
    )[0][0]
    if reach is None:
        return []
    rows = _rows(
        f"SELECT id, category, {_metres_sql('geom', point_geometry, scale)} AS metres "
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
