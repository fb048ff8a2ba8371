"""On PostgreSQL: a TRUNCATE of the annotations empties the kept nearest table too.

The row trigger of annotations/0007 does not fire on TRUNCATE (`manage.py flush`, a restore
script), which left `annotations_nearest` naming annotations that no longer exist, and a
within-distance question answering with them. A statement trigger AFTER TRUNCATE now empties
it, under the same advisory lock as every other write of the table.

On SQLite (and any other database) the migration does nothing.
"""

from django.db import migrations

# Literal SQL, as `postgis.nearest_functions_sql()` rendered it (lock 180007): the scale tests
# compare it with the code's render.
TABLE, NEAREST = "annotations_annotation", "annotations_nearest"
FUNCTION = "annotations_nearest_clear"
TRIGGER = "annotations_nearest_clear"

FORWARD = [
    """CREATE OR REPLACE FUNCTION annotations_nearest_clear() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(180007);
        TRUNCATE annotations_nearest;
        RETURN NULL;
    END
    $$""",
    f"""CREATE TRIGGER {TRIGGER} AFTER TRUNCATE ON {TABLE}
        FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()""",
]

BACKWARD = [
    f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}",
    f"DROP FUNCTION IF EXISTS {FUNCTION}()",
]


def forward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in FORWARD:
        schema_editor.execute(statement, params=None)


def backward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in BACKWARD:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("annotations", "0007_nearest_kept"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
