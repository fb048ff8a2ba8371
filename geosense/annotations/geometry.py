"""Geometry helpers: GeoJSON parsing, geodesic measures, a local metric projection, shape vectors.

Measures are geodesic (pyproj's `Geod` on WGS84), never flat-earth. Spatial work runs on
shapely geometries projected to an azimuthal equidistant plane centred on the data, whose
distortion is bounded (`LocalProjection.scale_bound`); reported distances go back through
`Geod`.
"""

import json
import math
from typing import Any

import numpy as np
import shapely
from pyproj import Geod, Transformer
from shapely.geometry import shape
from shapely.geometry.base import BaseGeometry

from .types import BBox, GeometryError

GEOD = Geod(ellps="WGS84")
EARTH_RADIUS_M = 6_371_008.8
SUPPORTED_TYPES = frozenset(
    {"Point", "LineString", "Polygon", "MultiPoint", "MultiLineString", "MultiPolygon"}
)
SHAPE_VECTOR_SIZE = 8
_PARSE_ERRORS = (
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    shapely.errors.ShapelyError,
)


def geometry_parse(geometry: Any) -> BaseGeometry:
    """A shapely geometry from a WGS84 GeoJSON geometry dict, or GeometryError saying why not."""
    if not isinstance(geometry, dict):
        raise GeometryError("a geometry must be a GeoJSON object")
    kind = geometry.get("type")
    if kind not in SUPPORTED_TYPES:
        raise GeometryError(f"geometry type {kind!r} is not supported")
    if not isinstance(geometry.get("coordinates"), list):
        raise GeometryError(f"{kind} without a coordinates array")
    try:
        geom = shape(geometry)
        coords = shapely.get_coordinates(geom)
    except _PARSE_ERRORS as exc:
        raise GeometryError(f"malformed {kind} coordinates ({exc})") from exc
    if geom.is_empty:
        raise GeometryError(f"empty {kind}")
    if not np.isfinite(coords).all():
        raise GeometryError(f"{kind} has non-finite coordinates")
    if (np.abs(coords[:, 0]) > 180).any() or (np.abs(coords[:, 1]) > 90).any():
        raise GeometryError(f"{kind} coordinates are not WGS84 longitude/latitude")
    geom = shapely.force_2d(geom)
    if not geom.is_valid:
        raise GeometryError(f"invalid {kind}: {shapely.is_valid_reason(geom)}")
    return geom


def geometry_dict(geom: BaseGeometry) -> dict[str, Any]:
    return json.loads(shapely.to_geojson(geom))


def geodesic_measures(geom: BaseGeometry) -> tuple[float, float]:
    """Geodesic (area_m2, length_m) on WGS84; a polygon's length is its perimeter."""
    dimension = shapely.get_dimensions(geom)
    if dimension == 2:
        area, perimeter = GEOD.geometry_area_perimeter(geom)
        return abs(area), perimeter
    if dimension == 1:
        return 0.0, GEOD.geometry_length(geom)
    return 0.0, 0.0


def bbox_of(geom: BaseGeometry) -> BBox:
    min_lon, min_lat, max_lon, max_lat = geom.bounds
    return (min_lon, min_lat, max_lon, max_lat)


def scale_bound(distance_from_centre_m: float) -> float:
    """Upper bound of the azimuthal equidistant scale factor within that distance of its centre.

    The radial scale is 1 and the transverse scale is x / sin(x) (x the angular distance),
    so projected distances lie between the geodesic ones and this factor times them.
    """
    x = min(distance_from_centre_m / EARTH_RADIUS_M, 2.5)
    return 1.0 if x < 1e-9 else x / math.sin(x)


class LocalProjection:
    """An azimuthal equidistant plane (metres) centred on (lon, lat)."""

    def __init__(self, *, lon: float, lat: float) -> None:
        self.lon = lon
        self.lat = lat
        crs = f"+proj=aeqd +lat_0={lat} +lon_0={lon} +datum=WGS84 +units=m +no_defs"
        self._forward = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
        self._inverse = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)

    def project(self, geoms: np.ndarray) -> np.ndarray:
        return shapely.transform(geoms, self._forward_coords)

    def unproject(self, geoms: np.ndarray) -> np.ndarray:
        return shapely.transform(geoms, self._inverse_coords)

    def to_lonlat(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lon, lat = self._inverse.transform(x, y)
        return np.asarray(lon), np.asarray(lat)

    def reach_m(self, lon: float, lat: float) -> float:
        """Geodesic distance of a point from the centre."""
        return float(GEOD.inv(self.lon, self.lat, lon, lat)[2])

    def _forward_coords(self, coords: np.ndarray) -> np.ndarray:
        return np.column_stack(self._forward.transform(coords[:, 0], coords[:, 1]))

    def _inverse_coords(self, coords: np.ndarray) -> np.ndarray:
        return np.column_stack(self._inverse.transform(coords[:, 0], coords[:, 1]))


def nearest_point_distances(
    projection: LocalProjection, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """Geodesic metres between the nearest points of projected geometry pairs (0 where they meet)."""
    if len(a) == 0:
        return np.zeros(0)
    ends = shapely.get_coordinates(shapely.shortest_line(a, b)).reshape(-1, 2, 2)
    lon1, lat1 = projection.to_lonlat(ends[:, 0, 0], ends[:, 0, 1])
    lon2, lat2 = projection.to_lonlat(ends[:, 1, 0], ends[:, 1, 1])
    distances = GEOD.inv(lon1, lat1, lon2, lat2)[2]
    return np.where(shapely.intersects(a, b), 0.0, np.asarray(distances, dtype=float))


def shape_vectors(geoms_m: np.ndarray, sizes_m: np.ndarray) -> np.ndarray:
    """Shape descriptors of metric geometries, one row each, so that similar shapes lie close.

    Columns: log area, log length (or perimeter), elongation of the minimum rotated rectangle,
    compactness (4πA/P²), orientation of the long axis (cos 2θ, sin 2θ, weighted by
    elongation so that squares have none), rectangle fill (polygons) or straightness (lines),
    log of a size attribute (a tree's crown radius: a point has no other shape).
    """
    n = len(geoms_m)
    out = np.zeros((n, SHAPE_VECTOR_SIZE))
    if n == 0:
        return out
    area = shapely.area(geoms_m)
    length = shapely.length(geoms_m)
    dims = shapely.get_dimensions(geoms_m)
    envelopes = shapely.oriented_envelope(geoms_m)
    coords, index = shapely.get_coordinates(envelopes, return_index=True)
    starts = np.searchsorted(index, np.arange(n))
    counts = np.bincount(index, minlength=n)
    p0 = coords[np.minimum(starts, len(coords) - 1)]
    p1 = coords[np.minimum(starts + 1, len(coords) - 1)]
    p2 = coords[np.minimum(starts + 2, len(coords) - 1)]
    e1 = np.where((counts >= 2)[:, None], p1 - p0, 0.0)
    e2 = np.where((counts >= 3)[:, None], p2 - p1, 0.0)
    s1 = np.hypot(e1[:, 0], e1[:, 1])
    s2 = np.hypot(e2[:, 0], e2[:, 1])
    long_side = np.maximum(s1, s2)
    short_side = np.minimum(s1, s2)
    long_edge = np.where((s1 >= s2)[:, None], e1, e2)
    theta = np.arctan2(long_edge[:, 1], long_edge[:, 0])
    with np.errstate(divide="ignore", invalid="ignore"):
        elongation = np.where(long_side > 0, 1.0 - short_side / long_side, 0.0)
        compactness = np.where((dims == 2) & (length > 0), 4 * np.pi * area / length**2, 0.0)
        fill = np.where(
            dims == 2,
            np.where(long_side * short_side > 0, area / (long_side * short_side), 0.0),
            np.where((dims == 1) & (length > 0), long_side / length, 0.0),
        )
    out[:, 0] = np.log1p(area)
    out[:, 1] = np.log1p(length)
    out[:, 2] = elongation
    out[:, 3] = np.clip(compactness, 0.0, 1.0)
    out[:, 4] = np.cos(2 * theta) * elongation
    out[:, 5] = np.sin(2 * theta) * elongation
    out[:, 6] = np.clip(fill, 0.0, 1.0)
    out[:, 7] = np.log1p(np.maximum(sizes_m, 0.0))
    return np.round(out, 6)


CONTEXT_CELL_M = 40.0


def neighbour_counts(
    geoms_m: np.ndarray,
    categories: list[str],
    classes: list[str],
    *,
    cell_m: float = CONTEXT_CELL_M,
) -> np.ndarray:
    """How many annotations of each of `classes` lie around each one, itself left out: those
    whose centres (of their bounding boxes) fall in the 3 x 3 grid cells of `cell_m` around its
    own. O(n log n) with numpy: a million rows take seconds."""
    n = len(geoms_m)
    out = np.zeros((n, len(classes)), dtype=np.int64)
    if n == 0 or not classes:
        return out
    bounds = shapely.bounds(geoms_m)  # the box's centre: 50x faster than centroids, as good here
    cells = np.floor((bounds[:, :2] + bounds[:, 2:]) / 2 / cell_m).astype(np.int64)
    cells -= cells.min(axis=0) - 1
    width = int(cells[:, 1].max()) + 2
    keys = cells[:, 0] * width + cells[:, 1]
    order = {name: i for i, name in enumerate(classes)}
    kinds = np.array([order.get(c, -1) for c in categories], dtype=np.int64)
    known = kinds >= 0
    unique, where = np.unique(keys, return_inverse=True)
    counts = np.zeros((len(unique), len(classes)), dtype=np.int64)
    np.add.at(counts, (where.ravel()[known], kinds[known]), 1)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            wanted = keys + dx * width + dy
            at = np.minimum(np.searchsorted(unique, wanted), len(unique) - 1)
            hit = unique[at] == wanted
            out[hit] += counts[at[hit]]
    out[np.flatnonzero(known), kinds[known]] -= 1
    return out


def context_vectors_json(counts: np.ndarray) -> list[str]:
    """The "context" vector of each row of `neighbour_counts`, as JSON text: log(1 + count) of
    each class, to 4 places (few neighbours matter more than many). Formatted by table: the
    counts are small integers, and a million rows of floats take long to print one by one."""
    if not len(counts):
        return []
    table = [repr(round(math.log1p(k), 4)) for k in range(int(counts.max()) + 1)]
    return ["[" + ",".join([table[k] for k in row]) + "]" for row in counts.tolist()]


def size_attribute(attributes: dict[str, Any]) -> float:
    value = attributes.get("crown_radius_m", 0.0)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def shape_vector(geom_lonlat: BaseGeometry, attributes: dict[str, Any]) -> list[float]:
    """The default "shape" vector of one WGS84 geometry.

    Shape descriptors need no geodesic precision, so the geometry is scaled to metres
    around its own centre (equirectangular), which costs nothing next to building a
    pyproj transformer per annotation.
    """
    centre = geom_lonlat.centroid
    metres_per_degree = EARTH_RADIUS_M * math.pi / 180
    x_scale = metres_per_degree * math.cos(math.radians(centre.y))
    metric = shapely.transform(
        geom_lonlat,
        lambda c: np.column_stack(
            [(c[:, 0] - centre.x) * x_scale, (c[:, 1] - centre.y) * metres_per_degree]
        ),
    )
    return shape_vectors(np.array([metric], dtype=object), np.array([size_attribute(attributes)]))[
        0
    ].tolist()
