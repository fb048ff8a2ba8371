"""The demo neighbourhood's quiet base layer: its blocks, parks and lots, drawn under the
annotations when no raster tile URL is set (`GEOSENSE_MAP_TILE_URL`), so shapes do not float
on grey. Streets are the gaps between blocks (their centrelines are `road` annotations).

Nothing is stored but the blocks `seed_demo` laid out (`DemoArea`): a tile's blocks and lots
are worked out from the street grid of `demo.py` for the tile's own extent.
"""

import math
from functools import cache

import numpy as np
import shapely

from . import demo
from .geometry import LocalProjection
from .models import DemoArea

BLOCK_ZOOM = 12  # blocks and parks from this zoom on
LOT_ZOOM = 15  # lots from this zoom on


@cache
def _projection() -> LocalProjection:
    return LocalProjection(lon=demo.PLACE_LON, lat=demo.PLACE_LAT)


def demo_blocks() -> dict[tuple[int, int], str]:
    """(i, j) → kind of every block of the demo seeded last (empty without one)."""
    row = DemoArea.objects.order_by("-pk").values_list("blocks", flat=True).first() or []
    return {(int(i), int(j)): str(kind) for i, j, kind in row}


def base_shapes(
    blocks: dict[tuple[int, int], str], lonlat_box: tuple[float, float, float, float], z: int
) -> list[tuple[str, shapely.Geometry]]:
    """(kind, lon/lat shape) of the base features meeting a lon/lat box at zoom z: "block" and
    "park" outlines from BLOCK_ZOOM, "lot" outlines from LOT_ZOOM."""
    if z < BLOCK_ZOOM or not blocks:
        return []
    west, south, east, north = lonlat_box
    outline = shapely.segmentize(shapely.box(west, south, east, north), max(east - west, 1e-9) / 4)
    x0, y0, x1, y1 = shapely.bounds(_projection().project(np.array([outline], dtype=object)))[0]
    # Block (i, j) spans x in [(i - 1/2) pitch, (i + 1/2) pitch]: the cells the box meets.
    i_range = range(math.floor(x0 / demo.PITCH_X + 0.5), math.floor(x1 / demo.PITCH_X + 0.5) + 1)
    j_range = range(math.floor(y0 / demo.PITCH_Y + 0.5), math.floor(y1 / demo.PITCH_Y + 0.5) + 1)
    if len(i_range) * len(j_range) > 4 * len(blocks):
        cells = [cell for cell in blocks if cell[0] in i_range and cell[1] in j_range]
    else:
        cells = [(i, j) for i in i_range for j in j_range if (i, j) in blocks]
    kinds, boxes = [], []
    for i, j in cells:
        left = i * demo.PITCH_X - demo.PITCH_X / 2 + demo.STREET / 2
        bottom = j * demo.PITCH_Y - demo.PITCH_Y / 2 + demo.STREET / 2
        width, depth = demo.LOTS_PER_ROW * demo.LOT_WIDTH, demo.BLOCK_DEPTH
        park = blocks[(i, j)] == "park"
        kinds.append("park" if park else "block")
        boxes.append((left, bottom, left + width, bottom + depth))
        if z >= LOT_ZOOM and not park:
            for lot in range(demo.LOTS_PER_ROW):
                x = left + lot * demo.LOT_WIDTH
                for y in (bottom, bottom + demo.LOT_DEPTH):
                    kinds.append("lot")
                    boxes.append((x, y, x + demo.LOT_WIDTH, y + demo.LOT_DEPTH))
    if not boxes:
        return []
    metres = shapely.box(*np.array(boxes).T)
    return list(zip(kinds, _projection().unproject(metres), strict=True))
