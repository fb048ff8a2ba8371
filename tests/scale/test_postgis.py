"""The annotations' PostGIS column on PostgreSQL (migration annotations/0005): every writer keeps
`geom` equal to the GeoJSON `geometry`, the migration backfills and reverses, and the GiST
indexes are there. On a PostgreSQL + PostGIS cluster of its own, seeded with the default demo."""

import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.browser.daphne_server import manage, server_env
from tests.scale.cluster import PostgresCluster, postgres_bindir
from tests.scale.conftest import scale_required_or_skip

DEMO_ANNOTATIONS = 2000
TABLE = "annotations_annotation"


@dataclass
class SpatialDatabase:
    postgres: PostgresCluster
    env: dict[str, str]

    def manage(self, *args: str) -> str:
        return manage(*args, env=self.env)

    def shell(self, code: str) -> str:
        return self.manage("shell", "--no-imports", "-c", code)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        return self.postgres.sql(query, params)


@pytest.fixture(scope="module")
def spatial_db() -> Iterator[SpatialDatabase]:
    """PostgreSQL + PostGIS, migrated, with the demo of `make run` (2,000 annotations, seed 0)."""
    scale_required_or_skip()
    postgres = PostgresCluster(bindir=postgres_bindir()).start()
    try:
        db = SpatialDatabase(postgres=postgres, env=server_env(database_url=postgres.url))
        db.manage("migrate", "--noinput")
        db.manage("seed_demo", "--annotations", str(DEMO_ANNOTATIONS), "--seed", "0")
        yield db
    finally:
        postgres.stop()


def geom_mismatches(db: SpatialDatabase) -> int:
    """Rows whose `geom` is not their GeoJSON geometry (NULL counts as a mismatch), or whose
    bbox columns are not `geom`'s box."""
    ((n,),) = db.sql(
        f"SELECT count(*) FROM {TABLE} WHERE geom IS NULL OR NOT ST_Equals("
        "geom, ST_SetSRID(ST_GeomFromGeoJSON(geometry::text), 4326)) OR ST_SRID(geom) <> 4326"
        " OR min_lon <> ST_XMin(geom) OR min_lat <> ST_YMin(geom)"
        " OR max_lon <> ST_XMax(geom) OR max_lat <> ST_YMax(geom)"
    )
    return n


def test_the_seeded_demo_has_its_geometry_in_postgis_with_gist_indexes(spatial_db):
    assert spatial_db.sql(f"SELECT count(*), count(geom) FROM {TABLE}") == [
        (DEMO_ANNOTATIONS, DEMO_ANNOTATIONS)
    ]
    assert geom_mismatches(spatial_db) == 0
    indexes = dict(
        spatial_db.sql("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", (TABLE,))
    )
    assert "USING gist (geom)" in indexes["annotations_annotation_geom_gist"]
    assert "USING gist (((geom)::geography))" in indexes["annotations_annotation_geog_gist"]


CREATE_AND_EDIT = """
from geosense.annotations.models import Annotation
from geosense.annotations.services import annotation_create, annotations_import_geojson
a = annotation_create(category="well", geometry={"type": "Point", "coordinates": [-118.5, 34.16]})
square = [[-118.51, 34.15], [-118.509, 34.15], [-118.509, 34.151], [-118.51, 34.15]]
feature = {"type": "Feature", "id": "f1", "properties": {"class": "pond"},
           "geometry": {"type": "Polygon", "coordinates": [square]}}
annotations_import_geojson(collection={"type": "FeatureCollection", "features": [feature]},
                           source="ponds")
feature["geometry"] = {"type": "LineString", "coordinates": square[:3]}
annotations_import_geojson(collection={"type": "FeatureCollection", "features": [feature]},
                           source="ponds")
print(a.pk, Annotation.objects.get(source="ponds").pk)
"""


def test_every_writer_keeps_geom_equal_to_the_geojson(spatial_db):
    """The ORM's create, an import's bulk insert and its update in place, and plain SQL; the
    bbox columns follow `geom` (migration 0006), even when plain SQL writes one of them."""
    created, imported = map(int, spatial_db.shell(CREATE_AND_EDIT).split()[-2:])
    rows = dict(
        spatial_db.sql(
            f"SELECT id, ST_AsText(geom) FROM {TABLE} WHERE id IN (%s, %s)", (created, imported)
        )
    )
    assert rows[created] == "POINT(-118.5 34.16)"
    assert rows[imported] == "LINESTRING(-118.51 34.15,-118.509 34.15,-118.509 34.151)"

    line = {"type": "LineString", "coordinates": [[-118.5, 34.16], [-118.49, 34.17]]}
    spatial_db.sql(
        f"UPDATE {TABLE} SET geometry = %s::jsonb WHERE id = %s", (json.dumps(line), created)
    )
    # A value written as a JSON string holding GeoJSON (double-encoded) is read all the same.
    spatial_db.sql(
        f"UPDATE {TABLE} SET geometry = to_jsonb(%s::text) WHERE id = %s",
        (json.dumps(line), imported),
    )
    assert (
        spatial_db.sql(
            f"SELECT ST_AsText(geom) FROM {TABLE} WHERE id IN (%s, %s)", (created, imported)
        )
        == [("LINESTRING(-118.5 34.16,-118.49 34.17)",)] * 2
    )
    spatial_db.sql(f"UPDATE {TABLE} SET min_lon = 0, max_lat = 0 WHERE id = %s", (created,))
    assert (
        spatial_db.sql(
            f"SELECT min_lon, min_lat, max_lon, max_lat FROM {TABLE} WHERE id IN (%s, %s)",
            (created, imported),
        )
        == [(-118.5, 34.16, -118.49, 34.17)] * 2
    )
    spatial_db.sql(f"DELETE FROM {TABLE} WHERE id IN (%s, %s)", (created, imported))
    assert geom_mismatches(spatial_db) == 0


def test_geometry_postgis_cannot_read_is_stored_with_no_geom(spatial_db):
    """A writer outside the app's validation is not refused: the row has no `geom`."""
    ((pk,),) = spatial_db.sql(
        f"INSERT INTO {TABLE} (category, geometry, min_lon, min_lat, max_lon, max_lat, area_m2, "
        "length_m, attributes, vectors, source, created, updated) VALUES ('x', "
        """'{"type": "Point", "coordinates": "here"}', 0, 0, 0, 0, 0, 0, '{}', '{}', 'bad', """
        "now(), now()) RETURNING id"
    )
    try:
        assert spatial_db.sql(f"SELECT geom FROM {TABLE} WHERE id = %s", (pk,)) == [(None,)]
    finally:
        spatial_db.sql(f"DELETE FROM {TABLE} WHERE id = %s", (pk,))


def test_the_migration_reverses_and_backfills_again(spatial_db):
    spatial_db.manage("migrate", "annotations", "0004")
    assert spatial_db.sql(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = %s "
        "AND column_name = 'geom'",
        (TABLE,),
    ) == [(0,)]
    assert spatial_db.sql(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'annotations_annotation_geom_sync'"
    ) == [(0,)]
    spatial_db.manage("migrate", "annotations")
    assert spatial_db.sql(f"SELECT count(*), count(geom) FROM {TABLE}") == [
        (DEMO_ANNOTATIONS, DEMO_ANNOTATIONS)
    ]
    assert geom_mismatches(spatial_db) == 0


# --- the same tool calls through PostGIS and through the embedded index ----------------------

PARITY = """
import json
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from geosense.annotations import demo, index, postgis, selectors, services
from geosense.annotations.spatial import spatial_backend
from geosense.fields import json_text
from tools.builtin import nearest_annotations, spatial_relation
from tools.registry import ToolContext

LAT, LON = demo.PLACE_LAT + 0.001, demo.PLACE_LON - 0.002
BBOX = [LON - 0.002, LAT - 0.002, LON + 0.002, LAT + 0.002]


def tool(handler, arguments):
    saved = {}

    def save(**kw):  # the artifact as stored: its columns may be numpy arrays
        saved.update(json.loads(json_text(kw["data"])))
        return "a1"

    context = ToolContext(artifact_save=save)
    result = handler(context, arguments)
    return saved or result


def calls():
    within = selectors.annotations_within_distance(source="tree", target="house", distance_m=20)
    return {
        "within": tool(spatial_relation, {"relation": "within_distance", "source": "trees",
                                          "target": "house", "distance_m": 20}),
        "within_metres": dict(zip(within.source_ids.tolist(), within.distances_m.tolist())),
        "overlap": tool(spatial_relation, {"relation": "overlap", "source": "solar_panel",
                                           "target": "house"}),
        # Beyond the kept table's reach: the join.
        "within_far": tool(spatial_relation, {"relation": "within_distance", "source": "tree",
                                              "target": "house",
                                              "distance_m": postgis.NEAREST_REACH_M + 10}),
        "within_bbox": tool(spatial_relation, {"relation": "within_distance", "source": "tree",
                                               "target": "house", "distance_m": 20,
                                               "bbox": BBOX}),
        "overlap_bbox": tool(spatial_relation, {"relation": "overlap", "source": "solar_panel",
                                                "target": "house", "bbox": BBOX}),
        "overlap_shares": {p.source_id: p.share for p in selectors.annotations_overlapping(
            source="solar_panel", target="house")},
        "nearest": tool(nearest_annotations, {"lat": LAT, "lon": LON, "k": 10}),
        "nearest_metres": [[h.id, h.distance_m] for h in selectors.annotations_nearest(
            lat=LAT, lon=LON, category="pool", k=5)],
    }


def both():
    with override_settings(GEOSENSE_SPATIAL_BACKEND="auto"):
        backend = spatial_backend()
        held = index.spatial_index_cached()
        with CaptureQueriesContext(connection) as queries:
            postgis = calls()
        # Any use of the index after a write builds or catches up a new one.
        built = index.spatial_index_cached() is not held
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    with override_settings(GEOSENSE_SPATIAL_BACKEND="index"):
        embedded = calls()
    used = {name: name in sql for name in ("ST_DWithin", "ST_Intersects", "<->")}
    return {"backend": backend, "index_built": built, "sql": used,
            "postgis": postgis, "embedded": embedded}


before = both()
gone = sorted(set(before["postgis"]["within"]["links"][:5]) | {before["postgis"]["nearest"]["nearest"][0]["id"]})
services.annotations_soft_delete(ids=gone)
after = both()
print(json.dumps({"before": before, "after": after, "deleted": gone}))
"""


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.001 * max(abs(a), abs(b)) + 1e-9


def pairs(artifact: dict) -> dict[int, tuple[int, float]]:
    return {
        i: (link, value)
        for i, link, value in zip(
            *(artifact[k] for k in ("ids", "links", "linkValues")), strict=True
        )
    }


def assert_same_answers(run: dict) -> None:
    """PostGIS answered (its operators ran, the index was not used) and agrees with the index."""
    assert run["backend"] == "postgis" and not run["index_built"]
    assert run["sql"] == {"ST_DWithin": True, "ST_Intersects": True, "<->": True}
    postgis, embedded = run["postgis"], run["embedded"]
    for relation in ("within", "within_far", "overlap", "within_bbox", "overlap_bbox"):
        ours, theirs = pairs(postgis[relation]), pairs(embedded[relation])
        assert len(ours) > 3 and ours.keys() == theirs.keys(), relation
        if relation.endswith("bbox"):  # a part of the whole
            assert len(ours) < len(pairs(postgis[relation.removesuffix("_bbox")])), relation
        assert {i: link for i, (link, _) in ours.items()} == {
            i: link for i, (link, _) in theirs.items()
        }, relation
        assert sorted(postgis[relation]["areas"]) == sorted(embedded[relation]["areas"])
    for key in ("within_metres", "overlap_shares"):
        assert postgis[key].keys() == embedded[key].keys()
        assert all(close(postgis[key][i], embedded[key][i]) for i in postgis[key]), key
    ours, theirs = postgis["nearest"]["nearest"], embedded["nearest"]["nearest"]
    assert [(h["id"], h["class"]) for h in ours] == [(h["id"], h["class"]) for h in theirs]
    assert [h[0] for h in postgis["nearest_metres"]] == [h[0] for h in embedded["nearest_metres"]]
    assert all(
        close(a[1], b[1])
        for a, b in zip(postgis["nearest_metres"], embedded["nearest_metres"], strict=True)
    )


def test_postgis_and_the_embedded_index_give_the_same_answers_before_and_after_a_deletion(
    spatial_db,
):
    out = json.loads(spatial_db.shell(PARITY).strip().splitlines()[-1])
    assert_same_answers(out["before"])
    assert_same_answers(out["after"])
    deleted = set(out["deleted"])
    for backend in ("postgis", "embedded"):
        after = out["after"][backend]
        assert not deleted & set(after["within"]["ids"] + after["within"]["links"])
        assert not deleted & {h["id"] for h in after["nearest"]["nearest"]}
    assert pairs(out["after"]["postgis"]["within"]) != pairs(out["before"]["postgis"]["within"])


EDGE = """
import json
from django.test import override_settings
from geosense.annotations import selectors, services
house = [[-118.4568139, 34.1759466], [-118.4567099, 34.1759436], [-118.4567122, 34.1758856],
         [-118.4567611, 34.175887], [-118.4567628, 34.1758464], [-118.4568179, 34.1758479],
         [-118.4568139, 34.1759466]]
ids = [
    services.annotation_create(category="edge_tree", geometry={
        "type": "Point", "coordinates": [-118.4566974, 34.1758304]}).pk,
    services.annotation_create(category="edge_house", geometry={
        "type": "Polygon", "coordinates": [house]}).pk,
]
metres = {}
for backend in ("auto", "index"):
    with override_settings(GEOSENSE_SPATIAL_BACKEND=backend):
        within = selectors.annotations_within_distance(
            source="edge_tree", target="edge_house", distance_m=20)
        nearest = selectors.annotations_nearest(
            lat=34.1758304, lon=-118.4566974, category="edge_house", k=1)
        metres[backend] = [within.distances_m.tolist(), [h.distance_m for h in nearest]]
print(json.dumps({"ids": ids, "metres": metres}))
"""


def test_metres_from_a_point_to_a_polygons_edge_agree(spatial_db):
    """A tree and a house of the demo at a million where PostGIS's spheroid `ST_Distance`
    says 6.2853 m and the geodesic between the nearest points is 6.2733 m (0.19 % apart)."""
    out = json.loads(spatial_db.shell(EDGE).strip().splitlines()[-1])
    spatial_db.sql(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (out["ids"],))
    (postgis_within, postgis_nearest), (index_within, index_nearest) = (
        out["metres"]["auto"],
        out["metres"]["index"],
    )
    assert len(postgis_within) == len(index_within) == 1
    assert index_within[0] == pytest.approx(6.2733, abs=1e-4)
    assert close(postgis_within[0], index_within[0])
    assert close(postgis_nearest[0], index_nearest[0])


OFF_GRID = """
import json
from pyproj import Geod
from django.db import connection
from django.test import override_settings
from geosense.annotations import selectors, services

def square(lon, lat, side):
    ring = [[lon, lat], [lon + side, lat], [lon + side, lat + side], [lon, lat + side], [lon, lat]]
    return {"type": "Polygon", "coordinates": [ring]}

def point(lon, lat):
    return {"type": "Point", "coordinates": [lon, lat]}

def line(lon, lat, length):
    return {"type": "LineString", "coordinates": [[lon, lat], [lon + length, lat]]}

# (source, target, the pair of points whose geodesic is their distance): the nearest point of
# each target is a vertex, so the expected metres are a geodesic between two points.
cases = {
    "on the grid": (point(30.00005, 30.00005), square(29.9999, 29.9999, 0.00015),
                    (30.00005, 30.00005, 30.00005, 30.00005)),
    "a large target": (point(10.0201, 10.0201), square(10.0, 10.0, 0.02),
                       (10.0201, 10.0201, 10.02, 10.02)),
    "a large source": (line(20.0, 20.0, 0.03), point(20.01, 20.0001), (20.01, 20.0, 20.01, 20.0001)),
    "across 180 degrees": (point(179.99995, 0.0), point(-179.99995, 0.0),
                           (179.99995, 0.0, -179.99995, 0.0)),
    "near the pole": (point(0.0, 89.5), point(0.01, 89.5), (0.0, 89.5, 0.01, 89.5)),
}
expected, ids = {}, []
geod = Geod(ellps="WGS84")
for name, (source, target, (lon1, lat1, lon2, lat2)) in cases.items():
    s = services.annotation_create(category="off_grid_source", geometry=source).pk
    t = services.annotation_create(category="off_grid_target", geometry=target).pk
    ids += [s, t]
    expected[s] = [name, t, geod.inv(lon1, lat1, lon2, lat2)[2]]
# Moved by SQL, as a writer other than the app may (the trigger moves its bbox columns too).
moved = services.annotation_create(category="off_grid_source", geometry=point(50.0, 50.0)).pk
near = services.annotation_create(category="off_grid_target", geometry=point(40.0001, 40.0)).pk
with connection.cursor() as cursor:
    cursor.execute("UPDATE annotations_annotation SET geometry = %s::jsonb WHERE id = %s",
                   [json.dumps(point(40.0, 40.0)), moved])
ids += [moved, near]
expected[moved] = ["moved by SQL", near, geod.inv(40.0, 40.0, 40.0001, 40.0)[2]]
# A target 25 m from the first source: out of reach, and not its nearest.
far = services.annotation_create(category="off_grid_target", geometry=point(30.00005, 30.00027))
ids.append(far.pk)
with override_settings(GEOSENSE_SPATIAL_BACKEND="auto"):
    within = selectors.annotations_within_distance(
        source="off_grid_source", target="off_grid_target", distance_m=20)
got = {s: [t, m] for s, t, m in zip(within.source_ids.tolist(), within.target_ids.tolist(),
                                     within.distances_m.tolist())}
print(json.dumps({"ids": ids, "expected": expected, "got": got}))
"""


def _within_pairs(spatial_db, script: str) -> tuple[dict[int, list], dict[int, list]]:
    """Run a script that makes sources and targets and asks within-distance of them; delete
    what it made. (got, expected): {source id: [target id, metres]} as answered and
    {source id: [case name, target id, geodesic metres]} as the script expects."""
    out = json.loads(spatial_db.shell(script).strip().splitlines()[-1])
    spatial_db.sql(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (out["ids"],))
    got = {int(s): v for s, v in out["got"].items()}
    return got, {int(s): v for s, v in out["expected"].items()}


def test_within_distance_finds_pairs_off_the_grid(spatial_db):
    """The whole-dataset within-distance hash-joins boxes on a grid of cells; a box too large
    for it, one across ±180° or near a pole goes through the geography index instead; a row
    moved by plain SQL is found where it went. Each case is a
    pair 0-15 m apart, measured as a geodesic between two points."""
    got, expected = _within_pairs(spatial_db, OFF_GRID)
    assert got.keys() == expected.keys(), {v[0] for k, v in expected.items() if k not in got}
    for source, (name, target, metres) in expected.items():
        assert got[source][0] == target, name
        assert got[source][1] == pytest.approx(metres, rel=1e-3, abs=1e-6), name


PLANE_METRES = """
import json
from pyproj import Geod
from django.test import override_settings
from geosense.annotations import selectors, services

geod = Geod(ellps="WGS84")

def ahead(lon, lat, metres, azimuth=45.0):
    return geod.fwd(lon, lat, azimuth, metres)[:2]

def point(lon, lat):
    return {"type": "Point", "coordinates": [lon, lat]}

def square(lon, lat, side):
    ring = [[lon, lat], [lon + side, lat], [lon + side, lat + side], [lon, lat + side], [lon, lat]]
    return {"type": "Polygon", "coordinates": [ring]}

# (name, source, target, the two points whose geodesic is the pair's distance), each pair at a
# longitude of its own. Northeast of a point, a square's nearest point is its low corner; a
# point northeast of a square's high corner is nearest to that corner.
cases = []
for n, lat in enumerate((0.0, 34.0, -45.0, 60.0, 72.0, 80.0)):
    lon = 10.0 * n
    for metres in (19.99998, 20.00002):  # 20 µm each side of the reach
        far = ahead(lon, lat, metres)
        cases.append((f"points {metres} m apart at {lat}", point(lon, lat), point(*far),
                      (lon, lat, *far)))
        lon += 0.01
    corner = ahead(lon, lat, 15.0)
    cases.append((f"a point and a polygon at {lat}", point(lon, lat), square(*corner, 0.0003),
                  (lon, lat, *corner)))
    lon += 0.01
    near = ahead(lon + 0.0003, lat + 0.0003, 12.0)
    cases.append((f"a polygon and a point at {lat}", square(lon, lat, 0.0003), point(*near),
                  (lon + 0.0003, lat + 0.0003, *near)))
expected, ids = {}, []
for name, source, target, (lon1, lat1, lon2, lat2) in cases:
    s = services.annotation_create(category="plane_source", geometry=source).pk
    t = services.annotation_create(category="plane_target", geometry=target).pk
    ids += [s, t]
    expected[s] = [name, t, geod.inv(lon1, lat1, lon2, lat2)[2]]
with override_settings(GEOSENSE_SPATIAL_BACKEND="auto"):
    within = selectors.annotations_within_distance(
        source="plane_source", target="plane_target", distance_m=20)
got = {s: [t, m] for s, t, m in zip(within.source_ids.tolist(), within.target_ids.tolist(),
                                     within.distances_m.tolist())}
print(json.dumps({"ids": ids, "expected": expected, "got": got}))
"""


def test_within_distance_metres_from_the_plane_match_the_spheroid(spatial_db):
    """Within-distance takes a nearest pair's metres from its planar distance where its bound
    says they are within 0.001 % of the geodesic (`postgis._plane_metres_sql`), else from the
    spheroid: points and polygons at latitudes from the equator to 80°, each measured against
    the geodesic between its two nearest points, and pairs 20 µm each side of the reach, which
    the plane alone puts on the wrong side at 72° (20.000014 m for 19.99998)."""
    got, every = _within_pairs(spatial_db, PLANE_METRES)
    expected = {source: v for source, v in every.items() if v[2] <= 20}
    assert got.keys() == expected.keys(), {v[0] for v in every.values()}
    for source, (name, target, metres) in expected.items():
        assert got[source][0] == target, name
        assert got[source][1] == pytest.approx(metres, rel=1e-5), name


# --- the nearest of each class, kept by the database (migration annotations/0007) ------------

KEPT_HELPERS = """
import json
import math
from django.db import connection, transaction
from django.test import override_settings
from geosense.annotations import postgis

REACH = postgis.NEAREST_REACH_M
QUESTIONS = [("tree", "house"), ("house", "tree"), ("tree", "tree"), ("pool", "house"),
             ("kept_tree", "kept_house"), ("kept_house", "kept_tree"), ("tree", "kept_house")]


def kept():
    with connection.cursor() as cursor:
        cursor.execute("SELECT source_id, target_category, target_id, metres"
                       " FROM annotations_nearest")
        return {(s, c): (t, m) for s, c, t, m in cursor.fetchall()}


def fresh():
    with transaction.atomic():
        postgis.nearest_rebuild()
        rows = kept()
        transaction.set_rollback(True)
    return rows


def stale():
    # Rows within the reach are each source's nearest of a class, as a rebuild finds them
    # (beyond it either may hold a farther candidate, or none).
    ours, theirs = kept(), fresh()
    far = (0, math.inf)
    return sorted(
        f"{key}: {ours.get(key)} kept, {theirs.get(key)} fresh"
        for key in ours.keys() | theirs.keys()
        if min(ours.get(key, far)[1], theirs.get(key, far)[1]) <= REACH
        and (ours.get(key, far)[0] != theirs.get(key, far)[0]
             or abs(ours.get(key, far)[1] - theirs.get(key, far)[1]) > 1e-9)
    )


def unequal_answers():
    # Within-distance from the kept table against the join, for a few classes and distances.
    wrong = []
    for source, target in QUESTIONS:
        for distance in (5.0, 20.0, REACH):
            a = postgis.annotations_within_distance(
                source=source, target=target, distance_m=distance)
            b = postgis.within_joined(source=source, target=target, distance_m=distance)
            if (a.source_ids.tolist() != b.source_ids.tolist()
                    or a.target_ids.tolist() != b.target_ids.tolist()
                    or any(abs(x - y) > 1e-5 * y for x, y in zip(a.distances_m, b.distances_m))):
                wrong.append(f"{source} -> {target} within {distance}")
    return wrong


def check():
    return {"stale": stale()[:5], "answers": unequal_answers()}
"""

KEPT_WRITES = (
    KEPT_HELPERS
    + """
from geosense.annotations import services
from geosense.annotations.models import Annotation

LON, LAT = -118.52, 34.16  # west of the demo: these classes meet only each other there


def point(lon, lat):
    return {"type": "Point", "coordinates": [lon, lat]}


def square(lon, lat, side=0.0001):
    ring = [[lon, lat], [lon + side, lat], [lon + side, lat + side], [lon, lat + side], [lon, lat]]
    return {"type": "Polygon", "coordinates": [ring]}


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def raw_insert(category, geometry):
    return sql(
        "INSERT INTO annotations_annotation (category, geometry, min_lon, min_lat, max_lon,"
        " max_lat, area_m2, length_m, attributes, vectors, source, created, updated) VALUES"
        " (%s, %s::jsonb, 0, 0, 0, 0, 0, 0, '{}', '{}', 'kept', now(), now()) RETURNING id",
        [category, json.dumps(geometry)])[0][0]


steps, ids = {}, []
steps["seeded"] = check()
houses = [services.annotation_create(category="kept_house",
                                     geometry=square(LON + 0.0002 * i, LAT)).pk
          for i in range(4)]
trees = [services.annotation_create(category="kept_tree",
                                    geometry=point(LON + 0.00015 * i, LAT - 0.00005)).pk
         for i in range(6)]
# A demo tree's nearest house becomes one of these: the demo meets them here.
demo_tree = sql("SELECT source_id FROM annotations_nearest WHERE target_category = 'house'"
                " AND source_category = 'tree'"
                " AND metres BETWEEN 5 AND 15 ORDER BY source_id LIMIT 1")[0][0]
((x, y),) = sql("SELECT ST_X(geom), ST_Y(geom) FROM annotations_annotation WHERE id = %s",
                [demo_tree])
houses.append(services.annotation_create(category="house", geometry=square(x + 0.00001, y)).pk)
houses.append(services.annotation_create(category="kept_house", geometry=square(x, y + 0.00002)).pk)
ids += houses + trees
steps["created by the ORM"] = check()
services.annotations_soft_delete(ids=[houses[1], trees[2], houses[-2]])
steps["soft-deleted by the ORM"] = check()
services.annotations_restore(ids=[houses[1], houses[-2]])
steps["restored by the ORM"] = check()
Annotation.all_objects.filter(id=houses[0]).delete()
steps["deleted by the ORM"] = check()
Annotation.objects.filter(id=trees[0]).update(category="kept_house")
steps["class changed by the ORM"] = check()
sql("UPDATE annotations_annotation SET geometry = %s::jsonb WHERE id = %s",
    [json.dumps(point(LON + 0.0003, LAT + 0.00012)), trees[1]])
steps["moved by SQL"] = check()
sql("UPDATE annotations_annotation SET category = 'kept_tree' WHERE id = %s", [houses[2]])
steps["class changed by SQL"] = check()
ids.append(raw_insert("kept_tree", point(LON + 0.00021, LAT + 0.00003)))
ids.append(raw_insert("kept_house", square(LON + 0.00045, LAT - 0.0001)))
steps["inserted by SQL"] = check()
sql("UPDATE annotations_annotation SET deleted_at = now() WHERE id = %s", [houses[3]])
steps["soft-deleted by SQL"] = check()
sql("DELETE FROM annotations_annotation WHERE id = %s", [trees[3]])
steps["deleted by SQL"] = check()
print(json.dumps({"steps": steps, "ids": ids}))
"""
)


def test_within_distance_reads_the_table_the_database_keeps(spatial_db):
    """Over the whole dataset within the reach, "trees within 20 m of a house" is one index scan
    of `annotations_nearest` (no join, no distance measured per question), and equals the join
    and the rows a rebuild would hold."""
    script = (
        KEPT_HELPERS
        + """
from django.test.utils import CaptureQueriesContext
with CaptureQueriesContext(connection) as queries:
    within = postgis.annotations_within_distance(source="tree", target="house", distance_m=20)
sql = " ".join(q["sql"] for q in queries.captured_queries)
print(json.dumps({"sql": sql, "rows": len(within.source_ids), "check": check()}))
"""
    )
    out = json.loads(spatial_db.shell(script).strip().splitlines()[-1])
    assert "annotations_nearest" in out["sql"]
    # The join's candidate pairs: probes of the geography index, grid cells, DISTINCT ON.
    assert all(part not in out["sql"] for part in ("_ST_Expand", "floor(", "DISTINCT ON"))
    assert out["rows"] > 100
    assert out["check"] == {"stale": [], "answers": []}


def test_the_kept_table_follows_every_writer(spatial_db):
    """Inserts, soft and hard deletes, restores, moves and class changes, through the ORM and
    through plain SQL: after each the table holds what a rebuild finds, and within-distance
    from it equals the join."""
    out = json.loads(spatial_db.shell(KEPT_WRITES).strip().splitlines()[-1])
    spatial_db.sql(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (out["ids"],))
    for step, found in out["steps"].items():
        assert found == {"stale": [], "answers": []}, step


def test_two_writers_near_each_other_leave_each_the_others_nearest(spatial_db):
    """A tree inserted in one transaction and a house 5 m from it in another, concurrently: the
    second's trigger waits for the first's lock, then sees the tree, so each is the other's
    nearest (without the lock neither would see the other, uncommitted)."""
    import threading

    import psycopg

    insert = (
        f"INSERT INTO {TABLE} (category, geometry, min_lon, min_lat, max_lon, max_lat, area_m2,"
        " length_m, attributes, vectors, source, created, updated) VALUES (%s, %s::jsonb,"
        " 0, 0, 0, 0, 0, 0, '{}', '{}', 'concurrent', now(), now()) RETURNING id"
    )
    tree = {"type": "Point", "coordinates": [12.0, 12.0]}
    ring = [[12.00004, 12.0], [12.0001, 12.0], [12.0001, 12.0001], [12.00004, 12.0001]]
    house = {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}
    dsn = spatial_db.postgres._dsn("geosense")
    ids: dict[str, int] = {}
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        ids["tree"] = first.execute(insert, ("conc_tree", json.dumps(tree))).fetchone()[0]

        def write_house() -> None:
            ids["house"] = second.execute(insert, ("conc_house", json.dumps(house))).fetchone()[0]
            second.commit()

        writer = threading.Thread(target=write_house)
        writer.start()
        waiting = []
        for _ in range(100):
            waiting = spatial_db.sql(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            if waiting:
                break
            threading.Event().wait(0.05)
        first.commit()
        writer.join(timeout=30)
    try:
        assert waiting, "the second writer did not wait for the first's lock"
        rows = dict(
            spatial_db.sql(
                "SELECT source_id, target_id FROM annotations_nearest WHERE source_id = ANY(%s)",
                ([ids["tree"], ids["house"]],),
            )
        )
        assert rows == {ids["tree"]: ids["house"], ids["house"]: ids["tree"]}
    finally:
        spatial_db.sql(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (list(ids.values()),))


def test_a_truncate_of_the_annotations_empties_the_kept_table(spatial_db):
    """`manage.py flush` or a restore script truncates: no kept row may name an annotation
    that is gone (the row trigger does not fire on TRUNCATE). Rolled back."""
    import psycopg

    with psycopg.connect(spatial_db.postgres._dsn("geosense")) as conn:
        before = conn.execute("SELECT count(*) FROM annotations_nearest").fetchone()[0]
        conn.execute(f"TRUNCATE {TABLE} CASCADE")
        after = conn.execute("SELECT count(*) FROM annotations_nearest").fetchone()[0]
        conn.rollback()
    assert before > 1000
    assert after == 0


# Two writers in threads of one `manage.py shell`, each on its own connection: the first runs
# its body in a transaction and calls `second_waits()` where the second must be blocked on one
# of its locks; the second starts once the first has begun. The script prints how each ended.
TWO_WRITERS = """
import json, threading, time
from django.db import connection, transaction
from geosense.annotations import postgis, services
from geosense.annotations.models import Annotation, AnnotationRevision

trees = list(Annotation.objects.filter(category="tree").order_by("id").values_list("id", flat=True)[:2])
started, results = threading.Event(), {}


def second_waits():
    for _ in range(200):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)


def first():
    with transaction.atomic():
FIRST


def second():
    started.wait(30)
SECOND


def writer(name, body):
    def run():
        try:
            body()
            results[name] = "committed"
        except Exception as exc:
            results[name] = repr(exc)
        finally:
            started.set()
            connection.close()
    return threading.Thread(target=run, daemon=True)


threads = [writer("first", first), writer("second", second)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(60)
CLEANUP
print(json.dumps(results))
"""


def _two_writers(spatial_db, *, first: str, second: str, cleanup: str) -> dict:
    script = (
        TWO_WRITERS.replace("FIRST", textwrap.indent(textwrap.dedent(first).strip(), " " * 8))
        .replace("SECOND", textwrap.indent(textwrap.dedent(second).strip(), " " * 4))
        .replace("CLEANUP", textwrap.dedent(cleanup).strip())
    )
    return json.loads(spatial_db.shell(script).strip().splitlines()[-1])


# Two writers whose locks used to cross: the first holds the revision row (a seed's bump inside
# its deferred block, or an import's bump after an in-place update of attributes only) and then
# needs the kept table's lock (its rebuild, or a write's trigger); the second is a user's
# soft delete, whose trigger takes that lock and whose bump then needs the revision row.
CROSSING_FIRST = {
    "seed": """
        with postgis.nearest_kept_in_bulk(rows=postgis.NEAREST_BULK_ROWS):
            AnnotationRevision.bump()
            started.set()
            second_waits()
    """,
    "import": """
        AnnotationRevision.bump()
        started.set()
        second_waits()
        services.annotation_create(
            category="crossing", geometry={"type": "Point", "coordinates": [11.0, 11.0]})
    """,
}


@pytest.mark.parametrize("order", ["seed", "import"])
def test_writers_whose_locks_crossed_both_commit(spatial_db, order):
    """A seed (or an import) that bumps the revision before it takes the kept table's lock, and a
    soft delete at the same time: both commit (the revision's bump takes that lock first, so
    every writer takes the two in one order; before, PostgreSQL found a deadlock and cancelled
    one)."""
    ended = _two_writers(
        spatial_db,
        first=CROSSING_FIRST[order],
        second="services.annotations_soft_delete(ids=[trees[0]])",
        cleanup="""
            services.annotations_restore(ids=[trees[0]])
            Annotation.all_objects.filter(category="crossing").delete()
        """,
    )
    assert ended == {"first": "committed", "second": "committed"}


def test_a_writer_of_two_statements_and_a_writer_of_its_second_row_both_commit(spatial_db):
    """A transaction that deletes one annotation and then edits another, while a second
    deletes that other one: both commit. Every statement on the annotations takes the kept
    table's lock before its row locks (migration annotations/0009); before, the first held the
    lock from its first trigger run and waited for the row the second had locked while that
    one's trigger waited for the lock, and PostgreSQL cancelled one as a deadlock."""
    ended = _two_writers(
        spatial_db,
        first="""
            services.annotations_soft_delete(ids=[trees[0]])
            started.set()
            second_waits()
            Annotation.objects.filter(id=trees[1]).update(category="two_statements")
        """,
        second="services.annotations_soft_delete(ids=[trees[1]])",
        cleanup="""
            Annotation.all_objects.filter(id=trees[1]).update(category="tree")
            services.annotations_restore(ids=trees)
        """,
    )
    assert ended == {"first": "committed", "second": "committed"}


def test_the_database_runs_the_functions_the_code_renders(spatial_db):
    """The kept table's functions in the migrated database are, to the whitespace, what
    `postgis` renders today with its reach, lock and SQL helpers: a change to any of them fails
    here until a migration installs the new functions (and rebuilds the table)."""
    script = """
import json
from geosense.annotations import postgis
today = postgis.nearest_functions_sql()
postgis.NEAREST_REACH_M += 10
print(json.dumps({"today": today, "farther": postgis.nearest_functions_sql()}))
"""
    out = json.loads(spatial_db.shell(script).strip().splitlines()[-1])
    installed = dict(
        spatial_db.sql(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", (list(out["today"]),)
        )
    )

    def words(bodies: dict[str, str]) -> dict[str, list[str]]:
        return {name: body.split() for name, body in bodies.items()}

    assert (
        set(installed)
        == set(out["today"])
        == {
            "annotations_nearest_find",
            "annotations_nearest_sync",
            "annotations_nearest_clear",
            "annotations_nearest_lock_first",
        }
    )
    assert words(installed) == words(out["today"])
    assert words(installed) != words(out["farther"])


def test_a_failed_bulk_block_leaves_the_trigger_on(spatial_db):
    """An exception inside `nearest_kept_in_bulk` that its caller catches: the block's writes
    are undone with the deferral, and the next write is kept row by row. A rebuild refuses to
    run under REPEATABLE READ (its snapshot would be older than its lock)."""
    script = (
        KEPT_HELPERS
        + """
from geosense.annotations import services


def point(lon, lat):
    return {"type": "Point", "coordinates": [lon, lat]}


out = {}
with transaction.atomic():
    try:
        with postgis.nearest_kept_in_bulk(rows=postgis.NEAREST_BULK_ROWS):
            services.annotation_create(category="failed_tree", geometry=point(13.0, 13.0))
            raise ValueError("the import found a bad feature")
    except ValueError:
        pass
    with connection.cursor() as cursor:
        out["deferred"] = postgis._deferred(cursor)
    services.annotation_create(category="failed_house", geometry=point(13.00005, 13.0))
    services.annotation_create(category="failed_tree", geometry=point(13.0001, 13.0))
    out["check"] = check()
    out["trees"] = services.Annotation.objects.filter(category="failed_tree").count()
    transaction.set_rollback(True)
try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        postgis.nearest_rebuild()
        transaction.set_rollback(True)
    out["repeatable read"] = "rebuilt"
except Exception as exc:
    out["repeatable read"] = type(exc).__name__
print(json.dumps(out))
"""
    )
    out = json.loads(spatial_db.shell(script).strip().splitlines()[-1])
    assert out == {
        "deferred": False,
        "check": {"stale": [], "answers": []},
        "trees": 1,
        "repeatable read": "RuntimeError",
    }


def test_an_import_moving_many_features_rebuilds_the_table_once(spatial_db):
    """A second import of a source that moves 1,000 of its features in place goes through the
    bulk path as its inserts do (the trigger off, one rebuild: its indexes are made anew)
    rather than 1,000 trigger runs under the one lock; the table then holds what a rebuild
    finds."""
    script = (
        KEPT_HELPERS
        + """
from geosense.annotations import services
from geosense.annotations.models import Annotation


def sql(statement):
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchall()


def collection(shift):
    return {"type": "FeatureCollection", "features": [
        {"type": "Feature", "id": n, "properties": {"class": "moved_tree" if n % 2 else "moved_house"},
         "geometry": {"type": "Point", "coordinates": [14.0 + 0.0001 * n, 14.0 + shift]}}
        for n in range(postgis.NEAREST_BULK_ROWS)]}


INDEX = "SELECT 'annotations_nearest_question'::regclass::oid"
services.annotations_import_geojson(collection=collection(0.0), source="moved")
before = sql(INDEX)
report = services.annotations_import_geojson(collection=collection(0.00003), source="moved")
out = {"updated": report.updated, "rebuilt": sql(INDEX) != before, "check": check()}
with transaction.atomic(), postgis.nearest_kept_in_bulk(rows=postgis.NEAREST_BULK_ROWS):
    Annotation.all_objects.filter(source="moved").delete()
print(json.dumps(out))
"""
    )
    out = json.loads(spatial_db.shell(script).strip().splitlines()[-1])
    assert out == {"updated": 1000, "rebuilt": True, "check": {"stale": [], "answers": []}}
