"""A believable suburban neighbourhood, generated in local metres around a real place.

Blocks of lots along a street grid in Encino (Los Angeles' San Fernando Valley): a house on
every lot (rectangular or L-shaped, a little askew), some with an attached or detached
garage, a pool (rectangular, oval or kidney-shaped), a shed or solar panels on the roof;
trees in the gardens and along the streets; street centrelines as lines. Deterministic for a
seed; blocks spiral out from the centre so that a small neighbourhood stays compact.
Coordinates are built with plain arithmetic: 200,000 features take a few seconds.
"""

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shapely.geometry import LineString, Point, Polygon
from shapely.geometry.base import BaseGeometry

PLACE = "Encino, Los Angeles, California"
PLACE_LON = -118.5214
PLACE_LAT = 34.1566

LOT_WIDTH = 18.0
LOT_DEPTH = 38.0
LOTS_PER_ROW = 14
STREET = 16.0
BLOCK_DEPTH = 2 * LOT_DEPTH
PITCH_X = LOT_WIDTH * LOTS_PER_ROW + STREET
PITCH_Y = BLOCK_DEPTH + STREET
# A pool whose id is easy to talk about ("pools similar to 25") on a fresh database.
SHOWCASE_POOL_INDEX = 24

AVENUES = [
    "Hayvenhurst Ave",
    "Balboa Blvd",
    "Louise Ave",
    "White Oak Ave",
    "Amestoy Ave",
    "Genesta Ave",
    "Libbit Ave",
    "Gaviota Ave",
    "Haskell Ave",
    "Densmore Ave",
]
STREETS = [
    "Magnolia Blvd",
    "Killion St",
    "Hatteras St",
    "Collins St",
    "Addison St",
    "Califa St",
    "Lemay St",
    "Oxnard St",
    "Burbank Blvd",
    "Weddington St",
]
HOUSE_STYLES = ["ranch", "craftsman", "mid-century", "spanish", "contemporary"]
TREE_SPECIES = [
    "jacaranda",
    "coast live oak",
    "sycamore",
    "mexican fan palm",
    "magnolia",
    "camphor",
    "crape myrtle",
    "olive",
]
_CIRCLE = [(math.cos(2 * math.pi * n / 24), math.sin(2 * math.pi * n / 24)) for n in range(24)]

Ring = list[tuple[float, float]]


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
        cells = [
            (i, j)
            for i in range(-ring, ring + 1)
            for j in range(-ring, ring + 1)
            if max(abs(i), abs(j)) == ring
        ]
        yield from sorted(cells, key=lambda c: (math.atan2(c[1], c[0]), c))
        ring += 1


def _rect(x0: float, y0: float, x1: float, y1: float) -> Ring:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _turn(ring: Ring, degrees: float, cx: float, cy: float) -> Ring:
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in ring]


def _pool_ring(rng: random.Random, kind: str, cx: float, cy: float) -> Ring:
    length, width = rng.uniform(7.0, 12.0), rng.uniform(3.5, 5.0)
    if kind == "rectangular":
        return _rect(cx - length / 2, cy - width / 2, cx + length / 2, cy + width / 2)
    if kind == "oval":
        return [(cx + length / 2 * x, cy + width / 2 * y) for x, y in _CIRCLE]
    # Kidney: an oval pinched on one side.
    return [
        (cx + length / 2 * x, cy + width / 2 * y * (1 - 0.35 * (x * x) * (y > 0)))
        for x, y in _CIRCLE
    ]


def _lot_features(
    rng: random.Random, lot_no: int, x0: float, y_front: float, facing: int, street: str
) -> list[DemoFeature]:
    """One lot: y_front is its street edge; facing is +1 when the street lies north of it."""
    address = f"{16000 + lot_no * 2} {street}"
    features: list[DemoFeature] = []
    back_edge = y_front - facing * LOT_DEPTH
    width, depth = rng.uniform(9.0, 13.5), rng.uniform(10.0, 15.0)
    left = x0 + (LOT_WIDTH - width) / 2 + rng.uniform(-1.0, 1.0)
    near = y_front - facing * rng.uniform(6.0, 8.5)
    far = near - facing * depth
    y_lo, y_hi = min(near, far), max(near, far)
    cx, cy = left + width / 2, (y_lo + y_hi) / 2
    turn = rng.uniform(-3.0, 3.0)
    if rng.random() < 0.4:
        # An L: a wing cut out of a back corner.
        cut_w, cut_d = width * rng.uniform(0.3, 0.5), depth * rng.uniform(0.3, 0.5)
        notch = far + facing * cut_d
        if rng.random() < 0.5:
            ring = [
                (left, near),
                (left + width, near),
                (left + width, notch),
                (left + width - cut_w, notch),
                (left + width - cut_w, far),
                (left, far),
            ]
        else:
            ring = [
                (left, near),
                (left + width, near),
                (left + width, far),
                (left + cut_w, far),
                (left + cut_w, notch),
                (left, notch),
            ]
    else:
        ring = _rect(left, y_lo, left + width, y_hi)
    features.append(
        DemoFeature(
            "house",
            Polygon(_turn(ring, turn, cx, cy)),
            {
                "address": address,
                "storeys": rng.choice((1, 1, 1, 2, 2)),
                "style": rng.choice(HOUSE_STYLES),
                "built": rng.randint(1948, 2021),
            },
        )
    )
    if rng.random() < 0.2:
        # Panels on the front half of the roof, which no L cut reaches.
        px = left + 1.2 + rng.uniform(0.0, max(width - 7.5, 0.0))
        py = near - facing * 1.2
        panel = _rect(
            px, min(py, py - facing * 2.0), px + rng.uniform(3.0, 5.0), max(py, py - facing * 2.0)
        )
        features.append(
            DemoFeature(
                "solar_panel",
                Polygon(_turn(panel, turn, cx, cy)),
                {"address": address, "panels": rng.randint(6, 19)},
            )
        )
    if rng.random() < 0.4:
        size = rng.uniform(5.5, 7.0)
        attached = rng.random() < 0.6
        if attached:
            # Attached garages share a wall with the house: a sliver overlaps the footprint.
            gx = left + width - 0.6 if x0 + LOT_WIDTH - (left + width) > 3.0 else left - size + 0.6
            gx = min(max(gx, x0 + 0.3), x0 + LOT_WIDTH - size - 0.3)
            gy = (near + cy) / 2
            garage = _rect(gx, gy - size / 2, gx + size, gy + size / 2)
        else:
            gx = x0 + LOT_WIDTH - size - 1.0
            gy = back_edge + facing * 1.0
            garage = _rect(gx, min(gy, gy + facing * size), gx + size, max(gy, gy + facing * size))
        features.append(
            DemoFeature("garage", Polygon(garage), {"address": address, "attached": attached})
        )
    garden_depth = abs(far - back_edge)
    if rng.random() < 0.35 and garden_depth > 9:
        kind = rng.choice(("rectangular", "rectangular", "oval", "kidney"))
        px, py = x0 + LOT_WIDTH / 2 + rng.uniform(-2.0, 2.0), (far + back_edge) / 2
        pool = _turn(_pool_ring(rng, kind, px, py), rng.uniform(-4.0, 4.0), px, py)
        features.append(
            DemoFeature(
                "pool",
                Polygon(pool),
                {
                    "address": address,
                    "shape": kind,
                    "heated": rng.random() < 0.3,
                },
            )
        )
    if rng.random() < 0.15:
        sy = back_edge + facing * 1.0
        shed = _rect(x0 + 1.0, min(sy, sy + facing * 2.5), x0 + 4.0, max(sy, sy + facing * 2.5))
        features.append(DemoFeature("shed", Polygon(shed), {"address": address}))
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        ty = back_edge + facing * rng.uniform(1.5, max(garden_depth - 1.0, 2.0))
        features.append(
            DemoFeature(
                "tree",
                Point(x0 + rng.uniform(1.5, LOT_WIDTH - 1.5), ty),
                {
                    "species": rng.choice(TREE_SPECIES),
                    "crown_radius_m": round(rng.uniform(1.5, 5.0), 1),
                    "setting": "garden",
                },
            )
        )
    if rng.random() < 0.7:
        tx = x0 + LOT_WIDTH / 2 + rng.uniform(-3.0, 3.0)
        features.append(
            DemoFeature(
                "tree",
                Point(tx, y_front + facing * 2.0),
                {
                    "species": rng.choice(TREE_SPECIES),
                    "crown_radius_m": round(rng.uniform(2.0, 4.0), 1),
                    "setting": "street",
                },
            )
        )
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
    rng = random.Random(seed)
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
            lots.extend(
                _lot_features(
                    rng, lot_no, x0, y_south + BLOCK_DEPTH, 1, STREETS[(j + 1) % len(STREETS)]
                )
            )
            lots.extend(_lot_features(rng, lot_no + 1, x0, y_south, -1, STREETS[j % len(STREETS)]))
            lot_no += 2
        for ends, name in _block_roads(i, j).items():
            segments.setdefault(ends, name)
    roads = [
        DemoFeature(
            "road",
            LineString([(x0, y0), (x1, y1)]),
            {
                "name": name,
                "lanes": 4 if name.endswith("Blvd") else 2,
                "surface": "asphalt",
            },
        )
        for (x0, y0, x1, y1), name in sorted(segments.items())
    ]
    features = (lots[: max(count - len(roads), 0)] + roads)[:count]
    pools = [n for n, f in enumerate(features) if f.category == "pool" and n >= SHOWCASE_POOL_INDEX]
    if pools:
        features.insert(SHOWCASE_POOL_INDEX, features.pop(pools[0]))
    return features
