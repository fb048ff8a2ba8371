"""Words a person reads about tools: lists, ids, distances, places (class names are in
geosense/annotations/classes.py).

Tools declare a human title and a one-line summary of a call's arguments for the cards the
page shows (approval and decision cards, the activity log); the local agent words its answers
with the same helpers.
"""

from collections.abc import Iterable
from math import cos, radians
from typing import Any

IDS_SHOWN = 8


def listing(items: Iterable[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def ids_text(ids: Iterable[Any]) -> str:
    """Annotation ids as "#3, #4 and #5"; a long list as "#3, #4, … and 40 more"."""
    ids = [str(i) for i in ids]
    if len(ids) <= IDS_SHOWN:
        return listing(f"#{i}" for i in ids)
    shown = ", ".join(f"#{i}" for i in ids[: IDS_SHOWN - 1])
    return f"{shown} and {len(ids) - IDS_SHOWN + 1:,} more"


def _trimmed(number: float, decimals: int) -> str:
    text = f"{number:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def metres_text(value: Any) -> str:
    """A distance in plain words: "20 m", "4.5 m", "1.5 km", "120 km"."""
    try:
        metres = float(value)
    except (TypeError, ValueError):
        return "?"
    if metres >= 1000:
        km = metres / 1000
        return f"{_trimmed(km, 1 if km < 100 else 0)} km"
    return f"{_trimmed(metres, 1 if metres < 100 else 0)} m"


def area_text(bbox: Any) -> str:
    """A bounding box [min_lon, min_lat, max_lon, max_lat] as "an area of about 350 m by 200 m"."""
    try:
        min_lon, min_lat, max_lon, max_lat = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return "an area"
    width = abs(max_lon - min_lon) * 111_320 * cos(radians((min_lat + max_lat) / 2))
    height = abs(max_lat - min_lat) * 110_540
    return f"an area of about {metres_text(width)} × {metres_text(height)}"


def place_text(lat: Any, lon: Any) -> str:
    """A position to about 10 m: "34.1568° N, 118.5227° W"."""
    try:
        lat, lon = float(lat), float(lon)
    except (TypeError, ValueError):
        return "a point"
    return f"{abs(lat):.4f}° {'N' if lat >= 0 else 'S'}, {abs(lon):.4f}° {'E' if lon >= 0 else 'W'}"


def sentence(text: str) -> str:
    """The first letter upper case."""
    return text[:1].upper() + text[1:]


def missing_text(deleted: list[int], unknown: list[int]) -> str:
    """Why ids name no annotation, for a person: "#7 was deleted (an administrator can
    restore it)."; "There is no annotation #99."; both, in one sentence each."""
    parts = []
    if deleted:
        one = len(deleted) == 1
        parts.append(
            f"{ids_text(deleted)} {'was' if one else 'were'} deleted "
            f"(an administrator can restore {'it' if one else 'them'})."
        )
    if unknown:
        parts.append(
            f"There is no annotation {ids_text(unknown)}."
            if len(unknown) == 1
            else f"There are no annotations {ids_text(unknown)}."
        )
    return " ".join(parts)
