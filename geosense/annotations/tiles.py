"""Mapbox Vector Tiles of the live annotations, for the WebGL map (`/tiles/annotations/…`).

A `TileBackend` answers three questions: the tile set's metadata (counts per class over the
whole dataset, bounds, revision), a tile's ETag, and a tile's bytes (gzip-compressed MVT).
`IndexTileBackend` answers them from the in-process spatial index (`index.py`), so a tile
reads nothing from the database; on PostgreSQL, `PostgisTileBackend` (`tiles_postgis.py`,
`ST_AsMVT`) takes its place behind the same three methods (`tile_backend()`).

One layer, `annotations`: each feature has `id`, `class` and its measures (`area_m2` for
polygons, `length_m` for lines and polygons' perimeters). Below `EXACT_ZOOM`, an annotation
smaller than a pixel (of a 512-pixel tile, as MapLibre draws them) is not drawn alone: such
annotations of a class are counted per cell of the tile, one point per cell with `class` and
`count` and no `id`; polygons and lines are simplified to half a pixel. Below `OVERVIEW_ZOOM`
the pixel counted grows (2 at zoom 11, 4 from zoom 10 out), and the cells with it. From `EXACT_ZOOM` on
every annotation in the tile is there, with its exact geometry (to the tile's 4096 grid).
A tile over `MAX_TILE_BYTES` is made again with a coarser pixel, so none is larger.

A tile's ETag is a digest of the index's generation and the ids of the annotations it holds:
a deletion or a restore changes the tiles it touches and no other; a write of content (an
import, an edit, a seed) changes every one.
"""

import gzip
import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import shapely

from .base import base_shapes, demo_blocks
from .index import ClassIndex, SpatialIndex, spatial_index
from .mvt import Layer, layer_of_dicts, tile_encode
from .spatial import spatial_backend

LAYER = "annotations"
BASE_LAYER = "base"
EXTENT = 4096
BUFFER = 64  # tile units drawn beyond each edge, so that lines and outlines meet at seams
TILE_PIXELS = 512
EXACT_ZOOM = 16
MIN_ZOOM, MAX_ZOOM = 0, 22
CELL_PIXELS = 16  # count points: one per class per cell of this many pixels
MAX_TILE_BYTES = 500_000
# gzip level 4 against 6 at a million annotations (the largest zoom-13 tile, 1.24 MB of MVT):
# 17 against 47 ms of CPU, 469 against 457 KB (docs/benchmarks.md).
GZIP_LEVEL = 4
TILE_URL = "/tiles/annotations/{z}/{x}/{y}.mvt"
# Below OVERVIEW_ZOOM the smallest annotation drawn alone grows 2x per zoom out, up to
# OVERVIEW_PIXELS: a map opening on a million annotations (zoom ~10) got ~13,000 road lines
# of 2-3 pixels per tile, seconds of parsing in its worker; they are counted there instead.
OVERVIEW_ZOOM = 12
OVERVIEW_PIXELS = 4.0
# Changing how tiles are drawn changes every ETag.
ENCODING_VERSION = "3"

EARTH_RADIUS = 6_378_137.0
HALF_WORLD = math.pi * EARTH_RADIUS
MAX_LAT = 85.0511287798066


class TileOutOfRange(ValueError):
    """z/x/y that names no tile."""


@dataclass(frozen=True)
class TileSetMetadata:
    revision: str
    total: int
    counts: dict[str, int]
    bounds: tuple[float, float, float, float] | None

    def as_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "total": self.total,
            "counts": self.counts,
            "bounds": list(self.bounds) if self.bounds else None,
            "minzoom": MIN_ZOOM,
            "maxzoom": MAX_ZOOM,
            "tiles": [TILE_URL],
        }


class TileBackend(Protocol):
    """Where tiles come from: the in-process index, or PostGIS (`ST_AsMVT`)."""

    def metadata(self) -> TileSetMetadata: ...

    def etag(self, z: int, x: int, y: int) -> str: ...

    def render(self, z: int, x: int, y: int) -> bytes: ...


def tile_check(z: int, x: int, y: int) -> None:
    if not MIN_ZOOM <= z <= MAX_ZOOM:
        raise TileOutOfRange(f"zoom must be {MIN_ZOOM} to {MAX_ZOOM}")
    if not (0 <= x < 2**z and 0 <= y < 2**z):
        raise TileOutOfRange(f"x and y must be 0 to {2**z - 1} at zoom {z}")


def mercator(coords: np.ndarray) -> np.ndarray:
    """Web Mercator metres (EPSG:3857) of lon/lat rows."""
    lon = np.radians(coords[:, 0])
    lat = np.radians(np.clip(coords[:, 1], -MAX_LAT, MAX_LAT))
    return np.column_stack(
        [EARTH_RADIUS * lon, EARTH_RADIUS * np.log(np.tan(math.pi / 4 + lat / 2))]
    )


def tile_bounds(z: int, x: int, y: int) -> tuple[float, float, float, float]:
    """The tile's Web Mercator bounds (west, south, east, north)."""
    size = 2 * HALF_WORLD / 2**z
    west, north = -HALF_WORLD + x * size, HALF_WORLD - y * size
    return west, north - size, west + size, north


def mercator_lonlat(mx: float, my: float) -> tuple[float, float]:
    lon = math.degrees(mx / EARTH_RADIUS)
    lat = math.degrees(2 * math.atan(math.exp(my / EARTH_RADIUS)) - math.pi / 2)
    return lon, lat


@dataclass(frozen=True)
class _Selection:
    """What one tile holds of one class: positions in the class, and their Mercator bounds."""

    class_index: ClassIndex
    positions: np.ndarray
    bounds: np.ndarray


class TileMemo:
    """What a tile backend keeps in its process: ETags by (revision, z, x, y), the oldest
    dropped past `tags_kept`, and drawn tiles by ETag, the least recently used dropped past
    `cache_bytes`. A revision names the whole live set, so neither can go stale."""

    def __init__(self, *, cache_bytes: int, tags_kept: int) -> None:
        self.cache_bytes = cache_bytes
        self.tags_kept = tags_kept
        self._tiles: OrderedDict[str, bytes] = OrderedDict()
        self._tiles_bytes = 0
        self._tags: OrderedDict[tuple[str, str, int, int, int], str] = OrderedDict()
        self._lock = threading.Lock()

    def tag(self, revision: str, z: int, x: int, y: int) -> str | None:
        with self._lock:
            return self._tags.get((ENCODING_VERSION, revision, z, x, y))

    def tag_keep(self, revision: str, z: int, x: int, y: int, tag: str) -> None:
        with self._lock:
            self._tags[(ENCODING_VERSION, revision, z, x, y)] = tag
            while len(self._tags) > self.tags_kept:
                self._tags.popitem(last=False)

    def tile(self, tag: str | None) -> bytes | None:
        with self._lock:
            if tag not in self._tiles:
                return None
            self._tiles.move_to_end(tag)
            return self._tiles[tag]

    def tile_keep(self, tag: str, data: bytes) -> None:
        with self._lock:
            if tag in self._tiles:
                return
            self._tiles[tag] = data
            self._tiles_bytes += len(data)
            while self._tiles_bytes > self.cache_bytes and self._tiles:
                self._tiles_bytes -= len(self._tiles.popitem(last=False)[1])


class IndexTileBackend:
    """Tiles drawn from the in-process spatial index, the last ones kept by ETag."""

    def __init__(self, *, cache_bytes: int = 64 * 2**20, tags_kept: int = 50_000) -> None:
        # ETags (and the metadata) by the index's revision: a low-zoom tile's tag digests every
        # id it holds (~0.2-0.5 s at a million annotations): without the memo a tile served
        # from the cache paid that.
        self.memo = TileMemo(cache_bytes=cache_bytes, tags_kept=tags_kept)
        self._metadata: TileSetMetadata | None = None

    def metadata(self) -> TileSetMetadata:
        index = spatial_index()
        known = self._metadata
        if known is not None and known.revision == index.revision:
            return known
        self._metadata = self._metadata_of(index)
        return self._metadata

    @staticmethod
    def _metadata_of(index: SpatialIndex) -> TileSetMetadata:
        counts = index.counts()
        boxes = [c.bounds for c in index.classes.values() if len(c.ids)]
        bounds = None
        if boxes:
            every = np.concatenate(boxes)
            bounds = (
                float(every[:, 0].min()),
                float(every[:, 1].min()),
                float(every[:, 2].max()),
                float(every[:, 3].max()),
            )
        return TileSetMetadata(
            revision=index.revision, total=sum(counts.values()), counts=counts, bounds=bounds
        )

    def etag(self, z: int, x: int, y: int) -> str:
        index = spatial_index()
        return self._known_tag(index, z, x, y) or self._tag(index, z, x, y, _select(index, z, x, y))

    def _known_tag(self, index: SpatialIndex, z: int, x: int, y: int) -> str | None:
        return self.memo.tag(index.revision, z, x, y)

    def _tag(self, index: SpatialIndex, z: int, x: int, y: int, selections: list) -> str:
        tag = _etag(index, z, x, y, selections)
        self.memo.tag_keep(index.revision, z, x, y, tag)
        return tag

    def render(self, z: int, x: int, y: int) -> bytes:
        index = spatial_index()
        if (kept := self.memo.tile(self._known_tag(index, z, x, y))) is not None:
            return kept
        selections = _select(index, z, x, y)
        tag = self._tag(index, z, x, y, selections)
        if (kept := self.memo.tile(tag)) is not None:
            return kept
        data = _render(index, z, x, y, selections)
        self.memo.tile_keep(tag, data)
        return data


def _mercator_of(class_index: ClassIndex, index: SpatialIndex) -> tuple[np.ndarray, np.ndarray]:
    """A class's shapes in Web Mercator and their bounds, worked out once per class index."""
    derived = class_index.derived
    if "mercator" not in derived:
        shapes = shapely.transform(index.projection.unproject(class_index.geoms), mercator)
        derived["mercator_bounds"] = shapely.bounds(shapes)
        derived["mercator"] = shapes
    return derived["mercator"], derived["mercator_bounds"]


def _select(index: SpatialIndex, z: int, x: int, y: int) -> list[_Selection]:
    """Per class, the annotations whose Mercator bounds meet the tile (with its buffer)."""
    tile_check(z, x, y)
    west, south, east, north = tile_bounds(z, x, y)
    pad = (east - west) * BUFFER / EXTENT
    west, south, east, north = west - pad, south - pad, east + pad, north + pad
    # The tree is in the index's own plane: query it with the tile's outline taken there.
    outline = shapely.segmentize(shapely.box(west, south, east, north), (east - west) / 8)
    lonlat = shapely.transform(outline, lambda c: np.column_stack(_lonlat_many(c)))
    query_box = shapely.envelope(index.projection.project(np.array([lonlat], dtype=object))[0])
    selections = []
    for name in sorted(index.classes):
        class_index = index.classes[name]
        candidates = np.sort(class_index.tree.query(query_box))
        if not len(candidates):
            continue
        _, bounds = _mercator_of(class_index, index)
        b = bounds[candidates]
        meets = (b[:, 0] <= east) & (b[:, 2] >= west) & (b[:, 1] <= north) & (b[:, 3] >= south)
        if meets.any():
            selections.append(_Selection(class_index, candidates[meets], b[meets]))
    return selections


def _lonlat_many(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lon = np.degrees(coords[:, 0] / EARTH_RADIUS)
    lat = np.degrees(2 * np.arctan(np.exp(coords[:, 1] / EARTH_RADIUS)) - math.pi / 2)
    return lon, lat


def _etag(index: SpatialIndex, z: int, x: int, y: int, selections: list[_Selection]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{ENCODING_VERSION}|{index.generation}|{z}/{x}/{y}".encode())
    for selection in selections:
        digest.update(f"|{selection.class_index.category}|".encode())
        digest.update(selection.class_index.ids[selection.positions].tobytes())
    return f'"{digest.hexdigest()}"'


def _render(index: SpatialIndex, z: int, x: int, y: int, selections: list[_Selection]) -> bytes:
    """The gzip-compressed tile; below EXACT_ZOOM, coarser until it fits MAX_TILE_BYTES."""
    pixel = min(OVERVIEW_PIXELS, 2.0 ** max(0, OVERVIEW_ZOOM - z))
    base = _base_features(index, z, x, y)
    while True:
        drawn = []
        for selection in selections:
            drawn.extend(_features(index, z, x, y, selection, pixel))
        layers = [_annotations_layer(drawn)]
        if base:
            layers.append(layer_of(BASE_LAYER, base))
        data = tile_compress(tile_encode(layers, extent=EXTENT))
        if len(data) <= MAX_TILE_BYTES or z >= EXACT_ZOOM:
            return data
        pixel *= 4


def tile_compress(data: bytes) -> bytes:
    """A tile as served (both backends): gzip at GZIP_LEVEL, no timestamp (same bytes, same
    ETag's body)."""
    return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)


def layer_of(name: str, features: list[dict[str, Any]]) -> Layer:
    """A layer of a few features given as dicts (`geometry`, `properties`): the base layer."""
    return layer_of_dicts(
        name, [f["geometry"] for f in features], [f["properties"] for f in features]
    )


def _base_features(index: SpatialIndex, z: int, x: int, y: int) -> list[dict[str, Any]]:
    if "demo_blocks" not in index.memo:
        index.memo["demo_blocks"] = demo_blocks()
    return base_layer_features(index.memo["demo_blocks"], z, x, y)


def base_layer_features(
    blocks: dict[tuple[int, int], str], z: int, x: int, y: int
) -> list[dict[str, Any]]:
    """The demo's blocks, parks and lots in the tile (`base.py`), as `kind` features."""
    west, south, east, north = tile_bounds(z, x, y)
    pad = (east - west) * BUFFER / EXTENT
    (w, s), (e, n) = (
        mercator_lonlat(west - pad, south - pad),
        mercator_lonlat(east + pad, north + pad),
    )
    shapes = base_shapes(blocks, (w, s, e, n), z)
    if not shapes:
        return []
    units = EXTENT / (east - west)
    in_tile = shapely.transform(
        shapely.transform(np.array([shape for _, shape in shapes], dtype=object), mercator),
        lambda c: np.column_stack([(c[:, 0] - west) * units, (north - c[:, 1]) * units]),
    )
    in_tile = shapely.clip_by_rect(in_tile, -BUFFER, -BUFFER, EXTENT + BUFFER, EXTENT + BUFFER)
    return [
        {"geometry": geom, "properties": {"kind": kind}}
        for (kind, _), geom in zip(shapes, in_tile, strict=True)
        if not geom.is_empty
    ]


@dataclass(frozen=True)
class _Drawn:
    """Features of one class in a tile, as columns (masked where a feature has no such
    property): count points have `count` and no id, annotations an id and their measures."""

    name: str
    geoms: np.ndarray
    ids: np.ma.MaskedArray
    counts: np.ma.MaskedArray
    areas: np.ma.MaskedArray
    lengths: np.ma.MaskedArray


def _annotations_layer(drawn: list[_Drawn]) -> Layer:
    if not drawn:
        return Layer(LAYER, np.zeros(0, dtype=object))
    ids = np.ma.concatenate([d.ids for d in drawn])
    return Layer(
        LAYER,
        np.concatenate([d.geoms for d in drawn]),
        {
            "id": ids,
            "class": np.concatenate([np.full(len(d.geoms), d.name) for d in drawn]),
            "count": np.ma.concatenate([d.counts for d in drawn]),
            "area_m2": np.ma.concatenate([d.areas for d in drawn]),
            "length_m": np.ma.concatenate([d.lengths for d in drawn]),
        },
        ids=ids,
    )


def _none(n: int, dtype: type) -> np.ma.MaskedArray:
    return np.ma.masked_all(n, dtype=dtype)


def _features(
    index: SpatialIndex, z: int, x: int, y: int, selection: _Selection, pixel: float
) -> list[_Drawn]:
    """One class's features in a tile; annotations under `pixel` pixels are counted per cell
    (below EXACT_ZOOM). A shape is clipped to the buffered tile only where it crosses its
    edge, and simplified only where it has points to lose."""
    west, south, east, _ = tile_bounds(z, x, y)
    size = east - west
    units = EXTENT / size  # tile units per Mercator metre
    class_index, positions, bounds = selection.class_index, selection.positions, selection.bounds
    name = class_index.category
    features: list[_Drawn] = []
    if z < EXACT_ZOOM:
        extent_px = np.maximum(bounds[:, 2] - bounds[:, 0], bounds[:, 3] - bounds[:, 1])
        small = extent_px * TILE_PIXELS / size < pixel
        features.extend(_count_points(name, bounds[small], west, south, size, pixel))
        positions, bounds = positions[~small], bounds[~small]
    if not len(positions):
        return features
    shapes, _ = _mercator_of(class_index, index)
    in_tile = shapely.transform(
        shapes[positions],
        lambda c: np.column_stack([(c[:, 0] - west) * units, (south + size - c[:, 1]) * units]),
    )
    low, high = -BUFFER / units, (EXTENT + BUFFER) / units  # the buffered tile, from its corner
    crosses = (
        (bounds[:, 0] - west < low)
        | (bounds[:, 2] - west > high)
        | (south + size - bounds[:, 3] < low)
        | (south + size - bounds[:, 1] > high)
    )
    in_tile[crosses] = shapely.clip_by_rect(
        in_tile[crosses], -BUFFER, -BUFFER, EXTENT + BUFFER, EXTENT + BUFFER
    )
    if z < EXACT_ZOOM:
        tolerance = EXTENT / TILE_PIXELS * pixel / 2
        changes = _simplify_may_change(in_tile, tolerance)
        in_tile[changes] = shapely.simplify(in_tile[changes], tolerance, preserve_topology=True)
    dims = shapely.get_dimensions(in_tile)
    measures = class_index.measures[positions]
    features.append(
        _Drawn(
            name,
            in_tile,
            np.ma.array(class_index.ids[positions].astype(np.int64)),
            _none(len(positions), np.int64),
            np.ma.array(round2(measures[:, 0]), mask=dims != 2),
            np.ma.array(round2(measures[:, 1]), mask=dims < 1),
        )
    )
    return features


def _simplify_may_change(geoms: np.ndarray, tolerance: float) -> np.ndarray:
    """Where `shapely.simplify` (Douglas-Peucker, topology preserved) could change a shape;
    elsewhere it returns the shape as it is, and is not called (it was ~40 % of a zoom-13
    tile's CPU; most shapes there are houses' and garages' four corners). Unchanged for sure:
    points, two-point lines, triangles (a ring keeps at least three points), and quadrilaterals
    whose every corner is farther than the tolerance from every other corner and from every
    segment between two others (the only distances the algorithm compares)."""
    kinds = shapely.get_type_id(geoms)
    sizes = shapely.get_num_coordinates(geoms)
    plain = shapely.get_num_interior_rings(geoms) == 0
    may = ~((kinds == 0) | ((kinds == 1) & (sizes <= 2)) | ((kinds == 3) & plain & (sizes <= 4)))
    quads = np.flatnonzero((kinds == 3) & plain & (sizes == 5))
    if len(quads):
        corners = shapely.get_coordinates(geoms[quads]).reshape(-1, 5, 2)[:, :4]
        clear = np.ones(len(quads), bool)
        for i in range(4):
            point = corners[:, i]
            others = [corners[:, j] for j in range(4) if j != i]
            for a in others:
                clear &= np.hypot(*(point - a).T) > tolerance
            for a, b in ((others[0], others[1]), (others[0], others[2]), (others[1], others[2])):
                clear &= _segment_distance(point, a, b) > tolerance
        may[quads[clear]] = False
    return may


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of each point p to the segment a-b (rows)."""
    ab, ap = b - a, p - a
    length2 = (ab**2).sum(axis=1)
    t = np.clip((ap * ab).sum(axis=1) / np.where(length2 > 0, length2, 1), 0, 1)
    return np.hypot(*(ap - t[:, None] * ab).T)


def round2(values: np.ndarray) -> np.ndarray:
    """`round(v, 2)` of each value, as Python rounds (the nearest double to the correctly
    rounded decimal), in numpy: rint(100 v) / 100 is that except where 100 v is within float
    error of a half; those few go through `round`."""
    scaled = values * 100
    rounded = np.rint(scaled) / 100
    tie = np.abs(scaled - np.floor(scaled) - 0.5) <= 1e-6 + np.abs(scaled) * 1e-14
    rounded[tie] = [round(v, 2) for v in values[tie].tolist()]
    return rounded


def _count_points(
    name: str, bounds: np.ndarray, west: float, south: float, size: float, pixel: float
) -> list[_Drawn]:
    """One point per cell holding annotations of the class: where they are on average, and
    how many."""
    if not len(bounds):
        return []
    cells = max(1, int(TILE_PIXELS / (CELL_PIXELS * pixel)))
    cx = (bounds[:, 0] + bounds[:, 2]) / 2
    cy = (bounds[:, 1] + bounds[:, 3]) / 2
    col = np.clip(((cx - west) / size * cells).astype(np.int64), 0, cells - 1)
    row = np.clip(((south + size - cy) / size * cells).astype(np.int64), 0, cells - 1)
    cell = row * cells + col
    counts = np.bincount(cell, minlength=cells * cells)
    sum_x = np.bincount(cell, weights=cx, minlength=cells * cells)
    sum_y = np.bincount(cell, weights=cy, minlength=cells * cells)
    units = EXTENT / size
    held = np.flatnonzero(counts)
    mx, my = sum_x[held] / counts[held], sum_y[held] / counts[held]
    points = shapely.points(np.rint((mx - west) * units), np.rint((south + size - my) * units))
    n = len(held)
    return [
        _Drawn(
            name,
            points,
            _none(n, np.int64),
            np.ma.array(counts[held].astype(np.int64)),
            _none(n, np.float64),
            _none(n, np.float64),
        )
    ]


_backends: dict[str, TileBackend] = {}


def tile_backend() -> TileBackend:
    """The tile backend of this process, following `spatial_backend()` (`spatial.py`, the
    one place that decides): PostGIS's (`tiles_postgis.py`, `ST_AsMVT`) when PostGIS answers,
    so no process holds the dataset; the in-process index's otherwise. One of each is kept
    (its tile cache lives as long as the process)."""
    name = spatial_backend()
    if name not in _backends:
        if name == "postgis":
            from .tiles_postgis import PostgisTileBackend  # it builds on this module

            _backends[name] = PostgisTileBackend()
        else:
            _backends[name] = IndexTileBackend()
    return _backends[name]


WARM_ZOOMS = 3  # how many zoom levels of the data's whole extent are drawn at start
WARM_TILES = 16  # … each of them at most this many tiles


def tiles_warm(index: SpatialIndex) -> None:
    """Work out every class's Web Mercator shapes ahead of the first tile, then draw the
    tiles a map opening on the whole dataset asks first (`initial_tiles`) into the cache: at
    a million annotations each holds most of the data and takes a second or more to draw."""
    for class_index in index.classes.values():
        _mercator_of(class_index, index)
    backend = tile_backend()
    bounds = backend.metadata().bounds
    if bounds is None:
        return
    for z, x, y in initial_tiles(bounds):
        backend.render(z, x, y)


def initial_tiles(bounds: tuple[float, float, float, float]) -> list[tuple[int, int, int]]:
    """The tiles over `bounds` (lon/lat) at the `WARM_ZOOMS` highest zooms where they are at
    most `WARM_TILES` tiles: what a map fitted to the data asks for first, from a phone's
    panel (the lowest) to a wide screen's (the highest)."""
    west, south, east, north = bounds
    (mw, ms), (me, mn) = mercator(np.array([[west, south], [east, north]], dtype=float))
    zooms = []
    for z in range(MAX_ZOOM, MIN_ZOOM - 1, -1):
        size = 2 * HALF_WORLD / 2**z
        xs = range(
            int((mw + HALF_WORLD) // size), min(2**z - 1, int((me + HALF_WORLD) // size)) + 1
        )
        ys = range(
            int((HALF_WORLD - mn) // size), min(2**z - 1, int((HALF_WORLD - ms) // size)) + 1
        )
        if len(xs) * len(ys) <= WARM_TILES:
            zooms.append([(z, x, y) for x in xs for y in ys])
        if len(zooms) == WARM_ZOOMS:
            break
    return [tile for tiles in reversed(zooms) for tile in tiles]
