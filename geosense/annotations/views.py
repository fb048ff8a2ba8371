"""The annotations JSON API and the map's vector tiles: a thin layer over the selectors and
the tile backend (`tiles.py`)."""

import json
import math

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from .selectors import annotation_boxes, annotations_geojson
from .tiles import TileOutOfRange, tile_backend, tile_check
from .types import BBox

TILE_CONTENT_TYPE = "application/vnd.mapbox-vector-tile"

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


def _unauthenticated() -> JsonResponse:
    return JsonResponse({"error": "authentication required"}, status=401)


# Tiles are drawn off the event loop, in the request's own thread (Django's ASGI handler gives
# each request one), so a map's dozen requests at once are drawn side by side.
_off_loop = sync_to_async


async def annotation_tile(request: HttpRequest, z: int, x: int, y: int) -> HttpResponse:
    """GET /tiles/annotations/{z}/{x}/{y}.mvt: a gzip-compressed Mapbox Vector Tile.

    Its ETag names what it holds, so a map asks again with `If-None-Match` and gets 304 until
    a change touches the tile (`Cache-Control: private, no-cache`: the browser keeps it, and
    checks it on every use).
    """
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    user = await request.auser()
    if not user.is_authenticated:
        return _unauthenticated()
    backend = tile_backend()
    try:
        tile_check(z, x, y)
    except TileOutOfRange as exc:
        return JsonResponse({"error": str(exc)}, status=404)
    tag = await _off_loop(backend.etag)(z, x, y)
    if tag in _etags(request.headers.get("If-None-Match", "")):
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(
            await _off_loop(backend.render)(z, x, y), content_type=TILE_CONTENT_TYPE
        )
        response["Content-Encoding"] = "gzip"
    response["ETag"] = tag
    response["Cache-Control"] = "private, no-cache"
    response["Vary"] = "Cookie, Authorization"
    return response


async def annotation_tileset(request: HttpRequest) -> HttpResponse:
    """GET /tiles/annotations.json: the tile set's revision, counts per class over every live
    annotation, bounds, zooms and tile URL (a TileJSON-like document)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    user = await request.auser()
    if not user.is_authenticated:
        return _unauthenticated()
    metadata = await _off_loop(tile_backend().metadata)()
    response = JsonResponse(metadata.as_json())
    response["Cache-Control"] = "private, no-cache"
    return response


def _etags(header: str) -> set[str]:
    """The entity tags of an If-None-Match header (weak ones as their strong form)."""
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


BOXES_MAX_IDS = 100_000


def _ids_parse(raw: bytes) -> list[int]:
    """The `ids` of a `{"ids": [int, …]}` body, or ValueError saying what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError('the body must be a JSON object {"ids": [int, …]}') from None
    ids = data.get("ids") if isinstance(data, dict) else None
    if not isinstance(ids, list):
        raise ValueError('the body must be a JSON object {"ids": [int, …]}')
    if len(ids) > BOXES_MAX_IDS:
        raise ValueError(f"at most {BOXES_MAX_IDS} ids per request")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in ids):
        raise ValueError("ids must be positive integers")
    return ids


@require_POST
def annotation_boxes_api(request: HttpRequest) -> JsonResponse:
    """POST /api/annotations/boxes {"ids": [...]}: `{"boxes": [[id, class, w, s, e, n], …]}` of
    the live ones (deleted and unknown ids are left out): where the map fits a highlight or a
    focus and ends its link lines, for up to 100,000 ids (a GET URL could not hold them)."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "authentication required"}, status=401)
    try:
        ids = _ids_parse(request.body)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"boxes": annotation_boxes(ids=ids)})
