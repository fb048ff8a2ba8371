"""The annotations JSON API: a thin layer over the selectors."""

import math

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from .selectors import annotations_geojson
from .types import BBox

MAX_FEATURES = getattr(settings, "GEOSENSE_ANNOTATIONS_API_MAX_FEATURES", 20_000)


def bbox_parse(raw: str) -> BBox:
    """`minlon,minlat,maxlon,maxlat` in WGS84 degrees, or ValueError saying what is wrong."""
    parts = raw.split(",")
    if len(parts) != 4:
        raise ValueError("bbox must be minlon,minlat,maxlon,maxlat")
    try:
        min_lon, min_lat, max_lon, max_lat = (float(part) for part in parts)
    except ValueError as exc:
        raise ValueError("bbox values must be numbers") from exc
    if not all(math.isfinite(v) for v in (min_lon, min_lat, max_lon, max_lat)):
        raise ValueError("bbox values must be finite numbers")
    if not (-180 <= min_lon <= max_lon <= 180 and -90 <= min_lat <= max_lat <= 90):
        raise ValueError("bbox must lie within -180..180, -90..90 with min <= max")
    return (min_lon, min_lat, max_lon, max_lat)


@require_GET
def annotations_api(request: HttpRequest) -> JsonResponse:
    """GET /api/annotations?bbox=minlon,minlat,maxlon,maxlat&class=…: a FeatureCollection.

    At most MAX_FEATURES features (by id); a larger answer says `"truncated": true`.
    """
    if not request.user.is_authenticated:
        return JsonResponse({"error": "authentication required"}, status=401)
    bbox = None
    if raw := request.GET.get("bbox"):
        try:
            bbox = bbox_parse(raw)
        except ValueError as exc:
            return JsonResponse({"error": str(exc)}, status=400)
    category = request.GET.get("class") or None
    if category is not None and len(category) > 64:
        return JsonResponse({"error": "class is too long"}, status=400)
    return JsonResponse(annotations_geojson(bbox=bbox, category=category, limit=MAX_FEATURES))
