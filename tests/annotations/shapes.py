"""GeoJSON shapes for tests, sized in metres around a longitude/latitude."""

import math
from typing import Any

M_PER_DEG = 111_320.0


def point(lon: float, lat: float) -> dict[str, Any]:
    return {"type": "Point", "coordinates": [lon, lat]}


def rectangle(
    lon: float, lat: float, width_m: float, height_m: float, turn_deg: float = 0.0
) -> dict[str, Any]:
    """A rectangle centred on (lon, lat), turned counter-clockwise by turn_deg."""
    c, s = math.cos(math.radians(turn_deg)), math.sin(math.radians(turn_deg))
    corners = [
        (-width_m / 2, -height_m / 2),
        (width_m / 2, -height_m / 2),
        (width_m / 2, height_m / 2),
        (-width_m / 2, height_m / 2),
    ]
    ring = [
        [
            lon + (x * c - y * s) / (M_PER_DEG * math.cos(math.radians(lat))),
            lat + (x * s + y * c) / M_PER_DEG,
        ]
        for x, y in corners
    ]
    return {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}


def line(*lonlats: tuple[float, float]) -> dict[str, Any]:
    return {"type": "LineString", "coordinates": [list(p) for p in lonlats]}
