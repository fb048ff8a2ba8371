"""Writes to annotations: create, import, soft-delete and restore, and the demo neighbourhood.

The demo user is the accounts' concern (`geosense.accounts.services.demo_user_ensure`); the
`seed_demo` command runs both.

Every write that bypasses `Model.save` bumps `AnnotationRevision`, so that the spatial
indexes cached in every process rebuild on their next query. On PostgreSQL a bulk write (the
seed's delete and insert, an import's in-place updates and inserts) goes through
`postgis.nearest_kept_in_bulk`, so the database's table of nearest annotations is rebuilt once
after a large one rather than kept row by row.
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely
from django.db import connection, transaction
from django.utils import timezone

from . import demo, postgis
from .geometry import (
    LocalProjection,
    bbox_of,
    context_vectors_json,
    geodesic_measures,
    geometry_dict,
    geometry_parse,
    neighbour_counts,
    shape_vector,
    shape_vectors,
    size_attribute,
)
from .models import Annotation, AnnotationRevision, DemoArea
from .types import (
    CLASS_MAX_LENGTH,
    CONTEXT_VECTOR,
    DEFAULT_VECTOR,
    GeometryError,
    ImportReport,
    SeedReport,
)

MAX_VECTOR_SIZE = 4096
VECTOR_NAME_MAX_LENGTH = 64
MAX_DEMO_ANNOTATIONS = 1_000_000
SEED_SOURCE = "seed_demo:"
# The layout's version, in every demo row's source: a new layout replaces an older one's rows.
DEMO_LAYOUT = "v2"
INSERT_BATCH = 2_000


class GeoJSONImportError(ValueError):
    """A FeatureCollection that cannot be imported; the message says where and why."""


def _category_clean(category: Any) -> str:
    if not isinstance(category, str | int) or isinstance(category, bool):
        raise ValueError("a class must be a string")
    text = str(category).strip()
    if not text or len(text) > CLASS_MAX_LENGTH:
        raise ValueError(f"a class must have 1 to {CLASS_MAX_LENGTH} characters")
    return text


def _vectors_clean(vectors: Any) -> dict[str, list[float]]:
    if not isinstance(vectors, dict):
        raise ValueError("vectors must be an object of name → list of numbers")
    clean: dict[str, list[float]] = {}
    for name, vector in vectors.items():
        if not isinstance(name, str) or not name or len(name) > VECTOR_NAME_MAX_LENGTH:
            raise ValueError("a vector name must be a short non-empty string")
        if (
            not isinstance(vector, list)
            or not 0 < len(vector) <= MAX_VECTOR_SIZE
            or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in vector
            )
        ):
            raise ValueError(f"vector {name!r} must be 1 to {MAX_VECTOR_SIZE} finite numbers")
        clean[name] = [float(x) for x in vector]
    return clean


def geometry_measures(geometry: dict[str, Any]) -> tuple[float, float]:
    """Geodesic (area_m2, length_m) of a WGS84 GeoJSON geometry (GeometryError if invalid)."""
    return geodesic_measures(geometry_parse(geometry))


def annotation_create(
    *,
    category: str,
    geometry: dict[str, Any],
    attributes: dict[str, Any] | None = None,
    vectors: dict[str, list[float]] | None = None,
    source: str = "",
) -> Annotation:
    """Create one annotation with its bounding box, geodesic measures and a "shape" vector."""
    geom = geometry_parse(geometry)
    attributes = dict(attributes or {})
    clean_vectors = _vectors_clean(vectors or {})
    clean_vectors.setdefault(DEFAULT_VECTOR, shape_vector(geom, attributes))
    area, length = geodesic_measures(geom)
    min_lon, min_lat, max_lon, max_lat = bbox_of(geom)
    return Annotation.objects.create(
        category=_category_clean(category),
        geometry=geometry_dict(geom),
        min_lon=min_lon,
        min_lat=min_lat,
        max_lon=max_lon,
        max_lat=max_lat,
        area_m2=area,
        length_m=length,
        attributes=attributes,
        vectors=clean_vectors,
        source=source[:64],
    )


def annotations_soft_delete(*, ids: Sequence[int]) -> list[int]:
    """Mark live annotations deleted; returns the ids deleted by this call."""
    with transaction.atomic():
        live = sorted(Annotation.objects.filter(id__in=list(ids)).values_list("id", flat=True))
        if live:
            Annotation.all_objects.filter(id__in=live).update(
                deleted_at=timezone.now(), updated=timezone.now()
            )
            AnnotationRevision.bump(content=False)
    return live


def annotations_restore(*, ids: Sequence[int]) -> list[int]:
    """Bring soft-deleted annotations back; returns the ids restored by this call."""
    with transaction.atomic():
        deleted = sorted(
            Annotation.all_objects.filter(id__in=list(ids), deleted_at__isnull=False).values_list(
                "id", flat=True
            )
        )
        if deleted:
            Annotation.all_objects.filter(id__in=deleted).update(
                deleted_at=None, updated=timezone.now()
            )
            AnnotationRevision.bump(content=False)
    return deleted


def _bulk_insert(
    *,
    categories: Sequence[str],
    geoms_lonlat: np.ndarray,
    attributes: Sequence[dict[str, Any]],
    vectors: Sequence[dict[str, list[float]]] | Sequence[str],
    source: str,
    measures: np.ndarray | None = None,
) -> int:
    """Insert many validated annotations with one parametrised statement per batch.

    `bulk_create` spent most of a 200,000-row seed compiling per-field SQL; the rows here
    are already clean, so they go in through `executemany` (the caller holds the transaction).
    `measures` (rows area_m2, length_m) when the caller has them; vectors may come as JSON.
    """
    geometry_texts = shapely.to_geojson(geoms_lonlat) if len(geoms_lonlat) else []
    bounds = shapely.bounds(geoms_lonlat) if len(geoms_lonlat) else np.zeros((0, 4))
    if measures is None:
        measures = np.array([geodesic_measures(geom) for geom in geoms_lonlat]).reshape(-1, 2)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    columns = [
        "category",
        "geometry",
        "min_lon",
        "min_lat",
        "max_lon",
        "max_lat",
        "area_m2",
        "length_m",
        "attributes",
        "vectors",
        "source",
        "created",
        "updated",
    ]
    json_marker = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    placeholders = [
        json_marker if name in {"geometry", "attributes", "vectors"} else "%s" for name in columns
    ]
    meta = Annotation._meta
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        connection.ops.quote_name(meta.db_table),
        ", ".join(connection.ops.quote_name(meta.get_field(name).column) for name in columns),
        ", ".join(placeholders),
    )
    encode = json.JSONEncoder(separators=(",", ":")).encode
    bound_rows, measure_rows = bounds.tolist(), measures.tolist()
    with postgis.nearest_kept_in_bulk(rows=len(geometry_texts)), connection.cursor() as cursor:
        for start in range(0, len(geometry_texts), INSERT_BATCH):
            cursor.executemany(
                sql,
                [
                    (
                        categories[n],
                        geometry_texts[n],
                        *bound_rows[n],
                        *measure_rows[n],
                        encode(attributes[n]),
                        vectors[n] if isinstance(vectors[n], str) else encode(vectors[n]),
                        source,
                        now,
                        now,
                    )
                    for n in range(start, min(start + INSERT_BATCH, len(geometry_texts)))
                ],
            )
    AnnotationRevision.bump()
    return len(geometry_texts)


@dataclass(frozen=True)
class _Features:
    """The features of a collection that will be imported, with their ids, and the skipped."""

    categories: list[str] = field(default_factory=list)
    geoms: list[Any] = field(default_factory=list)
    attributes: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)  # the feature ids, as text
    skipped: list[int] = field(default_factory=list)  # positions of features without a class


def _collection_check(collection: Any) -> list[Any]:
    if not isinstance(collection, dict) or collection.get("type") != "FeatureCollection":
        raise GeoJSONImportError(
            'not a GeoJSON FeatureCollection (its "type" must be "FeatureCollection")'
        )
    crs = collection.get("crs")
    if crs is not None:
        name = str((crs.get("properties") or {}).get("name", "")) if isinstance(crs, dict) else ""
        if not name.upper().endswith(("CRS84", "4326")):
            raise GeoJSONImportError(
                f"coordinates must be WGS84 longitude/latitude, not {name or crs!r}"
            )
    features = collection.get("features")
    if not isinstance(features, list):
        raise GeoJSONImportError('a FeatureCollection needs a "features" array')
    return features


def _feature_id(feature: dict[str, Any], properties: dict[str, Any], id_property: str | None):
    """The feature's stable id: its GeoJSON `id`, or the `id_property` property."""
    value = properties.get(id_property) if id_property else feature.get("id")
    if value is None or isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return value


def _features_parse(
    collection: Any, class_property: str, *, default_class: str | None, id_property: str | None
) -> _Features:
    parsed = _Features()
    seen: dict[str, int] = {}
    for n, feature in enumerate(_collection_check(collection)):
        where = f"feature {n}"
        if not isinstance(feature, dict) or feature.get("type") != "Feature":
            raise GeoJSONImportError(f"{where}: not a GeoJSON Feature")
        properties = feature.get("properties") or {}
        if not isinstance(properties, dict):
            raise GeoJSONImportError(f"{where}: properties must be an object")
        category = properties.get(class_property)
        if category is None or (isinstance(category, str) and not category.strip()):
            if default_class is None:
                parsed.skipped.append(n)
                continue
            category = default_class
        try:
            parsed.categories.append(_category_clean(category))
            parsed.geoms.append(geometry_parse(feature.get("geometry")))
        except (ValueError, GeometryError) as exc:
            raise GeoJSONImportError(f"{where}: {exc}") from exc
        extra = {key: value for key, value in properties.items() if key != class_property}
        feature_id = _feature_id(feature, properties, id_property)
        key = None if feature_id is None else str(feature_id)
        if key is not None:
            if key in seen:
                raise GeoJSONImportError(
                    f"{where}: the id {feature_id!r} is also feature {seen[key]}'s"
                )
            seen[key] = n
            extra["feature_id"] = feature_id
        parsed.attributes.append(extra)
        parsed.keys.append(key)
    return parsed


def _imported_before(source: str) -> dict[str, Annotation]:
    """The annotations an earlier import of `source` made (deleted ones too), by feature id."""
    return {
        str(annotation.attributes["feature_id"]): annotation
        for annotation in Annotation.all_objects.filter(source=source).only(
            "id", "category", "geometry", "attributes", "vectors"
        )
        if isinstance(annotation.attributes, dict) and "feature_id" in annotation.attributes
    }


def _update_in_place(annotation: Annotation, category: str, geom: Any, attrs: dict) -> bool:
    """Give an imported annotation its feature's new class, shape and properties; False when
    nothing changed."""
    geometry = geometry_dict(geom)
    if (annotation.category, annotation.geometry, annotation.attributes) == (
        category,
        geometry,
        attrs,
    ):
        return False
    area, length = geodesic_measures(geom)
    annotation.min_lon, annotation.min_lat, annotation.max_lon, annotation.max_lat = bbox_of(geom)
    annotation.category, annotation.geometry, annotation.attributes = category, geometry, attrs
    annotation.area_m2, annotation.length_m = area, length
    annotation.vectors = {**(annotation.vectors or {}), DEFAULT_VECTOR: shape_vector(geom, attrs)}
    annotation.updated = timezone.now()
    return True


UPDATED_FIELDS = (
    "category",
    "geometry",
    "min_lon",
    "min_lat",
    "max_lon",
    "max_lat",
    "area_m2",
    "length_m",
    "attributes",
    "vectors",
    "updated",
)


def annotations_import_geojson(
    *,
    collection: Any,
    class_property: str = "class",
    source: str = "import",
    default_class: str | None = None,
    id_property: str | None = None,
) -> ImportReport:
    """Import a WGS84 FeatureCollection (GeoJSONImportError says where and why nothing was).

    A feature with a stable id (its GeoJSON `id`, or the `id_property` property) that an earlier
    import of the same `source` made updates that annotation in place (a deleted one stays
    deleted); a second import of a source whose features have no id is refused, as it could
    only duplicate them. A feature without a class takes `default_class`, or is skipped and
    reported. Every other problem refuses the whole file.
    """
    parsed = _features_parse(
        collection, class_property, default_class=default_class, id_property=id_property
    )
    source = source[:64]
    with transaction.atomic():
        before = _imported_before(source)
        if (
            any(key is None for key in parsed.keys)
            and Annotation.all_objects.filter(source=source).exists()
        ):
            raise GeoJSONImportError(
                "this file was imported before and some of its features have no id, so they "
                "cannot be matched to the annotations it made: give every feature an id (or "
                "name one with --id-property), or delete the earlier import in the admin"
            )
        new = [n for n, key in enumerate(parsed.keys) if key is None or key not in before]
        changed = [
            before[key]
            for key, category, geom, attrs in zip(
                parsed.keys, parsed.categories, parsed.geoms, parsed.attributes, strict=True
            )
            if key is not None
            and key in before
            and _update_in_place(before[key], category, geom, attrs)
        ]
        # In-place updates and inserts together: one rebuild when they are many, as for inserts.
        with postgis.nearest_kept_in_bulk(rows=len(changed) + len(new)):
            if changed:
                Annotation.all_objects.bulk_update(changed, UPDATED_FIELDS, batch_size=INSERT_BATCH)
                AnnotationRevision.bump()
            created = (
                _bulk_insert(
                    categories=[parsed.categories[n] for n in new],
                    geoms_lonlat=np.array([parsed.geoms[n] for n in new], dtype=object),
                    attributes=[parsed.attributes[n] for n in new],
                    vectors=[
                        {DEFAULT_VECTOR: shape_vector(parsed.geoms[n], parsed.attributes[n])}
                        for n in new
                    ],
                    source=source,
                )
                if new
                else 0
            )
    matched = len(parsed.keys) - len(new)
    return ImportReport(
        created=created,
        updated=len(changed),
        unchanged=matched - len(changed),
        skipped=tuple(parsed.skipped),
    )


def demo_seed(*, annotations: int = 2000, seed: int = 0) -> SeedReport:
    """A neighbourhood of `annotations` features around a real place.

    Idempotent: the rows carry `seed_demo:<layout>:<seed>:<count>` in `source`; a second run
    with the same arguments changes nothing, other arguments (or an older layout) replace the
    earlier demo rows. A million rows take under two minutes: the shapes are made in bulk, their
    measures taken in the neighbourhood's own equidistant plane (within 0.0001 % of geodesic
    there), and rows go in through `_bulk_insert`.
    """
    if not 0 <= annotations <= MAX_DEMO_ANNOTATIONS:
        raise ValueError(f"--annotations must be between 0 and {MAX_DEMO_ANNOTATIONS}")
    marker = f"{SEED_SOURCE}{DEMO_LAYOUT}:{seed}:{annotations}"
    with transaction.atomic():
        earlier = Annotation.all_objects.filter(source__startswith=SEED_SOURCE)
        if (
            earlier.filter(source=marker).count() == annotations
            and not earlier.exclude(source=marker).exists()
        ):
            return SeedReport(
                place=demo.PLACE,
                created=0,
                replaced=0,
                total=annotations,
            )
        with postgis.nearest_kept_in_bulk(rows=max(annotations, earlier.count())):
            replaced, _ = earlier.delete()
            layout = demo.demo_features(count=annotations, seed=seed)
            created = _demo_insert(layout, marker=marker)
        DemoArea.objects.all().delete()
        DemoArea.objects.create(
            seed=seed, annotations=annotations, blocks=[list(b) for b in layout.blocks]
        )
    return SeedReport(
        place=demo.PLACE,
        created=created,
        replaced=replaced,
        total=annotations,
    )


def _demo_insert(layout: demo.DemoLayout, *, marker: str) -> int:
    """Insert the demo's features, measured and with their vectors, as rows from `marker`."""
    metric = layout.geoms_m
    sizes = np.array([size_attribute(a) for a in layout.attributes])
    shape_rows = shape_vectors(metric, sizes).tolist()
    context_rows = context_vectors_json(
        neighbour_counts(metric, layout.categories, sorted(set(layout.categories)))
    )
    projection = LocalProjection(lon=demo.PLACE_LON, lat=demo.PLACE_LAT)
    lonlat = shapely.transform(projection.unproject(metric), lambda c: np.round(c, 7))
    dims = shapely.get_dimensions(metric)
    measures = np.column_stack(
        [np.where(dims == 2, shapely.area(metric), 0.0), shapely.length(metric)]
    )
    return _bulk_insert(
        categories=layout.categories,
        geoms_lonlat=lonlat,
        attributes=layout.attributes,
        vectors=[
            f'{{"{DEFAULT_VECTOR}":{json.dumps(shape)},"{CONTEXT_VECTOR}":{around}}}'
            for shape, around in zip(shape_rows, context_rows, strict=True)
        ],
        source=marker,
        measures=measures,
    )


def demo_reset(*, annotations: int = 2000, seed: int = 0) -> tuple[SeedReport, int]:
    """Put the demo neighbourhood back as `make run` first made it; returns the seed report and
    how many deleted demo annotations came back.

    Deleted demo annotations are restored (their ids, which chat sessions refer to, are kept),
    a set that is incomplete or of another size is seeded again. (The demo user is reset by
    `geosense.accounts.services.demo_user_reset`; `seed_demo --reset` runs both.)
    """
    with transaction.atomic():
        deleted = Annotation.all_objects.filter(
            source=f"{SEED_SOURCE}{DEMO_LAYOUT}:{seed}:{annotations}", deleted_at__isnull=False
        ).values_list("id", flat=True)
        restored = annotations_restore(ids=list(deleted))
        report = demo_seed(annotations=annotations, seed=seed)
    return report, len(restored)
