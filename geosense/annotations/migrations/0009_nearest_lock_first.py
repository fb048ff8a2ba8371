"""On PostgreSQL: every statement that writes annotations takes the kept nearest table's lock
before it locks any row.

Since annotations/0007 the row trigger takes `pg_advisory_xact_lock(180007)` after the row it
runs for is locked, and holds it to commit. A transaction that wrote one annotation and then
another therefore took a row lock while holding the advisory lock, and a concurrent write of
that second row held the row and waited for the advisory lock in its own trigger: a deadlock,
which PostgreSQL ended by cancelling one of them. A BEFORE ... FOR EACH STATEMENT trigger runs
before the statement locks any row, so every writer now takes the advisory lock first, then
rows, then the revision row (`AnnotationRevision.bump` takes the lock too): one order. Every
statement that writes annotations (whichever columns) now waits for the lock, which the row
trigger's writers already did from their first trigger run; a second call in the same
transaction is a no-op.

On SQLite (and any other database) the migration does nothing.
"""

from django.db import migrations

# Literal SQL, as `postgis.nearest_functions_sql()` rendered it (lock 180007): the scale tests
# compare it with the code's render.
TABLE = "annotations_annotation"
FUNCTION = "annotations_nearest_lock_first"
TRIGGER = "annotations_nearest_lock_first"

FORWARD = [
    """CREATE OR REPLACE FUNCTION annotations_nearest_lock_first() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(180007);
        RETURN NULL;
    END
    $$""",
    f"""CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OR DELETE ON {TABLE}
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
        ("annotations", "0008_nearest_truncate"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
