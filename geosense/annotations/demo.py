"""A believable suburban neighbourhood, generated in local metres around a real place.

Blocks of lots along a street grid (Encino, in Los Angeles' San Fernando Valley): a house on
every lot, some with an attached or detached garage, a pool, a shed or solar panels on the
roof; trees in the gardens and along the streets; street centrelines as lines. Deterministic
for a seed; the first `count` features of a layout are returned, blocks spiralling out from
the centre so that a small neighbourhood stays compact.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from shapely import affinity
from shapely.geometry import LineString, Point, Polygon, box
from shapely.geometry.base import BaseGeometry

PLACE = "Encino, Los Angeles, California"
PLACE_LON = -118.5214
PLACE_LAT = 34.1566

LOT_WIDTH = 18.0
LOT_DEPTH = 38.0
LOTS_PER_ROW = 14
STREET = 16.0
BLOCK_WIDTH = LOT_WIDTH * LOTS_PER_ROW
BLOCK_DEPTH = 2 * LOT_DEPTH
PITCH_X = BLOCK_WIDTH + STREET
PITCH_Y = BLOCK_DEPTH + STREET
# A pool whose id is easy to talk about ("pools similar to 25") on a fresh database.
SHOWCASE_POOL_INDEX = 24

AVENUES = ["Hayvenhurst Ave", "Balboa Blvd", "Louise Ave", "White Oak Ave", "Amestoy Ave",
           "Genesta Ave", "Libbit Ave", "Gaviota Ave", "Haskell Ave", "Densmore Ave"]
STREETS = ["Magnolia Blvd", "Killion St", "Hatteras St", "Collins St", "Addison St",
           "Califa St", "Lemay St", "Oxnard St", "Burbank Blvd", "Weddington St"]
HOUSE_STYLES = ["ranch", "craftsman", "mid-century", "spanish", "contemporary"]
TREE_SPECIES = ["jacaranda", "coast live oak", "sycamore", "mexican fan palm", "magnolia",
                "camphor", "crape myrtle", "olive"]


@dataclass(frozen=True)
class DemoFeature:
    category: str
    geometry_m: BaseGeometry
    attributes: dict[str, Any]


def _spiral() -> Iterator[tuple[int, int]]:
    """Grid cells in rings around (0, 0), nearest first, without end."""
    yield (0, 0)
    ring = 1
    while True:
        cells = [(i, j) for i in range(-ring, ring + 1) for j in range(-ring, ring + 1)
                 if max(abs(i), abs(j)) == ring]
        yield from sorted(cells, key=lambda c: (math.atan2(c[1], c[0]), c))
        ring += 1


def _house(rng: np.random.Generator, x0: float, front: float, facing: int) -> tuple[Polygon, float, float]:
    """A footprint set back from the street; returns it with its width and depth."""
    width = rng.uniform(9.0, 13.5)
    depth = rng.uniform(10.0, 15.0)
    setback = rng.uniform(6.0, 8.5)
    left = x0 + (LOT_WIDTH - width) / 2 + rng.uniform(-1.0, 1.0)
    near = front - facing * setback
    far = near - facing * depth
    footprint = box(left, min(near, far), left + width, max(near, far))
    if rng.random() < 0.4:
        # An L-shaped house: a wing cut out of the back corner.
        cut_w, cut_d = width * rng.uniform(0.3, 0.5), depth * rng.uniform(0.3, 0.5)
        corner = left + width - cut_w if rng.random() < 0.5 else left
        back = far
        cut = footprint.difference(box(corner, min(back, back + facing * cut_d),
                                       corner + cut_w, max(back, back + facing * cut_d)))
        if cut.geom_type == "Polygon" and cut.is_valid:
            footprint = cut
    return footprint, width, depth


def _oval(cx: float, cy: float, rx: float, ry: float) -> Polygon:
    angles = np.linspace(0, 2 * np.pi, 25)[:-1]
    return Polygon(np.column_stack([cx + rx * np.cos(angles), cy + ry * np.sin(angles)]))


def _lot_features(rng: np.random.Generator, lot_no: int, x0: float, y_front: float, facing: int,
                  street: str) -> list[DemoFeature]:
    """One lot: y_front is its street edge; facing is +1 when the street lies north of it."""
    address = f"{16000 + lot_no * 2} {street}"
    features: list[DemoFeature] = []
    footprint, _, _ = _house(rng, x0, y_front, facing)
    turn = rng.uniform(-3.0, 3.0)
    footprint = affinity.rotate(footprint, turn, origin="centroid")
    if not footprint.is_valid:
        # Rotation can leave an L's inner corner a rounding error off its edge.
        footprint = footprint.buffer(0)
    storeys = int(rng.choice([1, 1, 1, 2, 2]))
    features.append(DemoFeature("house", footprint, {
        "address": address, "storeys": storeys, "style": str(rng.choice(HOUSE_STYLES)),
        "built": int(rng.integers(1948, 2022)),
    }))
    minx, miny, maxx, maxy = footprint.bounds
    if rng.random() < 0.2:
        inner = footprint.buffer(-1.2, join_style="mitre")
        if not inner.is_empty and inner.area > 6:
            ix0, iy0, ix1, iy1 = inner.bounds
            panel = box(ix0, iy0, ix0 + min(ix1 - ix0, rng.uniform(3.0, 6.0)), iy0 + min(iy1 - iy0, 2.0))
            panel = panel.intersection(inner)
            if panel.geom_type == "Polygon" and not panel.is_empty:
                features.append(DemoFeature("solar_panel", panel,
                                            {"address": address, "panels": int(rng.integers(6, 20))}))
    back_edge = y_front - facing * LOT_DEPTH
    if rng.random() < 0.4:
        attached = rng.random() < 0.6
        size = rng.uniform(5.5, 7.0)
        if attached:
            # Attached garages share a wall with the house: a sliver overlaps the footprint.
            side_x = maxx - 0.5 if x0 + LOT_WIDTH - maxx > size * 0.6 else minx - size + 0.5
            gy = (miny + maxy) / 2 + facing * rng.uniform(0, 2.0)
            garage = box(side_x, gy - size / 2, side_x + size, gy + size / 2)
        else:
            gx = x0 + LOT_WIDTH - size - 1.0
            gy = back_edge + facing * 1.0
            garage = box(gx, min(gy, gy + facing * size), gx + size, max(gy, gy + facing * size))
        lot = box(x0, min(y_front, back_edge), x0 + LOT_WIDTH, max(y_front, back_edge))
        garage = garage.intersection(lot)
        features.append(DemoFeature("garage", garage, {"address": address, "attached": attached}))
    garden_near = miny if facing > 0 else maxy
    garden_depth = abs(garden_near - back_edge)
    if rng.random() < 0.35 and garden_depth > 9:
        cx = x0 + LOT_WIDTH / 2 + rng.uniform(-2.0, 2.0)
        cy = (garden_near + back_edge) / 2
        kind = str(rng.choice(["rectangular", "rectangular", "oval", "freeform"]))
        length, width = rng.uniform(7.0, 12.0), rng.uniform(3.5, 5.0)
        if kind == "rectangular":
            pool = box(cx - length / 2, cy - width / 2, cx + length / 2, cy + width / 2)
        elif kind == "oval":
            pool = _oval(cx, cy, length / 2, width / 2)
        else:
            pool = _oval(cx - length / 4, cy, length / 3, width / 2).union(
                _oval(cx + length / 4, cy + width * 0.15, length / 3, width / 2.6)).simplify(0.05)
        pool = affinity.rotate(pool, rng.uniform(-4.0, 4.0), origin="centroid")
        features.append(DemoFeature("pool", pool, {
            "address": address, "shape": kind, "heated": bool(rng.random() < 0.3),
        }))
    if rng.random() < 0.15:
        sx = x0 + 1.0
        sy = back_edge + facing * 1.0
        shed = box(sx, min(sy, sy + facing * 2.5), sx + 3.0, max(sy, sy + facing * 2.5))
        features.append(DemoFeature("shed", shed, {"address": address}))
    for _ in range(int(rng.choice([0, 1, 1, 2, 3]))):
        tx = x0 + rng.uniform(1.5, LOT_WIDTH - 1.5)
        ty = back_edge + facing * rng.uniform(1.5, max(garden_depth - 1.0, 2.0))
        features.append(DemoFeature("tree", Point(tx, ty), {
            "species": str(rng.choice(TREE_SPECIES)),
            "crown_radius_m": round(float(rng.uniform(1.5, 5.0)), 1), "setting": "garden",
        }))
    if rng.random() < 0.7:
        tx = x0 + LOT_WIDTH / 2 + rng.uniform(-3.0, 3.0)
        features.append(DemoFeature("tree", Point(tx, y_front + facing * 2.0), {
            "species": str(rng.choice(TREE_SPECIES)),
            "crown_radius_m": round(float(rng.uniform(2.0, 4.0)), 1), "setting": "street",
        }))
    return features


def _block_roads(i: int, j: int) -> dict[tuple[float, float, float, float], str]:
    """The four centreline segments around block (i, j), keyed by their ends."""
    west, east = i * PITCH_X - PITCH_X / 2, (i + 1) * PITCH_X - PITCH_X / 2
    south, north = j * PITCH_Y - PITCH_Y / 2, (j + 1) * PITCH_Y - PITCH_Y / 2
    return {
        (west, south, east, south): STREETS[j % len(STREETS)],
        (west, north, east, north): STREETS[(j + 1) % len(STREETS)],
        (west, south, west, north): AVENUES[i % len(AVENUES)],
        (east, south, east, north): AVENUES[(i + 1) % len(AVENUES)],
    }


def demo_features(*, count: int, seed: int) -> list[DemoFeature]:
    """The first `count` features of the neighbourhood for a seed (metres around PLACE):
    the lots of blocks spiralling out from the centre, then the streets around them."""
    rng = np.random.default_rng(seed)
    lots: list[DemoFeature] = []
    segments: dict[tuple[float, float, float, float], str] = {}
    lot_no = 0
    cells = _spiral()
    while count > 0 and len(lots) + len(segments) < count:
        i, j = next(cells)
        # Lots start at the block's south-west corner, inside the streets around it.
        x_left = i * PITCH_X - PITCH_X / 2 + STREET / 2
        y_south = j * PITCH_Y - PITCH_Y / 2 + STREET / 2
        for lot in range(LOTS_PER_ROW):
            x0 = x_left + lot * LOT_WIDTH
            lots.extend(_lot_features(rng, lot_no, x0, y_south + BLOCK_DEPTH, 1,
                                      STREETS[(j + 1) % len(STREETS)]))
            lots.extend(_lot_features(rng, lot_no + 1, x0, y_south, -1, STREETS[j % len(STREETS)]))
            lot_no += 2
        for ends, name in _block_roads(i, j).items():
            segments.setdefault(ends, name)
    roads = [
        DemoFeature("road", LineString([(x0, y0), (x1, y1)]), {
            "name": name, "lanes": 4 if name.endswith("Blvd") else 2, "surface": "asphalt",
        })
        for (x0, y0, x1, y1), name in sorted(segments.items())
    ]
    features = lots[: max(count - len(roads), 0)] + roads
    features = features[:count]
    pools = [n for n, f in enumerate(features) if f.category == "pool" and n >= SHOWCASE_POOL_INDEX]
    if pools:
        features.insert(SHOWCASE_POOL_INDEX, features.pop(pools[0]))
    return features
