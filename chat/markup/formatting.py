"""Human formatting of the measures markup carries: lengths, areas, overlaps, credits, positions.

Pure functions, shared by the markup renderer and the `geosense_format` template filters; the
page formats the same texts (static/geosense/format.js), and tests/formatting_cases.json is the
table of cases both sides must agree on (tests/chat/test_formatting.py also compares thousands
of generated values). Precision follows what a map can show: a few significant digits, never
false precision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _trim(number: float, decimals: int) -> str:
    """Round to `decimals`, group thousands, and drop a trailing `.0`."""
    text = f"{number:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def format_length(value: Any) -> str:
    """Metres as `0.45 m`, `4.3 m`, `123 m`, `1.2 km`."""
    metres = _number(value)
    if metres is None:
        return "—"
    size = abs(metres)
    if size < 1:
        return f"{_trim(metres, 2)} m"
    if size < 100:
        return f"{_trim(metres, 1)} m"
    if size < 1000:
        return f"{_trim(metres, 0)} m"
    if size < 100_000:
        return f"{_trim(metres / 1000, 1)} km"
    return f"{_trim(metres / 1000, 0)} km"


def format_area(value: Any) -> str:
    """Square metres below one hectare (`850 m²`), hectares above (`1.25 ha`, `340 ha`)."""
    square_metres = _number(value)
    if square_metres is None:
        return "—"
    size = abs(square_metres)
    if size < 10:
        return f"{_trim(square_metres, 1)} m²"
    if size < 10_000:
        return f"{_trim(square_metres, 0)} m²"
    hectares = square_metres / 10_000
    if size < 100_000:
        return f"{_trim(hectares, 2)} ha"
    if size < 1_000_000:
        return f"{_trim(hectares, 1)} ha"
    return f"{_trim(hectares, 0)} ha"


def format_overlap(value: Any) -> str:
    """An intersection fraction in [0, 1] as a percentage: `42%`, `4.5%`."""
    fraction = _number(value)
    if fraction is None:
        return "—"
    percent = fraction * 100
    return f"{_trim(percent, 1 if abs(percent) < 10 else 0)}%"


def format_credits(value: Any) -> str:
    """`1 credit`, `2.5 credits`."""
    amount = _number(value)
    if amount is None:
        return "—"
    return f"{_trim(amount, 2)} {'credit' if amount == 1 else 'credits'}"


def format_pixels(value: Any) -> str:
    pixels = _number(value)
    return "—" if pixels is None else f"{_trim(pixels, 0)} px"


def format_position(value: Any) -> str:
    """Latitude/longitude with five decimals (about a metre): `52.52000° N, 13.40500° E`.

    Accepts `{"latitude", "longitude"}` / `{"lat", "lon"|"lng"}` objects or GeoJSON-ordered
    `[lon, lat]` pairs.
    """
    lat = lon = None
    if isinstance(value, Mapping):
        lat = _number(value.get("latitude", value.get("lat")))
        lon = _number(value.get("longitude", value.get("lon", value.get("lng"))))
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        lon, lat = _number(value[0]), _number(value[1])
    if lat is None or lon is None or abs(lat) > 90 or abs(lon) > 180:
        return "—"
    north = "N" if lat >= 0 else "S"
    east = "E" if lon >= 0 else "W"
    return f"{abs(lat):.5f}° {north}, {abs(lon):.5f}° {east}"


FORMATTERS = {
    "length": format_length,
    "area": format_area,
    "overlap": format_overlap,
    "credits": format_credits,
    "pixels": format_pixels,
    "position": format_position,
}
