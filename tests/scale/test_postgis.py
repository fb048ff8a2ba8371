"""The annotations' PostGIS column on PostgreSQL (migration annotations/0005): every writer keeps
`geom` equal to the GeoJSON `geometry`, the migration backfills and reverses, and the GiST
indexes are there. On a PostgreSQL + PostGIS cluster of its own, seeded with the default demo."""

import json
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
    """Rows whose `geom` is not their GeoJSON geometry (NULL counts as a mismatch)."""
    ((n,),) = db.sql(
        f"SELECT count(*) FROM {TABLE} WHERE geom IS NULL OR NOT ST_Equals("
        "geom, ST_SetSRID(ST_GeomFromGeoJSON(geometry::text), 4326)) OR ST_SRID(geom) <> 4326"
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
    """The ORM's create, an import's bulk insert and its update in place, and plain SQL."""
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
