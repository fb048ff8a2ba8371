"""Mapbox Vector Tile encoding of many features at once, written as bytes with numpy.

`mapbox-vector-tile` (the kept library: its decoder checks these tiles in the tests) encodes
one feature at a time in Python, about 0.3 ms per polygon: 6 s for a tile of 20,000
annotations. Filling its protobuf messages (`vector_tile_pb2`) one feature at a time was still
~45 % of a zoom-13 tile of a million annotations (~25,000 features). Here a whole layer is
worked out with numpy and written as protobuf bytes directly (the MVT 2.1 schema is small:
everything in a feature is a varint, so a layer's features are one run of varints):

- geometry (spec section 4.3): coordinates rounded to the tile's grid, repeated points
  dropped, rings of fewer than three points and lines of fewer than two dropped, polygons
  oriented (exterior rings positive by the surveyor's formula in tile coordinates, y down),
  then MoveTo / LineTo / ClosePath with zigzag-encoded deltas;
- properties (section 4.4): a column of values per key (a masked array where some features
  have none), each distinct value once in the layer's `values`, by type (string, signed int,
  double, bool), and each feature's tags as (key, value) index pairs;
- ids: the `id` field of each feature that has one.

No PyPI library does this faster and is kept: `freestiler` (0.3.0, alpha, Rust) builds whole
PMTiles archives from GeoPandas data, not one tile from shapes in a request.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely

POINT, LINESTRING, POLYGON = 1, 2, 3
MOVE_TO, LINE_TO, CLOSE_PATH = 1, 2, 7
# Protobuf keys (field number << 3 | wire type) of the schema's fields used here.
TILE_LAYER = 0x1A  # Tile.layers = 3, length-delimited
LAYER_NAME, LAYER_FEATURE, LAYER_KEY, LAYER_VALUE = 0x0A, 0x12, 0x1A, 0x22  # 1, 2, 3, 4
LAYER_EXTENT, LAYER_VERSION = 0x28, 0x78  # 5, 15: varints
FEATURE_ID, FEATURE_TAGS, FEATURE_TYPE, FEATURE_GEOMETRY = 0x08, 0x12, 0x18, 0x22  # 1-4
VALUE_STRING, VALUE_DOUBLE, VALUE_SINT, VALUE_BOOL = 0x0A, 0x19, 0x30, 0x38  # 1, 3, 6, 7


@dataclass(frozen=True)
class Layer:
    """One layer to encode: geometries in tile coordinates; per property key a column of one
    value per geometry (a masked array where some have none; its dtype gives the MVT value
    type); and the features' ids (masked where a feature has none), or None."""

    name: str
    geoms: np.ndarray
    properties: Mapping[str, np.ndarray] = field(default_factory=dict)
    ids: np.ndarray | None = None


def layer_of_dicts(name: str, geoms: Sequence[Any], properties: Sequence[dict]) -> Layer:
    """A layer from one properties dict per geometry (`id` also gives the feature's id). A
    key's values must be of one type (all str, all int, all float or all bool)."""
    keys = list(dict.fromkeys(key for each in properties for key in each))
    columns = {}
    for key in keys:
        present = [key in each for each in properties]
        kinds = {type(each[key]) for each in properties if key in each}
        if len(kinds) != 1:
            raise TypeError(f"property {key!r} has values of several types: {kinds}")
        (kind,) = kinds
        fill = {str: "", bool: False, int: 0, float: 0.0}[kind]
        values = [each.get(key, fill) for each in properties]
        dtype = object if kind is str else kind
        columns[key] = np.ma.array(
            np.array(values, dtype=dtype), mask=~np.array(present, dtype=bool)
        )
    ids = columns.get("id")
    return Layer(
        name,
        np.array(list(geoms), dtype=object),
        columns,
        ids if ids is not None and ids.dtype.kind in "iu" else None,
    )


def _command(command: int, count: np.ndarray | int) -> np.ndarray | int:
    return (count << 3) | command


def _zigzag(values: np.ndarray) -> np.ndarray:
    return (values << 1) ^ (values >> 63)


def _paths(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every path (point run, line or ring) of the features, on the grid and cleaned:
    (coords as int64 rows, the path of each coordinate, each path's feature, each path's
    kind: 0 points, 1 line, 2 ring).

    Points, lines and polygons without holes (nearly every annotation) are their own path;
    only the others are taken apart into parts and rings (new GEOS objects for each)."""
    types = shapely.get_type_id(geoms)
    holes = shapely.get_num_interior_rings(geoms)
    simple_line = (types == 1) | (types == 2)
    simple_polygon = (types == 3) & (holes == 0)
    simple_point = types == 0
    complex_ = np.flatnonzero(~(simple_line | simple_polygon | simple_point) & (types >= 0))
    dims = shapely.get_dimensions(geoms[complex_])
    parts, part_owner = shapely.get_parts(geoms[complex_], return_index=True)
    # A feature has one type: of a collection (a clip can make one) only the parts of its
    # highest dimension are kept.
    part_dims = shapely.get_dimensions(parts)
    same = part_dims == dims[part_owner]
    parts, part_owner, part_dims = parts[same], complex_[part_owner[same]], part_dims[same]
    polygons = part_dims == 2
    rings, ring_part = shapely.get_rings(parts[polygons], return_index=True)
    polygon_parts = np.flatnonzero(polygons)[ring_part]
    # Paths: each simple line or polygon, each line part, each ring; each feature's points.
    lines = np.flatnonzero(part_dims == 1)
    own_lines, own_polygons = np.flatnonzero(simple_line), np.flatnonzero(simple_polygon)
    path_geoms = np.concatenate([geoms[own_lines], geoms[own_polygons], parts[lines], rings])
    path_owner = np.concatenate(
        [own_lines, own_polygons, part_owner[lines], part_owner[polygon_parts]]
    )
    path_kind = np.repeat(
        np.array([1, 2, 1, 2], np.int64),
        [len(own_lines), len(own_polygons), len(lines), len(rings)],
    )
    # Each path's part (a simple shape is a part of its own, numbered after the others') and
    # whether it is its part's first path: a line, or a polygon part's exterior ring.
    own = len(own_lines) + len(own_polygons)
    path_part = np.concatenate([len(parts) + np.arange(own), lines, polygon_parts])
    exterior = np.ones(len(path_geoms), bool)
    if len(rings):
        exterior[own + len(lines) :] = np.r_[True, ring_part[1:] != ring_part[:-1]]
    coords, path_of = shapely.get_coordinates(path_geoms, return_index=True)
    point_parts = np.flatnonzero(part_dims == 0)
    point_coords, point_of = shapely.get_coordinates(
        np.concatenate([geoms[simple_point], parts[point_parts]]), return_index=True
    )
    point_owner = np.concatenate([np.flatnonzero(simple_point), part_owner[point_parts]])[point_of]
    coords = np.rint(coords).astype(np.int64)
    # A ring's last point closes it: ClosePath stands for it.
    last = np.r_[path_of[1:] != path_of[:-1], True] if len(path_of) else np.zeros(0, bool)
    keep = ~(last & (path_kind[path_of] == 2))
    repeat = np.r_[False, (path_of[1:] == path_of[:-1]) & (coords[1:] == coords[:-1]).all(axis=1)]
    keep &= ~repeat
    coords, path_of = coords[keep], path_of[keep]
    sizes = np.bincount(path_of, minlength=len(path_geoms))
    enough = sizes >= np.where(path_kind == 2, 3, 2)
    # A polygon part whose exterior is gone loses its holes too.
    part_ok = np.ones(len(parts) + own, bool)
    part_ok[path_part[exterior & ~enough]] = False
    path_ok = enough & part_ok[path_part]
    coords, path_of = coords[path_ok[path_of]], path_of[path_ok[path_of]]
    renumber = np.cumsum(path_ok) - 1
    path_of = renumber[path_of]
    path_owner, path_kind = path_owner[path_ok], path_kind[path_ok]
    # Exterior rings counter-clockwise in these y-down numbers (positive area), holes the other way.
    is_exterior = exterior[path_ok]
    coords = _oriented(coords, path_of, path_kind == 2, is_exterior)
    # The points of each point feature form one path of kind 0, after the others.
    if len(point_coords):
        point_order = np.argsort(point_owner, kind="stable")
        point_paths, point_path_of = np.unique(point_owner[point_order], return_inverse=True)
        coords = np.concatenate([coords, np.rint(point_coords[point_order]).astype(np.int64)])
        path_of = np.concatenate([path_of, point_path_of + len(path_owner)])
        path_owner = np.concatenate([path_owner, point_paths])
        path_kind = np.concatenate([path_kind, np.zeros(len(point_paths), np.int64)])
    order = np.argsort(path_owner[path_of], kind="stable")
    return coords[order], path_of[order], path_owner, path_kind


def _oriented(
    coords: np.ndarray, path_of: np.ndarray, is_ring: np.ndarray, is_exterior: np.ndarray
) -> np.ndarray:
    """Rings reversed where their signed area has the wrong sign for their role."""
    if not is_ring.any():
        return coords
    n_paths = len(is_ring)
    nxt = np.r_[1 : len(coords), 0]
    first = np.r_[0, np.flatnonzero(path_of[1:] != path_of[:-1]) + 1]
    wraps = np.r_[path_of[1:] != path_of[:-1], True]
    nxt[wraps] = first[np.searchsorted(first, np.flatnonzero(wraps), side="right") - 1]
    cross = coords[:, 0] * coords[nxt, 1] - coords[nxt, 0] * coords[:, 1]
    area = np.bincount(path_of, weights=cross.astype(float), minlength=n_paths)
    flip = is_ring & ((area > 0) != is_exterior)
    if not flip.any():
        return coords
    # Each point of a flipped ring takes the place mirrored within its ring.
    ends = np.r_[first[1:], len(coords)]
    at = np.arange(len(coords))
    mirrored = first[path_of] + ends[path_of] - 1 - at
    return coords[np.where(flip[path_of], mirrored, at)]


def _commands(geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The geometry commands of every kept feature, one after the other (uint64), how many
    each has, each one's position among geoms and its MVT type."""
    coords, path_of, path_owner, path_kind = _paths(geoms)
    if not len(coords):
        empty = np.zeros(0, np.int64)
        return empty.astype(np.uint64), empty, empty, empty
    owner = path_owner[path_of]
    # Deltas from the previous point of the same feature (the first from the origin).
    previous = np.vstack([np.zeros((1, 2), np.int64), coords[:-1]])
    new_feature = np.r_[True, owner[1:] != owner[:-1]]
    previous[new_feature] = 0
    deltas = _zigzag(coords - previous)
    first_of_path = np.r_[True, path_of[1:] != path_of[:-1]]
    sizes = np.bincount(path_of, minlength=len(path_kind))
    kind = path_kind[path_of]
    # Per point: the command ints before it, then its two parameters; ClosePath after a ring.
    # A line's or ring's second point follows its LineTo.
    second = np.r_[False, first_of_path[:-1] & ~first_of_path[1:]] & (kind != 0)
    lead = first_of_path.astype(np.int64) + second
    tail = np.where(np.r_[first_of_path[1:], True] & (kind == 2), 1, 0)
    width = lead + 2 + tail
    ends = np.cumsum(width)
    starts = ends - width
    out = np.zeros(int(ends[-1]), np.int64)
    point_count = sizes[path_of]
    move_count = np.where(kind == 0, point_count, 1)
    out[starts[first_of_path]] = _command(MOVE_TO, move_count[first_of_path])
    out[starts[second]] = _command(LINE_TO, point_count[second] - 1)
    out[ends - tail - 2] = deltas[:, 0]
    out[ends - tail - 1] = deltas[:, 1]
    out[ends[tail == 1] - 1] = _command(CLOSE_PATH, 1)
    feature_starts = starts[new_feature]
    counts = np.diff(np.r_[feature_starts, len(out)])
    types = np.array([POINT, LINESTRING, POLYGON])[
        np.maximum.reduceat(kind, np.flatnonzero(new_feature))
    ]
    return out.astype(np.uint64), counts, owner[new_feature], types


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """How many bytes each (uint64) value takes as a varint."""
    sizes = np.ones(len(values), np.int64)
    if not len(values):
        return sizes
    top, k = int(values.max()), 1
    while k < 10 and top >= 1 << (7 * k):
        sizes += values >= np.uint64(1 << (7 * k))
        k += 1
    return sizes


def _varints(values: np.ndarray, sizes: np.ndarray | None = None) -> bytes:
    """Protobuf varints of uint64 values (their `_varint_sizes` if known), one after the
    other: every value's low seven bits first, then the next seven of those that have more."""
    if not len(values):
        return b""
    sizes = _varint_sizes(values) if sizes is None else sizes
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]), np.uint8)
    at = ends - sizes
    out[at] = (values & np.uint64(0x7F)).astype(np.uint8) | np.where(sizes > 1, 0x80, 0).astype(
        np.uint8
    )
    longer = np.flatnonzero(sizes > 1)
    k = 1
    while len(longer):
        part = (values[longer] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = sizes[longer] > k + 1
        out[at[longer] + k] = part.astype(np.uint8) | np.where(more, 0x80, 0).astype(np.uint8)
        longer = longer[more]
        k += 1
    return out.tobytes()


def _varint(value: int) -> bytes:
    return _varints(np.array([value], np.uint64))


def _delimited(key: int, payload: bytes) -> bytes:
    return bytes([key]) + _varint(len(payload)) + payload


def _ranks(owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per owner (sorted ascending) how many entries it has, and each entry's rank in it."""
    counts = np.bincount(owner, minlength=n)
    firsts = np.cumsum(counts) - counts
    return counts, np.arange(len(owner)) - firsts[owner]


def _family(column: np.ndarray) -> str:
    kind = column.dtype.kind
    if kind == "b":
        return "bool"
    if kind in "iu":
        return "sint"
    if kind == "f":
        return "double"
    return "string"


def _values_bytes(family: str, values: np.ndarray) -> bytes:
    """The layer's `values` entries (each a Value message) of one type."""
    n = len(values)
    if family == "string":
        return b"".join(
            _delimited(LAYER_VALUE, _delimited(VALUE_STRING, str(v).encode())) for v in values
        )
    if family == "double":
        out = np.empty((n, 11), np.uint8)
        out[:, :3] = (LAYER_VALUE, 9, VALUE_DOUBLE)
        out[:, 3:] = values.astype("<f8").view(np.uint8).reshape(n, 8)
        return out.tobytes()
    if family == "bool":
        encoded = values.astype(np.uint64)
        key = VALUE_BOOL
    else:
        encoded = _zigzag(values.astype(np.int64)).view(np.uint64)
        key = VALUE_SINT
    tokens = np.empty((n, 4), np.uint64)
    tokens[:, 0], tokens[:, 1] = LAYER_VALUE, 1 + _varint_sizes(encoded)
    tokens[:, 2], tokens[:, 3] = key, encoded
    return _varints(tokens.ravel())


def _tags(layer: Layer, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """Per kept feature its tags (key and value indices, one after the other), how many it
    has, and the layer's encoded `keys` and `values`."""
    n = len(kept)
    key_of, value_of, present_of = [], [], []
    families: dict[str, list[tuple[int, np.ndarray]]] = {}
    for key, column in layer.properties.items():
        column = column[kept]
        present = ~np.ma.getmaskarray(column)
        if not present.any():
            continue
        families.setdefault(_family(column), []).append(
            (len(key_of), np.ma.getdata(column)[present])
        )
        key_of.append(key)
        value_of.append(np.zeros(n, np.uint64))
        present_of.append(present)
    values_bytes = []
    offset = 0
    for family, columns in families.items():
        distinct, inverse = np.unique(np.concatenate([v for _, v in columns]), return_inverse=True)
        values_bytes.append(_values_bytes(family, distinct))
        start = 0
        for k, values in columns:
            value_of[k][present_of[k]] = inverse[start : start + len(values)] + offset
            start += len(values)
        offset += len(distinct)
    keys_bytes = b"".join(_delimited(LAYER_KEY, key.encode()) for key in key_of)
    if not key_of:
        return np.zeros(0, np.uint64), np.zeros(n, np.int64), keys_bytes, b""
    present = np.column_stack(present_of)
    pairs = np.empty((n, len(key_of), 2), np.uint64)
    pairs[:, :, 0] = np.arange(len(key_of), dtype=np.uint64)
    pairs[:, :, 1] = np.column_stack(value_of)
    return pairs[present].ravel(), 2 * present.sum(axis=1), keys_bytes, b"".join(values_bytes)


def _features_bytes(layer: Layer) -> tuple[bytes, bytes, bytes]:
    """The layer's encoded features, keys and values."""
    geometry, geometry_counts, kept, types = _commands(np.asarray(layer.geoms, dtype=object))
    n = len(kept)
    if not n:
        return b"", b"", b""
    tags, tag_counts, keys_bytes, values_bytes = _tags(layer, kept)
    if layer.ids is None:
        has_id, ids = np.zeros(n, bool), np.zeros(n, np.uint64)
    else:
        chosen = layer.ids[kept]
        has_id = ~np.ma.getmaskarray(chosen)
        ids = np.ma.getdata(chosen).astype(np.uint64)
    has_tags = tag_counts > 0
    geometry_owner = np.repeat(np.arange(n), geometry_counts)
    tag_owner = np.repeat(np.arange(n), tag_counts)
    geometry_bytes = np.bincount(geometry_owner, _varint_sizes(geometry), minlength=n)
    tag_bytes = np.bincount(tag_owner, _varint_sizes(tags), minlength=n)
    geometry_bytes, tag_bytes = geometry_bytes.astype(np.int64), tag_bytes.astype(np.int64)
    feature_bytes = (
        has_id * (1 + _varint_sizes(ids))
        + has_tags * (1 + _varint_sizes(tag_bytes.astype(np.uint64)) + tag_bytes)
        + 2  # type: its key and one byte
        + 1
        + _varint_sizes(geometry_bytes.astype(np.uint64))
        + geometry_bytes
    )
    # Each feature as varints: its key and size in the layer, [id], [tags], type, geometry.
    width = 2 + 2 * has_id + 2 * has_tags + tag_counts + 2 + 2 + geometry_counts
    at = np.cumsum(width) - width
    tokens = np.zeros(int(width.sum()), np.uint64)
    tokens[at], tokens[at + 1] = LAYER_FEATURE, feature_bytes
    at = at + 2
    tokens[at[has_id]], tokens[at[has_id] + 1] = FEATURE_ID, ids[has_id]
    at = at + 2 * has_id
    tokens[at[has_tags]], tokens[at[has_tags] + 1] = FEATURE_TAGS, tag_bytes[has_tags]
    at = at + 2 * has_tags
    tokens[at[tag_owner] + _ranks(tag_owner, n)[1]] = tags
    at = at + tag_counts
    tokens[at], tokens[at + 1] = FEATURE_TYPE, types
    tokens[at + 2], tokens[at + 3] = FEATURE_GEOMETRY, geometry_bytes
    at = at + 4
    tokens[at[geometry_owner] + _ranks(geometry_owner, n)[1]] = geometry
    return _varints(tokens), keys_bytes, values_bytes


def tile_encode(layers: Sequence[Layer], *, extent: int) -> bytes:
    """An MVT of the layers (geometries in tile coordinates, 0 to extent, y down)."""
    tile = []
    for layer in layers:
        features, keys, values = _features_bytes(layer)
        body = b"".join(
            [
                _delimited(LAYER_NAME, layer.name.encode()),
                features,
                keys,
                values,
                bytes([LAYER_EXTENT]) + _varint(extent),
                bytes([LAYER_VERSION, 2]),
            ]
        )
        tile.append(_delimited(TILE_LAYER, body))
    return b"".join(tile)
