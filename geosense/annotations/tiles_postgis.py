"""The map's vector tiles drawn by PostGIS (`ST_AsMVT`), when the database is PostgreSQL.

The same tiles as `IndexTileBackend` (`tiles.py`: the layers, the zoom rules, the ETag's
meaning), worked out in the database so that no process holds a copy of the dataset:

- a tile's annotations are those whose bounds meet the buffered tile: found through the GiST
  index on `geom` (`&&`, boxes in float4, so a few too many), then exactly on the stored
  double-precision bounds (`min_lon` …), as the index compares its Mercator bounds (Web
  Mercator is monotone in each axis: the comparison is the same in degrees);
- below `EXACT_ZOOM` those smaller than `pixel` pixels are grouped per class and per cell of
  `CELL_PIXELS` pixels (their bounds' centres in Mercator, from the same columns: no
  geometry is read for them), one count point each at the mean of the centres; the others
  are simplified to half a pixel (`ST_SimplifyPreserveTopology` in Mercator metres);
- `ST_AsMVTGeom` puts the shapes on the tile's 4096 grid with its 64-unit buffer, clipped;
  `ST_AsMVT` encodes the `annotations` layer. The `base` layer (the demo's blocks, from one
  `DemoArea` row) is encoded by `tiles.py` and appended: an MVT is a protobuf message whose
  layers are a repeated field, so two encoded tiles joined are one tile with both layers.

A tile's ETag digests the content generation and the ids the tile holds (an md5 of them,
summed up by PostgreSQL, so ids never travel to the process): a deletion or a restore changes
the ETags of the tiles it touches and no other. Drawn tiles are kept by ETag, in a bounded
per-process cache, as the index's backend does.
"""

import hashlib
from typing import Any

from django.db import connection, transaction

from . import tiles
from .base import BLOCK_ZOOM, demo_blocks
from .models import Annotation, AnnotationRevision
from .mvt import tile_encode

_TABLE = Annotation._meta.db_table
_REVISION_TABLE = AnnotationRevision._meta.db_table

# Mercator metres of a column of degrees, as `tiles.mercator` works them out.
_X = "6378137.0 * radians({col})"
_Y = "6378137.0 * ln(tan(pi() / 4 + radians(least(greatest({col}, -{lat}), {lat})) / 2))"

# The live annotations whose bounds meet the buffered tile (%(w)s … in degrees).
_HIT = f"""
    SELECT id, category, geom, area_m2, length_m,
           {_X.format(col="min_lon")} AS x0, {_X.format(col="max_lon")} AS x1,
           {_Y.format(col="min_lat", lat=tiles.MAX_LAT)} AS y0,
           {_Y.format(col="max_lat", lat=tiles.MAX_LAT)} AS y1
    FROM {_TABLE}
    WHERE deleted_at IS NULL
      AND geom && ST_MakeEnvelope(%(w)s, %(s)s, %(e)s, %(n)s, 4326)
      AND max_lon >= %(w)s AND min_lon <= %(e)s AND max_lat >= %(s)s AND min_lat <= %(n)s
"""

# What the ETag digests: the generation, and the set of ids in the tile (its size, the sum and
# the xor of the ids' hashes: no sort, no text); with the revision token of the same snapshot.
_DIGEST = f"""
    SELECT (SELECT token FROM {_REVISION_TABLE} WHERE id = 1),
           (SELECT generation FROM {_REVISION_TABLE} WHERE id = 1),
           count(*) || ':' || coalesce(sum(id), 0) || ':'
               || coalesce(bit_xor(hashint8extended(id, 18)), 0)
    FROM hit
"""

_ETAG_SQL = f"WITH hit AS ({_HIT}) {_DIGEST}"

# The annotations layer and the digest, from one snapshot (one statement).
_TILE_SQL = f"""
WITH hit AS MATERIALIZED ({_HIT}),
marked AS (
    SELECT *, %(exact)s OR greatest(x1 - x0, y1 - y0) * %(pixels_per_metre)s >= %(pixel)s
           AS drawn
    FROM hit
),
counted AS (
    SELECT category, count(*)::integer AS n, avg((x0 + x1) / 2) AS mx, avg((y0 + y1) / 2) AS my
    FROM marked
    WHERE NOT drawn
    GROUP BY category,
        least(greatest(floor(((x0 + x1) / 2 - %(west)s) / %(size)s * %(cells)s), 0),
              %(cells)s - 1),
        least(greatest(floor((%(north)s - (y0 + y1) / 2) / %(size)s * %(cells)s), 0),
              %(cells)s - 1)
),
features AS MATERIALIZED (
    SELECT id AS fid, id, category AS class, NULL::integer AS count,
           CASE WHEN ST_Dimension(geom) = 2 THEN round(area_m2::numeric, 2)::float8 END
               AS area_m2,
           CASE WHEN ST_Dimension(geom) >= 1 THEN round(length_m::numeric, 2)::float8 END
               AS length_m,
           ST_AsMVTGeom(
               CASE WHEN %(exact)s THEN ST_Transform(geom, 3857)
                    ELSE ST_SimplifyPreserveTopology(ST_Transform(geom, 3857), %(tolerance)s)
               END,
               ST_TileEnvelope(%(z)s, %(x)s, %(y)s), {tiles.EXTENT}, {tiles.BUFFER}, true
           ) AS geom
    FROM marked
    WHERE drawn
    UNION ALL
    SELECT NULL, NULL, category, n, NULL, NULL,
           ST_MakePoint(round((mx - %(west)s) * %(units)s), round((%(north)s - my) * %(units)s))
    FROM counted
)
SELECT (SELECT ST_AsMVT(f, '{tiles.LAYER}', {tiles.EXTENT}, 'geom', 'fid'
                        ORDER BY f.class, f.fid NULLS FIRST, f.geom)
        FROM features f WHERE f.geom IS NOT NULL),
       digest.*
FROM ({_DIGEST}) AS digest
"""


def _params(z: int, x: int, y: int) -> dict[str, Any]:
    """The tile's buffered extent in degrees, and its Mercator numbers."""
    tiles.tile_check(z, x, y)
    west, south, east, north = tiles.tile_bounds(z, x, y)
    size = east - west
    pad = size * tiles.BUFFER / tiles.EXTENT
    w, s = tiles.mercator_lonlat(west - pad, south - pad)
    e, n = tiles.mercator_lonlat(east + pad, north + pad)
    return {
        "z": z,
        "x": x,
        "y": y,
        "w": w,
        "s": s,
        "e": e,
        "n": n,
        "west": west,
        "north": north,
        "size": size,
        "units": tiles.EXTENT / size,
        "pixels_per_metre": tiles.TILE_PIXELS / size,
        "exact": z >= tiles.EXACT_ZOOM,
    }


def _one_row(sql: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """The row of a tile statement, without JIT compilation: ST_AsMVTGeom's high cost
    estimate makes PostgreSQL compile a far tile's plan (~70 ms measured at zoom 14, more than
    it saves)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, params)
        return cursor.fetchone()


def _etag(z: int, x: int, y: int, generation: str | None, ids: str) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{tiles.ENCODING_VERSION}|postgis|{generation or ''}|{z}/{x}/{y}|{ids}".encode())
    return f'"{digest.hexdigest()}"'


class PostgisTileBackend:
    """Tiles drawn by PostGIS from the annotations table, the last ones kept by ETag.

    ETags are also kept by revision token (`tags_kept` of them): a token names the whole live
    set, so while it stands a tile's ETag costs one primary-key read, and a tile in the cache
    no statement over the annotations.
    """

    def __init__(self, *, cache_bytes: int = 64 * 2**20, tags_kept: int = 50_000) -> None:
        self.memo = tiles.TileMemo(cache_bytes=cache_bytes, tags_kept=tags_kept)
        self._metadata: tuple[str, tiles.TileSetMetadata] | None = None
        self._blocks: tuple[str, dict[tuple[int, int], str]] | None = None

    def metadata(self) -> tiles.TileSetMetadata:
        """Counts and bounds from one aggregate over the live rows, kept until the revision
        changes (a primary-key read tells)."""
        revision = AnnotationRevision.current()
        kept = self._metadata
        if kept is not None and kept[0] == revision and revision:
            return kept[1]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT category, count(*), min(min_lon), min(min_lat), max(max_lon),"
                f" max(max_lat) FROM {_TABLE} WHERE deleted_at IS NULL GROUP BY category"
                " ORDER BY category"
            )
            rows = cursor.fetchall()
        counts = {name: int(n) for name, n, *_ in rows}
        bounds = None
        if rows:
            bounds = (
                min(r[2] for r in rows),
                min(r[3] for r in rows),
                max(r[4] for r in rows),
                max(r[5] for r in rows),
            )
        metadata = tiles.TileSetMetadata(
            revision=revision, total=sum(counts.values()), counts=counts, bounds=bounds
        )
        self._metadata = (revision, metadata)
        return metadata

    def etag(self, z: int, x: int, y: int) -> str:
        params = _params(z, x, y)
        if known := self._known_tag(z, x, y):
            return known
        token, generation, ids = _one_row(_ETAG_SQL, params)
        return self._tag_keep(token, z, x, y, _etag(z, x, y, generation, ids))

    def _known_tag(self, z: int, x: int, y: int) -> str | None:
        token = AnnotationRevision.current()
        return self.memo.tag(token, z, x, y) if token else None

    def _tag_keep(self, token: str | None, z: int, x: int, y: int, tag: str) -> str:
        """Keep the ETag under the token its statement read (never a later one)."""
        if token:
            self.memo.tag_keep(token, z, x, y, tag)
        return tag

    def render(self, z: int, x: int, y: int) -> bytes:
        """The tile, from the cache when its ETag is known and kept; else drawn, and kept
        under the ETag its own statement digested (one snapshot)."""
        params = _params(z, x, y)
        if (kept := self.memo.tile(self._known_tag(z, x, y))) is not None:
            return kept
        tag, generation, layer = self._layer(params, pixel=1.0)
        data = self._tile(params, generation, layer)
        self.memo.tile_keep(tag, data)
        return data

    def _layer(self, params: dict[str, Any], *, pixel: float) -> tuple[str, str, bytes]:
        """The ETag, the content generation and the encoded annotations layer, with counts
        for what is under `pixel` pixels."""
        cells = max(1, int(tiles.TILE_PIXELS / (tiles.CELL_PIXELS * pixel)))
        layer, token, generation, ids = _one_row(
            _TILE_SQL,
            {
                **params,
                "pixel": pixel,
                "cells": cells,
                "tolerance": params["size"] / tiles.TILE_PIXELS * pixel / 2,
            },
        )
        z, x, y = params["z"], params["x"], params["y"]
        tag = self._tag_keep(token, z, x, y, _etag(z, x, y, generation, ids))
        return tag, generation or "", bytes(layer or b"")

    def _tile(self, params: dict[str, Any], generation: str, layer: bytes) -> bytes:
        """The gzip-compressed tile: below EXACT_ZOOM, coarser until it fits MAX_TILE_BYTES."""
        z, x, y = params["z"], params["x"], params["y"]
        base = self._base(z, x, y, generation)
        pixel = 1.0
        while True:
            data = tiles.tile_compress(layer + base)
            if len(data) <= tiles.MAX_TILE_BYTES or z >= tiles.EXACT_ZOOM:
                return data
            pixel *= 4
            _, _, layer = self._layer(params, pixel=pixel)

    def _base(self, z: int, x: int, y: int, generation: str) -> bytes:
        """The encoded `base` layer (nothing below BLOCK_ZOOM or without a demo area). The
        blocks are read again when the content generation changes (a seed changes it)."""
        if z < BLOCK_ZOOM:
            return b""
        if self._blocks is None or self._blocks[0] != generation or not generation:
            self._blocks = (generation, demo_blocks())
        features = tiles.base_layer_features(self._blocks[1], z, x, y)
        if not features:
            return b""
        return tile_encode([tiles.layer_of(tiles.BASE_LAYER, features)], extent=tiles.EXTENT)
