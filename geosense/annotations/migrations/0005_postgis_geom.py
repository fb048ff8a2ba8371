"""On PostgreSQL: the annotations' geometry as a PostGIS column, kept in step by a trigger.

`geom geometry(Geometry, 4326)` mirrors the GeoJSON `geometry` column (which stays the record,
portable to SQLite). A BEFORE INSERT OR UPDATE OF geometry trigger sets it from the JSON, so
every writer (the ORM, `_bulk_insert`'s raw SQL, psql) keeps it current without knowing it is
there; the model has no field for it, so nothing in Django reads or writes it. Indexes: GiST on
`geom` (bbox and `<->` KNN searches, tiles) and on `(geom::geography)` (`ST_DWithin` in metres).

On SQLite (and any other database) the migration does nothing: the embedded default needs no
GDAL, GEOS or PostGIS. The names below are what `postgis.py` and the tile backend use
(docs/architecture.md, "PostGIS").
"""

from django.db import migrations

TABLE = "annotations_annotation"
COLUMN = "geom"
FUNCTION = "annotations_annotation_geom_sync"
TRIGGER = "annotations_annotation_geom_sync"
GEOM_INDEX = "annotations_annotation_geom_gist"
GEOGRAPHY_INDEX = "annotations_annotation_geog_gist"

# What the app stores is a GeoJSON geometry object (`geometry_dict`, `shapely.to_geojson`), 2D,
# of the six simple types. The function also takes what other writers might leave: a JSON
# string holding GeoJSON (a double-encoded value), a Feature, 3D coordinates; anything
# PostGIS cannot read gets a NULL geom and a WARNING rather than a refused write (such a row
# is then found by no spatial query, as the embedded index could not parse it either).
SYNC_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    value jsonb := NEW.geometry;
BEGIN
    IF value IS NOT NULL AND jsonb_typeof(value) = 'string' THEN
        value := (value #>> '{{}}')::jsonb;
    END IF;
    IF value IS NOT NULL AND value ->> 'type' = 'Feature' THEN
        value := value -> 'geometry';
    END IF;
    IF value IS NULL OR jsonb_typeof(value) <> 'object' THEN
        NEW.{COLUMN} := NULL;
        RETURN NEW;
    END IF;
    BEGIN
        NEW.{COLUMN} := ST_SetSRID(ST_Force2D(ST_GeomFromGeoJSON(value::text)), 4326);
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'annotation %: geometry not readable by PostGIS (%)', NEW.id, SQLERRM;
        NEW.{COLUMN} := NULL;
    END;
    RETURN NEW;
END
$$;
"""

FORWARD = [
    f"ALTER TABLE {TABLE} ADD COLUMN {COLUMN} geometry(Geometry, 4326)",
    SYNC_FUNCTION,
    f"""CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OF geometry ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()""",
    # Backfill: the trigger fires on an update of `geometry`, even to the same value.
    f"UPDATE {TABLE} SET geometry = geometry",
    f"CREATE INDEX {GEOM_INDEX} ON {TABLE} USING gist ({COLUMN})",
    f"CREATE INDEX {GEOGRAPHY_INDEX} ON {TABLE} USING gist (({COLUMN}::geography))",
    f"ANALYZE {TABLE}",
]

BACKWARD = [
    f"DROP INDEX IF EXISTS {GEOGRAPHY_INDEX}",
    f"DROP INDEX IF EXISTS {GEOM_INDEX}",
    f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}",
    f"DROP FUNCTION IF EXISTS {FUNCTION}()",
    f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS {COLUMN}",
]

NO_POSTGIS = (
    "PostGIS is not available to this database user: as a superuser, run "
    "CREATE EXTENSION IF NOT EXISTS postgis; in the app's database (Debian: the "
    "postgresql-15-postgis-3 package), then migrate again (docs/deploy.md)"
)


def _postgis_ensure(schema_editor) -> None:
    """Create the extension unless it is there (a non-superuser cannot: say what to do)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'postgis'")
        if cursor.fetchone():
            return
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'postgis'")
        if not cursor.fetchone():
            raise RuntimeError(NO_POSTGIS)
    try:
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS postgis")
    except Exception as exc:
        raise RuntimeError(f"{NO_POSTGIS} ({exc})") from exc


def forward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    _postgis_ensure(schema_editor)
    for statement in FORWARD:
        schema_editor.execute(statement, params=None)  # None: '%' is no placeholder


def backward(apps, schema_editor) -> None:
    """Drops the column, its trigger and indexes; the extension stays (others may use it)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in BACKWARD:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("annotations", "0004_demoarea"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
