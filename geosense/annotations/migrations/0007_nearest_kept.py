"""On PostgreSQL: each live annotation's nearest live annotation of every class, kept by the database.

Table `annotations_nearest` (source_id, target_category) → (source_category, target_id,
planar, metres, slack): for every live annotation with a `geom` and every class with a live
member (other than itself) within the reach (`postgis.NEAREST_REACH_M`, widened as the join
widens a distance), that class's nearest one: the least planar distance in the plane conformal
at the source's least latitude, then the lowest id (the ranking of
`postgis.annotations_within_distance`'s join), with its metres as the join takes them (the
plane's, the geodesic within a factor 1 ± slack of them, or the spheroid's with slack 0:
`postgis.nearest_measures_sql`). "Trees within 20 m of a house" is then an index-only range
scan on (source_category, target_category, metres): the join per question measured a floor of
~5 s of CPU at a million rows (docs/benchmarks.md, issue 18).

An AFTER trigger on annotations keeps it whoever writes (the ORM, raw SQL, psql):
- a row that stops being live (soft delete, hard delete, or an update of its geometry or class:
  the old one goes, the new one comes) loses its own rows, and every source whose nearest it
  was looks again for its nearest of that class (`annotations_nearest_find`, through the
  geography GiST index);
- a row that becomes live (insert, restore, the new geometry or class) finds its own nearest of
  every class, and becomes the nearest of each neighbour within the reach that it is nearer to
  than that neighbour's nearest of its class (or that had none).

Concurrency: every run of the trigger first takes one transaction-level advisory lock
(`pg_advisory_xact_lock(NEAREST_LOCK)`), held until its transaction ends, so writers of the
table follow one another (`AnnotationRevision.bump` takes it too, before the revision row, so
that every writer takes the two in one order). The function is VOLATILE and the app's transactions READ COMMITTED,
so each query in it, run after the lock, sees every transaction committed before it got the lock:
a writer that committed first is seen by the next one (which then counts it among the
candidates and the neighbours), and one not yet committed has not run its trigger, which will
see this one once it gets the lock. Under REPEATABLE READ or SERIALIZABLE the queries would
read the transaction's first snapshot, older than the lock, and could miss a neighbour: the
trigger refuses such a write instead of keeping a stale nearest. (Two transactions that also
lock the same annotation rows in opposite orders can deadlock on the lock; PostgreSQL then
cancels one, which the app's retry or the user sees as a failed write. Since annotations/0009
every statement takes the lock before its rows, so annotation writers no longer deadlock on it.)

A bulk writer (`postgis.nearest_kept_in_bulk`: `seed_demo`, a large import) sets
`geosense.nearest_deferred` for its transaction, so the trigger leaves the table alone, and
rebuilds it set-based at the end (`postgis.nearest_rebuild`, the grid join over every class);
this migration builds it the same way.

On SQLite (and any other database) the migration does nothing.
"""

from django.db import migrations

# The SQL below is this migration's, as `postgis.nearest_functions_sql()` rendered it when it was
# written (reach 20 m widened as the join widens it: 20.41 m, 0.000184582... degrees of latitude;
# lock 180007; metres and slack of `postgis.nearest_measures_sql`, ranking of
# `postgis.nearest_planar_sql`), laid out to be read: the scale tests compare the functions of a
# migrated database with the code's render, so a change there needs a new migration.
TABLE, NEAREST = "annotations_annotation", "annotations_nearest"
FIND = "annotations_nearest_find"
FUNCTION = "annotations_nearest_sync"
TRIGGER = "annotations_nearest_sync"

# The nearest live annotation of class `of_class` (every class when NULL) to annotation `sid`,
# probed through the geography index, as rows of the table.
FIND_FUNCTION = """
CREATE OR REPLACE FUNCTION annotations_nearest_find(sid bigint, of_class text) RETURNS void
LANGUAGE sql VOLATILE AS $$
INSERT INTO annotations_nearest (source_id, target_category, source_category, target_id, planar, metres, slack)
SELECT source_id, target_category, source_category, target_id, planar,
       CASE WHEN greatest(abs(lat0 - planar), abs(lat1 + planar)) < 89
                 AND (radians(lat1 - lat0 + planar)
                      * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101)) <= 1e-05
            THEN (planar * 110574.2758215945 / (1 - 0.00669437999014 * sin(radians(lat0))^2) ^ 1.5)
            ELSE ST_Length(ST_Scale(ST_ShortestLine(ST_Scale(sg, scale, 1),
                   ST_Scale(CASE WHEN ST_XMin(sg) - ST_XMax(tg) > 180 THEN ST_Translate(tg, 360, 0)
                                 WHEN ST_XMin(tg) - ST_XMax(sg) > 180 THEN ST_Translate(tg, -360, 0)
                                 ELSE tg END, scale, 1)), 1 / scale, 1)::geography)
       END,
       CASE WHEN greatest(abs(lat0 - planar), abs(lat1 + planar)) < 89
                 AND (radians(lat1 - lat0 + planar)
                      * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101)) <= 1e-05
            THEN 2 * (radians(lat1 - lat0 + planar)
                      * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101))
            ELSE 0
       END
FROM (
  SELECT DISTINCT ON (t.category) s.id AS source_id, t.category AS target_category,
         s.category AS source_category, t.id AS target_id, s.geom AS sg, t.geom AS tg,
         s.scale, s.min_lat AS lat0, s.max_lat AS lat1, p.planar
  FROM (SELECT id, category, geom, min_lat, max_lat,
               (cos(radians(min_lat)) * (1 - 0.00669437999014 * sin(radians(min_lat))^2) / (1 - 0.00669437999014)) AS scale
        FROM annotations_annotation WHERE id = sid) s
  JOIN annotations_annotation t
    ON t.geom::geography && _ST_Expand(s.geom::geography, 20.41) AND t.id <> s.id
  CROSS JOIN LATERAL (SELECT ST_Distance(ST_Scale(s.geom, s.scale, 1),
                        ST_Scale(CASE WHEN ST_XMin(s.geom) - ST_XMax(t.geom) > 180 THEN ST_Translate(t.geom, 360, 0)
                                      WHEN ST_XMin(t.geom) - ST_XMax(s.geom) > 180 THEN ST_Translate(t.geom, -360, 0)
                                      ELSE t.geom END, s.scale, 1))
                      AS planar) p
  WHERE t.deleted_at IS NULL AND (of_class IS NULL OR t.category = of_class)
    AND p.planar <= 0.0001845822706965471
  ORDER BY t.category, p.planar, t.id
) nearest
ON CONFLICT (source_id, target_category) DO UPDATE SET
  source_category = EXCLUDED.source_category, target_id = EXCLUDED.target_id,
  planar = EXCLUDED.planar, metres = EXCLUDED.metres, slack = EXCLUDED.slack
$$;
"""

SYNC_FUNCTION = """
CREATE OR REPLACE FUNCTION annotations_nearest_sync() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    sources bigint[];
    classes text[];
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.deleted_at IS NULL) = (NEW.deleted_at IS NULL)
       AND OLD.category = NEW.category
       AND OLD.geom::bytea IS NOT DISTINCT FROM NEW.geom::bytea THEN
        RETURN NULL;
    END IF;
    IF current_setting('geosense.nearest_deferred', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'annotations are written in READ COMMITTED transactions only'
            USING HINT = 'the nearest table''s trigger reads what others committed '
                         'after its lock (migration annotations/0007)';
    END IF;
    PERFORM pg_advisory_xact_lock(180007);
    IF TG_OP <> 'INSERT' AND OLD.deleted_at IS NULL THEN
        DELETE FROM annotations_nearest WHERE source_id = OLD.id;
        WITH gone AS (DELETE FROM annotations_nearest WHERE target_id = OLD.id
                      RETURNING source_id, target_category)
        SELECT array_agg(source_id), array_agg(target_category) INTO sources, classes FROM gone;
        FOR i IN 1 .. coalesce(array_length(sources, 1), 0) LOOP
            PERFORM annotations_nearest_find(sources[i], classes[i]);
        END LOOP;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.deleted_at IS NULL AND NEW.geom IS NOT NULL THEN
        PERFORM annotations_nearest_find(NEW.id, NULL);
        INSERT INTO annotations_nearest AS kept (source_id, target_category, source_category, target_id, planar, metres, slack)
        SELECT source_id, NEW.category, source_category, NEW.id, planar,
               CASE WHEN greatest(abs(lat0 - planar), abs(lat1 + planar)) < 89
                         AND (radians(lat1 - lat0 + planar)
                              * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101)) <= 1e-05
                    THEN (planar * 110574.2758215945 / (1 - 0.00669437999014 * sin(radians(lat0))^2) ^ 1.5)
                    ELSE ST_Length(ST_Scale(ST_ShortestLine(ST_Scale(sg, scale, 1),
                           ST_Scale(CASE WHEN ST_XMin(sg) - ST_XMax(tg) > 180 THEN ST_Translate(tg, 360, 0)
                                         WHEN ST_XMin(tg) - ST_XMax(sg) > 180 THEN ST_Translate(tg, -360, 0)
                                         ELSE tg END, scale, 1)), 1 / scale, 1)::geography)
               END,
               CASE WHEN greatest(abs(lat0 - planar), abs(lat1 + planar)) < 89
                         AND (radians(lat1 - lat0 + planar)
                              * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101)) <= 1e-05
                    THEN 2 * (radians(lat1 - lat0 + planar)
                              * (tan(radians(greatest(abs(lat0 - planar), abs(lat1 + planar)))) + 0.0101))
                    ELSE 0
               END
        FROM (
          SELECT y.id AS source_id, y.category AS source_category, y.geom AS sg,
                 NEW.geom AS tg, y.scale, y.min_lat AS lat0, y.max_lat AS lat1,
                 ST_Distance(ST_Scale(y.geom, y.scale, 1),
                   ST_Scale(CASE WHEN ST_XMin(y.geom) - ST_XMax(NEW.geom) > 180 THEN ST_Translate(NEW.geom, 360, 0)
                                 WHEN ST_XMin(NEW.geom) - ST_XMax(y.geom) > 180 THEN ST_Translate(NEW.geom, -360, 0)
                                 ELSE NEW.geom END, y.scale, 1)) AS planar
          FROM (SELECT id, category, geom, min_lat, max_lat,
                       (cos(radians(min_lat)) * (1 - 0.00669437999014 * sin(radians(min_lat))^2) / (1 - 0.00669437999014)) AS scale
                FROM annotations_annotation
                WHERE geom::geography && _ST_Expand(NEW.geom::geography, 20.41)
                  AND id <> NEW.id AND deleted_at IS NULL) y
        ) neighbours
        WHERE planar <= 0.0001845822706965471
        ON CONFLICT (source_id, target_category) DO UPDATE SET
          source_category = EXCLUDED.source_category, target_id = EXCLUDED.target_id,
          planar = EXCLUDED.planar, metres = EXCLUDED.metres, slack = EXCLUDED.slack
        WHERE (EXCLUDED.planar, EXCLUDED.target_id) < (kept.planar, kept.target_id);
    END IF;
    RETURN NULL;
END
$$;
"""

FORWARD = [
    f"""CREATE TABLE {NEAREST} (
        source_id bigint NOT NULL,
        target_category varchar(64) NOT NULL,
        source_category varchar(64) NOT NULL,
        target_id bigint NOT NULL,
        planar double precision NOT NULL,
        metres double precision NOT NULL,
        slack double precision NOT NULL,
        PRIMARY KEY (source_id, target_category))""",
    FIND_FUNCTION,
    SYNC_FUNCTION,
    f"""CREATE TRIGGER {TRIGGER} AFTER INSERT OR DELETE
        OR UPDATE OF geometry, geom, category, deleted_at ON {TABLE}
        FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()""",
]

BACKWARD = [
    f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}",
    f"DROP FUNCTION IF EXISTS {FUNCTION}()",
    f"DROP FUNCTION IF EXISTS {FIND}(bigint, text)",
    f"DROP TABLE IF EXISTS {NEAREST}",
]


def forward(apps, schema_editor) -> None:
    from geosense.annotations import postgis

    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in FORWARD:
        schema_editor.execute(statement, params=None)  # None: '%' is no placeholder
    # The first fill, and its indexes: the code's set-based build, the one bulk writers run (its
    # ranking and metres are the trigger's: the scale tests compare the two).
    postgis.nearest_rebuild(using=schema_editor.connection.alias)


def backward(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in BACKWARD:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("annotations", "0006_geom_sync_bbox"),
    ]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
