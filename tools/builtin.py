"""The built-in backend tools over the annotations services."""

from typing import Any

import numpy as np

from geosense.annotations import selectors, services
from geosense.annotations.classes import class_label, class_match, class_plural, with_article
from geosense.annotations.types import (
    CLASS_MAX_LENGTH,
    SIMILAR_K_MAX,
    SIMILAR_SAMPLES_MAX,
    AnnotationNotFound,
    VectorNotFound,
)

from .registry import BackendTool, ToolContext, ToolError
from .wording import (
    area_text,
    ids_text,
    listing,
    metres_text,
    missing_text,
    place_text,
    sentence,
)

SIMILARITY_COST = 5
INLINE_LIMIT = 20  # rows a result shows the model inline; the rest stays in the artifact

_BBOX = {
    "type": "array",
    "description": "Bounding box [min_lon, min_lat, max_lon, max_lat] in WGS84 degrees.",
    "items": {"type": "number"},
    "minItems": 4,
    "maxItems": 4,
}
_CLASS = {"type": "string", "minLength": 1, "maxLength": CLASS_MAX_LENGTH}
_ID = {"type": "integer", "minimum": 1}


def _bbox(arguments: dict[str, Any]) -> tuple[float, float, float, float] | None:
    box = arguments.get("bbox")
    if box is None:
        return None
    min_lon, min_lat, max_lon, max_lat = (float(v) for v in box)
    if min_lon > max_lon or min_lat > max_lat:
        raise ToolError("bbox must be [min_lon, min_lat, max_lon, max_lat] with min ≤ max.")
    return min_lon, min_lat, max_lon, max_lat


def _known_class(name: str) -> str:
    counts = selectors.annotation_counts()
    found = class_match(name, counts)
    if found is not None:
        return found
    known = ", ".join(sorted(counts)) or "none"
    raise ToolError(f"There is no class {name!r}. Known classes: {known}.")


def _summary_row(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "class": row.category,
        "area_m2": round(row.area_m2, 2),
        "length_m": round(row.length_m, 2),
        "lat": round(row.centroid_lat, 6),
        "lon": round(row.centroid_lon, 6),
    }


# --- list_classes ----------------------------------------------------------------------------


def list_classes(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    counts = selectors.annotation_counts(bbox=_bbox(arguments))
    return {"counts": counts, "total": sum(counts.values())}


LIST_CLASSES = BackendTool(
    name="list_classes",
    description="Counts the annotations per class, optionally inside a bounding box.",
    arguments={"type": "object", "properties": {"bbox": _BBOX}, "additionalProperties": False},
    handler=list_classes,
    title="Count annotations per class",
    summary=lambda a: (
        f"Every class inside {area_text(a['bbox'])}" if a.get("bbox") else "Every class"
    ),
)


def _absent(ids) -> str:
    """Why these ids name no live annotation, in a sentence for a person (and the model)."""
    deleted, unknown = selectors.annotations_missing(ids=ids)
    return missing_text(deleted, unknown)


# --- query_annotations -----------------------------------------------------------------------


def query_annotations(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    category = arguments.get("class")
    if category:
        category = _known_class(category)
    rows = selectors.annotation_list(
        category=category,
        bbox=_bbox(arguments),
        ids=arguments.get("ids"),
        order_by=arguments.get("order_by"),
        limit=arguments.get("limit", 200),
    )
    items = [_summary_row(r) for r in rows]
    result: dict[str, Any] = {"count": len(items), "annotations": items[:INLINE_LIMIT]}
    if arguments.get("ids"):
        absent = _absent(arguments["ids"])
        if absent and not items:
            raise ToolError(absent)
        if absent:
            result["missing"] = absent
    if len(items) > INLINE_LIMIT:
        result["artifact_id"] = context.artifact_save(
            kind="annotations",
            data={"ids": [r["id"] for r in items], "annotations": items},
            origin="tool:query_annotations",
        )
        result["note"] = f"Showing {INLINE_LIMIT} of {len(items)}; all are in the artifact."
    return result


_ORDER_WORDS = {
    "area_m2": ("smallest", "largest", "by area"),
    "length_m": ("shortest", "longest", "by length"),
}


def _query_summary(arguments: dict[str, Any]) -> str:
    """ "The 3 largest houses", "The longest road", "Trees inside an area of …", "#3 and #4"."""
    category = arguments.get("class")
    limit = arguments.get("limit")
    order = arguments.get("order_by") or "id"
    things = class_plural(category) if category else "annotations"
    if arguments.get("ids"):
        text = f"{sentence(things)} {ids_text(arguments['ids'])}"
    elif order.lstrip("-") in _ORDER_WORDS:
        smallest, largest, _ = _ORDER_WORDS[order.lstrip("-")]
        which = largest if order.startswith("-") else smallest
        if limit == 1:
            text = f"The {which} {class_label(category) if category else 'annotation'}"
        elif limit:
            text = f"The {limit:,} {which} {things}"
        else:
            text = f"{sentence(things)}, {which} first"
    else:
        text = f"Up to {limit:,} {things}" if limit else sentence(things)
    if arguments.get("bbox"):
        text += f" inside {area_text(arguments['bbox'])}"
    return text


QUERY_ANNOTATIONS = BackendTool(
    name="query_annotations",
    description=(
        "Lists annotations with their id, class, area (m²), length (m) and centroid, filtered "
        "by class, bounding box or ids, ordered by a measure (e.g. '-area_m2' for the largest "
        "first). Use limit=1 with an order to find the largest or smallest."
    ),
    arguments={
        "type": "object",
        "properties": {
            "class": _CLASS,
            "bbox": _BBOX,
            "ids": {"type": "array", "items": _ID, "maxItems": 1000},
            "order_by": {"enum": ["id", "area_m2", "-area_m2", "length_m", "-length_m"]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "additionalProperties": False,
    },
    handler=query_annotations,
    title="List annotations",
    summary=_query_summary,
)


# --- spatial_relation ------------------------------------------------------------------------


def spatial_relation(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    source = _known_class(arguments["source"])
    target = _known_class(arguments["target"])
    relation = arguments["relation"]
    bbox = _bbox(arguments)
    if relation == "within_distance":
        distance = arguments.get("distance_m")
        if distance is None:
            raise ToolError("within_distance needs distance_m (metres).")
        within = selectors.annotations_within_distance(
            source=source, target=target, distance_m=float(distance), bbox=bbox
        )
        ids, links = within.source_ids, within.target_ids
        values = np.round(within.distances_m, 2)
        link_type = "distance"
    else:
        pairs = selectors.annotations_overlapping(source=source, target=target, bbox=bbox)
        ids = np.array([p.source_id for p in pairs], dtype=np.int64)
        links = np.array([p.target_id for p in pairs], dtype=np.int64)
        values = np.array([round(p.share, 4) for p in pairs], dtype=float)
        link_type = "overlap"
    # Columns for up to hundreds of thousands of pairs, kept as numpy arrays: the artifact's
    # JSON writes them as their lists would be (`geosense.fields.json_text`) in a fifth of
    # the time of making the lists first (~60 ms for a million annotations' 470,000 pairs).
    areas = np.round(selectors.annotation_areas(ids=ids), 2) if len(ids) else np.zeros(0)
    data = {
        "ids": ids,
        "links": links,
        "linkValues": values,
        "linkType": link_type,
        "areas": areas,
        "attributeHints": {"areas": "area"},
        "source": source,
        "target": target,
    }
    if relation == "within_distance":
        data["distance_m"] = float(arguments["distance_m"])
    artifact_id = context.artifact_save(kind="highlight", data=data, origin="tool:spatial_relation")
    preview = [
        {"id": i, "link": link, "value": v}
        for i, link, v in zip(
            ids[:INLINE_LIMIT].tolist(),
            links[:INLINE_LIMIT].tolist(),
            values[:INLINE_LIMIT].tolist(),
            strict=True,
        )
    ]
    return {
        "artifact_id": artifact_id,
        "count": len(ids),
        "linkType": link_type,
        "first": preview,
        "usage": (
            f'Highlight all with <tool type="highlight" data="${{{artifact_id}}}">…</tool>; '
            f"refer to values as ${{{artifact_id}.ids.0}}, ${{{artifact_id}.linkValues.0}}."
        ),
    }


SPATIAL_RELATION = BackendTool(
    name="spatial_relation",
    description=(
        "Relates two classes: 'within_distance' finds every source annotation within "
        "distance_m metres of a target one (with its nearest target and the distance), "
        "'overlap' finds source annotations overlapping a target (share 0–1 of the source's "
        "area). The result is stored as an artifact shaped for the highlight block."
    ),
    arguments={
        "type": "object",
        "properties": {
            "relation": {"enum": ["within_distance", "overlap"]},
            "source": _CLASS,
            "target": _CLASS,
            "distance_m": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000},
            "bbox": _BBOX,
        },
        "required": ["relation", "source", "target"],
        "additionalProperties": False,
    },
    handler=spatial_relation,
    title="Find annotations near or overlapping others",
    summary=lambda a: (
        (
            f"{sentence(class_plural(a['source']))} within {metres_text(a.get('distance_m'))} of "
            f"{with_article(a['target'])}"
            if a["relation"] == "within_distance"
            else f"{sentence(class_plural(a['source']))} overlapping {with_article(a['target'])}"
        )
        + (f" inside {area_text(a['bbox'])}" if a.get("bbox") else "")
    ),
)


# --- measure ---------------------------------------------------------------------------------


def measure(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    try:
        m = selectors.annotation_measures(annotation_id=arguments["id"])
    except AnnotationNotFound:
        raise ToolError(_absent([arguments["id"]])) from None
    return {
        "id": m.id,
        "class": m.category,
        "geometry_type": m.geometry_type,
        "area_m2": round(m.area_m2, 2),
        "length_m": round(m.length_m, 2),
        "perimeter_m": round(m.perimeter_m, 2),
        "centroid": {"lat": round(m.centroid_lat, 6), "lon": round(m.centroid_lon, 6)},
        "attributes": m.attributes,
    }


MEASURE = BackendTool(
    name="measure",
    description="Measures one annotation: class, geometry type, area (m²), length and perimeter (m), centroid, attributes.",
    arguments={
        "type": "object",
        "properties": {"id": _ID},
        "required": ["id"],
        "additionalProperties": False,
    },
    handler=measure,
    title="Measure an annotation",
    summary=lambda a: f"Annotation {ids_text([a['id']])}",
)


# --- nearest_annotations ---------------------------------------------------------------------


def nearest_annotations(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    category = arguments.get("class")
    hits = selectors.annotations_nearest(
        lat=arguments["lat"],
        lon=arguments["lon"],
        category=_known_class(category) if category else None,
        k=arguments.get("k", 5),
    )
    return {
        "nearest": [
            {"id": h.id, "class": h.category, "distance_m": round(h.distance_m, 1)} for h in hits
        ]
    }


NEAREST_ANNOTATIONS = BackendTool(
    name="nearest_annotations",
    description="The annotations nearest to a point (e.g. the user's location), with distances in metres.",
    arguments={
        "type": "object",
        "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
            "class": _CLASS,
            "k": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["lat", "lon"],
        "additionalProperties": False,
    },
    handler=nearest_annotations,
    title="Find the nearest annotations",
    summary=lambda a: (
        f"The {a.get('k', 5)} "
        f"{class_plural(a['class']) if a.get('class') else 'annotations'} nearest to "
        f"{place_text(a['lat'], a['lon'])}"
    ),
)


# --- similarity_search -----------------------------------------------------------------------


def similarity_search(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    samples = [(s["id"], s.get("v")) for s in arguments["samples"]]
    category = arguments.get("class")
    try:
        hits = selectors.annotations_similar(
            samples=samples,
            category=_known_class(category) if category else None,
            k=arguments.get("k", 20),
        )
    except AnnotationNotFound as exc:
        raise ToolError(_absent(exc.ids)) from None
    except VectorNotFound as exc:
        raise ToolError(str(exc)) from None
    ids = [h.id for h in hits]
    artifact_id = context.artifact_save(
        kind="highlight",
        data={"ids": ids, "scores": [round(h.score, 4) for h in hits]},
        origin="tool:similarity_search",
    )
    return {
        "artifact_id": artifact_id,
        "count": len(ids),
        "class": hits[0].category if hits else category,
        "results": [{"id": h.id, "score": round(h.score, 4)} for h in hits[:INLINE_LIMIT]],
    }


def _similar_summary(arguments: dict[str, Any]) -> str:
    """ "Pools like #25 and #216 (its “context” vector), up to 20 results"."""
    category = arguments.get("class")
    things = class_plural(category) if category else "annotations"
    samples = arguments["samples"]
    text = f"{sentence(things)} like {ids_text(s['id'] for s in samples)}"
    vectors = sorted({s["v"] for s in samples if s.get("v")})
    if vectors:
        text += f" (by {listing(f'“{v}”' for v in vectors)})"
    return text + f", up to {arguments.get('k', 20)} results"


SIMILARITY_SEARCH = BackendTool(
    name="similarity_search",
    description=(
        f"Finds the annotations most similar in shape to one or more samples (cosine over "
        f"feature vectors). Costs {SIMILARITY_COST} credits per call."
    ),
    arguments={
        "type": "object",
        "properties": {
            "samples": {
                "type": "array",
                "minItems": 1,
                "maxItems": SIMILAR_SAMPLES_MAX,
                "items": {
                    "type": "object",
                    "properties": {"id": _ID, "v": {"type": "string", "maxLength": 64}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
            },
            "class": _CLASS,
            "k": {"type": "integer", "minimum": 1, "maximum": SIMILAR_K_MAX},
        },
        "required": ["samples"],
        "additionalProperties": False,
    },
    handler=similarity_search,
    cost_credits=SIMILARITY_COST,
    read_only=False,
    title="Search for similar annotations",
    summary=_similar_summary,
)


# --- delete_annotations ----------------------------------------------------------------------


def delete_annotations(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    ids = list(dict.fromkeys(arguments["ids"]))
    deleted = services.annotations_soft_delete(ids=ids)
    missing = [i for i in ids if i not in deleted]
    result: dict[str, Any] = {"deleted": deleted, "restorable": True}
    if missing:
        result["not_found"] = missing
    if not deleted:
        raise ToolError(f"Nothing was deleted. {_absent(missing)}")
    return result


DELETE_ANNOTATIONS = BackendTool(
    name="delete_annotations",
    description="Deletes annotations by id (soft: an administrator can restore them).",
    arguments={
        "type": "object",
        "properties": {"ids": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 500}},
        "required": ["ids"],
        "additionalProperties": False,
    },
    handler=delete_annotations,
    destructive=True,
    read_only=False,
    permission="annotations.delete_annotation",
    title="Delete annotations",
    summary=lambda a: (
        f"{ids_text(a['ids'])} (an administrator can restore "
        f"{'it' if len(set(a['ids'])) == 1 else 'them'})"
    ),
)


# --- area_report (a sub-turn) ----------------------------------------------------------------

SUBTURN_TOOLS = frozenset({"list_classes", "query_annotations", "measure"})


async def area_report(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    if context.subturn is None:
        raise ToolError("Sub-agents are not available here.")
    text = await context.subturn(instructions=arguments["question"], tool_names=SUBTURN_TOOLS)
    return {"report": text}


AREA_REPORT = BackendTool(
    name="area_report",
    description=(
        "Asks a helper agent with read-only tools (list_classes, query_annotations, measure) "
        "to answer a self-contained question about the annotations and report back in text."
    ),
    arguments={
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1, "maxLength": 2000}},
        "required": ["question"],
        "additionalProperties": False,
    },
    handler=area_report,
    title="Ask a helper for a report",
    summary=lambda a: "“" + " ".join(str(a["question"]).split())[:200] + "”",
)


# Registered by ToolsConfig.ready(), in this order (the order the model sees them).
BUILTIN_TOOLS = (
    LIST_CLASSES,
    QUERY_ANNOTATIONS,
    SPATIAL_RELATION,
    MEASURE,
    NEAREST_ANNOTATIONS,
    SIMILARITY_SEARCH,
    DELETE_ANNOTATIONS,
    AREA_REPORT,
)
