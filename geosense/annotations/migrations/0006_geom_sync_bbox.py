"""On PostgreSQL: the geom trigger (annotations/0005) also sets the bbox columns from `geom`.

`postgis._grid_pairs_sql` needs the bounding box of every live annotation of two classes, a
million rows per question. The bbox columns hold it (the app's writers set them from the
geometry's bounds), but a writer that changes `geometry` alone (psql, a raw UPDATE) left them
stale, so the query computed `Box2D(geom)` and its four edges per row: ~1 µs a row, about a
tenth of the question's PostgreSQL CPU at a million. Now the trigger sets min_lon, min_lat,
max_lon and max_lat to `geom`'s least and greatest coordinates (the numbers the app writes) on
any write of the geometry or of those columns, so they are `geom`'s box and the query reads
them. A row PostGIS cannot read (NULL `geom`) keeps what its writer gave. The backfill rewrites
only rows whose columns differ from their `geom`'s box (none, when only the app wrote).

On SQLite (and any other database) the migration does nothing.
"""

from importlib import import_module

from django.db import migrations

geom = import_module("geosense.annotations.migrations.0005_postgis_geom")
TABLE, COLUMN, TRIGGER = geom.TABLE, geom.COLUMN, geom.TRIGGER
BBOX = ("min_lon", "min_lat", "max_lon", "max_lat")
EDGES = ("ST_XMin", "ST_YMin", "ST_XMax", "ST_YMax")

# 0005's function, with the box set from `geom` before its last RETURN.
_LAST_RETURN = "    END;\n    RETURN NEW;\nEND\n$$;"
assert geom.SYNC_FUNCTION.count(_LAST_RETURN) == 1
SYNC_FUNCTION = geom.SYNC_FUNCTION.replace(
    _LAST_RETURN,
    "    END;\n"
    f"    IF NEW.{COLUMN} IS NOT NULL THEN\n"
    + "".join(
        f"        NEW.{name} := {edge}(NEW.{COLUMN});\n"
        for name, edge in zip(BBOX, EDGES, strict=True)
    )
    + "    END IF;\n    RETURN NEW;\nEND\n$$;",
)


def _trigger(columns: str) -> list[str]:
    return [
        f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}",
        f"""CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OF {columns} ON {TABLE}
            FOR EACH ROW EXECUTE FUNCTION {geom.FUNCTION}()""",
    ]


stale = " OR ".join(
    f"{name} IS DISTINCT FROM {edge}({COLUMN})" for name, edge in zip(BBOX, EDGES, strict=True)
)
FORWARD = [
    SYNC_FUNCTION,
    *_trigger(", ".join(("geometry", *BBOX))),
    # The trigger fires on an update of `geometry`, even to the same value.
    f"UPDATE {TABLE} SET geometry = geometry WHERE {COLUMN} IS NOT NULL AND ({stale})",
]

BACKWARD = [geom.SYNC_FUNCTION, *_trigger("geometry")]


def forward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in FORWARD:
        schema_editor.execute(statement, params=None)  # None: '%' is no placeholder


def backward(apps, schema_editor) -> None:
    """0005's trigger again: the columns keep their values."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in BACKWARD:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("annotations", "0005_postgis_geom"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
