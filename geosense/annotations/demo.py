"""A believable suburban neighbourhood, generated in local metres around a real place.

Blocks of lots along a street grid in Encino (Los Angeles' San Fernando Valley): a house on
a lot (rectangular or L-shaped, a little askew), some with an attached or detached garage, a
pool (rectangular, oval or kidney-shaped), a shed or solar panels on the roof; trees in the
gardens and along the streets; street centrelines as lines. Not every block is alike, so that
a question such as "trees within 20 m of a house" picks out some trees and not others: some
blocks are parks (trees only), some hold a wooded lot (a run of lots grown over with trees),
some are sparse (half their lots empty). `block_kind` says which; the blocks, their lots and
the parks are also the map's quiet base layer (`base.py`).

Deterministic for a seed; blocks spiral out from the centre so that a small neighbourhood
stays compact. Coordinates are plain arithmetic and the shapes are built in bulk (shapely's
vectorised constructors, one call per kind and vertex count): a million features take ~20 s.
"""

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely

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


BLOCK_KINDS = ("houses", "sparse", "wooded", "park")
# Blocks near the centre whose kind is fixed, so that even a small demo has each kind.
_FIXED_KINDS = {(0, 0): "houses", (-1, 0): "park", (1, 1): "wooded", (0, -1): "sparse"}


def block_kind(i: int, j: int, seed: int) -> str:
    """What block (i, j) holds: "houses" (most), "sparse", "wooded" or "park"."""
    if (i, j) in _FIXED_KINDS:
        return _FIXED_KINDS[(i, j)]
    draw = random.Random(f"{seed}:{i}:{j}").random()
    return (
        "park"
        if draw < 0.07
        else "wooded"
        if draw < 0.15
        else "sparse"
        if draw < 0.35
        else "houses"
    )


@dataclass
class DemoFeatures:
    """Features in the making, in order: their class, attributes and shape as coordinates
    (a ring, a point or a line in metres), built into shapely geometries in bulk by `shapes`."""

    categories: list[str] = field(default_factory=list)
    attributes: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "ring", "point" or "line"
    coords: list[Any] = field(default_factory=list)

    def add(self, category: str, kind: str, coords: Any, attributes: dict[str, Any]) -> None:
        self.categories.append(category)
        self.kinds.append(kind)
        self.coords.append(coords)
        self.attributes.append(attributes)

    def __len__(self) -> int:
        return len(self.categories)

    def shapes(self) -> np.ndarray:
        """The geometries (metres), one per feature, made by vertex count in bulk."""
        out = np.empty(len(self), dtype=object)
        groups: dict[tuple[str, int], list[int]] = {}
        for n, (kind, coords) in enumerate(zip(self.kinds, self.coords, strict=True)):
            groups.setdefault((kind, 1 if kind == "point" else len(coords)), []).append(n)
        make = {"ring": shapely.polygons, "line": shapely.linestrings, "point": shapely.points}
        for (kind, _), where in groups.items():
            coords = np.array([self.coords[n] for n in where], dtype=float)
            out[where] = make[kind](coords)
        return out


@dataclass(frozen=True)
class DemoLayout:
    """The first features of a neighbourhood, and the blocks they stand on ((i, j, kind))."""

    categories: list[str]
    attributes: list[dict[str, Any]]
    geoms_m: np.ndarray
    blocks: list[tuple[int, int, str]]


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
    out: DemoFeatures,
    rng: random.Random,
    lot_no: int,
    x0: float,
    y_front: float,
    facing: int,
    street: str,
) -> None:
    """One lot with a house: y_front is its street edge; facing is +1 when the street lies
    north of it."""
    address = f"{16000 + lot_no * 2} {street}"
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
    out.add(
        "house",
        "ring",
        _turn(ring, turn, cx, cy),
        {
            "address": address,
            "storeys": rng.choice((1, 1, 1, 2, 2)),
            "style": rng.choice(HOUSE_STYLES),
            "built": rng.randint(1948, 2021),
        },
    )
    if rng.random() < 0.2:
        # Panels on the front half of the roof, which no L cut reaches.
        px = left + 1.2 + rng.uniform(0.0, max(width - 7.5, 0.0))
        py = near - facing * 1.2
        panel = _rect(
            px, min(py, py - facing * 2.0), px + rng.uniform(3.0, 5.0), max(py, py - facing * 2.0)
        )
        out.add(
            "solar_panel",
            "ring",
            _turn(panel, turn, cx, cy),
            {"address": address, "panels": rng.randint(6, 19)},
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
        out.add("garage", "ring", garage, {"address": address, "attached": attached})
    garden_depth = abs(far - back_edge)
    if rng.random() < 0.35 and garden_depth > 9:
        kind = rng.choice(("rectangular", "rectangular", "oval", "kidney"))
        px, py = x0 + LOT_WIDTH / 2 + rng.uniform(-2.0, 2.0), (far + back_edge) / 2
        pool = _turn(_pool_ring(rng, kind, px, py), rng.uniform(-4.0, 4.0), px, py)
        out.add(
            "pool",
            "ring",
            pool,
            {"address": address, "shape": kind, "heated": rng.random() < 0.3},
        )
    if rng.random() < 0.15:
        sy = back_edge + facing * 1.0
        shed = _rect(x0 + 1.0, min(sy, sy + facing * 2.5), x0 + 4.0, max(sy, sy + facing * 2.5))
        out.add("shed", "ring", shed, {"address": address})
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        ty = back_edge + facing * rng.uniform(1.5, max(garden_depth - 1.0, 2.0))
        _tree(out, rng, (x0 + rng.uniform(1.5, LOT_WIDTH - 1.5), ty), "garden", (1.5, 5.0))
    _street_tree(out, rng, x0, y_front, facing, 0.7)


def _tree(
    out: DemoFeatures,
    rng: random.Random,
    at: tuple[float, float],
    setting: str,
    crown: tuple[float, float],
) -> None:
    out.add(
        "tree",
        "point",
        at,
        {
            "species": rng.choice(TREE_SPECIES),
            "crown_radius_m": round(rng.uniform(*crown), 1),
            "setting": setting,
        },
    )


def _street_tree(
    out: DemoFeatures, rng: random.Random, x0: float, y_front: float, facing: int, chance: float
) -> None:
    if rng.random() < chance:
        tx = x0 + LOT_WIDTH / 2 + rng.uniform(-3.0, 3.0)
        _tree(out, rng, (tx, y_front + facing * 2.0), "street", (2.0, 4.0))


def _vacant_lot(
    out: DemoFeatures, rng: random.Random, x0: float, y_front: float, facing: int, wooded: bool
) -> None:
    """A lot with no house: grown over with trees (a wooded lot), or bare but for a street
    tree or two."""
    if wooded:
        for _ in range(rng.randint(7, 12)):
            x = x0 + rng.uniform(1.0, LOT_WIDTH - 1.0)
            y = y_front - facing * rng.uniform(1.0, LOT_DEPTH - 1.0)
            _tree(out, rng, (x, y), "wood", (2.0, 6.0))
    else:
        _street_tree(out, rng, x0, y_front, facing, 0.35)


def _park(out: DemoFeatures, rng: random.Random, x_left: float, y_south: float) -> None:
    """A park over a whole block: trees in loose groups, none along its edges' streets."""
    width, depth = LOTS_PER_ROW * LOT_WIDTH, BLOCK_DEPTH
    for _ in range(rng.randint(7, 10)):
        gx, gy = x_left + rng.uniform(15, width - 15), y_south + rng.uniform(12, depth - 12)
        for _ in range(rng.randint(3, 8)):
            x = min(max(gx + rng.gauss(0, 7), x_left + 3), x_left + width - 3)
            y = min(max(gy + rng.gauss(0, 5), y_south + 3), y_south + depth - 3)
            _tree(out, rng, (x, y), "park", (2.5, 6.0))


def _block_features(
    out: DemoFeatures, rng: random.Random, i: int, j: int, kind: str, lot_no: int
) -> int:
    """The features of block (i, j) of a kind; returns the next lot number."""
    # Lots start at the block's south-west corner, inside the streets around it.
    x_left = i * PITCH_X - PITCH_X / 2 + STREET / 2
    y_south = j * PITCH_Y - PITCH_Y / 2 + STREET / 2
    if kind == "park":
        _park(out, rng, x_left, y_south)
        return lot_no
    wood = (rng.randrange(LOTS_PER_ROW - 5), rng.randint(3, 6)) if kind == "wooded" else None
    for lot in range(LOTS_PER_ROW):
        x0 = x_left + lot * LOT_WIDTH
        sides = (
            (y_south + BLOCK_DEPTH, 1, STREETS[(j + 1) % len(STREETS)]),
            (y_south, -1, STREETS[j % len(STREETS)]),
        )
        for side, (y_front, facing, street) in enumerate(sides):
            wooded = wood is not None and side == 0 and wood[0] <= lot < wood[0] + wood[1]
            if wooded or (kind == "sparse" and rng.random() < 0.5):
                _vacant_lot(out, rng, x0, y_front, facing, wooded)
            else:
                _lot_features(out, rng, lot_no + side, x0, y_front, facing, street)
        lot_no += 2
    return lot_no


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


def demo_features(*, count: int, seed: int) -> DemoLayout:
    """The first `count` features of the neighbourhood for a seed (metres around PLACE):
    the lots of blocks spiralling out from the centre, then the streets around them."""
    rng = random.Random(seed)
    lots = DemoFeatures()
    segments: dict[tuple[float, float, float, float], str] = {}
    blocks: list[tuple[int, int, str]] = []
    lot_no = 0
    cells = _spiral()
    while count > 0 and len(lots) + len(segments) < count:
        i, j = next(cells)
        kind = block_kind(i, j, seed)
        blocks.append((i, j, kind))
        lot_no = _block_features(lots, rng, i, j, kind, lot_no)
        for ends, name in _block_roads(i, j).items():
            segments.setdefault(ends, name)
    keep = max(count - len(segments), 0)
    order = list(range(min(keep, len(lots))))
    pools = [n for n in order if lots.categories[n] == "pool" and n >= SHOWCASE_POOL_INDEX]
    if pools:
        order.insert(SHOWCASE_POOL_INDEX, order.pop(order.index(pools[0])))
    roads = sorted(segments.items())[: count - len(order)]
    shapes = lots.shapes() if len(lots) else np.empty(0, dtype=object)
    road_shapes = shapely.linestrings(
        np.array([[(x0, y0), (x1, y1)] for (x0, y0, x1, y1), _ in roads], dtype=float).reshape(
            len(roads), 2, 2
        )
    )
    return DemoLayout(
        categories=[lots.categories[n] for n in order] + ["road"] * len(roads),
        attributes=[lots.attributes[n] for n in order]
        + [
            {"name": name, "lanes": 4 if name.endswith("Blvd") else 2, "surface": "asphalt"}
            for _, name in roads
        ],
        geoms_m=np.concatenate([shapes[order], road_shapes]) if len(order) else road_shapes,
        blocks=blocks,
    )
